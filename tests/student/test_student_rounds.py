"""Query rounds: selection, labels.npz, and ``pate student train`` against the in-process
aggregator and against a real ``pate serve`` (Confident-GNMax, then Interactive-GNMax)."""

from __future__ import annotations

import json
import re
import sqlite3
from dataclasses import replace
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_harness import auth, serving, write_tokens
from student_support import one_thread, released, votes_for

from analysis.mechanisms import ConfidentGNMax
from analysis.rdp import epsilon_from_rdp
from pate.aggregation.aggregators import Aggregator
from pate.api import PrivateLabels
from pate.cli.main import main
from pate.data.datasets import Dataset, public_split
from pate.data.task import Benchmark, load_task
from pate.data.votes_file import load_votes_with_index
from pate.errors import UserError
from pate.rundir import RunDir
from student.rounds import (
    Received,
    interactive_baseline,
    read_rounds,
    round_plan,
    select_queries,
)

pytestmark = pytest.mark.usefixtures(one_thread.__name__)

CONFIDENT = ["--mechanism", "confident", "--threshold", "150", "--sigma1", "40",
             "--sigma2", "20"]
INTERACTIVE = ["--mechanism", "interactive", "--threshold", "100", "--sigma1", "40",
               "--sigma2", "20", "--gamma", "0.5"]
TRAIN = ["--method", "supervised", "--arch", "mlp", "--dataset", "digits", "--epochs", "2"]


@pytest.fixture()
def run_dir(tmp_path: Path, digits: Dataset) -> Path:
    """A run directory whose votes.npz covers digits' public pool (250 rows), synthetic."""
    (_, pool_y), _ = public_split(digits)
    np.savez(tmp_path / "votes.npz", votes=votes_for(pool_y),
             pool_index=np.arange(len(pool_y), dtype=np.int64))
    return tmp_path


def _pool_labels(digits: Dataset) -> np.ndarray:
    return public_split(digits)[0][1]


def test_selection() -> None:
    cand = np.array([9, 3, 5, 7, 1])
    np.testing.assert_array_equal(select_queries(cand, 3, "first"), [1, 3, 5])
    picked = select_queries(cand, 3, "random", np.random.default_rng(0))
    assert len(set(picked.tolist())) == 3 and set(picked.tolist()) <= set(cand.tolist())
    # asked in a random order: a round the budget cuts short keeps a random part, not the
    # lowest indices (the first 50 of 500 of 0-999 average about 500, sorted about 50)
    many = np.arange(1000)
    firsts = [select_queries(many, 500, "random", np.random.default_rng(s))[:50].mean()
              for s in range(20)]
    assert 400 < np.mean(firsts) < 600
    probs = np.array([[0.9, 0.1], [0.5, 0.5], [0.6, 0.4], [0.5, 0.5], [1.0, 0.0]])
    np.testing.assert_array_equal(select_queries(cand, 3, "uncertainty", probs=probs),
                                  [3, 7, 5])
    assert select_queries(cand, 10, "first").size == 5


def test_a_damaged_rounds_record_is_one_error(tmp_path: Path) -> None:
    from pate.rundir import RunDir

    run = RunDir(tmp_path).create()
    assert read_rounds(run) == []
    run.rounds.parent.mkdir()
    good = {"mechanism": {"mechanism": "gnmax", "sigma": 4.0}, "select": "first", "queries": 5}
    run.write_json(run.rounds, [good])
    assert read_rounds(run) == [good]
    for bad in ({"rounds": []}, [{"mechanism": {"mechanism": "gnmax"}}],
                [{**good, "queries": "5"}], [{**good, "mechanism": "gnmax"}]):
        run.write_json(run.rounds, bad)
        with pytest.raises(UserError, match="not a record of query rounds"):
            read_rounds(run)


def test_received_round_trip(tmp_path: Path) -> None:
    a = Received(np.array([4, 2]), np.array([1, -1]), np.array([1, 0], np.int8))
    b = Received(np.array([7]), np.array([3]), np.array([2], np.int8))
    (a + b).save(tmp_path / "labels.npz")
    back = Received.load(tmp_path / "labels.npz")
    assert back.pool_fingerprint is None  # as an older version's file
    np.testing.assert_array_equal(back.pool_index, [4, 2, 7])
    a = replace(a, pool_fingerprint="pool-a")
    (a + b).save(tmp_path / "labels.npz")  # the pool of either side
    assert Received.load(tmp_path / "labels.npz").pool_fingerprint == "pool-a"
    assert (b + a).first(1).pool_fingerprint == "pool-a"
    with pytest.raises(ValueError, match="two different pools"):
        _ = a + replace(b, pool_fingerprint="pool-b")
    # a damaged fingerprint is one error line, not a traceback
    for bad in (np.array(["a", "b"]), np.array(""), np.array([{"a": 1}], dtype=object)):
        np.savez(tmp_path / "bad.npz", pool_index=[4], label=[1], branch=[1],
                 pool_fingerprint=bad)
        with pytest.raises(UserError, match=r"pool_fingerprint (must be one non-empty string|"
                                            r"cannot be read)"):
            Received.load(tmp_path / "bad.npz")
    np.testing.assert_array_equal(back.label, [1, -1, 3])
    assert back.counts() == {"queries": 3, "answered": 2, "answered_by_teachers": 1,
                             "answered_by_student": 1}
    with pytest.raises(ValueError, match="twice"):
        _ = a + a
    # a branch that contradicts its label, or no branch at all, is a damaged file: it would
    # change which answers count as the teachers' (and so the publishable epsilon)
    for branch in ([1, 1, 2], [1, 0, 3], [0, 0, 2]):
        np.savez(tmp_path / "bad.npz", pool_index=[4, 2, 7], label=[1, -1, 3], branch=branch)
        with pytest.raises(UserError, match="branch must be 1 or 2 where a label came back"):
            Received.load(tmp_path / "bad.npz")


def _metrics(run: Path) -> dict:
    return json.loads((run / "student" / "metrics.json").read_text())


def test_two_rounds_with_the_local_aggregator(run_dir: Path, digits: Dataset) -> None:
    local = ["--run", str(run_dir), "--budget-epsilon", "1e6", *TRAIN]
    assert main(["student", "train", *local, *CONFIDENT, "--queries", "120",
                 "--balance-classes"]) == 0
    first = Received.load(run_dir / "labels.npz")
    np.testing.assert_array_equal(first.pool_index, np.arange(120))
    m = _metrics(run_dir)
    assert m["queries"] == 120 and 0 < m["answered"] <= 120
    assert m["labels_used"] == m["answered"] == m["answered_by_teachers"]
    truth = _pool_labels(digits)[first.pool_index]
    ok = first.label >= 0
    assert m["label_accuracy"] == pytest.approx(np.mean(first.label[ok] == truth[ok]))
    assert m["label_accuracy"] > 0.9
    assert m["training"]["balance_classes"] and "vat_eps" not in m["training"]  # supervised
    assert m["epsilon"]["data_independent"] > 0
    assert m["epsilon"]["data_dependent_sanitised"] > 0  # released with noise: see below
    assert (run_dir / "student" / "model.safetensors").is_file()

    assert main(["student", "train", *local, *INTERACTIVE, "--queries", "80",
                 "--select", "uncertainty"]) == 0
    both = Received.load(run_dir / "labels.npz")
    assert len(both) == 200 and np.unique(both.pool_index).size == 200
    np.testing.assert_array_equal(both.pool_index[:120], first.pool_index)
    m2 = _metrics(run_dir)
    assert m2["continued_from_previous"] and len(m2["rounds"]) == 2
    assert not m2["training"]["balance_classes"]
    assert m2["rounds"][1]["mechanism"]["mechanism"] == "interactive"
    assert m2["epsilon"]["data_independent"] > m["epsilon"]["data_independent"]
    # each round released the sanitised epsilon of every answer so far, once, and kept it
    assert released(run_dir / "ledger.db") == [
        (120, m["epsilon"]["data_dependent_sanitised"]),
        (200, m2["epsilon"]["data_dependent_sanitised"])]


def test_interactive_needs_a_previous_student(run_dir: Path, capsys: pytest.CaptureFixture
                                              ) -> None:
    rc = main(["student", "train", "--run", str(run_dir), "--budget-epsilon", "1e6", *TRAIN,
               *INTERACTIVE, "--queries", "10"])
    assert rc == 2
    assert "previous round" in capsys.readouterr().err


def test_a_round_stops_at_the_budget(run_dir: Path) -> None:
    agg = Aggregator(ConfidentGNMax(threshold=150, sigma1=40, sigma2=20))
    # The worst case of one request of 40 queries fits; after it, no second one of 40 can, but
    # the realised cost of the first (declined queries cost less) leaves room for smaller ones:
    # the round asks again in halves until even one query is refused.
    budget = epsilon_from_rdp(agg.worst_case_rdp(40), agg.orders, 1e-5)[0] + 1e-9
    assert main(["student", "train", "--run", str(run_dir), "--budget-epsilon", str(budget),
                 *TRAIN, *CONFIDENT, "--queries", "200", "--request-size", "40"]) == 0
    asked = Received.load(run_dir / "labels.npz").pool_index
    assert 40 < asked.size < 80
    np.testing.assert_array_equal(asked, np.arange(asked.size))
    assert _metrics(run_dir)["epsilon"]["data_independent"] <= budget


def test_rounds_against_a_real_service(run_dir: Path, digits: Dataset,
                                       capsys: pytest.CaptureFixture) -> None:
    tokens = write_tokens(run_dir / "tokens")
    serve = ["--votes", str(run_dir / "votes.npz"), "--delta", "1e-5", "--token-file",
             str(tokens), "--budget-epsilon", "1e6"]
    client = ["--run", str(run_dir), "--token-file", str(tokens), *TRAIN]
    with serving([*serve, *CONFIDENT], run_dir) as server:
        # a round told another mechanism than the server's is refused before anything is asked
        assert main(["student", "train", *client, "--server", server.url,
                     "--mechanism", "gnmax", "--queries", "100"]) == 2
        assert "answers with 'confident', not the 'gnmax'" in capsys.readouterr().err
        assert not (run_dir / "labels.npz").exists() and not (run_dir / "student").exists()
        assert main(["student", "train", *client, "--server", server.url,
                     "--mechanism", "confident", "--queries", "100"]) == 0
        spent = httpx.get(server.url + "/v1/budget", headers=auth()).json()["epsilon_spent"]
    got = Received.load(run_dir / "labels.npz")
    np.testing.assert_array_equal(got.pool_index, np.arange(100))
    ok = got.label >= 0
    assert np.mean(got.label[ok] == _pool_labels(digits)[got.pool_index][ok]) > 0.9
    m = _metrics(run_dir)
    assert m["epsilon"]["data_independent"] == pytest.approx(spent)
    assert m["epsilon"]["data_dependent_sanitised"] is None  # the votes are the server's

    # Round 2, Interactive-GNMax on the same ledger: the student sends its probabilities.
    with serving([*serve, *INTERACTIVE], run_dir) as server:
        assert main(["student", "train", *client, "--server", server.url,
                     "--mechanism", "interactive", "--queries", "60"]) == 0
        after = httpx.get(server.url + "/v1/budget", headers=auth()).json()
    both = Received.load(run_dir / "labels.npz")
    assert len(both) == 160 and after["queries"] == 160
    assert after["epsilon_spent"] > spent
    assert _metrics(run_dir)["answered"] == after["answered"]
    # the rounds record the server's parameters (GET /v1/mechanism), for their analysis
    assert [r["mechanism"] for r in _metrics(run_dir)["rounds"]] == [
        {"mechanism": "confident", "threshold": 150.0, "sigma1": 40.0, "sigma2": 20.0},
        {"mechanism": "interactive", "threshold": 100.0, "sigma1": 40.0, "sigma2": 20.0,
         "gamma": 0.5}]


def test_the_same_answers_get_the_same_sanitised_epsilon_in_any_run(
        run_dir: Path) -> None:
    """Privacy rule 6: a sanitised epsilon is drawn once per set of answers. Two run
    directories on one votes file asking the same rows (replays, free) publish the figure
    released for them, not a fresh draw whose noise could be averaged away; more answers get
    a new release, which pays for the first."""
    votes = run_dir / "votes.npz"

    def student(run: str, queries: int) -> float:
        assert main(["student", "train", "--run", str(run_dir / run), "--votes", str(votes),
                     "--budget-epsilon", "1e6", *TRAIN, *CONFIDENT, "--select", "first",
                     "--queries", str(queries)]) == 0
        return _metrics(run_dir / run)["epsilon"]["data_dependent_sanitised"]

    first = student("a", 90)
    with sqlite3.connect(run_dir / "ledger.db") as db:  # drawn with noise (no fallback)
        assert db.execute("SELECT sigma FROM ledger_releases").fetchall()[0][0] > 0
    assert student("b", 90) == first
    assert released(run_dir / "ledger.db") == [(90, first)]
    # the Python API asking the same rows of the same ledger, in another order and one request,
    # gets the answers again and the figure released for them
    pool_votes, pool_index = load_votes_with_index(votes)
    asked = Received.load(run_dir / "a" / "labels.npz").pool_index
    with PrivateLabels(pool_votes, ConfidentGNMax(150.0, 40.0, 20.0), epsilon_budget=1e6,
                       delta=1e-5, ledger=run_dir / "ledger.db") as labels:
        assert (pool_index == np.arange(len(pool_index))).all()  # rows are pool indices
        labels.ask(asked[::-1])
        assert labels.epsilon().smooth_sensitivity == first
    assert released(run_dir / "ledger.db") == [(90, first)]
    more = student("c", 120)
    # decided before asking, no sanitised figure is released for other answers: none drawn
    assert main(["student", "train", "--run", str(run_dir / "d"), "--votes", str(votes),
                 "--budget-epsilon", "1e6", *TRAIN, *CONFIDENT, "--select", "random",
                 "--queries", "60", "--no-sanitised-epsilon"]) == 0
    assert _metrics(run_dir / "d")["epsilon"]["data_dependent_sanitised"] is None
    assert released(run_dir / "ledger.db") == [(90, first), (120, more)]


def test_a_round_stopped_while_it_asked_keeps_what_it_got(run_dir: Path) -> None:
    """A round is recorded before its first request and its counts after each saved answer:
    stopped between saving answers and counting them, or before any answer, the next command
    accounts for every saved row (the analysis needs each row's round) and asks nothing again."""
    args = ["student", "train", "--run", str(run_dir), "--budget-epsilon", "1e6", *TRAIN,
            *CONFIDENT, "--select", "random", "--request-size", "20"]
    assert main([*args, "--queries", "40"]) == 0
    first, spent = Received.load(run_dir / "labels.npz"), _metrics(run_dir)["epsilon"]
    whole = read_rounds(RunDir(run_dir))
    assert [r["queries"] for r in whole] == [40]
    # the second request's answers saved, their counts not; then a round with no answer yet
    stopped = [{**whole[0], **first.first(20).counts()},
               {**whole[0], **Received.empty().counts()}]
    (run_dir / "student" / "rounds.json").write_text(json.dumps(stopped))
    assert main([*args, "--queries", "0"]) == 0
    assert read_rounds(RunDir(run_dir)) == whole
    again = Received.load(run_dir / "labels.npz")
    np.testing.assert_array_equal(again.pool_index, first.pool_index)
    assert _metrics(run_dir)["epsilon"]["data_independent"] == spent["data_independent"]


def test_a_student_trains_again_on_the_answers_in_hand_without_an_aggregator(
        run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """``--queries 0`` and no aggregator named: another student on the same answers, nothing
    asked, spent or released; its metrics carry the epsilons of the round that asked."""
    again = ["student", "train", "--run", str(run_dir), "--queries", "0",
             "--method", "vat", "--arch", "mlp", "--dataset", "digits", "--epochs", "1"]
    assert main(again) == 2  # nothing in hand yet
    assert "needs a round that asked them here" in capsys.readouterr().err
    assert main(["student", "train", "--run", str(run_dir), "--budget-epsilon", "1e6", *TRAIN,
                 *CONFIDENT, "--queries", "40"]) == 0
    first = _metrics(run_dir)
    ledger = (run_dir / "ledger.db").stat().st_mtime_ns
    releases = released(run_dir / "ledger.db")
    (run_dir / "student" / "metrics.json").unlink()  # as a training interrupted after its round
    assert main(again) == 2
    said = capsys.readouterr().err
    assert "have no epsilons of their own yet" in said and "again with --queries 0" in said
    (run_dir / "student" / "metrics.json").write_text(json.dumps(first))
    assert main(again) == 0
    second = _metrics(run_dir)
    assert (second["method"], first["method"]) == ("vat", "supervised")
    assert second["epsilon"] == first["epsilon"] and second["rounds"] == first["rounds"]
    assert second["queries"] == first["queries"] == 40
    assert (second["asked_this_round"], first["asked_this_round"]) == (0, 40)
    assert "(as the round that asked them gave)" in capsys.readouterr().out
    assert (run_dir / "ledger.db").stat().st_mtime_ns == ledger
    assert released(run_dir / "ledger.db") == releases
    assert main(["student", "train", "--run", str(run_dir), "--queries", "5",
                 "--method", "vat", "--dataset", "digits"]) == 2
    assert "--mechanism names the aggregator to ask" in capsys.readouterr().err
    assert main([*again, "--pool-size", "200"]) == 2  # answers of another pool's rows
    assert "answers in hand are of another public pool" in capsys.readouterr().err
    held = Received.load(run_dir / "labels.npz")
    assert len(held) == 40
    assert held.pool_fingerprint == load_task(Benchmark("digits"),
                                              need_private=False).pool_fingerprint
    metrics = _metrics(run_dir)  # either record of another pool refuses
    (run_dir / "student" / "metrics.json").write_text(
        json.dumps({**metrics, "pool_fingerprint": "another"}))
    assert main(again) == 2
    assert "answers in hand are of another public pool" in capsys.readouterr().err
    # labels.npz alone says so, with the metrics' record gone
    del metrics["pool_fingerprint"]
    (run_dir / "student" / "metrics.json").write_text(json.dumps(metrics))
    (run_dir / "votes.npz").unlink()  # nor do the votes
    assert main([*again, "--pool-size", "200"]) == 2
    assert "answers in hand are of another public pool" in capsys.readouterr().err


def test_votes_cast_on_another_pool_are_refused_before_anything_is_asked(
        run_dir: Path, capsys: pytest.CaptureFixture) -> None:
    """votes.npz records the pool it was cast on (``Task.pool_fingerprint``): a student whose
    pool is another is refused, by a votes file here before its ledger exists and by a
    server's GET /v1/pool before anything is asked; a student of that pool goes on."""
    def pool(size: int | None) -> str:
        return load_task(Benchmark("digits", pool_size=size), need_private=False).pool_fingerprint

    with np.load(run_dir / "votes.npz") as f:
        votes, index = f["votes"], f["pool_index"]
    np.savez(run_dir / "votes.npz", votes=votes, pool_index=index,
             pool_fingerprint=np.array(pool(200)))
    here = ["student", "train", "--run", str(run_dir), "--budget-epsilon", "1e6", *TRAIN,
            *CONFIDENT, "--queries", "20"]
    assert main(here) == 2
    said = capsys.readouterr().err
    assert "another public pool than the student's (of the built-in dataset digits;" in said
    assert "name the votes' pool with the data flags" in said
    assert not (run_dir / "ledger.db").exists() and not (run_dir / "labels.npz").exists()

    tokens = write_tokens(run_dir / "tokens")
    serve = ["--votes", str(run_dir / "votes.npz"), "--delta", "1e-5", "--token-file",
             str(tokens), "--budget-epsilon", "1e6", *CONFIDENT]
    with serving(serve, run_dir) as server:
        described = httpx.get(server.url + "/v1/pool", headers=auth()).json()
        assert described == {"rows": len(index), "first_index": 0,
                             "last_index": len(index) - 1, "teachers": int(votes[0].sum()),
                             "classes": 10, "fingerprint": pool(200)}
        assert main(["student", "train", "--run", str(run_dir), "--token-file", str(tokens),
                     *TRAIN, "--server", server.url, "--mechanism", "confident",
                     "--queries", "20"]) == 2
        assert "cast on another public pool" in capsys.readouterr().err
        assert httpx.get(server.url + "/v1/budget", headers=auth()).json()["queries"] == 0
    np.savez(run_dir / "votes.npz", votes=votes, pool_index=index,
             pool_fingerprint=np.array(pool(None)))
    assert main(here) == 0
    assert len(Received.load(run_dir / "labels.npz")) == 20


def test_interactive_baseline_looks_up_each_row_by_pool_index(tmp_path: Path) -> None:
    sent_index = np.array([7, 2, 9, 4])
    probs = np.random.default_rng(0).dirichlet(np.ones(3), size=4)
    path = tmp_path / "probs.npz"
    np.savez(path, pool_index=sent_index, probs=probs)
    got = interactive_baseline(path, np.array([9, 2, 4]), 50.0)
    np.testing.assert_allclose(got, 50.0 * probs[[2, 1, 3]])
    with pytest.raises(UserError, match="no student probabilities for 2 interactive"):
        interactive_baseline(path, np.array([2, 3, 11]), 50.0)
    with pytest.raises(UserError, match="no student probabilities for 1 interactive"):
        interactive_baseline(tmp_path / "absent.npz", np.array([2]), 50.0)


def test_round_plan_reads_each_rounds_mechanism_and_rows() -> None:
    """One reading of ``student/rounds.json`` for the analysis, the report and the audit: the
    recorded mechanism, or the configuration's where only its name was recorded; a damaged
    record or one that does not cover the answers is one UserError."""
    received = Received(np.arange(5), np.array([0, 1, -1, 2, 0]), np.array([1, 1, 0, 1, 1]))
    confident = {"mechanism": "confident", "threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0}
    rounds = [{"mechanism": confident, "queries": 3},
              {"mechanism": {"mechanism": "confident"}, "queries": 2}]
    with pytest.raises(UserError, match="parameters are not recorded"):
        round_plan(rounds, received)
    plan = round_plan(rounds, received, lambda name: ConfidentGNMax(100.0, 50.0, 20.0))
    assert [rows for _, rows in plan] == [slice(0, 3), slice(3, 5)]
    assert plan[0][0] == ConfidentGNMax(200.0, 150.0, 40.0)
    assert plan[1][0] == ConfidentGNMax(100.0, 50.0, 20.0)
    with pytest.raises(UserError, match=r"its rounds ask 4 rows, labels\.npz holds 5"):
        round_plan([{"mechanism": confident, "queries": 4}], received)
    with pytest.raises(UserError, match=r"^student/rounds\.json: "):
        round_plan([{"mechanism": {**confident, "sigma1": -1.0}, "queries": 5}], received)


def test_classes_no_answer_is_of_are_warned_of(run_dir: Path, digits: Dataset,
                                              capsys: pytest.CaptureFixture) -> None:
    """A round whose answers leave out classes (6 pool rows cannot hold all 10 digits) says
    which, by name, in one warning line: the student will not predict them."""
    assert main(["student", "train", "--run", str(run_dir), "--budget-epsilon", "1e9",
                 *TRAIN, *CONFIDENT, "--queries", "6", "--select", "first"]) == 0
    line = next(x for x in capsys.readouterr().err.splitlines() if "no answered label" in x)
    answered = set(Received.load(run_dir / "labels.npz").label.tolist()) - {-1}
    named = re.search(r"class\(es\) ([\d, ]+?)(?: and (\d+) more)?, of 10:", line)
    assert line.startswith("pate: warning: ") and named, line
    shown = {int(k) for k in named.group(1).split(", ")}
    assert not shown & answered
    assert len(shown) + int(named.group(2) or 0) == 10 - len(answered)
