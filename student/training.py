"""The students' methods and the training loop they share; prediction; saving/loading weights.

A learner (``student.supervised``, ``student.vat``, ``student.gan``) does one optimisation step on
a labelled batch and an unlabelled batch; ``fit`` feeds it. An epoch is one pass over the
unlabelled pool (as in the released code of Miyato et al. 2018 and Salimans et al. 2016), the few
labelled examples being drawn again and again in fresh random orders; the supervised baseline gets
the same number of steps, so every method has the same budget. The learning rate of Adam ramps
down linearly to zero over the last ``decay_from`` part of the steps, as both papers' code does.

Weights are written with safetensors (https://huggingface.co/docs/safetensors) next to a JSON
description of the network (``student/models.ModelSpec``), atomically (``pate.io``).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import numpy as np
import torch
from torch import nn

from pate.data.augment import AUGMENTATIONS, random_augment
from pate.errors import UserError
from pate.io import write_bytes_atomic, write_json_atomic
from student.choices import (
    ARCHITECTURE_RECORDS,
    ARCHITECTURES,
    METHOD_RECORDS,
    METHODS,
    POOL_FEATURE_ARCHS,
    arch_method_problem,
    methods_for_tables,
)
from student.defaults import STUDENT
from student.models import (
    Generator,
    ModelSpec,
    PoolFeatures,
    build_classifier,
)
from teachers.choices import is_import_path, model_name_problem
from teachers.fixed_maps import Pixels, feature_table, table_fits, table_width
from teachers.models import on_features
from teachers.user_models import check_trains_on, load_factory


@dataclass(frozen=True)
class MethodConfig:
    """A student method and its network: ``arch`` (default per method; the GAN needs its
    ``wn-mlp`` discriminator; vat and supervised also take a user's network by its import path
    ``package.module:factory``, :mod:`teachers.user_models`, imported here to fail early), Adam's
    learning rate (default per method), VAT's eps and entropy minimisation."""

    method: str
    arch: str | None = None
    width: int = STUDENT.width
    lr: float | None = None
    vat_eps: float = STUDENT.vat_eps
    entmin: bool = False

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")
        problem = None if self.arch is None else model_name_problem(self.arch, ARCHITECTURES)
        if problem:
            raise ValueError(f"arch {problem}")
        problem = arch_method_problem(self.method, self.arch)
        if problem:
            raise ValueError(problem)
        if self.arch is not None and is_import_path(self.arch):
            load_factory(self.arch, "arch")
        if not self.vat_eps > 0:
            raise ValueError(f"VAT's eps must be > 0, got {self.vat_eps!r}")

    def spec(self, in_shape: tuple[int, int, int], num_classes: int) -> ModelSpec:
        return ModelSpec(self.arch or METHOD_RECORDS[self.method].default_arch, tuple(in_shape),
                         num_classes, self.width)

    @property
    def learning_rate(self) -> float:
        return METHOD_RECORDS[self.method].lr if self.lr is None else self.lr


def method_for_data(kind: str, method: str, arch: str | None = None,
                    width: int = STUDENT.width, lr: float | None = None,
                    vat_eps: float = STUDENT.vat_eps, entmin: bool = False
                    ) -> MethodConfig:
    """The method and its network for ``kind`` of data (``image`` or ``tabular``): on tabular
    features the default network is the MLP, and the networks (and the GAN) made for images are
    refused (``UserError``, its message led by the option's name: ``arch`` or ``method``)."""
    if kind == "tabular":
        record = METHOD_RECORDS.get(method)
        if record is not None and record.images_only is not None:
            raise UserError(f"method {method} is for images ({record.images_only}); on tabular "
                            f"data use {methods_for_tables()}")
        if arch is None:
            arch = "mlp"
        elif arch in ARCHITECTURE_RECORDS and ARCHITECTURE_RECORDS[arch].images_only:
            raise UserError(f"arch {arch} needs images; on tabular data use mlp")
    try:
        return MethodConfig(method, arch, width, lr, vat_eps, entmin)
    except ValueError as exc:
        raise UserError(str(exc)) from None


@dataclass(frozen=True)
class FitConfig:
    """Hyper-parameters of the loop (the learners hold their own); the defaults are
    :data:`student.defaults.STUDENT`."""

    epochs: int = STUDENT.epochs
    batch_size: int = STUDENT.batch_size  # labelled examples per step
    # unlabelled examples per step (one epoch = one pass)
    unlabelled_batch_size: int = STUDENT.unlabelled_batch_size
    lr: float = 1e-3
    decay_from: float = 0.5            # linear decay to 0 over the last half of the steps
    augment: str = "none"              # pate.data.augment: random shifts (and mirroring) per step
    balance_classes: bool = False      # oversample the labelled set's rarer labels (see below)
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.augment not in AUGMENTATIONS:
            raise ValueError(f"augment must be one of {AUGMENTATIONS}, got {self.augment!r}")


class Learner(Protocol):
    """What ``fit`` drives: the published classifier, the optimisers and one step. A learner
    whose step reads the labelled batch only, and only through ``self.model(x_lab)``, says so
    with a class attribute ``labelled_only = True``: ``fit`` may then hand it rows of a table of
    its network's fixed maps, with ``self.model`` a head that reads them (:func:`_on_table`)."""

    model: nn.Module
    optimizers: list[torch.optim.Optimizer]

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]: ...


@dataclass(frozen=True)
class FitResult:
    """Per-epoch mean losses and wall-clock seconds."""

    losses: list[dict[str, float]]
    seconds_per_epoch: list[float]


def _smoothed_expert(arch: str) -> int | None:
    """The expert VAT smooths in ``arch`` (None: the whole network; a user's network too)."""
    record = ARCHITECTURE_RECORDS.get(arch)
    return None if record is None else record.smoothed_expert


def build_learner(method: MethodConfig, model: nn.Module, spec: ModelSpec) -> Learner:
    """The learner of ``method`` around ``model`` (built from ``spec``); the GAN learner builds
    its generator for ``spec.in_shape``."""
    lr = method.learning_rate
    if method.method == "vat":
        from student.vat import VATLearner

        return VATLearner(model, eps=method.vat_eps, entmin=method.entmin, lr=lr,
                          smoothed=_smoothed_expert(spec.arch))
    if method.method == "gan":
        from student.gan import GANLearner

        device = next(model.parameters()).device
        return GANLearner(model, Generator(spec.in_shape).to(device), lr=lr)
    from student.supervised import SupervisedLearner

    return SupervisedLearner(model, lr=lr)


def _set_lr(learner: Learner, scale: float) -> None:
    for opt in learner.optimizers:
        for group in opt.param_groups:
            group.setdefault("initial_lr", group["lr"])
            group["lr"] = group["initial_lr"] * scale


def lr_scale(step: int, total: int, decay_from: float) -> float:
    """1 until ``decay_from * total`` steps, then linearly down to 0 at ``total``."""
    start = int(decay_from * total)
    return 1.0 if step < start else max(0.0, (total - step) / max(1, total - start))


def balanced_indices(labels: np.ndarray) -> np.ndarray:
    """Indices into ``labels`` in which every present class appears as often as the most frequent
    one, its examples repeated cyclically: random oversampling of the minority classes (M. Buda,
    A. Maki, M. A. Mazurowski, "A systematic study of the class imbalance problem in convolutional
    neural networks", Neural Networks 106, 2018, §3.2.1). The aggregator answers the classes the
    teachers agree on more often (on Fashion-MNIST it answered 19 shirts of 511 labels against
    about 50 of each other class), so the student's label set is skewed where the teachers are
    weakest."""
    labels = np.asarray(labels)
    order = np.argsort(labels, kind="stable")
    _, starts, counts = np.unique(labels[order], return_index=True, return_counts=True)
    repeat = np.arange(counts.max())
    return order[(starts[:, None] + repeat[None, :] % counts[:, None]).ravel()]


def fit(learner: Learner, x_lab: np.ndarray, y_lab: np.ndarray, x_unl: np.ndarray,
        config: FitConfig,
        on_epoch: Callable[[int, dict[str, float]], None] | None = None) -> FitResult:
    """Train ``learner`` for ``config.epochs`` passes over ``x_unl`` (float32 [n, C, H, W]),
    with labelled batches from ``(x_lab, y_lab)`` (at least one example); ``on_epoch(epoch,
    mean losses)`` after each epoch. With ``config.balance_classes`` the labelled batches are
    drawn from ``balanced_indices(y_lab)``."""
    if len(y_lab) == 0:
        raise ValueError("the student needs at least one labelled example")
    lab_pool = torch.as_tensor(balanced_indices(y_lab) if config.balance_classes
                               else np.arange(len(y_lab)))
    device = torch.device(config.device)
    gen = torch.Generator().manual_seed(config.seed)
    xl = torch.as_tensor(x_lab, dtype=torch.float32, device=device)
    yl = torch.as_tensor(y_lab, dtype=torch.int64, device=device)
    xu = torch.as_tensor(x_unl, dtype=torch.float32, device=device)
    ub = min(config.unlabelled_batch_size, len(xu))
    # a single answer is drawn twice per batch: batch norm cannot train on a batch of one row,
    # and a round that bought one answer must not leave a run that can never go on
    lb = min(config.batch_size, max(2, len(lab_pool)))
    if min(lb, ub) < 2:  # batch_size 1, or a pool of one row
        check_trains_on(learner.model, 1, tuple(xl.shape[1:]), "the student's network", device,
                        "a batch size of at least 2, and a pool of at least 2 rows")
    steps = len(xu) // ub
    total = steps * config.epochs
    lab_order = torch.empty(0, dtype=torch.int64)
    losses, seconds = [], []
    model = learner.model.train()
    on_table = _on_table(learner, config, xl)
    if on_table is not None:  # the steps' network reads the table's rows; it trains ``model``
        learner.model, xl = on_table
    try:
        for epoch in range(config.epochs):
            start = time.perf_counter()
            perm = torch.randperm(len(xu), generator=gen)
            sums: dict[str, float] = {}
            for i in range(steps):
                while len(lab_order) < lb:  # a fresh random order of the labelled set
                    order = torch.randperm(len(lab_pool), generator=gen)
                    lab_order = torch.cat([lab_order, lab_pool[order]])
                li, lab_order = lab_order[:lb], lab_order[lb:]
                _set_lr(learner, lr_scale(epoch * steps + i, total, config.decay_from))
                stats = learner.step(random_augment(xl[li.to(device)], config.augment, gen),
                                     yl[li.to(device)],
                                     random_augment(xu[perm[i * ub:(i + 1) * ub].to(device)],
                                                    config.augment, gen))
                for k, v in stats.items():
                    sums[k] = sums.get(k, 0.0) + v
            losses.append({k: v / steps for k, v in sums.items()})
            seconds.append(time.perf_counter() - start)
            if on_epoch is not None:
                on_epoch(epoch, losses[-1])
    finally:
        learner.model = model
    settle_batch_norm(model, xu[torch.randperm(len(xu), generator=gen).to(device)], ub)
    return FitResult(losses, seconds)


def _on_table(learner: Learner, config: FitConfig, x: torch.Tensor
              ) -> tuple[nn.Module, torch.Tensor] | None:
    """``(head, table)`` where ``learner`` reads labelled rows only through its model
    (``labelled_only``), none is augmented (the maps see every row as it is) and its network
    has fixed maps (``cnn-hog-scatter``'s HOG and scattering): ``table`` holds the maps'
    outputs and the input's own columns on every row of ``x``, computed once, and ``head``
    (:func:`teachers.models.on_features`) trains the learner's model from its rows. The maps
    of a batch of 32 rows took 45 % of a step of that student (docs/benchmarks.md). None
    otherwise, and where the table would take more than a quarter of the memory left on its
    device (large images' scattering): the maps run on each batch."""
    if not getattr(learner, "labelled_only", False) or config.augment != "none":
        return None
    found = on_features(learner.model, tuple(x.shape[1:]), inputs=True)
    if found is None or all(isinstance(m, Pixels) for m in found[1]):
        return None
    head, maps = found
    fits = table_fits(len(x), table_width(head), x.device)
    return (head, feature_table(maps, x)) if fits else None


@torch.no_grad()
def settle_batch_norm(model: nn.Module, x: torch.Tensor, batch_size: int) -> None:
    """Set the running statistics of ``model``'s batch-norm layers to their averages over the
    rows of ``x`` (the public pool, shuffled: no privacy cost), the figures evaluation mode
    uses. Training leaves exponential averages (momentum 0.1) of its last batches, augmented
    ones, and after few steps still much of their start (mean 0, variance 1): a student trained
    20 steps on 300 rows scored 0.33 on 3 classes in evaluation mode, 0.63 with its batch
    statistics. Precise BN (Wu & Johnson, "Rethinking 'Batch' in BatchNorm", 2021), as
    ``torch.optim.swa_utils.update_bn`` computes it, which weighs every batch alike: so the
    rows go in batches of equal size (at most ``batch_size``, within one row), never a small
    last one. A network without batch norm is left as it is."""
    if len(x) > 1:
        chunks = torch.tensor_split(x, min(math.ceil(len(x) / batch_size), len(x) // 2))
        torch.optim.swa_utils.update_bn(chunks, model)


@torch.no_grad()
def predict_proba(model: nn.Module, x: np.ndarray, device: str = "cpu",
                  batch_size: int = 1024) -> np.ndarray:
    """Class probabilities float64 [n, classes] of ``model`` in evaluation mode."""
    model.eval()
    out = []
    for i in range(0, len(x), batch_size):
        xb = torch.as_tensor(x[i:i + batch_size], dtype=torch.float32, device=device)
        out.append(torch.softmax(model(xb).float(), dim=1).double().cpu())
    return torch.cat(out).numpy() if out else np.zeros((0, 0))


def accuracy(model: nn.Module, x: np.ndarray, y: np.ndarray, device: str = "cpu",
             batch_size: int = 1024) -> float:
    """Top-1 accuracy of ``model`` on ``(x, y)``, ``batch_size`` rows at a time."""
    return float(np.mean(predict_proba(model, x, device, batch_size).argmax(axis=1) == y))


def seed_everything(seed: int) -> None:
    """Seed torch's global generator (weight initialisation, noise layers, VAT's directions):
    training runs are reproducible offline experiments; the aggregator's noise is not seeded."""
    torch.manual_seed(seed)


def save_model(model: nn.Module, spec: ModelSpec, directory: Path, name: str = "model") -> None:
    """``directory/name.safetensors`` and ``directory/name.json`` (the spec), atomically."""
    from safetensors.torch import save

    state = {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items()}
    write_bytes_atomic(directory / f"{name}.safetensors", save(state))
    write_json_atomic(directory / f"{name}.json", spec.as_json())


def load_spec(directory: Path, name: str = "model") -> ModelSpec | None:
    """The spec saved next to ``name.safetensors``, or None when there is none."""
    path = directory / f"{name}.json"
    if not (path.is_file() and (directory / f"{name}.safetensors").is_file()):
        return None
    try:
        return ModelSpec.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, KeyError, TypeError):  # JSONDecodeError and UnicodeDecodeError too
        raise UserError(f"{path}: not a student's description: this run directory is "
                        "damaged") from None


def load_weights(model: nn.Module, directory: Path, name: str = "model") -> nn.Module:
    """Load ``directory/name.safetensors`` into ``model`` (strict) and return it."""
    from safetensors.torch import load_file

    model.load_state_dict(load_file(str(directory / f"{name}.safetensors")))
    return model


class NetworkChanged(UserError):
    """A user's saved network (``package.module:factory``) whose factory now builds other
    layers than its weights were saved from: its code changed since it was saved."""


def load_classifier(directory: Path, name: str = "model") -> tuple[nn.Module, ModelSpec] | None:
    """The saved classifier and its spec, or None when ``directory`` holds none; a
    ``cnn-hog-simclr`` student's pool features are rebuilt from its own saved tensors."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    spec = load_spec(directory, name)
    if spec is None:
        return None
    path = directory / f"{name}.safetensors"
    damaged = UserError(f"{path}: not the weights of the student {spec.arch} that {name}.json "
                        "describes: this run directory is damaged")
    if path.is_file() and not os.access(path, os.R_OK):  # safetensors says "no such file"
        raise UserError(f"{path}: not readable by you (its permissions)")
    try:
        state = load_file(str(path))
    except (OSError, SafetensorError):
        raise damaged from None
    try:
        features = PoolFeatures.from_state(state) if spec.arch in POOL_FEATURE_ARCHS else None
        model = build_classifier(spec, features)
        model.load_state_dict(state)
    except (RuntimeError, KeyError, ValueError):
        if not is_import_path(spec.arch):
            raise damaged from None
        raise NetworkChanged(f"{path}: not the weights of the student {spec.arch} that "
                             f"{name}.json describes: {spec.arch} builds other layers than "
                             "these weights were saved from (its code changed since?)"
                             ) from None
    return model, spec
