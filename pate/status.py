"""``pate status``: where a run stands (docs/cli.md): each stage of ``pate run`` done (with its
seconds), running or interrupted (started in ``log.txt`` but not finished), or pending; and the
privacy budget of the run's ledger: epsilon spent (data-independent, the only figure that may be
shown) and left. Reads only public records and the ledger's running totals; works while a run is
going on (SQLite in WAL mode lets a reader in beside the writer)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from analysis.orders import default_orders
from pate.aggregation.ledger import Ledger
from pate.config import STAGES, RunConfig, parse_config
from pate.errors import UserError
from pate.rundir import RunDir


def _stages(run: RunDir, config: RunConfig | None) -> list[dict[str, Any]]:
    done = run.finished_stages()
    started = set()
    if run.log.is_file():
        for line in run.log.read_text().splitlines():
            parts = line.split(" ", 1)
            if len(parts) == 2 and parts[1].endswith(": started"):
                started.add(parts[1].removesuffix(": started"))
    out = []
    for stage in STAGES if config is None else config.stages():
        if stage in done:
            out.append({"stage": stage, "state": "done", "seconds": done[stage]})
        else:
            out.append({"stage": stage,
                        "state": "running or interrupted" if stage in started else "pending"})
    return out


def _budget(run: RunDir, config: RunConfig | None) -> dict[str, Any] | None:
    if config is None or not run.ledger.is_file():
        return None
    a = config.aggregator
    ledger = Ledger(run.ledger_url, default_orders(), a.delta, a.budget_epsilon)
    try:
        b = ledger.budget()
    finally:
        ledger.close()
    return {"epsilon_budget": b.epsilon_budget, "epsilon_spent": b.epsilon_spent,
            "epsilon_left": max(0.0, b.epsilon_budget - b.epsilon_spent), "delta": b.delta,
            "basis": b.basis, "queries": b.queries, "answered": b.answered}


def run_status(run_dir: str | Path) -> dict[str, Any]:
    """The stages and the budget of a run directory."""
    run = RunDir(run_dir)
    if not run.root.is_dir():
        raise UserError(f"{run}: no such run directory")
    config = (parse_config(run.config.read_text(), str(run.config)) if run.config.is_file()
              else None)
    last = run.log.read_text().splitlines()[-1] if run.log.is_file() else None
    return {"run": str(run), "name": None if config is None else config.name,
            "stages": _stages(run, config), "budget": _budget(run, config), "last_log": last}
