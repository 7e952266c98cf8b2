"""What an (epsilon, delta) guarantee means for an attacker (docs/privacy-math.md §11).

Differential privacy is a limit on hypothesis tests (L. Wasserman, S. Zhou, "A Statistical
Framework for Differential Privacy", JASA 2010; P. Kairouz, S. Oh, P. Viswanath, "The Composition
Theorem for Differential Privacy", ICML 2015, Theorem 2.1): a mechanism is (epsilon, delta)-DP
exactly when every test of "this person's record is in the data" against "it is not", run on the
mechanism's output, has false-positive rate alpha and false-negative rate beta with

    alpha + e^epsilon beta >= 1 - delta   and   e^epsilon alpha + beta >= 1 - delta.

The functions below read those two inequalities for a reader of a report.
"""

from __future__ import annotations

import math


def _check(epsilon: float, delta: float) -> None:
    if not (epsilon >= 0 and math.isfinite(epsilon)) or not 0 <= delta < 1:
        raise ValueError(f"need a finite epsilon >= 0 and delta in [0, 1), got {epsilon!r}, "
                         f"{delta!r}")


def _exp(epsilon: float) -> float:
    """e^epsilon, infinite past the largest float (epsilon above about 709.78)."""
    try:
        return math.exp(epsilon)
    except OverflowError:
        return math.inf


def likelihood_factor(epsilon: float) -> float:
    """e^epsilon: the most one person's record can multiply the probability of any outcome of
    what is published (beyond delta); infinite where it is past the largest float."""
    _check(epsilon, 0.0)
    return _exp(epsilon)


def max_true_positive_rate(epsilon: float, delta: float, fpr: float) -> float:
    """The largest true-positive rate 1 - beta of a membership test whose false-positive rate
    is ``fpr``: min(e^eps fpr + delta, 1 - e^-eps (1 - delta - fpr), 1), from the two
    inequalities of the module's docstring."""
    _check(epsilon, delta)
    if not 0 <= fpr <= 1:
        raise ValueError(f"fpr must be in [0, 1], got {fpr!r}")
    scaled = _exp(epsilon) * fpr if fpr else 0.0  # not inf * 0
    return min(1.0, scaled + delta, 1.0 - math.exp(-epsilon) * max(0.0, 1.0 - delta - fpr))


def max_membership_accuracy(epsilon: float, delta: float) -> float:
    """The best accuracy of a guess "in or out" about one record that is in the data with
    probability 1/2: adding the two inequalities gives alpha + beta >= 2 (1 - delta) /
    (1 + e^eps), so the accuracy 1 - (alpha + beta) / 2 is at most (e^eps + delta) /
    (1 + e^eps)."""
    _check(epsilon, delta)
    return 1.0 - (1.0 - delta) / (1.0 + _exp(epsilon))  # the same, finite for any epsilon
