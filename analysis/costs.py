"""The one cost interpreter: a mechanism of ``analysis.mechanisms`` as PATE 2018's steps, and each
step's data-independent and data-dependent RDP (docs/privacy-math.md §2-4).

Every PATE aggregator is an optional selection step (the noisy threshold step of PATE 2018, §4.2:
max_j (n_j - baseline_j) + N(0, sigma1^2) >= T) followed by an answering step (a noisy argmax:
Laplace, PATE 2017 §2.2, or Gaussian, PATE 2018 §4.1) on the queries the selection passes. The
decomposition is made here, in ``steps`` and nowhere else; each step kind computes its costs from
the formulas of ``analysis.lnmax``, ``analysis.gaussian``, ``analysis.threshold`` and
``analysis.smooth_sensitivity`` (no formula is derived here). The aggregator (realised costs), the
Table-2 analysis (expected costs) and the report all call it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.gaussian import gnmax_logq, gnmax_rdp_dependent, gnmax_rdp_independent
from analysis.lnmax import lnmax_rdp_dependent, lnmax_rdp_independent
from analysis.mechanisms import (
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    Mechanism,
    ParameterError,
)
from analysis.rdp import Conversion, epsilon_from_rdp
from analysis.smooth_sensitivity import (
    check_conditions,
    gnmax_local_sensitivity_total,
    threshold_local_sensitivity_total,
)
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)


def _always_independent(costs_at_extremes: NDArray[np.float64],
                        independent: NDArray[np.float64]) -> bool:
    """Data-dependent analysis can never beat the data-independent one when even the most
    favourable votes give the same cost (then the step needs no smooth sensitivity)."""
    return bool(np.all(np.isclose(costs_at_extremes, independent)))


@dataclass(frozen=True)
class ThresholdStep:
    """Selection: max_j (n_j - baseline_j) + N(0, sigma1^2) >= T (PATE 2018, §4.2-4.3); the
    baseline is Interactive-GNMax's N p_j, zero otherwise."""

    threshold: float
    sigma1: float

    def inputs(self, votes: ArrayLike, baseline: ArrayLike | None = None
               ) -> NDArray[np.float64]:
        """What the step thresholds, per query, rounded (``threshold_inputs``)."""
        return threshold_inputs(votes, baseline)

    def logpr_answered(self, inputs: ArrayLike) -> NDArray[np.float64]:
        """log P[the query passes], per input."""
        return threshold_logpr_answered(self.threshold, self.sigma1, inputs)

    def rdp_independent(self, orders: ArrayLike) -> NDArray[np.float64]:
        """Data-independent RDP of one selection, ``[orders]``."""
        return threshold_rdp_independent(self.sigma1, orders)

    def rdp_dependent(self, logpr_answered: ArrayLike, orders: ArrayLike
                      ) -> NDArray[np.float64]:
        """Data-dependent RDP per query, ``[queries, orders]``, from ``logpr_answered``."""
        return threshold_rdp_dependent(logpr_answered, self.sigma1, orders)

    def always_independent(self, num_teachers: int, order: float) -> bool:
        """Whether the data-dependent cost equals the data-independent one even at the extreme
        inputs 0 and N (then the step contributes no sensitivity)."""
        a = np.array([order])
        extremes = self.logpr_answered(np.array([0.0, float(num_teachers)]))
        return _always_independent(self.rdp_dependent(extremes, a), self.rdp_independent(a))

    def local_sensitivity_total(self, inputs: ArrayLike, num_teachers: int,
                                order: float) -> NDArray[np.float64]:
        """LS of the step's total RDP at distance d (PATE 2018, App. C)."""
        return threshold_local_sensitivity_total(inputs, num_teachers, self.threshold,
                                                 self.sigma1, order)


@dataclass(frozen=True)
class LaplaceArgmax:
    """Answering: argmax_j (n_j + Lap(b)), pure 2/b-DP (PATE 2017, §2.2 and Thm. 3). PATE 2017
    leaves its smooth-sensitivity analysis open."""

    scale: float
    smooth_sensitivity: ClassVar[bool] = False

    def rdp_independent(self, orders: ArrayLike) -> NDArray[np.float64]:
        """Data-independent RDP of one answer, ``[orders]``."""
        return lnmax_rdp_independent(self.scale, orders)

    def rdp_dependent(self, votes: ArrayLike, orders: ArrayLike) -> NDArray[np.float64]:
        """Data-dependent RDP per query, ``[queries, orders]``."""
        return lnmax_rdp_dependent(votes, self.scale, orders)


@dataclass(frozen=True)
class GaussianArgmax:
    """Answering: argmax_j (n_j + N(0, sigma^2)) (PATE 2018, §4.1, Thm. 6, Prop. 8 and 10)."""

    sigma: float
    smooth_sensitivity: ClassVar[bool] = True

    def rdp_independent(self, orders: ArrayLike) -> NDArray[np.float64]:
        """Data-independent RDP of one answer, ``[orders]``."""
        return gnmax_rdp_independent(self.sigma, orders)

    def rdp_dependent(self, votes: ArrayLike, orders: ArrayLike) -> NDArray[np.float64]:
        """Data-dependent RDP per query, ``[queries, orders]``."""
        return gnmax_rdp_dependent(gnmax_logq(votes, self.sigma), self.sigma, orders)

    def always_independent(self, num_teachers: int, num_classes: int, order: float) -> bool:
        """Whether even unanimous votes cost the data-independent bound at ``order``."""
        unanimous = np.zeros((1, num_classes), np.int64)
        unanimous[0, 0] = num_teachers
        a = np.array([order])
        return _always_independent(self.rdp_dependent(unanimous, a), self.rdp_independent(a))

    def conditions(self, num_classes: int, order: float) -> tuple[bool, bool]:
        """Conditions C5 and C6 of the smooth-sensitivity release (PATE 2018, App. C)."""
        return check_conditions(self.sigma, num_classes, order)

    def local_sensitivity_total(self, votes: ArrayLike, order: float,
                                weights: NDArray[np.float64]) -> NDArray[np.float64]:
        """LS of the ``weights``-weighted total RDP at distance d (PATE 2018, App. C)."""
        return gnmax_local_sensitivity_total(votes, self.sigma, order, weights=weights)


AnswerStep = LaplaceArgmax | GaussianArgmax


@dataclass(frozen=True)
class Steps:
    """A mechanism as PATE 2018's steps: an optional selection, the answering step on the
    queries it passes, and for Interactive-GNMax the student's confidence threshold gamma (the
    selection then subtracts the student's baseline; a query it rejects gets the student's own
    label above gamma, which reads no private data and costs nothing)."""

    select: ThresholdStep | None
    answer: AnswerStep
    student_gamma: float | None = None


def steps(mechanism: Mechanism) -> Steps:
    """The step decomposition of a mechanism: the one place that decides which formulas apply."""
    match mechanism:
        case LNMax(scale=b):
            return Steps(None, LaplaceArgmax(b))
        case GNMax(sigma=sigma):
            return Steps(None, GaussianArgmax(sigma))
        case ConfidentGNMax(threshold=t, sigma1=sigma1, sigma2=sigma2):
            return Steps(ThresholdStep(t, sigma1), GaussianArgmax(sigma2))
        case InteractiveGNMax(threshold=t, sigma1=sigma1, sigma2=sigma2, gamma=gamma):
            return Steps(ThresholdStep(t, sigma1), GaussianArgmax(sigma2), gamma)
    raise TypeError(f"not a mechanism: {mechanism!r}")


def realised_rdp_independent(mechanism: Mechanism, asked: int, answered: int,
                             orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """Data-independent RDP of ``asked`` queries of which ``answered`` got the teachers' label:
    the selection step on every query and the answering step on each answer it ran on, composed
    by addition (Mironov 2017, Proposition 1). It reads only public counts, as the ledger
    charges. An Interactive-GNMax answer of the student's own label ran no answering step
    (PATE 2018, Algorithm 2) and is not counted in ``answered``."""
    plan = steps(mechanism)
    select = (np.zeros_like(orders) if plan.select is None
              else plan.select.rdp_independent(orders))
    return asked * select + answered * plan.answer.rdp_independent(orders)


def worst_case_queries(mechanism: Mechanism, epsilon: float, delta: float,
                       orders: NDArray[np.float64], limit: int = 10**9,
                       conversion: Conversion = "improved",
                       spent: NDArray[np.float64] | None = None) -> int:
    """The most queries, every one answered, that a budget ``epsilon`` at ``delta`` covers
    beyond the data-independent RDP ``spent`` already (none by default): the largest k (at most
    ``limit``) whose ``spent + realised_rdp_independent(mechanism, k, k)`` converts
    (``analysis.rdp.epsilon_from_rdp``, with ``conversion``) to at most ``epsilon``. The
    converted epsilon grows with k, so k is found by bisection."""
    base = np.zeros_like(orders) if spent is None else np.asarray(spent, np.float64)

    def fits(k: int) -> bool:
        rdp = base + realised_rdp_independent(mechanism, k, k, orders)
        return epsilon_from_rdp(rdp, orders, delta, conversion, warn_at_edge=False)[0] <= epsilon

    low, high = 0, 1
    while high <= limit and fits(high):
        low, high = high, 2 * high
    high = min(high, limit + 1)
    while high - low > 1:  # fits(low), not fits(high)
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def check_threshold(mechanism: Mechanism, num_teachers: int) -> None:
    """Refuse a threshold above N, N the number of teachers (a stated policy, not a formula):
    the threshold step compares T with a count of at most N (Interactive-GNMax: with
    max_j (n_j - N p_j)), so above N a query passes only by noise, almost surely a mistake
    (below 0, where every query would pass, the mechanism refuses as it is built). Raises
    ``ParameterError``."""
    plan = steps(mechanism)
    if plan.select is None:
        return
    if plan.select.threshold > num_teachers:
        raise ParameterError("threshold", f"{plan.select.threshold:g} exceeds the number of "
                             f"teachers ({num_teachers}): a query would pass only by noise")


@dataclass(frozen=True)
class ExpectedCosts:
    """Per-query RDP ``[queries, orders]`` of each step and the probability the answering step
    runs. Without a selection step ``select_*`` is zero and the probability one."""

    orders: NDArray[np.float64]
    pr_answered: NDArray[np.float64]
    select_dependent: NDArray[np.float64]
    select_independent: NDArray[np.float64]
    answer_dependent: NDArray[np.float64]
    answer_independent: NDArray[np.float64]

    def expected(self, dependent: bool) -> NDArray[np.float64]:
        """r_query = r_select + p r_answer, per query (the expectation over the step's outcome;
        docs/privacy-math.md §3)."""
        select = self.select_dependent if dependent else self.select_independent
        answer = self.answer_dependent if dependent else self.answer_independent
        return select + self.pr_answered[:, None] * answer


def expected_costs(votes: NDArray[np.int64], mechanism: Mechanism, orders: NDArray[np.float64],
                   baseline: NDArray[np.float64] | None = None) -> ExpectedCosts:
    """Data-dependent and data-independent RDP of every query, vectorised over queries, as PATE
    2018's Table-2 analysis charges them: the selection on every query, the answer weighted by
    the probability it runs."""
    plan = steps(mechanism)
    n_queries = votes.shape[0]
    zeros = np.zeros((n_queries, orders.size))
    answer_dep = plan.answer.rdp_dependent(votes, orders)
    answer_ind = np.broadcast_to(plan.answer.rdp_independent(orders), zeros.shape)
    if plan.select is None:
        return ExpectedCosts(orders, np.ones(n_queries), zeros, zeros, answer_dep, answer_ind)
    logp = plan.select.logpr_answered(plan.select.inputs(votes, baseline))
    return ExpectedCosts(
        orders, np.exp(logp), plan.select.rdp_dependent(logp, orders),
        np.broadcast_to(plan.select.rdp_independent(orders), zeros.shape),
        answer_dep, answer_ind)
