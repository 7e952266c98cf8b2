"""Whether a run's report is current: of this version's layout and newer than every file it is
made from. Light on purpose (no torch), so that ``pate status`` can say it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pate.errors import UserError
from pate.rundir import RunDir

# report.json's layout; a report of another (an older version's) is rebuilt, not reused. 2: the
# table's data-independent epsilon is the realised one, the ledger's charge. 3: its sanitised
# epsilon is the student's release, with noise; the analysis' figure before noise is private.
# 4: what the publishable epsilons mean (epsilon_meaning). 5: the privacy-utility curve, which
# holds DP-SGD's accuracies, is the owner-only page's alone. 6: the number of private records
# (the Details say what the epsilons rest on). 7: the data-independent epsilon with every query
# answered, the figure to quote (epsilon_to_quote), the budget; no private file's path; no
# released fallback.
REPORT_FORMAT = 7
OWNER_STEM = "owner-evaluation"  # the owner-only page: report/owner-evaluation.html and .json


def report_inputs(run: RunDir) -> list[Path]:
    """The files a run's report is made from."""
    audits = run.models_audits()
    return [run.config, run.manifest, run.votes, run.labels, run.rounds, run.probs,
            run.student_metrics, run.dpsgd_metrics, run.dpsgd_bayesian, run.comparison_metrics,
            run.releases,
            *audits[-1:]]


def current_report(run_dir: str | Path) -> dict[str, Any] | None:
    """The run's ``report/report.json`` when it is there, readable, of this version's layout
    (``REPORT_FORMAT``) and newer than every file it is made from; None when it must be
    written (again): it is derived from the run directory, so a missing, damaged or outdated
    one is rebuilt rather than trusted."""
    run = RunDir(run_dir)
    path = run.report_json
    try:
        report = run.read_json(path)
    except UserError:
        return None
    if not isinstance(report, dict) or report.get("report_format") != REPORT_FORMAT:
        return None
    if not all(p.is_file() for p in _report_files(run, report)):  # one deleted since
        return None
    written = path.stat().st_mtime_ns
    newer = [p for p in report_inputs(run) if p.is_file() and p.stat().st_mtime_ns > written]
    return None if newer else report


def _report_files(run: RunDir, report: dict[str, Any]) -> list[Path]:
    """The files written with ``report.json``, which is written last
    (``pate.report.run_report.write_run_report``): the page, the figures it names, and the
    owner-only page where the report says one was written."""
    figures = report.get("figures")
    named = list(figures.values()) if isinstance(figures, dict) else []
    owner = ([f"{OWNER_STEM}.json", f"{OWNER_STEM}.html"] if report.get("owner_evaluation")
             else [])
    return [run.report / str(name) for name in ("report.html", *named, *owner)]
