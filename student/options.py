"""How the student asks and trains (``StudentOptions``), validated where it is made: the
settings of ``pate student train`` (its errors name that command's flags) and of ``pate run``'s
student stages (whose config file is validated before, ``pate.config``). The Python API's
``Student`` checks its own arguments and trains with ``FitConfig``."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from pate.data.augment import AUGMENTATIONS
from pate.devices import device_problem
from pate.errors import UserError
from student.choices import SELECTIONS
from student.defaults import MOST_WIDTH, STUDENT
from student.training import FitConfig, MethodConfig, method_for_data
from teachers.rng import SEED_LIMIT


@dataclass(frozen=True)
class StudentOptions:
    """How the student asks and trains; validated at construction (``UserError``).

    ``queries`` pool rows are chosen by ``select`` and asked in requests of ``request_size``;
    the network (``arch``, default per method) is trained ``epochs`` passes over the pool.
    ``pool_encoder`` (a file) or ``encoder_epochs`` (learn one) set the ``cnn-hog-simclr``
    student's encoder. ``seed`` seeds initialisation and training order only: the aggregator's
    noise is never seeded."""

    method: str
    arch: str | None = None
    width: int = STUDENT.width
    queries: int = STUDENT.queries
    select: str = "first"
    request_size: int = STUDENT.request_size
    epochs: int = STUDENT.epochs
    batch_size: int = STUDENT.batch_size
    unlabelled_batch_size: int = STUDENT.unlabelled_batch_size
    lr: float | None = None
    augment: str = "none"
    balance_classes: bool = False
    vat_eps: float = STUDENT.vat_eps
    entmin: bool = False
    pool_encoder: Path | None = None
    encoder_epochs: int | None = None
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.queries < 0:
            raise UserError(f"--queries must be >= 0, got {self.queries}")
        for flag, count in (("--request-size", self.request_size), ("--epochs", self.epochs),
                            ("--encoder-epochs", self.encoder_epochs),
                            ("--width", self.width), ("--batch-size", self.batch_size),
                            ("--unlabelled-batch-size", self.unlabelled_batch_size)):
            if count is not None and count < 1:
                raise UserError(f"{flag} must be >= 1, got {count}")
        if self.width > MOST_WIDTH:  # torch's own words on a tensor's size, before
            raise UserError(f"--width must be at most {MOST_WIDTH}, got {self.width}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise UserError(f"--seed must be in [0, 2^63), got {self.seed}")
        if self.pool_encoder is not None and self.encoder_epochs is not None:
            raise UserError("give --pool-encoder (an encoder) or --encoder-epochs (learn one), "
                            "not both")
        if self.select not in SELECTIONS:
            raise UserError(f"--select must be one of {', '.join(SELECTIONS)}")
        if self.augment not in AUGMENTATIONS:
            raise UserError(f"--augment must be one of {', '.join(AUGMENTATIONS)}")
        for flag, value in (("--lr", self.lr), ("--vat-eps", self.vat_eps)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UserError(f"{flag} must be a finite number > 0, got {value!r}")
        problem = device_problem(self.device)
        if problem:
            raise UserError(problem)

    def method_config(self, kind: str = "image") -> MethodConfig:
        """The method and its network for ``kind`` of data: on tabular features the default
        network is the MLP, and the networks (and the GAN) made for images are refused."""
        return method_for_data(kind, self.method, self.arch, self.width, self.lr,
                               self.vat_eps, self.entmin)

    def fit_config(self, method: MethodConfig) -> FitConfig:
        try:
            return FitConfig(self.epochs, self.batch_size, self.unlabelled_batch_size,
                             method.learning_rate, augment=self.augment,
                             balance_classes=self.balance_classes, seed=self.seed,
                             device=self.device)
        except ValueError as exc:
            raise UserError(str(exc)) from None
