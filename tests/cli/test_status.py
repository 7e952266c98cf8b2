"""``pate status``: the stages of a run directory and its ledger's budget, during a run (a
stage started but not finished) and after."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import GNMax
from pate.api import PrivateLabels
from pate.cli.main import main
from pate.config import dump_config, load_config
from pate.rundir import RunDir


def test_status_mid_run_and_after(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = load_config("digits-tiny")
    run = RunDir(tmp_path / "run").create()
    run.write_text(run.config, dump_config(config))
    run.finish_stage("teachers", 3.5)
    run.append_log("teachers: finished in 3.5 s")
    run.append_log("votes: started")
    assert main(["status", "--run", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    states = {s["stage"]: s["state"] for s in status["stages"]}
    assert states == {"teachers": "done", "votes": "running or interrupted",
                      "student-confident": "pending", "student-active": "pending",
                      "compare": "pending", "report": "pending"}
    assert status["budget"] is None and status["last_log"].endswith("votes: started")

    # a ledger with charges: spent and left, data-independent
    a = config.aggregator
    labels = PrivateLabels(np.tile([15, 5, 0, 0, 0, 0, 0, 0, 0, 0], (30, 1)), GNMax(sigma=2.0),
                           epsilon_budget=a.budget_epsilon, delta=a.delta, ledger=run.ledger)
    labels.ask(np.arange(30))
    spent = labels.ledger.budget().epsilon_spent
    labels.close()
    assert main(["status", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert f"epsilon {spent:.4g} spent of {a.budget_epsilon:g}" in out
    assert "votes                running or interrupted" in out


def test_status_of_a_missing_run_is_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["status", "--run", str(tmp_path / "none")]) == 2
    assert capsys.readouterr().err.count("\n") == 1
