"""The report as a page: the summary table and the Details in HTML, a self-contained page with
its figures embedded, and the files ``report.json``, ``report.html`` and ``figures/*.png``."""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from pate.report.figures import figure_png
from pate.report.freshness import OWNER_STEM
from pate.report.meaning import budget_and_charged, meaning_html


def format_value(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}" if math.isfinite(value) else str(value)
    return html.escape(str(value))


TABLE_COLUMNS = [("method", "Method"), ("student", "Student"),
                 ("queries_answered", "Queries answered"),
                 ("epsilon_data_independent", "ε data-independent"),
                 ("epsilon_every_answered", "ε data-independent, every query answered"),
                 ("epsilon_data_independent_expected",
                  "ε data-independent, Table 2 expectation over the threshold (private)"),
                 ("epsilon_data_dependent", "ε data-dependent, Table 2 expectation (private)"),
                 ("epsilon_smooth_sensitivity", "ε sanitised (smooth sensitivity), released"),
                 ("epsilon_smooth_sensitivity_expected", "ε sanitised, before noise (private)"),
                 ("epsilon_spent", "ε charged for the student's answers"),
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
    "epsilon_vs_answered.png": "ε against the queries answered over the whole pool's votes, "
                               "in expectation over the noise, not the rows the student asked "
                               "(the tables' figures): the run's mechanism, and LNMax and GNMax "
                               "on the same votes, their cost only (PATE 2018, Figure 4). "
                               "Private.",
    "plurality_histogram.png": "How many teachers voted for the plurality, for the queries "
                               "asked and those answered (PATE 2018, Figure 5, left). Private.",
    "epsilon_split.png": "Each round's data-dependent ε, split between selecting the queries, "
                         "answering them and the conversion's δ term (PATE 2018, Figure 5, "
                         "right); each round is converted on its own, with its own δ term, so "
                         "the rounds' bars add up to more than the run's ε. Private.",
    "accuracy.png": "The teachers' accuracies, and the answered labels', the plurality's and "
                    "the student's. Private, except the student's.",
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
    elif report.get("partition") in ("record", "key"):
        rows.append(("Private records n, and δ against them",
                     f"not shown: the ε covers adding or removing "
                     f"{'a record' if report['partition'] == 'record' else 'a person'}, so "
                     f"their number is private; δ = {delta:g} was checked against 1/n"))
    aggregator = (report.get("config") or {}).get("aggregator")
    if aggregator and aggregator.get("budget_epsilon") is not None:
        rows.append(("This ledger's budget", f"ε = {aggregator['budget_epsilon']:g} at "
                     f"δ = {delta:g}, data-independent: the ledger refuses a batch whose worst "
                     "case would pass it"))
    if others := report.get("other_ledgers"):
        rows.append(("Other ledgers of this private data",
                     f"{others}, in this machine's registry as this report was written (pate "
                     "status lists them): the private data's privacy loss is this run's ε "
                     "composed with what they charged, not this ε alone"))
    if aggregator:
        interactive = ((report.get("config") or {}).get("student") or {}).get(
            "interactive_queries")  # γ, the student's confidence to keep its label, is its own
        rows.append(("Aggregator parameters", ", ".join(
            f"{name} = {aggregator[key]:g}" for key, name in (
                ("threshold", "T"), ("sigma1", "σ1"), ("sigma2", "σ2"),
                ("interactive_threshold", "interactive T"),
                ("interactive_sigma1", "interactive σ1"),
                ("interactive_sigma2", "interactive σ2"),
                *((("gamma", "interactive γ"),) if interactive else ()))
            if aggregator.get(key) is not None)))
    if report["privacy"]:
        rows.append(("RDP to (ε, δ) conversion", report["privacy"]["conversion"]))
    if (report["student"] or {}).get("eval_size"):
        rows.append(("Evaluation rows (the student's accuracy)", report["student"]["eval_size"]))
    return rows


def run_sections(report: dict[str, Any]) -> list[tuple[str, str]]:
    q, privacy = report["queries"], report["privacy"]
    # a user's files by their label set's origin; unknown (the data not found now): as named
    dataset = (report["dataset"] if report.get("classes_from") in (None, "dataset") else
               f"your own files (named after the public pool's: {report['dataset']})")
    details = [("Dataset", dataset), ("Teachers", report["teachers"]),
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
    if (report["student"] or {}).get("majority_accuracy") is not None:
        details.append(("Always the most frequent class (a baseline the student should beat)",
                        report["student"]["majority_accuracy"]))
    if report["teacher_accuracy"]:
        t = report["teacher_accuracy"]
        details.append(("Teacher accuracy (mean ± std, min–max)",
                        f"{t['mean']:.4f} ± {t['std']:.4f}, {t['min']:.4f}–{t['max']:.4f}"))
    if report.get("audit"):
        a = report["audit"]
        details.append(("Empirical privacy audit (pate audit models)",
                        f"{'passed' if a['passed'] else 'FAILED'} ({a['file']}; its figures "
                        f"are in {OWNER_STEM}.html)"))
    if privacy and privacy["smooth_sensitivity"]:
        ss = privacy["smooth_sensitivity"]
        released = ((report["student"] or {}).get("epsilon") or {}).get(
            "data_dependent_sanitised")
        if ss.get("fallback") and released is None:  # (an older version released fallbacks)
            details.append(("Smooth-sensitivity release", "none: the analysis's conditions "
                            "C5/C6 fail at its order, so the data-independent ε is the guarantee "
                            "(docs/privacy-math.md §5)"))
        else:
            noise = (ss["sigma"] * ss["value"] if ss.get("sigma") and ss.get("value")
                     else None)
            details.append(("Smooth-sensitivity release (order, β, SS, σ_ss; the noise's "
                            "standard deviation σ_ss · SS, in RDP)",
                            ", ".join(format_value(v) for v in (
                                ss["order"], ss["beta"], ss["value"], ss["sigma"], noise))))
    detail_rows = "".join(f"<tr><td>{html.escape(k)}</td><td>{format_value(v)}</td></tr>"
                          for k, v in details)
    note = ('<p class="note">This report contains private statistics, computed from the '
            "private data or the votes: the columns marked private, every figure (each says "
            "so in its title), and in the Details the teachers' and their plurality's "
            "accuracies and the smooth-sensitivity release's order, β, SS and σ. Share only "
            "the two data-independent ε, the sanitised ε where one was released, and the "
            "student's accuracy. The "
            "data-independent ε depends only on how many queries were asked and how many the "
            "teachers answered, counts the student holds anyway, and with every query answered "
            "only on how many were asked; the columns marked Table 2 are PATE 2018's analysis, "
            "expectations over which queries the threshold lets through, and depend on the "
            "votes.</p>")
    return [("Summary (in the form of PATE 2018, Table 1)", note + table_html(report["table"])),
            ("What these epsilons mean", meaning_html(
                report["epsilon_meaning"], *budget_and_charged(report),
                report.get("partition", "position"))),
            ("Details", f"<table>{detail_rows}</table>")]


def write_report(report: dict[str, Any], figures: dict[str, Figure], out_dir: Path,
                 title: str, sections: list[tuple[str, str]],
                 write_bytes: Callable[[Path, bytes], None], stem: str = "report") -> Path:
    """Write figures/*.png, ``stem``.html and, last, ``stem``.json under ``out_dir`` with
    ``write_bytes`` (an atomic, private writer of the caller's): the JSON, which names the
    figures, is there only once everything it names is."""
    pngs = {name: figure_png(fig) for name, fig in figures.items()}
    for name, png in pngs.items():
        write_bytes(out_dir / "figures" / name, png)
    report = {**report, "figures": {name: f"figures/{name}" for name in pngs}}
    write_bytes(out_dir / f"{stem}.html", render_html(title, sections, pngs).encode())
    write_bytes(out_dir / f"{stem}.json",
                (json.dumps(report, indent=2, sort_keys=True, default=_json_default) + "\n")
                .encode())
    return out_dir / f"{stem}.html"


def _json_default(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
