"""Composition of Rényi-DP and conversion to (epsilon, delta)-DP (docs/privacy-math.md §1)."""

from __future__ import annotations

from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.orders import warn_if_at_edge

Conversion = Literal["classic", "improved"]
CONVERSIONS: tuple[Conversion, ...] = ("classic", "improved")

# Below this order the improved conversion is numerically unstable and never useful
# (dp_accounting's rdp_privacy_accountant uses the same cut-off).
_MIN_IMPROVED_ORDER = 1.01


def compose(*rdp_curves: ArrayLike) -> NDArray[np.float64]:
    """RDP at the same orders adds under adaptive composition (Mironov 2017, Prop. 1)."""
    return np.sum([np.asarray(r, np.float64) for r in rdp_curves], axis=0)


def _check_delta(delta: float) -> None:
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def epsilon_curve(rdp: ArrayLike, orders: ArrayLike, delta: float,
                  conversion: Conversion = "improved") -> NDArray[np.float64]:
    """Epsilon at each order, before minimising.

    classic (Mironov 2017, Prop. 3): eps = r + log(1/delta)/(a - 1).
    improved (Canonne, Kamath, Steinke 2020, Prop. 12; Balle et al. 2020, Thm. 21):
    eps = r + log(1 - 1/a) - (log delta + log a)/(a - 1), defined for a > 1.01, clamped at 0.
    """
    _check_delta(delta)
    r = np.asarray(rdp, np.float64)
    a = np.asarray(orders, np.float64)
    if conversion == "classic":
        return r - np.log(delta) / (a - 1.0)
    if conversion == "improved":
        with np.errstate(divide="ignore", invalid="ignore"):
            eps = r + np.log1p(-1.0 / a) - (np.log(delta) + np.log(a)) / (a - 1.0)
        return np.where(a > _MIN_IMPROVED_ORDER, np.maximum(eps, 0.0), np.inf)
    raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")


def epsilon_from_rdp(rdp: ArrayLike, orders: ArrayLike, delta: float,
                     conversion: Conversion = "improved", *, warn_at_edge: bool = True
                     ) -> tuple[float, float]:
    """(epsilon, optimal order): the conversion minimised over the orders, after composition.
    ``warn_at_edge``: warn when the optimum is at an end of the grid; off for a curve computed
    from private votes, where whether it warns would tell something of them."""
    a = np.atleast_1d(np.asarray(orders, np.float64))
    eps = np.atleast_1d(epsilon_curve(rdp, a, delta, conversion))
    if not np.isfinite(eps).any():  # unbounded at every order: no order to warn of
        return float("inf"), float(a[0])
    idx = int(np.nanargmin(eps))
    if warn_at_edge:
        warn_if_at_edge(a, float(a[idx]))
    return float(eps[idx]), float(a[idx])


def delta_from_rdp(rdp: ArrayLike, orders: ArrayLike, epsilon: float,
                   conversion: Conversion = "improved") -> tuple[float, float]:
    """(delta, optimal order) for a target epsilon: the inverse of ``epsilon_from_rdp``.

    classic: delta = exp((a - 1)(r - eps)) (Mironov 2017, Prop. 3 solved for delta);
    improved: log delta = (a - 1)(r - eps + log(1 - 1/a)) - log a (Canonne et al. 2020, Prop. 12).
    """
    if epsilon < 0:
        raise ValueError(f"epsilon must be >= 0, got {epsilon!r}")
    r = np.atleast_1d(np.asarray(rdp, np.float64))
    a = np.atleast_1d(np.asarray(orders, np.float64))
    if conversion == "classic":
        log_delta = (a - 1.0) * (r - epsilon)
    elif conversion == "improved":
        with np.errstate(divide="ignore", invalid="ignore"):
            log_delta = (a - 1.0) * (r - epsilon + np.log1p(-1.0 / a)) - np.log(a)
        log_delta = np.where(a > _MIN_IMPROVED_ORDER, log_delta, np.inf)
    else:
        raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
    idx = int(np.nanargmin(log_delta))
    return float(min(1.0, np.exp(log_delta[idx]))), float(a[idx])
