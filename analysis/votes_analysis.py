"""Privacy analysis of a votes matrix, as PATE 2018's Table 2 analysis does it
(docs/privacy-math.md §3 and §5): every row is a query; the threshold step is paid on every query
and the answering step weighted by the probability of answering; the data-dependent total is
sanitised with smooth sensitivity at its optimal order, composed with the smooth-sensitivity
releases made before from the same votes (``EarlierRelease``), and ``sanitised_release`` adds
the release's noise. The costs come from ``analysis.costs``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.costs import (
    ExpectedCosts,
    GaussianArgmax,
    check_threshold,
    expected_costs,
    realised_rdp_independent,
    steps,
)
from analysis.mechanisms import Mechanism, ParameterError
from analysis.orders import MAX_FIXED_ORDER, as_orders
from analysis.rdp import Conversion, epsilon_curve, epsilon_from_rdp
from analysis.smooth_sensitivity import gnss_rdp, optimise_release

RELEASE_MARGIN = 2.0  # standard deviations of the release's noise added to the published figure


@dataclass(frozen=True)
class QuerySegment:
    """Queries answered by one aggregator: their votes and, for Interactive-GNMax, the baseline
    num_teachers * student_probs the threshold step sees subtracted."""

    votes: NDArray[np.int64] = field(repr=False)  # private
    mechanism: Mechanism
    baseline: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class EpsilonBound:
    """An epsilon at the analysis's delta, the Rényi order it was converted at and, for the
    data-dependent bound, the RDP total at that order (private)."""

    epsilon: float
    order: float
    rdp: float | None = None

    def to_json(self) -> dict[str, Any]:
        return ({"epsilon": self.epsilon, "order": self.order} if self.rdp is None
                else {"epsilon": self.epsilon, "order": self.order, "rdp": self.rdp})


@dataclass(frozen=True)
class EarlierRelease:
    """A smooth-sensitivity release made before from the same votes: its beta and sigma_ss (in
    units of SS_beta). Its RDP at an order a is Theorem 23's (PATE 2018), infinite unless
    1 < a < 1/(2 beta); releases compose with the answers by addition (Mironov 2017, Prop. 1)."""

    beta: float
    sigma: float


def earlier_releases_rdp(earlier: list[EarlierRelease],
                         orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """The RDP curve over ``orders`` of the releases ``earlier``, composed (infinite at an order
    outside a release's range)."""
    total = np.zeros_like(orders)
    for r in earlier:
        total += np.array([gnss_rdp(r.beta, r.sigma, a) if 1.0 < a < 1.0 / (2.0 * r.beta)
                           else np.inf for a in orders.tolist()])
    return total


@dataclass(frozen=True)
class SmoothSensitivityBound:
    """The smooth-sensitivity-sanitised epsilon before noise (PATE 2018, App. C): the release's
    order, beta, SS_beta (``value``), noise sigma in units of SS_beta (None: no noise needed),
    its RDP cost, conditions C5/C6, whether it fell back to the data-independent bound (they
    failed), the epsilon of the total (data-dependent RDP, the earlier releases' and this
    one's cost), and that total's RDP (``rdp``, private). A fallback reads no vote: its order is
    that of the data-independent bound, and beta, SS_beta, sigma and the RDP cost, which would
    describe a release that did not happen, are None. Every figure here is a function of the
    votes: what may be published is ``sanitised_release``'s."""

    order: float
    beta: float | None
    value: float | None
    sigma: float | None
    rdp_cost: float | None
    c5: bool
    c6: bool
    epsilon: float
    fallback: bool
    rdp: float | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "order": self.order, "beta": self.beta, "value": self.value, "sigma": self.sigma,
            "rdp_cost": self.rdp_cost, "conditions": {"c5": self.c5, "c6": self.c6},
            "epsilon": self.epsilon}
        if self.fallback:
            out["fallback"] = "data-independent"
        return out


@dataclass(frozen=True)
class PrivacyAnalysis:
    """The Table-2 analysis of some queries (docs/design.md, "pate analyze"): the mechanisms'
    names joined by "+", the counts, the data-independent, data-dependent (private) and
    smooth-sensitivity-sanitised bounds (None for LNMax)."""

    mechanism: str
    queries: int
    teachers: int
    classes: int
    delta: float
    conversion: Conversion
    expected_answered: float
    data_independent: EpsilonBound
    data_dependent: EpsilonBound
    smooth_sensitivity: SmoothSensitivityBound | None

    def to_json(self) -> dict[str, Any]:
        """The JSON object of ``pate analyze --json``."""
        return {
            "mechanism": self.mechanism, "queries": self.queries, "teachers": self.teachers,
            "classes": self.classes, "delta": self.delta, "conversion": self.conversion,
            "expected_answered": self.expected_answered,
            "data_independent": self.data_independent.to_json(),
            "data_dependent": self.data_dependent.to_json(),
            "smooth_sensitivity": (None if self.smooth_sensitivity is None
                                   else self.smooth_sensitivity.to_json())}


def _segment_sensitivity(segment: QuerySegment, costs: ExpectedCosts, order_index: int,
                         num_teachers: int) -> tuple[float, NDArray[np.float64], tuple[bool, bool]]:
    """(RDP total at the order, LS_total[d], conditions C5/C6) of one segment for the
    smooth-sensitivity release (PATE 2018, App. C). A step whose data-dependent cost always equals
    its data-independent one is charged the latter and contributes no sensitivity, as in the
    published analysis."""
    plan, votes = steps(segment.mechanism), segment.votes
    answer = plan.answer
    assert isinstance(answer, GaussianArgmax)
    order = float(costs.orders[order_index])
    answer_fixed = answer.always_independent(num_teachers, votes.shape[1], order)
    select_fixed = plan.select is None or plan.select.always_independent(num_teachers, order)

    p = costs.pr_answered
    select = costs.select_independent if select_fixed else costs.select_dependent
    answer_rdp = costs.answer_independent if answer_fixed else costs.answer_dependent
    rdp_total = float(select[:, order_index].sum() + p @ answer_rdp[:, order_index])

    ls_total = np.zeros(num_teachers)
    if plan.select is not None and not select_fixed:
        ls_total += plan.select.local_sensitivity_total(
            plan.select.inputs(votes, segment.baseline), num_teachers, order)
    conditions = (True, True)
    if not answer_fixed:
        conditions = answer.conditions(votes.shape[1], order)
        if all(conditions):  # else the analysis falls back, and reads no sensitivity
            ls_total += answer.local_sensitivity_total(votes, order, p)
    return rdp_total, ls_total, conditions


def analyze_segments(segments: list[QuerySegment], delta: float, *, order: float | None = None,
                     beta: float | None = None, conversion: Conversion = "improved",
                     earlier: list[EarlierRelease] | None = None) -> PrivacyAnalysis:
    """The Table-2 analysis of queries answered by one or more aggregators in turn (RDP curves
    compose by addition; local sensitivities of the total add distance by distance): data-
    independent, data-dependent and smooth-sensitivity-sanitised epsilon (docs/design.md).

    Without ``order`` the best order of the default grid is taken (each bound at its own optimum;
    the sanitised one at the data-dependent optimum, as published, or with ``earlier`` releases
    at the optimum of the data-dependent total and their cost). Where conditions C5/C6 fail,
    the sanitised epsilon falls back to the data-independent one of every query answered (and
    the earlier releases). An answering step without a smooth-sensitivity analysis (LNMax: PATE
    2017 leaves it open) gives ``None``."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not segments:
        raise ValueError("no queries to analyse")
    if order is not None and not order <= MAX_FIXED_ORDER:
        raise ValueError(f"a fixed order must be at most {MAX_FIXED_ORDER:g}, got {order}")
    orders = as_orders(order)
    votes = [np.asarray(s.votes, np.int64) for s in segments]
    num_teachers, num_classes = int(votes[0][0].sum()), votes[0].shape[1]
    if any(v.shape[1] != num_classes or np.any(v.sum(axis=1) != num_teachers) for v in votes):
        raise ValueError("every segment must have the same teachers and classes")
    for segment in segments:
        check_threshold(segment.mechanism, num_teachers)
    costs = [expected_costs(v, s.mechanism, orders, s.baseline)
             for v, s in zip(votes, segments, strict=True)]
    total_ind = sum(c.expected(dependent=False).sum(axis=0) for c in costs)
    total_dep = sum(c.expected(dependent=True).sum(axis=0) for c in costs)
    # every figure below is a function of the votes (even the expected data-independent one,
    # through each query's chance of an answer): no warning may depend on where its optimum is
    eps_ind, order_ind = epsilon_from_rdp(total_ind, orders, delta, conversion,
                                          warn_at_edge=False)
    eps_dep, order_dep = epsilon_from_rdp(total_dep, orders, delta, conversion,
                                          warn_at_edge=False)
    idx = int(np.flatnonzero(orders == order_dep)[0])

    def result(smooth: SmoothSensitivityBound | None) -> PrivacyAnalysis:
        return PrivacyAnalysis(
            mechanism="+".join(dict.fromkeys(s.mechanism.name for s in segments)),
            queries=int(sum(v.shape[0] for v in votes)), teachers=num_teachers,
            classes=num_classes, delta=delta, conversion=conversion,
            expected_answered=float(sum(c.pr_answered.sum() for c in costs)),
            data_independent=EpsilonBound(eps_ind, order_ind),
            data_dependent=EpsilonBound(eps_dep, order_dep, float(total_dep[idx])),
            smooth_sensitivity=smooth)

    if not all(steps(s.mechanism).answer.smooth_sensitivity for s in segments):
        return result(None)
    prior = earlier_releases_rdp(earlier or [], orders)
    order_rel = order_dep if not earlier else epsilon_from_rdp(
        total_dep + prior, orders, delta, conversion, warn_at_edge=False)[1]
    at = int(np.flatnonzero(orders == order_rel)[0])
    if beta is not None and not 0.0 <= beta < 1.0 / (2.0 * order_rel):
        raise ParameterError("beta", f"must be in [0, 1/(2*order)) = [0, {1 / (2 * order_rel):g})")
    parts = [_segment_sensitivity(QuerySegment(v, s.mechanism, s.baseline), c, at, num_teachers)
             for v, s, c in zip(votes, segments, costs, strict=True)]
    rdp_total = sum(p[0] for p in parts) + float(prior[at])
    c5, c6 = (all(p[2][k] for p in parts) for k in (0, 1))
    if not (c5 and c6):  # the proof does not apply: a bound that reads no vote, all answered
        worst = sum(realised_rdp_independent(s.mechanism, len(v), len(v), orders)
                    for v, s in zip(votes, segments, strict=True))
        epsilon, worst_order = epsilon_from_rdp(worst + prior, orders, delta, conversion,
                                                warn_at_edge=False)
        return result(SmoothSensitivityBound(
            order=worst_order, beta=None, value=None, sigma=None, rdp_cost=None, c5=c5, c6=c6,
            epsilon=epsilon, fallback=True))
    release = optimise_release(sum(p[1] for p in parts), rdp_total, order_rel,
                               None if beta is None else np.array([beta]))
    rdp = rdp_total + release.rdp_cost
    return result(SmoothSensitivityBound(
        order=order_rel, beta=release.beta, value=release.value,
        sigma=release.sigma if math.isfinite(release.sigma) else None,
        rdp_cost=release.rdp_cost, c5=c5, c6=c6,
        epsilon=float(epsilon_curve(rdp, order_rel, delta, conversion)), fallback=False,
        rdp=rdp))


def sanitised_release(bound: SmoothSensitivityBound, z: float, delta: float,
                      conversion: Conversion = "improved") -> float:
    """The epsilon that may be published (PATE 2018, App. C, Theorem 23, the GNSS mechanism):
    the total's RDP plus N(0, (sigma_ss SS_beta)^2) noise (``z`` a standard normal draw, from
    the operating system's entropy), plus ``RELEASE_MARGIN`` standard deviations so that the
    figure bounds the exact one with probability Phi(2) = 0.977 (the published search of beta
    and sigma_ss minimises this figure's expectation), converted at ``delta``. A total of
    smooth sensitivity 0 reads nothing it would need noise for: its epsilon (a fallback, whose
    sigma is None, is never released: ``student.sanitised``, docs/privacy-math.md §5)."""
    if bound.sigma is None or not bound.value or bound.rdp is None:
        return bound.epsilon
    noisy = bound.rdp + bound.value * bound.sigma * (z + RELEASE_MARGIN)
    return float(epsilon_curve(max(noisy, 0.0), bound.order, delta, conversion))


def analyze_votes(votes: NDArray[np.int64], mechanism: Mechanism, delta: float, *,
                  baseline: NDArray[np.float64] | None = None, order: float | None = None,
                  beta: float | None = None, conversion: Conversion = "improved"
                  ) -> PrivacyAnalysis:
    """``pate analyze``: the analysis of every row of ``votes`` answered by one aggregator."""
    return analyze_segments([QuerySegment(votes, mechanism, baseline)], delta, order=order,
                            beta=beta, conversion=conversion)
