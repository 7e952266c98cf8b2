"""The owner-only evaluation page of a run (``report/owner-evaluation.html`` and ``.json``, 0600):
the PATE student beside DP-SGD at its epsilons, a model trained on the private data without
privacy, and the teacher ensemble's plurality, on the same evaluation data, with the ratios.

Models trained on the private data without PATE are not for publication, nor are their figures:
this page is written apart from the run's report and says so at its top.
"""

from __future__ import annotations

import html
from typing import Any

from pate.report.freshness import OWNER_STEM
from pate.report.page import format_value

# DP-SGD's ε is for adding or removing a record; the student's as the partition sets it
# (pate.data.partitions).
_SAME_GUARANTEE = {
    "position": "DP-SGD's ε is for adding or removing a record, the student's for changing one "
                "(the teachers' rows were dealt by position): the same number, not the same "
                "guarantee",
    "record": "DP-SGD's ε and the student's are both for adding or removing a record (the "
              "teachers' rows were dealt by record): the same guarantee",
    "key": "the student's ε is for adding or removing all of one person's records (the "
           "teachers' rows were dealt by key), DP-SGD's for one record: at the same number the "
           "student's guarantee is the stronger"}


def owner_note(partition: str) -> str:
    """The page's opening note, for a run whose teachers' rows were dealt by ``partition``."""
    return ('<p class="note"><b>Owner only: not for publication.</b> This page compares the '
            "published PATE student with models that read the private data: a non-private "
            "model and the teachers' plurality carry no privacy guarantee, and their accuracy "
            "is a statistic of the private data. The DP-SGD models read the private data "
            "outside the run's budget: publishing one of them, or its accuracy, adds its ε "
            f"to the student's. {_SAME_GUARANTEE[partition]} (docs/privacy-math.md §12). "
            "Publish the student and the ε its report names to quote; keep this page.</p>")


def owner_link(comparison: bool, audit: bool) -> tuple[str, str]:
    """report.html's section pointing to this page (beside it, in ``report/``), saying what
    it holds: the compare stage's figures, the model audit's, or both."""
    held = [what for what, there in (
        ("the student beside DP-SGD at its ε, a model without privacy, the teachers' "
         "plurality and the privacy-utility curve", comparison),
        ("the model audit's figures", audit)) if there]
    return ("Owner-only evaluation",
            f'<p><a href="{OWNER_STEM}.html">{OWNER_STEM}.html</a>, beside this page and '
            f"for the data holder only, holds {html.escape('; and '.join(held))}.</p>")

_NAMES = {"sanitised": "smooth-sensitivity-sanitised", "data-independent": "data-independent"}


def owner_rows(report: dict[str, Any], comparison: dict[str, Any],
               ensemble_eval_plurality: float | None) -> list[dict[str, Any]]:
    """One row per model on the evaluation data: accuracy, epsilon and how it was trained, and
    the student's accuracy divided by the row's."""
    student = report.get("student") or {}
    eps = comparison.get("student_epsilon") or {}
    rows: list[dict[str, Any]] = [{
        "model": "(a) PATE student (published)",
        "accuracy": student.get("accuracy"),
        "epsilon": (f"{format_value(eps.get('sanitised'))} sanitised, "
                    f"{format_value(eps.get('data-independent'))} data-independent"),
        "training": (f"{student.get('method')} ({student.get('arch')}), "
                     f"{student.get('epochs')} epochs, {student.get('labels_used')} labels"),
    }]
    for d in comparison.get("dpsgd", []):
        if "accuracy" not in d:
            rows.append({"model": f"(b) DP-SGD at the student's {_NAMES[d['at']]} ε",
                         "training": d.get("skipped")})
            continue
        variant = ("" if d.get("noise", "gaussian") == "gaussian" and not d.get("encode")
                   and d.get("denoise", "none") == "none"
                   else f", {d['noise']} noise, {d['encode']} encoding profiles, denoising "
                        f"{d['denoise']}")
        rows.append({
            "model": f"(b) DP-SGD at the student's {_NAMES[d['at']]} ε",
            "accuracy": d["accuracy"], "epsilon": f"{d['epsilon']:.4g} (RDP)",
            "training": (f"{d.get('model', 'tempered-cnn')}, {d['epochs']} epochs, expected "
                         f"batch {d['batch_size']}, clipping C = {d['max_grad_norm']:g}, "
                         f"lr {d['lr']:g}, momentum {d['momentum']:g}, noise multiplier "
                         f"{d['noise_multiplier']:.3f}{variant}")})
    nonprivate = comparison.get("nonprivate")
    if nonprivate:
        rows.append({
            "model": "(c) non-private: the teachers' architecture on all the private data",
            "accuracy": nonprivate["accuracy"], "epsilon": "∞ (no privacy)",
            "training": (f"{nonprivate['model']}, {nonprivate['epochs']} epochs, batch "
                         f"{nonprivate['batch_size']}, {nonprivate['train_examples']} rows")})
    rows.append({"model": "(d) teacher ensemble's plurality on the evaluation data, no noise",
                 "accuracy": ensemble_eval_plurality, "epsilon": "∞ (no privacy)",
                 "training": f"{report.get('teachers')} teachers"})
    ours = student.get("accuracy")
    for row in rows:
        acc = row.get("accuracy")
        row["student_ratio"] = None if not ours or not acc else ours / acc
    return rows


def audit_section(audit: dict[str, Any]) -> tuple[str, str]:
    """The latest ``pate audit models`` summary (``audit/models-*.json``): per audited model its
    accuracy, the membership-inference epsilon lower bound against the analytic epsilon, the best
    attack's AUC, and whether it passed."""
    head = "".join(f"<th>{t}</th>" for t in ("Model", "Accuracy", "ε lower bound (audit)",
                                             "ε analytic", "Best AUC", "Passed"))
    body = "".join(
        f"<tr><td>{html.escape(t['target'])}</td><td>{format_value(t.get('accuracy'))}</td>"
        f"<td>{format_value(t['epsilon_lower'])}</td>"
        f"<td>{format_value(t.get('epsilon_analytic'))}</td>"
        f"<td>{format_value(max((a['auc'] for a in t['attacks']), default=None))}</td>"
        f"<td>{'yes' if t['passed'] else 'NO'}</td></tr>" for t in audit["targets"])
    verdict = ("Passed" if audit["passed"]
               else "FAILED: " + html.escape("; ".join(audit["failures"])))
    text = (f"<p>Membership inference with randomised canaries ({html.escape(audit['method'])})"
            f", at δ = {format_value(audit['delta'])} and confidence "
            f"{format_value(audit['confidence'])}: {html.escape(audit['file'])}. "
            f"{verdict}.</p>")
    return ("Empirical audit of the models", text
            + f'<table id="audit"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')


def owner_sections(rows: list[dict[str, Any]], dpsgd_choice: str, partition: str
                   ) -> list[tuple[str, str]]:
    """The page's sections: the note (:func:`owner_note`), the table, and how DP-SGD's
    settings were chosen."""
    head = "".join(f"<th>{t}</th>" for t in (
        "Model", "Accuracy", "ε (δ of the run)", "Training",
        "Student ÷ this (above 1: the student is the more accurate)"))
    body = "".join(
        f"<tr><td>{html.escape(r['model'])}</td><td>{format_value(r.get('accuracy'))}</td>"
        f"<td>{html.escape(str(r.get('epsilon') or '–'))}</td>"
        f"<td>{html.escape(str(r.get('training') or '–'))}</td>"
        f"<td>{format_value(r.get('student_ratio'))}</td></tr>" for r in rows)
    method = (f"<p>DP-SGD's hyperparameters: {html.escape(dpsgd_choice)}. Each DP-SGD model "
              "is trained to the student's ε at the run's δ (its noise multiplier calibrated "
              "by the project's sampled-Gaussian RDP accountant) on the private training data, "
              "and measured on the student's evaluation data.</p>")
    return [("The student against DP-SGD and models without privacy", owner_note(partition) + method
             + f'<table id="owner"><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>')]
