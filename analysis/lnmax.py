"""LNMax, the original PATE aggregator (Papernot et al. 2017, "Semi-supervised Knowledge Transfer
for Deep Learning from Private Training Data", arXiv 1610.05755; docs/privacy-math.md §4).

Laplace noise of scale b on every count; each answer is pure (2/b)-DP.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.logmath import log1mexp, log_plurality_miss


def lnmax_pure_epsilon(scale: float) -> float:
    """Pure epsilon of one LNMax answer with Laplace scale b: 2 / b (PATE 2017, §3)."""
    if scale <= 0:
        raise ValueError(f"the Laplace scale must be > 0, got {scale!r}")
    return 2.0 / scale


def lnmax_logq(votes: ArrayLike, scale: float) -> NDArray[np.float64]:
    """Upper bound on log P[LNMax does not return the plurality class] (PATE 2017, Lemma 4):
    with g_j = (n_i* - n_j)/b, q <= sum_{j != i*} (2 + g_j)/4 e^{-g_j}, capped at 1 - 1/m."""
    lnmax_pure_epsilon(scale)

    def log_overturn(gaps: NDArray[np.float64]) -> NDArray[np.float64]:
        g = gaps / scale
        return np.log(2.0 + g) + np.log(0.25) - g

    return log_plurality_miss(votes, log_overturn)


def pure_eps_rdp(logq: ArrayLike, pure_eps: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-dependent RDP of a pure eps-DP mechanism whose likely outcome has probability 1 - q
    (PATE 2017, Thm. 3; first term from Bun & Steinke 2016):

        t = (1 - q) ((1 - q)/(1 - e^eps q))^{a-1} + q e^{eps (a-1)} if q <= 1/(e^eps + 1),
        else t = inf;
        r(a) = min(eps^2 a / 2, log t / (a - 1), eps).

    log q = 0 (q = 1) gives the data-independent min(eps^2 a / 2, eps). Returns [queries, orders].
    """
    logq = np.atleast_1d(np.asarray(logq, np.float64))[:, None]
    a = np.atleast_1d(np.asarray(orders, np.float64))[None, :]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        applies = logq <= -np.logaddexp(0.0, pure_eps)  # q <= 1/(e^eps + 1), in log space
        log1q = log1mexp(logq)
        logt = np.logaddexp(log1q + (log1q - log1mexp(np.minimum(pure_eps + logq, 0.0)))
                            * (a - 1.0), logq + pure_eps * (a - 1.0))
        logt = np.where(applies, logt, np.inf)
        return np.minimum(np.minimum(0.5 * pure_eps**2 * a, logt / (a - 1.0)), pure_eps)


def lnmax_rdp_independent(scale: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-independent RDP of one LNMax answer: min(eps^2 a / 2, eps) with eps = 2/b."""
    return pure_eps_rdp(np.zeros(1), lnmax_pure_epsilon(scale), orders)[0]


def lnmax_rdp_dependent(votes: ArrayLike, scale: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-dependent RDP of LNMax per query, ``[queries, orders]``."""
    return pure_eps_rdp(lnmax_logq(votes, scale), lnmax_pure_epsilon(scale), orders)
