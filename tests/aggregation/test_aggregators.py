"""The aggregators against their definitions (PATE 2017 §2.2; PATE 2018 §4, Algorithms 1-2) and
their costs against ``analysis``."""

from __future__ import annotations

import numpy as np
import pytest
from scipy.stats import norm

from analysis.costs import steps
from analysis.gaussian import gnmax_logq, gnmax_rdp_dependent, gnmax_rdp_independent
from analysis.lnmax import lnmax_rdp_dependent, lnmax_rdp_independent
from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    Mechanism,
    parameters,
)
from analysis.orders import default_orders
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)
from pate.aggregation.aggregators import COST_SLICE, NOISE, Aggregator, Branch

ORDERS = default_orders()


def plurality_votes(rows: int, classes: int = 10, teachers: int = 250,
                    seed: int = 1) -> np.ndarray:
    """Votes with a unique plurality whose margin varies from 1 to 150 votes."""
    rng = np.random.default_rng(seed)
    v = rng.multinomial(teachers, np.full(classes, 1.0 / classes), size=rows)
    top = rng.integers(0, classes, rows)
    v[np.arange(rows), top] = v.max(axis=1) + rng.integers(1, 150, rows)
    return v


@pytest.mark.parametrize("params", [
    LNMax(scale=1e-6),
    GNMax(sigma=1e-6),
    ConfidentGNMax(threshold=0.0, sigma1=1e-6, sigma2=1e-6),
])
def test_vanishing_noise_returns_the_plurality(params: Mechanism) -> None:
    v = plurality_votes(500)
    out = Aggregator(params).answer(v)
    np.testing.assert_array_equal(out.labels, np.argmax(v, axis=1))
    assert np.all(out.branch == Branch.TEACHERS)


@pytest.mark.parametrize("params", [LNMax(scale=1e7),
                                    GNMax(sigma=1e7)])
def test_huge_noise_spreads_the_labels(params: Mechanism) -> None:
    v = np.zeros((20000, 10), np.int64)
    v[:, 3] = 250  # unanimous teachers
    counts = np.bincount(Aggregator(params).answer(v).labels, minlength=10)
    # uniform: 2000 each, std ~42
    assert counts.min() > 1750 and counts.max() < 2250


def test_confident_answers_at_the_predicted_rate() -> None:
    t, s1 = 200.0, 40.0
    n = 20000
    v = np.zeros((3 * n, 10), np.int64)
    v[:n, 0] = 250          # far above T: always answered
    v[n:2 * n, 0] = 200     # at T: half
    v[n:2 * n, 1] = 50
    v[2 * n:, 0] = 60       # far below T: never
    v[2 * n:, 1:] = 21
    out = Aggregator(ConfidentGNMax(threshold=t, sigma1=s1, sigma2=1e-3)).answer(v)
    rates = [(out.labels[k * n:(k + 1) * n] >= 0).mean() for k in range(3)]
    predicted = np.exp(threshold_logpr_answered(t, s1, [250, 200, 60]))
    for rate, p in zip(rates, predicted, strict=True):
        assert abs(rate - p) < 5 * np.sqrt(p * (1 - p) / n) + 1e-3
    # answered queries get the plurality (sigma2 tiny), the others -1 and branch none
    answered = out.labels >= 0
    np.testing.assert_array_equal(out.labels[answered], np.argmax(v[answered], axis=1))
    assert np.all(out.branch[~answered] == Branch.NONE)
    assert np.all(out.branch[answered] == Branch.TEACHERS)


def test_confident_rate_matches_a_mid_probability() -> None:
    t, s1, n = 200.0, 50.0, 40000
    v = np.zeros((n, 10), np.int64)
    v[:, 0], v[:, 1] = 150, 100
    out = Aggregator(ConfidentGNMax(threshold=t, sigma1=s1, sigma2=1.0)).answer(v)
    p = norm.sf((t - 150) / s1)
    assert abs((out.labels >= 0).mean() - p) < 5 * np.sqrt(p * (1 - p) / n)


def test_confident_costs_come_from_analysis() -> None:
    v = plurality_votes(300, seed=7)
    t, s1, s2 = 120.0, 30.0, 20.0
    out = Aggregator(ConfidentGNMax(threshold=t, sigma1=s1, sigma2=s2)).answer(v)
    passed = out.branch == Branch.TEACHERS
    assert 0 < passed.sum() < len(v)
    step_ind = threshold_rdp_independent(s1, ORDERS)
    gn_ind = gnmax_rdp_independent(s2, ORDERS)
    np.testing.assert_allclose(out.rdp_independent[~passed],
                               np.tile(step_ind, ((~passed).sum(), 1)))
    np.testing.assert_allclose(out.rdp_independent[passed],
                               np.tile(step_ind + gn_ind, (passed.sum(), 1)))
    step_dep = threshold_rdp_dependent(
        threshold_logpr_answered(t, s1, threshold_inputs(v)), s1, ORDERS)
    gn_dep = gnmax_rdp_dependent(gnmax_logq(v, s2), s2, ORDERS)
    np.testing.assert_allclose(out.rdp_dependent, step_dep + passed[:, None] * gn_dep)
    assert np.all(out.rdp_dependent <= out.rdp_independent + 1e-12)
    np.testing.assert_allclose(out.total_independent(), out.rdp_independent.sum(axis=0))


def test_gnmax_and_lnmax_costs_come_from_analysis() -> None:
    v = plurality_votes(50, seed=3)
    g = Aggregator(GNMax(sigma=40.0)).answer(v)
    np.testing.assert_allclose(g.rdp_independent, np.tile(gnmax_rdp_independent(40.0, ORDERS),
                                                          (50, 1)))
    np.testing.assert_allclose(g.rdp_dependent,
                               gnmax_rdp_dependent(gnmax_logq(v, 40.0), 40.0, ORDERS))
    ln = Aggregator(LNMax(scale=20.0)).answer(v)
    np.testing.assert_allclose(ln.rdp_independent, np.tile(lnmax_rdp_independent(20.0, ORDERS),
                                                           (50, 1)))
    np.testing.assert_allclose(ln.rdp_dependent, lnmax_rdp_dependent(v, 20.0, ORDERS))


def test_interactive_branches_and_costs() -> None:
    t, s1, s2, gamma = 100.0, 1e-3, 1e-3, 0.8
    v = np.zeros((3, 4), np.int64)
    v[0] = [200, 50, 0, 0]   # teachers confident, student disagrees: threshold passes
    v[1] = [100, 100, 50, 0]  # teachers split; student sure of class 2 (> gamma)
    v[2] = [100, 100, 50, 0]  # teachers split; student unsure (< gamma): no answer
    probs = np.array([[0.0, 1.0, 0.0, 0.0],
                      [0.05, 0.05, 0.9, 0.0],
                      [0.3, 0.3, 0.4, 0.0]])
    agg = Aggregator(InteractiveGNMax(threshold=t, sigma1=s1, sigma2=s2,
                                     gamma=gamma))
    out = agg.answer(v, probs)
    # max(n - N p): row 0: 200 - 0 = 200 >= T; row 1: 100 - 12.5 < T; row 2: 100 - 75 < T
    np.testing.assert_array_equal(out.labels, [0, 2, -1])
    np.testing.assert_array_equal(out.branch, [Branch.TEACHERS, Branch.STUDENT, Branch.NONE])
    step_ind = threshold_rdp_independent(s1, ORDERS)
    np.testing.assert_allclose(out.rdp_independent[1], step_ind)  # the student costs nothing
    np.testing.assert_allclose(out.rdp_independent[2], step_ind)
    np.testing.assert_allclose(out.rdp_independent[0],
                               step_ind + gnmax_rdp_independent(s2, ORDERS))
    baseline = v.sum(axis=1, keepdims=True) * probs
    step_dep = threshold_rdp_dependent(
        threshold_logpr_answered(t, s1, threshold_inputs(v, baseline)), s1, ORDERS)
    np.testing.assert_allclose(out.rdp_dependent[1:], step_dep[1:])


def test_interactive_needs_distributions() -> None:
    agg = Aggregator(InteractiveGNMax(threshold=1, sigma1=1, sigma2=1, gamma=0.5))
    v = np.array([[3, 1]])
    for bad in ([[0.7, 0.7]], [[np.nan, 1.0]], [[1.5, -0.5]], [[1.0, 0.0, 0.0]]):
        with pytest.raises(ValueError):
            agg.answer(v, bad)
    with pytest.raises(ValueError):
        agg.answer(v)


def test_worst_case_bounds_every_realised_cost() -> None:
    v = plurality_votes(400, seed=5)
    for params in (ConfidentGNMax(threshold=100, sigma1=20, sigma2=10),
                   GNMax(sigma=10), LNMax(scale=10)):
        agg = Aggregator(params)
        out = agg.answer(v)
        assert np.all(out.total_independent() <= agg.worst_case_rdp(400) * (1 + 1e-12))


def test_noise_is_fresh_unless_an_offline_seed_is_given() -> None:
    v = np.zeros((2000, 10), np.int64)
    params = GNMax(sigma=1e6)
    a, b = Aggregator(params).answer(v), Aggregator(params).answer(v)
    assert not np.array_equal(a.labels, b.labels)
    with pytest.warns(RuntimeWarning, match="offline experiments"):
        c = Aggregator(params, offline_seed=3).answer(v)
    with pytest.warns(RuntimeWarning):
        d = Aggregator(params, offline_seed=3).answer(v)
    np.testing.assert_array_equal(c.labels, d.labels)


@pytest.mark.parametrize("params", [
    LNMax(scale=20.0),
    GNMax(sigma=30.0),
    ConfidentGNMax(threshold=0.0, sigma1=1.0, sigma2=30.0),
])
def test_a_tabulated_pool_costs_the_same(params: Mechanism) -> None:
    pool = plurality_votes(300, seed=11)
    rows = np.array([5, 17, 250, 3])
    plain = Aggregator(params).answer(pool[rows])
    tabled = Aggregator(params)
    assert tabled.tabulate(pool)
    out = tabled.answer(pool[rows], pool_rows=rows)
    np.testing.assert_allclose(out.rdp_dependent, plain.rdp_dependent)
    np.testing.assert_allclose(out.total_dependent(), plain.total_dependent())
    np.testing.assert_allclose(out.total_independent(), plain.total_independent())
    with pytest.raises(ValueError, match="tabulated"):
        tabled.answer(pool[rows], pool_rows=rows + 1)


@pytest.mark.parametrize("params", [ConfidentGNMax(threshold=200, sigma1=150, sigma2=40),
                                    InteractiveGNMax(threshold=100, sigma1=150, sigma2=40,
                                                     gamma=0.5)])
def test_a_tabulated_pool_has_every_selection_cost_in_advance(params: Mechanism) -> None:
    """No vote maximum is costed for the first time while a request waits (the time it took
    would tell that the maximum was new): tabulating a pool of N = 250 teachers' votes costs
    the selection of every input it can see, 0 to N, at the values a request would compute."""
    votes = np.random.default_rng(5).multinomial(250, np.full(10, 0.1), size=40)
    agg = Aggregator(params)
    assert agg.tabulate(votes)
    assert agg._step_table is not None and agg._step_table.shape == (251, agg.orders.size)
    select = steps(params).select
    for x in (0, 37, 250):
        np.testing.assert_array_equal(
            agg._step_table[x], select.rdp_dependent(select.logpr_answered([x]),
                                                     agg.orders)[0])
    # a request gathers from the table (nothing new is costed) the costs computed afresh
    rows = np.arange(40)
    probs = (np.random.default_rng(6).dirichlet(np.ones(10), size=40)
             if agg.takes_student_probs else None)
    agg.answer(votes, probs, pool_rows=rows)
    assert not agg._step_memo
    baseline = None if probs is None else 250 * probs
    step_in = np.unique(select.inputs(votes.astype(np.float64), baseline))
    np.testing.assert_array_equal(agg._step_dependent(select, step_in),
                                  Aggregator(params)._step_dependent(select, step_in))


@pytest.mark.parametrize("params", [GNMax(sigma=40.0), LNMax(scale=20.0)])
def test_a_large_batch_is_costed_in_slices_to_the_same_values(params: Mechanism) -> None:
    """Over ``COST_SLICE`` queries, the data-dependent costs are computed a slice at a time
    (their temporaries bounded, issue 28) and equal the costs computed at once."""
    v = plurality_votes(2 * COST_SLICE + 7, seed=17)
    out = Aggregator(params).answer(v)
    whole = steps(params).answer.rdp_dependent(v.astype(np.float64), ORDERS)
    np.testing.assert_array_equal(out.rdp_dependent, whole)
    table = Aggregator(params)
    assert table.tabulate(v)
    np.testing.assert_array_equal(table.answer(v[:3], pool_rows=np.arange(3)).rdp_dependent,
                                  whole[:3])


def test_every_step_of_every_mechanism_has_a_sampler() -> None:
    """A registered mechanism runs as soon as its steps have samplers: ``NOISE`` holds one per
    step kind, and the aggregator needs nothing else of it."""
    v = plurality_votes(20, seed=13)
    probs = np.full(v.shape, 1.0 / v.shape[1])
    for cls in MECHANISMS.values():
        mechanism = cls(**{f.name: 0.5 for f in parameters(cls)})
        agg = Aggregator(mechanism)
        plan = steps(mechanism)
        assert {type(plan.answer), type(plan.select)} - {type(None)} <= set(NOISE)
        out = agg.answer(v, probs if agg.takes_student_probs else None)
        assert out.labels.shape == (20,)
        np.testing.assert_allclose(agg.worst_case_rdp(1),
                                   plan.answer.rdp_independent(ORDERS)
                                   + (0 if plan.select is None
                                      else plan.select.rdp_independent(ORDERS)))
