"""VAT's virtual adversarial perturbation (Miyato et al. 2018, §3.3): its norm is eps, it raises
the KL divergence more than random directions of the same norm, and it leaves the network alone
(no running-statistic update, no parameter gradient), in float32 even under autocast."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from student_support import one_thread
from torch.nn import functional as F

from pate.data.datasets import Dataset, public_split
from student.models import ModelSpec, PoolFeatures, build_classifier
from student.training import FitConfig, MethodConfig, build_learner, fit, seed_everything
from student.vat import frozen_batch_stats, virtual_adversarial_perturbation
from teachers.pool_encoder import train_pool_encoder

EPS = 1.5
pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module")
def trained(digits: Dataset) -> tuple[torch.nn.Module, torch.Tensor]:
    """An MLP trained briefly on digits, in training mode, and a batch of 256 images."""
    seed_everything(0)
    spec = ModelSpec("mlp", digits.train_x.shape[1:], 10)
    model = build_classifier(spec)
    learner = build_learner(MethodConfig("supervised"), model, spec)
    fit(learner, digits.train_x[:300], digits.train_y[:300], digits.train_x,
        FitConfig(epochs=2))
    model.train()
    return model, torch.as_tensor(digits.test_x[:256])


def _kl_rows(model: torch.nn.Module, x: torch.Tensor, logp: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), frozen_batch_stats(model):
        logq = torch.log_softmax(model(x), dim=1)
    return F.kl_div(logq, logp, log_target=True, reduction="none").sum(dim=1)


def _clean(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad(), frozen_batch_stats(model):
        return torch.log_softmax(model(x), dim=1)


def test_perturbation_has_norm_eps(trained: tuple[torch.nn.Module, torch.Tensor]) -> None:
    model, x = trained
    r = virtual_adversarial_perturbation(model, x, _clean(model, x), EPS)
    assert r.shape == x.shape and r.dtype == torch.float32
    np.testing.assert_allclose(r.flatten(1).norm(dim=1).numpy(), EPS, rtol=1e-5)


def test_perturbation_beats_random_directions(
        trained: tuple[torch.nn.Module, torch.Tensor]) -> None:
    model, x = trained
    logp = _clean(model, x)
    torch.manual_seed(1)
    kl_adv = _kl_rows(model, x + virtual_adversarial_perturbation(model, x, logp, EPS), logp)
    kl_random = []
    for _ in range(5):
        d = torch.randn_like(x)
        kl_random.append(_kl_rows(model, x + EPS * d / d.flatten(1).norm(dim=1)[:, None, None,
                                                                                  None], logp))
    median_random = torch.stack(kl_random).median(dim=0).values
    assert float(kl_adv.mean()) > 5 * float(median_random.mean())
    assert float((kl_adv > median_random).float().mean()) > 0.85


def test_perturbation_leaves_the_network_alone(
        trained: tuple[torch.nn.Module, torch.Tensor]) -> None:
    model, x = trained
    stats = {k: v.clone() for k, v in model.state_dict().items() if "running" in k}
    momenta = [m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        r = virtual_adversarial_perturbation(model, x, _clean(model, x), EPS)
    assert r.dtype == torch.float32
    for k, v in stats.items():
        assert torch.equal(model.state_dict()[k], v), k
    assert all(p.grad is None for p in model.parameters())
    assert momenta == [m.momentum for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d)]


@pytest.mark.parametrize("arch", ["cnn-hog", "cnn-hog-simclr", "cnn-hog-scatter"])
def test_cnn_hog_smooths_the_cnn_and_fits_hog_to_the_labels(digits: Dataset, arch: str) -> None:
    """A cnn-hog (cnn-hog-simclr, cnn-hog-scatter) VAT step: the (first) linear expert's gradient
    is that of its own cross-entropy alone; the Conv-Small expert also gets the smoothness term;
    all move and stay finite."""
    features = None
    if arch == "cnn-hog-simclr":
        pool_x = public_split(digits)[0][0]
        features = PoolFeatures.on_pool(train_pool_encoder(pool_x, 1, seed=0), pool_x)
    seed_everything(0)
    spec = ModelSpec(arch, digits.train_x.shape[1:], 10)
    model = build_classifier(spec, features)
    learner = build_learner(MethodConfig("vat", arch), model, spec)
    x_lab, y_lab = torch.as_tensor(digits.train_x[:32]), torch.as_tensor(digits.train_y[:32])
    x_unl = torch.as_tensor(digits.train_x[32:160])
    hog = copy.deepcopy(model.experts[1])
    hog_grads = torch.autograd.grad(F.cross_entropy(hog(x_lab), y_lab), list(hog.parameters()))
    before = [p.detach().clone() for p in model.parameters()]
    stats = learner.step(x_lab, y_lab, x_unl)
    assert stats["lds"] > 0 and all(np.isfinite(v) for v in stats.values())
    for p, g in zip(model.experts[1].parameters(), hog_grads, strict=True):
        torch.testing.assert_close(p.grad, g)
    assert all(torch.isfinite(p).all() and not torch.equal(p, b)
               for p, b in zip(model.parameters(), before, strict=True))
