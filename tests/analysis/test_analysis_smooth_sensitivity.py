"""Smooth sensitivity against brute force over every vote vector of small ensembles."""

import functools
import itertools
import math
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from analysis.costs import realised_rdp_independent
from analysis.gaussian import gnmax_logq
from analysis.mechanisms import ConfidentGNMax, LNMax
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from analysis.smooth_sensitivity import (
    GNMaxSensitivity,
    check_conditions,
    gnmax_local_sensitivity_total,
    gnss_rdp,
    optimise_release,
    smooth_sensitivity,
    threshold_local_sensitivity_total,
)
from analysis.threshold import threshold_logpr_answered, threshold_rdp_dependent
from analysis.votes_analysis import analyze_votes


def all_vote_vectors(teachers: int, classes: int) -> np.ndarray:
    """Every way of splitting ``teachers`` votes over ``classes`` classes."""
    rows = [c for c in itertools.product(range(teachers + 1), repeat=classes)
            if sum(c) == teachers]
    return np.array(rows)


def distance(u: np.ndarray, v: np.ndarray) -> int:
    """Number of teachers that must change their vote to turn v into u."""
    return int(np.maximum(u - v, 0).sum())


@functools.cache
def space(teachers: int, classes: int) -> tuple[np.ndarray, np.ndarray]:
    """All vote vectors and, for each, the indices of its neighbours (one vote moved)."""
    vectors = all_vote_vectors(teachers, classes)
    index = {tuple(v): i for i, v in enumerate(vectors)}
    nbrs = []
    for v in vectors:
        ids = []
        for a, b in itertools.permutations(range(classes), 2):
            if v[a] > 0:
                u = v.copy()
                u[a] -= 1
                u[b] += 1
                ids.append(index[tuple(u)])
        nbrs.append(ids)
    return vectors, np.array(nbrs, dtype=object)


def exact_ls_at_distance(costs: np.ndarray, vectors: np.ndarray, nbrs: np.ndarray,
                         v: np.ndarray) -> np.ndarray:
    """max over u within distance d of v of max_{u' ~ u} |cost(u') - cost(u)|, d = 0..N-1."""
    teachers = int(v.sum())
    local = np.array([max(abs(costs[j] - costs[i]) for j in nbrs[i])
                      for i in range(len(vectors))])
    dist = np.array([distance(u, v) for u in vectors])
    return np.array([local[dist <= d].max() for d in range(teachers)])


@pytest.mark.parametrize("sigma,order", [(2.0, 2.0), (3.0, 3.0), (1.5, 2.0)])
def test_gnmax_local_sensitivity_bounds_brute_force(sigma: float, order: float) -> None:
    teachers, classes = 12, 3
    vectors, nbrs = space(teachers, classes)
    sens = GNMaxSensitivity(sigma, classes, order)
    costs = sens.cost(gnmax_logq(vectors, sigma))
    walks_seen = set()
    for v in vectors[:: max(1, len(vectors) // 25)]:
        ours = gnmax_local_sensitivity_total(v[None], sigma, order)
        exact = exact_ls_at_distance(costs, vectors, nbrs, v)
        assert np.all(ours >= exact - 1e-12), (v, ours, exact)
        logq = gnmax_logq(v[None], sigma)[0]
        walks_seen.add("right" if logq < sens.logq1 else "left" if logq > sens.logq0 else "flat")
    assert walks_seen == {"right", "left", "flat"} or walks_seen >= {"right", "left"}


def test_threshold_local_sensitivity_brute_force() -> None:
    teachers, classes, threshold, sigma1, order = 14, 3, 9.0, 2.5, 4.0
    vectors, nbrs = space(teachers, classes)
    logp = threshold_logpr_answered(threshold, sigma1, vectors.max(axis=1))
    costs = threshold_rdp_dependent(logp, sigma1, np.array([order]))[:, 0]
    for v in vectors[::7]:
        ours = threshold_local_sensitivity_total(np.array([v.max()]), teachers, threshold,
                                                 sigma1, order)
        exact = exact_ls_at_distance(costs, vectors, nbrs, v)
        assert np.all(ours >= exact - 1e-12)
        assert np.all(np.diff(ours) >= 0)
        top_two = np.sort(v)[-2:]
        if top_two[1] > top_two[0] + 1 and 0 < v.max() < teachers:  # max moves both ways
            assert ours[0] == pytest.approx(exact[0], rel=1e-12)


def test_totals_add_over_queries_and_weights_scale() -> None:
    rng = np.random.default_rng(0)
    votes = np.array([rng.multinomial(40, rng.dirichlet(np.ones(4) * 0.4)) for _ in range(30)])
    weights = rng.uniform(0, 1, 30)
    total = gnmax_local_sensitivity_total(votes, 4.0, 6.0, weights)
    parts = sum(w * gnmax_local_sensitivity_total(v[None], 4.0, 6.0) for v, w in
                zip(votes, weights, strict=True))
    np.testing.assert_allclose(total, parts, rtol=1e-12)
    np.testing.assert_array_equal(total, gnmax_local_sensitivity_total(votes, 4.0, 6.0, weights,
                                                                       threads=1))


@given(st.lists(st.floats(0, 1), min_size=2, max_size=50), st.floats(0.0, 0.5))
@settings(max_examples=100, deadline=None)
def test_smooth_sensitivity_properties(ls: list[float], beta: float) -> None:
    arr = np.array(ls)
    ss = smooth_sensitivity(arr, np.array([beta, beta + 0.1]))
    assert ss[0] >= arr[0] and ss[0] >= ss[1]
    assert ss[0] <= arr.max() + 1e-15


def test_gnss_cost_and_release_search() -> None:
    order, beta = 10.0, 0.03
    expected = order * math.exp(2 * beta) / 4.0**2 + (
        beta * order - 0.5 * math.log(1 - 2 * order * beta)) / (order - 1)
    assert gnss_rdp(beta, 4.0, order) == pytest.approx(expected, rel=1e-14)
    with pytest.raises(ValueError, match="order"):
        gnss_rdp(0.06, 4.0, order)
    ls = np.linspace(0.01, 0.2, 100)
    best = optimise_release(ls, 1.0, order)
    assert 0.3 / order <= best.beta < 0.495 / order
    objective = lambda r: r.rdp_cost + 2 * r.value * r.sigma  # noqa: E731
    for b in np.arange(0.3 / order, 0.495 / order, 0.01 / order):
        assert objective(best) <= objective(optimise_release(ls, 1.0, order, [b])) + 1e-12


def test_conditions_hold_for_paper_parameters_and_fail_where_they_do() -> None:
    assert check_conditions(40.0, 10, 17.0) == (True, True)
    assert check_conditions(100.0, 150, 54.0) == (True, True)
    assert check_conditions(3.0, 3, 5.0) == (True, False)  # beta(b_u(q)) - beta(q) dips
    assert check_conditions(40.0, 1, 17.0) == (True, True)  # one class: nothing to check


def test_the_fallback_where_the_proof_fails_reads_no_vote() -> None:
    """Where conditions C5/C6 fail nothing data-dependent may be released: the fallback is the
    data-independent bound of every query answered, the same whatever the votes."""
    mechanism, orders = ConfidentGNMax(14, 4, 2), default_orders()
    worst = epsilon_from_rdp(realised_rdp_independent(mechanism, 10, 10, orders), orders,
                             1e-5)[0]
    released = []
    for row in ([20, 0, 0], [7, 7, 6], [12, 5, 3]):
        result = analyze_votes(np.array([row] * 10), mechanism, 1e-5).smooth_sensitivity
        assert result is not None and result.fallback
        released.append({k: v for k, v in result.to_json().items() if k != "conditions"})
    # nothing of the release that did not happen (order, beta, SS, sigma) is said either
    assert released[0] == released[1] == released[2]
    assert released[0]["epsilon"] == worst and released[0]["beta"] is None


def test_no_warning_depends_on_the_votes() -> None:
    """Whether the optimum order of a vote-dependent curve is at the grid's end is a fact about
    the votes: the analysis says nothing of it, whatever the votes (it said it for split votes
    and not for unanimous ones)."""
    unanimous = np.tile([250] + [0] * 9, (5, 1))
    split = np.tile([126, 124] + [0] * 8, (5, 1))
    for mechanism in (LNMax(scale=20), ConfidentGNMax(200, 150, 40)):
        for votes in (unanimous, split):
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                analyze_votes(votes, mechanism, 1e-5)
    with pytest.warns(RuntimeWarning, match="at the end of the grid"):  # a public curve still does
        epsilon_from_rdp(np.linspace(1, 0, 5), np.arange(2.0, 7.0), 1e-5)


def test_where_theorem_6_does_not_apply_the_analysis_falls_back() -> None:
    """A sigma so small that no q0 exists at the data-dependent order (Theorem 6 does not
    apply at its natural bound): the proof does not apply, as where C5 fails, so the sanitised
    epsilon falls back to the data-independent one; it used to raise, naming the order (a
    statistic of the votes)."""
    split = np.tile([130, 120] + [0] * 8, (5, 1))
    bound = analyze_votes(split, ConfidentGNMax(100, 10, 5), 1e-5).smooth_sensitivity
    assert bound is not None and bound.fallback and not (bound.c5 or bound.c6)
    assert np.isfinite(bound.epsilon)


def test_a_fixed_order_past_the_largest_is_refused() -> None:
    """An order past ``MAX_FIXED_ORDER`` gains nothing and overflows the bounds (1e308 gave an
    infinite epsilon): refused; the largest is analysed to finite figures."""
    from analysis.orders import MAX_FIXED_ORDER

    votes = np.array([[90, 5, 5]] * 10)
    bound = analyze_votes(votes, ConfidentGNMax(60, 20, 10), 1e-5, order=MAX_FIXED_ORDER)
    assert np.isfinite(bound.data_independent.epsilon)
    with pytest.raises(ValueError, match="a fixed order must be at most 1e"):
        analyze_votes(votes, ConfidentGNMax(60, 20, 10), 1e-5, order=1e308)
