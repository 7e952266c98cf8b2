"""The privacy-utility report: numbers equal ``pate analyze`` and the metrics files; files are
private and self-contained; the HTML opens in a real browser."""

import contextlib
import io
import json
import math
import os
import shutil
import stat
import subprocess
from pathlib import Path

import numpy as np
import pytest

from analysis.costs import realised_rdp_independent
from analysis.mechanisms import ConfidentGNMax
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from pate.cli.main import main
from pate.config import dump_config, load_config
from pate.data.datasets import load_dataset, public_split
from pate.data.synthetic import synthetic_votes
from pate.errors import UserError
from pate.report.content import PRIVATE_TABLE_KEYS, public_rows
from pate.report.run_report import load_run_data, write_comparison
from pate.rundir import RunDir


def make_run(run_dir: Path, rounds: bool) -> dict:
    """A run directory as the pipeline leaves it, on the digits pool, with synthetic votes."""
    config = load_config("digits-tiny")
    (run_dir / "student").mkdir(parents=True)
    (run_dir / "dpsgd").mkdir()
    (run_dir / "teachers").mkdir()
    (run_dir / "config.toml").write_text(dump_config(config))
    ds = load_dataset("digits", need_train=False)
    (_, pool_y), _ = public_split(ds)
    n, teachers = pool_y.size, config.teachers.count
    votes = synthetic_votes(n, teachers, 10, seed=3)
    rng = np.random.default_rng(0)
    pool_index = rng.permutation(n)  # vote row i is about pool item pool_index[i]
    truth = pool_y[pool_index]
    top = votes.argmax(axis=1)
    rows = np.arange(n)
    votes[rows, top], votes[rows, truth] = votes[rows, truth], votes[rows, top].copy()
    np.savez(run_dir / "votes.npz", votes=votes, pool_index=pool_index)
    asked = rng.choice(n, 150, replace=False)  # vote rows
    labels = np.where(rng.random(150) < 0.6, votes[asked].argmax(axis=1), -1)
    branch = np.where(labels >= 0, 1, 0).astype(np.int8)  # none 0, teachers 1, student 2
    if rounds:  # every other Interactive answer is the student's own label
        branch[100:][(labels[100:] >= 0) & (np.arange(50) % 2 == 0)] = 2
    np.savez(run_dir / "labels.npz", pool_index=pool_index[asked], label=labels, branch=branch)
    if rounds:  # as pate student train records a Confident then an Interactive round
        (run_dir / "student" / "rounds.json").write_text(json.dumps(
            [{"mechanism": {"mechanism": "confident"}, "queries": 100},
             {"mechanism": {"mechanism": "interactive"}, "queries": 50}]))
        np.savez(run_dir / "student" / "probs.npz", pool_index=pool_index[asked[100:]],
                 probs=rng.dirichlet(np.ones(10), 50))
    (run_dir / "student" / "metrics.json").write_text(json.dumps(
        {"method": "vat", "arch": "cnn-hog-simclr", "accuracy": 0.91,
         "epsilon": {"data_independent": 7.5, "data_dependent_sanitised": 6.5, "delta": 1e-5}}))
    (run_dir / "dpsgd" / "metrics.json").write_text(json.dumps(
        {"accuracy": 0.88, "epsilon": 3.0, "delta": 1e-5}))
    (run_dir / "dpsgd" / "bayesian.json").write_text(json.dumps(
        {"epsilon_bayesian": 1.2, "bayesian_moment": 2}))
    (run_dir / "teachers" / "manifest.json").write_text(json.dumps(
        {"accuracy": {"per_teacher": rng.uniform(0.6, 0.8, teachers).tolist()}}))
    return {"votes": votes, "asked": asked, "labels": labels, "branch": branch, "truth": truth,
            "config": config}


def pate(*args: str) -> subprocess.CompletedProcess:
    """``pate ARGS`` by the command line's own entry point, in this process (without an
    interpreter's start-up and torch's import, two to three seconds a call): its exit status
    and what it printed."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(args))
        except SystemExit as exc:  # a usage error: argparse exits, with status 2
            status = exc.code if isinstance(exc.code, int) else 1
    return subprocess.CompletedProcess(args, status, out.getvalue(), err.getvalue())


def test_report_numbers_equal_analyze_and_metrics(tmp_path: Path) -> None:
    run = tmp_path / "run"
    made = make_run(run, rounds=False)
    proc = pate("report", "--run", str(run))
    assert proc.returncode == 0, proc.stderr
    report = json.loads((run / "report" / "report.json").read_text())
    a = made["config"].aggregator
    np.save(tmp_path / "asked.npy", made["votes"][made["asked"]])
    analysed = pate("analyze", "--votes", str(tmp_path / "asked.npy"), "--mechanism",
                    "confident", "--threshold", repr(a.threshold), "--sigma1", repr(a.sigma1),
                    "--sigma2", repr(a.sigma2), "--delta", repr(a.delta), "--json")
    assert analysed.returncode == 0, analysed.stderr
    assert report["privacy"] == json.loads(analysed.stdout)
    row, dpsgd = report["table"]
    assert (dpsgd["epsilon_data_independent"], dpsgd["epsilon_bayesian"]) == (3.0, 1.2)
    # what pate run prints: no private column, nor the DP-SGD model's (private) accuracy
    assert [r["student"] for r in public_rows(report["table"])] == [row["student"]]
    assert PRIVATE_TABLE_KEYS.isdisjoint(public_rows(report["table"])[0])
    assert row["epsilon_data_independent_expected"] == \
        report["privacy"]["data_independent"]["epsilon"]
    # the publishable data-independent epsilon is that of the counts asked and answered
    orders = default_orders()
    realised = epsilon_from_rdp(realised_rdp_independent(
        ConfidentGNMax(a.threshold, a.sigma1, a.sigma2), made["labels"].size,
        int((made["labels"] >= 0).sum()), orders), orders, a.delta)[0]
    assert row["epsilon_data_independent"] == pytest.approx(realised, rel=1e-12)
    assert row["epsilon_data_independent"] != row["epsilon_data_independent_expected"]
    # the strictest: as if every query asked had been answered (privacy-math.md §12)
    worst = epsilon_from_rdp(realised_rdp_independent(
        ConfidentGNMax(a.threshold, a.sigma1, a.sigma2), made["labels"].size,
        made["labels"].size, orders), orders, a.delta)[0]
    assert row["epsilon_every_answered"] == pytest.approx(worst, rel=1e-12)
    assert row["epsilon_every_answered"] > row["epsilon_data_independent"]
    # the released figure is the student's (drawn once, with noise); the analysis' is private
    assert row["epsilon_smooth_sensitivity_expected"] == \
        report["privacy"]["smooth_sensitivity"]["epsilon"]
    assert row["epsilon_smooth_sensitivity"] == 6.5
    assert row["accuracy"] == 0.91 and dpsgd["accuracy"] == 0.88
    assert row["student"] == "vat (cnn-hog-simclr)" and dpsgd["student"] == "dpsgd"
    assert row["epsilon_spent"] == 7.5
    assert row["queries_answered"] == int((made["labels"] >= 0).sum())
    assert report["teacher_accuracy"]["count"] == made["config"].teachers.count
    answered = made["labels"] >= 0
    assert report["queries"]["label_accuracy"] == pytest.approx(
        np.mean(made["labels"][answered] == made["truth"][made["asked"][answered]]))
    for name in ("epsilon_vs_answered", "plurality_histogram", "epsilon_split", "accuracy"):
        png = run / "report" / "figures" / f"{name}.png"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert stat.S_IMODE(png.stat().st_mode) == 0o600
    assert stat.S_IMODE((run / "report").stat().st_mode) == 0o700
    page = (run / "report" / "report.html").read_text()
    assert "<script" not in page and "http://" not in page and "https://" not in page
    assert page.count("data:image/png;base64,") == 4
    # what the two publishable epsilons allow an attacker, at the run's delta
    meaning = {m["epsilon"]: m for m in report["epsilon_meaning"]}
    assert set(meaning) == {"sanitised, released", "data-independent",
                            "data-independent, every query answered"}
    released = meaning["sanitised, released"]
    assert released["value"] == 6.5 and released["delta"] == a.delta
    assert released["likelihood_factor"] == pytest.approx(math.exp(6.5))
    assert released["membership_accuracy"] == pytest.approx(
        (math.exp(6.5) + a.delta) / (1 + math.exp(6.5)))
    assert released["true_positive_rate"] == pytest.approx(min(
        1, math.exp(6.5) * 0.01 + a.delta, 1 - math.exp(-6.5) * (1 - a.delta - 0.01)))
    assert meaning["data-independent"]["value"] == row["epsilon_data_independent"]
    assert "What these epsilons mean" in page and "99.8 %" in page  # (e^6.5 + d) / (1 + e^6.5)
    assert "rules out almost no attack" in page  # said where a guess is right 99 % of the time
    assert "probability 97.7 %" in page
    # the one figure to quote, and the budget it was spent under (public: the config's)
    assert ("<b>The figure to quote: ε = 6.5 at δ = 1e-05</b> (the sanitised, released ε, "
            "resting on PATE 2018&#x27;s data-dependent analysis") in page
    assert "ε = 1000 at δ = 1e-05, data-independent" in page
    assert "This ledger&#x27;s budget" in page or "This ledger's budget" in page
    assert "everything published from this run; that analysis is not a proven bound" in page
    assert "100 %" not in page  # a near-certainty is said as over 99.99 %, not rounded up
    assert "budget was not exceeded" not in page  # 6.5 of 1000
    assert row["epsilon_to_quote"] == 6.5 and report["epsilon_to_quote"] == {
        "epsilon": 6.5, "delta": a.delta, "figure": "sanitised, released"}
    # a figure to quote above the budget says why, and what the ledger charged
    from pate.report.meaning import meaning_html
    above = meaning_html(report["epsilon_meaning"], budget=5.0, charged=4.2)
    assert "above the budget (ε = 5), yet the budget was not exceeded: the ledger charged " \
           "ε = 4.2" in above and "release_sanitised = false" in above
    assert "No sanitised ε was released" not in above
    # a charge past the budget (a config's budget that is not the ledger's): no such claim
    assert "budget was not exceeded" not in meaning_html(report["epsilon_meaning"], budget=5.0,
                                                         charged=7.0)
    # answers with no sanitised release (a pate serve's rounds): the page does not describe one
    unreleased = meaning_html([m for m in report["epsilon_meaning"]
                               if m["epsilon"] != "sanitised, released"])
    assert "No sanitised ε was released for these answers" in unreleased
    assert "probability 97.7 %" not in unreleased
    # a toy's ε past e^ε's largest float: strict JSON (no Infinity), said as ∞ on the page
    from pate.report.meaning import epsilon_meaning
    huge = epsilon_meaning({"delta": 1e-5, "epsilon_data_independent": 800.0})
    json.dumps(huge, allow_nan=False)
    assert huge[0]["likelihood_factor"] is None and huge[0]["membership_accuracy"] == 1.0
    assert "<td>∞</td><td>over 99.99 %</td>" in meaning_html(huge)
    assert page.count("(private)</") >= 2  # the private columns; each figure says so too
    # a figure to quote above the budget says why where it is quoted: pate run's line, status
    metrics = json.loads((run / "student" / "metrics.json").read_text())
    metrics["epsilon"]["data_dependent_sanitised"] = 9.25
    (run / "student" / "metrics.json").write_text(json.dumps(metrics))
    config = (run / "config.toml").read_text()
    (run / "config.toml").write_text(config.replace("budget_epsilon = 1000.0",
                                                    "budget_epsilon = 8.0"))
    assert pate("report", "--run", str(run)).returncode == 0
    quoted = json.loads((run / "report" / "report.json").read_text())["epsilon_to_quote"]
    assert quoted["epsilon"] == 9.25 and quoted["above_budget"].startswith(
        "The figure to quote is above the budget (epsilon = 8), yet the budget was not "
        "exceeded: the ledger charged epsilon = 7.5")
    assert "budget was not exceeded" in (run / "report" / "report.html").read_text()
    said = pate("status", "--run", str(run)).stdout
    assert f"  {quoted['above_budget']}" in said.splitlines()
    (run / "config.toml").write_text(config)
    # a student that failed to train after its answers were charged: the charge is still said
    (run / "student" / "metrics.json").unlink()
    assert pate("report", "--run", str(run)).returncode == 0
    row = json.loads((run / "report" / "report.json").read_text())["table"][0]
    assert row["epsilon_spent"] == pytest.approx(realised, rel=1e-12)


def test_two_rounds_compose_and_runs_compare(tmp_path: Path) -> None:
    made = {name: make_run(tmp_path / name, rounds=(name == "b")) for name in ("a", "b")}
    proc = pate("report", "--runs", str(tmp_path / "a"), str(tmp_path / "b"),
                "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    b = json.loads((tmp_path / "b" / "report" / "report.json").read_text())
    assert b["privacy"]["mechanism"] == "confident+interactive"
    assert [r["mechanism"] for r in b["queries"]["per_round"]] == ["confident", "interactive"]
    # the data-independent epsilon charges the answering step only where the teachers answered
    # (as the ledger does): the Interactive answers of the student's own label ran none
    a, branch = made["b"]["config"].aggregator, made["b"]["branch"]
    assert np.sum(branch[100:] == 2) > 0
    orders = default_orders()
    rdp = sum(realised_rdp_independent(a.round_mechanism(name), rows.size,
                                       int(np.sum(rows == 1)), orders)
              for name, rows in (("confident", branch[:100]), ("interactive", branch[100:])))
    assert b["queries"]["epsilon_data_independent"] == pytest.approx(
        epsilon_from_rdp(rdp, orders, a.delta)[0], rel=1e-12)
    cmp = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert cmp["runs"] == ["a", "b"] and len(cmp["table"]) == 4
    assert "This comparison contains private statistics" in (
        tmp_path / "cmp" / "report.html").read_text()
    # a place the system will not write to is one line, exit 74, not a traceback
    proc = pate("report", "--runs", str(tmp_path / "a"), str(tmp_path / "b"),
                "--out", str(tmp_path / "cmp" / "report.json" / "sub"))
    err = proc.stderr.strip().splitlines()
    assert proc.returncode == 74 and len(err) == 1, proc.stderr
    assert err[0].startswith(f"pate: error: {tmp_path / 'cmp' / 'report.json' / 'sub'}")
    assert err[0].endswith(": Not a directory")


def test_a_student_answer_in_a_round_without_a_student_step_is_refused(tmp_path: Path) -> None:
    made = make_run(tmp_path / "run", rounds=False)  # one Confident round: no student branch
    branch = made["branch"].copy()
    branch[np.flatnonzero(branch == 1)[0]] = 2
    np.savez(tmp_path / "run" / "labels.npz", pool_index=np.load(
        tmp_path / "run" / "votes.npz")["pool_index"][made["asked"]], label=made["labels"],
        branch=branch)
    proc = pate("report", "--run", str(tmp_path / "run"))
    assert proc.returncode == 2
    assert "answers of the student's own label in a confident round" in proc.stderr


@pytest.mark.parametrize("stray", [10**15, -1])
def test_answers_about_rows_the_votes_do_not_hold_are_refused(tmp_path: Path,
                                                               stray: int) -> None:
    """A labels file of another pool (a row far beyond it, or a negative one) is one error, not
    a table the size of the largest index nor a row read from the end."""
    made = make_run(tmp_path / "run", rounds=False)
    asked = np.load(tmp_path / "run" / "votes.npz")["pool_index"][made["asked"]]
    asked[3] = stray
    np.savez(tmp_path / "run" / "labels.npz", pool_index=asked, label=made["labels"],
             branch=made["branch"])
    with pytest.raises(UserError, match="asks for pool rows the votes do not cover"):
        load_run_data(tmp_path / "run")


def test_runs_compared_rebuild_a_report_of_an_older_layout(tmp_path: Path) -> None:
    """A run's report.json is derived: ``--runs`` writes again one that an older version wrote
    (no ``report_format``) or that is damaged, instead of comparing its stale figures."""
    for name in ("a", "b"):
        make_run(tmp_path / name, rounds=False)
        (tmp_path / name / "report").mkdir()
    (tmp_path / "a" / "report" / "report.json").write_text(json.dumps(
        {"run": "a", "table": [{"student": "stale", "accuracy": 0.1}]}))
    (tmp_path / "b" / "report" / "report.json").write_text("{not json")
    proc = pate("report", "--runs", str(tmp_path / "a"), str(tmp_path / "b"),
                "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    cmp = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert [row["student"] for row in cmp["table"]] == ["vat (cnn-hog-simclr)", "dpsgd"] * 2
    a = json.loads((tmp_path / "a" / "report" / "report.json").read_text())
    assert a["report_format"] >= 2 and a["table"][0]["accuracy"] == 0.91
    # a student trained again after the report: the report is outdated, and written again
    metrics = tmp_path / "a" / "student" / "metrics.json"
    metrics.write_text(metrics.read_text().replace("0.91", "0.93"))
    assert pate("report", "--runs", str(tmp_path / "a"), str(tmp_path / "b"),
                "--out", str(tmp_path / "cmp")).returncode == 0
    cmp = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert [row["accuracy"] for row in cmp["table"]][::2] == [0.93, 0.91]
    # an outdated report whose private inputs are gone is compared as written, with a warning
    (tmp_path / "b" / "votes.npz").unlink()
    metrics = tmp_path / "b" / "student" / "metrics.json"
    metrics.write_text(metrics.read_text().replace("0.91", "0.95"))
    proc = pate("report", "--runs", str(tmp_path / "a"), str(tmp_path / "b"),
                "--out", str(tmp_path / "cmp"))
    assert proc.returncode == 0, proc.stderr
    assert "report cannot be written again" in proc.stderr and "compared as it was" in proc.stderr
    cmp = json.loads((tmp_path / "cmp" / "report.json").read_text())
    assert [row["accuracy"] for row in cmp["table"]][::2] == [0.93, 0.91]


def test_a_model_audit_is_said_in_the_report_and_shown_to_the_owner(tmp_path: Path) -> None:
    run = tmp_path / "run"
    make_run(run, rounds=False)
    (run / "audit").mkdir()
    target = {"target": "teacher", "accuracy": 0.7, "epsilon_lower": 0.3125,
              "epsilon_analytic": 0.25, "attacks": [{"auc": 0.61}], "passed": False}
    for stamp, passed in (("20261124T100000Z", True), ("20261125T100000Z", False)):
        (run / "audit" / f"models-{stamp}.json").write_text(json.dumps(
            {"method": "one training run", "delta": 1e-5, "confidence": 0.95,
             "targets": [{**target, "passed": passed}], "passed": passed,
             "failures": [] if passed else ["privacy bug: teacher's bound exceeds"]}))
    assert pate("report", "--run", str(run)).returncode == 0
    report = json.loads((run / "report" / "report.json").read_text())
    assert report["audit"] == {"file": "audit/models-20261125T100000Z.json", "passed": False}
    page = (run / "report" / "report.html").read_text()
    assert "FAILED" in page and "0.3125" not in page      # the verdict, not the figures
    owner = run / "report" / "owner-evaluation.html"
    assert stat.S_IMODE(owner.stat().st_mode) == 0o600
    text = owner.read_text()
    assert "Owner only: not for publication" in text and "0.3125" in text
    assert "privacy bug: teacher" in text


def test_the_report_names_no_private_file(tmp_path: Path) -> None:
    """report.json carries the run's config, but not where the private data lies (cli.md:
    your own files are named by the public pool's)."""
    from pate.report.run_report import run_facts
    from pate.rundir import RunDir

    text = dump_config(load_config("digits-tiny")).replace(
        'dataset = "digits"', 'private = "/secret/patients.csv"\npublic = "/data/pool.csv"\n'
        'label = "y"')
    run = RunDir(tmp_path / "run").create()
    run.write_config(text)
    config = run_facts(run).config
    assert config["data"]["public"] == "/data/pool.csv" and "private" not in config["data"]
    assert "patients" not in json.dumps(config)


def test_a_fallback_is_not_shown_as_a_sanitised_figure(tmp_path: Path) -> None:
    """Where C5/C6 fail nothing sanitised is released (student.sanitised): the report says so
    in its Details, and puts no figure in the sanitised columns."""
    from pate.report.content import summary_table
    from pate.report.page import run_sections

    run = tmp_path / "run"
    make_run(run, rounds=False)
    assert pate("report", "--run", str(run)).returncode == 0
    report = json.loads((run / "report" / "report.json").read_text())
    report["privacy"]["smooth_sensitivity"] |= {"fallback": "data-independent", "beta": None,
                                                "value": None, "sigma": None}
    report["student"]["epsilon"]["data_dependent_sanitised"] = None
    row = summary_table(report)[0]
    assert row["epsilon_smooth_sensitivity"] is None
    assert row["epsilon_smooth_sensitivity_expected"] is None
    details = run_sections({**report, "table": [row]})[2][1]
    assert "conditions C5/C6 fail at its order, so the data-independent ε is the guarantee" \
        in details
    # γ is a parameter of the interactive round: said where the run asked one
    assert "interactive γ" not in details and "σ2 = " in details
    config = report["config"]
    asked = {**config, "student": {**config["student"], "interactive_queries": 5}}
    details = run_sections({**report, "table": [row], "config": asked})[2][1]
    assert f"interactive γ = {config['aggregator']['gamma']:g}" in details


def test_report_of_a_directory_without_a_run_is_one_line(tmp_path: Path) -> None:
    proc = pate("report", "--run", str(tmp_path))
    assert proc.returncode == 2
    assert proc.stderr.strip().count("\n") == 0
    assert "neither a config.toml (pate run) nor a student's metrics" in proc.stderr
    proc = pate("report", "--run", str(tmp_path / "nonexist"))  # said as pate status says it
    assert proc.returncode == 2 and "nonexist: no such run directory" in proc.stderr
    # --out is --runs' own: with --run it is refused, not silently ignored
    proc = pate("report", "--run", str(tmp_path), "--out", str(tmp_path / "elsewhere"))
    assert proc.returncode == 2 and proc.stderr.strip().count("\n") == 0
    assert "--out is for --runs: a run's report is written in its own directory" in proc.stderr
    assert not (tmp_path / "elsewhere").exists()


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed (apt-get install chromium)")
def test_report_opens_in_headless_chromium(tmp_path: Path) -> None:
    run = tmp_path / "run"
    make_run(run, rounds=True)
    assert pate("report", "--run", str(run)).returncode == 0
    page = (run / "report" / "report.html").as_uri()
    flags = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={tmp_path / 'profile'}",
             "--enable-logging=stderr", "--v=0"]
    dom = subprocess.run([*flags, "--dump-dom", page], capture_output=True, text=True,
                         timeout=120)
    assert 'id="summary"' in dom.stdout and "Confident-GNMax then Interactive-GNMax" in dom.stdout
    console = [line for line in dom.stderr.splitlines() if ":CONSOLE" in line]
    assert console == []
    shot = tmp_path / "shot.png"
    subprocess.run([*flags, "--window-size=1200,900", f"--screenshot={shot}", page],
                   capture_output=True, timeout=120, check=True)
    from matplotlib.image import imread

    pixels = imread(shot)
    assert pixels.shape[:2] == (900, 1200)
    top = pixels[:450, :, :3]  # the title and the summary table
    assert top.std() > 0.05 and (top < 0.5).mean() > 0.005  # text was drawn, not a blank page
    os.remove(shot)


def test_a_comparison_is_not_written_into_a_run_nor_of_one_run_twice(tmp_path: Path) -> None:
    """``--out`` naming a run directory would put the comparison's report.html beside the run's
    own files, and ``--runs A A`` compared a run with itself: both refused, before anything is
    written."""
    for name in ("a", "b"):
        (tmp_path / name).mkdir()
    RunDir(tmp_path / "a").finish_stage("teachers", 1.0)
    with pytest.raises(UserError, match=r"a is a run directory: give the comparison a folder"):
        write_comparison([tmp_path / "a", tmp_path / "b"], tmp_path / "a")
    # nor inside one: its report/ (its own report replaced), its student/ (the folder
    # published, which would take the comparison's private figures), a student-only run's
    student_only = tmp_path / "s"
    (student_only / "student").mkdir(parents=True)
    (student_only / "student" / "schema.json").write_text("{}")
    for out in (tmp_path / "a" / "report", tmp_path / "a" / "student" / "new",
                student_only / "student", student_only):
        with pytest.raises(UserError, match=r"(is inside the run directory .*|is a run "
                                            r"directory): give the comparison a folder"):
            write_comparison([tmp_path / "a", tmp_path / "b"], out)
        assert not (out / "report.html").exists() and not (out / "report.json").exists()
    # a folder that holds a votes file or answers of its own is no run: a comparison goes there
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "labels.npz").write_bytes(b"")
    (mine / "votes.npz").write_bytes(b"")
    with pytest.raises(UserError) as refused:  # these runs hold nothing to report
        write_comparison([tmp_path / "a", tmp_path / "b"], mine / "cmp")
    assert "give the comparison a folder" not in str(refused.value)
    with pytest.raises(UserError, match="a run is named twice in --runs"):
        write_comparison([tmp_path / "a", tmp_path / "b" / ".." / "a"], tmp_path / "cmp")
    assert not (tmp_path / "cmp").exists() and not (tmp_path / "a" / "report.html").exists()


def test_a_student_of_a_remote_aggregator_is_told_where_its_report_is(tmp_path: Path) -> None:
    """A run directory holding a student's answers from a server and no votes cannot be
    analysed here: said so, not by advice to cast votes it has no teachers for."""
    np.savez(tmp_path / "labels.npz", pool_index=np.arange(3), label=np.array([1, -1, 0]),
             branch=np.array([1, 0, 1], np.int8))
    (tmp_path / "student").mkdir()
    (tmp_path / "student" / "metrics.json").write_text(json.dumps(
        {"dataset": "digits", "epsilon": {"delta": 1e-5, "data_independent": 1.0}}))
    with pytest.raises(UserError, match=r"no votes.npz: a report analyses the votes the answers "
                                        r"came from, and these came from an aggregator"):
        load_run_data(tmp_path)
    (tmp_path / "labels.npz").unlink()
    with pytest.raises(UserError, match=r"no votes.npz; run `pate teachers votes"):
        load_run_data(tmp_path)
