"""``pate status``: the stages of a run directory and its ledger's budget, during a run (a
stage started but not finished) and after."""

from __future__ import annotations

import json
import os
import sqlite3
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
    run.write_config(dump_config(config))
    run.finish_stage("teachers", 3.5)
    run.append_log("teachers: finished in 3.5 s")
    run.append_log("votes: started")
    assert main(["status", "--run", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    states = {s["stage"]: s["state"] for s in status["stages"]}
    assert states == {"teachers": "done", "votes": "stopped",
                      "student-confident": "pending", "student-active": "pending",
                      "compare": "pending", "report": "pending"}
    assert status["budget"] is None and status["last_log"].endswith("votes: started")

    # a ledger with charges: spent and left, data-independent
    a = config.aggregator
    labels = PrivateLabels(np.tile([15, 5, 0, 0, 0, 0, 0, 0, 0, 0], (30, 1)), GNMax(sigma=2.0),
                           epsilon_budget=a.budget_epsilon, delta=a.delta, ledger=run.ledger)
    labels.ask(np.arange(30))
    spent = labels.ledger.budget().epsilon_spent
    with labels.ledger.sanitised_releases():  # a writer holds the ledger's write lock
        assert main(["status", "--run", str(run)]) == 0  # reads only: not held up by it
    labels.close()
    out = capsys.readouterr().out
    assert f"epsilon {spent:.4g} spent of {a.budget_epsilon:g}" in out
    assert "votes                stopped" in out
    with run.exclusive():  # a pate run holds the directory
        assert main(["status", "--run", str(run)]) == 0
        assert "votes                running" in capsys.readouterr().out
    # a report said done in stages.json but missing is out of date (pate run writes it again)
    run.finish_stage("report", 0.5)
    assert main(["status", "--run", str(run), "--json"]) == 0
    states = {s["stage"]: s["state"] for s in json.loads(capsys.readouterr().out)["stages"]}
    assert states["report"] == "out of date"
    # totals that the requests do not add up to (edited by hand) are not shown as the budget
    with sqlite3.connect(run.ledger) as db:
        db.execute("UPDATE ledger_budget SET queries = 0")
    assert main(["status", "--run", str(run), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert "budget totals differ from the sum of the recorded requests" in budget["unreadable"]


def test_status_of_a_missing_run_is_one_line(tmp_path: Path,
                                             capsys: pytest.CaptureFixture) -> None:
    assert main(["status", "--run", str(tmp_path / "none")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no such run directory" in err
    (tmp_path / "data").mkdir()  # a folder, but not a run's (a slip of the path)
    (tmp_path / "data" / "train.csv").write_text("a,b\n")
    assert main(["status", "--run", str(tmp_path / "data")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "holds nothing of a run" in err[0]
    assert main(["status", "--run", str(tmp_path / "data" / "train.csv")]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "train.csv: a file, not a run directory" in err[0]


def test_status_of_a_run_built_by_hand(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """No config.toml (the stage commands built it): each command's output, there or not, and
    the budget with the settings the ledger was created with (here not the presets')."""
    rng = np.random.default_rng(0)
    votes = tmp_path / "votes.npz"  # the digits pool: 250 rows, 10 classes, 20 teachers
    np.savez(votes, votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    run = tmp_path / "run"
    assert main(["--quiet", "student", "train", "--run", str(run), "--votes", str(votes),
                 "--ledger", f"sqlite:///{run / 'ledger.db'}", "--dataset", "digits",
                 "--method", "supervised", "--mechanism", "gnmax", "--sigma", "40",
                 "--budget-epsilon", "77", "--delta", "1e-6", "--queries", "20",
                 "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main(["status", "--run", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    states = {s["stage"]: s["state"] for s in status["stages"]}
    assert states == {"teachers": "not run", "votes": "not run", "student": "done",
                      "report": "not run"}
    assert status["networks"] == {"teachers": None, "student": "cnn"}  # digits' default
    assert status["stages"][2]["seconds"] > 0
    budget = status["budget"]
    assert (budget["epsilon_budget"], budget["delta"], budget["queries"]) == (77.0, 1e-6, 20)
    assert 0 < budget["epsilon_spent"] < 77
    (run / "teachers").mkdir()
    (run / "teachers" / "manifest.json").write_text('{"done": false}')
    assert main(["status", "--run", str(run)]) == 0
    out = capsys.readouterr().out
    assert "teachers             stopped\n" in out and "spent of 77" in out
    # how many teachers are trained, and whether a command is training them now
    (run / "teachers" / "manifest.json").write_text(json.dumps({
        "done": False, "num_teachers": 8,
        "shards": {"1": {"sha256": "0" * 64, "teachers": [4, 8]}}}))
    assert main(["status", "--run", str(run)]) == 0
    assert "teachers             stopped, 4 of 8 teachers trained" in capsys.readouterr().out
    assert main(["status", "--run", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["stages"][0] == {
        "stage": "teachers", "state": "stopped", "trained": 4, "teachers": 8}
    with RunDir(run).exclusive():  # as pate teachers train holds it
        assert main(["status", "--run", str(run)]) == 0
    assert "teachers             running, 4 of 8 teachers trained" in capsys.readouterr().out
    # a report older than what it is made from (a student retrained since) is out of date
    from pate.report.freshness import REPORT_FORMAT

    (run / "report").mkdir()
    report = run / "report" / "report.json"
    quoted = {"epsilon": 3.25, "delta": 1e-6, "figure": "sanitised, released"}
    report.write_text(json.dumps({"report_format": REPORT_FORMAT, "epsilon_to_quote": quoted}))
    (run / "report" / "report.html").write_text("<html></html>")  # written with it
    metrics = run / "student" / "metrics.json"
    os.utime(report, ns=(metrics.stat().st_mtime_ns + 10**9,) * 2)
    assert main(["status", "--run", str(run)]) == 0  # a current report's figure to quote
    assert ("  epsilon to quote: 3.25 at delta 1e-06 (sanitised, released; the report says "
            "what it rests on)") in capsys.readouterr().out.splitlines()
    for expected, said in (("done", quoted), ("out of date", None)):
        assert main(["status", "--run", str(run), "--json"]) == 0
        status = json.loads(capsys.readouterr().out)
        states = {s["stage"]: s["state"] for s in status["stages"]}
        assert states["report"] == expected and status["epsilon_to_quote"] == said
        os.utime(metrics, ns=(report.stat().st_mtime_ns + 10**9,) * 2)
    # votes in the run directory charged to a ledger elsewhere (recorded beside them)
    other = tmp_path / "other"
    other.mkdir()
    (other / "votes.npz").write_bytes(votes.read_bytes())
    assert main(["--quiet", "student", "train", "--run", str(other), "--votes",
                 str(other / "votes.npz"), "--ledger", f"sqlite:///{tmp_path / 'kept.db'}",
                 "--dataset", "digits", "--method", "supervised", "--mechanism", "gnmax",
                 "--sigma", "40", "--budget-epsilon", "55", "--delta", "1e-6", "--queries",
                 "10", "--epochs", "1"]) == 0
    capsys.readouterr()
    assert main(["status", "--run", str(other), "--json"]) == 0
    budget = json.loads(capsys.readouterr().out)["budget"]
    assert budget["ledger"].endswith("/kept.db") and not (other / "ledger.db").exists()
    assert (budget["epsilon_budget"], budget["queries"]) == (55.0, 10)
    (other / "ledger-url.txt").write_text("postgresql://nobody@127.0.0.1:9/none\n")
    assert main(["status", "--run", str(other)]) == 0
    said = capsys.readouterr().out
    assert "budget: its ledger cannot be read here: " in said
    assert said.count("postgresql://nobody@127.0.0.1:9/none") == 1  # named once

    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):  # the ledger moved away
        (run / name).unlink(missing_ok=True)
    assert main(["status", "--run", str(run)]) == 0
    assert "no ledger here, though answers were charged to one" in capsys.readouterr().out


def test_a_log_emptied_or_damaged_by_hand_is_read(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture) -> None:
    """``log.txt`` is a plain file a user may edit: empty, or with a byte that is no UTF-8, the
    status still says the stages (it was an internal error)."""
    from pate.config import dump_config, load_config

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.toml").write_text(dump_config(load_config("digits-tiny")))
    (run / "log.txt").write_text("")
    assert main(["status", "--run", str(run), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["last_log"] is None
    (run / "log.txt").write_bytes(b"2026-11-29T12:00:00 teachers: started\n\xff\xfe edited\n")
    assert main(["status", "--run", str(run), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["last_log"] == "\ufffd\ufffd edited"
    assert {s["stage"]: s["state"] for s in status["stages"]}["teachers"] == "stopped"
