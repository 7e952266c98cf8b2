"""scripts/bench_linear_experts.py's pool whitening: on the pool it was fitted on, the projected
features are uncorrelated, with unit variance unshrunk and v / (v + a mean(v)) shrunk."""

import torch
from bench_linear_experts import pool_whitening


def _pool() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    mixing = torch.randn(12, 12, generator=generator)
    return torch.randn(500, 12, generator=generator) @ mixing + 3.0


def test_whitened_pool_has_identity_covariance() -> None:
    pool = _pool()
    mean, projection = pool_whitening(pool, 5, 0.0)
    z = (pool - mean) @ projection
    assert projection.shape == (12, 5)
    assert torch.allclose(z.mean(0), torch.zeros(5), atol=1e-4)
    assert torch.allclose(z.T @ z / len(z), torch.eye(5), atol=1e-3)


def test_shrinkage_scales_each_component_by_its_variance() -> None:
    pool = _pool()
    _, plain = pool_whitening(pool, 5, 0.0)
    mean, projection = pool_whitening(pool, 5, 0.5)
    z = (pool - mean) @ projection
    centred = pool - pool.mean(0)
    variance = (centred @ (plain / plain.norm(dim=0))).pow(2).mean(0)  # along each component
    expected = variance / (variance + 0.5 * variance.mean())
    covariance = z.T @ z / len(z)
    assert torch.allclose(covariance.diagonal(), expected, rtol=1e-3)
    assert torch.allclose(covariance - torch.diag(covariance.diagonal()), torch.zeros(5, 5),
                          atol=1e-3)
    assert bool((expected < 1).all()) and bool((expected[:-1] >= expected[1:]).all())
