"""Smooth sensitivity of PATE's data-dependent privacy cost (PATE 2018, Appendices B and C;
docs/privacy-math.md §5).

The data-dependent RDP total is a function of the private votes, so it is released with Gaussian
noise scaled to its beta-smooth sensitivity (the GNSS mechanism). This module computes, at one
Rényi order:

- local sensitivity (LS) at every distance d for GNMax (Algorithms 3-5, Prop. 13) and for the
  threshold step, summed over queries into one array ``LS_total[d]``, d = 0..N-1;
- SS_beta = max_d e^{-beta d} LS_total[d], the RDP of the Gaussian release (Theorem 23), and the
  published beta / sigma search;
- a numeric check of the monotonicity conditions C5 and C6 the proofs need.

Everything is vectorised: over queries, and over blocks of distances for the walks of Algorithms
4 and 5 (no Python loop per query or per distance).
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.optimize import brentq
from scipy.special import log_ndtr, logsumexp, ndtri_exp

from analysis.gaussian import (
    gnmax_logq,
    gnmax_rdp_independent,
    log_normal_sf,
    theorem6_applies,
    theorem6_rdp,
)
from analysis.threshold import threshold_logpr_answered, threshold_rdp_dependent

# Elements per block of the (queries x distances x classes) walks: bounds memory to ~100 MB.
_BLOCK_ELEMENTS = 4_000_000


# --------------------------------------------------------------------------------------------
# GNMax: beta(q), q0, q1, b_l, b_u and LS as a function of log q (Algorithm 3, Prop. 13)
# --------------------------------------------------------------------------------------------

def _theorem6_at(logq: NDArray[np.float64], sigma: float, order: float) -> NDArray[np.float64]:
    return theorem6_rdp(logq, sigma, np.array([order]))[:, 0]


class NotApplicable(ValueError):
    """PATE 2018's data-dependent analysis of GNMax does not apply at this (sigma, order): no
    q0 exists below which Theorem 6 beats the data-independent bound."""


@functools.lru_cache(maxsize=256)
def gnmax_logq0(sigma: float, order: float) -> float:
    """log q0: the point above which GNMax's data-independent bound a/sigma^2 beats Theorem 6
    (PATE 2018, App. B.4): the root of theorem6(log q) - a/sigma^2, bracketed below the natural
    upper bound min(-(1 + 1/sigma)^2, -((a - 1)/sigma)^2, -1/sigma^2) where Theorem 6 is valid."""
    independent = float(gnmax_rdp_independent(sigma, order))

    def excess(logq: float) -> float:
        return float(_theorem6_at(np.array([logq]), sigma, order)[0]) - independent

    upper = min(-(1.0 + 1.0 / sigma) ** 2, -(((order - 1.0) / sigma) ** 2), -1.0 / sigma**2)
    if not (theorem6_applies(np.array([upper]), sigma)[0]
            and sigma * math.sqrt(-upper) + 1.0 >= order):
        raise NotApplicable(f"Theorem 6 does not apply at its natural bound (sigma={sigma}, "
                            f"order={order})")
    if excess(upper) < 0:
        return upper
    lower = 2.0 * upper
    while excess(lower) > 0:
        if lower < -1e5:
            raise NotApplicable("no data-dependent gain for GNMax at this order: q0 not "
                                "bracketed")
        lower *= 1.5
    return float(brentq(excess, lower, upper))


def _log_bounds_neighbour_q(logq: NDArray[np.float64], sigma: float,
                            num_classes: int) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(log b_l(q), log b_u(q)): the range of the union-bound q over neighbouring vote vectors
    (PATE 2018, Prop. 13): b_l = (m-1)/2 erfc(1/sigma + erfcinv(2q/(m-1))) and
    b_u = min(1, (m-1)/2 erfc(-1/sigma + erfcinv(2q/(m-1)))). With erfc(x) = 2 Phi(-sqrt2 x) and
    erfcinv(y) = -Phi^{-1}(y/2)/sqrt2 this is (m-1) Phi(Phi^{-1}(q/(m-1)) -+ sqrt2/sigma),
    evaluated in log space so that tiny q neither underflows nor loses precision."""
    log_m1 = math.log(num_classes - 1)
    z = ndtri_exp(logq - log_m1)
    shift = math.sqrt(2.0) / sigma
    return log_m1 + log_ndtr(z - shift), np.minimum(0.0, log_m1 + log_ndtr(z + shift))


@dataclass(frozen=True)
class GNMaxSensitivity:
    """LS of GNMax's data-dependent cost as a function of log q, at one (sigma, m, order)."""

    sigma: float
    num_classes: int
    order: float

    @functools.cached_property
    def logq0(self) -> float:
        return gnmax_logq0(self.sigma, self.order)

    @functools.cached_property
    def logq1(self) -> float:
        """log q1 = log b_l(q0): below it, moving votes towards the runner-up raises LS."""
        return float(_log_bounds_neighbour_q(np.array([self.logq0]), self.sigma,
                                             self.num_classes)[0][0])

    def cost(self, logq: NDArray[np.float64]) -> NDArray[np.float64]:
        """beta(q): Theorem 6 below q0, the data-independent a/sigma^2 above (App. B.4)."""
        independent = float(gnmax_rdp_independent(self.sigma, self.order))
        with np.errstate(invalid="ignore"):
            dependent = _theorem6_at(np.minimum(logq, self.logq0), self.sigma, self.order)
        return np.where(logq >= self.logq0, independent, dependent)

    def local_sensitivity(self, logq: ArrayLike) -> NDArray[np.float64]:
        """Algorithm 3: LS(q) = max(beta(b_u(q)) - beta(q), beta(q) - beta(b_l(q))), with q
        replaced by q1 when q1 <= q <= q0 (PATE 2018, Prop. 13)."""
        logq = np.asarray(logq, np.float64)
        logq = np.where((logq >= self.logq1) & (logq <= self.logq0), self.logq1, logq)
        log_bl, log_bu = _log_bounds_neighbour_q(logq, self.sigma, self.num_classes)
        here = self.cost(logq)
        return np.maximum(self.cost(log_bu) - here, here - self.cost(log_bl))

    @functools.cached_property
    def plateau(self) -> float:
        """LS at every vote vector whose q lies in [q1, q0], and at every distance past a walk."""
        return float(self.local_sensitivity(np.array([self.logq1]))[0])


# --------------------------------------------------------------------------------------------
# GNMax: LS at every distance, summed over queries (Algorithms 4 and 5)
# --------------------------------------------------------------------------------------------

def _logq_table(num_teachers: int, sigma: float) -> NDArray[np.float64]:
    """log P[N(0, 2 sigma^2) >= g] for every integer gap g in [-N, N], indexed by g + N."""
    return log_normal_sf(np.arange(-num_teachers, num_teachers + 1), math.sqrt(2.0) * sigma)


def _runs(sorted_desc: NDArray[np.int64]) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """Distinct values of each row of a row-wise descending matrix and the log of their
    multiplicities, padded to the widest row (padding has log-weight -inf)."""
    q, w = sorted_desc.shape
    if w == 0:
        return np.zeros((q, 1), np.int64), np.full((q, 1), -np.inf)
    starts = np.ones((q, w), bool)
    starts[:, 1:] = sorted_desc[:, 1:] != sorted_desc[:, :-1]
    run_id = np.cumsum(starts, axis=1) - 1
    k = int(run_id.max()) + 1
    rows = np.broadcast_to(np.arange(q)[:, None], (q, w))
    values = np.zeros((q, k), np.int64)
    values[rows, run_id] = sorted_desc
    counts = np.zeros((q, k))
    np.add.at(counts, (rows, run_id), 1.0)
    with np.errstate(divide="ignore"):
        return values, np.log(counts)


def _drive_walk(n_queries: int, n_teachers: int, elements_per_step: int,
                step: Callable[[NDArray[np.int64], NDArray[np.int64]],
                               tuple[NDArray[np.float64], NDArray[np.bool_]]]
                ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """Run a walk over blocks of distances for all queries at once. ``step(active, d)`` gives
    log q and "stop here" for the active queries at distances d, ``[active, len(d)]``. Returns
    (query, d, log q_d) for every step up to and including each query's first stop."""
    active = np.arange(n_queries)
    out_q, out_d, out_logq = [], [], []
    start = 0
    while active.size and start < n_teachers:
        width = max(1, min(n_teachers - start,
                           _BLOCK_ELEMENTS // (active.size * elements_per_step)))
        d = start + np.arange(width)
        logq, stopped = step(active, d)
        has_stop = stopped.any(axis=1)
        stop = np.where(has_stop, stopped.argmax(axis=1), width - 1)
        qi, di = np.nonzero(np.arange(width)[None, :] <= stop[:, None])
        out_q.append(active[qi])
        out_d.append(d[di])
        out_logq.append(logq[qi, di])
        active = active[~has_stop]
        start += width
    return _concat(out_q, out_d, out_logq)


# A term more than this many nats below the largest one changes log q by < 150 e^-42 < 1e-16.
_NEGLIGIBLE_NATS = 42.0


def _walk_towards_runner_up(sorted_votes: NDArray[np.int64], table: NDArray[np.float64],
                            sens: GNMaxSensitivity
                            ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """Algorithm 5's walk for queries with q < q1: at step d the leader has lost d votes to the
    runner-up; it stops at the first d with q_d >= q1.

    log q_d = T(g1 - 2d) + log(1 + sum_j w_j e^{T(n0 - d - c_j) - T(g1 - 2d)}) over the distinct
    other counts c_j (multiplicity w_j), T the Gaussian log survival function of the gap. Along
    the walk T(g1 - 2d) - T(n0 - d - c_j) is concave in d (T'' lies in [-1/(2 sigma^2), 0) and the
    runner-up's gap stays >= 0), so a term negligible at both ends of a block of steps is
    negligible inside it and is left out of that block."""
    n_teachers = (table.size - 1) // 2
    cap = math.log1p(-1.0 / sens.num_classes)
    leader, runner = sorted_votes[:, 0], sorted_votes[:, 1]
    gap_runner = leader - runner
    rest_values, rest_logw = _runs(sorted_votes[:, 2:])

    def step(active: NDArray[np.int64], d: NDArray[np.int64]
             ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
        ends = np.stack([np.full(active.size, d[0]),
                         np.clip(gap_runner[active] // 2, d[0], d[-1])], axis=1)
        runner_at_ends = table[np.clip(gap_runner[active, None] - 2 * ends + n_teachers,
                                       0, table.size - 1)]
        rest_at_ends = (table[np.clip(leader[active, None, None] - ends[:, :, None]
                                      - rest_values[active, None, :] + n_teachers,
                                      0, table.size - 1)] + rest_logw[active, None, :])
        relevant = (rest_at_ends >= runner_at_ends[:, :, None] - _NEGLIGIBLE_NATS).any(axis=1)
        columns = max(1, int((relevant.shape[1] - np.argmax(relevant[:, ::-1], axis=1))
                             [relevant.any(axis=1)].max(initial=1)))
        runner_terms = table[np.clip(gap_runner[active, None] - 2 * d[None, :] + n_teachers,
                                     0, table.size - 1)]
        gap_rest = (leader[active, None, None] - d[None, :, None]
                    - rest_values[active, None, :columns])
        # 0 <= n0 - d - c_j + N <= 2N for d <= N: no clipping needed
        relative = table[gap_rest + n_teachers]
        relative += rest_logw[active, None, :columns]
        relative -= runner_terms[:, :, None]
        logq = np.minimum(runner_terms + np.log1p(np.exp(relative).sum(axis=2)), cap)
        return logq, logq >= sens.logq1

    return _drive_walk(sorted_votes.shape[0], n_teachers, rest_values.shape[1] + 1, step)


def _walk_towards_leader(sorted_votes: NDArray[np.int64], table: NDArray[np.float64],
                         sens: GNMaxSensitivity
                         ) -> tuple[NDArray[np.int64], NDArray[np.int64], NDArray[np.float64]]:
    """Algorithm 4's walk for queries with q > q0: each step moves one vote from the largest
    other class to the leader, so after k steps the other classes are levelled down from the top
    by k votes; it stops at the first k with q_k <= q0 or no vote left outside the leader."""
    n_teachers = (table.size - 1) // 2
    cap = math.log1p(-1.0 / sens.num_classes)
    leader = sorted_votes[:, 0]
    others = sorted_votes[:, 1:]
    width_m = others.shape[1]
    prefix = np.concatenate([np.zeros((others.shape[0], 1), np.int64),
                             np.cumsum(others, axis=1)], axis=1)
    # levelling the top i+1 classes down to others[:, i] removes prefix[i] - i * others[:, i]
    to_level = prefix[:, :-1] - np.arange(width_m)[None, :] * others

    def step(active: NDArray[np.int64], k: NDArray[np.int64]
             ) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
        levelled = (to_level[active, None, :] <= k[None, :, None]).sum(axis=2)  # i + 1
        top_total = np.take_along_axis(prefix[active], levelled, axis=1) - k[None, :]
        level, extra = np.divmod(top_total, levelled)
        j = np.arange(width_m)[None, None, :]
        new_others = np.where(j < levelled[..., None],
                              level[..., None] + (j < extra[..., None]),
                              others[active, None, :])
        gaps = leader[active, None, None] + k[None, :, None] - new_others
        logq = np.minimum(logsumexp(table[np.clip(gaps + n_teachers, 0, table.size - 1)],
                                    axis=2), cap)
        return logq, (logq <= sens.logq0) | (new_others[..., 0] == 0)

    return _drive_walk(sorted_votes.shape[0], n_teachers, width_m, step)


def _concat(*parts: list[NDArray]) -> tuple[NDArray[np.int64], NDArray[np.int64],
                                            NDArray[np.float64]]:
    q, d, logq = (np.concatenate(p) if p else np.zeros(0) for p in parts)
    return q.astype(np.int64), d.astype(np.int64), logq.astype(np.float64)


def _walk_sums(sorted_votes: NDArray[np.int64], weights: NDArray[np.float64],
               logq: NDArray[np.float64], table: NDArray[np.float64],
               sens: GNMaxSensitivity) -> NDArray[np.float64]:
    """sum_q w_q LS_q[d] over the given queries. Along its walk (d <= D_q) a query contributes
    LS(log q_d); after it, and everywhere for queries with q in [q1, q0], the plateau. Summed
    without cancellation: the plateau is weighted by the queries whose walk has ended."""
    n_teachers = (table.size - 1) // 2
    walked = np.zeros(n_teachers)
    ended = np.zeros(n_teachers + 1)  # ended[d]: weight of the walks whose last step is d - 1
    ended[0] = weights[(logq >= sens.logq1) & (logq <= sens.logq0)].sum()
    for walk, selected in ((_walk_towards_runner_up, logq < sens.logq1),
                           (_walk_towards_leader, logq > sens.logq0)):
        rows = np.flatnonzero(selected)
        if rows.size == 0:
            continue
        q, d, logq_d = walk(sorted_votes[rows], table, sens)
        keep = d < n_teachers
        walked += np.bincount(d[keep], minlength=n_teachers,
                              weights=sens.local_sensitivity(logq_d[keep]) * weights[rows[q[keep]]])
        steps = np.bincount(q, minlength=rows.size)  # a walk covers d = 0..D_q
        ended += np.bincount(np.minimum(steps, n_teachers), weights=weights[rows],
                             minlength=n_teachers + 1)
    return walked + sens.plateau * np.cumsum(ended)[:n_teachers]


def gnmax_local_sensitivity_total(votes: ArrayLike, sigma: float, order: float,
                                  weights: ArrayLike | None = None,
                                  threads: int | None = None) -> NDArray[np.float64]:
    """sum_q w_q LS_q[d] for d = 0..N-1, LS_q[d] the local sensitivity of query q's GNMax cost
    at distance d (PATE 2018, Algorithms 3-5). ``weights`` are the probabilities that GNMax runs
    (Confident/Interactive) or ones. O(teachers x classes) per query, vectorised; query chunks run
    on ``threads`` threads (default: one per CPU; numpy releases the GIL in its kernels)."""
    v = np.atleast_2d(np.asarray(votes)).astype(np.int64)
    n_queries, num_classes = v.shape
    n_teachers = int(v[0].sum())
    w = np.ones(n_queries) if weights is None else np.asarray(weights, np.float64)
    if num_classes == 1 or n_teachers == 0:
        return np.zeros(max(n_teachers, 1))
    sens = GNMaxSensitivity(float(sigma), num_classes, float(order))
    logq = gnmax_logq(v, sigma)
    sorted_votes = -np.sort(-v, axis=1)
    table = _logq_table(n_teachers, sigma)
    n_chunks = max(1, min(threads or os.cpu_count() or 1, n_queries // 256))
    chunks = np.array_split(np.arange(n_queries), n_chunks)
    with ThreadPoolExecutor(max_workers=n_chunks) as pool:
        parts = pool.map(lambda rows: _walk_sums(sorted_votes[rows], w[rows], logq[rows],
                                                 table, sens), chunks)
        return np.sum(list(parts), axis=0)


# --------------------------------------------------------------------------------------------
# Threshold step
# --------------------------------------------------------------------------------------------

def threshold_local_sensitivity_total(max_votes: ArrayLike, num_teachers: int, threshold: float,
                                      sigma1: float, order: float) -> NDArray[np.float64]:
    """sum_q LS_q[d] of the threshold step's data-dependent cost (PATE 2018, App. C): with r[v]
    the cost when the (rounded) thresholded maximum is v = 0..N, LS(v) = max |r[v +- 1] - r[v]|,
    and LS_q[d] = max over |d'| <= d of LS(v* + d') within [0, N].

    The published analysis (and docs/privacy-math.md §5) takes max(LS(v* + d), LS(v* - d)) at
    exactly d. For one query both give the same SS_beta, but a neighbour at distance d of the whole
    votes matrix may move some queries' maxima by less than d, so the sum over queries must use the
    maximum over distances <= d (Nissim, Raskhodnikova, Smith 2007, Def. 3.1) to stay an upper
    bound. Where the published array is already non-decreasing (the usual case) they agree."""
    n = int(num_teachers)
    levels = np.arange(n + 1)
    r = threshold_rdp_dependent(threshold_logpr_answered(threshold, sigma1, levels),
                                sigma1, np.array([order]))[:, 0]
    steps = np.abs(np.diff(r))
    ls_level = np.full(n + 2 * n + 1, -np.inf)  # padded so that v* +- d never leaves the array
    ls_level[n:2 * n + 1] = np.maximum(np.concatenate([steps, [-np.inf]]),
                                       np.concatenate([[-np.inf], steps]))
    centres, counts = np.unique(np.clip(np.round(np.asarray(max_votes)), 0, n).astype(np.int64),
                                return_counts=True)
    d = np.arange(n)
    total = np.zeros(n)
    chunk = max(1, _BLOCK_ELEMENTS // max(n, 1))
    for lo in range(0, centres.size, chunk):
        c = centres[lo:lo + chunk, None]
        ls = np.maximum(ls_level[n + c + d[None, :]], ls_level[n + c - d[None, :]])
        ls = np.maximum.accumulate(np.maximum(ls, 0.0), axis=1)
        total += counts[lo:lo + chunk] @ ls
    return total


# --------------------------------------------------------------------------------------------
# Release: smooth sensitivity, GNSS cost, and the beta / sigma search
# --------------------------------------------------------------------------------------------

def smooth_sensitivity(ls_total: ArrayLike, beta: ArrayLike) -> NDArray[np.float64]:
    """SS_beta = max_d e^{-beta d} LS_total[d] (Nissim, Raskhodnikova, Smith 2007; PATE 2018,
    App. C), for one beta or an array of them."""
    ls = np.asarray(ls_total, np.float64)
    b = np.atleast_1d(np.asarray(beta, np.float64))
    return (ls[None, :] * np.exp(-b[:, None] * np.arange(ls.size)[None, :])).max(axis=1)


def gnss_rdp(beta: float, sigma_ss: float, order: float) -> float:
    """RDP of releasing a value plus N(0, (sigma_ss SS_beta)^2) (PATE 2018, Theorem 23), for
    1 < a < 1/(2 beta): a e^{2 beta} / sigma_ss^2 + (beta a - ½ log(1 - 2 a beta)) / (a - 1)."""
    if beta > 0 and not 1.0 < order < 1.0 / (2.0 * beta):
        raise ValueError(f"the GNSS bound needs 1 < order < 1/(2 beta); got order={order}, "
                         f"beta={beta}")
    return (order * math.exp(2.0 * beta) / sigma_ss**2
            + (beta * order - 0.5 * math.log1p(-2.0 * order * beta)) / (order - 1.0))


@dataclass(frozen=True)
class SmoothSensitivityRelease:
    """The chosen release of a data-dependent RDP total at one order."""

    order: float
    beta: float
    value: float       # SS_beta of the total
    sigma: float       # noise std in units of SS_beta
    rdp_cost: float    # RDP of the release at the order (Theorem 23)


def default_betas(order: float) -> NDArray[np.float64]:
    """The published search range: beta in [0.3/a, 0.495/a) in steps of 0.01/a."""
    return np.arange(0.3 / order, 0.495 / order, 0.01 / order)


def optimise_release(ls_total: ArrayLike, rdp_total: float, order: float,
                     betas: ArrayLike | None = None) -> SmoothSensitivityRelease:
    """Choose beta and sigma_ss minimising rdp_total + r_ss + 2 sigma_ss SS_beta, with
    sigma_ss = (a e^{2 beta} / SS_beta)^{1/3} the minimiser of a e^{2 beta}/sigma^2 + 2 SS sigma
    (PATE 2018, App. C, the published analysis). Not releasable itself: it looks at private data."""
    b = default_betas(order) if betas is None else np.atleast_1d(np.asarray(betas, np.float64))
    ss = smooth_sensitivity(ls_total, b)
    best: SmoothSensitivityRelease | None = None
    best_objective = math.inf
    for beta, value in zip(b.tolist(), ss.tolist(), strict=True):
        if value <= 0.0:
            return SmoothSensitivityRelease(order, 0.0, 0.0, math.inf, 0.0)
        sigma = (order * math.exp(2.0 * beta) / value) ** (1.0 / 3.0)
        cost = gnss_rdp(beta, sigma, order)
        objective = rdp_total + cost + 2.0 * value * sigma
        if objective < best_objective:
            best_objective = objective
            best = SmoothSensitivityRelease(order, beta, value, sigma, cost)
    assert best is not None
    return best


# --------------------------------------------------------------------------------------------
# Conditions C5 and C6 (PATE 2018, App. B.4.2), checked numerically
# --------------------------------------------------------------------------------------------

def check_conditions(sigma: float, num_classes: int, order: float,
                     points: int = 20_000) -> tuple[bool, bool]:
    """C5: beta(q) (Theorem 6) is non-decreasing on (0, q0); C6: beta(b_u(q)) - beta(q) is
    non-decreasing on (0, b_l(q0)); both False where no q0 exists (``NotApplicable``).
    Checked on a log-spaced grid of -log q from the interval's upper end to 1e5 (q down to
    e^-100000), with a relative tolerance for rounding."""
    if num_classes < 2:
        return True, True
    sens = GNMaxSensitivity(float(sigma), num_classes, float(order))
    try:
        logq0 = sens.logq0
    except NotApplicable:  # no q0: the proof does not apply, as where C5 fails
        return False, False

    def non_decreasing(values: NDArray[np.float64]) -> bool:
        tol = 1e-9 * np.maximum(np.abs(values[1:]), np.abs(values[:-1])) + 1e-300
        return bool(np.all(np.isfinite(values)) and np.all(np.diff(values) >= -tol))

    def grid(upper_logq: float) -> NDArray[np.float64]:
        return -np.logspace(np.log10(1e5), np.log10(-upper_logq), points)  # increasing log q

    c5 = non_decreasing(_theorem6_at(grid(logq0), sigma, order))
    if not c5:
        return False, False
    logq = grid(sens.logq1)
    _, log_bu = _log_bounds_neighbour_q(logq, sigma, num_classes)
    with np.errstate(invalid="ignore"):
        delta = _theorem6_at(log_bu, sigma, order) - _theorem6_at(logq, sigma, order)
    return True, non_decreasing(delta)
