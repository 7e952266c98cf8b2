"""Read a run directory into ``pate.report.run_data.RunData`` and write its report (the run
directory of docs/design.md: config.toml, votes.npz, labels.npz, teachers/manifest.json,
student/rounds.json, student/metrics.json, dpsgd/metrics.json -> report/)."""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from analysis.costs import steps
from pate.aggregation.vote_pool import VotePool
from pate.aggregation.votes_ledger import ledgers_beside
from pate.config import AggregatorConfig, parse_config
from pate.data.partitions import counts_private
from pate.data.task import Benchmark, DataSource, Task, load_task
from pate.data.votes_file import load_partition, load_private_records, load_votes_with_index
from pate.errors import UserError
from pate.io import ensure_dir, write_bytes_atomic
from pate.report.content import build_report, compare_runs
from pate.report.freshness import OWNER_STEM, REPORT_FORMAT, current_report
from pate.report.owner import (
    audit_section,
    owner_link,
    owner_note,
    owner_rows,
    owner_sections,
)
from pate.report.page import run_sections, table_html, write_report
from pate.report.run_data import RunData, Segment
from pate.rundir import RunDir
from student.rounds import Received, interactive_baseline, read_rounds, round_plan
from teachers.manifest import TeachersManifest, teachers_source


@dataclass(frozen=True)
class RunFacts:
    """What a report needs beyond the run's arrays: where the public data is, delta, the LNMax
    scale of Figure 4's comparison, the aggregator settings that give a round recorded by name
    only its parameters (None: not known), and the configuration to show (None: none)."""

    source: DataSource | None
    delta: float
    lnmax_scale: float
    aggregator: AggregatorConfig | None = None
    config: dict[str, Any] | None = None


def run_facts(run: RunDir) -> RunFacts:
    """The facts of ``pate run``'s ``config.toml``; without one (a directory the separate
    commands made), the data of the teachers' manifest and the delta of the student's metrics,
    the rounds' parameters being those ``student/rounds.json`` recorded."""
    if not run.root.is_dir():
        raise UserError(f"{run}: no such run directory")
    if run.config.is_file():
        config = parse_config(run.config.read_text(), str(run.config))
        a = config.aggregator
        # the report names the data by its public files, never the private file's path
        return RunFacts(config.data.source(), a.delta, a.lnmax_scale, a,
                        json.loads(config.model_dump_json(exclude={"data": {"private"}})))
    metrics = run.read_json(run.student_metrics)
    if metrics is None:
        raise UserError(f"{run}: neither a config.toml (pate run) nor a student's metrics "
                        "(written by a pate student train that finished): nothing to report")
    delta = (metrics.get("epsilon") or {}).get("delta") if isinstance(metrics, dict) else None
    if not isinstance(delta, float) or not 0.0 < delta < 1.0:
        raise UserError(f"{run.student_metrics}: no delta in (0, 1) under epsilon: this run "
                        "directory is damaged")
    return RunFacts(teachers_source(run.root), delta,
                    AggregatorConfig.model_fields["lnmax_scale"].default)


def _public_task(source: DataSource | None) -> Task | None:
    """The run's public side (the pool, the label set), or None where its data is not here."""
    if source is None:
        return None
    try:
        return load_task(source, need_private=False)
    except UserError:
        return None


def _teacher_accuracies(run: RunDir) -> np.ndarray | None:
    manifest = TeachersManifest.read(run.root)
    values = None if manifest is None else manifest.accuracy.get("per_teacher")
    return np.asarray(values, np.float64) if values else None


def _segments(run: RunDir, facts: RunFacts, votes: np.ndarray,
              pool_index: np.ndarray) -> list[Segment]:
    """The student's query rounds, in the order ``labels.npz`` holds their rows: each round's
    record in ``student/rounds.json`` (one Confident round when there is none), and for
    Interactive rounds the baseline num_teachers * the probabilities the student sent
    (``student/probs.npz``)."""
    try:
        received = Received.load(run.labels)
    except (OSError, ValueError, KeyError) as exc:
        raise UserError(f"{run.labels}: not a labels file ({exc.__class__.__name__})") from None
    asked, labels = received.pool_index, received.label
    try:
        rows = VotePool(votes, pool_index).rows(asked)
    except UserError:  # rows of another pool, or asked twice: not this run's answers
        raise UserError(f"{run.labels}: asks for pool rows the votes do not cover, or one row "
                        "twice") from None
    rounds = (read_rounds(run)
              or [{"mechanism": {"mechanism": "confident"}, "queries": int(asked.size)}])
    teachers = float(votes[0].sum())
    segments = []
    for mechanism, sel in round_plan(rounds, received, None if facts.aggregator is None
                                     else facts.aggregator.round_mechanism):
        baseline = None
        if steps(mechanism).student_gamma is not None:
            baseline = interactive_baseline(run.probs, asked[sel], teachers)
        elif received.by_teachers[sel].sum() != (labels[sel] >= 0).sum():
            raise UserError(f"{run.labels}: answers of the student's own label in a "
                            f"{mechanism.name} round, which has none: this run directory is "
                            "damaged")
        segments.append(Segment(rows[sel], mechanism, labels[sel],
                                received.by_teachers[sel], baseline))
    return segments


def _dataset_name(task: Task | None, source: DataSource | None,
                  student: dict[str, Any] | None) -> str:
    """The data's name: the loaded task's, a built-in dataset's, else the student's record."""
    if task is not None:
        return task.name
    if isinstance(source, Benchmark):
        return source.name
    return str((student or {}).get("dataset", "unknown"))


def load_run_data(run_dir: str | Path) -> RunData:
    run = RunDir(run_dir)
    facts = run_facts(run)
    if not run.votes.is_file():
        if run.labels.is_file() and not run.teachers.is_dir():  # a student of a server's
            raise UserError(f"{run}: no votes.npz: a report analyses the votes the answers "
                            "came from, and these came from an aggregator elsewhere (a pate "
                            "serve); the student's epsilons are in its metrics (`pate status "
                            f"--run {run}`), the votes' report where they are")
        raise UserError(f"{run}: no votes.npz; run `pate teachers votes --run {run}`")
    votes, pool_index = load_votes_with_index(run.votes)
    segments = _segments(run, facts, votes, pool_index) if run.labels.is_file() else []
    task = _public_task(facts.source)
    pool_y = None if task is None or task.pool_y is None else task.pool_y[pool_index]
    student = run.read_json(run.student_metrics)
    partition = load_partition(run.votes)  # the number of records is shown where public
    records = None if counts_private(partition) else load_private_records(run.votes)
    return RunData(
        name=run.root.resolve().name,
        dataset=_dataset_name(task, facts.source, student),
        delta=facts.delta, votes=votes, pool_labels=pool_y, segments=segments,
        lnmax_scale=facts.lnmax_scale,
        teacher_accuracies=_teacher_accuracies(run),
        student=student,
        dpsgd=_dpsgd_metrics(run),
        comparison=run.read_json(run.comparison_metrics),
        classes_from=None if task is None else task.classes_from,
        extra={"partition": partition, "private_records": records,
               # how many other ledgers charge the same private data as the report is written
               # (their ε composes with this run's), not where they are: their URLs are the
               # owner's paths and hosts
               "other_ledgers": len(ledgers_beside(run.root)),
               **({} if facts.config is None else {"config": facts.config})})


def _dpsgd_metrics(run: RunDir) -> dict[str, Any] | None:
    """The DP-SGD baseline's metrics (public ``dpsgd/metrics.json``) with its Bayesian epsilon
    (private ``dpsgd/bayesian.json``, as the report is); None without a baseline."""
    metrics = run.read_json(run.dpsgd_metrics)
    bayesian = run.read_json(run.dpsgd_bayesian)
    if isinstance(metrics, dict) and isinstance(bayesian, dict):
        return {**metrics, **bayesian}
    return metrics


def _private_writer(path: Path, data: bytes) -> None:
    ensure_dir(path.parent, private=True)
    write_bytes_atomic(path, data, private=True)


def _eval_plurality(run: RunDir) -> float | None:
    """The teachers' plurality accuracy on the evaluation data (the votes stage's)."""
    manifest = TeachersManifest.read(run.root)
    return None if manifest is None else manifest.accuracy.get("plurality")


def latest_models_audit(run: RunDir) -> dict[str, Any] | None:
    """The newest ``pate audit models`` summary of the run (``RunDir.models_audits``, private),
    with its file name; None when no audit ran."""
    found = run.models_audits()
    if not found:
        return None
    try:
        return {**json.loads(found[-1].read_text()), "file": f"audit/{found[-1].name}"}
    except (OSError, ValueError):
        raise UserError(f"{found[-1]}: not a readable audit summary") from None


def write_run_report(run_dir: str | Path) -> Path:
    """Analyse the run and write ``report/`` (private: it holds vote histograms and the
    data-dependent epsilon); returns the path of ``report.html``. A run with an owner-only
    evaluation (``comparison/``) also gets ``report/owner-evaluation.html`` and ``.json``."""
    run = RunDir(run_dir)
    data = load_run_data(run_dir)
    report, figures = build_report(data)
    # the curve holds DP-SGD's accuracies: the owner-only page's (docs/design.md, rule 2)
    curve = report.pop("privacy_utility", None), figures.pop("privacy_utility.png", None)
    audit = latest_models_audit(run)
    if audit is not None:  # the report says only that an audit ran and whether it passed
        report["audit"] = {"file": audit["file"], "passed": audit["passed"]}
    owner = data.comparison is not None or audit is not None
    sections = run_sections(report) + (
        [owner_link(data.comparison is not None, audit is not None)] if owner else [])
    if owner:  # before report.json, written last: a stop between leaves no current report
        write_owner_evaluation(run, data, report, curve, audit)
    report["owner_evaluation"] = f"{OWNER_STEM}.html" if owner else None
    return write_report(report, figures, run.report,
                        f"PATE privacy-utility report: {_title(data)}", sections,
                        _private_writer)


def _title(data: RunData) -> str:
    """The run as a page's title names it: its folder, and its config's name where that
    differs (``runs/x`` of the preset ``fashion-mnist-small``)."""
    name = (data.extra.get("config") or {}).get("name")
    return data.name if name in (None, data.name) else f"{data.name} ({name})"


def write_owner_evaluation(run: RunDir, data: RunData, report: dict[str, Any],
                           curve: tuple[dict[str, Any] | None, Any], audit: dict[str, Any] | None
                           ) -> None:
    """``report/owner-evaluation.html`` and ``.json`` (0600): the compare stage's comparison and
    the privacy-utility ``curve`` (its points and figure), and the latest model audit's
    figures."""
    owner: dict[str, Any] = {"run": data.name, "note": "owner only: not for publication"}
    sections, shown = [], {}
    if data.comparison is not None:
        rows = owner_rows(report, data.comparison, _eval_plurality(run))
        owner.update(rows=rows, privacy_utility=curve[0],
                     dpsgd_hyperparameters=data.comparison["dpsgd_hyperparameters"])
        sections += owner_sections(rows, owner["dpsgd_hyperparameters"], data.extra["partition"])
        shown["privacy_utility.png"] = curve[1]
    else:
        sections.append(("Owner-only evaluation", owner_note(data.extra["partition"])))
    if audit is not None:
        owner["audit"] = audit
        sections.append(audit_section(audit))
    write_report(owner, shown, run.report, f"Owner-only evaluation: {_title(data)}", sections,
                 _private_writer, stem=OWNER_STEM)


def _stale_report(run_dir: str | Path, why: UserError) -> dict[str, Any]:
    """The report a run already has when it cannot be written again (its private files gone,
    say), with a warning; ``why`` again when it has none."""
    path = RunDir(run_dir).report_json
    try:
        report = json.loads(path.read_text())
    except (OSError, ValueError):
        raise why from None
    if not isinstance(report, dict) or report.get("report_format") != REPORT_FORMAT:
        raise why  # another layout's figures may mean other things (a sanitised ε before noise)
    warnings.warn(f"{run_dir}: its report cannot be written again ({why}); compared as it was "
                  "written", stacklevel=2)
    return report


def write_comparison(run_dirs: list[Path], out_dir: Path) -> Path:
    """The report comparing ``run_dirs`` (each run's report written first where missing or of
    an older layout), in ``out_dir``; ``UserError`` when ``out_dir`` is a file, or a run
    directory or inside one (its top would take the comparison's report.html beside its own
    files, its report/ would lose its own report, its student/, the folder published, would
    take the comparison's private figures), or when a run is named twice (one run compared
    with itself)."""
    if out_dir.exists() and not out_dir.is_dir():
        raise UserError(f"{out_dir}: a file, not a directory for the report")
    for folder in (out_dir.resolve(), *out_dir.resolve().parents):
        if RunDir(folder).holds_a_run():  # the comparison would replace or publish its files
            where = ("is a run directory" if folder == out_dir.resolve() else
                     f"is inside the run directory {folder}")
            raise UserError(f"{out_dir} {where}: give the comparison a folder of its own "
                            "(--out)")
    named = [run_dir.resolve() for run_dir in run_dirs]
    if len(set(named)) < len(named):
        raise UserError("a run is named twice in --runs: compare different runs")
    reports = []
    for run_dir in run_dirs:
        report = current_report(run_dir)
        if report is None:
            try:
                write_run_report(run_dir)
                report = RunDir(run_dir).read_json(RunDir(run_dir).report_json)
            except UserError as exc:
                report = _stale_report(run_dir, exc)
        reports.append(report)
    summary, figures = compare_runs(reports)
    note = ('<p class="note">This comparison contains private statistics, computed from the '
            "votes: the columns marked private. Share only the data-independent ε, the "
            "sanitised ε where one was released, and the students' accuracy.</p>")
    sections = [("Runs compared", note + table_html(summary["table"], first_column="Run"))]
    return write_report(summary, figures, out_dir, "PATE runs compared", sections,
                        _private_writer)
