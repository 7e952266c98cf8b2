"""teachers.votes: vote histograms, accuracy, votes.npz, and the CLI."""

from __future__ import annotations

import json
import stat

import numpy as np
import pytest
import torch
from torch.func import functional_call

from pate.cli.main import main
from pate.data.datasets import public_split
from pate.errors import UserError
from teachers import checkpoints
from teachers.ensemble import TrainConfig, train_group
from teachers.models import build_model
from teachers.partition import make_partition
from teachers.votes import Ensemble, load_ensemble, vote_groups


@pytest.fixture(scope="module")
def ensemble(digits):
    part = make_partition(len(digits.train_y), 9, 0)
    cfg = TrainConfig(model="cnn", epochs=6, batch_size=16, augment="none")
    x, y = torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y)
    shards = [train_group(cfg, x, y, 10, np.array(ids), part.parts(ids), int(part.sizes.min()))
              for ids in (range(0, 5), range(5, 9))]
    return Ensemble("cnn", (1, 8, 8), 10, shards)


def test_votes_are_the_histogram_of_each_teachers_label(digits, ensemble):
    x = digits.test_x[:77]
    votes = ensemble.vote(x, batch_size=32)
    assert votes.dtype == np.int32 and votes.shape == (77, 10)
    assert (votes.sum(1) == ensemble.num_teachers).all() and ensemble.num_teachers == 9
    base = build_model("cnn", (1, 8, 8), 10)
    expected = np.zeros((77, 10), dtype=np.int32)
    for shard in ensemble.shards:  # reference: one teacher at a time
        for k in range(next(iter(shard.values())).shape[0]):
            with torch.no_grad():
                pred = functional_call(base, {n: v[k] for n, v in shard.items()},
                                       (torch.as_tensor(x),)).argmax(1).numpy()
            expected[np.arange(77), pred] += 1
    np.testing.assert_array_equal(votes, expected)
    acc = ensemble.accuracy(x, digits.test_y[:77], batch_size=32)
    assert acc.shape == (9,) and 0.5 < acc.mean() <= 1.0
    assert (votes.argmax(1) == digits.test_y[:77]).mean() >= acc.mean() - 0.05


def test_wrong_input_shape_is_a_user_error(ensemble):
    with pytest.raises(UserError, match="shape"):
        ensemble.vote(np.zeros((2, 1, 28, 28), dtype=np.float32))


def test_load_ensemble_needs_a_trained_run(tmp_path):
    with pytest.raises(UserError, match="teachers train"):
        load_ensemble(tmp_path)


def test_cli_train_votes_student_and_report(tmp_path, digits, capsys, ray_running):
    run = tmp_path / "run"
    argv = ["teachers", "train", "--run", str(run), "--dataset", "digits", "--teachers", "6",
            "--shard-size", "3", "--epochs", "4", "--workers", "1", "--pool-size", "200"]
    assert main(argv) == 0
    assert main(["teachers", "votes", "--run", str(run)]) == 0
    with np.load(run / "votes.npz") as f:
        votes, index = f["votes"], f["pool_index"]
    assert votes.dtype == np.int32 and votes.shape == (200, 10) and (votes.sum(1) == 6).all()
    assert index.dtype == np.int64 and index.tolist() == list(range(200))
    assert stat.S_IMODE((run / "votes.npz").stat().st_mode) == 0o600
    acc = checkpoints.read_manifest(run)["accuracy"]
    (_, pool_y), (_, eval_y) = public_split(digits, 200)
    assert acc["rows"] == len(eval_y) and len(acc["per_teacher"]) == 6
    assert acc["pool_plurality"] == pytest.approx((votes.argmax(1) == pool_y).mean())
    assert acc["mean"] > 0.5
    assert str(votes.sum()) not in capsys.readouterr().err  # nothing private is printed
    assert main(["teachers", "train", "--run", str(run), "--dataset", "digits",
                 "--teachers", "7"]) == 2  # a different partition: refused, one line

    # the separate commands' directory (no config.toml) gets its report too: the data of the
    # teachers' manifest, the delta of the student's metrics, the round as rounds.json has it
    assert main(["student", "train", "--run", str(run), "--mechanism", "confident",
                 "--threshold", "4", "--sigma1", "1", "--sigma2", "1", "--budget-epsilon",
                 "1e4", "--delta", "1e-5", "--queries", "60", "--method", "supervised",
                 "--arch", "mlp", "--epochs", "2"]) == 0
    # another pool than the one the teachers voted on is refused before anything is asked
    assert main(["student", "train", "--run", str(run), "--mechanism", "confident",
                 "--threshold", "4", "--sigma1", "1", "--sigma2", "1", "--budget-epsilon",
                 "1e4", "--delta", "1e-5", "--queries", "60", "--method", "supervised",
                 "--dataset", "digits", "--pool-size", "150"]) == 2
    assert "the student's pool must be theirs" in capsys.readouterr().err
    assert main(["report", "--run", str(run)]) == 0
    report = json.loads((run / "report" / "report.json").read_text())
    assert (report["dataset"], report["delta"], report["queries"]["asked"]) == ("digits", 1e-5,
                                                                                 60)
    assert report["privacy"]["mechanism"] == "confident" and "config" not in report
    labels = np.load(run / "labels.npz")
    answered = labels["label"] >= 0
    assert report["queries"]["label_accuracy"] == pytest.approx(
        np.mean(labels["label"][answered] == pool_y[labels["pool_index"][answered]]))



def test_shards_are_regrouped_for_voting_in_order(ensemble):
    """``vote_groups`` keeps every teacher, in order, in groups of at least a shard's worth."""
    def sizes(groups):
        return [next(iter(g.values())).shape[0] for g in groups]

    stacked = {name: torch.cat([s[name] for s in ensemble.shards]) for name in ensemble.shards[0]}
    assert sizes(vote_groups(stacked, [5, 4], 3)) == [5, 4]
    assert sizes(vote_groups(stacked, [5, 4], 7)) == [7, 2]
    merged = vote_groups(stacked, [5, 4], 100)
    assert sizes(merged) == [9] and vote_groups({}, [], 100) == []
    for name in stacked:
        assert merged[0][name].data_ptr() == stacked[name].data_ptr()  # views, not copies
