"""The noisy threshold step of Confident- and Interactive-GNMax (PATE 2018, §4.2-4.3, Alg. 1-2;
docs/privacy-math.md §3).

The step compares max_j n_j (Interactive: max_j (n_j - N p_j)) plus N(0, sigma1^2) with T. Its
input has sensitivity 1 where GNMax's has sqrt 2, so every GNMax bound applies with sigma replaced
by sqrt(2) sigma1.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.gaussian import (
    gnmax_rdp_dependent,
    gnmax_rdp_independent,
    log_normal_sf,
)
from analysis.logmath import log1mexp


def student_baseline(votes: ArrayLike, probs: ArrayLike) -> NDArray[np.float64]:
    """Interactive-GNMax's baseline N p_j (PATE 2018, Alg. 2): each query's number of teachers
    N (its row sum) times the class probabilities ``probs`` the student sent for it."""
    v = np.atleast_2d(np.asarray(votes, np.float64))
    return v.sum(axis=1, keepdims=True) * np.asarray(probs, np.float64)


def threshold_inputs(votes: ArrayLike, baseline: ArrayLike | None = None) -> NDArray[np.float64]:
    """What the step thresholds, per query: max_j (n_j - baseline_j), rounded to an integer as the
    published analysis does (so Interactive's fractional values have a finite sensitivity table)."""
    v = np.atleast_2d(np.asarray(votes, np.float64))
    if baseline is not None:
        v = v - np.atleast_2d(np.asarray(baseline, np.float64))
    return np.round(v.max(axis=1))


def threshold_logpr_answered(threshold: float, sigma1: float,
                             max_votes: ArrayLike) -> NDArray[np.float64]:
    """log P[max + N(0, sigma1^2) >= T] = log ½ erfc((T - max)/(sqrt 2 sigma1)) (PATE 2018, §4.2).
    ``max_votes`` is the (rounded) output of ``threshold_inputs``."""
    if sigma1 <= 0:
        raise ValueError(f"sigma1 must be > 0, got {sigma1!r}")
    return log_normal_sf(threshold - np.asarray(max_votes, np.float64), sigma1)


def threshold_rdp_independent(sigma1: float, orders: ArrayLike) -> NDArray[np.float64]:
    """Data-independent RDP of the threshold step: a / (2 sigma1^2)."""
    return gnmax_rdp_independent(np.sqrt(2.0) * sigma1, orders)


def threshold_rdp_dependent(logpr_answered: ArrayLike, sigma1: float,
                            orders: ArrayLike) -> NDArray[np.float64]:
    """Data-dependent RDP of the threshold step: Theorem 6 with sigma -> sqrt(2) sigma1 and
    q -> min(p, 1 - p), the less likely outcome (PATE 2018, §4.2 and App. A).
    Returns ``[queries, orders]``."""
    logp = np.atleast_1d(np.asarray(logpr_answered, np.float64))
    logq = np.minimum(logp, log1mexp(logp))
    return gnmax_rdp_dependent(logq, np.sqrt(2.0) * sigma1, orders)
