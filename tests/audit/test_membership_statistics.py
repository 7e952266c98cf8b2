"""``analysis.membership``: the one-run bound against brute force and an independent loop, its
coverage and tightness on randomised response, ROC figures against scikit-learn, and the attack
scores."""

import math

import numpy as np
import pytest
from scipy import stats
from sklearn.metrics import roc_auc_score, roc_curve

from analysis.membership import (
    auc,
    guess_grid,
    logit_confidence,
    loss_scores,
    offline_lira,
    one_run_audit,
    one_run_epsilon,
    one_run_pvalue,
    tpr_at_fpr,
)


def loop_pvalue(m: int, r: int, v: int, eps: float, delta: float) -> float:
    """Steinke et al. 2023, Appendix D, written as a plain loop (the reference)."""
    q = 1.0 / (1.0 + math.exp(-eps))
    tail = stats.binom.sf(v - 1, r, q)
    best, total = 0.0, 0.0
    for i in range(1, v + 1):
        total += stats.binom.pmf(v - i, r, q)
        best = max(best, total / i)
    return min(1.0, tail + 2 * m * delta * best)


@pytest.mark.parametrize(("r", "v", "beta"), [(100, 90, 0.05), (500, 300, 0.01), (20, 20, 0.05)])
def test_pure_dp_bound_is_the_binomial_tail_inverted(r: int, v: int, beta: float) -> None:
    # Brute force: the largest epsilon on a fine grid whose binomial tail is below beta.
    grid = np.linspace(0.0, 8.0, 400_001)
    tail = stats.binom.sf(v - 1, r, 1.0 / (1.0 + np.exp(-grid)))
    expected = grid[tail < beta].max()
    assert one_run_epsilon(1000, r, v, 0.0, beta) == pytest.approx(expected, abs=3e-5)


def test_pvalue_with_delta_matches_the_loop() -> None:
    for m, r, v, eps, delta in [(1000, 100, 90, 1.0, 1e-4), (5000, 800, 500, 0.3, 1e-5),
                                (200, 50, 50, 2.5, 1e-3), (300, 40, 12, 0.0, 1e-5)]:
        assert one_run_pvalue(m, r, v, eps, delta) == pytest.approx(
            loop_pvalue(m, r, v, eps, delta), rel=1e-9)
    # delta only ever weakens the bound
    assert one_run_epsilon(10**4, 1000, 900, 1e-5, 0.05) < one_run_epsilon(10**4, 1000, 900,
                                                                            0.0, 0.05)


def test_no_correct_guess_beyond_chance_gives_zero() -> None:
    assert one_run_epsilon(1000, 100, 50, 1e-5, 0.05) == 0.0
    assert one_run_epsilon(1000, 0, 0, 1e-5, 0.05) == 0.0


def randomised_response(rng: np.random.Generator, m: int, eps: float
                        ) -> tuple[np.ndarray, np.ndarray]:
    """Coin flips and the scores of eps-DP randomised response: each canary's bit is reported
    truthfully with probability e^eps / (1 + e^eps); a little independent noise breaks ties."""
    members = rng.random(m) < 0.5
    truthful = rng.random(m) < 1.0 / (1.0 + math.exp(-eps))
    bit = np.where(truthful, members, ~members)
    return bit + 0.01 * rng.random(m), members


def test_one_run_audit_covers_and_is_tight_on_randomised_response() -> None:
    rng = np.random.default_rng(7)
    eps = 1.0
    bounds = [one_run_audit(*randomised_response(rng, 2000, eps), 1e-5, 0.95).epsilon_lower
              for _ in range(40)]
    assert sum(b > eps for b in bounds) <= 4        # holds with 95 % each (here: never fails)
    big = one_run_audit(*randomised_response(rng, 100_000, eps), 0.0, 0.95)
    assert 0.85 * eps < big.epsilon_lower <= eps     # many canaries: close to the truth
    assert big.guesses > 0 and big.tests == len(guess_grid(100_000))


def test_scores_independent_of_membership_give_nothing() -> None:
    rng = np.random.default_rng(8)
    hits = [one_run_audit(rng.normal(size=1000), rng.random(1000) < 0.5, 1e-5, 0.95,
                          other_tests=2).epsilon_lower > 0 for _ in range(40)]
    assert sum(hits) <= 4


def test_auc_and_tpr_match_scikit_learn() -> None:
    rng = np.random.default_rng(9)
    members = rng.random(3000) < 0.5
    scores = np.round(rng.normal(size=3000) + members, 1)   # rounding makes ties
    assert auc(scores, members) == pytest.approx(roc_auc_score(members, scores), abs=1e-12)
    fpr, tpr, _ = roc_curve(members, scores)
    for target in (0.001, 0.01, 0.1, 0.5):
        expected = tpr[fpr <= target].max()
        assert tpr_at_fpr(scores, members, [target])[0] == pytest.approx(expected)
    with pytest.raises(ValueError):
        auc(scores, np.ones(3000, bool))


def test_attack_scores() -> None:
    p = np.array([[0.7, 0.2, 0.1], [1.0 - 1e-15, 5e-16, 5e-16]])
    lp = np.log(p)
    assert loss_scores(lp, [0, 1]) == pytest.approx([np.log(0.7), np.log(5e-16)])
    phi = logit_confidence(lp, np.array([0, 0]))
    assert phi[0] == pytest.approx(np.log(0.7 / 0.3))
    assert np.isfinite(phi[1]) and phi[1] > 30
    # Offline LiRA: mean and pooled deviation of the references, per record.
    refs = np.array([[0.0, 1.0, 2.0], [2.0, 3.0, 4.0]])
    lira = offline_lira(np.array([1.0, 5.0, 3.0]), refs)
    assert lira.mu_out == pytest.approx([1.0, 2.0, 3.0]) and lira.sigma_out == pytest.approx(1.0)
    assert lira.scores == pytest.approx([0.0, 3.0, 0.0])
    with pytest.raises(ValueError):
        offline_lira(np.zeros(3), np.zeros((2, 4)))
