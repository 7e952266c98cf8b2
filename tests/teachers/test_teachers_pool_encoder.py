"""teachers.pool_encoder and the cnn-pool-hog-simclr teachers: the NT-Xent loss, the folded and
standardised frozen encoder, an encoder (of either kind: SimCLR or the whitening of
hog-scatter-whitened) that depends on the public pool alone, and a run that records, reuses and
guards its encoder."""

from __future__ import annotations

import dataclasses
import math
import stat

import numpy as np
import pytest
import torch

from pate.data.datasets import public_split
from pate.data.task import load_task
from pate.errors import UserError
from teachers import checkpoints
from teachers.distributed import Cluster, TrainJob, _pool_encoder, train_teachers
from teachers.ensemble import TrainConfig
from teachers.models import build_model
from teachers.pool_encoder import FEATURES, FrozenEncoder, nt_xent, simclr_views, train_pool_encoder
from teachers.votes import collect_votes, load_ensemble


def test_nt_xent_is_eq1_averaged_over_all_views():
    torch.manual_seed(0)
    z, tau = torch.randn(6, 5), 0.3
    u = (z / z.norm(dim=1, keepdim=True)).numpy()
    n = 3
    terms = []
    for i in range(2 * n):
        j = (i + n) % (2 * n)
        others = sum(math.exp(u[i] @ u[k] / tau) for k in range(2 * n) if k != i)
        terms.append(-math.log(math.exp(u[i] @ u[j] / tau) / others))
    assert nt_xent(z, tau).item() == pytest.approx(np.mean(terms), rel=1e-5)
    # identical views of distinct images give a lower loss than unrelated views
    a = torch.randn(3, 5)
    assert nt_xent(torch.cat([a, a]), tau) < nt_xent(torch.cat([a, torch.randn(3, 5)]), tau)


def test_views_are_random_crops_within_range(digits):
    x = torch.as_tensor(digits.test_x[:64])
    g = torch.Generator().manual_seed(0)
    a, b = simclr_views(x, g), simclr_views(x, g)
    assert a.shape == x.shape and a.min() >= 0 and a.max() <= 1
    assert not torch.equal(a, b) and not torch.equal(a, x)
    # views still resemble their own image more than another one's
    own = (a - x).flatten(1).norm(dim=1)
    other = (a - x.roll(1, 0)).flatten(1).norm(dim=1)
    assert (own < other).float().mean() > 0.7


def test_frozen_encoder_is_folded_and_standardised_on_the_pool(digits):
    (pool_x, _), (eval_x, _) = public_split(digits)
    tensors = train_pool_encoder(pool_x, 3, seed=0)
    enc = FrozenEncoder({k: torch.as_tensor(v) for k, v in tensors.items()})
    assert not list(enc.parameters())  # buffers only: shared by the teachers, never trained
    f = enc(torch.as_tensor(pool_x))
    assert f.shape == (len(pool_x), FEATURES)
    # standardised with the statistics of the trainable encoder in eval mode: if the folded
    # convolutions differed from conv + batch norm, these would not be 0 and 1
    torch.testing.assert_close(f.mean(0), torch.zeros(FEATURES), atol=1e-3, rtol=0)
    std = torch.as_tensor(tensors["std"])  # the pool's standard deviation plus a 1e-3 floor
    torch.testing.assert_close(f.std(0), (std - 1e-3) / std, atol=1e-3, rtol=1e-3)
    assert ((std - 1e-3) / std).mean() > 0.5
    assert enc(torch.as_tensor(eval_x)).std() > 0.3  # new images are not mapped to a point


def test_build_model_demands_the_encoder_exactly_when_used():
    with pytest.raises(UserError, match="needs pool encoder"):
        build_model("cnn-pool-hog-simclr", (1, 8, 8), 10)
    with pytest.raises(UserError, match="takes no pool encoder"):
        build_model("cnn-pool-hog", (1, 8, 8), 10, {})


@pytest.mark.parametrize("model,method", [("cnn-pool-hog-simclr", "simclr"),
                                          ("hog-scatter-whitened", "whitening")])
def test_encoder_reads_the_public_pool_only(tmp_path, digits, monkeypatch, model, method):
    """Changing every private row and label leaves the encoder bit for bit the same (after 5
    epochs of SimCLR rather than the run's 60: the code path is the same), whatever its kind;
    the manifest says which kind, and where and how long SimCLR trained."""
    monkeypatch.setattr("teachers.distributed.EPOCHS", 5)
    job = TrainJob("digits", 4, 4, TrainConfig(model=model))
    task = load_task(job.source)
    other = dataclasses.replace(task, private_x=np.ascontiguousarray(task.private_x[::-1]),
                                private_y=(task.private_y + 1) % 10)
    shas = []
    for i, data in enumerate([task, other]):
        manifest = {"shards": {}}
        (tmp_path / str(i)).mkdir()
        # asked for cuda on a machine without it: trained on the CPU, and recorded so
        _pool_encoder(tmp_path / str(i), job, manifest, data, "cpu" if i else "cuda:99")
        recorded = manifest["pool_encoder"]
        shas.append(recorded["sha256"])
        assert recorded["method"] == method
        assert recorded["pool_rows"] == len(public_split(digits)[0][1])
        if method == "simclr":
            assert recorded["epochs"] == 5 and recorded["device"] == "cpu"
        else:  # fitted on the CPU whatever the device: no epochs, no device
            assert "epochs" not in recorded and "device" not in recorded
    assert shas[0] == shas[1]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_encoder_trains_on_a_gpu_as_on_the_cpu(digits, monkeypatch):
    """The same seed gives the same views and start on both devices (the random draws stay on a
    CPU generator), so the encoders agree up to float rounding, which two epochs amplify to a
    few thousandths (measured on an H200 with TF32 off: at most 0.0032); another seed or
    other views differ by tenths."""
    monkeypatch.setattr(torch.backends.cudnn, "allow_tf32", False)
    monkeypatch.setattr(torch.backends.cuda.matmul, "allow_tf32", False)
    pool_x = public_split(digits)[0][0]
    cpu, gpu = (train_pool_encoder(pool_x, 2, seed=0, device=d) for d in ("cpu", "cuda"))
    assert cpu.keys() == gpu.keys()
    for k in cpu:
        assert isinstance(gpu[k], np.ndarray)
        np.testing.assert_allclose(gpu[k], cpu[k], rtol=0, atol=1e-2)


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_run_records_reuses_and_guards_its_encoder(tmp_path, digits, ray_running):
    run = tmp_path / "run"
    job = TrainJob("digits", 12, 6, TrainConfig(model="cnn-pool-hog-simclr", epochs=8))
    train_teachers(run, job, Cluster(workers=1))
    manifest = checkpoints.read_manifest(run)
    recorded = manifest["pool_encoder"]
    path = run / "teachers" / checkpoints.ENCODER_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    collect_votes(run)
    accuracy = checkpoints.read_manifest(run)["accuracy"]
    assert accuracy["mean"] > 0.8 and accuracy["pool_plurality"] > 0.9

    # A rerun reuses the recorded encoder (nothing is missing).
    assert train_teachers(run, job, Cluster(workers=1))["trained"] == []
    assert checkpoints.read_manifest(run)["pool_encoder"] == recorded

    # A damaged encoder: voting and further training fail closed, with one clear line.
    path.write_bytes(path.read_bytes()[:-8])
    with pytest.raises(UserError, match=r"pool encoder .* missing or corrupt"):
        load_ensemble(run)
    (run / "teachers" / checkpoints.shard_file(1)).unlink()
    with pytest.raises(UserError, match="trained teachers depend on it"):
        train_teachers(run, job, Cluster(workers=1))
