"""Statistics of membership inference and of auditing privacy with one training run.

A membership-inference attack gives every audited record a score, higher meaning "more likely a
member". This module turns scores into the figures an audit reports, without knowing anything of
the models:

* **ROC figures**: the area under the ROC curve (the Mann-Whitney statistic, ties counted half;
  H. B. Mann, D. R. Whitney 1947) and the true-positive rate at a low false-positive rate, the
  figure Carlini et al. argue for ("Membership Inference Attacks From First Principles", IEEE
  S&P 2022, §III).
* **Attack scores**: the loss-threshold attack (S. Yeom, I. Giacomelli, M. Fredrikson, S. Jha,
  "Privacy Risk in Machine Learning: Analyzing the Connection to Overfitting", CSF 2018, §3.2:
  a member has a lower loss, so the score is minus the loss, log p_y) and the offline
  likelihood-ratio attack (Carlini et al. 2022, §VI-C, "offline" with a global variance): the
  target's logit-scaled confidence phi = log(p_y / (1 - p_y)) against its distribution under
  reference models that never saw the record, N(mu_out(x), sigma_out^2); the one-sided test
  statistic (phi - mu_out(x)) / sigma_out ranks records exactly as the likelihood ratio does.
* **A lower bound on epsilon from one training run** (T. Steinke, M. Nasr, M. Jagielski,
  "Privacy Auditing with One (1) Training Run", NeurIPS 2023). m audit records ("canaries") are
  each included in the training data by an independent fair coin S_i; the auditor sees the
  trained model only, guesses "member" for the k+ highest scores and "non-member" for the k-
  lowest, and abstains on the rest: r = k+ + k- guesses, v of them correct. If training is
  (epsilon, delta)-DP with respect to each canary, then (their Theorem 5.2, with the p-value of
  their Appendix D)

      P[V >= v] <= P[B >= v] + 2 m delta max_{1 <= i <= v} P[v - i <= B < v] / i,
      B ~ Binomial(r, e^epsilon / (1 + e^epsilon)),

  so an observed v whose right-hand side is below beta rejects epsilon at level beta, and the
  largest epsilon rejected is a lower bound with confidence 1 - beta. For pure DP (delta = 0)
  this is their Theorem 3.1: correct guesses are dominated by randomised response's.

The guess counts (k+, k-) are searched over a fixed grid; each pair is one test, so the level is
Bonferroni-corrected over the grid (and over whatever else the caller searched, ``tests``):
the bound holds with the stated confidence whichever pair turns out best.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy import special, stats

# Fractions of the canaries guessed on each side (k+ / m and k- / m); 0 means no guess on that
# side. Every pair but (0, 0) is one candidate.
GUESS_FRACTIONS: tuple[float, ...] = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5)
BISECTION_STEPS = 32
EPSILON_CEILING = 30.0   # above any bound 10^9 guesses can give (ln 10^9 < 21)


# -- attack scores ----------------------------------------------------------------------------


def loss_scores(log_probs: ArrayLike, labels: ArrayLike) -> NDArray[np.float64]:
    """Yeom et al. 2018's loss-threshold score: log p_y (minus the cross-entropy), ``[..., n]``
    from log-probabilities ``[..., n, classes]`` and labels ``[n]``."""
    lp = np.asarray(log_probs, np.float64)
    y = np.asarray(labels, np.int64)
    return np.take_along_axis(lp, np.broadcast_to(y[:, None], (*lp.shape[:-1], 1)),
                              axis=-1)[..., 0]


def logit_confidence(log_probs: ArrayLike, labels: ArrayLike) -> NDArray[np.float64]:
    """phi = log(p_y / (1 - p_y)) = log p_y - log sum_{j != y} p_j (Carlini et al. 2022, §IV-B:
    the logit scaling makes the confidence of one record over training runs near Gaussian),
    computed in log space so that p_y near 1 stays finite; ``[..., n]``."""
    lp = np.asarray(log_probs, np.float64)
    y = np.asarray(labels, np.int64)
    own = np.arange(lp.shape[-1]) == y[:, None]
    rest = special.logsumexp(np.where(own, -np.inf, lp), axis=-1)
    return loss_scores(lp, y) - rest


@dataclass(frozen=True)
class OfflineLiRA:
    """The offline likelihood-ratio scores and the reference statistics they used."""

    scores: NDArray[np.float64]
    mu_out: NDArray[np.float64]
    sigma_out: float


def offline_lira(target: ArrayLike, references: ArrayLike) -> OfflineLiRA:
    """Carlini et al. 2022's offline attack with a global variance (§VI-C): ``target`` ``[n]``
    is phi of the audited model on each record, ``references`` ``[models, n]`` phi of reference
    models trained without any of the records. Score (phi - mu_out(x)) / sigma_out, where
    mu_out(x) is the references' mean on record x and sigma_out^2 the variance of phi about it,
    pooled over records and models (one reference model: sigma_out = 1, the ranking is the
    same)."""
    phi = np.asarray(target, np.float64)
    ref = np.asarray(references, np.float64)
    if ref.ndim != 2 or ref.shape[1] != phi.shape[0] or ref.shape[0] < 1:
        raise ValueError(f"references must be [models >= 1, {phi.shape[0]}], got {ref.shape}")
    mu = ref.mean(axis=0)
    sigma = float(np.sqrt(((ref - mu) ** 2).mean())) if ref.shape[0] > 1 else 1.0
    sigma = sigma if sigma > 0 else 1.0
    return OfflineLiRA((phi - mu) / sigma, mu, sigma)


# -- ROC figures ------------------------------------------------------------------------------


def _check(scores: ArrayLike, members: ArrayLike) -> tuple[NDArray[np.float64], NDArray[np.bool_]]:
    s = np.asarray(scores, np.float64)
    m = np.asarray(members, bool)
    if s.ndim != 1 or s.shape != m.shape:
        raise ValueError(f"scores and members must be 1-d of one length, got {s.shape}, "
                         f"{m.shape}")
    if not m.any() or m.all():
        raise ValueError("need at least one member and one non-member")
    if not np.isfinite(s).all():
        raise ValueError("scores must be finite")
    return s, m


def auc(scores: ArrayLike, members: ArrayLike) -> float:
    """Area under the ROC curve: P[score(member) > score(non-member)] + P[tie] / 2, by the
    Mann-Whitney U statistic on mid-ranks."""
    s, m = _check(scores, members)
    ranks = stats.rankdata(s)
    n1, n0 = int(m.sum()), int((~m).sum())
    return float((ranks[m].sum() - n1 * (n1 + 1) / 2.0) / (n1 * n0))


def roc_curve(scores: ArrayLike, members: ArrayLike
              ) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
    """(false-positive rates, true-positive rates) of every threshold "score >= t", from the
    strictest (nothing guessed: (0, 0)) to the loosest ((1, 1)); tied scores move together."""
    s, m = _check(scores, members)
    order = np.argsort(-s, kind="stable")
    s, m = s[order], m[order]
    last = np.r_[np.flatnonzero(np.diff(s) != 0), s.size - 1]  # end of each tie group
    tp = np.cumsum(m)[last]
    fp = np.cumsum(~m)[last]
    return np.r_[0.0, fp / (~m).sum()], np.r_[0.0, tp / m.sum()]


def tpr_at_fpr(scores: ArrayLike, members: ArrayLike, fpr: ArrayLike) -> NDArray[np.float64]:
    """The highest true-positive rate of a threshold whose false-positive rate is at most each
    ``fpr`` (Carlini et al. 2022, §III-B)."""
    f, t = roc_curve(scores, members)
    target = np.asarray(fpr, np.float64)
    ok = f[None, :] <= target.reshape(-1, 1)
    return np.where(ok, t[None, :], 0.0).max(axis=1).reshape(target.shape)


# -- one training run ---------------------------------------------------------------------------


def _log_binom_pmf(k: NDArray[np.float64], r: NDArray[np.float64], q: NDArray[np.float64]
                   ) -> NDArray[np.float64]:
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (special.gammaln(r + 1) - special.gammaln(k + 1) - special.gammaln(r - k + 1)
               + special.xlogy(k, q) + special.xlog1py(r - k, -q))
    return np.where((k >= 0) & (k <= r), out, -np.inf)


def one_run_pvalue(m: int, r: ArrayLike, v: ArrayLike, epsilon: ArrayLike, delta: float
                   ) -> NDArray[np.float64]:
    """P-value of v or more correct guesses out of r, among m canaries, under the null
    hypothesis that training is (epsilon, delta)-DP (Steinke et al. 2023, Theorem 5.2 and
    Appendix D): P[B >= v] + 2 m delta max_{1 <= i <= v} P[v - i <= B < v] / i with
    B ~ Binomial(r, e^eps / (1 + e^eps)), capped at 1. Broadcasts over r, v and epsilon."""
    if not 0.0 <= delta <= 1.0:
        raise ValueError(f"delta must be in [0, 1], got {delta!r}")
    r_, v_, eps = np.broadcast_arrays(np.asarray(r, np.float64), np.asarray(v, np.float64),
                                      np.asarray(epsilon, np.float64))
    if np.any((v_ < 0) | (v_ > r_) | (r_ > m)) or np.any(eps < 0):
        raise ValueError("need 0 <= v <= r <= m and epsilon >= 0")
    q = special.expit(eps)
    p = stats.binom.sf(v_ - 1, r_, q)
    if delta > 0:
        width = int(v_.max()) if v_.size else 0
        i = np.arange(1, width + 1, dtype=np.float64)
        pmf = np.exp(_log_binom_pmf(v_[..., None] - i, r_[..., None], q[..., None]))
        pmf = np.where(i <= v_[..., None], pmf, 0.0)
        ratio = np.cumsum(pmf, axis=-1) / i
        p = p + 2.0 * m * delta * (ratio.max(axis=-1, initial=0.0))
    return np.minimum(p, 1.0)


def one_run_epsilon(m: int, r: ArrayLike, v: ArrayLike, delta: float, beta: float
                    ) -> NDArray[np.float64]:
    """The largest epsilon that v correct guesses out of r (m canaries) reject at level beta:
    a lower bound on epsilon with confidence 1 - beta (Steinke et al. 2023, Appendix D's
    bisection, here over all (r, v) at once); 0 when not even epsilon = 0 is rejected."""
    if not 0.0 < beta < 1.0:
        raise ValueError(f"beta must be in (0, 1), got {beta!r}")
    r_, v_ = np.broadcast_arrays(np.asarray(r, np.float64), np.asarray(v, np.float64))
    lo = np.zeros(r_.shape)
    hi = np.full(r_.shape, EPSILON_CEILING)
    rejected_at_zero = one_run_pvalue(m, r_, v_, lo, delta) < beta
    for _ in range(BISECTION_STEPS):
        mid = (lo + hi) / 2.0
        below = one_run_pvalue(m, r_, v_, mid, delta) < beta
        lo = np.where(below, mid, lo)
        hi = np.where(below, hi, mid)
    return np.where(rejected_at_zero, lo, 0.0)


def guess_grid(m: int, fractions: tuple[float, ...] = GUESS_FRACTIONS
               ) -> NDArray[np.int64]:
    """The (k+, k-) pairs searched ``[candidates, 2]``: each fraction of m on each side, rounded
    down, without (0, 0), duplicates or pairs of more than m guesses."""
    k = np.unique(np.floor(np.asarray(fractions) * m).astype(np.int64))
    pairs = np.stack(np.meshgrid(k, k, indexing="ij"), -1).reshape(-1, 2)
    pairs = pairs[(pairs.sum(axis=1) > 0) & (pairs.sum(axis=1) <= m)]
    return np.unique(pairs, axis=0)


@dataclass(frozen=True)
class OneRunBound:
    """The best (k+, k-) of the grid: its guesses, correct guesses and epsilon lower bound, at
    confidence ``confidence`` after correcting for ``tests`` tests in all."""

    epsilon_lower: float
    k_plus: int
    k_minus: int
    guesses: int
    correct: int
    canaries: int
    confidence: float
    tests: int


def one_run_audit(scores: ArrayLike, members: ArrayLike, delta: float, confidence: float,
                  other_tests: int = 1,
                  fractions: tuple[float, ...] = GUESS_FRACTIONS) -> OneRunBound:
    """Steinke et al. 2023's audit of one training run: guess "member" for the k+ highest
    ``scores`` and "non-member" for the k- lowest, for every (k+, k-) of ``guess_grid``; each
    guess count's bound at level (1 - confidence) / (grid size x ``other_tests``), so that the
    best one (and the best of ``other_tests`` such audits, e.g. of several attacks) holds with
    probability ``confidence``. ``members`` (the coin flips) are used only to count correct
    guesses; ties in scores are broken by position, which does not depend on them."""
    s, mem = _check(scores, members)
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if other_tests < 1:
        raise ValueError(f"other_tests must be >= 1, got {other_tests!r}")
    m = s.size
    grid = guess_grid(m, fractions)
    order = np.argsort(-s, kind="stable")
    hits_top = np.r_[0, np.cumsum(mem[order])]              # members among the j highest
    hits_bottom = np.r_[0, np.cumsum(~mem[order][::-1])]    # non-members among the j lowest
    kp, km = grid[:, 0], grid[:, 1]
    correct = hits_top[kp] + hits_bottom[km]
    tests = len(grid) * other_tests
    level = (1.0 - confidence) / tests
    # The pure-DP bound of every pair first (cheap); delta > 0 only lowers a pair's bound, so
    # only the pairs whose pure bound beats the delta bound of the best pure one can win.
    eps = one_run_epsilon(m, kp + km, correct, 0.0, level)
    if delta > 0:
        lead = int(np.argmax(eps))
        lead_eps = one_run_epsilon(m, kp[lead] + km[lead], correct[lead], delta, level)
        rivals = np.flatnonzero(eps > lead_eps)
        exact = np.zeros_like(eps)
        exact[lead] = lead_eps
        exact[rivals] = one_run_epsilon(m, kp[rivals] + km[rivals], correct[rivals], delta,
                                        level)
        eps = exact
    best = int(np.argmax(eps))
    return OneRunBound(float(eps[best]), int(kp[best]), int(km[best]), int(kp[best] + km[best]),
                       int(correct[best]), m, confidence, tests)
