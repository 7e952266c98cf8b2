"""The statistics of ``analysis.audit``: Clopper-Pearson, the epsilon lower bound, event search,
and the direct noise tests, on draws whose distribution is known."""

import numpy as np
import pytest
from scipy import stats

from analysis.audit import (
    adjacent_correlation_pvalue,
    audit_counts,
    bonferroni,
    clopper_pearson,
    epsilon_lower_bound,
    likelihood_ratio_events,
    noise_fit,
    pairs_independence_pvalue,
)


def test_clopper_pearson_closed_forms() -> None:
    # k = 0: high = 1 - (alpha/2)^(1/n); k = n: low = (alpha/2)^(1/n).
    low, high = clopper_pearson([0, 10], [10, 10], 0.05)
    assert low[0] == 0.0 and high[1] == 1.0
    assert high[0] == pytest.approx(1 - 0.025 ** 0.1)
    assert low[1] == pytest.approx(0.025 ** 0.1)
    low, high = clopper_pearson(500, 1000, 0.05)
    assert low < 0.5 < high and high - 0.5 == pytest.approx(0.5 - low)


def test_clopper_pearson_covers() -> None:
    rng = np.random.default_rng(1)
    k = rng.binomial(200, 0.03, size=4000)
    low, high = clopper_pearson(k, 200, 0.1)
    assert np.mean((low <= 0.03) & (high >= 0.03)) >= 0.9


def test_epsilon_lower_bound() -> None:
    # Far more draws than needed: the bound approaches ln(p / q) from below.
    eps = epsilon_lower_bound(20_000_000, 10**8, 10_000_000, 10**8, 0.0, 0.05)
    assert np.log(2) - 0.01 < eps < np.log(2)
    # delta eats the event's probability: nothing is learnt.
    assert epsilon_lower_bound(10, 1000, 1, 1000, 0.5, 0.05) == 0.0
    # A smaller alpha (Bonferroni) gives a smaller bound.
    assert (epsilon_lower_bound(300, 1000, 100, 1000, 0.0, bonferroni(0.05, 10))
            < epsilon_lower_bound(300, 1000, 100, 1000, 0.0, 0.05))


def test_events_are_likelihood_ratio_prefixes() -> None:
    events = likelihood_ratio_events([10, 0, 50, 30], [10, 0, 5, 60])
    # order by ratio: outcome 2 (10.1), 0 (1), 3 (0.5); outcome 1 never seen
    assert events.tolist() == [[False, False, True, False], [True, False, True, False]]


def test_audit_counts_is_a_lower_bound() -> None:
    # Randomised response with e^eps = 3: the bound is positive and below ln 3 (one-sided
    # coverage at 95 %; in 40 repetitions at most a few exceed it).
    rng = np.random.default_rng(2)
    p = np.array([0.75, 0.25])
    over = 0
    for _ in range(40):
        sel = np.stack([rng.multinomial(20_000, p), rng.multinomial(20_000, p[::-1])])
        est = np.stack([rng.multinomial(20_000, p), rng.multinomial(20_000, p[::-1])])
        best = audit_counts(sel[None], est[None], 20_000, 1e-5, 0.95)
        assert best is not None and best.epsilon_lower > 0.9
        over += best.epsilon_lower > np.log(3)
    assert over <= 6


def test_noise_fit_rejects_a_wrong_scale_or_family() -> None:
    rng = np.random.default_rng(3)
    x = rng.normal(0.0, 6.0, 100_000)
    assert noise_fit(x, "gaussian", 6.0).pvalue > 1e-6
    assert noise_fit(x, "gaussian", 3.0).pvalue < 1e-12
    assert noise_fit(x, "laplace", 6.0 / np.sqrt(2)).pvalue < 1e-12
    assert noise_fit(rng.laplace(0.0, 2.0, 100_000), "laplace", 2.0).pvalue > 1e-6


def test_independence_tests_catch_reuse() -> None:
    rng = np.random.default_rng(4)
    x = rng.normal(size=(20_000, 10))
    assert adjacent_correlation_pvalue(x) > 1e-6
    assert adjacent_correlation_pvalue(np.repeat(x[::2], 2, axis=0)) == 0.0
    assert adjacent_correlation_pvalue(np.ones((100, 3))) < 1e-6
    y = rng.integers(0, 3, 20_000)
    assert pairs_independence_pvalue(y) > 1e-6
    assert pairs_independence_pvalue(np.repeat(y[::2], 2)) < 1e-12
    assert pairs_independence_pvalue(np.zeros(100)) == 1.0


def test_pairs_independence_is_calibrated() -> None:
    rng = np.random.default_rng(5)
    p = [pairs_independence_pvalue(rng.choice(4, 2000, p=[0.5, 0.3, 0.19, 0.01]))
         for _ in range(200)]
    assert stats.kstest(p, "uniform").pvalue > 1e-3
