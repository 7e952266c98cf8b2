"""Teachers dealt their rows by record (``teachers.partition``): adding or removing one record
changes one teacher's rows and training and no other's, so the analysis covers DP-SGD's
neighbouring datasets; the run's votes and report say which relation the ε is for."""

from __future__ import annotations

import json
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pate.config import dump_config, load_config
from pate.data.votes_file import load_partition
from pate.errors import UserError
from teachers.ensemble import TrainConfig, train_group, train_one
from teachers.partition import deal_rows, make_partition, verify_partition, write_partition


def _teachers_rows(part, x, y) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each teacher's rows as content (features, labels), in the order it reads them."""
    return [(x[p], y[p]) for p in part.parts()]


def _changed(a, b) -> list[int]:
    return [t for t, ((xa, ya), (xb, yb)) in enumerate(zip(a, b, strict=True))
            if xa.shape != xb.shape or not (np.array_equal(xa, xb) and np.array_equal(ya, yb))]


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**40), at=st.integers(0, 400), teachers=st.integers(1, 12))
def test_adding_a_record_changes_one_teacher_only(seed, at, teachers):
    gen = np.random.default_rng(seed % 997)
    x, y = gen.normal(size=(400, 2, 3)).astype(np.float32), gen.integers(0, 4, 400)
    record, label = gen.normal(size=(1, 2, 3)).astype(np.float32), 3
    a = deal_rows("record", x, y, teachers, seed)
    b = deal_rows("record", np.insert(x, at, record, axis=0), np.insert(y, at, label),
                  teachers, seed)
    owner = int(b.assignment[at])
    assert _changed(_teachers_rows(a, x, y), _teachers_rows(
        b, np.insert(x, at, record, axis=0), np.insert(y, at, label))) == [owner]
    assert b.sizes[owner] == a.sizes[owner] + 1
    others = np.arange(teachers) != owner  # their steps too: each teacher's own size sets them
    np.testing.assert_array_equal(a.step_rows()[others], b.step_rows()[others])
    assert np.array_equal(np.sort(np.concatenate(a.parts())), np.arange(400))


def test_dealt_by_position_an_added_record_moves_other_rows():
    """Why position covers changing a record only: an insertion reshuffles the deal."""
    gen = np.random.default_rng(0)
    x, y = gen.normal(size=(400, 3)).astype(np.float32), gen.integers(0, 4, 400)
    x2, y2 = np.insert(x, 7, x[:1] + 1, axis=0), np.insert(y, 7, 1)
    a, b = make_partition(400, 10, 0), make_partition(401, 10, 0)
    assert len(_changed(_teachers_rows(a, x, y), _teachers_rows(b, x2, y2))) > 1
    np.testing.assert_array_equal(a.step_rows(), np.full(10, a.sizes.min()))


def test_the_deal_is_seeded_and_a_teacher_without_rows_is_refused():
    gen = np.random.default_rng(1)
    x, y = gen.normal(size=(500, 4)).astype(np.float32), gen.integers(0, 3, 500)
    a, b, c = (deal_rows("record", x, y, 9, s) for s in (5, 5, 6))
    assert a.sha256 == b.sha256 != c.sha256 and a.by == "record"
    same = np.zeros((6, 4), np.float32)  # six copies of one record reach one teacher
    with pytest.raises(UserError, match="teachers get no rows"):
        deal_rows("record", same, np.zeros(6, np.int64), 2, 0)
    with pytest.raises(UserError, match="must be one of position, record"):
        deal_rows("hash", x, y, 9, 0)


def test_a_run_dealt_otherwise_is_refused(tmp_path):
    gen = np.random.default_rng(2)
    x, y = gen.normal(size=(100, 4)).astype(np.float32), gen.integers(0, 3, 100)
    write_partition(tmp_path, make_partition(100, 5, 0), "d")
    recorded = json.loads((tmp_path / "partition.json").read_text())
    assert recorded["by"] == "position"
    with pytest.raises(UserError, match="dealt their rows by position, not by record"):
        verify_partition(recorded, deal_rows("record", x, y, 5, 0), "d")
    del recorded["by"]  # an older version's record: dealt by position
    verify_partition(recorded, make_partition(100, 5, 0), "d")


def test_a_teachers_training_ignores_the_other_teachers_sizes(digits):
    """Teachers of one group taking different numbers of steps (sizes 60 and 40 or 70, batch
    8: 8, 5 or 9 steps an epoch) train on one stack, each teacher as it trains alone, whether
    it stops first or last."""
    x, y = torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y)
    cfg = TrainConfig(model="cnn", epochs=2, batch_size=8, lr=3e-3, seed=3)
    a, small, large = np.arange(0, 60), np.arange(60, 100), np.arange(100, 170)
    epochs_done: list[int] = []  # teacher-epochs, as each teacher ends one
    first = train_group(cfg, x, y, 10, np.array([4, 9]), [a, small], np.array([60, 40]),
                        on_epochs=epochs_done.append)
    assert epochs_done == [1, 1, 1, 1]  # teacher 9 ends its epochs at steps 5, 10; 4 at 8, 16
    second = train_group(cfg, x, y, 10, np.array([4, 9]), [a, large], np.array([60, 70]))
    alone = {4: train_one(cfg, x, y, 10, 4, a, 60), 9: train_one(cfg, x, y, 10, 9, large, 70)}
    for name, p in alone[4].named_parameters():
        for group in (first, second):  # teacher 4 stops last, then first
            torch.testing.assert_close(group[name][0], p.detach(), rtol=1e-4, atol=1e-5)
    for name, p in alone[9].named_parameters():
        assert not torch.allclose(first[name][1], second[name][1], rtol=1e-3, atol=1e-4)
        torch.testing.assert_close(second[name][1], p.detach(), rtol=1e-4, atol=1e-5)


def test_pate_run_dealt_by_record_says_what_its_epsilon_covers(tmp_path: Path) -> None:
    text = dump_config(load_config("digits-tiny")).replace(
        'partition = "position"', 'partition = "record"').replace(
        "epochs = 40", "epochs = 5")  # the student's: what the report says is tested
    (tmp_path / "c.toml").write_text(text)
    run = tmp_path / "r"
    proc = subprocess.run([sys.executable, "-m", "pate", "run", str(tmp_path / "c.toml"),
                           "--run", str(run), "--quiet"], capture_output=True, text=True,
                          timeout=900)  # a process of its own: the teachers' stage starts Ray
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads((run / "partition.json").read_text())["by"] == "record"
    assert stat.S_IMODE((run / "partition.json").stat().st_mode) == 0o600  # it counts them
    assert "1297" not in proc.stderr  # nor does a warning (delta against n) say how many
    assert load_partition(run / "votes.npz") == "record"
    report = json.loads((run / "report" / "report.json").read_text())
    page = (run / "report" / "report.html").read_text()
    owner = (run / "report" / "owner-evaluation.html").read_text()
    assert report["partition"] == "record" and report["private_records"] is None
    assert "1297" not in page  # the number of private records is not shown
    assert "adding their record to the private data or removing it" in page
    assert "changing their record" not in page
    assert "both for adding or removing a record" in owner and "not the same" not in owner


@pytest.mark.filterwarnings(  # votes on the teachers' own rows, on purpose
    "ignore:x. some of its rows are rows the teachers were trained on")
def test_the_python_teachers_deal_by_record_and_keep_it(tmp_path: Path) -> None:
    from pate.api import Teachers

    gen = np.random.default_rng(3)
    x = gen.normal(size=(300, 6)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    teachers = Teachers(3, 2, epochs=1, shard_size=3, partition="record").fit(x, y)
    loaded = Teachers.load(teachers.save(tmp_path / "t"))
    assert loaded.partition == "record"
    np.testing.assert_array_equal(loaded.vote(x[:50]), teachers.vote(x[:50]))
    with pytest.raises(UserError, match="partition must be one of position, record"):
        Teachers(3, 2, partition="hash")


def test_a_teacher_of_one_row_beside_a_large_one_draws_only_its_own_orders(digits):
    """The minibatch orders are drawn per number of steps: drawn for both at the larger one's,
    the teacher of one row took (its epochs) x (the larger partition) keys: 157 MB here."""
    x, y = torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y)
    cfg = TrainConfig(model="mlp", epochs=2, batch_size=8, seed=0)
    parts = [np.arange(0, 1), np.arange(1, 1201)]
    tracemalloc.start()
    try:
        train_group(cfg, x, y, 10, np.array([0, 1]), parts, np.array([1, 1200]))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 50e6, peak
