"""Privacy analysis of a votes matrix, as PATE 2018's Table 2 analysis does it (privacy-math.md
§3 and §5): every row is a query; the threshold step is paid on every query and the GNMax step
weighted by the probability of answering; the data-dependent total is sanitised with smooth
sensitivity at its optimal order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from numpy.typing import NDArray

from analysis.gaussian import gnmax_logq, gnmax_rdp_dependent, gnmax_rdp_independent
from analysis.lnmax import lnmax_rdp_dependent, lnmax_rdp_independent
from analysis.orders import as_orders
from analysis.rdp import Conversion, epsilon_curve, epsilon_from_rdp
from analysis.smooth_sensitivity import (
    check_conditions,
    gnmax_local_sensitivity_total,
    optimise_release,
    threshold_local_sensitivity_total,
)
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)

Mechanism = Literal["lnmax", "gnmax", "confident", "interactive"]
MECHANISMS: tuple[Mechanism, ...] = ("lnmax", "gnmax", "confident", "interactive")


@dataclass(frozen=True)
class AggregatorParams:
    """Noise parameters of one aggregator (PATE 2017 LNMax; PATE 2018 Algorithms 1 and 2)."""

    mechanism: Mechanism
    scale: float | None = None       # LNMax: Laplace scale b
    sigma: float | None = None       # GNMax: sigma
    threshold: float | None = None   # Confident/Interactive: T
    sigma1: float | None = None      # threshold noise
    sigma2: float | None = None      # GNMax noise of the answering step

    def __post_init__(self) -> None:
        required = {"lnmax": ("scale",), "gnmax": ("sigma",),
                    "confident": ("threshold", "sigma1", "sigma2"),
                    "interactive": ("threshold", "sigma1", "sigma2")}
        if self.mechanism not in required:
            raise ValueError(f"mechanism must be one of {MECHANISMS}, got {self.mechanism!r}")
        for name in required[self.mechanism]:
            value = getattr(self, name)
            if value is None:
                raise ValueError(f"{self.mechanism} needs --{name}")
            if name != "threshold" and not value > 0:
                raise ValueError(f"--{name} must be > 0, got {value}")
            if not math.isfinite(value):
                raise ValueError(f"--{name} must be finite, got {value}")

    @property
    def gnmax_sigma(self) -> float:
        """The sigma of the GNMax (answering) step."""
        value = self.sigma if self.mechanism == "gnmax" else self.sigma2
        assert value is not None
        return value

    @property
    def thresholded(self) -> bool:
        return self.mechanism in ("confident", "interactive")


@dataclass(frozen=True)
class QueryCosts:
    """Per-query RDP ``[queries, orders]`` of each step and the probability the answer step runs.
    For a thresholded mechanism ``select_*`` is the threshold step; otherwise it is zero."""

    orders: NDArray[np.float64]
    pr_answered: NDArray[np.float64]
    select_dependent: NDArray[np.float64]
    select_independent: NDArray[np.float64]
    answer_dependent: NDArray[np.float64]
    answer_independent: NDArray[np.float64]

    def expected(self, dependent: bool) -> NDArray[np.float64]:
        """r_query = r_select + p r_answer, per query (the expectation over the step's outcome)."""
        select = self.select_dependent if dependent else self.select_independent
        answer = self.answer_dependent if dependent else self.answer_independent
        return select + self.pr_answered[:, None] * answer


def query_costs(votes: NDArray[np.int64], params: AggregatorParams, orders: NDArray[np.float64],
                baseline: NDArray[np.float64] | None = None) -> QueryCosts:
    """Data-dependent and data-independent RDP of every query, vectorised over queries."""
    n_queries = votes.shape[0]
    zeros = np.zeros((n_queries, orders.size))
    if params.mechanism == "lnmax":
        assert params.scale is not None
        answer_dep = lnmax_rdp_dependent(votes, params.scale, orders)
        answer_ind = np.broadcast_to(lnmax_rdp_independent(params.scale, orders), zeros.shape)
    else:
        sigma = params.gnmax_sigma
        answer_dep = gnmax_rdp_dependent(gnmax_logq(votes, sigma), sigma, orders)
        answer_ind = np.broadcast_to(gnmax_rdp_independent(sigma, orders), zeros.shape)
    if not params.thresholded:
        return QueryCosts(orders, np.ones(n_queries), zeros, zeros, answer_dep, answer_ind)
    assert params.threshold is not None and params.sigma1 is not None
    logp = threshold_logpr_answered(params.threshold, params.sigma1,
                                    threshold_inputs(votes, baseline))
    return QueryCosts(
        orders, np.exp(logp),
        threshold_rdp_dependent(logp, params.sigma1, orders),
        np.broadcast_to(threshold_rdp_independent(params.sigma1, orders), zeros.shape),
        answer_dep, answer_ind)


def _always_independent(costs_at_extremes: NDArray[np.float64],
                        independent: NDArray[np.float64]) -> bool:
    """Data-dependent analysis can never beat the data-independent one when even the most
    favourable votes give the same cost (then the step needs no smooth sensitivity)."""
    return bool(np.all(np.isclose(costs_at_extremes, independent)))


@dataclass(frozen=True)
class QuerySegment:
    """Queries answered by one aggregator: their votes and, for Interactive-GNMax, the baseline
    num_teachers * student_probs the threshold step sees subtracted."""

    votes: NDArray[np.int64]
    params: AggregatorParams
    baseline: NDArray[np.float64] | None = None


def _segment_sensitivity(segment: QuerySegment, costs: QueryCosts, order_index: int,
                         num_teachers: int) -> tuple[float, NDArray[np.float64], dict[str, bool]]:
    """(RDP total at the order, LS_total[d], conditions C5/C6) of one segment for the
    smooth-sensitivity release (PATE 2018, App. C). A step whose data-dependent cost always equals
    its data-independent one is charged the latter and contributes no sensitivity, as in the
    published analysis."""
    params, votes = segment.params, segment.votes
    order = float(costs.orders[order_index])
    a = np.array([order])
    sigma = params.gnmax_sigma
    unanimous = np.zeros((1, votes.shape[1]), np.int64)
    unanimous[0, 0] = num_teachers
    answer_fixed = _always_independent(
        gnmax_rdp_dependent(gnmax_logq(unanimous, sigma), sigma, a),
        gnmax_rdp_independent(sigma, a))
    select_fixed = True
    if params.thresholded:
        assert params.threshold is not None and params.sigma1 is not None
        extremes = threshold_logpr_answered(params.threshold, params.sigma1,
                                            np.array([0.0, float(num_teachers)]))
        select_fixed = _always_independent(
            threshold_rdp_dependent(extremes, params.sigma1, a),
            threshold_rdp_independent(params.sigma1, a))

    p = costs.pr_answered
    select = costs.select_independent if select_fixed else costs.select_dependent
    answer = costs.answer_independent if answer_fixed else costs.answer_dependent
    rdp_total = float(select[:, order_index].sum() + p @ answer[:, order_index])

    ls_total = np.zeros(num_teachers)
    if not select_fixed:
        assert params.threshold is not None and params.sigma1 is not None
        ls_total += threshold_local_sensitivity_total(
            threshold_inputs(votes, segment.baseline), num_teachers, params.threshold,
            params.sigma1, order)
    conditions = {"c5": True, "c6": True}
    if not answer_fixed:
        c5, c6 = check_conditions(sigma, votes.shape[1], order)
        conditions = {"c5": c5, "c6": c6}
        ls_total += gnmax_local_sensitivity_total(votes, sigma, order, weights=p)
    return rdp_total, ls_total, conditions


def analyze_segments(segments: list[QuerySegment], delta: float, *, order: float | None = None,
                     beta: float | None = None, conversion: Conversion = "improved"
                     ) -> dict[str, Any]:
    """The Table-2 analysis of queries answered by one or more aggregators in turn (RDP curves
    compose by addition; local sensitivities of the total add distance by distance): data-
    independent, data-dependent and smooth-sensitivity-sanitised epsilon (DESIGN.md contract).

    Without ``order`` the best order of the default grid is taken (each bound at its own optimum;
    the sanitised one at the data-dependent optimum, as published). Where conditions C5/C6 fail,
    the sanitised epsilon falls back to the data-independent one at that order. LNMax has no
    smooth-sensitivity analysis (PATE 2017 leaves it open), so a segment of it gives ``None``."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not segments:
        raise ValueError("no queries to analyse")
    orders = as_orders(order)
    votes = [np.asarray(s.votes, np.int64) for s in segments]
    num_teachers, num_classes = int(votes[0][0].sum()), votes[0].shape[1]
    if any(v.shape[1] != num_classes or np.any(v.sum(axis=1) != num_teachers) for v in votes):
        raise ValueError("every segment must have the same teachers and classes")
    costs = [query_costs(v, s.params, orders, s.baseline)
             for v, s in zip(votes, segments, strict=True)]
    total_ind = sum(c.expected(dependent=False).sum(axis=0) for c in costs)
    total_dep = sum(c.expected(dependent=True).sum(axis=0) for c in costs)
    eps_ind, order_ind = epsilon_from_rdp(total_ind, orders, delta, conversion)
    eps_dep, order_dep = epsilon_from_rdp(total_dep, orders, delta, conversion)
    idx = int(np.flatnonzero(orders == order_dep)[0])

    mechanisms = list(dict.fromkeys(s.params.mechanism for s in segments))
    result: dict[str, Any] = {
        "mechanism": "+".join(mechanisms), "queries": int(sum(v.shape[0] for v in votes)),
        "teachers": num_teachers, "classes": num_classes, "delta": delta,
        "conversion": conversion,
        "expected_answered": float(sum(c.pr_answered.sum() for c in costs)),
        "data_independent": {"epsilon": eps_ind, "order": order_ind},
        "data_dependent": {"epsilon": eps_dep, "order": order_dep,
                           "rdp": float(total_dep[idx])},
        "smooth_sensitivity": None,
    }
    if "lnmax" in mechanisms:
        return result
    if beta is not None and not 0.0 <= beta < 1.0 / (2.0 * order_dep):
        raise ValueError(f"--beta must be in [0, 1/(2*order)) = [0, {1 / (2 * order_dep):g})")
    parts = [_segment_sensitivity(QuerySegment(v, s.params, s.baseline), c, idx, num_teachers)
             for v, s, c in zip(votes, segments, costs, strict=True)]
    rdp_total = sum(p[0] for p in parts)
    conditions = {key: all(p[2][key] for p in parts) for key in ("c5", "c6")}
    release = optimise_release(sum(p[1] for p in parts), rdp_total, order_dep,
                               None if beta is None else np.array([beta]))
    out: dict[str, Any] = {
        "order": order_dep, "beta": release.beta, "value": release.value,
        "sigma": release.sigma if math.isfinite(release.sigma) else None,
        "rdp_cost": release.rdp_cost, "conditions": conditions}
    if conditions["c5"] and conditions["c6"]:
        out["epsilon"] = float(epsilon_curve(rdp_total + release.rdp_cost, order_dep, delta,
                                             conversion))
    else:  # the smooth-sensitivity proof does not apply: release only the safe bound
        out["epsilon"] = float(epsilon_curve(total_ind[idx], order_dep, delta, conversion))
        out["fallback"] = "data-independent"
    result["smooth_sensitivity"] = out
    return result


def analyze_votes(votes: NDArray[np.int64], params: AggregatorParams, delta: float, *,
                  baseline: NDArray[np.float64] | None = None, order: float | None = None,
                  beta: float | None = None, conversion: Conversion = "improved"
                  ) -> dict[str, Any]:
    """``pate analyze``: the analysis of every row of ``votes`` answered by one aggregator."""
    return analyze_segments([QuerySegment(votes, params, baseline)], delta, order=order,
                            beta=beta, conversion=conversion)
