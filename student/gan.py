"""Semi-supervised GAN with feature matching (Salimans, Goodfellow, Zaremba, Cheung, Radford,
Chen, "Improved Techniques for Training GANs", NeurIPS 2016).

The discriminator is a K-class classifier with logits l(x); "real" is D(x) = Z(x) / (Z(x) + 1),
Z(x) = sum_k exp l_k(x) (§5, the K+1-th logit fixed at 0). Its loss is L_supervised + L_unsupervised
(§5) with L_unsupervised = -E_data log D(x) - E_G log(1 - D(G(z))), i.e. with
s = logsumexp(l): -E_data [s - softplus(s)] + E_G softplus(s), weighted 1/2 as in the released code.
The generator minimises ||E_data f(x) - E_z f(G(z))||^2 on the discriminator's last hidden layer
f (feature matching, §3.1), mean over features as in the released code. Adam, beta1 = 0.5.
"""

from __future__ import annotations

import torch
from torch.nn import functional as F

from student.models import Z_DIM, Discriminator, Generator


def unlabelled_loss(logits_real: torch.Tensor, logits_fake: torch.Tensor) -> torch.Tensor:
    """L_unsupervised of §5 for the K-class discriminator, times 1/2."""
    s_real = torch.logsumexp(logits_real, dim=1)
    s_fake = torch.logsumexp(logits_fake, dim=1)
    return 0.5 * (-s_real.mean() + F.softplus(s_real).mean() + F.softplus(s_fake).mean())


def feature_matching_loss(f_real: torch.Tensor, f_fake: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of the batches' mean features (§3.1); the data side is constant."""
    return (f_real.detach().mean(dim=0) - f_fake.mean(dim=0)).pow(2).mean()


class GANLearner:
    """One discriminator step (labelled + unlabelled + generated batch), then one generator step
    on feature statistics. ``model`` is the discriminator, the published classifier."""

    def __init__(self, model: Discriminator, generator_net: Generator, lr: float = 3e-3) -> None:
        self.model, self.generator_net = model, generator_net
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr, betas=(0.5, 0.999)),
                           torch.optim.Adam(generator_net.parameters(), lr=lr, betas=(0.5, 0.999))]

    def _fake(self, n: int, like: torch.Tensor) -> torch.Tensor:
        return self.generator_net(torch.rand(n, Z_DIM, device=like.device))

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        opt_d, opt_g = self.optimizers
        self.generator_net.train()
        n_lab, n_unl = len(x_lab), len(x_unl)
        fake = self._fake(n_unl, x_unl)
        logits = self.model(torch.cat([x_lab, x_unl, fake.detach()]))
        sup = F.cross_entropy(logits[:n_lab], y_lab)
        unl = unlabelled_loss(logits[n_lab:n_lab + n_unl], logits[n_lab + n_unl:])
        opt_d.zero_grad(set_to_none=True)
        (sup + unl).backward()
        opt_d.step()

        f_real = self.model.features(x_unl)
        f_fake = self.model.features(self._fake(n_unl, x_unl))
        gen = feature_matching_loss(f_real, f_fake)
        opt_g.zero_grad(set_to_none=True)
        gen.backward()
        opt_g.step()
        return {"supervised": float(sup.detach()), "unsupervised": float(unl.detach()),
                "generator": float(gen.detach())}
