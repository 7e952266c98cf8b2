"""Privacy spent as queries accumulate: epsilon after every query prefix (PATE 2018, Figures 1
and 4) and how the total splits between selecting and answering queries (Figure 5)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from analysis.costs import expected_costs
from analysis.mechanisms import Mechanism
from analysis.orders import as_orders
from analysis.rdp import Conversion, epsilon_curve


@dataclass(frozen=True)
class CumulativeCost:
    """After each query i (prefix 0..i): expected answered, data-dependent and data-independent
    epsilon at ``delta`` (each minimised over the orders), and at the final data-dependent optimal
    order the shares of the selection step, the answering step and delta's term."""

    answered: NDArray[np.float64]
    epsilon_dependent: NDArray[np.float64]
    epsilon_independent: NDArray[np.float64]
    order: float
    split_selection: float
    split_answering: float
    split_delta: float


def _best_over_orders(rdp_prefixes: NDArray[np.float64], orders: NDArray[np.float64],
                      delta: float, conversion: Conversion) -> tuple[NDArray[np.float64],
                                                                       NDArray[np.int64]]:
    eps = epsilon_curve(rdp_prefixes, orders[None, :], delta, conversion)
    best = np.nanargmin(eps, axis=1)
    return eps[np.arange(eps.shape[0]), best], best


def cumulative_cost(votes: NDArray[np.int64], mechanism: Mechanism, delta: float,
                    baseline: NDArray[np.float64] | None = None,
                    conversion: Conversion = "improved") -> CumulativeCost:
    """Epsilon after every prefix of the queries, vectorised: cumulative sums of the per-query
    RDP curves, converted and minimised over the default grid of orders at each prefix."""
    orders = as_orders(None)
    costs = expected_costs(np.asarray(votes, np.int64), mechanism, orders, baseline)
    dependent = np.cumsum(costs.expected(dependent=True), axis=0)
    independent = np.cumsum(costs.expected(dependent=False), axis=0)
    eps_dep, best = _best_over_orders(dependent, orders, delta, conversion)
    eps_ind, _ = _best_over_orders(independent, orders, delta, conversion)
    k = int(best[-1])
    selection = float(costs.select_dependent[:, k].sum())
    answering = float(dependent[-1, k]) - selection
    delta_term = float(eps_dep[-1]) - selection - answering
    total = selection + answering + delta_term
    return CumulativeCost(np.cumsum(costs.pr_answered), eps_dep, eps_ind, float(orders[k]),
                          selection / total, answering / total, delta_term / total)
