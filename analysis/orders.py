"""The grid of Rényi orders every analysis minimises over (docs/privacy-math.md §1)."""

from __future__ import annotations

import warnings

import numpy as np
from numpy.typing import NDArray

# the largest order an analysis is asked to fix: past it the conversion's log(1/delta)/(alpha-1)
# term is gone, so no bound gains, and the bounds' terms overflow (1e308 gives infinity)
MAX_FIXED_ORDER = 1e6


def default_orders() -> NDArray[np.float64]:
    """Fractional orders 1.1..10.9, every half order 2..100, the published analysis' log-spaced
    tail 100..500 (the PATE 2018 code's ``np.arange(2, 100.5, .5)`` and
    ``np.logspace(2, log10 500, 100)``, so our minimum is never above theirs), then a log-spaced
    tail up to 5000 for many teachers."""
    grid = np.concatenate([
        np.arange(11, 110) / 10.0,
        np.arange(2.0, 100.5, 0.5),
        np.logspace(np.log10(100.0), np.log10(500.0), num=100),
        np.geomspace(500.0, 5000.0, num=41)[1:],
    ])
    return np.unique(grid)


def as_orders(orders: float | NDArray[np.float64] | None) -> NDArray[np.float64]:
    """The default grid for None, else a 1-d float array; every order must exceed 1."""
    out = default_orders() if orders is None else np.atleast_1d(np.asarray(orders, np.float64))
    if out.ndim != 1 or out.size == 0 or not np.all(out > 1.0):
        raise ValueError("Rényi orders must be > 1")
    return out


def warn_if_at_edge(orders: NDArray[np.float64], best: float) -> None:
    """Warn when the optimum sits at an end of a grid of several orders: the grid is too narrow."""
    if orders.size > 1 and best in (orders[0], orders[-1]):
        warnings.warn(f"optimal Rényi order {best:g} is at the end of the grid "
                      f"[{orders[0]:g}, {orders[-1]:g}]; the bound may be loose",
                      RuntimeWarning, stacklevel=3)
