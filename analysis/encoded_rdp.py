"""Rényi DP of DP-SGD with gradient encoding and any symmetric noise family (Nasr, Shokri,
Houmansadr 2020, "Improving Deep Learning with Differential Privacy using Gradient Encoding and
Denoising", Lemma 4, Lemma 5, Theorem 1; docs/privacy-math.md §10).

One step, Poisson sampling at rate q, every encoded per-example gradient dominated by a profile
psi of Psi (coordinates tau, the clipping norm the unit), i.i.d. noise of density z per coordinate
at standard deviation sigma, integer order a:

    eps(a) = 1/(a - 1) log sum_{k=0..a} C(a, k) q^k (1 - q)^(a - k) prod_{tau in psi} M_k(tau),
    M_k(tau) = integral (z(x - tau) / z(x))^k z(x) dx.

The paper prints the prefactor as 1/(1 - a); with it the Gaussian case would be negative, and
1/(a - 1) gives exactly the sampled Gaussian (the tests check it). The bound for Psi is the
maximum over its members; steps add.

- Gaussian noise with every psi of norm <= 1 is the sampled Gaussian mechanism
  (prod M_k = exp(k (k - 1) ||psi||^2 / (2 sigma^2))): routed to ``analysis.sampled_gaussian``
  with all its orders, fractional included.
- Other families: integer orders only (the lemma's binomial expansion). log M_k is computed by
  Gauss-Legendre quadrature in log space, on a grid of shifts onto which each tau is rounded up;
  sound because M_k is non-decreasing in |tau|, which is checked on the grid (a family where it
  fails is refused), as is the density's symmetry (eq. 14).
"""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln, logsumexp

from analysis.encoding_profiles import sorted_profiles
from analysis.noise_families import NoiseFamily, check_symmetric, noise_family
from analysis.orders import as_orders
from analysis.rdp import Conversion, epsilon_from_rdp
from analysis.sampled_gaussian import sampled_gaussian_rdp, smallest_noise_for_epsilon

INTEGER_ORDERS = np.arange(2.0, 65.0)
DEFAULT_GRID_SIZE = 2000
# The smallest positive grid point, relative to the largest coordinate of Psi.
_GRID_FLOOR = 1e-7
# Gauss-Legendre nodes per piece: (-inf, 0], [0, tau], [tau, inf), the tails mapped by
# x = tau + tan(theta), theta in [0, pi/2).
_QUADRATURE_NODES = 128
# Largest k * u (order times shift in standard deviations) given a finite log M_k.
_MAX_K_SHIFT = 8.0
_MONOTONE_ATOL = 1e-12
_MONOTONE_RTOL = 1e-9
_ROWS_PER_CHUNK = 64


def shift_grid(top: float, size: int = DEFAULT_GRID_SIZE) -> NDArray[np.float64]:
    """0, then ``size - 1`` geometrically spaced points from ``top * 1e-7`` to ``top``: the values
    onto which the accountant rounds each coordinate of Psi up."""
    if size < 2 or not top > 0:
        raise ValueError(f"the shift grid needs size >= 2 and top > 0, got {size}, {top!r}")
    return np.concatenate([[0.0], np.geomspace(top * _GRID_FLOOR, top, size - 1)])


def profile_counts(profiles: NDArray[np.float64], grid: NDArray[np.float64]
                   ) -> NDArray[np.float64]:
    """[members, grid points]: how many coordinates of each profile round up to each grid point
    (the smallest grid point >= the coordinate's magnitude)."""
    p = np.atleast_2d(np.abs(np.asarray(profiles, np.float64)))
    if p.max() > grid[-1]:
        raise ValueError("a profile value lies above the shift grid")
    g = len(grid)
    counts = np.empty((len(p), g), np.float64)
    for start in range(0, len(p), _ROWS_PER_CHUNK):
        rows = p[start:start + _ROWS_PER_CHUNK]
        idx = np.searchsorted(grid, rows, side="left") + g * np.arange(len(rows))[:, None]
        counts[start:start + len(rows)] = np.bincount(idx.ravel(), minlength=g * len(rows)
                                                      ).reshape(len(rows), g)
    return counts


def _quadrature(shifts: NDArray[np.float64]) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Nodes x and log weights [shifts, 3 * nodes] for integrals over the real line that split at
    0 and at each shift u >= 0 (where a Laplace density has its kinks)."""
    t, w = np.polynomial.legendre.leggauss(_QUADRATURE_NODES)
    theta, w_theta = (t + 1.0) * np.pi / 4.0, w * np.pi / 4.0
    tail_x, tail_w = np.tan(theta), w_theta / np.cos(theta) ** 2
    mid, w_mid = (t + 1.0) / 2.0, w / 2.0
    u = shifts[:, None]
    x = np.concatenate([np.broadcast_to(-tail_x, (len(shifts), len(t))), u * mid,
                        u + tail_x], axis=1)
    with np.errstate(divide="ignore"):
        log_w = np.concatenate([np.broadcast_to(np.log(tail_w), (len(shifts), len(t))),
                                np.log(u * w_mid), np.broadcast_to(np.log(tail_w),
                                                                   (len(shifts), len(t)))],
                               axis=1)
    return x, log_w


def log_moments(family: NoiseFamily, shifts: ArrayLike, max_k: int) -> NDArray[np.float64]:
    """log M_k(u) for k = 0..max_k (rows) and each shift u >= 0 (columns), noise of standard
    deviation 1 (Lemma 5): M_k(u) = integral z(x - u)^k z(x)^(1 - k) dx, by Gauss-Legendre
    quadrature in log space (logsumexp of log integrand + log weight); where M_k < e, as
    log1p(integral z(x) expm1(k log(z(x - u) / z(x))) dx), which keeps the relative accuracy for
    tiny shifts. M_0 = M_1 = 1 exactly. Where k u exceeds 8 (the range in which the quadrature
    was checked against closed forms, docs/privacy-math.md §10) the entry is +inf: no bound."""
    u = np.atleast_1d(np.asarray(shifts, np.float64))
    if np.any(u < 0):
        raise ValueError("shifts must be >= 0")
    x, log_w = _quadrature(u)
    log_z0 = family.logpdf(x)
    log_ratio = family.logpdf(x - u[:, None]) - log_z0
    log_base = log_z0 + log_w
    weight = np.exp(log_base)
    out = np.zeros((max_k + 1, len(u)))
    for k in range(2, max_k + 1):
        kl = k * log_ratio
        log_terms = kl + log_base
        top = log_terms.max(axis=1, keepdims=True)
        log_m = (top + np.log(np.exp(log_terms - top).sum(axis=1, keepdims=True)))[:, 0]
        small = log_m < 1.0
        rows = slice(None) if small.all() else small
        kl = kl[rows]
        with np.errstate(over="ignore"):
            excess = np.where(kl < 1.0, weight[rows] * np.expm1(np.minimum(kl, 1.0)),
                              np.exp(log_terms[rows]) - weight[rows])
        log_m[rows] = np.log1p(np.sum(excess, axis=1))
        out[k] = np.where(k * u > _MAX_K_SHIFT, np.inf, log_m)
    out[:, u == 0.0] = 0.0
    return out


def check_monotone(table: NDArray[np.float64], family: NoiseFamily) -> None:
    """Refuse a family whose log M_k is not non-decreasing along the (increasing) grid of shifts
    for some k: rounding tau up onto the grid, and bounding an encoded gradient dominated by psi
    by psi itself, are then unsound."""
    with np.errstate(invalid="ignore"):
        step = np.diff(table, axis=1)
        slack = _MONOTONE_ATOL + _MONOTONE_RTOL * np.abs(table[:, 1:])
        falling = np.isfinite(step) & (step < -slack)
    if np.any(falling):
        k = int(np.nonzero(falling.any(axis=1))[0][0])
        raise ValueError(f"noise family {family.name!r}: M_{k}(tau) decreases in |tau| on the "
                         "grid; the encoded-gradient bound does not hold for it")


def mixture_rdp(q: float, log_moment_sums: ArrayLike, orders: ArrayLike) -> NDArray[np.float64]:
    """eps(a) = 1/(a - 1) log sum_{k=0..a} C(a, k) q^k (1 - q)^(a - k) exp(L_k) for integer
    orders a (Lemma 4 and Theorem 1, the prefactor's sign corrected), where L_k = log prod_tau
    M_k(tau) is given along the last axis of ``log_moment_sums`` (k = 0..max order). Leading axes
    are kept; the result has the orders as its last axis, clamped at 0."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"sampling rate must be in [0, 1], got {q!r}")
    a = np.asarray(orders, np.float64)
    lm = np.asarray(log_moment_sums, np.float64)
    if np.any(a != np.round(a)) or np.any(a < 2) or a.max() > lm.shape[-1] - 1:
        raise ValueError("mixture_rdp needs integer orders >= 2 covered by the moments given")
    k = np.arange(lm.shape[-1], dtype=np.float64)
    aa = a[:, None]
    kk = np.minimum(k, aa)
    with np.errstate(divide="ignore", invalid="ignore"):
        log_q, log_1mq = np.log(q), np.log1p(-q)
        coef = (gammaln(aa + 1.0) - gammaln(kk + 1.0) - gammaln(aa - kk + 1.0)
                + np.where(kk > 0, kk * log_q, 0.0)
                + np.where(aa - kk > 0, (aa - kk) * log_1mq, 0.0))
    coef = np.where(k <= aa, coef, -np.inf)
    # A term of weight 0 (k > a, or q in {0, 1}) is 0 even where L_k is +inf (no bound).
    with np.errstate(invalid="ignore"):
        terms = np.where(np.isneginf(coef), -np.inf, lm[..., None, :] + coef)
    log_a = logsumexp(terms, axis=-1)
    return np.maximum(log_a, 0.0) / (a - 1.0)


class EncodedAccountant:
    """The RDP of encoded DP-SGD for one noise family and one set of profiles Psi ([members,
    dimension], unit clipping norm), with the profiles' grid counts computed once so that many
    noise multipliers (a bisection) cost one quadrature each."""

    def __init__(self, family: NoiseFamily, profiles: ArrayLike,
                 grid_size: int = DEFAULT_GRID_SIZE) -> None:
        check_symmetric(family)
        p = np.atleast_2d(np.abs(np.asarray(profiles, np.float64)))
        if not np.all(np.linalg.norm(p, axis=1) <= 1.0 + 1e-9):
            raise ValueError("every profile must have L2 norm <= 1 (the clipping norm)")
        self.family = family
        self.gaussian = family.name == "gaussian"
        if not self.gaussian:
            self.grid = shift_grid(float(p.max()), grid_size)
            self.counts = profile_counts(p, self.grid)

    def default_orders(self) -> NDArray[np.float64]:
        return as_orders(None) if self.gaussian else INTEGER_ORDERS

    def rdp(self, q: float, noise_multiplier: float, steps: int = 1,
            orders: ArrayLike | None = None) -> NDArray[np.float64]:
        """RDP of ``steps`` steps at each order: the maximum over Psi of ``mixture_rdp``, times
        ``steps``. Gaussian: the sampled Gaussian at noise multiplier sigma (sensitivity 1, an
        upper bound for profiles of norm below 1)."""
        a = self.default_orders() if orders is None else as_orders(orders)
        if not (math.isfinite(noise_multiplier) and noise_multiplier > 0):
            raise ValueError(f"noise multiplier must be a finite number > 0, got "
                             f"{noise_multiplier!r}")
        if steps < 0:
            raise ValueError(f"steps must be >= 0, got {steps!r}")
        if self.gaussian:
            return sampled_gaussian_rdp(q, noise_multiplier, a, steps)
        table = log_moments(self.family, self.grid / noise_multiplier, int(a.max()))
        check_monotone(table, self.family)
        # 0 * inf is 0 here (a grid point no coordinate rounds to costs nothing).
        unbounded = (self.counts > 0) @ np.isinf(table).T
        sums = np.where(unbounded, np.inf, self.counts @ np.where(np.isinf(table), 0.0, table).T)
        per_member = mixture_rdp(q, sums, a)
        return steps * per_member.max(axis=0)

    def epsilon(self, q: float, noise_multiplier: float, steps: int, delta: float,
                conversion: Conversion = "improved",
                orders: ArrayLike | None = None, *, warn_at_edge: bool = True
                ) -> tuple[float, float]:
        """(epsilon, optimal order) by ``analysis.rdp.epsilon_from_rdp``. No step, or a
        sampling rate of 0, releases nothing: epsilon 0 (the conversion of an RDP of 0 would
        still give log(1/delta) / (a - 1) > 0), at the grid's first order."""
        a = self.default_orders() if orders is None else as_orders(orders)
        if steps == 0 or q == 0:
            self.rdp(q, noise_multiplier, steps, a)  # the arguments checked all the same
            return 0.0, float(a[0])
        return epsilon_from_rdp(self.rdp(q, noise_multiplier, steps, a), a, delta, conversion,
                                warn_at_edge=warn_at_edge)

    def noise_multiplier_for_epsilon(self, epsilon: float, q: float, steps: int, delta: float,
                                     conversion: Conversion = "improved",
                                     rtol: float = 1e-4) -> float:
        """The smallest noise multiplier (standard deviation / C) reaching ``epsilon`` (the
        trial ones' optimal orders not warned of at the grid's ends)."""
        return smallest_noise_for_epsilon(
            lambda s: self.epsilon(q, s, steps, delta, conversion, warn_at_edge=False)[0],
            epsilon, rtol)


def encoded_accountant(noise: str, dof: float, encode: int | None, dimension: int, seed: int,
                       grid_size: int = DEFAULT_GRID_SIZE) -> EncodedAccountant:
    """The accountant of DP-SGD with ``noise`` (``analysis.noise_families``) and Psi of ``encode``
    profiles of ``dimension`` coordinates drawn from ``seed`` (``sorted_profiles``). Gaussian
    noise needs no profiles (every one has norm 1: the sampled Gaussian); without encoding
    (plain clipping) only Gaussian noise is accounted."""
    family = noise_family(noise, dof)
    if family.name == "gaussian":
        return EncodedAccountant(family, np.ones((1, 1)), grid_size)
    if encode is None:
        raise ValueError(f"{noise} noise is accounted for encoded gradients only: give the "
                         "number of profiles to encode against")
    return EncodedAccountant(family, sorted_profiles(encode, dimension, seed), grid_size)
