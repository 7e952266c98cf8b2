"""``pate run`` end to end on the digits-tiny preset: every stage runs for real (Ray teachers, a
real ``pate serve`` process, the student's query rounds, the report), and a rerun skips them."""

import json
import os
import re
import stat
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest
from student_support import released

from pate.api import Teachers
from pate.cli.main import main
from pate.config import STAGES, RunConfig, dump_config, load_config, parse_config
from pate.config_changes import config_differences
from pate.data.datasets import load_dataset
from pate.data.task import load_task
from pate.data.votes_file import load_private_fingerprint
from pate.errors import UserError
from pate.pipeline import _check_data, _other_budgets, prepare_run_dir
from pate.progress import quiet
from pate.rundir import RunDir
from student.rounds import Received
from teachers.defaults import TEACHERS


def test_pipeline_end_to_end_then_resume(tmp_path: Path,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    first = subprocess.run([sys.executable, "-m", "pate", "run", "digits-tiny", "--run",
                            str(run)], capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    out = json.loads(first.stdout.strip().splitlines()[-1])
    assert out["report"] == str(run / "report" / "report.html")
    # the printed line holds no private figure: no data-dependent epsilon, only public columns
    assert out["summary"] and all("epsilon_data_dependent" not in r
                                  and "epsilon_data_independent_expected" not in r
                                  for r in out["summary"])
    assert "epsilon_smooth_sensitivity" in out["summary"][0]
    assert out["epsilon_to_quote"] == {"epsilon": out["summary"][0]["epsilon_to_quote"],
                                       "delta": 1e-5, "figure": "sanitised, released"}
    for name in ("config.toml", "partition.json", "votes.npz", "labels.npz", "ledger.db",
                 "student/metrics.json", "student/schema.json", "report/report.json",
                 "report/report.html", "stages.json"):
        assert (run / name).is_file(), name
    for private in ("votes.npz", "ledger.db", "service.token", "config.toml"):
        assert stat.S_IMODE((run / private).stat().st_mode) == 0o600, private
    assert stat.S_IMODE(run.stat().st_mode) == 0o700
    with np.load(run / "votes.npz") as f:  # the delta's bound travels with the votes
        assert int(f["private_records"]) == RunDir(run).private_records() == 1297
        votes = f["votes"]
    # the run's teachers, from Python, vote as they did (the pool: the test split's first half)
    pool = load_dataset("digits").test_x[:len(votes)]
    loaded = Teachers.load(run)
    np.testing.assert_array_equal(loaded.vote(pool), votes)
    # and their ledgers are entered under the key the run's votes carry (budget registry)
    assert loaded.private_fingerprint_ == load_private_fingerprint(run / "votes.npz")

    report = json.loads((run / "report" / "report.json").read_text())
    metrics = json.loads((run / "student" / "metrics.json").read_text())
    with np.load(run / "labels.npz") as f:
        labels = f["label"]
    row = report["table"][0]
    assert row["accuracy"] == metrics["accuracy"]
    # the baseline of always the evaluation rows' most frequent class, which it must beat
    assert 0.05 < metrics["majority_accuracy"] < 0.2 < metrics["accuracy"]
    assert "Always the most frequent class" in (run / "report" / "report.html").read_text()
    assert row["epsilon_spent"] == metrics["epsilon"]["data_independent"]
    assert row["queries_answered"] == int((labels >= 0).sum()) > 0
    assert 0 < row["epsilon_data_dependent"] <= row["epsilon_data_independent_expected"]
    # the realised data-independent epsilon is what the run's own ledger charged
    assert row["epsilon_data_independent"] == pytest.approx(row["epsilon_spent"], rel=1e-9)
    stages = json.loads((run / "stages.json").read_text())
    assert set(stages) == {"teachers", "votes", "student-confident", "student-active",
                           "compare", "report"}
    # round 2 asks Confident-GNMax about rows round 1 did not, those its student was least sure of
    first_round, active_round = metrics["rounds"]
    assert (first_round["select"], active_round["select"]) == ("random", "uncertainty")
    assert active_round["mechanism"]["mechanism"] == "confident"
    with np.load(run / "labels.npz") as f:
        asked = f["pool_index"]
    assert len(np.unique(asked)) == len(asked) == first_round["queries"] + active_round["queries"]
    check_owner_evaluation(run, report, metrics)

    # progress: stderr is a pipe here, so plain lines (one per stage and per student epoch), and
    # every stage's start and end in log.txt
    epochs = metrics["epochs"]
    for e in range(1, epochs + 1):
        for stage in ("student-confident", "student-active"):
            assert f"pate run: {stage}: epoch {e} done" in first.stderr
    log = (run / "log.txt").read_text().splitlines()
    for stage in stages:
        assert any(line.endswith(f" {stage}: started") for line in log), stage
        assert any(f" {stage}: finished in " in line for line in log), stage
    assert sum(" student-confident: epoch " in line for line in log) == epochs
    assert sum(" student-active: epoch " in line for line in log) == epochs

    capsys.readouterr()
    # what an attempt killed between writing a file and renaming it left is removed on rerun;
    # a file of the user's that only looks alike is not
    left = [run / ".votes.npz.k2j_x9ab.tmp", run / "student" / ".model.safetensors.a1b2c3d4.tmp"]
    for path in left:
        path.write_bytes(b"half")
        os.utime(path, (time.time() - 3600,) * 2)  # untouched for an hour
    (run / ".notes.tmp").write_text("mine")
    (run / ".report.json.z9y8x7w6.tmp").write_bytes(b"")  # another command writing it now
    assert main(["run", "digits-tiny", "--run", str(run)]) == 0  # in-process: no new imports
    assert not any(path.exists() for path in left) and (run / ".notes.tmp").exists()
    assert (run / ".report.json.z9y8x7w6.tmp").exists()
    assert "removed 2 unfinished write(s)" in (run / "log.txt").read_text()
    second = capsys.readouterr().err
    for stage in stages:
        assert f"{stage}: done already, skipped" in second
    assert json.loads((run / "stages.json").read_text()) == stages
    assert main(["run", "digits-tiny", "--run", str(run), "--quiet"]) == 0
    assert capsys.readouterr().err == ""
    assert not quiet()  # for that command only, though it ran in this process

    # a report of an older layout is written again, not reused
    old = {k: v for k, v in report.items() if k != "report_format"}
    (run / "report" / "report.json").write_text(json.dumps(old))
    assert main(["run", "digits-tiny", "--run", str(run)]) == 0
    assert "report: started" in capsys.readouterr().err
    again = json.loads((run / "report" / "report.json").read_text())
    assert again["report_format"] == report["report_format"] and again["table"] == report["table"]
    # so is one whose page, a figure or its owner-only page was deleted since (status says so
    # before)
    assert again["owner_evaluation"] == "owner-evaluation.html"
    for gone in ("report.html", next(iter(again["figures"].values())), "owner-evaluation.json"):
        (run / "report" / gone).unlink()
        assert main(["status", "--run", str(run), "--json"]) == 0
        states = {s["stage"]: s["state"] for s in json.loads(capsys.readouterr().out)["stages"]}
        assert states["report"] != "done"
        assert main(["run", "digits-tiny", "--run", str(run)]) == 0
        assert "report: started" in capsys.readouterr().err
        assert (run / "report" / gone).is_file()
    # report.json is written last: a report stopped part-way (here its page cannot be
    # written) leaves none that would be taken as current
    for name in ("report.json", "report.html"):
        (run / "report" / name).unlink()
    (run / "report" / "report.html").mkdir()
    assert main(["report", "--run", str(run)]) != 0
    assert not (run / "report" / "report.json").exists()
    (run / "report" / "report.html").rmdir()
    capsys.readouterr()

    # a stage stopped after its round asked (in its training, say) only trains when resumed: it
    # asks and spends nothing more
    stopped = json.loads((run / "stages.json").read_text())
    del stopped["student-active"]
    (run / "stages.json").write_text(json.dumps(stopped))
    assert main(["run", "digits-tiny", "--run", str(run), "--quiet"]) == 0
    resumed = json.loads((run / "student" / "metrics.json").read_text())
    assert resumed["epsilon"]["data_independent"] == metrics["epsilon"]["data_independent"]
    assert (resumed["queries"], resumed["asked_this_round"]) == (metrics["queries"], 0)
    with np.load(run / "labels.npz") as f:
        np.testing.assert_array_equal(f["pool_index"], asked)
    assert [r["round"] for r in json.loads((run / "student" / "rounds.json").read_text())] == [
        "student-confident", "student-active"]
    # a stage stopped within its round asks the rest of it, not a whole round again
    kept = Received.load(run / "labels.npz").first(30)
    kept.save(run / "labels.npz")
    rounds = json.loads((run / "student" / "rounds.json").read_text())
    (run / "student" / "rounds.json").write_text(json.dumps([{**rounds[0], **kept.counts()}]))
    (run / "stages.json").write_text(json.dumps({"teachers": 1.0, "votes": 1.0}))
    assert main(["run", "digits-tiny", "--run", str(run), "--quiet"]) == 0
    rounds = json.loads((run / "student" / "rounds.json").read_text())
    assert [(r["round"], r["queries"]) for r in rounds] == [
        ("student-confident", 30), ("student-confident", 170), ("student-active", 50)]
    assert len(Received.load(run / "labels.npz")) == 250


def check_owner_evaluation(run: Path, report: dict, metrics: dict) -> None:
    """The compare stage's owner-only page: apart from the report, private, one row per model
    with the student's ratio, DP-SGD trained to the student's two epsilons, and the curve's
    points in the report with epsilon growing with the queries used."""
    assert stat.S_IMODE((run / "comparison").stat().st_mode) == 0o700
    # all of it private, the DP-SGD models and their metrics too
    for path in (run / "comparison").rglob("*"):
        assert stat.S_IMODE(path.stat().st_mode) == (0o700 if path.is_dir() else 0o600), path
    assert len(list((run / "comparison").glob("dpsgd-*/model.pt"))) == 2
    for private in ("report/owner-evaluation.json", "report/owner-evaluation.html"):
        assert stat.S_IMODE((run / private).stat().st_mode) == 0o600, private
    html = (run / "report" / "owner-evaluation.html").read_text()
    assert "Owner only: not for publication" in html
    assert "not for publication" not in (run / "report" / "report.html").read_text()
    owner = json.loads((run / "report" / "owner-evaluation.json").read_text())
    comparison = json.loads((run / "comparison" / "metrics.json").read_text())
    models = [row["model"][:3] for row in owner["rows"]]
    assert models == ["(a)", "(b)", "(b)", "(c)", "(d)"]
    for row in owner["rows"]:
        assert 0 < row["accuracy"] <= 1
        assert row["student_ratio"] == pytest.approx(metrics["accuracy"] / row["accuracy"])
    # log.txt is public: the compare stage says what it trained, not how well
    compare = [line for line in (run / "log.txt").read_text().splitlines()
               if " compare: " in line]
    assert compare and not any("accuracy" in line for line in compare), compare
    targets = comparison["student_epsilon"]
    # the student's sanitised epsilon is the one released (with noise) once, by the last round
    assert targets["sanitised"] == metrics["epsilon"]["data_dependent_sanitised"] is not None
    assert [e for _, e in released(run / "ledger.db")] == [targets["sanitised"]]
    assert not (run / "sanitised-releases.json").exists()
    assert report["table"][0]["epsilon_smooth_sensitivity"] == targets["sanitised"]
    assert targets["data-independent"] == metrics["epsilon"]["data_independent"]
    for d in comparison["dpsgd"]:  # calibrated to the target from below
        assert 0.97 * targets[d["at"]] <= d["epsilon"] <= targets[d["at"]] * (1 + 1e-9)
    # the curve holds DP-SGD's accuracies: the owner-only page's, not the report's
    curve = owner["privacy_utility"]["pate"]
    assert [p["fraction"] for p in curve] == [0.5, 1.0]
    assert curve[0]["epsilon_data_independent"] < curve[1]["epsilon_data_independent"]
    assert curve[1]["epsilon_data_independent"] == pytest.approx(
        metrics["epsilon"]["data_independent"], rel=1e-6)
    assert owner["figures"] == {"privacy_utility.png": "figures/privacy_utility.png"}
    assert "privacy_utility" not in report
    assert "privacy_utility.png" not in report["figures"]
    page = (run / "report" / "report.html").read_text()
    assert page.count("data:image/png;base64,") == 4 and 'href="owner-evaluation.html"' in page
    # what the epsilons rest on, in the Details
    assert report["private_records"] == 1297 and "1297; δ = 1e-05 = 0.013 / n" in page
    assert "T = 6, σ1 = 2, σ2 = 1" in page and "<td>improved</td>" in page
    assert "<title>PATE privacy-utility report: run (digits-tiny)</title>" in page
    assert page.count("<figcaption>") == 4 and "(PATE 2018, Figure 4). Private." in page


def test_a_budget_spent_by_the_first_round_does_not_stop_the_run(tmp_path: Path) -> None:
    """The later round finds the budget spent: the student keeps its answers, the run goes on
    to the report (a rerun would otherwise meet the same refusal, for good)."""
    text = dump_config(load_config("digits-tiny")).replace(
        "budget_epsilon = 1000.0", "budget_epsilon = 150.0").replace(
        "[compare]\nenabled = true", "[compare]\nenabled = false").replace(
        "epochs = 40", "epochs = 5")  # the student's: the budget is what is tested
    (tmp_path / "c.toml").write_text(text)
    proc = subprocess.run([sys.executable, "-m", "pate", "run", str(tmp_path / "c.toml"),
                           "--run", str(tmp_path / "r")], capture_output=True, text=True,
                          timeout=900)  # a process of its own: the teachers' stage starts Ray
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "budget exhausted after" in proc.stderr and "student-active: finished" in proc.stderr
    rounds = json.loads((tmp_path / "r" / "student" / "rounds.json").read_text())
    assert len(rounds) == 1 and rounds[0]["queries"] < 200  # the active round asked nothing
    assert (tmp_path / "r" / "report" / "report.html").is_file()


def test_a_directory_the_separate_commands_made_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Teachers trained by `pate teachers train` (no config.toml) have settings pate run cannot
    know: it refuses the directory and writes nothing into it."""
    run = tmp_path / "run"
    (run / "teachers").mkdir(parents=True)
    (run / "partition.json").write_text('{"num_rows": 1297}')
    assert main(["run", "digits-tiny", "--run", str(run), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "holds what other commands made (partition.json, teachers)" in err
    assert sorted(p.name for p in run.iterdir()) == ["partition.json", "teachers"]
    mine = tmp_path / "mine"  # a folder of the user's own files: said so
    mine.mkdir()
    (mine / "notes.txt").write_text("hi")
    assert main(["run", "digits-tiny", "--run", str(mine), "--quiet"]) == 2
    assert ("mine is not empty (notes.txt) and is no run directory: pate run needs a new or "
            "empty --run directory") in capsys.readouterr().err
    assert [p.name for p in mine.iterdir()] == ["notes.txt"]


def test_rerun_with_another_config_is_refused(tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o755)
    run.chmod(0o755)
    (run / "config.toml").write_text(
        'name = "other"\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n'
        "budget_epsilon = 1\ndelta = 1e-5\n")
    (run / "votes.npz").write_bytes(b"")  # a stage made something
    assert main(["run", "digits-tiny", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "different configuration (other data.dataset, " in err and err.count("\n") == 1
    assert "name" not in err.split("(other ")[1].split(", on which")[0]  # a label only
    assert stat.S_IMODE(run.stat().st_mode) == 0o755  # a directory refused is left as it was
    # without its config.toml, a run's finished stages would be taken for the new config's
    (run / "config.toml").unlink()
    (run / "stages.json").write_text('{"teachers": 1.0, "votes": 1.0}')
    assert main(["run", "digits-tiny", "--run", str(run)]) == 2
    err = capsys.readouterr().err
    assert "no config.toml; use a new --run directory" in err and err.count("\n") == 1
    assert not (run / "config.toml").exists()


def test_a_config_mended_after_a_failed_start_replaces_it(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A first attempt that stopped before any stage made anything (killed at the teachers'
    start, say) leaves config.toml and log.txt only; the mended config takes its place instead
    of being refused. A model that does not import, data that does not load, or a delta too
    large for it, stops before the run directory is made."""
    tiny = dump_config(load_config("digits-tiny"))
    run = tmp_path / "run"
    config = tmp_path / "nosuchpkg.toml"
    config.write_text(tiny.replace("[teachers]\n", '[teachers]\nmodel = "nosuchpkg.mod:f"\n'))
    assert main(["run", str(config), "--run", str(run), "--quiet"]) == 2
    assert "teachers.model 'nosuchpkg.mod:f': cannot import" in capsys.readouterr().err
    assert not run.exists()
    first, mended = (parse_config(tiny.replace("count = 10", f"count = {n}"), "t")
                     for n in (9, 10))
    prepare_run_dir(first, RunDir(run))
    RunDir(run).append_log("teachers: started")  # and killed there
    prepare_run_dir(mended, RunDir(run))
    assert parse_config((run / "config.toml").read_text(), "again") == mended
    assert "config.toml replaced" in (run / "log.txt").read_text()
    (run / "partition.json").write_text("{}")  # once a stage has made something: refused
    with pytest.raises(UserError, match=r"started with a different configuration \(other "
                                        r"teachers\.count, on which what it has made depends\)"
                                        r": repeat it, or use a new --run directory$"):
        prepare_run_dir(first, RunDir(run))  # no budget spent yet: no word of a second one
    (run / "ledger.db").write_bytes(b"")  # once a round has opened its ledger
    with pytest.raises(UserError, match=r": repeat it, or use a new --run directory \(with its "
                                        r"own ledger, .* unless aggregator\.ledger names one"):
        prepare_run_dir(first, RunDir(run))
    (run / "ledger.db").unlink()
    # but it may resume elsewhere: another Ray cluster, a GPU share, more workers
    moved = mended.model_copy(update={"teachers": mended.teachers.model_copy(update={
        "ray_address": "10.0.0.1:6379", "gpus_per_shard": 0.25, "workers": 4})})
    prepare_run_dir(moved, RunDir(run))
    assert parse_config((run / "config.toml").read_text(), "again") == moved
    assert "where the stages run changed" in (run / "log.txt").read_text()
    # the settings of stages not finished may be mended (a round that got no answer, a
    # comparison that could not run), not once their stage has finished
    RunDir(run).finish_stage("teachers", 1.0)
    RunDir(run).finish_stage("votes", 1.0)
    more = moved.model_copy(update={
        "student": moved.student.model_copy(update={"queries": 500}),
        "compare": moved.compare.model_copy(update={"enabled": False})})
    prepare_run_dir(more, RunDir(run))
    assert parse_config((run / "config.toml").read_text(), "again") == more
    assert ("config.toml: student.queries, compare.enabled changed, for the stages not "
            "finished") in (run / "log.txt").read_text()
    RunDir(run).finish_stage("student-confident", 1.0)
    with pytest.raises(UserError, match=r"other student\.queries, on which.*to train the "
                                        r"student again on the answers in hand, at no privacy "
                                        r"cost: pate student train --run .* --queries 0"):
        prepare_run_dir(moved, RunDir(run))
    renamed = more.model_copy(update={"name": "called otherwise"})  # what the report calls it
    prepare_run_dir(renamed, RunDir(run))
    assert "config.toml: name changed" in (run / "log.txt").read_text()
    more = renamed
    # an earlier version wrote DP-SGD's default network out: the same run, finished or not
    RunDir(run).finish_stage("report", 1.0)
    written = more.model_copy(update={"dpsgd": more.dpsgd.model_copy(
        update={"model": "tempered-cnn"})})
    unset = more.model_copy(update={"dpsgd": more.dpsgd.model_copy(update={"model": None})})
    RunDir(run).write_config(dump_config(written))
    prepare_run_dir(unset, RunDir(run))
    for change, message in (('dataset = "digits"\npool_size = 100000',
                             "the pool size (--pool-size, data.pool_size) must be"),
                            ("delta = 0.01", "pate: error: aggregator.delta 0.01 is at least 1/n"),
                            # DP-SGD's profiles and rate, refused after the teachers had
                            # trained and the rounds had charged the ledger before
                            ('noise = "laplace"\nencode = 1000000000',
                             "pate: error: dpsgd.encode: 1000000000 profiles of"),
                            ("lr = 1e39", "pate: error: [dpsgd]: lr must be below float32's")):
        config = tmp_path / "early.toml"
        config.write_text(tiny.replace('dataset = "digits"', change) if "pool" in change
                          else tiny.replace('noise = "gaussian"', change).replace(
                              "# encode = (not set)", "") if "encode" in change
                          else tiny.replace("lr = 4.0", change) if "1e39" in change
                          else tiny.replace("delta = 1e-05", change))
        assert main(["run", str(config), "--run", str(tmp_path / "early"), "--quiet"]) == 2
        assert message in capsys.readouterr().err
        assert not (tmp_path / "early").exists()



def test_a_default_written_out_is_the_same_run(tmp_path: Path) -> None:
    """A key left unset stands for its default: a finished run whose config writes it out (the
    pool, half the test split; the data's network; the method's network and learning rate;
    round 1's parameters for round 2) or leaves it out again is the same run, and the log says
    so; another value is still refused, by its key."""
    tiny = load_config("digits-tiny")
    run = RunDir(tmp_path / "run")
    prepare_run_dir(tiny, run)
    for stage in STAGES:
        run.finish_stage(stage, 1.0)
    pool = len(load_dataset("digits", need_train=False).test_y) // 2
    a = tiny.aggregator
    written = tiny.model_copy(update={
        "data": tiny.data.model_copy(update={"dataset": "digits", "pool_size": pool}),
        "teachers": tiny.teachers.model_copy(update={
            "model": "cnn", "batch_size": TEACHERS.batch_size, "lr": TEACHERS.lr}),
        "aggregator": a.model_copy(update={"interactive_threshold": a.threshold,
                                           "interactive_sigma1": a.sigma1,
                                           "interactive_sigma2": a.sigma2}),
        "student": tiny.student.model_copy(update={"arch": "cnn", "lr": 1e-3})})
    assert config_differences(tiny, written) == [] == config_differences(written, tiny)
    prepare_run_dir(written, run)
    assert parse_config(run.config.read_text(), "again") == written
    prepare_run_dir(tiny, run)  # left out again
    assert (run.log.read_text().count("config.toml: the same settings, a default written out "
                                      "or left out") == 2)
    other = written.model_copy(update={
        "data": written.data.model_copy(update={"pool_size": pool - 1}),
        "student": written.student.model_copy(update={"arch": "mlp"}),
        "aggregator": a.model_copy(update={"interactive_sigma2": a.sigma2 + 1})})
    with pytest.raises(UserError, match=r"other data\.pool_size, aggregator\.interactive_sigma2, "
                                        r"student\.arch, on which"):
        prepare_run_dir(other, run)
    with pytest.raises(UserError, match=r"other data\.pool_size, on which"):
        prepare_run_dir(tiny.model_copy(update={
            "data": tiny.data.model_copy(update={"pool_size": pool + 1})}), run)

def test_a_budget_is_the_ledgers_once_it_is_open(tmp_path: Path) -> None:
    """Before any round, the budget may be mended; once the run's ledger is open it holds the
    budget and delta it was created with, and a changed one is refused before config.toml is
    rewritten (it was written, then refused by the ledger, leaving the two at odds)."""
    tiny = load_config("digits-tiny")
    run = RunDir(tmp_path / "run")

    def budget(epsilon: float) -> RunConfig:
        return tiny.model_copy(update={"aggregator": tiny.aggregator.model_copy(
            update={"budget_epsilon": epsilon})})

    prepare_run_dir(budget(1000.0), run)
    (run.root / "partition.json").write_text("{}")
    prepare_run_dir(budget(2000.0), run)  # no ledger yet: mended
    run.ledger.write_bytes(b"")
    with pytest.raises(UserError, match=r"other aggregator\.budget_epsilon, on which"):
        prepare_run_dir(budget(3000.0), run)
    assert parse_config(run.config.read_text(), "kept").aggregator.budget_epsilon == 2000.0
    run.ledger.unlink()  # a shared ledger, recorded beside the votes when a round opened it
    (run.root / "ledger-url.txt").write_text("postgresql://pate@db.example/ledgers\n")
    with pytest.raises(UserError, match=r"other aggregator\.budget_epsilon, on which"):
        prepare_run_dir(budget(3000.0), run)


def test_a_mended_config_is_checked_as_a_new_one_is(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Settings of stages not finished may change on a rerun, and are checked before anything
    runs, as a new run's are: a budget that no longer covers two queries is refused before the
    student's stage would make its ledger with it."""
    tiny = load_config("digits-tiny")
    run = RunDir(tmp_path / "run")
    prepare_run_dir(tiny, run)
    run.write_json(run.partition, {"num_rows": 1297})
    run.finish_stage("teachers", 1.0)
    run.finish_stage("votes", 1.0)
    mended = tmp_path / "mended.toml"
    mended.write_text(dump_config(tiny).replace("budget_epsilon = ", "budget_epsilon = 1e-9\n# "))
    assert main(["run", str(mended), "--run", str(run.root), "--quiet"]) == 2
    assert "does not cover two queries" in capsys.readouterr().err
    assert parse_config(run.config.read_text(), "again") == tiny
    assert not run.ledger.exists()


def test_mistakes_training_would_reveal_late_are_refused_before_the_run_exists(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Each of these used to pass the config's validation, train the teachers, and fail at a
    later stage in a directory that its mended config could no longer use."""
    tiny = dump_config(load_config("digits-tiny"))
    for shift, role in enumerate(("private", "public", "test")):  # no row in two of them
        rows = "".join(f"{i % 7 + 7 * shift},{'ab'[i % 2]},{i % 2}\n" for i in range(60))
        (tmp_path / f"{role}.csv").write_text("x,c,y\n" + rows)
    table = tiny.replace('dataset = "digits"', "\n".join(
        f'{role} = "{tmp_path / role}.csv"' for role in ("private", "public", "test"))
        + '\nlabel = "y"')
    cases = [(tiny.replace("count = 10", "count = 5000"),
              "teachers.count 5000 is more than the number of private records"),
             (tiny.replace("budget_epsilon = 1000.0", "budget_epsilon = 0.5"),
              "aggregator.budget_epsilon 0.5 does not cover two queries"),
             (tiny.replace("budget_epsilon = 1000.0", "budget_epsilon = 8.0"),  # one query
              "does not cover two queries, the fewest a student can learn from"),
             (tiny.replace('select = "random"', 'select = "uncertainty"'), "student.select"),
             (tiny.replace("delta = 1e-05", "delta = 1e-3"),
              "(or aggregator.allow_large_delta = true)"),
             (table.replace("[teachers]\n", '[teachers]\nmodel = "cnn"\n'),
              "teachers.model cnn needs images; on tabular data use mlp"),
             (table.replace('method = "supervised"', 'method = "gan"'),
              "student.method gan is for images (the improved-GAN student generates images)"),
             (table.replace('method = "supervised"', 'method = "supervised"\narch = "cnn"'),
              "student.arch cnn needs images; on tabular data use mlp")]
    for text, message in cases:
        config = tmp_path / "c.toml"
        config.write_text(text)
        assert main(["run", str(config), "--run", str(tmp_path / "r"), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (tmp_path / "r").exists()


def test_a_budget_of_fewer_queries_than_classes_is_warned_of_before_training(
        tmp_path: Path) -> None:
    """digits has 10 classes; a budget that covers, at worst, 2 or 4 answered queries may leave
    the student with nothing to learn from once the teachers have trained: said up front (one
    is refused, above)."""
    tiny = load_config("digits-tiny")  # Confident-GNMax T 6, sigma1 2, sigma2 1: eps 7.59 each

    def budget(epsilon: float) -> RunConfig:
        return tiny.model_copy(update={"aggregator": tiny.aggregator.model_copy(
            update={"budget_epsilon": epsilon})})

    for epsilon, covered in ((12.0, "2 teachers' answers,"), (20.0, "4 teachers' answers,")):
        with pytest.warns(UserWarning, match=f"buys at most {covered} fewer than the 10"):
            _check_data(budget(epsilon), RunDir(tmp_path / "run"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        _check_data(budget(100.0), RunDir(tmp_path / "run"))


def test_more_queries_than_pool_rows_is_warned_of_or_refused_before_training(
        tmp_path: Path) -> None:
    tiny = load_config("digits-tiny")  # a pool of 250 rows
    many = tiny.model_copy(update={"student": tiny.student.model_copy(
        update={"queries": 200, "active_queries": 100})})
    with pytest.warns(UserWarning, match="300 queries in all .* for a pool of 250 rows"):
        _check_data(many, RunDir(tmp_path / "run"))
    # a round after the whole pool was asked for would find nothing left: refused up front,
    # before any budget is spent on the rounds that can run
    for queries, later in ((250, {"active_queries": 10}),
                           (200, {"active_queries": 50, "interactive_queries": 5})):
        none_left = tiny.model_copy(update={"student": tiny.student.model_copy(
            update={"queries": queries, **later})})
        key = list(later)[-1]
        with pytest.raises(UserError, match=rf"^student\.{key} {later[key]}: the rounds before it "
                                            r"ask for all 250 pool rows, .* or \w+ = 0\)$"):
            _check_data(none_left, RunDir(tmp_path / "run"))
    assert not (tmp_path / "run").exists()


def test_a_deal_that_leaves_a_teacher_without_rows_is_refused_before_the_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Dealt by record, whether every teacher gets a row depends on the rows: found with the
    other checks of the data, before the run directory is made."""
    tiny = load_config("digits-tiny")  # 1 297 private rows
    dealt = tiny.model_copy(update={"teachers": tiny.teachers.model_copy(
        update={"partition": "record", "count": 900})})
    config = tmp_path / "dealt.toml"
    config.write_text(dump_config(dealt))
    assert main(["run", str(config), "--run", str(tmp_path / "run"), "-q"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("pate: error: dealt by record, some of the 900 teachers get no rows")
    assert not (tmp_path / "run").exists()


def test_a_run_directory_in_use_is_refused(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    """Two `pate run`s on one directory would train the same stage at once."""
    from pate.rundir import RunDir

    assert not RunDir(tmp_path / "run").in_use()  # not there yet: nobody holds it
    run = RunDir(tmp_path / "run").create()
    with run.exclusive():  # another command holds it
        assert run.in_use()
        assert main(["run", "digits-tiny", "--run", str(run), "--quiet"]) == 2
        err = capsys.readouterr().err
        assert "is in use by another pate command" in err and err.count("\n") == 1
        # and the separate commands, which would train or release from the same files
        for argv in (["teachers", "train", "--dataset", "digits", "--teachers", "2"],
                     ["teachers", "votes"],
                     ["student", "train", "--dataset", "digits", "--mechanism", "gnmax",
                      "--sigma", "1", "--budget-epsilon", "9", "--delta", "1e-5",
                      "--method", "supervised"]):
            assert main(["--quiet", *argv, "--run", str(run)]) == 2
            assert "is in use by another pate command" in capsys.readouterr().err
    assert not run.stages.exists()
    with run.exclusive():  # released when its holder ends
        pass


def test_runs_on_one_private_dataset_can_share_one_budget(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``aggregator.ledger`` (relative to the config file) names a ledger that two run
    directories on the same private data both charge: one budget, as ``pate status`` of
    either shows; each run records it beside its votes."""
    from pate.status import run_status

    tiny = load_config("digits-tiny")
    tiny = tiny.model_copy(update={  # short trainings: the budget is what is tested
        "aggregator": tiny.aggregator.model_copy(update={"ledger": "shared/ledger.db"}),
        "student": tiny.student.model_copy(update={"epochs": 5}),
        "compare": tiny.compare.model_copy(update={"enabled": False})})
    (tmp_path / "shared").mkdir()
    spent = []
    for seed in (0, 1):  # other teachers, so that their votes are answered afresh
        config = tmp_path / f"c{seed}.toml"
        config.write_text(dump_config(tiny.model_copy(update={
            "teachers": tiny.teachers.model_copy(update={"seed": seed})})))
        run = tmp_path / f"run{seed}"
        assert main(["--quiet", "run", str(config), "--run", str(run)]) == 0
        assert not (run / "ledger.db").exists()
        assert (run / "ledger-url.txt").read_text().strip().endswith("/shared/ledger.db")
        # the votes carry which private data they protect: the same for both runs
        manifest = json.loads((run / "teachers" / "manifest.json").read_text())
        assert load_private_fingerprint(run / "votes.npz") == manifest["private_data_fingerprint"]
        spent.append(run_status(run)["budget"])
    assert spent[1]["queries"] > spent[0]["queries"] > 0
    assert spent[1]["epsilon_spent"] > spent[0]["epsilon_spent"]
    assert run_status(tmp_path / "run0")["budget"] == spent[1]  # one budget, seen from both
    assert "other ledger(s)" not in capsys.readouterr().err  # one ledger: nothing to warn of
    # a third run with a ledger of its own is warned of before anything trains (pate run's
    # checks of its data), as its ledger would be a second budget for the data
    own = load_config("digits-tiny")
    task = load_task(own.data.source())
    said = _other_budgets(own, RunDir(tmp_path / "run2"), task)
    assert said is not None and re.search(
        r"already charged to 1 other ledger\(s\) \(sqlite:///.*/shared/ledger\.db\): this "
        "run's ledger would be another budget", said)
    assert _other_budgets(load_config(str(tmp_path / "c0.toml")), RunDir(tmp_path / "run2"),
                          task) is None  # the shared one: nothing to say
    # said only once nothing refuses the run: a refusal is its one line
    (tmp_path / "c2.toml").write_text(dump_config(own.model_copy(update={
        "teachers": own.teachers.model_copy(update={"count": 10**6})})))
    capsys.readouterr()
    assert main(["--quiet", "run", str(tmp_path / "c2.toml"), "--run", str(tmp_path / "run2")]
                ) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "teachers.count 1000000 is more than" in err[0], err
    assert not (tmp_path / "run2").exists()
    # and a run it does not refuse says so once, not again when its ledger opens for the votes
    (tmp_path / "c3.toml").write_text(dump_config(tiny.model_copy(update={
        "aggregator": tiny.aggregator.model_copy(update={"ledger": None})})))
    assert main(["--quiet", "run", str(tmp_path / "c3.toml"), "--run", str(tmp_path / "run3")]
                ) == 0
    assert capsys.readouterr().err.count("other ledger(s)") == 1
    # the report says how many other ledgers charge the data, not where they are
    report = tmp_path / "run3" / "report"
    assert json.loads((report / "report.json").read_text())["other_ledgers"] == 1
    page = (report / "report.html").read_text()
    assert "Other ledgers of this private data" in page and "shared" not in page
    assert json.loads((tmp_path / "run0" / "report" / "report.json").read_text()
                      )["other_ledgers"] == 0  # written before run3's ledger was
