"""The Gaussian mechanism and GNMax: data-independent and data-dependent RDP.

PATE 2018 (Papernot et al., "Scalable Private Learning with PATE", arXiv 1802.08908), §4.1 and
Appendix A; restated in docs/privacy-math.md §2. Every function is vectorised: votes are
``[queries, classes]``, log q is ``[queries]``, orders are ``[orders]`` and RDP is
``[queries, orders]``.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import log_ndtr

from analysis.logmath import log1mexp, log_plurality_miss


def gaussian_rdp(sensitivity: float, sigma: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Gaussian mechanism with L2 sensitivity s and noise N(0, sigma^2): r(a) = a s^2 / (2 sigma^2)
    (Mironov 2017, Prop. 7)."""
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    return np.asarray(orders, np.float64) * sensitivity**2 / (2.0 * sigma**2)


def gnmax_rdp_independent(sigma: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-independent GNMax: one teacher moves two counts by 1 (sensitivity sqrt 2), so
    r(a) = a / sigma^2 (PATE 2018, Prop. 8)."""
    return gaussian_rdp(np.sqrt(2.0), sigma, orders)


def log_normal_sf(x: ArrayLike, scale: float) -> NDArray[np.float64]:
    """log P[N(0, scale^2) >= x], accurate far into the tail."""
    return log_ndtr(-np.asarray(x, np.float64) / scale)


def gnmax_logq(votes: ArrayLike, sigma: float) -> NDArray[np.float64]:
    """Upper bound on log P[GNMax does not return the plurality class], per query (PATE 2018,
    Prop. 7): q <= sum_{j != i*} P[N(0, 2 sigma^2) >= n_i* - n_j], capped at 1 - 1/m.

    One class (m = 1) gives log q = -inf: the output is fixed."""
    return log_plurality_miss(votes, lambda gaps: log_normal_sf(gaps, np.sqrt(2.0) * sigma))


def theorem6_rdp(logq: ArrayLike, sigma: float, orders: ArrayLike) -> NDArray[np.float64]:
    """The data-dependent bound of PATE 2018, Theorem 6, with the higher orders of Prop. 10
    (mu2 = sigma sqrt(-log q), mu1 = mu2 + 1, eps_i = mu_i / sigma^2), **without** checking its
    validity conditions:

        A = (1 - q) / (1 - (q e^{eps2})^{(mu2 - 1)/mu2}),  B = e^{eps1} / q^{1/(mu1 - 1)},
        r(a) = log[(1 - q) A^{a-1} + q B^{a-1}] / (a - 1),

    computed in log space. Returns ``[queries, orders]``; callers decide where it applies."""
    logq = np.atleast_1d(np.asarray(logq, np.float64))[:, None]
    a = np.atleast_1d(np.asarray(orders, np.float64))[None, :]
    var = sigma**2
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        mu2 = sigma * np.sqrt(-logq)
        eps2 = mu2 / var
        eps1 = eps2 + 1.0 / var          # mu1 = mu2 + 1
        log1q = log1mexp(logq)
        log_a = (a - 1.0) * (log1q - log1mexp((logq + eps2) * (1.0 - 1.0 / mu2)))
        log_b = (a - 1.0) * (eps1 - logq / mu2)  # mu1 - 1 = mu2
        return np.logaddexp(log1q + log_a, logq + log_b) / (a - 1.0)


def theorem6_applies(logq: ArrayLike, sigma: float) -> NDArray[np.bool_]:
    """Per-query validity of Theorem 6 with Prop. 10's orders (PATE 2018, Thm. 6 and Lemma 9):
    mu2 > 1, -log q > eps2 and log q <= (mu2 - 1) eps2 - mu2 [log(mu1/(mu1-1)) + log(mu2/(mu2-1))].
    The order condition mu1 > a is checked by ``gnmax_rdp_dependent``."""
    logq = np.atleast_1d(np.asarray(logq, np.float64))
    with np.errstate(divide="ignore", invalid="ignore"):
        mu2 = sigma * np.sqrt(-logq)
        mu1 = mu2 + 1.0
        eps2 = mu2 / sigma**2
        bound = ((mu2 - 1.0) * eps2
                 - mu2 * (np.log1p(1.0 / (mu1 - 1.0)) + np.log1p(1.0 / (mu2 - 1.0))))
        return (mu2 > 1.0) & (logq <= bound) & (-logq > eps2)


def gnmax_rdp_dependent(logq: ArrayLike, sigma: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-dependent RDP of GNMax from an upper bound on q (PATE 2018, Theorem 6 + Prop. 10):
    Theorem 6 where it applies (and mu1 > a), capped by the data-independent a / sigma^2
    everywhere; log q = -inf (a fixed output) costs 0. Returns ``[queries, orders]``."""
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma!r}")
    logq = np.atleast_1d(np.asarray(logq, np.float64))
    a = np.atleast_1d(np.asarray(orders, np.float64))
    independent = np.broadcast_to(gnmax_rdp_independent(sigma, a), (logq.size, a.size))
    with np.errstate(invalid="ignore"):
        mu1 = sigma * np.sqrt(-logq) + 1.0
    mask = theorem6_applies(logq, sigma)[:, None] & (mu1[:, None] > a[None, :])
    dependent = theorem6_rdp(logq, sigma, a)
    out = np.where(mask, np.minimum(independent, dependent), independent)
    return np.where(np.isneginf(logq)[:, None], 0.0, out)
