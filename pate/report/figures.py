"""The privacy-utility report of a run: every figure in one JSON object, the paper's figures as
PNGs and a self-contained HTML page (PATE 2018, Table 1 and Figures 4 and 5).

Inputs are plain arrays and dictionaries (``RunData``); reading a run directory is
``pate.report.run_report``'s job.
The report holds private statistics (vote histograms, the data-dependent epsilon): it is for the
data curator and is written with private file modes.
"""

from __future__ import annotations

import base64
import html
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import NDArray

from analysis.costs import realised_rdp_independent
from analysis.cumulative import cumulative_cost
from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    Mechanism,
)
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from analysis.votes_analysis import PrivacyAnalysis, QuerySegment, analyze_segments
from pate.report.freshness import REPORT_FORMAT
from pate.report.meaning import epsilon_meaning, meaning_html


@dataclass(frozen=True)
class Segment:
    """Queries answered by one aggregator: rows of the votes matrix, what came back, and which
    answers the teachers gave (the rest of the answers are Interactive-GNMax's student label)."""

    rows: NDArray[np.int64]
    mechanism: Mechanism
    labels: NDArray[np.int64]                 # -1 = no answer
    by_teachers: NDArray[np.bool_]
    baseline: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class RunData:
    name: str
    dataset: str
    delta: float
    votes: NDArray[np.int64]                  # PRIVATE: every pool row
    pool_labels: NDArray[np.int64] | None     # true labels of the pool rows (public data)
    segments: list[Segment]
    lnmax_scale: float
    teacher_accuracies: NDArray[np.float64] | None = None
    student: dict[str, Any] | None = None
    dpsgd: dict[str, Any] | None = None
    comparison: dict[str, Any] | None = None  # PRIVATE: comparison/metrics.json (owner only)
    classes_from: str | None = None           # where the label set came from (public schema)
    extra: dict[str, Any] = field(default_factory=dict)


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


def prefix_epsilon(data: RunData, count: int) -> float:
    """Data-independent epsilon, at the run's delta, of the first ``count`` queries asked (rounds
    in order) as realised: ``analysis.costs.realised_rdp_independent`` of each round's asked
    count and count of the teachers' answers, as the ledger charged them. It is a function of
    public counts only, so free to publish."""
    orders = default_orders()
    total, left = np.zeros_like(orders), count
    for s in data.segments:
        by_teachers = s.by_teachers[:left]
        total = total + realised_rdp_independent(s.mechanism, by_teachers.size,
                                                 int(by_teachers.sum()), orders)
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


def figure_privacy_utility(points: dict[str, Any]) -> Figure:
    """Test accuracy against epsilon (delta of the run) for PATE students on prefixes of the
    answers (data-independent epsilon), the run's student at its sanitised epsilon too, and for
    DP-SGD."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    pate = sorted(points["pate"], key=lambda p: p["epsilon_data_independent"])
    if pate:
        ax.plot([p["epsilon_data_independent"] for p in pate], [p["accuracy"] for p in pate],
                "o-", color="tab:blue", label="PATE student (data-independent ε)")
        for p in pate:
            ax.annotate(f"{p['answered']} labels", (p["epsilon_data_independent"],
                                                    p["accuracy"]),
                        fontsize=7, xytext=(4, -10), textcoords="offset points")
    for p in points["pate_sanitised"]:
        ax.plot([p["epsilon"]], [p["accuracy"]], "*", ms=14, color="tab:blue",
                label="the PATE student (sanitised ε)")
    dpsgd = sorted(points["dpsgd"], key=lambda p: p["epsilon"])
    if dpsgd:
        ax.plot([p["epsilon"] for p in dpsgd], [p["accuracy"] for p in dpsgd], "s--",
                color="tab:red", label="DP-SGD (its accountant's ε)")
    ax.set_xlabel(f"ε at δ = {points['delta']:g}")
    ax.set_ylabel("Accuracy on the evaluation data")
    ax.set_title("Privacy-utility: PATE against DP-SGD (owner only)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


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
            "epsilon_data_independent_expected": privacy["data_independent"]["epsilon"],
            "epsilon_data_dependent": privacy["data_dependent"]["epsilon"],
            "epsilon_smooth_sensitivity": student_eps.get("data_dependent_sanitised"),
            "epsilon_smooth_sensitivity_expected": ss["epsilon"] if ss else None,
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


# ------------------------------------------------------------------------------------------
# Figures
# ------------------------------------------------------------------------------------------

def figure_epsilon_vs_answered(data: RunData) -> Figure:
    """Privacy cost against queries answered over the whole pool, for LNMax, GNMax and the run's
    Confident-GNMax (PATE 2018, Figure 4 / Figure 1 middle)."""
    first = next((s.mechanism for s in data.segments
                  if isinstance(s.mechanism, ConfidentGNMax | InteractiveGNMax)), None)
    gnmax = next((s.mechanism for s in data.segments if isinstance(s.mechanism, GNMax)), None)
    sigma = first.sigma2 if first is not None else gnmax.sigma if gnmax is not None else 40.0
    curves: list[tuple[str, Mechanism, str, str]] = [
        (f"LNMax, scale {data.lnmax_scale:g}", LNMax(data.lnmax_scale), "tab:red", "--"),
        (f"GNMax, σ = {sigma:g}", GNMax(sigma), "tab:orange", "-.")]
    if first is not None:
        curves.append((f"Confident-GNMax, T = {first.threshold:g}, σ1 = {first.sigma1:g}, "
                       f"σ2 = {first.sigma2:g}",
                       ConfidentGNMax(first.threshold, first.sigma1, first.sigma2),
                       "tab:green", "-"))
    run_mechanisms = [s.mechanism for s in data.segments]
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for label, mechanism, colour, style in curves:
        cost = cumulative_cost(data.votes, mechanism, data.delta)
        ours = mechanism in run_mechanisms
        label = f"{label}{'' if ours else ' (not run)'}"
        ax.plot(cost.answered, cost.epsilon_dependent, color=colour, ls=style, lw=2,
                label=f"{label}: data-dependent")
        if isinstance(mechanism, ConfidentGNMax):
            ax.plot(cost.answered, cost.epsilon_independent, color=colour, ls=":", lw=1.5,
                    label=f"{label}: data-independent")
    ax.set_xlabel("Queries answered (expected, over the whole pool's votes)")
    ax.set_ylabel(f"Privacy cost ε at δ = {data.delta:g}")
    ax.set_title("Privacy cost against queries answered (private)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_plurality_histogram(data: RunData, rows: NDArray[np.int64],
                               answered: NDArray[np.bool_]) -> Figure:
    """Share of teachers agreeing with the plurality, for queries asked and answered
    (PATE 2018, Figure 5 left)."""
    teachers = data.votes[0].sum()
    agreement = 100.0 * data.votes[rows].max(axis=1) / teachers
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    # one bin per possible share where the teachers are few, else 25 of 4 %
    bins = ((np.arange(teachers + 2) - 0.5) * 100.0 / teachers if teachers <= 25
            else np.linspace(0, 100, 26))
    ax.hist(agreement, bins=bins, color="tab:blue", alpha=0.5, label=f"asked ({rows.size})")
    ax.hist(agreement[answered], bins=bins, color="tab:green", alpha=0.7,
            label=f"answered ({int(answered.sum())})")
    ax.set_xlabel("Teachers voting for the plurality class (%)")
    ax.set_ylabel("Number of queries")
    ax.set_title("Teacher consensus of asked and answered queries (private)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    return fig


def figure_epsilon_split(data: RunData) -> Figure:
    """How epsilon splits between selecting queries (threshold step), answering them (GNMax)
    and the conversion's delta term, for each thresholded round (PATE 2018, Figure 5 right)."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    names, parts = [], []
    for i, s in enumerate(data.segments):
        cost = cumulative_cost(data.votes[s.rows], s.mechanism, data.delta, s.baseline)
        eps = float(cost.epsilon_dependent[-1])
        names.append(f"round {i + 1}\n{s.mechanism.title}")
        parts.append([eps * cost.split_selection, eps * cost.split_answering,
                      eps * cost.split_delta])
    values = np.array(parts).reshape(-1, 3)
    left = np.zeros(len(names))
    for k, (label, colour) in enumerate([("selection (threshold step)", "tab:blue"),
                                         ("answering (GNMax step)", "tab:green"),
                                         ("δ term of the conversion", "tab:gray")]):
        ax.barh(names, values[:, k], left=left, color=colour, label=label)
        left += values[:, k]
    ax.set_xlabel(f"Data-dependent ε at δ = {data.delta:g}, each round alone")
    ax.set_title("Data-dependent ε of each round, split (private)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_accuracy(report: dict[str, Any], teacher_acc: NDArray[np.float64] | None) -> Figure:
    """Teacher accuracy spread, and label / ensemble / student / DP-SGD accuracy."""
    fig = Figure(figsize=(10, 4.2))
    left, right = fig.subplots(1, 2)
    if teacher_acc is not None:
        left.hist(teacher_acc, bins=20, color="tab:purple", alpha=0.8)
        left.axvline(float(teacher_acc.mean()), color="k", ls="--",
                     label=f"mean {teacher_acc.mean():.3f}")
        left.legend()
    left.set_xlabel("Teacher accuracy on the evaluation set")
    left.set_ylabel("Number of teachers")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_title("Teacher accuracy spread (private)")
    bars = {"answered labels\n(pool)": report["queries"]["label_accuracy"],
            "ensemble plurality\n(pool, no noise)": report["ensemble"]["plurality_accuracy"],
            "student\n(evaluation)": (report["student"] or {}).get("accuracy"),
            "DP-SGD\n(evaluation)": (report["dpsgd"] or {}).get("accuracy")}
    bars = {k: v for k, v in bars.items() if v is not None}
    right.bar(list(bars), list(bars.values()), color="tab:cyan")
    for i, v in enumerate(bars.values()):
        right.text(i, v + 0.01, f"{v:.3f}", ha="center")
    right.set_ylim(0, 1.08)
    right.set_ylabel("Accuracy")
    right.set_title("Accuracies (private, except the student's)")
    fig.tight_layout()
    return fig


# ------------------------------------------------------------------------------------------
# Output
# ------------------------------------------------------------------------------------------

def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()


def format_value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return html.escape(str(value))


# The summary table's columns that are not for publication (docs/design.md, privacy rule 2).
# statistics of the votes: the analysis' expectations over the threshold's noise
PRIVATE_TABLE_KEYS = frozenset({"epsilon_data_dependent", "epsilon_data_independent_expected",
                                "epsilon_smooth_sensitivity_expected", "epsilon_bayesian"})


def public_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The summary table without its private columns, nor the DP-SGD baseline's row (a model
    trained on the private data outside the ledger's budget: its accuracy is private,
    docs/design.md, rule 2): what may be printed or logged."""
    return [{k: v for k, v in row.items() if k not in PRIVATE_TABLE_KEYS} for row in rows
            if row.get("student") != "dpsgd"]


TABLE_COLUMNS = [("method", "Method"), ("student", "Student"),
                 ("queries_answered", "Queries answered"),
                 ("epsilon_data_independent", "ε data-independent"),
                 ("epsilon_data_independent_expected", "ε data-independent, expected (private)"),
                 ("epsilon_data_dependent", "ε data-dependent, expected (private)"),
                 ("epsilon_smooth_sensitivity", "ε sanitised (smooth sensitivity), released"),
                 ("epsilon_smooth_sensitivity_expected", "ε sanitised, before noise (private)"),
                 ("epsilon_spent", "ε charged by the ledger"),
                 ("epsilon_bayesian", "ε Bayesian, data-dependent (private)"), ("delta", "δ"),
                 ("accuracy", "Accuracy")]


def table_html(rows: list[dict[str, Any]], first_column: str | None = None) -> str:
    """The summary table, without the columns no row has a value in."""
    columns = [(key, title) for key, title in TABLE_COLUMNS
               if any(r.get(key) is not None for r in rows)]
    head = (f"<th>{html.escape(first_column)}</th>" if first_column else "") + "".join(
        f"<th>{html.escape(title)}</th>" for _, title in columns)
    body = "".join(
        "<tr>" + (f"<td>{html.escape(str(r.get('run', '')))}</td>" if first_column else "")
        + "".join(f"<td>{format_value(r.get(key))}</td>" for key, _ in columns) + "</tr>"
        for r in rows)
    return (f'<div class="scroll"><table id="summary"><thead><tr>{head}</tr></thead>'
            f"<tbody>{body}</tbody></table></div>")


_STYLE = """body{font-family:system-ui,sans-serif;margin:2em auto;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:4px 8px;
text-align:right}th{background:#eef}td:first-child,th:first-child{text-align:left}
.note{background:#fff6e0;border-left:4px solid #e0a000;padding:.5em 1em}
.scroll{overflow-x:auto}
img{max-width:100%;border:1px solid #ddd;margin:.5em 0}code{background:#f4f4f4}"""


# what each figure shows, as its caption and its image's text (a screen reader's)
FIGURE_CAPTIONS = {
    "epsilon_vs_answered.png": "ε against the queries answered over the whole pool's votes: "
                               "the run's mechanism, and LNMax and GNMax on the same votes "
                               "(PATE 2018, Figure 4). Private.",
    "plurality_histogram.png": "How many teachers voted for the plurality, for the queries "
                               "asked and those answered (PATE 2018, Figure 5, left). Private.",
    "epsilon_split.png": "Each round's data-dependent ε, split between selecting the queries, "
                         "answering them and the conversion's δ term (PATE 2018, Figure 5, "
                         "right). Private.",
    "accuracy.png": "The teachers' accuracies, and the answered labels', the plurality's, the "
                    "student's and DP-SGD's. Private, except the student's.",
    "privacy_utility.png": "Accuracy against ε: the student, students on parts of its answers, "
                           "and DP-SGD trained to the student's ε. Owner only.",
    "tradeoff.png": "Each run's accuracy against its ε (sanitised, else data-independent).",
}


def render_html(title: str, sections: list[tuple[str, str]], pngs: dict[str, bytes]) -> str:
    """A self-contained page: inline CSS, figures embedded as base64 PNG with their captions,
    no script, no network."""
    figs = "".join(
        f'<figure><img alt="{html.escape(FIGURE_CAPTIONS.get(name, name))}" '
        f'src="data:image/png;base64,{base64.b64encode(png).decode()}">'
        f"<figcaption>{html.escape(FIGURE_CAPTIONS.get(name, name))}</figcaption></figure>"
        for name, png in pngs.items())
    body = "".join(f"<h2>{html.escape(h)}</h2>{content}" for h, content in sections)
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f"<title>{html.escape(title)}</title><style>{_STYLE}</style></head><body>"
            f"<h1>{html.escape(title)}</h1>{body}<h2>Figures</h2>{figs}</body></html>")


_CLASSES_FROM = {"config": "the config's classes", "test": "the test data's labels",
                 "folders": "the image folder's class subfolders", "dataset": "the dataset"}


def _assumptions(report: dict[str, Any]) -> list[tuple[str, Any]]:
    """The Details' rows that say on what the epsilons rest (all public): delta against the
    number of private records, the aggregator's parameters, the conversion from RDP, and the
    evaluation rows the accuracy is measured on."""
    rows: list[tuple[str, Any]] = []
    n, delta = report.get("private_records"), report["delta"]
    if n:
        rows.append(("Private records n, and δ against them",
                     f"{n}; δ = {delta:g} = {delta * n:.2g} / n (1/n or more is refused)"))
    aggregator = (report.get("config") or {}).get("aggregator")
    if aggregator:
        rows.append(("Aggregator parameters", ", ".join(
            f"{name} = {aggregator[key]:g}" for key, name in (
                ("threshold", "T"), ("sigma1", "σ1"), ("sigma2", "σ2"),
                ("interactive_threshold", "interactive T"),
                ("interactive_sigma1", "interactive σ1"),
                ("interactive_sigma2", "interactive σ2")) if aggregator.get(key) is not None)))
    if report["privacy"]:
        rows.append(("RDP to (ε, δ) conversion", report["privacy"]["conversion"]))
    if (report["student"] or {}).get("eval_size"):
        rows.append(("Evaluation rows (the student's accuracy)", report["student"]["eval_size"]))
    return rows


def run_sections(report: dict[str, Any]) -> list[tuple[str, str]]:
    q, privacy = report["queries"], report["privacy"]
    details = [("Dataset", report["dataset"]), ("Teachers", report["teachers"]),
               ("Classes", f"{report['classes']}, from "
                           f"{_CLASSES_FROM.get(report.get('classes_from'), 'the dataset')}"),
               ("Public pool", report["pool_size"]),
               ("Queries asked", q["asked"]), ("Queries answered", q["answered"]),
               ("Label accuracy of answered queries", q["label_accuracy"]),
               ("Ensemble plurality accuracy on the pool (no noise)",
                report["ensemble"]["plurality_accuracy"])]
    details += _assumptions(report)
    if report["student"] and report["student"].get("accuracy") is None:
        details.append(("Student accuracy", "not measured: no test data was given (accuracy "
                                            "is never measured on private data)"))
    if report["teacher_accuracy"]:
        t = report["teacher_accuracy"]
        details.append(("Teacher accuracy (mean ± std, min–max)",
                        f"{t['mean']:.4f} ± {t['std']:.4f}, {t['min']:.4f}–{t['max']:.4f}"))
    if report.get("audit"):
        a = report["audit"]
        details.append(("Empirical privacy audit (pate audit models)",
                        f"{'passed' if a['passed'] else 'FAILED'} ({a['file']}; its figures "
                        "are in owner-evaluation.html)"))
    if privacy and privacy["smooth_sensitivity"]:
        ss = privacy["smooth_sensitivity"]
        details.append(("Smooth-sensitivity release (order, β, SS, σ)",
                        ", ".join(format_value(ss[k]) for k in ("order", "beta", "value",
                                                                  "sigma"))))
    detail_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{format_value(v)}</td></tr>"
                          for k, v in details)
    note = ('<p class="note">This report contains private statistics, computed from the '
            "private data or the votes: the columns marked private, every figure (each says "
            "so in its title), and in the Details the teachers' and their plurality's "
            "accuracies and the smooth-sensitivity release's order, β, SS and σ. Share only "
            "the data-independent ε, the sanitised ε and the student's accuracy. The "
            "data-independent ε depends only on how many queries were asked and how many the "
            "teachers answered, counts the student holds anyway; the columns marked expected "
            "are PATE 2018's Table 2 analysis, expectations over which queries the threshold "
            "lets through, and depend on the votes.</p>")
    return [("Summary (in the form of PATE 2018, Table 1)", note + table_html(report["table"])),
            ("What these epsilons mean", meaning_html(report["epsilon_meaning"])),
            ("Details", f"<table>{detail_rows}</table>")]


def write_report(report: dict[str, Any], figures: dict[str, Figure], out_dir: Path,
                 title: str, sections: list[tuple[str, str]],
                 write_bytes: Callable[[Path, bytes], None], stem: str = "report") -> Path:
    """Write figures/*.png, ``stem``.json and ``stem``.html under ``out_dir`` with
    ``write_bytes`` (an atomic, private writer of the caller's)."""
    pngs = {name: figure_png(fig) for name, fig in figures.items()}
    for name, png in pngs.items():
        write_bytes(out_dir / "figures" / name, png)
    report = {**report, "figures": {name: f"figures/{name}" for name in pngs}}
    write_bytes(out_dir / f"{stem}.json",
                (json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n")
                .encode())
    write_bytes(out_dir / f"{stem}.html", render_html(title, sections, pngs).encode())
    return out_dir / f"{stem}.html"


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def compare_runs(reports: list[dict[str, Any]]) -> tuple[dict[str, Any], dict[str, Figure]]:
    """Several runs side by side: their table rows and an accuracy-against-epsilon plot."""
    rows = [{"run": r["run"], **row} for r in reports for row in r["table"]]
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for row in rows:
        eps = row.get("epsilon_smooth_sensitivity") or row.get("epsilon_data_independent")
        if eps is not None and row.get("accuracy") is not None:
            ax.scatter(eps, row["accuracy"], s=50)
            ax.annotate(f"{row['run']}: {row['method']}", (eps, row["accuracy"]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("ε (smooth-sensitivity-sanitised, else data-independent)")
    ax.set_ylabel("Accuracy")
    ax.set_title("Privacy-utility trade-off across runs")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return {"runs": [r["run"] for r in reports], "table": rows}, {"tradeoff.png": fig}
