"""DP-SGD from Python: the baseline a PATE student should beat at the same epsilon.

``DPSGD(epsilon, delta=...)`` trains a network on the private rows with DP-SGD (Abadi et al.,
CCS 2016, Algorithm 1; :mod:`student.dpsgd`), its noise multiplier calibrated to ``epsilon`` by
the project's sampled-Gaussian RDP accountant (docs/privacy-math.md), the same learner as
``pate dpsgd train`` and ``pate run``'s compare stage. The defaults are Tramèr & Boneh's
Fashion-MNIST settings (ICLR 2021: expected batch 2 048, lr 4, momentum 0.9, clipping C = 0.1,
40 epochs). ``model`` is ``scatter-linear`` (their recipe, a linear softmax on wavelet scattering
features; the strongest measured on images), ``hog-linear``, ``tempered-cnn`` (images) or
``linear`` (any rows, feature rows' default); the default is ``tempered-cnn`` on images,
``linear`` on feature rows (not a network of your own, unlike ``Teachers`` and ``Student``).
Fix the settings in advance or choose them on public data: tuning them on the private data
costs privacy of its own. The expected batch is of the private rows: on fewer rows than it,
every step takes them all (a warning says so).

Privacy: the fitted model is differentially private at (``epsilon_``, ``delta``) for the rows it
was trained on, a budget of its own. Publishing it beside a PATE student of the same data adds
the two epsilons. ``bayesian_`` holds the Bayesian accountant's epsilon, which depends on the
private gradients: it is for the data's owner, not for publication.
"""

from __future__ import annotations

import numbers
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import ArrayLike, NDArray

from analysis.rdp import CONVERSIONS, Conversion
from pate.aggregation.delta_policy import check_delta
from pate.api_checks import (
    accuracy_of,
    checked_integer,
    checked_labels,
    checked_rate,
    checked_rows,
    checked_rows_of,
)
from pate.data.files import rows_said
from pate.errors import UserError
from pate.rundir import DPSGD_METRICS, RunDir
from student.baseline import fit_dpsgd, load_dpsgd_model, public_norm, split_bayesian
from student.defaults import DPSGD
from student.dpsgd import DPSGDConfig
from student.training import predict_proba
from teachers.rng import SEED_LIMIT


class DPSGD:
    """DP-SGD to a target ``epsilon`` at ``delta``, or with a given ``noise_multiplier`` (the
    noise's deviation over the clipping norm; the epsilon follows); ``model``, ``epochs``,
    ``batch_size`` (the expected Poisson batch), ``lr``, ``momentum``, ``max_grad_norm`` and
    ``conversion`` (RDP to (epsilon, delta)) as ``pate dpsgd train``'s flags (``model`` None:
    ``tempered-cnn`` for images, ``linear`` for feature rows).
    ``seed`` seeds the weights' initialisation only: sampling and noise always come from the
    operating system's entropy. A delta of 1/n or more (n the private rows) is refused unless
    ``allow_large_delta``. After ``fit``: ``model_name_`` (the network trained), ``metrics_``
    (epsilon, noise multiplier, steps: public) and ``bayesian_`` (the Bayesian accountant's
    epsilon, computed from the private gradients: for the data's owner only)."""

    def __init__(self, epsilon: float | None = None, *, noise_multiplier: float | None = None,
                 delta: float = 1e-5, model: str | None = None,
                 epochs: int = DPSGD.epochs, batch_size: int = DPSGD.batch_size,
                 lr: float = DPSGD.lr, momentum: float = DPSGD.momentum,
                 max_grad_norm: float = DPSGD.max_grad_norm, conversion: Conversion = "improved",
                 allow_large_delta: bool = False, seed: int | None = None) -> None:
        if isinstance(momentum, bool) or not isinstance(momentum, numbers.Real):
            raise UserError(f"momentum must be a number in [0, 1), got {momentum!r}")
        if not isinstance(allow_large_delta, bool):
            raise UserError(f"allow_large_delta must be True or False, got "
                            f"{allow_large_delta!r}")
        if (epsilon is None) == (noise_multiplier is None):
            raise UserError("give exactly one of epsilon (the noise is calibrated to it) and "
                            "noise_multiplier (the epsilon follows from it)")
        if conversion not in CONVERSIONS:
            raise UserError(f"conversion must be one of {', '.join(CONVERSIONS)}, got "
                            f"{conversion!r}")
        try:
            self.config = DPSGDConfig(
                epochs=checked_integer("epochs", epochs, 1),
                expected_batch_size=checked_integer("batch_size", batch_size, 1),
                lr=checked_rate("lr", lr), momentum=float(momentum),
                max_grad_norm=checked_rate("max_grad_norm", max_grad_norm),
                target_epsilon=None if epsilon is None else checked_rate("epsilon", epsilon),
                noise_multiplier=(None if noise_multiplier is None
                                  else checked_rate("noise_multiplier", noise_multiplier)),
                delta=checked_rate("delta", delta), model=model, conversion=conversion,
                init_seed=None if seed is None else checked_integer("seed", seed, 0, SEED_LIMIT))
        except (TypeError, ValueError) as e:
            raise UserError(str(e)) from None
        self.allow_large_delta = allow_large_delta
        self.model_: torch.nn.Module | None = None
        self.model_name_: str | None = None
        self.in_shape_: tuple[int, ...] = ()
        self.classes_: tuple[str, ...] | None = None  # the class names, where loaded
        self.metrics_: dict[str, Any] | None = None
        self.bayesian_: dict[str, Any] | None = None

    def fit(self, x_private: ArrayLike, y_private: ArrayLike, n_classes: int, *,
            x_public: ArrayLike | None = None) -> DPSGD:
        """Train on the private rows ``(x_private, y_private)``, labels in ``[0, n_classes)``.
        ``x_public`` (rows of the same shape that are not private, such as the student's pool)
        gives the mean and deviation that ``tempered-cnn`` and ``linear`` standardise inputs
        with; without it they take the inputs as they are. The scattering and HOG maps normalise
        each example by itself."""
        n_classes = checked_integer("n_classes", n_classes, 2)
        x = checked_rows(x_private, "x_private")
        y = checked_labels(y_private, n_classes)
        if len(x) != len(y):
            raise UserError("y_private must hold one label per row of x_private, got "
                            + rows_said(len(y), len(x), "labels", private=True))
        norm = (0.0, 1.0)
        if x_public is not None:
            public = checked_rows(x_public, "x_public")
            if public.shape[1:] != x.shape[1:]:
                raise UserError(f"x_public has rows of shape {list(public.shape[1:])}, "
                                f"x_private {list(x.shape[1:])}")
            norm = public_norm(public)
        check_delta(self.config.delta, len(y), self.allow_large_delta, "allow_large_delta=True")
        result = fit_dpsgd(x, y, None, None, n_classes, self.config, norm)
        metrics = {k: v for k, v in result.metrics.items()
                   if k not in ("accuracy", "eval_examples")}
        self.metrics_, self.bayesian_ = split_bayesian(metrics)
        self.model_, self.in_shape_ = result.model, tuple(x.shape[1:])
        self.classes_ = None  # loaded with a model before, not this one's
        self.model_name_ = self.metrics_["config"]["model"]
        return self

    @property
    def epsilon_(self) -> float:
        """The epsilon the fitted model is private at (RDP accountant, at ``delta``): the
        target, or just under it; with a ``noise_multiplier`` given, what it gives."""
        if self.metrics_ is None:
            raise UserError("fit the model first")
        return float(self.metrics_["epsilon"])

    def predict_proba(self, x: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities ``[rows, classes]``."""
        if self.model_ is None:
            raise UserError("fit the model first")
        return predict_proba(self.model_, checked_rows_of(x, self.in_shape_, "this model"))

    def predict(self, x: ArrayLike) -> NDArray[np.int64]:
        """The most probable class of each row."""
        return self.predict_proba(x).argmax(axis=1)

    def score(self, x: ArrayLike, y: ArrayLike) -> float:
        """Accuracy on labelled rows (measure it on a test set, never on the private data)."""
        probs = self.predict_proba(x)
        return accuracy_of(probs.argmax(axis=1), y, probs.shape[1])


def load_dpsgd(path: str | Path) -> DPSGD:
    """The DP-SGD model ``pate dpsgd train`` or ``pate run`` wrote: a run directory (its
    ``dpsgd/``) or a folder holding ``model.pt`` and ``metrics.json`` (such as the owner-only
    ``comparison/`` models); ready to ``predict``, its settings those it was trained with. It
    reads rows as the run read its data (``pate.data.task.load_task``: a CSV encoded with the
    public pool's statistics); ``classes_`` names its outputs and ``metrics_`` holds its
    epsilon and settings."""
    folder = Path(path)
    if RunDir(folder).dpsgd.is_dir():  # a run directory: its dpsgd/
        folder = RunDir(folder).dpsgd
    model, metrics = load_dpsgd_model(folder)
    try:
        trained = metrics["config"]
        loaded = DPSGD(noise_multiplier=metrics["noise_multiplier"], delta=metrics["delta"],
                       model=trained["model"], epochs=trained["epochs"],
                       batch_size=trained["expected_batch_size"], lr=trained["lr"],
                       momentum=trained["momentum"], max_grad_norm=trained["max_grad_norm"],
                       conversion=trained["conversion"])
    except (KeyError, TypeError, UserError):
        raise UserError(f"{folder / DPSGD_METRICS}: its training settings cannot be read (a "
                        "damaged file)") from None
    loaded.model_, loaded.model_name_ = model, trained["model"]
    loaded.in_shape_ = tuple(metrics["in_shape"])
    loaded.classes_ = tuple(str(c) for c in metrics["classes"])
    loaded.metrics_ = metrics
    return loaded
