"""teachers.optimiser: per-teacher one-cycle schedules and AdamW on a stack equal torch's
OneCycleLR and AdamW run on each teacher alone."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from teachers.optimiser import TeacherAdamW, one_cycle


@pytest.mark.parametrize("total", [1, 2, 3, 4, 7, 10, 80, 333])
def test_one_cycle_is_torchs_schedule(total: int) -> None:
    p = torch.zeros(1, requires_grad=True)
    opt = torch.optim.AdamW([p], lr=3e-3)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=3e-3, total_steps=total)
    for step in range(total):
        lr, beta1 = one_cycle(step, np.array([total, 5 * total]), 3e-3)
        assert lr[0] == pytest.approx(opt.param_groups[0]["lr"], rel=1e-12, abs=0)
        assert beta1[0] == pytest.approx(opt.param_groups[0]["betas"][0], rel=1e-12, abs=0)
        opt.step()
        sched.step()


def test_a_stack_of_teachers_steps_as_each_alone() -> None:
    """Four teachers of 9, 5, 5 and 2 steps on one stack end as torch's AdamW and OneCycleLR
    leave each alone; a finished teacher is not touched again."""
    gen = torch.Generator().manual_seed(0)
    totals = np.array([9, 5, 5, 2])
    start = [torch.randn(4, 4, 2, generator=gen), torch.randn(4, 6, generator=gen)]
    grads = [[torch.randn(4, *t.shape[1:], generator=gen) for t in start] for _ in range(9)]
    stack = [t.clone() for t in start]
    opt = TeacherAdamW(stack, totals, max_lr=0.05, weight_decay=0.1)
    assert len(opt.optimiser.param_groups) == 3
    for step in range(9):
        live = int(np.count_nonzero(totals > step))
        before = [t[live:].clone() for t in stack]
        opt.step(step, [g[:live] for g in grads[step]])
        assert all(torch.equal(t[live:], b) for t, b in zip(stack, before, strict=True))
    for k, total in enumerate(totals):
        alone = [t[k].clone().requires_grad_() for t in start]
        ref = torch.optim.AdamW(alone, lr=0.05, weight_decay=0.1, fused=True)
        sched = torch.optim.lr_scheduler.OneCycleLR(ref, max_lr=0.05, total_steps=int(total))
        for step in range(total):
            for a, g in zip(alone, grads[step], strict=True):
                a.grad = g[k].clone()
            ref.step()
            sched.step()
        for a, t in zip(alone, stack, strict=True):
            torch.testing.assert_close(t[k], a.detach(), rtol=1e-6, atol=1e-7)


def test_a_tensor_the_loss_did_not_use_is_left() -> None:
    stack = [torch.ones(2, 3), torch.ones(2, 3)]
    opt = TeacherAdamW(stack, np.array([4, 4]), max_lr=0.1, weight_decay=0.5)
    opt.step(0, [torch.ones(2, 3), None])
    assert not torch.equal(stack[0], torch.ones(2, 3))
    assert torch.equal(stack[1], torch.ones(2, 3))


def test_teachers_out_of_order_are_refused() -> None:
    with pytest.raises(ValueError, match="ordered by their steps"):
        TeacherAdamW([torch.ones(2, 3)], np.array([2, 4]), max_lr=0.1, weight_decay=0.0)


def test_a_gradient_laid_out_unlike_its_tensor_steps_as_one_laid_out_alike() -> None:
    """torch.autograd.grad can return a transposed gradient (a linear layer's under vmap); the
    fused kernel would read it in the tensor's layout."""
    gen = torch.Generator().manual_seed(1)
    grad = torch.randn(2, 5, 3, generator=gen).transpose(1, 2)  # [2, 3, 5], not contiguous
    a, b = torch.ones(2, 3, 5), torch.ones(2, 3, 5)
    TeacherAdamW([a], np.array([3, 3]), 0.1, 0.0).step(0, [grad])
    TeacherAdamW([b], np.array([3, 3]), 0.1, 0.0).step(0, [grad.contiguous()])
    assert torch.equal(a, b)
