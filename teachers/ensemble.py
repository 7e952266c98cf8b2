"""Vectorised training of K teachers in one process, each on its own partition only.

The K teachers' parameters are stacked on a leading axis and the architecture is mapped over the
stack with ``torch.func.vmap(functional_call(...))`` (https://pytorch.org/docs/stable/func.html).
vmap lowers convolutions to grouped convolutions; hand-written grouped convolutions measured the
same on a 2-core CPU (within 5 %), so the generic form is kept. At each step teacher k gets a
minibatch ``[b, C, H, W]`` drawn from its own partition; the loss is the sum over teachers of each
teacher's mean cross-entropy, so every teacher's gradient is its own. AdamW (I. Loshchilov,
F. Hutter, ICLR 2019) acts elementwise, so one optimiser over the stack is K independent ones;
the learning rate follows a one-cycle schedule (L. N. Smith, N. Topin, "Super-Convergence",
2019), which suits the few hundred steps a small teacher gets. Both are
:mod:`teachers.optimiser`'s, which give each teacher its own schedule.

Determinism: a teacher's initial weights, its minibatch order (a fresh permutation of its
partition each epoch), its augmentation and its mixup weights are counter-based random numbers
of (seed, teacher id, position) (:mod:`teachers.rng`), independent of which teachers share the
group. A teacher takes ``epochs * ceil(rows / batch_size)`` steps, ``rows`` what its partition
sets (``teachers.partition.Partition.step_rows``): the smallest partition of the whole run where
the rows were dealt by position, its own where they were dealt by record or key. Teachers of a group
that take different numbers of steps still train as one stack: it is ordered by steps, most
first, and each step trains the teachers that have steps left, on their own schedules. Either
way a group reproduces the teachers trained one by one (:func:`train_one`).

Where every path of a built-in network starts with a fixed map (``hog``, ``scatter``,
``hog-scatter``: :func:`teachers.models.on_features`), only its head is mapped over the teachers;
the maps run outside vmap, on each step's shifted or mixed rows, or, where the rows are neither
augmented nor mixed, once per row of the group before training (:mod:`teachers.fixed_maps`).
Either way the teachers are those :func:`train_one` trains on the pixels.

A user's own network (``model = "package.module:factory"``, :mod:`teachers.user_models`) trains
the same way when it passes the vmap test (:func:`vectorised`); its stacked state then holds its
buffers too, each teacher's own. When it does not (dropout, data-dependent control flow), one
warning line says so and :func:`train_group` trains its teachers one at a time with
:func:`train_one`, the slower path, returning the same stacked state; the random numbers such a
forward draws come from torch's generator seeded from (seed, teacher).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, vmap

from pate.data.augment import AUGMENTATIONS, MAX_SHIFT, shift_flip
from pate.data.datasets import TEACHER_AUGMENT
from pate.data.task import Benchmark, DataSource
from pate.errors import UserError
from teachers import rng
from teachers.choices import DEFAULT_MODEL, MODELS, is_import_path, model_name_problem
from teachers.defaults import TEACHERS
from teachers.fixed_maps import FixedMap, feature_table, table_fits, table_width
from teachers.models import build_model, initial_state, on_features
from teachers.optimiser import TeacherAdamW
from teachers.partition import check_disjoint, own_rows
from teachers.user_models import (
    load_factory,
    load_state,
    module_state,
    seeded,
    vmap_problem,
    warn_one_at_a_time,
)

# Beyond a million epochs or rows a batch, a teacher's steps and their drawn orders would
# overflow or exhaust memory deep in training (after the partition is recorded): refused first.
MOST_EPOCHS_OR_BATCH = 1_000_000


@dataclass(frozen=True)
class TrainConfig:
    """How every teacher of a run is trained (recorded in the manifest). ``augment`` is one of
    :data:`AUGMENTATIONS`; the defaults are :data:`teachers.defaults.TEACHERS`. ``mixup`` is
    the alpha of mixup's Beta(alpha, alpha) (0: off); with ``cnn-pool`` and mixup 0.4 a
    Fashion-MNIST run's 250 teachers reached 0.774 (plurality 0.834). ``model`` is a built-in
    name or the import path of a user's factory, imported here to fail early."""

    model: str = "cnn"
    epochs: int = TEACHERS.epochs
    batch_size: int = TEACHERS.batch_size
    lr: float = TEACHERS.lr
    weight_decay: float = TEACHERS.weight_decay
    augment: str = "none"
    mixup: float = TEACHERS.mixup
    seed: int = 0

    def __post_init__(self) -> None:
        if not self.mixup >= 0:
            raise UserError("mixup (the Beta distribution's alpha) must be >= 0; 0 turns it off")
        if self.augment not in AUGMENTATIONS:
            raise UserError(f"augment must be one of {', '.join(AUGMENTATIONS)}")
        problem = model_name_problem(self.model, MODELS)
        if problem:
            raise UserError(f"model {problem}")
        if is_import_path(self.model):
            load_factory(self.model)
        for name, count in (("epochs", self.epochs), ("batch_size", self.batch_size)):
            if not 1 <= count <= MOST_EPOCHS_OR_BATCH:
                raise UserError(f"{name} must be at least 1 and at most "
                                f"{MOST_EPOCHS_OR_BATCH:,}, got {count}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise UserError(f"lr must be a finite number > 0, got {self.lr!r}")
        if not 0 <= self.seed < rng.SEED_LIMIT:
            raise UserError(f"the seed must be in [0, 2^63), got {self.seed}")


def train_config_for(source: DataSource, kind: str, *, model: str | None = None,
                     augment: str = "auto", seed: int = 0,
                     **given: int | float | None) -> TrainConfig:
    """The training settings of teachers on ``source``, data of ``kind`` (``image`` or
    ``tabular``): ``model``, else the kind's ``DEFAULT_MODEL``; ``augment``, or for ``auto``
    the benchmark's (``pate.data.datasets.TEACHER_AUGMENT``; none for other data); the
    ``TrainConfig`` defaults where ``given`` (epochs, batch_size, lr, mixup) is None."""
    name = source.name if isinstance(source, Benchmark) else ""
    return TrainConfig(model=model or DEFAULT_MODEL[kind], seed=seed,
                       augment=TEACHER_AUGMENT.get(name, "none") if augment == "auto" else augment,
                       **{k: v for k, v in given.items() if v is not None})


def total_steps(cfg: TrainConfig, rows: np.ndarray) -> np.ndarray:
    """Optimiser steps of teachers whose partitions set ``rows`` (``Partition.step_rows``):
    ``epochs * ceil(rows / batch_size)``, elementwise."""
    return cfg.epochs * -(-np.asarray(rows, dtype=np.int64) // cfg.batch_size)


def example_order(seed: int, teacher_ids: np.ndarray, sizes: np.ndarray, draws: int
                  ) -> np.ndarray:
    """``[K, draws]`` local row numbers: teacher k's rows ``0..sizes[k]-1``, a new random
    permutation of them per epoch, concatenated."""
    sizes = np.asarray(sizes, dtype=np.int64)
    epochs = -(-draws // int(sizes.min()))
    keys = rng.uniform(seed, teacher_ids, rng.ORDER,
                       np.arange(epochs)[None, :, None], np.arange(sizes.max())[None, None, :])
    keys = np.where(np.arange(sizes.max())[None, None, :] < sizes[:, None, None], keys, 2.0)
    perms = np.argsort(keys, axis=2, kind="stable")
    pos = np.arange(draws)[None, :]
    k = np.arange(len(sizes))[:, None]
    return perms[k, pos // sizes[:, None], pos % sizes[:, None]]


def augment_params(seed: int, teacher_ids: np.ndarray, draws: int,
                   max_shift: int = MAX_SHIFT) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per draw: a shift (dy, dx) in [-max_shift, max_shift] and a horizontal-flip bit."""
    b = rng.bits(seed, teacher_ids, rng.AUGMENT, np.arange(draws)[None])
    span = np.uint64(2 * max_shift + 1)
    dy = (b % span).astype(np.int64) - max_shift
    dx = ((b >> np.uint64(8)) % span).astype(np.int64) - max_shift
    flip = ((b >> np.uint64(16)) & np.uint64(1)).astype(bool)
    return dy, dx, flip


def mixup_weights(seed: int, teacher_ids: np.ndarray, draws: int, alpha: float) -> np.ndarray:
    """Per draw, mixup's weight lambda ~ Beta(alpha, alpha) (float32 ``[K, draws]``, by the
    inverse CDF of counter-based uniforms); all ones when ``alpha`` is 0 (no mixing)."""
    if alpha == 0:
        return np.ones((len(teacher_ids), draws), np.float32)
    from scipy.stats import beta

    u = rng.uniform(seed, teacher_ids, rng.MIXUP, np.arange(draws)[None])
    return beta.ppf(u, alpha, alpha).astype(np.float32)


def _cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Per-example cross-entropy ``[K * b]`` of logits ``[K, b, C]``, or of an
    :class:`~teachers.models.Experts` model's ``[K, b, E, C]`` summed over its experts (each
    expert's gradient is its own)."""
    if logits.dim() == 4:
        y = y[..., None].expand(logits.shape[:-1])
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="none")
    return ce.reshape(y.shape[0] * y.shape[1], -1).sum(1)


def _loss(cfg: TrainConfig, forward: Callable[[torch.Tensor], torch.Tensor], xb: torch.Tensor,
          yb: torch.Tensor, lam: torch.Tensor) -> torch.Tensor:
    """Sum over teachers of each teacher's mean cross-entropy on its batch ``xb [K, b, ...]``.

    With mixup (H. Zhang et al., "mixup: Beyond Empirical Risk Minimization", ICLR 2018, eq. 1)
    example i of a teacher's batch is mixed with example b-1-i of the same batch (the batch is a
    random draw, so this is a random pairing, and a teacher never mixes in another's data):
    x = lam x_i + (1 - lam) x_{b-1-i}, loss = lam CE(y_i) + (1 - lam) CE(y_{b-1-i})."""
    if cfg.mixup == 0:
        return _cross_entropy(forward(xb), yb).sum() / yb.shape[1]
    w = lam.reshape(*lam.shape, *(1,) * (xb.dim() - 2))
    logits = forward(w * xb + (1 - w) * xb.flip(1))
    ce = [_cross_entropy(logits, y) for y in (yb, yb.flip(1))]
    lam = lam.reshape(-1)
    return (lam * ce[0] + (1 - lam) * ce[1]).sum() / yb.shape[1]


def _batches(cfg: TrainConfig, teacher_ids: np.ndarray, parts: list[np.ndarray],
             steps: np.ndarray, device: torch.device
             ) -> Callable[[int], tuple[torch.Tensor, ...]]:
    """A function step -> (global rows [K, b], dy, dx, flip, mixup weight), for teacher k's
    ``steps[k]`` steps; a teacher's rows past its own steps are 0 (never read). The orders are
    drawn per number of steps: drawn for all at the most steps, a teacher of one row beside one
    of 2 000 took 2.8 GB at 20 epochs (the small one's epochs times the largest partition)."""
    b = cfg.batch_size
    sizes = np.array([len(p) for p in parts])
    padded = np.zeros((len(parts), sizes.max()), dtype=np.int64)
    mask = np.arange(sizes.max())[None] < sizes[:, None]
    padded[mask] = np.concatenate(parts)
    draws = int(steps.max()) * b
    rows = np.zeros((len(parts), draws), dtype=np.int64)
    for count in np.unique(steps):
        group = np.flatnonzero(steps == count)
        rows[group, :count * b] = np.take_along_axis(padded[group], example_order(
            cfg.seed, teacher_ids[group], sizes[group], int(count) * b), 1)
    aug = augment_params(cfg.seed, teacher_ids, draws)
    lam = mixup_weights(cfg.seed, teacher_ids, draws, cfg.mixup)
    tensors = [torch.as_tensor(a, device=device) for a in (rows, *aug, lam)]

    def batch(step: int) -> tuple[torch.Tensor, ...]:
        return tuple(t[:, step * b:(step + 1) * b] for t in tensors)
    return batch


def _augmented(cfg: TrainConfig, x: torch.Tensor, rows: torch.Tensor, dy: torch.Tensor,
               dx: torch.Tensor, flip: torch.Tensor) -> torch.Tensor:
    xb = x[rows.reshape(-1)]
    if cfg.augment != "none":
        flip = flip if cfg.augment == "shift-flip" else torch.zeros_like(flip)
        xb = shift_flip(xb, dy.reshape(-1), dx.reshape(-1), flip.reshape(-1))
    return xb.reshape(*rows.shape, *xb.shape[1:])


def vectorised(cfg: TrainConfig, in_shape: tuple[int, ...], num_classes: int,
               device: str | torch.device = "cpu") -> bool:
    """Whether the teachers of ``cfg.model`` train vectorised: a built-in always; a user's
    network when teachers 0 and 1 pass :func:`teachers.user_models.vmap_problem` on rows of
    ``in_shape``; otherwise one warning line says they are trained one at a time."""
    if not is_import_path(cfg.model):
        return True
    base = build_model(cfg.model, in_shape, num_classes).to(device)
    init = initial_state(cfg.model, base, in_shape, num_classes, np.arange(2), cfg.seed)
    problem = vmap_problem(cfg.model, base, {k: v.to(device) for k, v in init.items()},
                           in_shape, num_classes, train=True)
    if problem is not None:
        warn_one_at_a_time(cfg.model, problem, "training")
    return problem is None


def train_group(cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                teacher_ids: np.ndarray, parts: list[np.ndarray], step_rows: int | np.ndarray,
                encoder: dict[str, torch.Tensor] | None = None,
                on_epochs: Callable[[int], None] | None = None,
                memory_share: float = 1.0) -> dict[str, torch.Tensor]:
    """Train the teachers ``teacher_ids`` together; teacher k only ever reads rows ``parts[k]``
    of ``x``/``y`` (already on the target device) and takes ``total_steps(cfg, step_rows[k])``
    steps (an int: the same for all). ``encoder``: the run's frozen pool encoder,
    for the architectures that use one (shared, not trained). Returns the teachers' stacked
    parameters (CPU), and a user's network's buffers. A user's network that fails the vmap test
    (:func:`vectorised`) is trained one teacher at a time (:func:`train_one`), the slower
    path, and so is one alone (the non-private model). ``on_epochs(n)``: ``n`` more
    teacher-epochs are done (after each epoch). ``memory_share``: the part of the device's
    memory this group may count on (:func:`teachers.fixed_maps.table_fits`)."""
    check_disjoint(parts, len(x))
    ids = np.asarray(teacher_ids, dtype=np.int64)
    rows = np.broadcast_to(np.asarray(step_rows, dtype=np.int64), ids.shape)
    alone = len(ids) == 1 and is_import_path(cfg.model)  # a user's network, alone: no probe
    if alone or not vectorised(cfg, tuple(x.shape[1:]), num_classes, x.device):
        states = [module_state(train_one(cfg, x, y, num_classes, int(t), part, int(r),
                                         on_epochs=on_epochs))
                  for t, part, r in zip(ids, parts, rows, strict=True)]
        return {k: torch.stack([s[k] for s in states]).cpu() for k in states[0]}
    steps = total_steps(cfg, rows)
    order = np.argsort(-steps, kind="stable")  # most steps first
    state = _train_stacked(cfg, x, y, num_classes, ids[order], [parts[i] for i in order],
                           steps[order], encoder, on_epochs, memory_share)
    back = torch.as_tensor(np.argsort(order))
    return {k: v[back] for k, v in state.items()}


def _train_stacked(cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                   ids: np.ndarray, parts: list[np.ndarray], steps: np.ndarray,
                   encoder: dict[str, torch.Tensor] | None,
                   on_epochs: Callable[[int], None] | None,
                   memory_share: float) -> dict[str, torch.Tensor]:
    """:func:`train_group`'s vectorised path: teacher k takes ``steps[k]`` steps (most first).
    Step s trains the teachers that still have steps to take, the group's first ones, on
    their own one-cycle schedules (:mod:`teachers.optimiser`); the others are done."""
    device = x.device
    in_shape = tuple(x.shape[1:])
    # The module's own parameters are never used (functional_call replaces them), its buffers
    # (a frozen encoder's) are: so it lives on the device.
    base = build_model(cfg.model, in_shape, num_classes, encoder).to(device)
    trainable = {n for n, p in base.named_parameters() if p.requires_grad}
    state = {k: v.to(device) for k, v in
             initial_state(cfg.model, base, in_shape, num_classes, ids, cfg.seed).items()}
    trained = [k for k in state if k in trainable]
    opt = TeacherAdamW([state[k] for k in trained], steps, cfg.lr, cfg.weight_decay)
    split = None if is_import_path(cfg.model) else on_features(base, in_shape)
    maps: list[FixedMap] = []
    if split is not None:  # the head is mapped over the teachers, the fixed maps run outside
        base, maps = split
        # the rows reach the maps as they are, and their table fits: the maps run once a row
        if cfg.augment == "none" and cfg.mixup == 0 and table_fits(
                sum(len(p) for p in parts), table_width(base), device, memory_share):
            x, y, parts = _mapped_rows(maps, x, y, parts)
            maps = []
    batch = _batches(cfg, ids, parts, steps, device)
    head = vmap(lambda p, xb: functional_call(base, p, (xb,)))

    def forward(params: dict[str, torch.Tensor], xb: torch.Tensor) -> torch.Tensor:
        """Logits of the teachers ``params`` on their batches ``xb [live, b, ...]`` (shifted
        or mixed rows through the fixed maps first, if any)."""
        if maps:
            xb = feature_table(maps, xb.flatten(0, 1)).unflatten(0, xb.shape[:2])
        return head(params, xb)

    per_epoch = steps // cfg.epochs
    for step in range(int(steps[0])):
        live = int(np.count_nonzero(steps > step))
        params = {k: v[:live].detach().requires_grad_(k in trainable)
                  for k, v in state.items()}
        rows, dy, dx, flip, lam = (t[:live] for t in batch(step))
        loss = _loss(cfg, partial(forward, params), _augmented(cfg, x, rows, dy, dx, flip),
                     y[rows], lam)
        grads = torch.autograd.grad(loss, [params[k] for k in trained], allow_unused=True)
        opt.step(step, grads)
        if on_epochs is not None:
            ended = np.count_nonzero((step + 1) % per_epoch[:live] == 0)
            if ended:
                on_epochs(int(ended))
    return {k: v.cpu() for k, v in state.items()}


def _mapped_rows(maps: list[FixedMap], x: torch.Tensor, y: torch.Tensor,
                 parts: list[np.ndarray]) -> tuple[torch.Tensor, torch.Tensor, list[np.ndarray]]:
    """The table of the fixed ``maps`` on the group's own rows (``parts``, in order), their
    labels, and each teacher's rows renumbered in it: a teacher reads the same rows, once
    mapped."""
    used, renumbered = own_rows(parts)
    rows = torch.as_tensor(used, device=x.device)
    return feature_table(maps, x[rows]), y[rows], renumbered


def train_one(cfg: TrainConfig, x: torch.Tensor, y: torch.Tensor, num_classes: int,
              teacher_id: int, part: np.ndarray, step_rows: int,
              encoder: dict[str, torch.Tensor] | None = None,
              on_epochs: Callable[[int], None] | None = None) -> nn.Module:
    """The same teacher as :func:`train_group` would produce, trained alone as a plain module
    for ``total_steps(cfg, step_rows)`` steps (the one-at-a-time baseline of the benchmark, the
    reference of the equivalence test, and the slower path of a user's network that vmap cannot
    map). The random numbers its forward draws (dropout) come from torch's generator seeded
    from (seed, teacher)."""
    ids = np.array([teacher_id])
    in_shape = tuple(x.shape[1:])
    model = build_model(cfg.model, in_shape, num_classes, encoder).to(x.device)
    load_state(model, initial_state(cfg.model, model, in_shape, num_classes, ids, cfg.seed), 0)
    trained = [p for p in model.parameters() if p.requires_grad]
    steps = int(total_steps(cfg, step_rows))
    opt = TeacherAdamW([p.detach()[None] for p in trained], np.array([steps]), cfg.lr,
                       cfg.weight_decay)
    batch = _batches(cfg, ids, [part], np.array([steps]), x.device)
    per_epoch = steps // cfg.epochs
    with seeded(cfg.seed, teacher_id, rng.FORWARD, x.device):
        for step in range(steps):
            rows, dy, dx, flip, lam = batch(step)
            loss = _loss(cfg, lambda xb: model(xb[0])[None],
                         _augmented(cfg, x, rows, dy, dx, flip), y[rows], lam)
            grads = torch.autograd.grad(loss, trained, allow_unused=True)
            opt.step(step, [None if g is None else g[None] for g in grads])
            if on_epochs is not None and (step + 1) % per_epoch == 0:
                on_epochs(1)
    return model
