"""The sampled Gaussian (DP-SGD) against dp_accounting, Opacus and numeric integration."""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import integrate
from scipy.stats import binom, norm

from analysis.orders import default_orders
from analysis.sampled_gaussian import (
    NOISE_CEILING,
    dpsgd_epsilon,
    log_binomial_moment,
    noise_multiplier_for_epsilon,
    sampled_gaussian_rdp,
)
from pate.cli.main import main

dp_accounting = pytest.importorskip("dp_accounting")
opacus_rdp = pytest.importorskip("opacus.accountants.analysis.rdp")

INTEGER_ORDERS = np.concatenate([np.arange(2.0, 101.0), [128.0, 256.0]])
GRID = [(q, s) for q in (1e-3, 0.01, 0.0341, 0.2, 0.9) for s in (0.5, 1.0, 2.15, 6.0)]
STEPS = (1, 1_000, 100_000)


def exact_rdp(q: float, sigma: float, alpha: float) -> float:
    """r(a) = log E_{z ~ N(0, sigma^2)} [(1 - q + q e^{(2z-1)/(2 sigma^2)})^a] / (a - 1) by
    adaptive quadrature around the peak of the integrand (docs/privacy-math.md §6)."""
    def log_f(z: np.ndarray | float) -> np.ndarray:
        return norm.logpdf(z, 0.0, sigma) + alpha * np.logaddexp(
            np.log1p(-q), np.log(q) + (2.0 * np.asarray(z) - 1.0) / (2.0 * sigma**2))

    zs = np.linspace(-30 * sigma, alpha + 30 * sigma, 100_001)
    values = log_f(zs)
    peak, top = zs[np.argmax(values)], values.max()
    val, _ = integrate.quad(lambda z: np.exp(log_f(z) - top), peak - 40 * sigma,
                            peak + 40 * sigma, points=[peak], epsabs=0, epsrel=1e-12,
                            limit=1000)
    return float((top + np.log(val)) / (alpha - 1.0))


@pytest.mark.parametrize(("q", "sigma"), GRID)
def test_integer_orders_match_dp_accounting_and_opacus(q: float, sigma: float) -> None:
    from dp_accounting.rdp.rdp_privacy_accountant import (
        _compute_rdp_poisson_subsampled_gaussian as dpa_rdp,
    )

    for steps in STEPS:
        ours = sampled_gaussian_rdp(q, sigma, INTEGER_ORDERS, steps)
        theirs = steps * dpa_rdp(q, sigma, INTEGER_ORDERS)
        opacus = np.asarray(opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps,
                                                   orders=list(INTEGER_ORDERS)))
        np.testing.assert_allclose(ours, theirs, rtol=1e-5)
        np.testing.assert_allclose(ours, opacus, rtol=1e-5)


# Some of the grid's points are best at the first or last order: each of the three says so
# (warnings expected here), and all three must still pick that order.
@pytest.mark.filterwarnings("ignore:optimal Rényi order .* end of the grid:RuntimeWarning",
                            "ignore:Optimal order is the (smallest|largest) alpha:UserWarning")
@pytest.mark.parametrize(("q", "sigma"), GRID)
def test_epsilon_matches_dp_accounting_and_opacus(q: float, sigma: float) -> None:
    from dp_accounting import GaussianDpEvent, PoissonSampledDpEvent
    from dp_accounting.rdp import RdpAccountant

    delta = 1e-5
    for steps in STEPS:
        ours, order = dpsgd_epsilon(q, sigma, steps, delta, "improved", INTEGER_ORDERS)
        acc = RdpAccountant(list(INTEGER_ORDERS))
        acc.compose(PoissonSampledDpEvent(q, GaussianDpEvent(sigma)), steps)
        theirs, their_order = acc.get_epsilon_and_optimal_order(delta)
        rdp = opacus_rdp.compute_rdp(q=q, noise_multiplier=sigma, steps=steps,
                                     orders=list(INTEGER_ORDERS))
        opacus, opacus_order = opacus_rdp.get_privacy_spent(
            orders=list(INTEGER_ORDERS), rdp=rdp, delta=delta)
        assert ours == pytest.approx(theirs, rel=1e-5)
        assert ours == pytest.approx(opacus, rel=1e-5)
        assert order == their_order == opacus_order


@pytest.mark.parametrize(("q", "sigma"), [(1e-3, 1.0), (0.01, 6.0), (0.0341, 2.15), (0.2, 0.7),
                                          (0.5, 1.0), (0.9, 3.0)])
def test_fractional_orders_never_below_exact(q: float, sigma: float) -> None:
    alphas = np.array([1.1, 1.5, 2.5, 3.7, 7.3, 12.5, 30.5, 64.5])
    ours = sampled_gaussian_rdp(q, sigma, alphas)
    exact = np.array([exact_rdp(q, sigma, a) for a in alphas])
    assert np.all(ours >= exact * (1 - 1e-9)), ours / exact - 1
    # ... and tight: within 1e-5 relative, or 1e-12 absolute for vanishing values
    np.testing.assert_allclose(ours, exact, rtol=1e-5, atol=1e-12)


def test_fractional_on_the_default_grid_is_sane() -> None:
    """Never negative, non-decreasing in the order (Van Erven & Harremoës 2014, Thm. 3), never
    below Opacus' signed series by more than rounding, and never above dp_accounting's
    absolute-value series (an upper bound on the same sum)."""
    from dp_accounting.rdp.rdp_privacy_accountant import (
        _compute_rdp_poisson_subsampled_gaussian as dpa_rdp,
    )

    orders = default_orders()[default_orders() < 1000]
    logging.disable(logging.WARNING)  # dp_accounting logs every order it cannot converge
    try:
        for q, sigma in GRID[::3]:
            ours = sampled_gaussian_rdp(q, sigma, orders)
            assert np.all(np.isfinite(ours)) and np.all(ours >= 0)
            assert np.all(np.diff(ours) >= -1e-12 * ours[1:])
            upper = dpa_rdp(q, sigma, orders)
            ok = np.isfinite(upper)
            assert np.all(ours[ok] <= upper[ok] * (1 + 1e-9) + 1e-12)
    finally:
        logging.disable(logging.NOTSET)


def test_edge_cases() -> None:
    a = np.array([1.5, 2.0, 10.0, 31.7])
    assert np.all(sampled_gaussian_rdp(0.0, 1.0, a, 100) == 0)
    np.testing.assert_allclose(sampled_gaussian_rdp(1.0, 2.0, a), a / 8.0)
    assert np.all(np.isinf(sampled_gaussian_rdp(0.1, 0.0, a)))
    assert np.all(sampled_gaussian_rdp(0.1, 1.0, a, steps=0) == 0)
    # a huge noise multiplier: tiny but never negative, also at fractional orders
    tiny = sampled_gaussian_rdp(1e-4, 1e4, a)
    assert np.all(tiny >= 0) and np.all(tiny < 1e-12)
    with pytest.raises(ValueError):
        sampled_gaussian_rdp(1.5, 1.0, a)
    with pytest.raises(ValueError):
        sampled_gaussian_rdp(0.1, -1.0, a)


@settings(max_examples=40, deadline=None)
@given(q=st.floats(1e-4, 0.999), sigma=st.floats(0.3, 50.0), alpha=st.integers(2, 40))
def test_log_binomial_moment_is_the_binomial_expectation(q: float, sigma: float,
                                                         alpha: int) -> None:
    assume(alpha * (alpha - 1) / (2 * sigma**2) < 600)  # the direct sum must not overflow
    k = np.arange(alpha + 1)
    direct = np.log(np.sum(binom.pmf(k, alpha, q) * np.exp((k * k - k) / (2 * sigma**2))))
    assert log_binomial_moment(q, alpha, sigma) == pytest.approx(direct, rel=1e-9, abs=1e-12)


def test_log_binomial_moment_broadcasts_over_sigma() -> None:
    sig = np.array([[0.5], [2.0], [np.inf]])
    out = log_binomial_moment(0.05, np.array([3.0, 5.0]), sig)
    assert out.shape == (3, 2)
    np.testing.assert_allclose(out[2], 0.0, atol=1e-12)  # zero distance: no privacy loss
    np.testing.assert_allclose(out[1], log_binomial_moment(0.05, [3.0, 5.0], 2.0))


def test_noise_multiplier_for_epsilon_is_the_smallest_that_fits() -> None:
    q, steps, delta, orders = 2048 / 60_000, 1160, 1e-5, np.arange(1.5, 64.0, 0.5)
    sigma = noise_multiplier_for_epsilon(3.0, q, steps, delta, orders=orders, rtol=1e-4)
    assert dpsgd_epsilon(q, sigma, steps, delta, orders=orders)[0] <= 3.0
    assert dpsgd_epsilon(q, sigma * (1 - 3e-4), steps, delta, orders=orders)[0] > 3.0


def test_cli_json(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["epsilon", "dpsgd", "--sampling-rate", "0.01", "--noise-multiplier", "1.1",
                 "--steps", "10000", "--delta", "1e-5", "--conversion", "classic", "--json"])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert set(out) == {"epsilon", "order", "conversion"}
    assert out["conversion"] == "classic"
    eps, order = dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5, "classic")
    assert out["epsilon"] == pytest.approx(eps) and out["order"] == order
    assert dpsgd_epsilon(0.01, 1.1, 10_000, 1e-5, "improved")[0] < eps


def test_cli_error_is_one_line(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["epsilon", "dpsgd", "--sampling-rate", "1.5", "--noise-multiplier", "1",
                 "--steps", "10", "--delta", "1e-5"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("pate: error:") and err.count("\n") == 1
    # too little noise: no epsilon (not "Infinity" in the JSON), and no warning about an order
    for noise, said in (("1e-9", "epsilon is unbounded at noise multiplier 1e-09"),
                        ("0", "noise multiplier must be a finite number > 0, got 0.0")):
        assert main(["epsilon", "dpsgd", "--sampling-rate", "0.01", "--noise-multiplier", noise,
                     "--steps", "10", "--delta", "1e-5", "--json"]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and said in err, err


def test_nothing_released_costs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    """No step, or a sampling rate of 0: epsilon 0, not the conversion's log(1/delta)/(a-1)."""
    for rate, steps in (("0.01", "0"), ("0", "10")):
        assert main(["epsilon", "dpsgd", "--sampling-rate", rate, "--noise-multiplier", "1.1",
                     "--steps", steps, "--delta", "1e-5", "--json"]) == 0
        out = capsys.readouterr()
        assert json.loads(out.out)["epsilon"] == 0.0 and out.err == ""


def test_noise_outside_what_float64_computes_is_bounded_not_an_error() -> None:
    """Below NOISE_FLOOR the RDP is inf, above NOISE_CEILING the ceiling's curve (both upper
    bounds); inside, more noise costs strictly less. A target epsilon of inf is refused."""
    tiny = sampled_gaussian_rdp(0.01, 1e-300, None, 100)
    huge = sampled_gaussian_rdp(0.01, 1e300, None, 100)
    assert np.all(np.isinf(tiny))
    np.testing.assert_array_equal(huge, sampled_gaussian_rdp(0.01, NOISE_CEILING, None, 100))
    assert np.all(sampled_gaussian_rdp(0.01, 1e3, None, 100)
                  >= sampled_gaussian_rdp(0.01, 1e4, None, 100))
    with pytest.raises(ValueError, match="finite number > 0"):
        noise_multiplier_for_epsilon(math.inf, 0.01, 100, 1e-5)
