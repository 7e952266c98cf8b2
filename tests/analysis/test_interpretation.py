"""analysis.interpretation: the hypothesis-testing reading of (epsilon, delta), checked against
the randomised-response mechanism, which meets the bounds with equality."""

from __future__ import annotations

import math

import numpy as np
import pytest

from analysis.interpretation import (
    likelihood_factor,
    max_membership_accuracy,
    max_true_positive_rate,
)


def test_no_privacy_loss_means_no_better_than_chance():
    assert likelihood_factor(0) == 1
    assert max_membership_accuracy(0, 0) == 0.5
    for fpr in (0, 0.01, 0.3, 1):
        assert max_true_positive_rate(0, 0, fpr) == pytest.approx(fpr)


@pytest.mark.parametrize("epsilon", [0.1, 1.0, 2.3, 8.0])
def test_randomised_response_attains_the_bounds(epsilon):
    """Randomised response answers the true bit with probability p = e^eps / (1 + e^eps): it is
    (eps, 0)-DP, and the test "in" when it says in has alpha = 1 - p, 1 - beta = p, and
    accuracy p, the largest the bounds allow."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    assert max_membership_accuracy(epsilon, 0) == pytest.approx(p)
    assert max_true_positive_rate(epsilon, 0, 1 - p) == pytest.approx(p)


def test_the_bounds_grow_with_epsilon_delta_and_fpr():
    grid = np.linspace(0, 6, 25)
    acc = [max_membership_accuracy(e, 1e-5) for e in grid]
    assert all(np.diff(acc) > 0) and acc[-1] < 1
    tpr = [max_true_positive_rate(e, 1e-5, 0.01) for e in grid]
    assert all(np.diff(tpr) >= 0) and tpr[0] == pytest.approx(0.01 + 1e-5)
    assert max_true_positive_rate(2, 1e-5, 0.01) == pytest.approx(math.exp(2) * 0.01 + 1e-5)
    assert 1 - 1e-8 < max_true_positive_rate(20, 0, 0.5) < 1  # 1 - e^-20 / 2
    assert max_true_positive_rate(1, 0, 1) == 1.0
    assert max_membership_accuracy(1, 0.1) > max_membership_accuracy(1, 0)


@pytest.mark.parametrize("args", [(-1, 0), (math.inf, 0), (1, 1), (1, -0.1), (math.nan, 0)])
def test_bad_arguments_are_refused(args):
    with pytest.raises(ValueError):
        max_membership_accuracy(*args)
    with pytest.raises(ValueError, match="fpr"):
        max_true_positive_rate(1, 0, 1.5)


def test_an_epsilon_past_the_largest_exponential_gives_the_limits_not_an_overflow():
    """A toy run's ε of several hundred: e^ε overflows a float past 709.78; the report still
    reads (the factor infinite, the best guesses certain, no test at no false alarm)."""
    assert likelihood_factor(800) == math.inf
    assert max_membership_accuracy(800, 1e-5) == 1.0
    assert max_true_positive_rate(800, 1e-5, 0.01) == 1.0
    assert max_true_positive_rate(800, 1e-5, 0.0) == pytest.approx(1e-5)
    assert max_membership_accuracy(700, 0) == pytest.approx(1.0)  # still finite there
