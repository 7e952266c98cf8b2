"""The accountant of DP-SGD with gradient encoding (analysis.encoded_rdp): the Gaussian case against
the sampled Gaussian, Laplace at q = 1 against Mironov's closed form, monotonicity of M_k, the
refusal of asymmetric and non-monotone families, and the profiles of Psi."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from analysis.encoded_rdp import (
    EncodedAccountant,
    encoded_accountant,
    log_moments,
    mixture_rdp,
    shift_grid,
)
from analysis.encoding_profiles import sorted_profiles
from analysis.noise_families import NOISE_FAMILIES, NoiseFamily, ks_distance, noise_family
from analysis.sampled_gaussian import dpsgd_epsilon, sampled_gaussian_rdp

ORDERS = np.arange(2.0, 65.0)


def _numeric_gaussian() -> NoiseFamily:
    """N(0, 1) under another name, so that the accountant takes its numerical path."""
    return NoiseFamily("gaussian-numeric", stats.norm.logpdf, stats.norm.cdf, stats.norm.ppf, 1.0)


def _laplace_rdp(order: np.ndarray, shift_over_scale: float) -> np.ndarray:
    """Mironov 2017 ("Rényi Differential Privacy", Table II): the Laplace mechanism of scale b and
    sensitivity s at order a, with r = s / b: 1/(a-1) log(a/(2a-1) e^{(a-1) r} + (a-1)/(2a-1)
    e^{-a r})."""
    a, r = order, shift_over_scale
    return np.log(a / (2 * a - 1) * np.exp((a - 1) * r)
                  + (a - 1) / (2 * a - 1) * np.exp(-a * r)) / (a - 1)


@pytest.mark.parametrize("q", [1e-3, 0.03, 0.5, 1.0])
@pytest.mark.parametrize("sigma", [0.6, 1.0, 4.0])
def test_mixture_formula_with_gaussian_moments_is_the_sampled_gaussian(q: float,
                                                                      sigma: float) -> None:
    # prod_tau M_k(tau) = exp(k (k - 1) ||psi||^2 / (2 sigma^2)) with ||psi|| = 1; the prefactor
    # 1/(a - 1) (not the paper's 1/(1 - a)) must give the sampled Gaussian, positive.
    k = np.arange(65.0)
    ours = mixture_rdp(q, k * (k - 1) / (2 * sigma**2), ORDERS)
    np.testing.assert_allclose(ours, sampled_gaussian_rdp(q, sigma, ORDERS), rtol=1e-9,
                               atol=1e-12)
    assert np.all(ours > 0)


def test_numerical_path_on_gaussian_noise_is_the_sampled_gaussian() -> None:
    # 100 equal coordinates of 0.1 (norm 1) sit on the grid (its top): no rounding, so the
    # quadrature alone separates the two.
    profile = np.full((1, 100), 0.1)
    for q, sigma in ((0.03, 1.0), (0.25, 2.0), (1.0, 1.5)):
        ours = EncodedAccountant(_numeric_gaussian(), profile, 50).rdp(q, sigma, 7, ORDERS)
        np.testing.assert_allclose(ours, sampled_gaussian_rdp(q, sigma, ORDERS, 7), rtol=1e-9)


def test_gaussian_family_routes_to_the_sampled_gaussian_with_fractional_orders() -> None:
    acc = encoded_accountant("gaussian", 9.0, 1000, 26010, 0)
    assert acc.default_orders().size > 300 and np.any(acc.default_orders() % 1 != 0)
    assert acc.epsilon(0.034, 1.1, 1160, 1e-5) == dpsgd_epsilon(0.034, 1.1, 1160, 1e-5)


def test_laplace_at_q1_is_mironovs_closed_form_summed_over_coordinates() -> None:
    fam = noise_family("laplace")
    profile = np.full((1, 100), 0.1)
    sigma = 1.3
    ours = EncodedAccountant(fam, profile, 50).rdp(1.0, sigma, 1, ORDERS)
    expected = 100 * _laplace_rdp(ORDERS, 0.1 / (sigma * fam.scale))
    np.testing.assert_allclose(ours, expected, rtol=1e-9)
    # A profile off the grid: rounded up, so above the exact sum and within the grid's spacing.
    rough = np.sort(np.abs(np.random.default_rng(1).normal(size=50)))[::-1]
    rough /= np.linalg.norm(rough)
    acc = EncodedAccountant(fam, rough[None], grid_size=200)
    ours = acc.rdp(1.0, 3.0, 1, ORDERS)
    exact = sum(_laplace_rdp(ORDERS, t / (3.0 * fam.scale)) for t in rough)
    ratio = acc.grid[-1] / acc.grid[-2]
    above = sum(_laplace_rdp(ORDERS, ratio * t / (3.0 * fam.scale)) for t in rough)
    # Orders a with a * max(tau) / sd > 8 are left unbounded (inf), the others bounded.
    bounded = ORDERS * rough[0] / 3.0 <= 8.0
    assert np.isinf(ours[~bounded]).all() and bounded.sum() > 30
    assert np.all(ours[bounded] >= exact[bounded] * (1 - 1e-9))
    assert np.all(ours[bounded] <= above[bounded] * (1 + 1e-9))


@pytest.mark.parametrize("name", NOISE_FAMILIES)
def test_moments_non_decreasing_in_the_shift(name: str) -> None:
    shifts = np.concatenate([[0.0], np.geomspace(1e-6, 0.12, 300)])
    table = log_moments(noise_family(name), shifts, 64)
    assert np.all(np.isfinite(table)) and np.all(table >= 0)
    assert np.all(np.diff(table, axis=1) >= 0)


def test_quadrature_matches_the_gaussian_closed_form() -> None:
    shifts = np.array([1e-4, 1e-2, 0.1, 0.5, 1.0])
    table = log_moments(noise_family("gaussian"), shifts, 8)
    k = np.arange(9.0)[:, None]
    np.testing.assert_allclose(table, k * (k - 1) * shifts**2 / 2, rtol=1e-9)


def test_student_t_costs_more_than_the_gaussian_at_equal_variance() -> None:
    # Fisher information times variance is (dof + 1) / (dof + 3) * dof / (dof - 2) > 1.
    profiles = sorted_profiles(20, 500, 0)
    gauss = encoded_accountant("gaussian", 9.0, 20, 500, 0).epsilon(0.05, 1.0, 100, 1e-5)[0]
    t = EncodedAccountant(noise_family("student-t"), profiles, 300).epsilon(0.05, 1.0, 100,
                                                                      1e-5)[0]
    assert t > gauss


def test_asymmetric_family_is_refused() -> None:
    skew = stats.skewnorm(4.0)
    fam = NoiseFamily("skew-normal", skew.logpdf, skew.cdf, skew.ppf, 1.0)
    with pytest.raises(ValueError, match="not symmetric"):
        EncodedAccountant(fam, np.full((1, 4), 0.5))


def test_non_monotone_family_is_refused() -> None:
    # A symmetric comb: a wide Gaussian modulated with period 1. A shift by a whole period
    # realigns the teeth, so M_k(1) < M_k(1/2).
    beta, omega, s = 0.9, 2 * np.pi, 3.0

    def logpdf(x: np.ndarray) -> np.ndarray:
        return (stats.norm.logpdf(x, scale=s) + np.log1p(beta * np.cos(omega * x))
                - np.log1p(beta * np.exp(-(omega * s) ** 2 / 2)))

    fam = NoiseFamily("comb", logpdf, stats.norm.cdf, stats.norm.ppf, 1.0)
    with pytest.raises(ValueError, match="decreases"):
        EncodedAccountant(fam, np.array([[1.0]]), 300).rdp(0.1, 1.0, 1, np.arange(2.0, 9.0))


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="encoded gradients only"):
        encoded_accountant("student-t", 9.0, None, 100, 0)
    with pytest.raises(ValueError, match="dof > 2"):
        noise_family("student-t", 2.0)
    with pytest.raises(ValueError, match="noise must be one of"):
        noise_family("cauchy")
    with pytest.raises(ValueError, match="norm <= 1"):
        EncodedAccountant(noise_family("laplace"), np.full((1, 4), 1.0))
    with pytest.raises(ValueError, match="integer orders"):
        mixture_rdp(0.1, np.zeros(10), [2.5])
    with pytest.raises(ValueError):
        shift_grid(0.0)


def test_profiles_are_sorted_unit_and_reproducible() -> None:
    p = sorted_profiles(5, 1000, 3)
    np.testing.assert_allclose(np.linalg.norm(p, axis=1), 1.0, rtol=1e-12)
    assert np.all(np.diff(p, axis=1) <= 0) and np.all(p >= 0)
    np.testing.assert_array_equal(p, sorted_profiles(5, 1000, 3))
    assert not np.array_equal(p, sorted_profiles(5, 1000, 4))


def test_ks_distance_small_for_pure_noise_large_for_signal() -> None:
    rng = np.random.default_rng(0)
    fam = noise_family("student-t")
    noise = 0.2 * fam.ppf(rng.uniform(size=20000))
    assert ks_distance(noise, fam, 0.2) < 0.02
    assert ks_distance(noise + 0.5, fam, 0.2) > 0.5
