"""The report's reading of the epsilons it lets you publish: what each one allows an attacker
(``analysis.interpretation``; docs/privacy-math.md §11). Only public figures go in: the released
smooth-sensitivity epsilon, the data-independent one and delta."""

from __future__ import annotations

import html
import math
from typing import Any

from analysis.interpretation import (
    likelihood_factor,
    max_membership_accuracy,
    max_true_positive_rate,
)

# The false-positive rate at which the report states the best true-positive rate (Carlini et
# al., "Membership Inference Attacks From First Principles", IEEE S&P 2022, argue for low rates).
FALSE_POSITIVE_RATE = 0.01
# In the order of preference for the figure to quote: the sanitised one where released (PATE
# 2018's analysis), else the one that rests on the least (docs/privacy-math.md §12).
_PUBLISHABLE = (("epsilon_smooth_sensitivity", "sanitised, released"),
                ("epsilon_every_answered", "data-independent, every query answered"),
                ("epsilon_data_independent", "data-independent"))


def epsilon_meaning(row: dict[str, Any]) -> list[dict[str, Any]]:
    """For each publishable epsilon of a summary-table row: the likelihood factor, the best
    accuracy of a membership guess at even odds and the best true-positive rate at
    ``FALSE_POSITIVE_RATE``, at the row's delta."""
    delta = row.get("delta")
    if not isinstance(delta, int | float) or not 0 <= delta < 1:
        return []
    found = []
    for key, name in _PUBLISHABLE:
        epsilon = row.get(key)
        if not isinstance(epsilon, int | float) or not math.isfinite(epsilon) or epsilon < 0:
            continue
        found.append({
            "epsilon": name, "value": epsilon, "delta": delta,
            # None past the largest float (JSON has no infinity): e^ε said as "∞"
            "likelihood_factor": (factor if math.isfinite(factor := likelihood_factor(epsilon))
                                  else None),
            "membership_accuracy": max_membership_accuracy(epsilon, delta),
            "false_positive_rate": FALSE_POSITIVE_RATE,
            "true_positive_rate": max_true_positive_rate(epsilon, delta, FALSE_POSITIVE_RATE)})
    return found


# What each publishable figure rests on (docs/privacy-math.md §12), said beside the figure to quote.
_RESTS_ON = {
    "sanitised, released": "PATE 2018's data-dependent analysis, its noise drawn once",
    "data-independent, every query answered": "the fewest assumptions of the three",
    "data-independent": "the answers as the ledger charged them"}


# Who the figures protect, as the teachers' partition sets it (pate.data.partitions).
_NEIGHBOURS = {
    "position": "changing their record in the private data (changing, not adding or removing: "
                "the teachers' partition deals rows by position)",
    "record": "adding their record to the private data or removing it (as DP-SGD's ε does: "
              "the teachers' partition deals each record by a hash of its content, so no other "
              "teacher's rows move; changing a record is a removal and an addition)",
    "key": "adding all of their records to the private data or removing them (every row the "
           "data's key column names as theirs reaches one teacher, dealt by a hash of the key; "
           "DP-SGD's ε covers one record)"}


_SANITISED = (
    "The sanitised ε is PATE 2018's data-dependent analysis, as its authors publish it; it "
    "covers the answers and its own release, and is smaller when the teachers agree. It is one "
    "noisy draw: the analysis' own figure plus noise plus two standard deviations of that "
    "noise, so it is at least the analysis' figure with probability 97.7 % (a draw is often "
    "well above it, seldom below). That analysis is not a proven bound on each query's "
    "Rényi divergence (docs/privacy-math.md §12). <code>pate run</code> releases it in "
    "<code>student/metrics.json</code>, a public file; once it is published, the "
    "data-independent ε no longer covers everything published, since that release reads the "
    "votes. ")


def _percent(share: float) -> str:
    """A share as a percentage that does not round a near-certainty up to 100 %."""
    pct = 100 * share
    if pct < 99.9:
        return f"{pct:.1f} %"
    return f"{pct:.2f} %" if pct < 99.99 else "over 99.99 %"


def _factor(value: float | None) -> str:
    """e^ε as a reader takes it in: three digits, or its power of ten from a million on; None
    (past the largest float) as ∞."""
    if value is None or not math.isfinite(value):
        return "∞"
    if value < 999_500:  # what rounds to three digits below a million
        return f"{value:.3g}"
    return f"over 10<sup>{math.floor(math.log10(value))}</sup>"


def budget_and_charged(report: dict[str, Any]) -> tuple[float | None, float | None]:
    """A report's budget (its config's, public) and what its ledger charged (the PATE row's
    ``epsilon_spent``); None where it has none."""
    budget = ((report.get("config") or {}).get("aggregator") or {}).get("budget_epsilon")
    return budget, report["table"][0].get("epsilon_spent") if report["table"] else None


def above_budget(held: dict[str, Any], budget: float | None, charged: float | None,
                 epsilon: str = "ε") -> str | None:
    """Why the figure to quote (``held``: ``epsilon_meaning``'s first) is above the
    ``budget`` though the budget held (the ledger ``charged`` within it, in all): what it
    counts besides (docs/privacy-math.md §12). None where it is not above the budget, or the
    charge is not within it (a config's budget that is not the ledger's). ``epsilon``: the
    letter's spelling."""
    if budget is None or charged is None or not charged <= budget < held["value"]:
        return None
    return (f"The figure to quote is above the budget ({epsilon} = {budget:g}), yet the budget "
            f"was not exceeded: the ledger charged {epsilon} = {charged:.4g} in all, the "
            "data-independent cost of the answers as they came. The figure to quote counts more: "
            + (f"its own release and two standard deviations of its noise besides the answers "
               f"(with few teachers the sanitised {epsilon} is the larger: a run can decide not "
               "to release it, before asking, with release_sanitised = false)."
               if held["epsilon"] == "sanitised, released" else
               "every query asked as if the teachers had answered it."))


def meaning_html(meaning: list[dict[str, Any]], budget: float | None = None,
                 charged: float | None = None, partition: str = "position") -> str:
    """The report's section: the definition in words, one row per epsilon, the figure to
    quote and what it rests on; where that figure is above the ``budget``, why, with what the
    ledger ``charged``; the neighbouring datasets as the teachers' ``partition`` sets them
    (``pate.data.partitions``)."""
    if not meaning:
        return "<p>No publishable epsilon yet: the student has asked nothing.</p>"
    delta = meaning[0]["delta"]
    # the figure to quote: the sanitised epsilon where one was released (it covers everything
    # published), else the data-independent one of every query answered (_PUBLISHABLE's order)
    held = meaning[0]
    weak = ("" if held["membership_accuracy"] < 0.99 else
            f'<p class="note">At ε = {held["value"]:.3g} the guarantee rules out almost no '
            "attack: a guess about one person's record may be right "
            f"{_percent(held['membership_accuracy'])} of the time. An ε of a few units or "
            "less is what a meaningful guarantee needs.</p>")
    why = above_budget(held, budget, charged)
    above = "" if why is None else f'<p class="note">{html.escape(why)}</p>'
    fpr = f"{100 * FALSE_POSITIVE_RATE:g} %"
    rows = "".join(
        f"<tr><td>{html.escape(m['epsilon'])}</td><td>{m['value']:.3g}</td>"
        f"<td>{_factor(m['likelihood_factor'])}</td><td>{_percent(m['membership_accuracy'])}</td>"
        f"<td>{_percent(m['true_positive_rate'])}</td></tr>" for m in meaning)
    return (
        f'<p><b>The figure to quote: ε = {held["value"]:.3g} at δ = {delta:g}</b> (the '
        f"{html.escape(held['epsilon'])} ε, resting on "
        f"{html.escape(_RESTS_ON[held['epsilon']])}), for everything published from this run"
        + ("; that analysis is not a proven bound (below)"
           if held["epsilon"] == "sanitised, released" else "")
        + f".</p>{above}"
        "<p>An ε bounds what it covers (the student and the labels it received; the sanitised "
        "one its own release too), on what it rests on (below, and docs/privacy-math.md §12): "
        f"for any one person, {_NEIGHBOURS[partition]} makes anything those outputs show at "
        f"most e<sup>ε</sup> times as likely, plus at most δ = {delta:g}. Smaller is stronger. "
        "Against an attacker who knows every other record and how the run was made, that "
        "means (the figures in the order they are preferred for quoting):</p>"
        "<table><thead><tr><th>ε</th><th>value</th><th>e<sup>ε</sup>: the most one record "
        "multiplies the chance of any outcome</th><th>best accuracy of a guess which of two "
        "records a person's is (even odds; 50 % is chance)</th><th>best share of people "
        f"caught at {fpr} false alarms</th></tr></thead><tbody>{rows}</tbody></table>"
        f"{weak}<p>The data-independent ε with every query answered rests on nothing the "
        "votes or the noise decided, and covers the answers alone: it rests on the fewest "
        "assumptions. The data-independent ε charges the answering step only where the threshold "
        "let a query through, as PATE 2018 and the ledger do: a running total, held strictly "
        "by the ledger's budget, fixed in advance (docs/privacy-math.md §12). "
        + (_SANITISED if any(m["epsilon"] == "sanitised, released" for m in meaning) else
           "No sanitised ε was released for these answers (rounds that asked a "
           "<code>pate serve</code>, or <code>release_sanitised = false</code>): the "
           "data-independent ε is the one to publish. ")
        + "Real "
        "attacks usually reach far less than these bounds (<code>pate audit models</code> "
        "measures some). The bounds are the hypothesis-testing reading of differential privacy "
        "(Kairouz, Oh and Viswanath, ICML 2015, Theorem 2.1).</p>")
