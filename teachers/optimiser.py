"""AdamW over a stack of teachers, each teacher on its own one-cycle schedule.

Teachers dealt by record or key take different numbers of steps (``epochs * ceil(rows /
batch_size)`` of their own rows), so at a given step each has its own learning rate and
momentum, and a teacher that has taken all its steps must stop. torch's optimisers take one
learning rate per parameter group, and a tensor holds every teacher of the group on its leading
axis. So the stack, ordered by steps (most first), is cut into views, one parameter group per
number of steps; each group follows its own schedule and stops at its last step, and the
teachers train as one stack whatever their partitions' sizes.

- :func:`one_cycle`: the learning rate and beta1 of a step, per teacher, as torch's
  ``OneCycleLR`` sets them with its defaults (L. N. Smith, N. Topin, "Super-Convergence: Very
  Fast Training of Neural Networks Using Large Learning Rates", 2019, §3: a cosine rise from
  ``max_lr / 25`` to ``max_lr`` over the first 30 % of the steps, then a cosine fall to
  ``max_lr / 25 / 1e4``; beta1 falls from 0.95 to 0.85 and rises back, opposite the rate).
- :class:`TeacherAdamW`: torch's AdamW (I. Loshchilov, F. Hutter, "Decoupled Weight Decay
  Regularization", ICLR 2019, Algorithm 2) with a parameter group per number of steps, each
  group's tensors views of the stack.

Both are checked against torch's ``AdamW`` and ``OneCycleLR`` teacher by teacher
(``tests/teachers/test_teachers_optimiser.py``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

# torch.optim.lr_scheduler.OneCycleLR's defaults, the schedule the teachers always trained with.
WARM_UP = 0.3
DIV_FACTOR = 25.0
FINAL_DIV_FACTOR = 1e4
BASE_MOMENTUM, MAX_MOMENTUM = 0.85, 0.95
# torch.optim.AdamW's beta2 (its default); the schedule sets beta1.
BETA2 = 0.999


def _cosine(start: np.ndarray | float, end: np.ndarray | float, pct: np.ndarray
            ) -> np.ndarray:
    """From ``start`` (``pct`` 0) to ``end`` (``pct`` 1) along half a cosine."""
    return end + (start - end) / 2.0 * (np.cos(np.pi * pct) + 1)


def one_cycle(step: int, total: np.ndarray, max_lr: float) -> tuple[np.ndarray, np.ndarray]:
    """The learning rate and beta1 of step ``step`` (from 0) for teachers taking ``total`` steps
    each (``[K]``), as ``torch.optim.lr_scheduler.OneCycleLR(max_lr=max_lr,
    total_steps=total)`` sets them before that step: the first phase ends at step
    ``0.3 total - 1``, the second at ``total - 1``."""
    total = np.asarray(total, dtype=np.float64)
    start_lr = max_lr / DIV_FACTOR
    rise_end = WARM_UP * total - 1
    rising = step <= rise_end
    with np.errstate(divide="ignore", invalid="ignore"):
        pct = np.where(rising, step / rise_end, (step - rise_end) / (total - 1 - rise_end))
    lr = np.where(rising, _cosine(start_lr, max_lr, pct),
                  _cosine(max_lr, start_lr / FINAL_DIV_FACTOR, pct))
    beta1 = np.where(rising, _cosine(MAX_MOMENTUM, BASE_MOMENTUM, pct),
                     _cosine(BASE_MOMENTUM, MAX_MOMENTUM, pct))
    return lr, beta1


class TeacherAdamW:
    """torch's AdamW over ``tensors`` whose leading axis is the teacher (updated in place), the
    teachers ordered by ``steps``, most first, each on its own one-cycle schedule up to
    ``max_lr``. Each run of teachers taking the same number of steps is one parameter group
    (its tensors are views of the stack), whose rate and beta1 are set before every step as
    ``OneCycleLR`` would set them; a group whose teachers have taken all their steps gets no
    gradient, and torch's optimiser leaves such a group as it is. So the arithmetic is torch's
    fused AdamW, one call per group, as many as the numbers of steps the teachers take."""

    def __init__(self, tensors: list[torch.Tensor], steps: np.ndarray, max_lr: float,
                 weight_decay: float) -> None:
        self.steps = np.asarray(steps, dtype=np.int64)
        if np.any(np.diff(self.steps) > 0):
            raise ValueError("the teachers must be ordered by their steps, most first")
        starts = np.flatnonzero(np.r_[True, np.diff(self.steps) != 0])
        self.bounds = list(zip(starts.tolist(), [*starts[1:].tolist(), len(self.steps)],
                               strict=True))
        self.group_steps = self.steps[starts]
        self.max_lr = max_lr
        if any(len(t) != len(self.steps) for t in tensors):
            raise ValueError("every tensor's leading axis must be the teachers'")
        self.optimiser = torch.optim.AdamW(
            [{"params": [t[a:b].detach() for t in tensors]} for a, b in self.bounds],
            lr=max_lr, weight_decay=weight_decay, fused=True)

    def step(self, step: int, grads: Sequence[torch.Tensor | None]) -> None:
        """Step ``step`` (from 0) of the teachers that have not taken all theirs, the first
        ones, whose gradients ``grads`` are (one per tensor, leading axis: those teachers). A
        tensor whose gradient is None (unused by the loss) is left, as torch leaves it."""
        lr, beta1 = one_cycle(step, self.group_steps, self.max_lr)
        for (a, b), total, group, rate, momentum in zip(
                self.bounds, self.group_steps, self.optimiser.param_groups, lr, beta1,
                strict=True):
            live = total > step
            group["lr"], group["betas"] = float(rate), (float(momentum), BETA2)
            for view, grad in zip(group["params"], grads, strict=True):
                view.grad = None if not live or grad is None else _laid_out_as(view, grad[a:b])
        self.optimiser.step()


def _laid_out_as(param: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """``grad`` in ``param``'s memory layout. ``backward`` lays a leaf's gradient out as the
    leaf; ``torch.autograd.grad`` need not (a linear layer's under vmap comes transposed), and
    the fused AdamW kernel reads both as laid out alike: measured, a transposed gradient
    updated the wrong weights."""
    if grad.stride() == param.stride():
        return grad
    return torch.empty_like(param).copy_(grad)
