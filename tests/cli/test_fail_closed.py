"""Mistakes a new user made, each refused in one line (exit 2) before anything is charged, and
leaving no half-written artifact: votes that are not the pool's, a budget that covers no query, a
threshold above the number of teachers or below 0, a pool already asked in full, a device the
machine lacks, a damaged run directory, a run directory that cannot be created, an empty run
directory left by a failed command, and `pate run --help` naming every preset."""

from __future__ import annotations

import json
import shutil
import socket
import time
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from analysis.costs import realised_rdp_independent
from analysis.mechanisms import ConfidentGNMax, GNMax
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from pate.aggregation.ledger import Ledger
from pate.cli.main import build_parser, main
from pate.config import dump_config, load_config, preset_names

ORDERS = default_orders()
EXAMPLE = Path(__file__).resolve().parents[2] / "pate" / "examples" / "votes-synthetic-640x250.npy"


def _one_error_line(capsys: pytest.CaptureFixture, message: str) -> None:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pate: error: ") and message in err[0], err


def _student(run: Path, votes: Path, *extra: str) -> list[str]:
    return ["student", "train", "--run", str(run), "--votes", str(votes), "--dataset", "digits",
            "--method", "supervised", "--mechanism", "gnmax", "--sigma", "4", "--delta", "1e-5",
            "--queries", "50", "--epochs", "1", *extra]


def _spent(votes: Path, budget: float) -> float:
    ledger = Ledger(f"sqlite:///{votes.parent / 'ledger.db'}", default_orders(), 1e-5, budget)
    try:
        return ledger.budget().epsilon_spent
    finally:
        ledger.close()


def test_votes_that_are_not_the_pools_are_refused_before_any_charge(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    votes = tmp_path / "votes.npz"  # 300 rows of 2 classes against digits' 10-class pool
    np.savez(votes, votes=rng.multinomial(20, [0.5, 0.5], size=300))
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "100")) == 2
    _one_error_line(capsys, "the votes have 2 classes, the data 10")
    # refused before the ledger was opened: no ledger.db beside the votes, nothing written
    assert not (tmp_path / "ledger.db").exists() and not (run / "labels.npz").exists()
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=300))
    assert main(_student(run, votes, "--budget-epsilon", "100")) == 2
    _one_error_line(capsys, "the votes cover pool rows up to 299, but the pool has 250 rows")
    assert not (tmp_path / "ledger.db").exists()
    # another run's votes: 20 teachers voted, this run has 30 (its manifest says so)
    (run / "teachers").mkdir(parents=True)
    (run / "teachers" / "manifest.json").write_text('{"num_teachers": 30}')
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    assert main(_student(run, votes, "--budget-epsilon", "100")) == 2
    _one_error_line(capsys, "the votes are of 20 teachers, the run's teachers number 30")
    assert not (tmp_path / "ledger.db").exists() and not (run / "labels.npz").exists()


def test_a_budget_that_covers_no_query_is_one_line_and_writes_nothing(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(1)
    votes = tmp_path / "votes.npz"  # the digits pool: 250 rows, 10 classes, 20 teachers
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "0.01")) == 2
    _one_error_line(capsys, "does not cover even one query of this aggregator: nothing was "
                            "created")
    # no ledger was made with that budget, so a larger one is taken
    assert not (tmp_path / "ledger.db").exists() and not run.exists()
    assert main(_student(run, votes, "--budget-epsilon", "6")) == 0
    # with answers in hand, a spent budget is still one line: nothing new is trained on
    status = 0
    while status == 0:  # until the budget is spent
        capsys.readouterr()
        status = main(_student(run, votes, "--budget-epsilon", "6", "--queries", "250"))
    assert status == 2
    _one_error_line(capsys, "does not cover even one more query: nothing was asked or spent "
                            "(--queries 0 retrains on the answers so far)")


def test_a_budget_spent_with_no_answer_says_the_run_cannot_go_on(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A budget of one query's worst case, and a query the teachers are too split to answer:
    the budget is spent, nothing came back, and the error says that asking more is futile."""
    rng = np.random.default_rng(3)
    votes = tmp_path / "votes.npz"  # 20 teachers split over 10 classes: never near 20 votes
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    confident = ConfidentGNMax(threshold=20.0, sigma1=1.0, sigma2=4.0)
    one = epsilon_from_rdp(realised_rdp_independent(confident, 1, 1, ORDERS), ORDERS, 1e-5)[0]
    args = [*_student(tmp_path / "run", votes, "--budget-epsilon", repr(one * 1.001))]
    args[args.index("gnmax")] = "confident"
    args[args.index("--sigma"):args.index("--sigma") + 2] = [
        "--threshold", "20", "--sigma1", "1", "--sigma2", "4"]
    assert main(args) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1] == (f"pate: error: the privacy budget (epsilon {one * 1.001:g}) is spent and "
                       "none of the 1 query asked was answered: nothing to train on, and "
                       "nothing more can be asked of this ledger (a new run with a larger "
                       "budget or a lower threshold)")


def test_a_second_ledger_for_the_same_votes_is_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """One budget per body of private data: once the votes' ledger exists, another ledger for
    them is refused, whichever came first (the same file named another way, by its path say, is
    not another ledger)."""
    rng = np.random.default_rng(4)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 0
    capsys.readouterr()
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5", "--ledger",
                         f"sqlite:///{tmp_path / 'other.db'}")) == 2
    _one_error_line(capsys, "ledger.db already charges these votes")
    assert not (tmp_path / "other.db").exists()
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5", "--ledger",
                         f"sqlite:///{tmp_path}/./ledger.db")) == 0
    # the other way round: votes first charged to a ledger of another name keep it, recorded
    # beside them, and their own ledger.db would be the second budget
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    np.savez(elsewhere / "votes.npz", votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9,
                                                            size=250))
    other = f"sqlite:///{tmp_path / 'other.db'}"
    assert main(_student(tmp_path / "run2", elsewhere / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5", "--ledger", other)) == 0
    record = elsewhere / "ledger-url.txt"
    assert record.read_text() == other + "\n" and record.stat().st_mode & 0o077 == 0
    capsys.readouterr()
    assert main(_student(tmp_path / "run2", elsewhere / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5")) == 2
    _one_error_line(capsys, f"{other} already charges these votes")
    assert not (elsewhere / "ledger.db").exists()
    assert main(_student(tmp_path / "run2", elsewhere / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5", "--ledger", other)) == 0
    # the same ledger named by its file's path, as a config file may name it
    assert main(_student(tmp_path / "run2", elsewhere / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5", "--ledger", str(tmp_path / "other.db"))) == 0


def test_votes_moved_with_their_own_ledger_keep_it(tmp_path: Path) -> None:
    """The votes' own ledger.db is recorded as such, not by its path: a folder moved (or
    renamed) with its votes and ledger goes on with them."""
    rng = np.random.default_rng(6)
    home = tmp_path / "a"
    home.mkdir()
    np.savez(home / "votes.npz", votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    assert main(_student(home / "run", home / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5")) == 0
    assert (home / "ledger-url.txt").read_text() == "ledger.db\n"
    home.rename(tmp_path / "b")
    assert main(_student(tmp_path / "b" / "run", tmp_path / "b" / "votes.npz",
                         "--budget-epsilon", "20", "--queries", "5")) == 0
    assert len(np.load(tmp_path / "b" / "run" / "labels.npz")["pool_index"]) == 10


def test_answers_in_hand_without_their_ledger_are_refused(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Fail closed: once answers were charged, a ledger that is gone is not started afresh (a
    second budget for the same data)."""
    rng = np.random.default_rng(5)
    run = tmp_path / "run"
    run.mkdir()
    votes = run / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 0
    for name in ("ledger.db", "ledger.db-wal", "ledger.db-shm"):
        (run / name).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 2
    _one_error_line(capsys, "the ledger that charged these votes")
    # nor by a student of another run directory on the same votes, with no answers of its own
    assert main(_student(tmp_path / "run2", votes, "--budget-epsilon", "20",
                         "--queries", "5")) == 2
    _one_error_line(capsys, "the ledger that charged these votes")
    assert not (run / "ledger.db").exists() and not (tmp_path / "run2" / "labels.npz").exists()
    # votes charged before their ledger was recorded: the answers in hand say so
    (run / "ledger-url.txt").unlink()
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 2
    _one_error_line(capsys, "answers received before were charged to a ledger that is not at")
    assert not (run / "ledger.db").exists()


def test_answers_in_hand_are_asked_for_more_only_of_their_own_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run's rounds record which ledger charged them (its random name, ``Budget.ledger``): an
    aggregator over a copy of the votes, with a ledger of its own (here another run's), is
    refused for that run before it asks anything; the first ledger still answers it."""
    rng = np.random.default_rng(8)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    copy = tmp_path / "copy"
    copy.mkdir()
    (copy / "votes.npz").write_bytes(votes.read_bytes())
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 0
    assert main(_student(tmp_path / "other", copy / "votes.npz", "--budget-epsilon", "20",
                         "--queries", "5")) == 0
    rounds = json.loads((run / "student" / "rounds.json").read_text())
    assert len({r["ledger"] for r in rounds}) == 1
    capsys.readouterr()
    assert main(_student(run, copy / "votes.npz", "--budget-epsilon", "20", "--queries",
                         "5")) == 2
    _one_error_line(capsys, "the aggregator charges another ledger than the one that charged "
                            "this run's answers")
    assert len(np.load(run / "labels.npz")["pool_index"]) == 5
    assert _spent(copy / "votes.npz", 20) == _spent(votes, 20)  # nothing more charged there
    assert main(_student(run, votes, "--budget-epsilon", "20", "--queries", "5")) == 0


def test_a_server_url_without_its_scheme_or_unreachable_is_one_line(tmp_path: Path,
                                                     capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "tokens").write_text("x" * 32 + "\n")
    (tmp_path / "tokens").chmod(0o600)  # a secret
    assert main(["student", "train", "--run", str(tmp_path / "run"), "--method", "supervised",
                 "--dataset", "digits", "--server", "127.0.0.1:8470", "--token-file",
                 str(tmp_path / "tokens"), "--mechanism", "gnmax"]) == 2
    _one_error_line(capsys, "127.0.0.1:8470: the server's URL starts with http:// or https://")
    assert main(["student", "train", "--run", str(tmp_path / "run"), "--method", "supervised",
                 "--dataset", "digits", "--server", "htp://me:s3cret@h:1", "--token-file",
                 str(tmp_path / "tokens"), "--mechanism", "gnmax"]) == 2
    _one_error_line(capsys, "htp://me:***@h:1: the server's URL starts with http://")
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    assert main(["student", "train", "--run", str(tmp_path / "run"), "--method", "supervised",
                 "--dataset", "digits", "--server", f"http://127.0.0.1:{port}", "--token-file",
                 str(tmp_path / "tokens"), "--mechanism", "gnmax"]) == 2
    _one_error_line(capsys, f"cannot reach http://127.0.0.1:{port}: is a pate serve running")
    assert time.monotonic() - started < 5
    for server, said in ((f"http://127.0.0.1:{port}/v1", "give the server's address without "
                                                          "/v1"),
                         (f"http://127.0.0.1:{port}", "cannot read the token file "
                                                      "(FileNotFoundError)")):
        assert main(["student", "train", "--run", str(tmp_path / "run"), "--method",
                     "supervised", "--dataset", "digits", "--server", server, "--token-file",
                     str(tmp_path / ("tokens" if "/v1" in server else "no-tokens")),
                     "--mechanism", "gnmax"]) == 2
        _one_error_line(capsys, said)
    # a password in the URL is not repeated; an empty URL (an unset variable) is not taken
    # for no server; a token file of bytes is not said in the codec's words
    (tmp_path / "binary").write_bytes(bytes(range(128, 256)))
    (tmp_path / "binary").chmod(0o600)
    for server, tokens, said in (
            (f"http://me:s3cret@127.0.0.1:{port}", "tokens",
             f"cannot reach http://me:***@127.0.0.1:{port}: is a pate serve running"),
            ("", "tokens", "--server is empty: give a pate serve's address"),
            (f"http://127.0.0.1:{port}", "binary",
             "binary: cannot read the token file (UnicodeDecodeError)")):
        assert main(["student", "train", "--run", str(tmp_path / "run"), "--method",
                     "supervised", "--dataset", "digits", "--server", server, "--token-file",
                     str(tmp_path / tokens), "--mechanism", "gnmax"]) == 2
        _one_error_line(capsys, said)


def test_a_request_larger_than_the_budget_allows_is_split(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(2)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, [0.9] + [0.1 / 9] * 9, size=250))
    run = tmp_path / "run"
    # one query of GNMax sigma 4 costs about eps 1.5 at delta 1e-5; 512 of them would not fit
    assert main(_student(run, votes, "--budget-epsilon", "6", "--request-size", "512")) == 0
    with np.load(run / "labels.npz") as f:
        asked = f["pool_index"].size
    assert 0 < asked < 50 and _spent(votes, 6.0) <= 6.0
    assert "budget exhausted after" in capsys.readouterr().err


def test_a_threshold_above_the_number_of_teachers_is_refused(
        capsys: pytest.CaptureFixture) -> None:
    assert main(["analyze", "--votes", str(EXAMPLE), "--mechanism", "confident",
                 "--threshold", "300", "--sigma1", "150", "--sigma2", "40",
                 "--delta", "1e-5"]) == 2
    _one_error_line(capsys, "--threshold 300 exceeds the number of teachers (250)")


@pytest.mark.parametrize("threshold", ["60", "-3"])
def test_student_train_refuses_a_bad_threshold_before_any_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture, threshold: str) -> None:
    """A threshold above the 20 teachers (or below 0) is refused before the service opens its
    ledger: nothing asked, nothing charged, no ledger.db, no labels."""
    rng = np.random.default_rng(3)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    run = tmp_path / "run"
    args = _student(run, votes, "--budget-epsilon", "1000")
    mech = args.index("--mechanism")
    args[mech:mech + 4] = ["--mechanism", "confident", "--threshold", threshold, "--sigma1", "2",
                           "--sigma2", "1"]
    assert main(args) == 2
    _one_error_line(capsys, "exceeds the number of teachers (20)" if threshold == "60"
                    else "--threshold must be >= 0, got -3.0")
    assert not (tmp_path / "ledger.db").exists() and not (run / "labels.npz").exists()


def test_asking_again_when_every_row_was_asked_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(4)
    votes = tmp_path / "votes.npz"  # the whole digits pool
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "1000", "--queries", "300")) == 0
    assert "300 queries asked for, 250 pool rows were left to ask: asked those" in \
        capsys.readouterr().err  # said, not silently fewer
    spent = _spent(votes, 1000.0)
    assert main(_student(run, votes, "--budget-epsilon", "1000", "--select", "uncertainty")) == 2
    _one_error_line(capsys, "nothing is left to ask")
    assert _spent(votes, 1000.0) == spent


def test_a_damaged_run_directory_is_one_line(tmp_path: Path,
                                            capsys: pytest.CaptureFixture) -> None:
    """A truncated or overwritten file of a student's run directory: one line naming it, nothing
    asked, before and after."""
    rng = np.random.default_rng(5)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    run = tmp_path / "run"
    assert main(_student(run, votes, "--budget-epsilon", "1000", "--queries", "5")) == 0
    capsys.readouterr()
    spent = _spent(votes, 1000.0)
    for name in ("labels.npz", "student/model.json", "student/model.safetensors",
                 "student/rounds.json"):
        damaged = tmp_path / name.replace("/", "-")
        shutil.copytree(run, damaged)
        (damaged / name).write_text("{")
        assert main(_student(damaged, votes, "--budget-epsilon", "1000", "--queries", "5")) == 2
        _one_error_line(capsys, f"{damaged / name}: not ")
        assert _spent(votes, 1000.0) == spent


@pytest.mark.parametrize(("flags", "message"), [
    (["--lr", "-1"], "--lr must be a finite number > 0"),
    (["--lr", "nan"], "--lr must be a finite number > 0"),
    (["--vat-eps", "inf"], "--vat-eps must be a finite number > 0"),
    (["--width", "0"], "--width must be >= 1, got 0"),
    (["--width", str(10**20)], "--width must be at most 65536"),  # torch's words before
    (["--threads", str(10**20)], f"--threads {10**20}: more than torch can take"),
    (["--unlabelled-batch-size", "0"], "--unlabelled-batch-size must be >= 1"),
    (["--seed", "-1"], "--seed must be in [0, 2^63), got -1"),
    (["--queries", "-5"], "--queries must be >= 0, got -5"),
    (["--epochs", "0"], "--epochs must be >= 1, got 0"),
])
def test_student_flags_out_of_range_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str) -> None:
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=np.random.default_rng(6).multinomial(20, np.full(10, 0.1), size=250))
    assert main(_student(tmp_path / "run", votes, "--budget-epsilon", "1000", *flags)) == 2
    _one_error_line(capsys, message)
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize(("flags", "message"), [
    (["--lr", "nan"], "lr must be a finite number > 0, got nan"),
    (["--epochs", "0"], "epochs must be at least 1 and at most 1,000,000, got 0"),
    # an OverflowError in the shard before, after partition.json was written
    (["--epochs", str(10**20)], "epochs must be at least 1 and at most 1,000,000, got 1000"),
    (["--batch-size", str(10**20)], "batch_size must be at least 1 and at most 1,000,000"),
    (["--seed", "-1"], "the seed must be in [0, 2^63)")])
def test_teacher_flags_out_of_range_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], message: str) -> None:
    assert main(["teachers", "train", "--run", str(tmp_path / "run"), "--dataset", "digits",
                 "--teachers", "2", *flags]) == 2
    _one_error_line(capsys, message)
    assert not (tmp_path / "run").exists()


def test_a_mistaken_flag_is_one_line_of_its_sub_command(
        capsys: pytest.CaptureFixture) -> None:
    """Said by the sub-command, in one line: argparse printed its whole usage first (26 lines
    for pate student train)."""
    with pytest.raises(SystemExit) as info:
        main(["status", "--run", "r", "--bogus", "1"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("pate status: error: unrecognized arguments: --bogus 1 "
                                       "(pate status --help for its usage)\n")
    with pytest.raises(SystemExit) as info:
        main(["student", "train", "--run", "r", "--method", "vat", "--epochs", "x"])
    assert info.value.code == 2
    assert capsys.readouterr().err == ("pate student train: error: argument --epochs: invalid "
                                       "int value: 'x' (pate student train --help for its "
                                       "usage)\n")


@pytest.mark.parametrize("command", [
    ["run", "digits-tiny"], ["status"], ["report"], ["teachers", "train", "--dataset", "digits"],
    ["student", "train", "--votes", str(EXAMPLE)], ["dpsgd", "train", "--epsilon", "1"]])
def test_an_empty_run_directory_is_a_usage_error_not_the_current_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        command: list[str]) -> None:
    """``--run "$DIR"`` with DIR unset: refused as it is parsed. ``Path("")`` is ``.``, and
    ``pate run`` took an empty value for no value (its default, runs/<name>)."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*command, "--run", ""])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        "error: argument --run: an empty path (an unset shell variable?)" in err)
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize(("command", "flag"), [
    (["teachers", "train", "--run", "r", "--data-dir"], "--data-dir"),
    (["teachers", "train", "--run", "r", "--private", "p.csv", "--public", "q.csv", "--test"],
     "--test"),
    (["student", "train", "--run", "r", "--method", "supervised", "--ledger"], "--ledger"),
    (["analyze", "--delta", "1e-5", "--votes"], "--votes"),
    (["analyze", "--delta", "1e-5", "--votes", "v.npy", "--asked"], "--asked"),
    (["teachers", "votes", "--run", "r", "--data-dir"], "--data-dir"),
    (["report", "--runs", "a", "b", "--out"], "--out")])
def test_every_path_flag_refuses_an_empty_value(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture,
        command: list[str], flag: str) -> None:
    """The same rule for the data's, the ledger's and the outputs' paths: an empty
    ``--data-dir`` would have read the dataset from the current folder."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main([*command, ""])
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and (
        f"error: argument {flag}: an empty path (an unset shell variable?)" in err)
    assert not any(tmp_path.iterdir())


def test_a_port_out_of_range_and_a_file_for_the_report_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as info:
        main(["serve", "--votes", str(EXAMPLE), "--port", "70000"])
    assert info.value.code == 2 and "a port is 0 to 65535" in capsys.readouterr().err
    for flag, value, said in (("--port", "abc", "a port is a number, 0 to 65535, got 'abc'"),
                              # which the server would take for every interface
                              ("--host", "", "an address to listen on, not an empty one")):
        with pytest.raises(SystemExit) as info:
            main(["serve", "--votes", str(EXAMPLE), flag, value])
        assert info.value.code == 2 and said in capsys.readouterr().err
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main(["report", "--runs", str(tmp_path / "r1"), str(tmp_path / "r2"), "--out",
                 str(blocker)]) == 2
    _one_error_line(capsys, "a file, not a directory for the report")


NO_CUDA = pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")


@NO_CUDA
def test_a_device_this_machine_lacks_is_refused_before_anything_runs(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """--device cuda without CUDA: a usage error where the device is local (the flag's type), a
    line from the Ray cluster's resources for the teachers (their GPUs may be remote), and
    pate run stops before its run directory exists. Without these the teachers waited for a
    GPU forever."""
    run = tmp_path / "run"
    with pytest.raises(SystemExit) as info:
        main(["teachers", "votes", "--run", str(run), "--device", "cuda"])
    assert info.value.code == 2
    assert "this machine has no CUDA GPU" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["student", "train", "--run", str(run), "--device", "cuda:x"])
    assert "'cuda:x' is not a torch device" in capsys.readouterr().err
    assert main(["teachers", "train", "--run", str(run), "--dataset", "digits", "--teachers",
                 "2", "--workers", "1", "--device", "cuda"]) == 2
    # this machine's GPUs where a local Ray would start, the running Ray's where one is
    gpus = ("no node of the Ray cluster has the 1 GPU(s) a shard on cuda asks for (at most 0 "
            "on one node)" if ray.is_initialized()
            else "this machine has no CUDA GPU that torch can use")
    _one_error_line(capsys, gpus)
    assert not run.exists()
    config = tmp_path / "gpu.toml"
    config.write_text(dump_config(load_config("digits-tiny")).replace(
        'device = "cpu"', 'device = "cuda"'))
    assert main(["run", str(config), "--run", str(tmp_path / "gpu-run")]) == 2
    _one_error_line(capsys, "this machine has no CUDA GPU")
    assert not (tmp_path / "gpu-run").exists()


@pytest.mark.parametrize("command", [
    ["teachers", "train", "--dataset", "digits", "--teachers", "2"],
    ["student", "train", "--method", "supervised", "--mechanism", "gnmax", "--sigma", "4",
     "--budget-epsilon", "1", "--dataset", "digits"],
])
def test_a_run_directory_that_cannot_be_created_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture, command: list[str]) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    assert main([*command[:2], "--run", str(blocker / "run"), *command[2:]]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("pate: error: ") and "Traceback" not in err[0]


def test_a_failed_command_leaves_no_empty_run_directory(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    run = tmp_path / "new-run"
    assert main(_student(run, tmp_path / "missing.npz", "--budget-epsilon", "1")) == 2
    _one_error_line(capsys, "no votes file")
    assert not run.exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    assert main(_student(kept, tmp_path / "missing.npz", "--budget-epsilon", "1")) == 2
    assert kept.is_dir()  # a directory the user made stays


def test_pate_run_help_names_every_preset() -> None:
    parser = build_parser()
    run = next(a for a in parser._subparsers._group_actions[0].choices.items()
               if a[0] == "run")[1]
    text = run.format_help().replace("\n", " ").replace("- ", "-")
    for name in preset_names():
        assert name in text, name


def test_a_delta_of_one_over_n_or_more_is_refused(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    from pate.rundir import RunDir

    rng = np.random.default_rng(3)
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250))
    run = RunDir(tmp_path / "run").create()
    run.write_json(run.partition, {"num_rows": 1297})  # as the teachers' stage records it
    args = _student(run.root, votes, "--budget-epsilon", "100")
    args[args.index("--delta") + 1] = "0.01"
    assert main(args) == 2
    _one_error_line(capsys, "delta 0.01 is at least 1/n, n the number of private records")
    assert not run.labels.exists() and not (tmp_path / "ledger.db").exists()
    assert not run.student.exists()  # not even an empty folder
    args[args.index("--delta") + 1] = "5e-4"  # below 1/n, above 1/(10 n): a warning
    assert main([*args, "--queries", "5"]) == 0
    assert "pate: warning: delta 0.0005 is above 1/(10 n)" in capsys.readouterr().err
    other = tmp_path / "b" / "votes.npz"  # a new ledger: told to, it accepts a large delta
    other.parent.mkdir()
    other.write_bytes(votes.read_bytes())
    second = RunDir(tmp_path / "run2").create()  # with no answers charged to another ledger
    second.write_json(second.partition, {"num_rows": 1297})
    args[args.index("--run") + 1] = str(second.root)
    args[args.index("--votes") + 1] = str(other)
    args[args.index("--delta") + 1] = "0.01"
    assert main([*args, "--queries", "5", "--allow-large-delta"]) == 0
    # pate serve over the run holds the same rule, before its ledger is opened
    capsys.readouterr()
    assert main(["serve", "--run", str(run.root), "--mechanism", "gnmax", "--sigma", "4",
                 "--budget-epsilon", "10", "--delta", "0.01", "--token-file",
                 str(tmp_path / "tokens"), "--port", "0"]) == 2
    _one_error_line(capsys, "delta 0.01 is at least 1/n, n the number of private records")
    assert not run.ledger.exists()
    # votes that do not say how many records they protect: a large delta is said unchecked
    from pate.aggregation.label_service import open_label_service

    plain = tmp_path / "plain" / "votes.npy"
    plain.parent.mkdir()
    np.save(plain, rng.multinomial(20, np.full(10, 0.1), size=50))
    with pytest.warns(UserWarning, match="delta 0.01 cannot be checked against 1/n: these votes "
                                         "do not say how many private records"):
        open_label_service(GNMax(sigma=4.0), epsilon_budget=10.0, delta=0.01,
                           votes_path=plain).close()


def test_a_round_refused_before_the_aggregator_opens_makes_no_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An interactive round, or --select uncertainty, with no student yet, or a seed beyond
    int64: one line, and no ledger made (it would hold the mistaken budget for good), no
    student folder."""
    votes = tmp_path / "votes.npz"
    np.savez(votes, votes=np.random.default_rng(2).multinomial(20, np.full(10, 0.1), size=250))
    run = tmp_path / "run"
    interactive = ["--mechanism", "interactive", "--threshold", "5", "--sigma1", "2",
                   "--sigma2", "2", "--gamma", "0.8"]
    for extra in (["--select", "uncertainty"], interactive, ["--seed", str(2**63)]):
        args = _student(run, votes, "--budget-epsilon", "500", *extra)
        assert main(args) == 2
        _one_error_line(capsys, "need the student of a previous round" if "--seed" not in extra
                        else "--seed must be in [0, 2^63)")
        assert not (tmp_path / "ledger.db").exists() and not (tmp_path / "ledger-url.txt").exists()
        assert not (run / "student").exists()
    assert main(_student(run, votes, "--budget-epsilon", "50")) == 0  # the budget meant


def test_votes_copied_elsewhere_keep_their_delta_bound(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A run's votes.npz records how many private records its teachers learnt from: copied out
    of the run, and served or asked from there, they still refuse a delta of 1/n or more."""
    rng = np.random.default_rng(3)
    votes = tmp_path / "copy" / "votes.npz"
    votes.parent.mkdir()
    np.savez(votes, votes=rng.multinomial(20, np.full(10, 0.1), size=250),
             private_records=np.array(1297))
    args = _student(tmp_path / "run", votes, "--budget-epsilon", "100")
    args[args.index("--delta") + 1] = "0.01"
    assert main(args) == 2
    _one_error_line(capsys, "delta 0.01 is at least 1/n, n the number of private records")
    assert not (votes.parent / "ledger.db").exists()
    serve = ["serve", "--votes", str(votes), "--mechanism", "gnmax", "--sigma", "4",
             "--budget-epsilon", "10", "--delta", "0.01", "--token-file",
             str(tmp_path / "tokens"), "--port", "0"]
    (tmp_path / "tokens").write_text("a-token\n")
    (tmp_path / "tokens").chmod(0o600)
    assert main(serve) == 2
    _one_error_line(capsys, "delta 0.01 is at least 1/n, n the number of private records")
    assert not (votes.parent / "ledger.db").exists()
    assert main([*args, "--queries", "5", "--allow-large-delta"]) == 0  # when told to
    capsys.readouterr()
    np.savez(votes, votes=np.ones((3, 2)), private_records=np.array(0))
    assert main(args) == 2
    _one_error_line(capsys, "private_records must be one integer >= 1")


def test_a_command_registers_only_its_own_module() -> None:
    """`pate serve` and `pate status` start without importing torch (seconds saved on every
    call); without a command, or with an unknown one, every command is there to list."""
    import subprocess
    import sys

    probe = ("import sys; from pate.cli.main import build_parser; p = build_parser({argv}); "
             "print('torch' in sys.modules, sorted(p._subparsers._group_actions[0].choices))")
    for argv, commands in ((["serve", "--help"], ["serve"]), (["-q", "status"], ["status"])):
        out = subprocess.run([sys.executable, "-c", probe.format(argv=argv)], check=True,
                             capture_output=True, text=True).stdout.split(" ", 1)
        assert out == ["False", f"{commands}\n"]
    for argv in (None, ["bogus"]):
        names = build_parser(argv)._subparsers._group_actions[0].choices
        assert {"run", "serve", "status", "teachers", "student", "dpsgd"} <= set(names)


def test_help_gives_each_options_default(capsys: pytest.CaptureFixture) -> None:
    """``--help`` says an option's default where it has one, once."""
    for argv, shown in ((["student", "train"], ("pool (default: 30)", "(default: 1000)")),
                        (["dpsgd", "train"], ("private data (default: 40)", "(default: 2048)")),
                        (["teachers", "train"], ("(default: 250)",))):
        with pytest.raises(SystemExit):
            main([*argv, "--help"])
        text = " ".join(capsys.readouterr().out.split())
        assert all(s in text for s in shown), (argv, text)
        assert "default: None" not in text and "default: False" not in text


def test_a_warning_is_one_line_once_per_command(capsys: pytest.CaptureFixture) -> None:
    """The stages of `pate run` read the same data again, and each change of the warning
    filters lets a warning through again: the command prints it once."""
    import warnings

    from pate.cli.main import _warning_printer

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = _warning_printer()
        for _ in range(3):
            warnings.warn("the public data's column age is read as categories", stacklevel=1)
        warnings.warn("another", stacklevel=1)
    assert capsys.readouterr().err.splitlines() == [
        "pate: warning: the public data's column age is read as categories",
        "pate: warning: another"]


def test_serving_a_run_with_nothing_to_serve_makes_no_ledger(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """``pate serve`` on a run directory with neither votes nor teachers: one line, and no
    ledger (it would hold the mistaken budget for the run's teachers to come), here or where
    ``--ledger`` points."""
    run = tmp_path / "run"
    run.mkdir()
    (tmp_path / "tokens").write_text("a-token\n")
    (tmp_path / "tokens").chmod(0o600)
    serve = ["serve", "--run", str(run), "--mechanism", "gnmax", "--sigma", "2",
             "--budget-epsilon", "10", "--delta", "1e-5", "--token-file",
             str(tmp_path / "tokens"), "--port", "0"]
    for extra in ([], ["--ledger", str(run / "other.db")]):
        assert main([*serve, *extra]) == 2
        _one_error_line(capsys, "nothing to serve: no votes file and no teacher ensemble")
        assert sorted(p.name for p in run.iterdir()) == []
