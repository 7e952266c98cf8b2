"""The privacy-utility report of a run as data: every figure of ``report.json`` (PATE 2018, Table 1
and its Table 2 analysis), the points of the privacy-utility curve and the figures that go with
them (:mod:`pate.report.figures`). Inputs are ``RunData``.
The report holds private statistics (vote histograms, the data-dependent epsilon): it is for the
data curator and is written with private file modes.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from analysis.costs import realised_rdp_independent
from analysis.mechanisms import MECHANISMS
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from analysis.votes_analysis import PrivacyAnalysis, QuerySegment, analyze_segments
from pate.report.figures import (
    figure_accuracy,
    figure_epsilon_split,
    figure_epsilon_vs_answered,
    figure_plurality_histogram,
    figure_privacy_utility,
    figure_tradeoff,
)
from pate.report.freshness import REPORT_FORMAT
from pate.report.meaning import above_budget, budget_and_charged, epsilon_meaning
from pate.report.run_data import RunData


def _stats(values: NDArray[np.float64]) -> dict[str, float]:
    return {"mean": float(values.mean()), "std": float(values.std()), "min": float(values.min()),
            "max": float(values.max()), "count": int(values.size)}


def analyse(data: RunData) -> PrivacyAnalysis | None:
    """The Table-2 privacy analysis of every round of the run (None before any query)."""
    segments = [QuerySegment(data.votes[s.rows], s.mechanism, s.baseline)
                for s in data.segments]
    return analyze_segments(segments, data.delta) if segments else None


def build_report(data: RunData) -> tuple[dict[str, Any], dict[str, Figure]]:
    """report.json's content and the figures, named as their files under ``figures/``."""
    privacy = analyse(data)
    labels = np.concatenate([s.labels for s in data.segments]) if data.segments else np.zeros(0)
    rows = np.concatenate([s.rows for s in data.segments]) if data.segments else np.zeros(0, int)
    answered = labels >= 0
    label_accuracy = None
    if data.pool_labels is not None and answered.any():
        label_accuracy = float(np.mean(labels[answered] == data.pool_labels[rows[answered]]))
    plurality = data.votes.argmax(axis=1)
    ensemble_accuracy = (float(np.mean(plurality == data.pool_labels))
                         if data.pool_labels is not None else None)

    report: dict[str, Any] = {
        "report_format": REPORT_FORMAT,
        "run": data.name, "dataset": data.dataset, "delta": data.delta,
        "teachers": int(data.votes[0].sum()), "classes": int(data.votes.shape[1]),
        "classes_from": data.classes_from,
        "pool_size": int(data.votes.shape[0]),
        "queries": {"asked": int(labels.size), "answered": int(answered.sum()),
                    "label_accuracy": label_accuracy,
                    "epsilon_data_independent": (prefix_epsilon(data, int(labels.size))
                                                 if labels.size else None),
                    "epsilon_every_answered": (prefix_epsilon(data, int(labels.size), True)
                                               if labels.size else None),
                    "per_round": [{"mechanism": s.mechanism.name, "asked": int(s.labels.size),
                                   "answered": int((s.labels >= 0).sum())}
                                  for s in data.segments]},
        "privacy": None if privacy is None else privacy.to_json(),
        "ensemble": {"plurality_accuracy": ensemble_accuracy},
        "teacher_accuracy": (_stats(data.teacher_accuracies)
                             if data.teacher_accuracies is not None else None),
        "student": data.student, "dpsgd": data.dpsgd, **data.extra,
    }
    report["table"] = summary_table(report)
    report["epsilon_meaning"] = (epsilon_meaning(report["table"][0])  # the PATE row's
                                 if report["privacy"] is not None else [])
    if report["epsilon_meaning"]:  # the figure to quote, first (meaning.py), in the row too:
        quoted = report["epsilon_meaning"][0]  # pate run prints the row
        report["table"][0]["epsilon_to_quote"] = quoted["value"]
        report["epsilon_to_quote"] = {"epsilon": quoted["value"], "delta": quoted["delta"],
                                      "figure": quoted["epsilon"]}
        why = above_budget(quoted, *budget_and_charged(report), epsilon="epsilon")
        if why is not None:  # said where it is quoted: pate run's line, pate status
            report["epsilon_to_quote"]["above_budget"] = why
    figures = {
        "epsilon_vs_answered.png": figure_epsilon_vs_answered(data),
        "plurality_histogram.png": figure_plurality_histogram(data, rows, answered),
        "epsilon_split.png": figure_epsilon_split(data),
        "accuracy.png": figure_accuracy(report, data.teacher_accuracies),
    }
    if data.comparison is not None:
        report["privacy_utility"] = privacy_utility_points(data, data.comparison)
        figures["privacy_utility.png"] = figure_privacy_utility(report["privacy_utility"])
    return report, figures


def prefix_epsilon(data: RunData, count: int, every_answered: bool = False) -> float:
    """Data-independent epsilon, at the run's delta, of the first ``count`` queries asked (rounds
    in order) as realised: ``analysis.costs.realised_rdp_independent`` of each round's asked
    count and count of the teachers' answers, as the ledger charged them; or, with
    ``every_answered``, as if the teachers had answered every one (the worst case, which rests
    on nothing the votes decided: docs/privacy-math.md §12). A function of public counts only,
    so free to publish."""
    orders = default_orders()
    total, left = np.zeros_like(orders), count
    for s in data.segments:
        by_teachers = s.by_teachers[:left]
        answered = by_teachers.size if every_answered else int(by_teachers.sum())
        total = total + realised_rdp_independent(s.mechanism, by_teachers.size, answered,
                                                 orders)
        left -= by_teachers.size
    return epsilon_from_rdp(total, orders, data.delta, warn_at_edge=False)[0]


def privacy_utility_points(data: RunData, comparison: dict[str, Any]) -> dict[str, Any]:
    """Accuracy against epsilon: the students on prefixes of the answers, and the run's
    student, at the realised data-independent epsilon of the queries each used
    (:func:`prefix_epsilon`), and DP-SGD at the epsilons it was trained to."""
    asked = sum(s.rows.size for s in data.segments)
    student = data.student or {}
    points = list(comparison.get("prefixes", []))
    if student.get("accuracy") is not None and asked:
        points.append({"fraction": 1.0, "queries": asked,
                       "answered": int(sum((s.labels >= 0).sum() for s in data.segments)),
                       "accuracy": student["accuracy"]})
    pate = [{**point, "epsilon_data_independent": prefix_epsilon(data, point["queries"])}
            for point in points]
    dpsgd = [{"at": d["at"], "epsilon": d["epsilon"], "accuracy": d["accuracy"]}
             for d in comparison.get("dpsgd", []) if "accuracy" in d]
    sanitised = (comparison.get("student_epsilon") or {}).get("sanitised")
    marked = ([{"epsilon": sanitised, "accuracy": student["accuracy"]}]
              if sanitised is not None and student.get("accuracy") is not None else [])
    return {"pate": pate, "pate_sanitised": marked, "dpsgd": dpsgd, "delta": data.delta}


def _student_name(student: dict[str, Any]) -> str | None:
    """The student's method and, where its metrics name it, its network: ``vat
    (cnn-hog-simclr)``."""
    method, arch = student.get("method"), student.get("arch")
    return f"{method} ({arch})" if method and arch else method


def summary_table(report: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows in the form of PATE 2018's Table 1."""
    rows = []
    privacy = report["privacy"]
    if privacy is not None:
        ss = privacy["smooth_sensitivity"]
        student_eps = (report["student"] or {}).get("epsilon") or {}
        rows.append({
            "method": "PATE: " + " then ".join(MECHANISMS[m].title
                                                for m in privacy["mechanism"].split("+")),
            "student": _student_name(report["student"] or {}),
            "queries_answered": report["queries"]["answered"],
            "epsilon_data_independent": report["queries"]["epsilon_data_independent"],
            "epsilon_every_answered": report["queries"].get("epsilon_every_answered"),
            "epsilon_data_independent_expected": privacy["data_independent"]["epsilon"],
            "epsilon_data_dependent": privacy["data_dependent"]["epsilon"],
            "epsilon_smooth_sensitivity": student_eps.get("data_dependent_sanitised"),
            # a fallback (C5/C6 fail) is the data-independent bound, never released
            "epsilon_smooth_sensitivity_expected": (ss["epsilon"] if ss and not ss.get("fallback")
                                                    else None),
            # without the student's metrics (its training failed after the answers were
            # charged), what the ledger charged for the answers in hand
            "epsilon_spent": student_eps.get("data_independent",
                                             report["queries"]["epsilon_data_independent"]),
            "delta": privacy["delta"],
            "accuracy": (report["student"] or {}).get("accuracy"),
        })
    if report["dpsgd"]:
        d = report["dpsgd"]
        rows.append({
            "method": "DP-SGD baseline", "student": "dpsgd", "queries_answered": None,
            "epsilon_data_independent": d.get("epsilon"), "epsilon_data_dependent": None,
            "epsilon_smooth_sensitivity": None, "epsilon_bayesian": d.get("epsilon_bayesian"),
            "delta": d.get("delta"), "accuracy": d.get("accuracy"),
        })
    return rows


# The summary table's columns that are not for publication (docs/design.md, privacy rule 2).
# statistics of the votes: the analysis' expectations over the threshold's noise
PRIVATE_TABLE_KEYS = frozenset({"epsilon_data_dependent", "epsilon_data_independent_expected",
                                "epsilon_smooth_sensitivity_expected", "epsilon_bayesian"})


def public_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary table without its private columns (docs/design.md, rule 2), and without the
    DP-SGD baseline's row: what ``pate run`` prints, the PATE student's release. The baseline is
    a release of its own (``dpsgd/metrics.json``, DP at its own epsilon, which no ledger
    charges): publishing both spends both."""
    return [{k: v for k, v in row.items() if k not in PRIVATE_TABLE_KEYS} for row in rows
            if row.get("student") != "dpsgd"]


def compare_runs(reports: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Figure]]:
    """Several runs side by side: their table rows and an accuracy-against-epsilon plot."""
    rows = [{"run": r["run"], **row} for r in reports for row in r["table"]]
    return ({"runs": [r["run"] for r in reports], "table": rows},
            {"tradeoff.png": figure_tradeoff(rows)})
