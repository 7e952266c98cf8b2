"""The models ``pate audit models`` trains again as the run trained them: teachers of the run's
kind in one vectorised group (``Recipe``, ``train_models``, ``stacked_log_probs``), and the
student of the run's rounds (``StudentRecipe``, ``train_student``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from numpy.typing import NDArray

from analysis.costs import steps
from analysis.mechanisms import Mechanism
from student.models import ModelSpec, PoolFeatures, build_classifier
from student.training import (
    FitConfig,
    MethodConfig,
    build_learner,
    fit,
    predict_proba,
    seed_everything,
)
from teachers.ensemble import TrainConfig, train_group
from teachers.user_models import named_by_class
from teachers.votes import Ensemble


@dataclass(frozen=True)
class Recipe:
    """How the run trains a teacher: the network, its settings, the frozen pool encoder of the
    architectures that use one, and the input shape and number of classes."""

    train: TrainConfig
    in_shape: tuple[int, int, int]
    num_classes: int
    encoder: dict[str, torch.Tensor] | None
    device: str = "cpu"


def train_models(recipe: Recipe, data: Sequence[tuple[NDArray[np.float32], NDArray[np.int64]]],
                 ids: Sequence[int], step_rows: int | NDArray[np.int64]
                 ) -> dict[str, torch.Tensor]:
    """Train one model per ``(x, y)`` of ``data`` with ``teachers.ensemble.train_group`` (the
    run's teacher training, vectorised over the models), model j with teacher id ``ids[j]`` (its
    initial weights) and ``epochs * ceil(step_rows[j] / batch_size)`` steps (one number: the
    same for all). Returns the stacked parameters."""
    x = np.concatenate([d[0] for d in data]).astype(np.float32)
    y = np.concatenate([d[1] for d in data]).astype(np.int64)
    ends = np.cumsum([len(d[1]) for d in data])
    parts = [np.arange(end - len(d[1]), end) for d, end in zip(data, ends, strict=True)]
    device = torch.device(recipe.device)
    with named_by_class("retraining the teachers' kind of model"):  # on private rows
        return train_group(recipe.train, torch.as_tensor(x, device=device),
                           torch.as_tensor(y, device=device), recipe.num_classes,
                           np.asarray(ids, np.int64), parts, step_rows, recipe.encoder)


def stacked_log_probs(recipe: Recipe, params: dict[str, torch.Tensor], x: NDArray[np.float32],
                      batch_size: int = 512) -> NDArray[np.float64]:
    """Log-probabilities ``[models, n, classes]`` of stacked teacher-kind models on ``x``, as
    the run's ensemble computes them (``teachers.votes.Ensemble``: fixed maps outside vmap)."""
    ensemble = Ensemble(recipe.train.model, recipe.in_shape, recipe.num_classes, [params],
                        recipe.device, recipe.encoder)
    out = [torch.log_softmax(logits.double(), -1).cpu()
           for logits in ensemble.logits(x.astype(np.float32, copy=False), batch_size)]
    models = next(iter(params.values())).shape[0]
    return (torch.cat(out, 1).numpy() if out
            else np.zeros((models, 0, recipe.num_classes)))


def select_models(params: dict[str, torch.Tensor], rows: slice | list[int]
                  ) -> dict[str, torch.Tensor]:
    """The models ``rows`` of stacked parameters."""
    return {k: v[rows] for k, v in params.items()}


@dataclass(frozen=True)
class StudentRecipe:
    """How the run trained its student: method and network, the loop's settings, the pool
    features of ``cnn-hog-simclr`` (from the published student: public), its rounds and the
    answers' rows in order."""

    method: MethodConfig
    spec: ModelSpec
    fit: FitConfig
    features: PoolFeatures | None
    rounds: list[tuple[Mechanism, NDArray[np.int64]]]
    epsilon: float
    epsilon_basis: str
    delta: float


def train_student(recipe: StudentRecipe, pool_x: NDArray[np.float32],
                  answer: Callable[[int, NDArray[np.float64] | None], NDArray[np.int64]]
                  ) -> torch.nn.Module:
    """The student of the run's rounds: round i's labels are ``answer(i, probs)`` (probs: the
    current student's on the round's rows, for Interactive-GNMax, else None); after each round
    the student is trained on every label so far, continuing from the previous round's weights
    (``pate student train``). Rows answered -1 are not used."""
    seed_everything(recipe.fit.seed)
    model = build_classifier(recipe.spec, recipe.features).to(recipe.fit.device)
    index, label = np.zeros(0, np.int64), np.zeros(0, np.int64)
    for i, (mechanism, rows) in enumerate(recipe.rounds):
        probs = (predict_proba(model, pool_x[rows], recipe.fit.device) if i
                 and steps(mechanism).student_gamma is not None else None)
        index = np.concatenate([index, rows])
        label = np.concatenate([label, answer(i, probs)])
        ok = label >= 0
        if not ok.any():
            continue
        fit(build_learner(recipe.method, model, recipe.spec), pool_x[index[ok]], label[ok],
            pool_x, recipe.fit)
    return model


@torch.no_grad()
def classifier_log_probs(model: torch.nn.Module, x: NDArray[np.float32], device: str
                         ) -> NDArray[np.float64]:
    """Log-probabilities ``[n, classes]`` of a student-kind classifier on ``x``."""
    return np.log(np.clip(predict_proba(model, x, device), 1e-300, None))
