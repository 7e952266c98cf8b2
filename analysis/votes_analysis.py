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


def _sanitise(votes: NDArray[np.int64], params: AggregatorParams, costs: QueryCosts,
              order_index: int, num_teachers: int, baseline: NDArray[np.float64] | None,
              beta: float | None) -> dict[str, Any]:
    """Smooth-sensitivity release of the data-dependent total at one order (PATE 2018, App. C).
    A step whose data-dependent cost always equals its data-independent one is charged the
    latter and contributes no sensitivity, as in the published analysis."""
    order = float(costs.orders[order_index])
    a = np.array([order])
    num_classes = votes.shape[1]
    sigma = params.gnmax_sigma
    unanimous = np.zeros((1, num_classes), np.int64)
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
            threshold_inputs(votes, baseline), num_teachers, params.threshold, params.sigma1,
            order)
    conditions = {"c5": True, "c6": True}
    if not answer_fixed:
        c5, c6 = check_conditions(sigma, num_classes, order)
        conditions = {"c5": c5, "c6": c6}
        ls_total += gnmax_local_sensitivity_total(votes, sigma, order, weights=p)
    release = optimise_release(ls_total, rdp_total, order,
                               None if beta is None else np.array([beta]))
    finite_sigma = math.isfinite(release.sigma)
    return {"order": order, "beta": release.beta, "value": release.value,
            "sigma": release.sigma if finite_sigma else None,
            "rdp_cost": release.rdp_cost, "rdp": rdp_total,
            "conditions": conditions}


def analyze_votes(votes: NDArray[np.int64], params: AggregatorParams, delta: float, *,
                  baseline: NDArray[np.float64] | None = None, order: float | None = None,
                  beta: float | None = None, conversion: Conversion = "improved"
                  ) -> dict[str, Any]:
    """The full analysis of ``pate analyze`` (DESIGN.md contract): data-independent,
    data-dependent and smooth-sensitivity-sanitised epsilon of answering every row of ``votes``.

    Without ``order`` the best order of the default grid is taken (each bound at its own
    optimum; the sanitised one at the data-dependent optimum, as published). Where conditions C5/C6
    fail the sanitised epsilon falls back to the data-independent one at that order."""
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    orders = as_orders(order)
    votes = np.asarray(votes, np.int64)
    num_teachers = int(votes[0].sum())
    costs = query_costs(votes, params, orders, baseline)
    total_ind = costs.expected(dependent=False).sum(axis=0)
    total_dep = costs.expected(dependent=True).sum(axis=0)
    eps_ind, order_ind = epsilon_from_rdp(total_ind, orders, delta, conversion)
    eps_dep, order_dep = epsilon_from_rdp(total_dep, orders, delta, conversion)
    idx = int(np.flatnonzero(orders == order_dep)[0])

    result: dict[str, Any] = {
        "mechanism": params.mechanism, "queries": int(votes.shape[0]),
        "teachers": num_teachers, "classes": int(votes.shape[1]), "delta": delta,
        "conversion": conversion, "expected_answered": float(costs.pr_answered.sum()),
        "data_independent": {"epsilon": eps_ind, "order": order_ind},
        "data_dependent": {"epsilon": eps_dep, "order": order_dep,
                           "rdp": float(total_dep[idx])},
        "smooth_sensitivity": None,
    }
    if params.mechanism == "lnmax":
        return result  # the published smooth-sensitivity analysis covers the GNMax family only
    if beta is not None and not 0.0 <= beta < 1.0 / (2.0 * order_dep):
        raise ValueError(f"--beta must be in [0, 1/(2*order)) = [0, {1 / (2 * order_dep):g})")
    release = _sanitise(votes, params, costs, idx, num_teachers, baseline, beta)
    if release["conditions"]["c5"] and release["conditions"]["c6"]:
        release["epsilon"] = float(epsilon_curve(release["rdp"] + release["rdp_cost"],
                                                 order_dep, delta, conversion))
    else:  # the smooth-sensitivity proof does not apply: release only the safe bound
        release["epsilon"] = float(epsilon_curve(total_ind[idx], order_dep, delta, conversion))
        release["fallback"] = "data-independent"
    del release["rdp"]
    result["smooth_sensitivity"] = release
    return result
