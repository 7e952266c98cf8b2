"""teachers.whitening and the hog-scatter-whitened teachers: the pool's features whitened as the
formula says, and a run that records it as its pool encoder, votes with it, and keeps it from a
student that reads SimCLR encoders (that it reads the public pool alone:
test_teachers_pool_encoder.py), and the bench that trains such teachers as a run does."""

from __future__ import annotations

import stat
from argparse import Namespace

import numpy as np
import pytest
import torch
from bench_linear_experts import as_teachers

from pate.data.datasets import public_split
from pate.data.task import load_task
from pate.errors import UserError
from pate.rundir import RunDir
from student.options import StudentOptions
from student.workflow import _given_encoder
from teachers import checkpoints
from teachers.distributed import Cluster, TrainJob, train_teachers
from teachers.ensemble import TrainConfig
from teachers.models import build_model, fit_pool_encoder
from teachers.partition import make_partition
from teachers.votes import collect_votes
from teachers.whitening import COMPONENTS, pool_whitening


def _correlated(n: int, f: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, f, generator=g) @ torch.randn(f, f, generator=g) + 3.0


@pytest.mark.parametrize("shrinkage", [0.0, 1.0])
@pytest.mark.parametrize("rows", [500, 20], ids=["covariance", "gram"])
def test_components_are_uncorrelated_with_shrunk_unit_variance(shrinkage, rows):
    """On the pool itself, component k has variance v_k / (v_k + a mean(v)) and no covariance
    with another: 1 for every component when a = 0; whether found from the features'
    covariance (more rows than features) or from the rows' Gram matrix (fewer)."""
    pool = _correlated(rows, 12 if rows > 12 else 40, 0)
    mean, projection = pool_whitening(pool, 8, shrinkage)
    z = (pool - mean) @ projection
    cov = (z.T @ z / len(pool)).double()
    centred = (pool - pool.mean(0)).double()
    v = torch.linalg.eigvalsh(centred.T @ centred / len(pool)).flip(0)[:8]
    torch.testing.assert_close(cov.diagonal(), v / (v + shrinkage * v.mean()), rtol=1e-3,
                               atol=1e-4)
    torch.testing.assert_close(cov - torch.diag(cov.diagonal()), torch.zeros(8, 8,
                               dtype=torch.float64), rtol=0, atol=1e-4)
    torch.testing.assert_close(z.mean(0), torch.zeros(8), rtol=0, atol=1e-4)


def test_components_are_capped_by_the_rows_and_the_features():
    assert pool_whitening(_correlated(500, 12, 1), 64, 1.0)[1].shape == (12, 12)
    assert pool_whitening(_correlated(5, 12, 1), 64, 1.0)[1].shape == (12, 4)  # rank n - 1


def test_the_model_needs_the_whitening_and_reads_its_width(digits):
    with pytest.raises(UserError, match="needs pool encoder"):
        build_model("hog-scatter-whitened", (1, 8, 8), 10)
    encoder = fit_pool_encoder("hog-scatter-whitened", public_split(digits)[0][0], 0)
    # digits are 8x8: HOG has 36 features, scattering 324; each keeps at most COMPONENTS
    assert encoder["hog.projection"].shape == (36, 36)
    assert encoder["scatter.projection"].shape == (324, min(COMPONENTS, 324))
    model = build_model("hog-scatter-whitened", (1, 8, 8), 10, encoder)
    widths = [expert[1].in_features for expert in model.experts]
    assert widths == [encoder["hog.projection"].shape[1], encoder["scatter.projection"].shape[1]]
    assert not any(p.requires_grad for m in model.experts for p in m[0].parameters())


def test_a_run_of_whitened_teachers_votes_with_its_whitening(tmp_path, ray_stopped):
    run = tmp_path / "run"
    job = TrainJob("digits", 12, 6, TrainConfig(model="hog-scatter-whitened", epochs=8,
                                                batch_size=16, lr=0.02))
    train_teachers(run, job, Cluster(workers=1))
    path = run / "teachers" / checkpoints.ENCODER_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    collect_votes(run)
    accuracy = checkpoints.read_manifest(run)["accuracy"]
    assert accuracy["mean"] > 0.7 and accuracy["pool_plurality"] > 0.9  # chance: 0.1
    # a cnn-hog-simclr student on this run learns its own encoder: this one is no SimCLR's
    options = StudentOptions(method="vat", arch="cnn-hog-simclr")
    assert _given_encoder(RunDir(run), options, 1) is None


def test_the_benchs_teachers_are_those_of_a_run(tmp_path, ray_stopped):
    """``scripts/bench_linear_experts.py --recipe teachers --whiten 128 --shrinkage 1`` trains
    the teachers ``pate teachers train`` trains (its code, its random numbers): the same votes
    on the pool, to the last one."""
    run = tmp_path / "run"
    cfg = TrainConfig(model="hog-scatter-whitened", epochs=4, batch_size=16, lr=0.02)
    job = TrainJob("digits", 12, 6, cfg)
    train_teachers(run, job, Cluster(workers=1))
    collect_votes(run)
    task = load_task(job.source)
    args = Namespace(teachers=12, whiten=COMPONENTS, shrinkage=1.0, epochs=4, batch_size=16,
                     lr=0.02, weight_decay=cfg.weight_decay, threads=1)
    scores, votes = as_teachers(task, make_partition(len(task.private_y), 12, seed=0), args)
    np.testing.assert_array_equal(votes, np.load(run / "votes.npz")["votes"])
    accuracy = checkpoints.read_manifest(run)["accuracy"]
    assert scores["plurality_pool"] == round(accuracy["pool_plurality"], 4)
    assert scores["mean_accuracy"] == round(float(accuracy["mean"]), 4)
