"""The supervised baseline: cross-entropy on the answered labels only, the unlabelled pool unused
(the "supervised-only" rows of Miyato et al. 2018, Table 2, and Salimans et al. 2016, Table 1)."""

from __future__ import annotations

import torch
from torch import nn

from student.losses import cross_entropy


class SupervisedLearner:
    """Adam on the cross-entropy of the labelled batch."""

    # fit may train it on a table of its network's fixed maps: a subclass whose step reads
    # the unlabelled batch through the network must set it False
    labelled_only = True

    def __init__(self, model: nn.Module, lr: float = 1e-3) -> None:
        self.model = model
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        loss = cross_entropy(self.model(x_lab), y_lab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"supervised": float(loss.detach())}
