"""student.losses: on one network's logits they are the usual batch means; on an Experts
network's [n, E, C] each expert's term is its own (the sum of the per-expert losses), so the
gradient reaching one expert does not depend on the others."""

from __future__ import annotations

import torch
from torch.nn import functional as F

from student.losses import cross_entropy, entropy, kl_logits


def _kl(logp: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    return F.kl_div(torch.log_softmax(logits, 1), logp, log_target=True, reduction="batchmean")


def test_one_network_gets_the_usual_batch_means() -> None:
    g = torch.Generator().manual_seed(0)
    logits, other = torch.randn(8, 5, generator=g), torch.randn(8, 5, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    logp = torch.log_softmax(other, 1)
    torch.testing.assert_close(cross_entropy(logits, y), F.cross_entropy(logits, y))
    torch.testing.assert_close(kl_logits(logp, logits), _kl(logp, logits))
    p = torch.softmax(logits, 1)
    torch.testing.assert_close(entropy(logits), -(p * p.log()).sum(1).mean())


def test_experts_each_get_their_own_term() -> None:
    g = torch.Generator().manual_seed(1)
    logits = torch.randn(8, 3, 5, generator=g, requires_grad=True)
    other = torch.randn(8, 3, 5, generator=g)
    y = torch.randint(0, 5, (8,), generator=g)
    logp = torch.log_softmax(other, -1)
    per_expert = [(F.cross_entropy(logits[:, e], y), _kl(logp[:, e], logits[:, e]),
                   entropy(logits[:, e])) for e in range(3)]
    for i, loss in enumerate((cross_entropy(logits, y), kl_logits(logp, logits),
                              entropy(logits))):
        torch.testing.assert_close(loss, sum(t[i] for t in per_expert))
        (grad,) = torch.autograd.grad(loss, logits)
        (alone,) = torch.autograd.grad(per_expert[0][i], logits)
        torch.testing.assert_close(grad[:, 0], alone[:, 0])
