"""The Bayesian accountant for DP-SGD (Triastcyn & Faltings, "Bayesian Differential Privacy for
Machine Learning", ICML 2020, and "Improved Accounting for Differentially Private Learning", arXiv
1901.09697; restated in docs/privacy-math.md §7).

Instead of the worst case over neighbouring datasets, the privacy cost of each step is an upper
confidence bound on the expected moment over pairs of examples drawn from the data: with m pairs
of (clipped) per-example gradients at distances d_i and Gaussian noise of std sigma (same units),

    l_i(lam) = T * log E_{k ~ Binomial(lam + 1, q)} [exp((k^2 - k) d_i^2 / (2 sigma^2))],
    c_t(lam) = (1/T) log(M + t_{1-gamma, m-1} S / sqrt(m - 1)),

M and S the mean and standard deviation (ddof 0) of exp(l_i) (Triastcyn & Faltings 2020, eq. 8-12:
the Student-t posterior of the mean under a flat prior). T is the total number of steps planned (the
Hölder correction of the composition theorem, Triastcyn & Faltings 2020, eq. 5). With C(lam) = sum_t
c_t(lam) and K estimates each failing with probability gamma,

    eps = min_lam [C(lam) - log(delta - (1 - (1 - gamma)^K))] / lam,
    delta = min_lam exp(C(lam) - lam eps) + 1 - (1 - gamma)^K.

That is the classic RDP conversion (Mironov 2017, Prop. 3) of the curve C(lam)/lam at orders
lam + 1, so conversion and composition are ``analysis.rdp``'s, and the expectation is the
sampled Gaussian's integer-order moment ``analysis.sampled_gaussian.log_binomial_moment`` with
noise multiplier sigma / d_i. With every pair at the clipping bound the accountant reproduces the
classical RDP bound of DP-SGD.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp, stdtrit

from analysis.rdp import compose, delta_from_rdp, epsilon_from_rdp
from analysis.sampled_gaussian import log_binomial_moment

# The authors' moments (their notebooks' ``powers=[2, 4, 8, 16, 32]``) and moment 1 (order 2), the
# lowest there is: a minimum over more moments is never larger, and a well-noised run often has its
# optimum at moment 2, which would otherwise sit at the grid's end.
DEFAULT_MOMENTS: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
# the largest moment accounted: the binomial expansion of moment lam holds lam + 1 terms
MAX_MOMENT = 1024


def _pair_log_moments(distances: NDArray[np.float64], noise_std: float, sampling_rate: float,
                      moments: NDArray[np.float64], scale: float) -> NDArray[np.float64]:
    """l_i(lam) = scale * log E_{k ~ Bin(lam + 1, q)} exp((k^2 - k) d_i^2 / (2 sigma^2)),
    shape [pairs, moments] (Triastcyn & Faltings 2020, eq. 10; the authors' mixture-first
    direction)."""
    with np.errstate(divide="ignore"):
        ratio = noise_std / distances  # the noise multiplier each pair sees; d = 0 -> inf -> 0
    return scale * log_binomial_moment(sampling_rate, moments[None, :] + 1.0, ratio[:, None])


def upper_confidence_log_mean(log_samples: ArrayLike, failure_probability: float
                              ) -> NDArray[np.float64]:
    """log(M + t_{1-gamma, m-1} S / sqrt(m - 1)) over axis 0, M and S the mean and standard
    deviation (ddof 0) of exp(log_samples): the Student-t upper confidence bound of Triastcyn &
    Faltings 2020, eq. 11-12, in log space. log S = log M + 1/2 log mean(expm1(l_i - log M)^2) is
    stable because l_i - log M <= log m."""
    ell = np.asarray(log_samples, np.float64)
    m = ell.shape[0]
    if m < 3:
        raise ValueError(f"the Bayesian estimator needs at least 3 pairs per step, got {m}")
    log_mean = logsumexp(ell, axis=0) - np.log(m)
    with np.errstate(divide="ignore"):
        log_std = log_mean + 0.5 * np.log(np.mean(np.expm1(ell - log_mean) ** 2, axis=0))
    log_t = np.log(-stdtrit(m - 1, failure_probability))  # t_{1-gamma, m-1}
    return np.logaddexp(log_mean, log_t + log_std - 0.5 * np.log(m - 1.0))


def failure_probability(gamma: float, estimates: int) -> float:
    """1 - (1 - gamma)^K: the probability that at least one of K independent estimates, each
    failing with probability gamma, fails; the part of delta the estimator takes."""
    return float(-np.expm1(estimates * np.log1p(-gamma)))


class BayesianAccountant:
    """Accumulates the Bayesian privacy cost of DP-SGD steps (docs/privacy-math.md §7).

    ``confidence`` is the estimator's confidence 1 - gamma per estimate. In float64,
    ``1 - 1e-16`` is 1 - 2^-53, so gamma = 1 - confidence = 1.11e-16 (exact subtraction), which
    is what the authors' code uses; pass ``failure_probability`` to give gamma directly (e.g.
    exactly 1e-16) instead.
    """

    def __init__(self, moments: Sequence[int] = DEFAULT_MOMENTS, total_steps: int = 1,
                 confidence: float = 1 - 1e-16, *,
                 failure_probability: float | None = None) -> None:
        lam = np.asarray(moments, np.float64)
        if lam.ndim != 1 or lam.size == 0 or np.any(lam < 1) or np.any(lam != np.round(lam)):
            raise ValueError(f"moments must be positive integers, got {moments!r}")
        if np.any(lam > MAX_MOMENT):  # each costs its order's terms for every pair and step
            raise ValueError(f"moments must be at most {MAX_MOMENT}, got {int(lam.max())}")
        if int(total_steps) != total_steps or total_steps < 1:
            raise ValueError(f"total_steps must be a positive integer, got {total_steps!r}")
        gamma = 1.0 - confidence if failure_probability is None else failure_probability
        if not 0.0 < gamma < 1.0:
            raise ValueError("the estimator's failure probability 1 - confidence must be in "
                             f"(0, 1), got {gamma!r}")
        self.moments = lam
        self.total_steps = int(total_steps)
        self.gamma = float(gamma)
        self.steps = 0
        self.estimates = 0
        self._cost = np.zeros_like(lam)

    @property
    def cost(self) -> NDArray[np.float64]:
        """The total C(lam) at each moment."""
        return self._cost.copy()

    @property
    def failure_probability(self) -> float:
        """1 - (1 - gamma)^K for the K estimates so far: the part of delta the estimator takes."""
        return failure_probability(self.gamma, self.estimates)

    def step_cost(self, distances: ArrayLike, noise_std: float, sampling_rate: float,
                  steps: int = 1) -> NDArray[np.float64]:
        """c(lam) of ``steps`` steps estimated from one sample of pair distances (Triastcyn &
        Faltings 2020, eq. 10-12): the Student-t bound on the mean of exp(steps * T * log E[...]),
        over T. Given ``[rows, pairs]`` distances, one estimate per row: ``[rows, moments]``."""
        d = np.asarray(distances, np.float64)
        if d.ndim not in (1, 2) or not np.all(np.isfinite(d)) or np.any(d < 0):
            raise ValueError("distances must be a 1-d (or [rows, pairs]) array of finite "
                             "non-negative numbers")
        if not noise_std > 0:
            raise ValueError(f"noise_std must be > 0, got {noise_std!r}")
        if int(steps) != steps or steps < 1:
            raise ValueError(f"steps must be a positive integer, got {steps!r}")
        ell = _pair_log_moments(d.T.ravel(), noise_std, sampling_rate, self.moments,
                                float(self.total_steps * steps))  # [pairs (x rows), moments]
        ell = ell.reshape(d.T.shape + self.moments.shape)
        return upper_confidence_log_mean(ell, self.gamma) / self.total_steps

    def accumulate(self, distances: ArrayLike, noise_std: float, sampling_rate: float,
                   steps: int = 1) -> None:
        """Add the cost of ``steps`` steps whose pairs are at ``distances`` (one estimate)."""
        if self.steps + steps > self.total_steps:
            raise ValueError(f"{self.steps + steps} steps exceed total_steps="
                             f"{self.total_steps}: the Hölder correction would be wrong")
        self._cost = compose(self._cost, self.step_cost(distances, noise_std, sampling_rate,
                                                        steps))
        self.steps += int(steps)
        self.estimates += 1

    def accumulate_each(self, distances: ArrayLike, noise_std: float,
                        sampling_rate: float) -> None:
        """Add one step per row of ``distances`` ``[steps, pairs]`` (the pairs sampled at that
        step, one estimate each), as ``accumulate`` row by row would: a step at a time, each
        vectorised over its pairs and moments (every step at once would need memory in
        proportion to the steps, and blocks of steps ran no faster, out of the CPU's caches:
        docs/benchmarks.md)."""
        d = np.asarray(distances, np.float64)
        if d.ndim != 2:
            raise ValueError(f"distances must be [steps, pairs], got shape {d.shape}")
        if self.steps + d.shape[0] > self.total_steps:
            raise ValueError(f"{self.steps + d.shape[0]} steps exceed total_steps="
                             f"{self.total_steps}: the Hölder correction would be wrong")
        cost = self._cost  # kept only once every step is costed: a bad row changes nothing
        for row in d:
            cost = compose(cost, self.step_cost(row, noise_std, sampling_rate))
        self._cost = cost
        self.steps += d.shape[0]
        self.estimates += d.shape[0]

    def epsilon_and_moment(self, delta: float) -> tuple[float, int]:
        """(epsilon, optimal moment) at ``delta``, which must exceed the failure probability.
        No warning when the optimum is at the grid's end: the cost is a statistic of the private
        gradients, and the warning would tell something of them."""
        fail = self.failure_probability
        if not fail < delta < 1.0:
            raise ValueError(f"delta={delta!r} must lie in ({fail:.3g}, 1): above the "
                             "estimator's failure probability 1 - (1 - gamma)^K")
        eps, order = epsilon_from_rdp(self._cost / self.moments, self.moments + 1.0,
                                      delta - fail, "classic", warn_at_edge=False)
        return eps, round(order - 1.0)

    def get_epsilon(self, delta: float) -> float:
        """eps = min_lam [C(lam) - log(delta - (1 - (1 - gamma)^K))] / lam."""
        return self.epsilon_and_moment(delta)[0]

    def get_delta(self, epsilon: float) -> float:
        """delta = min_lam exp(C(lam) - lam eps) + 1 - (1 - gamma)^K, at most 1."""
        delta, _ = delta_from_rdp(self._cost / self.moments, self.moments + 1.0, epsilon,
                                  "classic")
        return min(1.0, delta + self.failure_probability)


def bayesian_epsilon(distances: NDArray[np.float64], noise_std: float, sampling_rate: float,
                     delta: float, moments: Sequence[int] = DEFAULT_MOMENTS,
                     confidence: float = 1 - 1e-16) -> tuple[float, int]:
    """(epsilon, optimal moment) at ``delta`` of DP-SGD steps whose sampled pair distances of
    clipped per-example gradients are the rows of ``distances [steps, pairs]``, the noise of
    ``noise_std`` on the summed gradient and Poisson sampling at ``sampling_rate``: every row
    accounted (``BayesianAccountant.accumulate_each``), then converted (Triastcyn & Faltings
    2020, Theorem 2). ``ValueError`` for distances that are not finite, non-negative numbers
    ``[steps, pairs]``."""
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    distances = np.asarray(distances)
    if (distances.ndim != 2 or not np.issubdtype(distances.dtype, np.number)
            or 0 in distances.shape):
        raise ValueError(f"distances must be a numeric array [steps >= 1, pairs >= 1], got "
                         f"shape {list(distances.shape)}")
    distances = distances.astype(np.float64)
    if not np.all(np.isfinite(distances)) or np.any(distances < 0):
        raise ValueError("distances must be finite and non-negative")
    accountant = BayesianAccountant(moments, total_steps=len(distances), confidence=confidence)
    fail = failure_probability(accountant.gamma, len(distances))  # said before the work
    if not fail < delta:
        raise ValueError(f"at confidence {confidence:g} per step the estimate of {len(distances)} "
                         f"steps fails with probability {fail:.3g}, not below delta={delta:g}: "
                         "raise the confidence")
    with np.errstate(over="ignore", divide="ignore", invalid="ignore"):  # no noise: inf
        accountant.accumulate_each(distances, noise_std, sampling_rate)
        return accountant.epsilon_and_moment(delta)
