"""Virtual adversarial training (Miyato, Maeda, Koyama, Ishii, "Virtual Adversarial Training: A
Regularization Method for Supervised and Semi-Supervised Learning", TPAMI 2018).

The local distributional smoothness loss (§3.1) is
LDS(x) = KL(p(y | x, theta_hat) || p(y | x + r_vadv, theta)), theta_hat a constant copy (the clean
prediction, detached). The virtual adversarial direction is found by one power iteration (§3.3,
Algorithm 1): d ~ N(0, I), g = grad_r KL(p(.|x) || p(.|x + r)) at r = xi d/||d||, and
r_vadv = eps g/||g|| (L2 norm per example, so ||r_vadv|| = eps exactly). xi = 1e-6 as in §4.
The power iteration runs in float32 even under autocast. Perturbed passes use their own batch
statistics but do not update the running ones (the released code's ``update_batch_stats=False``).
With ``entmin`` the loss adds the entropy of the clean prediction on unlabelled data
("VAT+EntMin", §3.4). For a network of experts (:class:`teachers.models.Experts`, the
``cnn-hog`` student) every expert learns from its own cross-entropy (``student.losses``), and the
smoothness and entropy terms apply to the one expert ``smoothed`` (see ``student.models``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from torch import nn

from student.losses import cross_entropy, entropy, kl_logits

XI = 1e-6  # §4: the finite-difference step of the power iteration


@contextlib.contextmanager
def frozen_batch_stats(model: nn.Module) -> Iterator[None]:
    """Batch norm normalises with the batch's statistics but leaves the running ones alone:
    momentum 0 makes the running-average update an identity."""
    norms = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [m.momentum for m in norms]
    for m in norms:
        m.momentum = 0.0
    try:
        yield
    finally:
        for m, momentum in zip(norms, saved, strict=True):
            m.momentum = momentum


def _unit(d: torch.Tensor) -> torch.Tensor:
    """d / ||d|| per example (L2 over all but the first axis); the max-abs pre-scaling of the
    released code keeps the squares finite."""
    flat = d.flatten(1)
    flat = flat / flat.abs().amax(dim=1, keepdim=True).clamp_min(1e-12)
    flat = flat / flat.norm(dim=1, keepdim=True).clamp_min(1e-12)
    return flat.view_as(d)


def virtual_adversarial_perturbation(model: nn.Module, x: torch.Tensor, logp_clean: torch.Tensor,
                                     eps: float, xi: float = XI, iterations: int = 1,
                                     generator: torch.Generator | None = None) -> torch.Tensor:
    """r_vadv (§3.3, Algorithm 1) for every example of ``x``; ``logp_clean`` are the
    detached log-probabilities at ``x``. Each row has L2 norm ``eps``. No parameter gradient is
    accumulated and no running statistic updated."""
    x = x.detach().float()
    logp_clean = logp_clean.detach().float()
    d = torch.randn(x.shape, generator=generator, device=x.device, dtype=torch.float32)
    device_type = x.device.type
    with frozen_batch_stats(model), torch.autocast(device_type, enabled=False):
        for _ in range(iterations):
            r = (xi * _unit(d)).requires_grad_()
            kl = kl_logits(logp_clean, model(x + r).float())
            (d,) = torch.autograd.grad(kl, r)
    return eps * _unit(d.detach())


class VATLearner:
    """Cross-entropy on labelled data plus ``alpha`` LDS on unlabelled data (§3.2), optionally
    plus the entropy of the clean unlabelled prediction; Adam. ``smoothed``: for an Experts
    network, the index of the expert the LDS and entropy terms are for."""

    def __init__(self, model: nn.Module, eps: float = 2.0, alpha: float = 1.0,
                 entmin: bool = False, lr: float = 1e-3, xi: float = XI,
                 smoothed: int | None = None) -> None:
        self.model, self.eps, self.alpha, self.entmin, self.xi = model, eps, alpha, entmin, xi
        self.smoothed = smoothed
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        # Separate passes, so that the perturbed passes normalise with the statistics of the
        # same unlabelled batch as the clean one; only the clean unlabelled pass updates them.
        net = self.model if self.smoothed is None else self.model.experts[self.smoothed]
        clean = net(x_unl)
        with frozen_batch_stats(self.model):
            sup = cross_entropy(self.model(x_lab), y_lab)
        logp_clean = torch.log_softmax(clean.detach().float(), dim=-1)
        r_adv = virtual_adversarial_perturbation(net, x_unl, logp_clean, self.eps, self.xi)
        with frozen_batch_stats(net):
            lds = kl_logits(logp_clean, net(x_unl + r_adv))
        loss = sup + self.alpha * lds
        stats = {"supervised": float(sup.detach()), "lds": float(lds.detach())}
        if self.entmin:
            ent = entropy(clean)
            loss = loss + ent
            stats["entropy"] = float(ent.detach())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return stats
