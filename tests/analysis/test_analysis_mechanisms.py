"""GNMax, the threshold step and LNMax against independent computations: quadrature of the exact
output distributions, mpmath at high precision, Monte Carlo, and brute force over neighbours."""

import itertools
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.integrate import quad
from scipy.stats import laplace, norm

from analysis.gaussian import (
    gaussian_rdp,
    gnmax_logq,
    gnmax_rdp_dependent,
    gnmax_rdp_independent,
    theorem6_rdp,
)
from analysis.lnmax import lnmax_logq, lnmax_rdp_dependent, lnmax_rdp_independent, pure_eps_rdp
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)

ORDERS = np.array([1.5, 2.0, 3.0, 5.0, 8.0, 16.0, 32.0])


def renyi(p: np.ndarray, q: np.ndarray, order: float) -> float:
    """Rényi divergence of order a between two discrete distributions."""
    return math.log(np.sum(p**order * q ** (1 - order))) / (order - 1)


def gnmax_output_distribution(votes: np.ndarray, sigma: float) -> np.ndarray:
    """P[argmax_j (n_j + N(0, sigma^2)) = i] for every i, by one-dimensional quadrature."""
    out = []
    for i, n_i in enumerate(votes):
        others = np.delete(votes, i)

        def density(x: float, n_i: float = n_i, others: np.ndarray = others) -> float:
            return norm.pdf(x, n_i, sigma) * np.prod(norm.cdf((x - others) / sigma))

        out.append(quad(density, n_i - 12 * sigma, n_i + 12 * sigma, epsabs=1e-14)[0])
    return np.array(out)


def neighbours(votes: np.ndarray) -> list[np.ndarray]:
    """Vote vectors where one teacher moved its vote to another class."""
    out = []
    for a, b in itertools.permutations(range(votes.size), 2):
        if votes[a] > 0:
            u = votes.copy()
            u[a] -= 1
            u[b] += 1
            out.append(u)
    return out


@pytest.mark.parametrize("sigma,shift", [(1.0, 1.0), (2.5, math.sqrt(2)), (0.7, 3.0)])
def test_gaussian_rdp_equals_numerical_renyi_divergence(sigma: float, shift: float) -> None:
    for order in (1.5, 2.0, 7.0):
        def integrand(x: float, order: float = order) -> float:
            return math.exp(order * norm.logpdf(x, 0, sigma)
                            + (1 - order) * norm.logpdf(x, shift, sigma))

        exact = math.log(quad(integrand, -40 * sigma, 40 * sigma, epsabs=1e-15, limit=200)[0]
                         ) / (order - 1)
        assert gaussian_rdp(shift, sigma, order) == pytest.approx(exact, rel=1e-7)


def test_gnmax_logq_is_the_union_bound_and_bounds_monte_carlo() -> None:
    rng = np.random.default_rng(1)
    votes = np.array([[30, 22, 5, 3], [40, 10, 10, 0], [20, 20, 10, 10], [60, 0, 0, 0]])
    sigma = 6.0
    logq = gnmax_logq(votes, sigma)
    for row, lq in zip(votes, logq, strict=True):
        top = int(np.argmax(row))
        union = sum(norm.sf(row[top] - row[j], scale=math.sqrt(2) * sigma)
                    for j in range(row.size) if j != top)
        assert math.exp(lq) == pytest.approx(min(union, 1 - 1 / row.size), rel=1e-12)
        noisy = row + rng.normal(0, sigma, size=(200_000, row.size))
        wrong = np.mean(noisy.argmax(axis=1) != top)
        assert wrong <= math.exp(lq) + 4 * math.sqrt(wrong * (1 - wrong) / 200_000) + 1e-4


def test_theorem6_matches_high_precision_formula() -> None:
    mpmath.mp.dps = 50
    for sigma, logq in [(40.0, -12.0), (100.0, -30.0), (5.0, -9.5)]:
        q = mpmath.e ** mpmath.mpf(logq)
        mu2 = sigma * mpmath.sqrt(-mpmath.mpf(logq))
        mu1 = mu2 + 1
        eps1, eps2 = mu1 / sigma**2, mu2 / sigma**2
        a_ = (1 - q) / (1 - (q * mpmath.e**eps2) ** ((mu2 - 1) / mu2))
        b_ = mpmath.e**eps1 / q ** (1 / (mu1 - 1))
        for order in (2.0, 5.0, 11.0):
            exact = mpmath.log((1 - q) * a_ ** (order - 1) + q * b_ ** (order - 1)) / (order - 1)
            assert theorem6_rdp(np.array([logq]), sigma, np.array([order]))[0, 0] == \
                pytest.approx(float(exact), rel=1e-10)


@pytest.mark.parametrize("votes,sigma", [([14, 2, 0], 2.0), ([20, 4, 1], 3.0), ([9, 8, 3], 2.0),
                                         ([30, 0, 0], 4.0)])
def test_gnmax_data_dependent_bound_holds_against_every_neighbour(votes: list[int],
                                                                  sigma: float) -> None:
    v = np.array(votes)
    bound = gnmax_rdp_dependent(gnmax_logq(v[None], sigma), sigma, ORDERS)[0]
    p = gnmax_output_distribution(v, sigma)
    for u in neighbours(v):
        p_u = gnmax_output_distribution(u, sigma)
        for order, r in zip(ORDERS, bound, strict=True):
            assert renyi(p, p_u, order) <= r * (1 + 1e-6) + 1e-9


def test_threshold_bound_holds_against_neighbours_and_matches_monte_carlo() -> None:
    threshold, sigma1, n = 30.0, 4.0, 50
    rng = np.random.default_rng(2)
    for top in (10, 25, 31, 45):
        logp = threshold_logpr_answered(threshold, sigma1, np.array([top]))
        mc = np.mean(top + rng.normal(0, sigma1, 200_000) >= threshold)
        assert math.exp(logp[0]) == pytest.approx(mc, abs=5e-3)
        bound = threshold_rdp_dependent(logp, sigma1, ORDERS)[0]
        assert np.all(bound <= threshold_rdp_independent(sigma1, ORDERS) + 1e-15)
        p = math.exp(logp[0])
        for other in (top - 1, top + 1):
            if not 0 <= other <= n:
                continue
            p_o = math.exp(threshold_logpr_answered(threshold, sigma1, np.array([other]))[0])
            for order, r in zip(ORDERS, bound, strict=True):
                assert renyi(np.array([p, 1 - p]), np.array([p_o, 1 - p_o]), order) <= r + 1e-12


def test_threshold_inputs_subtract_the_baseline_and_round() -> None:
    votes = np.array([[5, 3, 2], [10, 0, 0]])
    baseline = np.array([[3.3, 3.3, 3.4], [2.0, 4.0, 4.0]])
    np.testing.assert_array_equal(threshold_inputs(votes), [5, 10])
    np.testing.assert_array_equal(threshold_inputs(votes, baseline), [2, 8])


def test_lnmax_pairwise_term_is_the_exact_laplace_difference_tail() -> None:
    scale = 3.0
    for gap in (0.0, 1.0, 4.0, 10.0):
        exact = quad(lambda x, g=gap: laplace.pdf(x, scale=scale) * laplace.sf(x + g, scale=scale),
                     -80, 80, epsabs=1e-14)[0]
        logq = lnmax_logq(np.array([[gap + 100.0, 100.0, 0.0]]), scale)[0]
        third = (2 + (gap + 100) / scale) / 4 * math.exp(-(gap + 100) / scale)
        assert math.exp(logq) == pytest.approx(min(exact + third, 0.5 * (1 + 1)), rel=1e-6)


def laplace_cdf(x: float, loc: np.ndarray, scale: float) -> np.ndarray:
    """Laplace's CDF written out: scipy.stats' per-call overhead would dominate the quadrature."""
    z = (x - loc) / scale
    return np.where(z < 0, 0.5 * np.exp(np.minimum(z, 0)), 1 - 0.5 * np.exp(-np.maximum(z, 0)))


def lnmax_output_distribution(votes: np.ndarray, scale: float) -> np.ndarray:
    out = []
    for i, n_i in enumerate(votes):
        others = np.delete(votes, i)
        out.append(quad(lambda x, n_i=n_i, o=others: np.exp(-abs(x - n_i) / scale) / (2 * scale)
                        * np.prod(laplace_cdf(x, o, scale)), n_i - 60 * scale,
                        n_i + 60 * scale, epsabs=1e-14, limit=200)[0])
    return np.array(out)


@pytest.mark.parametrize("votes,scale", [([20, 2, 1], 2.0), ([12, 10, 1], 2.0), ([40, 0, 0], 5.0)])
def test_lnmax_bound_holds_against_every_neighbour(votes: list[int], scale: float) -> None:
    v = np.array(votes)
    bound = lnmax_rdp_dependent(v[None], scale, ORDERS)[0]
    assert np.all(bound <= lnmax_rdp_independent(scale, ORDERS) + 1e-15)
    p = lnmax_output_distribution(v, scale)
    for u in neighbours(v):
        p_u = lnmax_output_distribution(u, scale)
        for order, r in zip(ORDERS, bound, strict=True):
            assert renyi(p, p_u, order) <= r * (1 + 1e-6) + 1e-9


vote_rows = st.integers(2, 12).flatmap(lambda m: st.lists(
    st.lists(st.integers(0, 60), min_size=m, max_size=m).filter(lambda r: sum(r) > 0),
    min_size=1, max_size=8))


@given(vote_rows, st.floats(0.5, 200.0))
@settings(max_examples=80, deadline=None)
def test_gnmax_properties(rows: list[list[int]], sigma: float) -> None:
    width = len(rows[0])
    total = max(sum(r) for r in rows)
    votes = np.array([[*r[:-1], r[-1] + total - sum(r)] for r in rows if len(r) == width])
    dep = gnmax_rdp_dependent(gnmax_logq(votes, sigma), sigma, ORDERS)
    ind = gnmax_rdp_independent(sigma, ORDERS)
    assert np.all(np.isfinite(dep)) and np.all(dep >= 0)
    assert np.all(dep <= ind + 1e-15)
    per_row = np.vstack([gnmax_rdp_dependent(gnmax_logq(r[None], sigma), sigma, ORDERS)
                         for r in votes])
    np.testing.assert_array_equal(dep, per_row)
    assert np.all(gnmax_rdp_independent(sigma * 1.5, ORDERS) < ind)


@given(st.floats(1e-3, 5000.0), st.floats(-2000.0, 0.0))
@settings(max_examples=80, deadline=None)
def test_pure_eps_rdp_properties(eps: float, logq: float) -> None:
    r = pure_eps_rdp(np.array([logq]), eps, ORDERS)[0]
    assert np.all(np.isfinite(r)) and np.all(r >= 0)
    assert np.all(r <= np.minimum(eps, eps**2 * ORDERS / 2) + 1e-15)


def test_edge_cases() -> None:
    sigma = 10.0
    # one class: the output is fixed and free
    assert np.all(gnmax_rdp_dependent(gnmax_logq(np.array([[25]]), sigma), sigma, ORDERS) == 0)
    assert np.all(lnmax_rdp_dependent(np.array([[25]]), 2.0, ORDERS) == 0)
    # a tiny Laplace scale (pure epsilon 2000): finite, capped by epsilon, no overflow
    tiny = lnmax_rdp_dependent(np.array([[0, 12, 10, 37, 1, 15, 4, 7, 83, 81]]), 1e-3, ORDERS)
    assert np.all(np.isfinite(tiny)) and np.all(tiny <= 2000.0)
    # a two-way tie gets no data-dependent saving
    tie = gnmax_rdp_dependent(gnmax_logq(np.array([[50, 50, 0]]), sigma), sigma, ORDERS)[0]
    np.testing.assert_array_equal(tie, gnmax_rdp_independent(sigma, ORDERS))
    # unanimous votes of many teachers are much cheaper than the data-independent bound
    unanimous = gnmax_rdp_dependent(gnmax_logq(np.array([[250, 0, 0]]), 40.0), 40.0, ORDERS)[0]
    assert np.all(unanimous > 0)
    assert unanimous[1] < 0.01 * gnmax_rdp_independent(40.0, ORDERS)[1]
    # one teacher: no consensus to exploit
    one = gnmax_rdp_dependent(gnmax_logq(np.array([[1, 0, 0]]), 1.0), 1.0, ORDERS)[0]
    np.testing.assert_array_equal(one, gnmax_rdp_independent(1.0, ORDERS))
    with pytest.raises(ValueError, match="sigma"):
        gnmax_rdp_dependent(np.array([-3.0]), 0.0, ORDERS)
