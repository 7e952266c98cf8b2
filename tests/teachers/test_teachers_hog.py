"""teachers.hog and the two-expert cnn-pool-hog teacher: orientation bins, block normalisation,
vmap, and experts that train independently and predict with their mean probability."""

from __future__ import annotations

import numpy as np
import torch
from torch.func import functional_call, vmap

from teachers.ensemble import TrainConfig, _loss
from teachers.hog import hog_features, hog_size
from teachers.models import Experts, build_model, init_stacked


def _edge(vertical: bool) -> torch.Tensor:
    x = torch.zeros(1, 1, 16, 16)
    if vertical:
        x[..., :, 8:] = 1.0
    else:
        x[..., 8:, :] = 1.0
    return x


def _bin_mass(x: torch.Tensor) -> torch.Tensor:
    """Squared features summed per orientation bin (features are sqrt of normalised mass)."""
    f = hog_features(x).reshape(1, 9, 4, -1)  # [n, bins, 2x2 cells of a block, blocks]
    return (f ** 2).sum((0, 2, 3))


def test_size_and_flat_image():
    for shape in [(1, 28, 28), (1, 8, 8), (3, 32, 32)]:
        assert hog_features(torch.rand(2, *shape)).shape == (2, hog_size(shape))
    assert torch.all(hog_features(torch.full((1, 1, 28, 28), 0.7)) < 0.02)  # only the epsilons


def test_edges_vote_into_their_orientation():
    vertical, horizontal = _bin_mass(_edge(True)), _bin_mass(_edge(False))
    assert vertical.argmax() == 0  # horizontal gradient: angle 0
    # angle pi/2 is bin position 4.5: split evenly between bins 4 and 5
    torch.testing.assert_close(horizontal[4], horizontal[5])
    assert horizontal[[4, 5]].sum() > 0.99 * horizontal.sum()
    assert vertical[0] > 0.99 * vertical.sum()


def test_blocks_are_l2_normalised_and_contrast_invariant():
    x = torch.rand(3, 1, 28, 28)
    f = hog_features(x)
    blocks = (f ** 2).reshape(3, 36, -1)  # undo the square root: each block has unit L2 norm
    torch.testing.assert_close((blocks ** 2).sum(1), torch.ones(3, 36), rtol=1e-3, atol=1e-3)
    torch.testing.assert_close(hog_features(3 * x + 1), f, rtol=1e-3, atol=1e-3)


def test_runs_under_vmap():
    x = torch.rand(4, 5, 1, 28, 28)
    torch.testing.assert_close(vmap(hog_features)(x), torch.stack([hog_features(b) for b in x]))


def test_experts_train_alone_and_predict_with_mean_probability():
    model = build_model("cnn-pool-hog", (1, 28, 28), 10)
    assert isinstance(model, Experts)
    x, y = torch.rand(6, 1, 28, 28), torch.randint(0, 10, (6,))
    train_logits = model(x)
    assert train_logits.shape == (6, 2, 10)
    expected = torch.log(train_logits.softmax(-1).mean(1))
    torch.testing.assert_close(model.eval()(x), expected)

    params = init_stacked(model, np.array([0]), seed=1)
    for p in params.values():
        p.requires_grad_()
    base = build_model("cnn-pool-hog", (1, 28, 28), 10).to("meta")
    forward = vmap(lambda p, xb: functional_call(base, p, (xb,)))
    for mixup in (0.0, 0.4):
        cfg = TrainConfig(model="cnn-pool-hog", mixup=mixup)
        lam = torch.full((1, 6), 1.0 if mixup == 0 else 0.7)
        loss = _loss(cfg, lambda xb: forward(params, xb), x[None], y[None], lam)
        grads = torch.autograd.grad(loss, list(params.values()))
        # the HOG expert's gradient is that of its own cross-entropy alone
        hog_names = [n for n in params if n.startswith("experts.1.")]
        w = lam.reshape(1, 6, 1, 1, 1)
        xm = w * x[None] + (1 - w) * x[None].flip(1)
        hog_logits = forward(params, xm)[0, :, 1]
        own = torch.nn.functional.cross_entropy(hog_logits, y, reduction="none")
        own_mixed = torch.nn.functional.cross_entropy(hog_logits, y.flip(0), reduction="none")
        ref = (lam[0] * own + (1 - lam[0]) * own_mixed).mean()
        ref_grads = torch.autograd.grad(ref, [params[n] for n in hog_names])
        for n, g in zip(hog_names, ref_grads, strict=True):
            torch.testing.assert_close(grads[list(params).index(n)], g)
