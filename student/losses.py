"""The students' classification losses, for one network's logits ``[n, C]`` or for an
:class:`~teachers.models.Experts` network's ``[n, E, C]`` in training mode: then each expert gets
its own term, summed over the experts, so that each expert's gradient is its own (as the teachers'
experts are trained, ``teachers.ensemble``)."""

from __future__ import annotations

import torch
from torch.nn import functional as F


def cross_entropy(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of -log softmax(logits)[y], summed over experts."""
    logp = torch.log_softmax(logits, dim=-1)
    index = y.reshape(-1, *(1,) * (logits.dim() - 1)).expand(*logits.shape[:-1], 1)
    return -logp.gather(-1, index).sum() / logits.shape[0]


def kl_logits(logp_clean: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of KL(p_clean || softmax(logits)), summed over experts;
    ``logp_clean`` are log-probabilities of the same shape."""
    return F.kl_div(torch.log_softmax(logits, dim=-1), logp_clean, log_target=True,
                    reduction="sum") / logits.shape[0]


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Mean over the batch of the entropy of softmax(logits), summed over experts."""
    logp = torch.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum() / logits.shape[0]
