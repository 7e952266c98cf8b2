"""Statistics of an empirical privacy audit: a lower bound on epsilon from samples of a mechanism's
output on two neighbouring inputs, and tests that drawn noise has the family, the scale and the
independence the analysis assumes.

The lower bound follows DP auditing (Jagielski, Ullman, Oprea 2020, "Auditing Differentially
Private Machine Learning: How Private is Private SGD?"; Nasr, Song, Thakurta, Papernot, Carlini
2021, "Adversary Instantiation: Lower Bounds for Differentially Private Machine Learning"). An
(epsilon, delta)-DP mechanism M satisfies, for every event E and neighbours D, D',

    P[M(D) in E] <= e^epsilon P[M(D') in E] + delta,

so with a lower confidence bound p_low on P[M(D) in E] and an upper one q_high on P[M(D') in E],

    epsilon >= ln((p_low - delta) / q_high)

holds with the confidence of both bounds together (Clopper-Pearson intervals, each side at
alpha / 2, and a Bonferroni correction over every estimate reported). The event is chosen as in
DP-Sniper (Bichsel, Steffen, Bogunovic, Vechev 2021, "DP-Sniper: Black-Box Discovery of
Differential Privacy Violations using Classifiers"): for a discrete output, the best events are
the likelihood-ratio level sets (Neyman-Pearson), so the candidates are the prefixes of the
outcomes sorted by their empirical ratio. Events and neighbouring pairs are searched on one half of
the draws and the chosen ones estimated on the other half, which the search never saw.

Arrays: ``counts`` are outcome counts ``[..., outcomes]``; a pair is ``[2, outcomes]`` (the
counts on D and on D').
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import stats

NoiseFamily = Literal["gaussian", "laplace"]


def clopper_pearson(successes: ArrayLike, trials: ArrayLike, alpha: float
                    ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """Exact binomial interval (Clopper & Pearson 1934) at confidence 1 - alpha, each side
    alpha / 2: low = Beta(alpha/2; k, n - k + 1), high = Beta(1 - alpha/2; k + 1, n - k), with
    low = 0 at k = 0 and high = 1 at k = n."""
    if not 0.0 < alpha < 1.0:
        raise ValueError(f"alpha must be in (0, 1), got {alpha!r}")
    k = np.asarray(successes, np.float64)
    n = np.asarray(trials, np.float64)
    with np.errstate(invalid="ignore"):
        low = np.where(k > 0, stats.beta.ppf(alpha / 2.0, k, n - k + 1.0), 0.0)
        high = np.where(k < n, stats.beta.ppf(1.0 - alpha / 2.0, k + 1.0, n - k), 1.0)
    return low, high


def epsilon_lower_bound(hits_p: ArrayLike, trials_p: ArrayLike, hits_q: ArrayLike,
                        trials_q: ArrayLike, delta: float, alpha: float) -> NDArray[np.float64]:
    """ln((p_low - delta) / q_high), at least 0, for an event seen ``hits_p`` times in
    ``trials_p`` draws on D and ``hits_q`` times in ``trials_q`` draws on D' (Jagielski et al.
    2020, §3; Nasr et al. 2021, §3). p_low is the Clopper-Pearson lower end of the first, q_high
    the upper end of the second, each at confidence 1 - alpha / 2: the bound holds with
    probability at least 1 - alpha."""
    if not 0.0 <= delta < 1.0:
        raise ValueError(f"delta must be in [0, 1), got {delta!r}")
    p_low, _ = clopper_pearson(hits_p, trials_p, alpha)
    _, q_high = clopper_pearson(hits_q, trials_q, alpha)
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.log((p_low - delta) / q_high)
    return np.where(p_low > delta, np.maximum(eps, 0.0), 0.0)


def bonferroni(alpha: float, tests: int) -> float:
    """The per-test level that keeps the family-wise error of ``tests`` tests at alpha."""
    if tests < 1:
        raise ValueError(f"tests must be >= 1, got {tests!r}")
    return alpha / tests


def likelihood_ratio_events(counts_p: ArrayLike, counts_q: ArrayLike) -> NDArray[np.bool_]:
    """Candidate events ``[events, outcomes]`` for telling D (``counts_p``) from D'
    (``counts_q``): the outcomes seen under either, sorted by their empirical likelihood ratio
    (with +1/2 on each count, so an outcome seen under one only has a finite ratio), and every
    non-empty proper prefix of that order (Neyman-Pearson: the most powerful tests are the
    ratio's level sets; DP-Sniper, Bichsel et al. 2021, §4). Outcomes never seen are in no
    event, so no two events count the same draws."""
    p = np.asarray(counts_p, np.float64)
    q = np.asarray(counts_q, np.float64)
    seen = np.flatnonzero((p + q) > 0)
    order = seen[np.argsort(-((p[seen] + 0.5) / (q[seen] + 0.5)), kind="stable")]
    events = np.zeros((max(order.size - 1, 0), p.size), bool)
    events[:, order] = np.arange(1, order.size)[:, None] > np.arange(order.size)[None, :]
    return events


@dataclass(frozen=True)
class Candidate:
    """An event on one pair, in one direction: ``forward`` means P is the pair's first
    distribution (D) and Q its second (D')."""

    pair: int
    event: NDArray[np.bool_]
    forward: bool


@dataclass(frozen=True)
class Estimate:
    """The audit's answer: the best candidate's epsilon lower bound on the estimation half, with
    the probabilities' confidence ends and the number of candidates it was corrected for."""

    epsilon_lower: float
    candidate: Candidate
    p_low: float
    q_high: float
    candidates: int


def _hits(counts: NDArray[np.float64], events: NDArray[np.bool_]) -> NDArray[np.float64]:
    """How many draws of ``counts`` ``[outcomes]`` fall in each event ``[..., outcomes]``."""
    return events.astype(np.float64) @ counts


def select_candidates(selection: ArrayLike, trials: int, delta: float, alpha: float,
                      keep: int) -> list[Candidate]:
    """The best event (and direction) of each pair by its lower bound on the selection half
    ``[pairs, 2, outcomes]`` (``trials`` draws per distribution), then the ``keep`` best pairs.
    Scoring by the lower bound, not the raw ratio, favours events frequent enough to be
    estimated; one candidate per pair spends the Bonferroni correction on distinct ones."""
    counts = np.asarray(selection, np.float64)
    scored: list[tuple[float, Candidate]] = []
    for pair, (c0, c1) in enumerate(counts):
        best: tuple[float, Candidate] | None = None
        for forward, (cp, cq) in ((True, (c0, c1)), (False, (c1, c0))):
            events = likelihood_ratio_events(cp, cq)
            if not events.size:
                continue
            score = epsilon_lower_bound(_hits(cp, events), trials, _hits(cq, events),
                                        trials, delta, alpha)
            i = int(np.argmax(score))
            if score[i] > 0 and (best is None or score[i] > best[0]):
                best = (float(score[i]), Candidate(pair, events[i], forward))
        if best is not None:
            scored.append(best)
    scored.sort(key=lambda item: -item[0])
    return [c for _, c in scored[:keep]]


def estimate(candidates: list[Candidate], estimation: ArrayLike, trials: int, delta: float,
             alpha: float) -> Estimate | None:
    """Each candidate's lower bound on the estimation half ``[pairs, 2, outcomes]`` at the
    Bonferroni level alpha / len(candidates); the best one (None without candidates)."""
    if not candidates:
        return None
    counts = np.asarray(estimation, np.float64)
    level = bonferroni(alpha, len(candidates))
    best: Estimate | None = None
    for c in candidates:
        p, q = counts[c.pair] if c.forward else counts[c.pair][::-1]
        hits_p, hits_q = _hits(p, c.event), _hits(q, c.event)
        eps = float(epsilon_lower_bound(hits_p, trials, hits_q, trials, delta, level))
        p_low = float(clopper_pearson(hits_p, trials, level)[0])
        q_high = float(clopper_pearson(hits_q, trials, level)[1])
        if best is None or eps > best.epsilon_lower:
            best = Estimate(eps, c, p_low, q_high, len(candidates))
    return best


def audit_counts(selection: ArrayLike, estimation: ArrayLike, trials: int, delta: float,
                 confidence: float, keep: int = 3) -> Estimate | None:
    """Search events and pairs on ``selection``, estimate the ``keep`` best on ``estimation``
    (both ``[pairs, 2, outcomes]``, ``trials`` draws per distribution and half): an epsilon lower
    bound that holds with probability ``confidence`` (None: no event separates the pairs)."""
    alpha = 1.0 - confidence
    return estimate(select_candidates(selection, trials, delta, alpha, keep), estimation,
                    trials, delta, alpha)


# -- the noise itself ----------------------------------------------------------------------


def noise_distribution(family: NoiseFamily, scale: float) -> stats.rv_continuous:
    """The zero-mean distribution the analysis assumes: N(0, scale^2) or Laplace(0, scale)."""
    if scale <= 0:
        raise ValueError(f"scale must be > 0, got {scale!r}")
    if family == "gaussian":
        return stats.norm(0.0, scale)
    if family == "laplace":
        return stats.laplace(0.0, scale)
    raise ValueError(f"noise family must be gaussian or laplace, got {family!r}")


@dataclass(frozen=True)
class FitTest:
    """Goodness of fit of samples to a fully specified distribution: Kolmogorov-Smirnov
    (sensitive near the centre) and Cramér-von Mises (the whole CDF), with p-values."""

    ks_statistic: float
    ks_pvalue: float
    cvm_statistic: float
    cvm_pvalue: float

    @property
    def pvalue(self) -> float:
        """The smaller p-value, Bonferroni-corrected for the two tests."""
        return min(1.0, 2.0 * min(self.ks_pvalue, self.cvm_pvalue))


def noise_fit(samples: ArrayLike, family: NoiseFamily, scale: float) -> FitTest:
    """Test that ``samples`` (flattened) are draws of ``noise_distribution(family, scale)``: a
    wrong family or scale (sigma / 2) is rejected with p ~ 0 at 10^5 draws."""
    x = np.asarray(samples, np.float64).ravel()
    cdf = noise_distribution(family, scale).cdf
    ks = stats.kstest(x, cdf)
    with np.errstate(invalid="ignore", divide="ignore"):
        cvm = stats.cramervonmises(x, cdf)
    # scipy's series for the CvM p-value gives NaN far in the tail, where p is 0 to precision.
    cvm_p = 0.0 if np.isnan(cvm.pvalue) else float(cvm.pvalue)
    return FitTest(float(ks.statistic), float(ks.pvalue), float(cvm.statistic), cvm_p)


def adjacent_correlation_pvalue(samples: ArrayLike) -> float:
    """Independence across queries of noise ``[queries, components]``: Pearson's r between
    queries 2i and 2i + 1 for each component (disjoint pairs, so under independence sqrt(n) r
    is asymptotically N(0, 1)); the smallest two-sided p-value, Bonferroni-corrected over the
    components. One draw reused across queries gives r = 1, p = 0."""
    x = np.asarray(samples, np.float64)
    x = x.reshape(x.shape[0], -1)
    pairs = x.shape[0] // 2
    if pairs < 3:
        raise ValueError(f"need at least 6 queries, got {x.shape[0]}")
    a, b = x[0:2 * pairs:2], x[1:2 * pairs:2]
    a = a - a.mean(axis=0)
    b = b - b.mean(axis=0)
    with np.errstate(divide="ignore", invalid="ignore"):
        r = (a * b).sum(axis=0) / np.sqrt((a * a).sum(axis=0) * (b * b).sum(axis=0))
    r = np.where(np.isnan(r), 1.0, r)  # constant noise: as dependent as it gets
    p = 2.0 * stats.norm.sf(np.sqrt(pairs) * np.abs(r))
    return float(min(1.0, x.shape[1] * p.min()))


def pairs_independence_pvalue(outcomes: ArrayLike, min_expected: float = 5.0) -> float:
    """Independence of discrete outcomes of adjacent queries: a chi-square test on the
    contingency table of (outcome 2i, outcome 2i + 1) over disjoint pairs (Pearson 1900). Rare
    outcomes (expected cell count below ``min_expected``) are pooled into one; a single outcome
    gives p = 1 (nothing to test)."""
    y = np.asarray(outcomes).ravel()
    pairs = y.size // 2
    first, second = y[0:2 * pairs:2], y[1:2 * pairs:2]
    values, codes = np.unique(np.concatenate([first, second]), return_inverse=True)
    freq = np.bincount(codes, minlength=values.size) / (2.0 * pairs)
    common = pairs * freq**2 >= min_expected  # cells between common outcomes are expected >= it
    keep = np.where(common, np.arange(values.size), values.size)  # rare -> one pooled code
    _, merged = np.unique(keep[codes], return_inverse=True)
    k = int(merged.max()) + 1
    if k < 2:
        return 1.0
    table = np.zeros((k, k))
    np.add.at(table, (merged[:pairs], merged[pairs:]), 1.0)
    table = table[table.sum(axis=1) > 0][:, table.sum(axis=0) > 0]
    if min(table.shape) < 2:
        return 1.0
    return float(stats.chi2_contingency(table, correction=False).pvalue)
