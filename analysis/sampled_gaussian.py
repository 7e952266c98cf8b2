"""Rényi DP of the Poisson-subsampled Gaussian mechanism: the privacy of DP-SGD.

Abadi et al. 2016 ("Deep Learning with Differential Privacy", §3.1, the moments accountant) and
Mironov, Talwar, Zhang 2019 ("Rényi Differential Privacy of the Sampled Gaussian Mechanism", §3);
restated in docs/privacy-math.md §6. Poisson sampling with rate q, L2 sensitivity 1 (the clipping
norm), noise N(0, sigma^2) (sigma the noise multiplier), add/remove-one neighbours:

    r(a) = log A_a / (a - 1),
    A_a = E_{z ~ N(0, sigma^2)} [(1 - q + q e^{(2z - 1)/(2 sigma^2)})^a].

Everything is vectorised over the orders. The integer-order expansion ``log_binomial_moment`` is
also the per-pair cost of the Bayesian accountant (``analysis.bayesian``).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln, log_ndtr, logsumexp

from analysis.orders import as_orders
from analysis.rdp import Conversion, epsilon_from_rdp

# The fractional-order series stops once both new terms are falling and below e^-30 times the
# sum so far (dp_accounting's criterion), or after this many terms; an order whose series has not
# converged falls back to the next integer order, a valid upper bound since RDP is non-decreasing
# in the order (Van Erven and Harremoës 2014, Thm. 3).
_FRACTIONAL_TERM_LOG_TOL = -30.0
_FRACTIONAL_MAX_TERMS = 20_000
# The series is summed in blocks of terms, each twice the last: few passes for the long series of
# high orders, little computed past the stop of the short ones.
_FRACTIONAL_FIRST_BLOCK = 32
# Relative slack for rounding in the alternating series, so that it stays an upper bound.
_LOG_ROUNDING_SLACK = np.log(1e-13)
# The noise multipliers the float64 series computes; outside, sampled_gaussian_rdp bounds.
NOISE_FLOOR, NOISE_CEILING = 1e-6, 1e12


def _check_rate(q: float) -> None:
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate must be in [0, 1], got {q!r}")


def log_binomial_moment(q: float, orders: ArrayLike, sigma: ArrayLike) -> NDArray[np.float64]:
    """log E_{k ~ Binomial(a, q)} [exp((k^2 - k) / (2 sigma^2))] for integer orders a.

    For integer a this is log A_a of the sampled Gaussian (Mironov, Talwar, Zhang 2019, §3.3,
    eq. for integer alpha; docs/privacy-math.md §6), and with sigma = noise std / pair distance the
    per-pair moment of the Bayesian accountant (Triastcyn & Faltings 2020, §4; docs/privacy-math.md
    §7). Computed in log space from log-binomial coefficients (gammaln).

    ``sigma`` broadcasts against ``orders``: the result has shape
    ``np.broadcast_shapes(np.shape(sigma), np.shape(orders))``. sigma = inf gives 0, sigma = 0
    gives inf (for q > 0).
    """
    _check_rate(q)
    a = np.asarray(orders, np.float64)
    if np.any(a != np.round(a)) or np.any(a < 0):
        raise ValueError("log_binomial_moment needs non-negative integer orders")
    s = np.asarray(sigma, np.float64)
    if np.any(s < 0):
        raise ValueError("sigma must be >= 0")
    with np.errstate(divide="ignore"):
        half_inv_var = (0.5 / s**2)[..., None]
        log_q, log_1mq = np.log(q), np.log1p(-q)
    k = np.arange(int(a.max(initial=0.0)) + 1, dtype=np.float64)
    a_k = a[..., None]
    inside = k <= a_k
    kk = np.where(inside, k, 0.0)
    # the binomial's log-pmf depends on the order alone: computed once per order, not per sigma
    # (the Bayesian accountant asks for thousands of sigmas at a handful of orders)
    with np.errstate(invalid="ignore"):
        # 0 * log 0 = 0: the k = 0 term when q = 0, the k = a term when q = 1.
        log_pmf = (gammaln(a_k + 1.0) - gammaln(kk + 1.0) - gammaln(a_k - kk + 1.0)
                   + np.where(kk > 0, kk * log_q, 0.0)
                   + np.where(a_k - kk > 0, (a_k - kk) * log_1mq, 0.0))
        quad = np.where(k * k - k > 0, (k * k - k) * half_inv_var, 0.0)
        # a term of probability 0 is 0, whatever its factor (q = 0 or 1 with sigma = 0)
        terms = np.where(inside & (log_pmf > -np.inf), log_pmf + quad, -np.inf)
    return logsumexp(terms, axis=-1)


def _log_a_integer(q: float, sigma: float, orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """``log_binomial_moment`` at 1-d integer orders, taken in groups of orders within a factor
    of two of each other: each group's expansion is as long as its own largest order, not the
    grid's (orders 2..100 would otherwise each expand to 5000 terms)."""
    out = np.empty_like(orders)
    size_class = np.floor(np.log2(orders))
    for size in np.unique(size_class):
        group = size_class == size
        out[group] = log_binomial_moment(q, orders[group], sigma)
    return out


def _log_a_fractional(q: float, sigma: float, orders: NDArray[np.float64]) -> NDArray[np.float64]:
    """log A_a for fractional orders, 0 < q < 1, sigma > 0 (Mironov, Talwar, Zhang 2019, §3.3):
    with z0 = sigma^2 log(1/q - 1) + 1/2 split the expectation at z0 and expand both sides,

        A_a = sum_i binom(a, i) [ q^i (1-q)^{a-i} e^{(i^2-i)/(2 sigma^2)} Phi((z0 - i)/sigma)
                                 + q^{a-i} (1-q)^i e^{(j^2-j)/(2 sigma^2)} Phi((j - z0)/sigma) ],

    j = a - i, Phi the standard normal CDF. binom(a, i) changes sign for i > a, so the positive
    and negative terms are summed separately in log space. The truncated sum plus the magnitude of
    the last terms and a rounding slack is returned (an upper bound when the alternating tail
    decreases); orders that did not converge within the term cap come back as nan."""
    log_q, log_1mq = np.log(q), np.log1p(-q)
    z0 = sigma**2 * (log_1mq - log_q) + 0.5
    half_inv_var = 0.5 / sigma**2
    log_abs_gamma_a1 = gammaln(orders + 1.0)
    ceil_orders = np.ceil(orders)
    # per order, the state after its last term so far: the sums, the last term, its two halves
    log_pos, log_neg, log_last, prev_s0, prev_s1 = (
        np.full(orders.shape, fill) for fill in (-np.inf, -np.inf, -np.inf, np.inf, np.inf))
    active = np.ones(orders.shape, bool)
    start, block = 0, _FRACTIONAL_FIRST_BLOCK
    while start < _FRACTIONAL_MAX_TERMS and active.any():
        # the next block of terms of every unfinished order at once: rows orders, columns i
        rows = np.flatnonzero(active)
        i = np.arange(start, min(start + block, _FRACTIONAL_MAX_TERMS), dtype=np.float64)
        a = orders[rows, None]
        j = a - i
        # |binom(a, i)| = |Gamma(a + 1)| / (i! |Gamma(a - i + 1)|); gammaln returns log |Gamma|.
        log_coef = log_abs_gamma_a1[rows, None] - gammaln(i + 1.0) - gammaln(j + 1.0)
        negative = (np.maximum(i - ceil_orders[rows, None], 0.0) % 2) == 1
        s0 = (log_coef + i * log_q + j * log_1mq + (i * i - i) * half_inv_var
              + log_ndtr((z0 - i) / sigma))
        s1 = (log_coef + j * log_q + i * log_1mq + (j * j - j) * half_inv_var
              + log_ndtr((j - z0) / sigma))
        term = np.logaddexp(s0, s1)
        # the running sums after each term, added one by one as the series is defined
        pos = np.logaddexp.accumulate(np.column_stack(
            [log_pos[rows], np.where(negative, -np.inf, term)]), axis=1)[:, 1:]
        neg = np.logaddexp.accumulate(np.column_stack(
            [log_neg[rows], np.where(negative, term, -np.inf)]), axis=1)[:, 1:]
        before_s0 = np.column_stack([prev_s0[rows], s0[:, :-1]])
        before_s1 = np.column_stack([prev_s1[rows], s1[:, :-1]])
        falling = ((s0 < before_s0) | np.isneginf(s0)) & ((s1 < before_s1) | np.isneginf(s1))
        small = np.maximum(s0, s1) < np.logaddexp(pos, neg) + _FRACTIONAL_TERM_LOG_TOL
        stop = falling & small
        stopped = stop.any(axis=1)
        last = np.where(stopped, stop.argmax(axis=1), i.size - 1)  # each order's last term
        at = (np.arange(rows.size), last)
        log_pos[rows], log_neg[rows], log_last[rows] = pos[at], neg[at], term[at]
        prev_s0[rows], prev_s1[rows] = s0[at], s1[at]
        active[rows[stopped]] = False
        start, block = start + i.size, 2 * block
    slack = np.logaddexp(log_last, _LOG_ROUNDING_SLACK + np.logaddexp(log_pos, log_neg))
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        total = -np.expm1(log_neg - log_pos) + np.exp(slack - log_pos)
        log_a = log_pos + np.log(total)
    return np.where(active | ~(total > 0) | ~np.isfinite(log_a), np.nan, log_a)


def sampled_gaussian_rdp(q: float, noise_multiplier: float, orders: ArrayLike | None = None,
                         steps: int = 1) -> NDArray[np.float64]:
    """RDP of ``steps`` compositions of the Poisson-subsampled Gaussian at each order:
    steps * log A_a / (a - 1) (Mironov, Talwar, Zhang 2019, §3; docs/privacy-math.md §6).

    Integer orders use the exact binomial expansion; fractional orders the two-sided series, kept
    an upper bound and never negative (an order whose series does not converge takes the value
    of the next integer order). q = 0 gives 0, q = 1 the Gaussian a / (2 sigma^2), sigma below
    ``NOISE_FLOOR`` inf, and sigma above ``NOISE_CEILING`` the ceiling's curve: upper bounds both,
    where the float64 series would over- or underflow.
    ``orders`` defaults to ``analysis.orders.default_orders()``.
    """
    _check_rate(q)
    if not (np.isfinite(noise_multiplier) and noise_multiplier >= 0):
        raise ValueError(f"noise multiplier must be a finite number >= 0, got "
                         f"{noise_multiplier!r}")
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps!r}")
    a = as_orders(orders)
    if q == 0.0 or steps == 0:
        return np.zeros_like(a)
    if noise_multiplier < NOISE_FLOOR:  # inf bounds it; the series would overflow
        return np.full_like(a, np.inf)
    noise_multiplier = min(noise_multiplier, NOISE_CEILING)  # more noise costs less
    if q == 1.0:
        return steps * a / (2.0 * noise_multiplier**2)
    integer = a == np.round(a)
    log_a = np.empty_like(a)
    log_a[integer] = _log_a_integer(q, noise_multiplier, a[integer])
    frac = ~integer
    if frac.any():
        fractional = _log_a_fractional(q, noise_multiplier, a[frac])
        fallback = np.isnan(fractional)
        if fallback.any():
            ceil = np.ceil(a[frac][fallback])
            fractional[fallback] = (_log_a_integer(q, noise_multiplier, ceil)
                                    * (a[frac][fallback] - 1.0) / (ceil - 1.0))
        log_a[frac] = fractional
    return steps * np.maximum(log_a, 0.0) / (a - 1.0)


def dpsgd_epsilon(q: float, noise_multiplier: float, steps: int, delta: float,
                  conversion: Conversion = "improved",
                  orders: ArrayLike | None = None) -> tuple[float, float]:
    """(epsilon, optimal order) of DP-SGD: the sampled Gaussian composed over ``steps`` and
    converted by ``analysis.rdp.epsilon_from_rdp`` (docs/privacy-math.md §1, §6)."""
    a = as_orders(orders)
    return epsilon_from_rdp(sampled_gaussian_rdp(q, noise_multiplier, a, steps), a, delta,
                            conversion)


def noise_multiplier_for_epsilon(epsilon: float, q: float, steps: int, delta: float,
                                 conversion: Conversion = "improved",
                                 orders: ArrayLike | None = None,
                                 rtol: float = 1e-4) -> float:
    """The smallest noise multiplier (to relative tolerance ``rtol``, rounded up) whose
    ``dpsgd_epsilon`` is at most ``epsilon``: bisection, epsilon being decreasing in sigma. The
    trial sigmas' optimal orders are not warned of at the grid's ends (the one chosen is, where
    its epsilon is computed)."""
    a = as_orders(orders)
    return smallest_noise_for_epsilon(
        lambda sigma: epsilon_from_rdp(sampled_gaussian_rdp(q, sigma, a, steps), a, delta,
                                       conversion, warn_at_edge=False)[0], epsilon, rtol)


def smallest_noise_for_epsilon(epsilon_of: Callable[[float], float], epsilon: float,
                               rtol: float = 1e-4) -> float:
    """The smallest noise multiplier (to relative tolerance ``rtol``, rounded up) at which the
    decreasing function ``epsilon_of`` is at most ``epsilon``: doubling, then bisection."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"target epsilon must be a finite number > 0, got {epsilon!r}")
    lo, hi = 0.0, 1.0
    while epsilon_of(hi) > epsilon:
        lo, hi = hi, 2.0 * hi
        if hi > 1e6:
            raise ValueError(f"no noise multiplier up to 1e6 reaches epsilon {epsilon}")
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if epsilon_of(mid) > epsilon else (lo, mid)
    return hi
