"""``pate status``: where a run stands (docs/cli.md): each stage of ``pate run`` done (with its
seconds), running (started in ``log.txt``, and a command holds the directory), stopped
(started, not finished, and no command holds it: it failed or was interrupted), out of date (a
report missing or older than its sources), or pending (for a directory the stage commands built,
each command's output, there or not); and the privacy budget
of the run's ledger, with the settings it was created with: epsilon spent (data-independent, the
only figure of the ledger that may be shown) and left; and the epsilon to quote of a current
report. Reads only public records and the ledger's settings and
running totals; works while a run is going on (SQLite in WAL mode lets a reader in beside the
writer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pate.aggregation.ledger_totals import stored_budget
from pate.aggregation.votes_ledger import ledgers_beside, recorded_ledger
from pate.config import RunConfig, recorded_config
from pate.errors import LedgerError, UserError
from pate.report.freshness import current_report
from pate.rundir import RunDir
from teachers.manifest import TeachersManifest


def _stages(run: RunDir, config: RunConfig, log: list[str]) -> list[dict[str, Any]]:
    """The stages of ``pate run``: done (stages.json), started in ``log`` (log.txt's lines), or
    pending."""
    done = run.finished_stages()
    started = set()
    for line in log:
        parts = line.split(" ", 1)
        if len(parts) == 2 and parts[1].endswith(": started"):
            started.add(parts[1].removesuffix(": started"))
    unfinished = _unfinished(run)
    out = []
    stale = "report" in done and current_report(run.root) is None  # pate run writes it again
    for stage in config.stages():
        if stage == "report" and stale:
            out.append({"stage": stage, "state": "out of date"})
        elif stage in done:
            out.append({"stage": stage, "state": "done", "seconds": done[stage]})
        else:
            out.append({"stage": stage,
                        "state": unfinished if stage in started else "pending"})
    return out


def _unfinished(run: RunDir) -> str:
    """A stage started and not finished: running where a command holds the directory, else
    stopped."""
    return "running" if run.in_use() else "stopped"


def _stages_by_hand(run: RunDir, manifest: TeachersManifest | None) -> list[dict[str, Any]]:
    """A directory the stage commands built (no config.toml): each command's output, there or
    not (the teachers' manifest says whether every teacher is trained; where not, whether a
    command trains them now and how many are: ``trained`` of ``teachers``)."""
    student = run.read_json(run.student_metrics)
    return [{"stage": "teachers", **({"state": "not run"} if manifest is None else
                                       {"state": "done"} if manifest.done else
                                       _teachers_unfinished(run, manifest))},
              {"stage": "votes", "state": "done" if run.votes.is_file() else "not run"},
              {"stage": "student", "state": "not run" if student is None else "done",
               **({} if student is None or student.get("seconds") is None
                  else {"seconds": student["seconds"]})},
              {"stage": "report", "state": "not run" if not run.report_json.is_file()
               else "done" if current_report(run.root) is not None else "out of date"}]


def _teachers_unfinished(run: RunDir, manifest: TeachersManifest) -> dict[str, Any]:
    """Teachers not all trained: running (a command holds the directory) or stopped, and
    how many of how many are trained where the manifest says (a damaged one: not said)."""
    state = {"state": _unfinished(run)}
    total = manifest.record.get("num_teachers")
    try:
        trained = sum(len(s.teachers) for s in manifest.shards if s.teachers is not None)
    except (KeyError, ValueError, TypeError, AttributeError):  # a damaged manifest
        return state
    return {**state, "trained": trained, "teachers": total} if isinstance(total, int) else state


def _budget(run: RunDir) -> dict[str, Any] | None:
    """The budget of the ledger that charges the run's votes (its own ``ledger.db``, or the one
    recorded beside them, a PostgreSQL URL say), read without opening it for writing
    (``stored_budget``); where it cannot be read here, where it is and why."""
    url = recorded_ledger(run.root)
    if url is None:
        return None
    try:
        b = stored_budget(url)
        if b is None:
            return None
    except LedgerError as exc:  # a server down, a password only the service is given
        return {"ledger": url, "unreadable": str(exc)}
    return {"ledger": url, "epsilon_budget": b.epsilon_budget, "epsilon_spent": b.epsilon_spent,
            "epsilon_left": max(0.0, b.epsilon_budget - b.epsilon_spent), "delta": b.delta,
            "basis": b.basis, "queries": b.queries, "answered": b.answered,
            "other_ledgers": ledgers_beside(run.root)}


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """The stages and the budget of a run directory."""
    run = RunDir(run_dir)
    run.require_dir()
    if not any(p.exists() for p in (run.config, run.log, run.stages, run.partition, run.teachers,
                                    run.votes, run.ledger, run.labels, run.student, run.dpsgd,
                                    run.comparison, run.report, run.audit)):
        raise UserError(f"{run}: holds nothing of a run (no config.toml, teachers, votes, "
                        "labels or student): not a run directory, or one not started")
    config = recorded_config(run.config)
    log = run.log_lines()
    manifest = TeachersManifest.read(run.root)
    return {"run": str(run), "name": None if config is None else config.name,
            "stages": (_stages_by_hand(run, manifest) if config is None
                       else _stages(run, config, log)),
            "networks": _networks(run, manifest),
            "budget": _budget(run), "answers_in_hand": run.labels.is_file(),
            "last_log": next(reversed(log), None),
            "epsilon_to_quote": _to_quote(run)}


def _networks(run: RunDir, manifest: TeachersManifest | None) -> dict[str, str | None]:
    """The networks the run's teachers and its student were trained as: a built-in's name or a
    user's import path (settings, public), None where none was trained yet."""
    student = run.read_json(run.student / "model.json")
    return {"teachers": None if manifest is None else manifest.record.get("model"),
            "student": student.get("arch") if isinstance(student, dict) else None}


def _to_quote(run: RunDir) -> dict[str, Any] | None:
    """The report's ``epsilon_to_quote`` (``{"epsilon", "delta", "figure"}`` and, where it is
    above the budget, ``"above_budget"``, why: public figures, docs/privacy-math.md §12) where
    the report is current; None where there is none, or it is out of date. The report's other
    figures stay where they are."""
    report = current_report(run.root)
    return None if report is None else report.get("epsilon_to_quote")
