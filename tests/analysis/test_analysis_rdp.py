"""RDP composition and conversions against independent computations."""

import math

import numpy as np
import pytest
from dp_accounting.rdp.rdp_privacy_accountant import compute_delta, compute_epsilon
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.optimize import brentq
from scipy.stats import norm

from analysis.orders import default_orders
from analysis.rdp import compose, delta_from_rdp, epsilon_curve, epsilon_from_rdp


def exact_gaussian_delta(eps: float, sigma: float) -> float:
    """Exact delta(eps) of the Gaussian mechanism, sensitivity 1 (Balle & Wang 2018, Thm. 8)."""
    return (norm.cdf(0.5 / sigma - eps * sigma)
            - math.exp(eps) * norm.cdf(-0.5 / sigma - eps * sigma))


def exact_gaussian_epsilon(delta: float, sigma: float) -> float:
    return brentq(lambda e: exact_gaussian_delta(e, sigma) - delta, 0.0, 100.0)


@pytest.mark.parametrize("sigma", [0.8, 2.0, 5.0, 20.0])
@pytest.mark.parametrize("delta", [1e-3, 1e-5, 1e-8])
def test_conversions_are_valid_and_ordered_on_the_gaussian(sigma: float, delta: float) -> None:
    orders = default_orders()
    rdp = orders / (2 * sigma**2)
    classic, _ = epsilon_from_rdp(rdp, orders, delta, "classic")
    improved, _ = epsilon_from_rdp(rdp, orders, delta, "improved")
    exact = exact_gaussian_epsilon(delta, sigma)
    assert exact <= improved <= classic
    assert improved < 1.5 * exact + 0.1  # and not uselessly loose


def test_improved_conversion_matches_dp_accounting() -> None:
    orders = default_orders()
    rng = np.random.default_rng(0)
    for _ in range(20):
        rdp = rng.uniform(0.0, 0.05) * orders + rng.uniform(0, 1)
        delta = 10 ** rng.uniform(-10, -3)
        ours, _ = epsilon_from_rdp(rdp, orders, delta, "improved")
        theirs, _ = compute_epsilon(orders, rdp, delta)
        assert ours == pytest.approx(theirs, rel=1e-9)
        d_ours, _ = delta_from_rdp(rdp, orders, ours + 0.1, "improved")
        d_theirs, _ = compute_delta(orders, rdp, ours + 0.1)
        assert d_ours <= d_theirs * (1 + 1e-9)


@pytest.mark.filterwarnings("ignore:optimal Rényi order")
@given(st.floats(1e-4, 10.0), st.floats(1e-12, 0.5), st.sampled_from(["classic", "improved"]))
@settings(max_examples=60, deadline=None)
def test_delta_from_epsilon_inverts(scale: float, delta: float, conversion: str) -> None:
    orders = default_orders()
    rdp = scale * orders / 100
    eps, _ = epsilon_from_rdp(rdp, orders, delta, conversion)
    back, _ = delta_from_rdp(rdp, orders, eps, conversion)
    assert back <= delta * (1 + 1e-9)


@given(st.lists(st.floats(0, 5), min_size=1, max_size=5), st.floats(1e-10, 0.1))
@settings(max_examples=60, deadline=None)
def test_improved_never_above_classic(slopes: list[float], delta: float) -> None:
    orders = default_orders()
    rdp = compose(*[s * orders / 50 for s in slopes])
    assert np.all(epsilon_curve(rdp, orders, delta, "improved")
                  <= epsilon_curve(rdp, orders, delta, "classic") + 1e-12)


def test_composition_adds_at_each_order() -> None:
    a, b = np.arange(1.0, 4.0), np.array([0.5, 0.25, 0.125])
    np.testing.assert_array_equal(compose(a, b), a + b)


@pytest.mark.parametrize("delta", [0.0, 1.0, -1e-5, 2.0])
def test_bad_delta_is_refused(delta: float) -> None:
    with pytest.raises(ValueError, match="delta"):
        epsilon_from_rdp(np.ones(3), np.array([2.0, 3.0, 4.0]), delta)


def test_default_grid_contains_the_published_grid_and_warns_at_an_edge() -> None:
    orders = default_orders()
    published = np.concatenate([np.arange(2, 100.5, 0.5),
                                np.logspace(np.log10(100), np.log10(500), 100)])
    assert np.all(np.isin(published, orders))
    assert orders.min() < 1.2 and orders.max() >= 5000
    with pytest.warns(RuntimeWarning, match="end of the grid"):
        epsilon_from_rdp(np.full(orders.size, 1e-9), orders, 0.5, "classic")
