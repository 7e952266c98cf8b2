"""The cost interpreter (``analysis.costs``) against the formula functions it dispatches to: the
per-step RDP of every mechanism equals what the step's own formulas give."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.costs import (
    GaussianArgmax,
    LaplaceArgmax,
    Steps,
    ThresholdStep,
    expected_costs,
    realised_rdp_independent,
    steps,
    worst_case_queries,
)
from analysis.gaussian import gnmax_logq, gnmax_rdp_dependent, gnmax_rdp_independent
from analysis.lnmax import lnmax_rdp_dependent, lnmax_rdp_independent
from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    parameters,
)
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)

ORDERS = default_orders()


def votes(rows: int = 60, classes: int = 10, teachers: int = 250, seed: int = 2) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.multinomial(teachers, rng.dirichlet(np.full(classes, 0.3), size=rows)[0],
                           size=rows)


def test_the_decomposition() -> None:
    assert steps(LNMax(20.0)) == Steps(None, LaplaceArgmax(20.0))
    assert steps(GNMax(40.0)) == Steps(None, GaussianArgmax(40.0))
    assert steps(ConfidentGNMax(200.0, 150.0, 40.0)) == Steps(ThresholdStep(200.0, 150.0),
                                                              GaussianArgmax(40.0))
    assert steps(InteractiveGNMax(250.0, 40.0, 30.0, 0.9)) == Steps(
        ThresholdStep(250.0, 40.0), GaussianArgmax(30.0), student_gamma=0.9)
    for cls in MECHANISMS.values():  # every registered mechanism has its interpreter case
        steps(cls(**{f.name: 0.5 for f in parameters(cls)}))
    with pytest.raises(TypeError, match="not a mechanism"):
        steps("gnmax")  # type: ignore[arg-type]


def test_lnmax_and_gnmax_costs_are_their_formulas() -> None:
    v = votes()
    ln = expected_costs(v, LNMax(20.0), ORDERS)
    np.testing.assert_array_equal(ln.answer_dependent, lnmax_rdp_dependent(v, 20.0, ORDERS))
    np.testing.assert_array_equal(ln.answer_independent[7], lnmax_rdp_independent(20.0, ORDERS))
    g = expected_costs(v, GNMax(40.0), ORDERS)
    np.testing.assert_array_equal(g.answer_dependent,
                                  gnmax_rdp_dependent(gnmax_logq(v, 40.0), 40.0, ORDERS))
    np.testing.assert_array_equal(g.answer_independent[3], gnmax_rdp_independent(40.0, ORDERS))
    for c in (ln, g):  # no selection: every query is answered, nothing else is paid
        np.testing.assert_array_equal(c.pr_answered, 1.0)
        assert not c.select_dependent.any() and not c.select_independent.any()
        np.testing.assert_array_equal(c.expected(dependent=True), c.answer_dependent)


@pytest.mark.parametrize("interactive", [False, True])
def test_thresholded_costs_are_their_formulas(interactive: bool) -> None:
    v = votes(seed=4)
    t, s1, s2 = 120.0, 50.0, 30.0
    baseline = None
    mechanism = ConfidentGNMax(t, s1, s2)
    if interactive:
        rng = np.random.default_rng(5)
        baseline = 250 * rng.dirichlet(np.ones(10), size=v.shape[0])
        mechanism = InteractiveGNMax(t, s1, s2, 0.8)
    c = expected_costs(v, mechanism, ORDERS, baseline)
    logp = threshold_logpr_answered(t, s1, threshold_inputs(v, baseline))
    np.testing.assert_array_equal(c.pr_answered, np.exp(logp))
    np.testing.assert_array_equal(c.select_dependent, threshold_rdp_dependent(logp, s1, ORDERS))
    np.testing.assert_array_equal(c.select_independent[0], threshold_rdp_independent(s1, ORDERS))
    np.testing.assert_array_equal(c.answer_dependent,
                                  gnmax_rdp_dependent(gnmax_logq(v, s2), s2, ORDERS))
    np.testing.assert_array_equal(c.answer_independent[0], gnmax_rdp_independent(s2, ORDERS))
    np.testing.assert_allclose(c.expected(dependent=False),
                               threshold_rdp_independent(s1, ORDERS)
                               + np.exp(logp)[:, None] * gnmax_rdp_independent(s2, ORDERS))


def test_a_step_that_never_beats_its_bound_is_detected() -> None:
    """Huge noise: the data-dependent bound is the data-independent one even for unanimous
    votes, so the step needs no smooth sensitivity; small noise: it can do better."""
    assert GaussianArgmax(1e4).always_independent(250, 10, 10.0)
    assert not GaussianArgmax(40.0).always_independent(250, 10, 10.0)
    assert not ThresholdStep(200.0, 50.0).always_independent(250, 10.0)


@pytest.mark.parametrize("mechanism", [ConfidentGNMax(300.0, 200.0, 40.0), GNMax(sigma=40.0),
                                       LNMax(scale=20.0)], ids=lambda m: m.name)
@pytest.mark.parametrize("epsilon", [0.5, 2.0, 8.0])
@pytest.mark.filterwarnings("ignore:optimal Rényi order")
def test_worst_case_queries_is_the_largest_count_within_the_budget(mechanism, epsilon) -> None:
    def spent(k: int) -> float:
        return epsilon_from_rdp(realised_rdp_independent(mechanism, k, k, ORDERS), ORDERS,
                                1e-5)[0]

    k = worst_case_queries(mechanism, epsilon, 1e-5, ORDERS)
    if k:
        assert spent(k) <= epsilon
    assert spent(k + 1) > epsilon
    assert worst_case_queries(mechanism, 1e6, 1e-5, ORDERS, limit=50) == 50
