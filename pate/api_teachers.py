"""``Teachers`` of the Python API (:mod:`pate.api`): partition the private rows among the teachers,
train them vectorised in this process, vote, save and load them as ``pate teachers train``
writes them. The weights are private."""

from __future__ import annotations

from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from pate.api_checks import (
    Network,
    checked_device,
    checked_integer,
    checked_kind,
    checked_labels,
    checked_network,
    checked_rate,
    checked_rows,
    checked_rows_of,
    warn_if_of_script,
    warn_if_private_rows,
)
from pate.data.files import rows_said
from pate.data.partitions import PARTITIONS
from pate.data.row_identity import (
    private_rows_key,
    row_keys,
    rows_content_digest,
    rows_fingerprint,
)
from pate.errors import TRACEBACK_VARIABLE, UserError
from pate.io import ensure_dir
from pate.rundir import RunDir
from teachers import checkpoints
from teachers.choices import DEFAULT_MODEL, MODEL_RECORDS, POOL_ENCODER_MODELS, model_data_problem
from teachers.defaults import TEACHERS
from teachers.distributed import shard_ranges, train_shard
from teachers.ensemble import TrainConfig
from teachers.manifest import TeachersManifest
from teachers.models import check_user_model, fit_pool_encoder
from teachers.partition import deal_rows
from teachers.rng import SEED_LIMIT
from teachers.user_models import named_by_class
from teachers.votes import Ensemble, load_ensemble

# what a failure on private rows says of its message, which it does not show (it may quote them)
_WITHHELD = (f"; its message is withheld, as it may quote private rows ({TRACEBACK_VARIABLE}=1 "
             "shows it, for data you may see)")


class Teachers:
    """An ensemble of ``n_teachers`` teachers, each fitted on its own disjoint part of the
    private rows (a seeded partition), ``shard_size`` at a time, vectorised.

    ``model`` is a built-in architecture (``cnn``, ``cnn-pool``, ``resnet``, ``mlp``, ...) or a
    ``"package.module:factory"`` (or that factory function itself, defined at the top of a
    module), by default ``cnn`` on images and ``mlp`` on feature rows;
    ``n_classes`` is the label set's size (public schema: it is never read from the private
    labels). Feature rows are used unscaled: standardise them with the pool's statistics
    first (see the module's docstring). ``augment`` (``none``, ``shift``, ``shift-flip``) and
    ``mixup`` (the alpha of its Beta distribution; 0: off) are as in ``pate run``'s
    ``[teachers]``; ``device`` trains and votes there (``cuda`` on a GPU). ``partition``
    (``position``, ``record`` or ``key``, ``teachers.partition``) is how the rows are dealt: by
    record, each goes to the teacher its content hashes to, and the privacy analysis holds for
    adding or removing a record (as DP-SGD's), not only for changing one; by key, each goes to
    the teacher its key (``fit``'s ``keys``: whose the row is) hashes to, and the analysis holds
    for adding or removing all of one person's rows."""

    def __init__(self, n_teachers: int, n_classes: int, *, model: Network = None,
                 epochs: int = TEACHERS.epochs, batch_size: int = TEACHERS.batch_size,
                 lr: float = TEACHERS.lr, shard_size: int = TEACHERS.shard_size,
                 augment: str = "none", mixup: float = TEACHERS.mixup, seed: int = 0,
                 device: str = "cpu", partition: str = "position") -> None:
        model = checked_network(model, "model")
        if partition not in PARTITIONS:
            raise UserError(f"partition must be one of {', '.join(PARTITIONS)}, got "
                            f"{partition!r}")
        self.partition = partition
        self.n_teachers = checked_integer("n_teachers", n_teachers, 1)
        self.n_classes = checked_integer("n_classes", n_classes, 2)
        self.shard_size = checked_integer("shard_size", shard_size, 1)
        self.model = model
        self.config = TrainConfig(model=model or DEFAULT_MODEL["image"],
                                  epochs=checked_integer("epochs", epochs, 1),
                                  batch_size=checked_integer("batch_size", batch_size, 1),
                                  lr=checked_rate("lr", lr), augment=augment,
                                  mixup=checked_rate("mixup", mixup, zero_is_off=True),
                                  seed=checked_integer("seed", seed, 0, SEED_LIMIT))
        self.device = checked_device(device)
        self.ensemble_: Ensemble | None = None
        # set by fit (or load): how many private rows, their fingerprint, and that of the rows
        # in any order (the ledgers' second key, Task.private_rows_fingerprint; PRIVATE)
        self.private_records_: int | None = None
        self.private_fingerprint_: str | None = None
        self.private_rows_fingerprint_: str | None = None
        # loaded from a run whose rows were read before they were encoded (a CSV of numbers):
        # the key of them as encoded too (Task.private_encoded_rows_fingerprint; PRIVATE)
        self.private_encoded_rows_fingerprint_: str | None = None
        self._private_rows: NDArray | None = None

    @property
    def encoder_(self) -> dict[str, np.ndarray] | None:
        """The frozen encoder fitted on the public pool, for the models that read one (the
        ensemble's, as CPU arrays); None before ``fit`` or ``load``, and for the others."""
        encoder = None if self.ensemble_ is None else self.ensemble_.encoder
        return None if encoder is None else {k: v.cpu().numpy() for k, v in encoder.items()}

    def fit(self, x: ArrayLike, y: ArrayLike, keys: ArrayLike | None = None,
            x_public: ArrayLike | None = None) -> Teachers:
        """Partition the private rows among the teachers and train them; ``keys`` (one per row:
        whose it is) where the rows are dealt by key; ``x_public``, the public pool's rows, for
        the models that fit a frozen encoder on it first (``cnn-pool-hog-simclr``: SimCLR;
        ``hog-scatter-whitened``: the whitening of its fixed maps), and only for them."""
        xs, ys = checked_rows(x), checked_labels(y, self.n_classes)
        if (x_public is None) == (self.config.model in POOL_ENCODER_MODELS):
            raise UserError(f"x_public= (the public pool) goes with the models that fit an "
                            f"encoder on it ({', '.join(sorted(POOL_ENCODER_MODELS))}), and "
                            "only with them")
        pool = None if x_public is None else checked_rows(x_public)
        if pool is not None and pool.shape[1:] != xs.shape[1:]:
            raise UserError(f"x_public has rows of {list(pool.shape[1:])}, x of "
                            f"{list(xs.shape[1:])}")
        if pool is not None and len(pool) < 2:
            raise UserError("x_public needs at least 2 rows to fit an encoder on")
        if len(ys) != len(xs):
            raise UserError("y must hold one label per row of x, got "
                            + rows_said(len(ys), len(xs), "labels", private=True))
        if (keys is None) == (self.partition == "key"):
            raise UserError("keys= (whose each row is) go with partition='key', and only with it")
        whose = None if keys is None else np.asarray(keys).astype(str).reshape(-1)
        if whose is not None and len(whose) != len(xs):
            raise UserError("keys must hold one key per row of x, got "
                            + rows_said(len(whose), len(xs), "keys", private=True))
        kind = checked_kind(xs, self.config.augment)
        if self.model is None:
            self.config = replace(self.config, model=DEFAULT_MODEL[kind])
        problem = model_data_problem(self.config.model, kind, xs.shape[1:])
        if problem:
            raise UserError(problem)
        check_user_model(self.config.model, xs.shape[1:], self.n_classes, self.config.batch_size)
        part = deal_rows(self.partition, xs, ys, self.n_teachers, self.config.seed, whose)
        fitted = (None if pool is None else
                  fit_pool_encoder(self.config.model, pool, self.config.seed, self.device))
        with named_by_class("the teachers' training on the private rows", _WITHHELD):
            shards = [train_shard(self.config, xs, ys, self.n_classes, teachers,
                                  part.parts(teachers), part.step_rows(teachers), self.device,
                                  torch.get_num_threads(), fitted)
                      for teachers in shard_ranges(self.n_teachers, self.shard_size)]
        encoder = (None if fitted is None else
                   {k: torch.as_tensor(v, device=self.device) for k, v in fitted.items()})
        self.ensemble_ = Ensemble(self.config.model, xs.shape[1:], self.n_classes,
                                  [{k: torch.from_numpy(v).to(self.device) for k, v in s.items()}
                                   for s in shards], device=self.device, encoder=encoder)
        self.private_records_, self.private_fingerprint_ = len(ys), rows_fingerprint(xs, ys)
        self.private_rows_fingerprint_ = private_rows_key(rows_content_digest(xs))
        self._private_rows = row_keys(xs)  # in memory only: rows of x to warn of in vote
        return self

    def vote(self, x: ArrayLike) -> NDArray[np.int32]:
        """The teachers' vote histograms ``[rows, n_classes]`` on public rows (PRIVATE); rows
        the teachers fitted here were trained on are warned of (without a count)."""
        if self.ensemble_ is None:
            raise UserError("fit the teachers first")
        rows = checked_rows_of(x, self.ensemble_.in_shape, "the teachers")
        warn_if_private_rows(rows, self._private_rows)
        with named_by_class("the teachers' vote", _WITHHELD):
            return self.ensemble_.vote(rows)

    def save(self, directory: str | Path) -> Path:
        """Write the fitted teachers under ``directory/teachers/`` as ``pate teachers train``
        does (one safetensors file per shard and a manifest with their sha256), every file
        0600 in 0700 folders: the weights are PRIVATE. ``Teachers.load`` reads them back."""
        if self.ensemble_ is None:
            raise UserError("fit the teachers first")
        root = Path(directory)
        if root.exists() and not root.is_dir():
            raise UserError(f"{root}: not a folder; save writes the teachers into a folder")
        if RunDir(root).manifest.exists():
            raise UserError(f"{root} holds teachers already: save into another folder")
        warn_if_of_script(self.config.model, "the teachers'")
        if not root.exists():  # made 0700, as the folders inside; a folder of yours is kept
            ensure_dir(root, private=True)
        ens = self.ensemble_
        shards = {str(i): {"sha256": checkpoints.save_shard(
                      root, i, {k: v.cpu().numpy() for k, v in shard.items()})}
                  for i, shard in enumerate(ens.shards)}
        fitted = self.encoder_
        encoder = ({} if fitted is None else {"pool_encoder": checkpoints.encoder_record(
            root, fitted, MODEL_RECORDS[self.config.model].pool_encoder)})
        checkpoints.write_manifest(root, {**encoder,
            "model": self.config.model, "in_shape": list(ens.in_shape),
            "num_classes": ens.num_classes, "num_teachers": ens.num_teachers,
            "train": asdict(self.config), "partition": self.partition, "shards": shards,
            "done": True, "private_records": self.private_records_,
            "private_fingerprint": self.private_fingerprint_,
            "private_data_fingerprint": self.private_fingerprint_,  # the arrays as given: both
            "private_rows_fingerprint": self.private_rows_fingerprint_,
            "saved_by": "pate.api.Teachers"})
        return root

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> Teachers:
        """Teachers written by ``save`` (or by ``pate run``, from its run directory), checked
        against their recorded sha256, ready to ``vote`` on ``device``."""
        device = checked_device(device)
        manifest = TeachersManifest.read(directory)
        if manifest is None:
            raise UserError(f"{directory}: no saved teachers (teachers/manifest.json)")
        try:
            teachers = cls(manifest.num_teachers, manifest.num_classes, model=manifest.model,
                           device=device, partition=manifest.partition)
            teachers.config = TrainConfig(**manifest.train_settings)
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{directory}: its teachers' manifest is not of this version "
                            "(num_teachers, num_classes, model, train)") from None
        teachers.ensemble_ = load_ensemble(directory, device)
        teachers.private_records_ = (manifest.private_records
                                     or RunDir(directory).private_records())
        # the key of the ledgers of their data, as their votes carry it
        teachers.private_fingerprint_ = manifest.data_fingerprint
        teachers.private_rows_fingerprint_ = manifest.rows_fingerprint
        teachers.private_encoded_rows_fingerprint_ = manifest.encoded_rows_fingerprint
        return teachers
