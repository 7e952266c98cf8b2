"""teachers.distributed on a real local Ray: shards are checkpointed, a rerun trains only what is
missing, and a run killed mid-way (SIGKILL, driver and Ray workers) loses only its shards in
flight."""

from __future__ import annotations

import http.server
import json
import os
import re
import signal
import stat
import subprocess
import sys
import threading
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import ray
import torch

from pate.data.task import Benchmark, load_task
from pate.errors import UserError
from teachers import checkpoints
from teachers.distributed import (
    Cluster,
    TrainJob,
    _check_reachable,
    _cpus_per_shard,
    _shards_failed,
    device_share,
    shard_ranges,
    train_teachers,
)
from teachers.ensemble import TrainConfig, train_group
from teachers.partition import make_partition, own_rows

CFG = TrainConfig(model="mlp", epochs=3, batch_size=16, augment="none", seed=1)  # cheap: the
# tests are of checkpoints and Ray; the networks are tested in test_teachers_ensemble.py
JOB = TrainJob("digits", num_teachers=12, shard_size=4, train=CFG)


def _shas(run: Path) -> dict[str, str]:
    return {i: s["sha256"] for i, s in checkpoints.read_manifest(run)["shards"].items()}


def test_shard_ranges_cover_all_teachers():
    shards = shard_ranges(10, 4)
    assert [(r.start, r.stop) for r in shards] == [(0, 4), (4, 8), (8, 10)]


def test_a_ray_shard_counts_on_its_cpus_share_of_the_memory(ray_running):
    """Shards in flight side by side see the same free memory when they decide whether their
    table fits: each counts on its CPUs' share of its node's (``device_share``)."""
    node_cpus = ray.cluster_resources()["CPU"]  # one local node
    share = ray.get(ray.remote(device_share).options(num_cpus=1).remote("cpu"))
    assert share == pytest.approx(1 / node_cpus)
    assert device_share("cpu") == 1.0  # the driver, as the Python API trains its shards


@pytest.mark.parametrize("cluster,message", [
    (Cluster(workers=0), "--workers and --shard-size must be at least 1"),
    (Cluster(gpus_per_shard=0), "--gpus-per-shard must be a number > 0"),
    (Cluster(gpus_per_shard=float("nan")), "--gpus-per-shard must be a number > 0"),
    (Cluster(gpus_per_shard=1.5), "--gpus-per-shard must be a share of one GPU (at most 1) or "
                                  "a whole number of GPUs, got 1.5")])
def test_a_cluster_that_cannot_run_is_refused_before_anything(tmp_path, cluster, message):
    with pytest.raises(UserError, match=re.escape(message)):
        train_teachers(tmp_path / "run", JOB, cluster)
    assert not (tmp_path / "run").exists()


def test_more_teachers_than_any_run_could_have_are_refused_at_once(tmp_path):
    """Said before the shards are listed: 10^20 teachers hung there, before the data could
    say that each needs a private row of its own."""
    with pytest.raises(UserError, match=r"--teachers must be at most 10,000,000, got 10{20}"):
        train_teachers(tmp_path / "run", replace(JOB, num_teachers=10**20))
    assert not (tmp_path / "run").exists()


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
def test_cuda_on_a_machine_without_a_gpu_is_refused_before_anything(tmp_path):
    """A local Ray has this machine's GPUs only: said before the partition is written (in a
    process of its own: this one may hold the test session's Ray)."""
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pate", "teachers", "train", "--run", str(run),
                           "--dataset", "digits", "--teachers", "4", "--device", "cuda"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "pate: error: device 'cuda': this machine has no CUDA GPU that torch can use"]
    assert not run.exists()


def test_train_checkpoint_and_resume(tmp_path, ray_running):
    run = tmp_path / "run"
    result = train_teachers(run, JOB, Cluster(workers=2))
    assert result == {"trained": [0, 1, 2], "skipped": []}
    assert ray.is_initialized()  # the Ray this process started is left running
    manifest = checkpoints.read_manifest(run)
    assert manifest["done"] and manifest["num_teachers"] == 12
    assert stat.S_IMODE((run / "teachers").stat().st_mode) == 0o700
    for i in range(3):
        assert stat.S_IMODE((run / "teachers" / checkpoints.shard_file(i)).stat().st_mode) == 0o600
    assert json.loads((run / "partition.json").read_text())["sizes"] == [109] + [108] * 11
    before = _shas(run)
    # each Ray task was given its shard's rows alone (own_rows), renumbered: the teachers are
    # those train_group trains on the whole private split with the rows' own indices
    task = load_task(Benchmark("digits"))
    part = make_partition(len(task.private_y), JOB.num_teachers, CFG.seed)
    rows, renumbered = own_rows(part.parts(range(4, 8)))
    assert np.array_equal(np.sort(rows), np.flatnonzero(np.isin(part.assignment, range(4, 8))))
    assert all(np.array_equal(rows[r], p) for r, p in zip(renumbered,
                                                           part.parts(range(4, 8)), strict=True))
    expected = train_group(CFG, torch.tensor(task.private_x), torch.tensor(task.private_y), 10,
                           np.arange(4, 8), part.parts(range(4, 8)), int(part.sizes.min()))
    shard = checkpoints.load_shard(run, 1, before["1"])
    assert all(torch.equal(expected[k], shard[k]) for k in expected)

    # Nothing missing: nothing trained.
    assert train_teachers(run, JOB, Cluster(workers=2))["trained"] == []
    # A lost checkpoint is retrained alone, identically (training is deterministic).
    (run / "teachers" / checkpoints.shard_file(1)).unlink()
    assert train_teachers(run, JOB, Cluster(workers=1)) == {"trained": [1], "skipped": [0, 2]}
    assert _shas(run) == before

    with pytest.raises(UserError, match=r"other settings \(other shard_size\)"):
        train_teachers(run, TrainJob("digits", 12, 6, CFG), Cluster())
    with pytest.raises(UserError, match=r"other settings \(other train\.epochs, train\.lr\)"):
        train_teachers(run, TrainJob("digits", 12, 4, replace(CFG, epochs=CFG.epochs + 1,
                                                              lr=CFG.lr / 2)), Cluster())


def test_one_local_worker_trains_in_this_process_without_ray(tmp_path, monkeypatch, ray_stopped):
    """``workers = 1`` with no cluster: the shards train here, one after the other, with the
    checkpoints and the resume of Ray's path, and the parameters ``train_group`` gives.
    ``RAY_ADDRESS`` names a closed port, so any start of Ray would fail."""
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")
    run = tmp_path / "run"
    assert train_teachers(run, JOB, Cluster(workers=1)) == {"trained": [0, 1, 2], "skipped": []}
    assert not ray.is_initialized()
    assert checkpoints.read_manifest(run)["done"]
    before = _shas(run)
    (run / "teachers" / checkpoints.shard_file(2)).unlink()
    assert train_teachers(run, JOB, Cluster(workers=1)) == {"trained": [2], "skipped": [0, 1]}
    assert _shas(run) == before  # deterministic, as through Ray

    task = load_task(Benchmark("digits"))
    part = make_partition(len(task.private_y), JOB.num_teachers, CFG.seed)
    expected = train_group(CFG, torch.tensor(task.private_x), torch.tensor(task.private_y), 10,
                           np.arange(4, 8), part.parts(range(4, 8)), int(part.sizes.min()))
    shard = checkpoints.load_shard(run, 1, before["1"])
    assert expected.keys() == shard.keys()
    assert all(torch.equal(expected[k], shard[k]) for k in expected)


def test_missing_gpus_are_refused_before_the_pool_encoder_trains(tmp_path, ray_running):
    """Shards on cuda where Ray has no GPU: refused before the pool encoder's minutes of
    training, with nothing written under teachers/."""
    run = tmp_path / "run"
    job = TrainJob("digits", 12, 4, TrainConfig(model="cnn-pool-hog-simclr", epochs=1, seed=1))
    started = time.perf_counter()
    with pytest.raises(UserError, match="GPU"):
        train_teachers(run, job, Cluster(workers=1, device="cuda"))
    assert time.perf_counter() - started < 30  # the encoder alone trains for minutes
    assert not (run / "teachers").exists()


def test_a_run_stopped_before_its_first_shard_holds_no_settings(tmp_path, ray_running):
    """The manifest is written once training starts (``pate status``: under way); one with no
    shard and no pool encoder, as a run stopped before its first shard leaves it, holds
    nothing trained, so a rerun with other training settings starts afresh."""
    run = tmp_path / "run"
    train_teachers(run, JOB, Cluster(workers=2), only=[0])
    manifest = checkpoints.read_manifest(run)
    checkpoints.write_manifest(run, {**manifest, "shards": {}, "done": False})
    assert train_teachers(run, TrainJob("digits", 12, 6, CFG), Cluster(workers=2)) == {
        "trained": [0, 1], "skipped": []}
    assert checkpoints.read_manifest(run)["shard_size"] == 6


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_killed_run_loses_only_shards_in_flight(tmp_path, ray_running):
    run = tmp_path / "run"
    args = [sys.executable, "-m", "pate", "teachers", "train", "--run", str(run),
            "--dataset", "digits", "--teachers", "12", "--shard-size", "2", "--epochs", "10",
            "--augment", "none", "--seed", "1", "--workers", "1"]
    proc = subprocess.Popen(args, start_new_session=True, stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    manifest = run / "teachers" / "manifest.json"
    deadline = time.time() + 240
    seen_started = False  # the manifest says so before the first shard is done
    while time.time() < deadline and proc.poll() is None:
        if manifest.is_file():
            shards = json.loads(manifest.read_text())["shards"]
            seen_started |= not shards
            if shards:
                break
        time.sleep(0.05)
    assert seen_started
    assert proc.poll() is None, proc.stderr.read().decode()
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and the Ray processes it started
    proc.wait()
    done = _shas(run)
    assert 1 <= len(done) < 6 and not json.loads(manifest.read_text())["done"]

    job = TrainJob("digits", 12, 2, TrainConfig(epochs=10, augment="none", seed=1))
    result = train_teachers(run, job, Cluster(workers=2))
    assert sorted(result["skipped"]) == sorted(int(i) for i in done)
    assert sorted(result["trained"] + result["skipped"]) == list(range(6))
    after = _shas(run)
    assert all(after[i] == sha for i, sha in done.items())  # finished shards untouched

    from teachers.votes import load_ensemble
    votes = load_ensemble(run).vote(np.zeros((3, 1, 8, 8), dtype=np.float32))
    assert votes.sum(1).tolist() == [12, 12, 12]


def test_a_resume_on_reordered_or_changed_private_rows_is_refused(tmp_path, digits, ray_running):
    """The partition deals rows by position: rows shuffled (or a label changed) between a
    stopped run and its resume would put one record in two teachers. The manifest (private)
    keeps a digest of the private rows; a resume on others is refused, and nothing trains."""
    from pate.data.task import DataFiles

    private, public = tmp_path / "private.npz", tmp_path / "public.npz"
    np.savez(private, x=digits.train_x, y=digits.train_y)
    np.savez(public, x=digits.test_x[:100])
    job = TrainJob(DataFiles(str(private), str(public), classes=tuple("0123456789")), 4, 2,
                   TrainConfig(model="mlp", epochs=1, seed=0))
    run = tmp_path / "run"
    assert train_teachers(run, job, Cluster(), only=[0])["trained"] == [0]
    assert "private_fingerprint" not in (run / "partition.json").read_text()  # public file
    order = np.random.default_rng(0).permutation(len(digits.train_y))
    for x, y in ((digits.train_x[order], digits.train_y[order]),
                 (digits.train_x, np.where(np.arange(len(digits.train_y)) == 7,
                                           (digits.train_y + 1) % 10, digits.train_y))):
        np.savez(private, x=x, y=y)
        with pytest.raises(UserError, match="the private data is not what this run's teachers"):
            train_teachers(run, job, Cluster())
        assert list(checkpoints.read_manifest(run)["shards"]) == ["0"]
    np.savez(private, x=digits.train_x, y=digits.train_y)  # restored: the resume goes on
    assert train_teachers(run, job, Cluster())["trained"] == [1]


def test_shards_report_their_epochs_as_they_train(digits, ray_running):
    """A shard tells the driver's counter after each epoch (its progress within shards that
    take minutes each), vectorised or one teacher at a time."""
    from teachers.distributed import train_shard
    from teachers.epoch_counter import EpochCounter

    part = make_partition(len(digits.train_y), 4, CFG.seed)
    min_size = int(part.sizes.min())
    calls: list[int] = []
    train_group(CFG, torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y), 10,
                np.arange(4), part.parts(range(4)), min_size, on_epochs=calls.append)
    assert calls == [4] * CFG.epochs
    counter = ray.remote(num_cpus=0)(EpochCounter).remote()
    ray.get(ray.remote(train_shard).remote(CFG, digits.train_x, digits.train_y, 10, range(2),
                                           part.parts(range(2)), min_size, "cpu", 1, None,
                                           (counter, 5)))
    deadline = time.time() + 30
    while ray.get(counter.total.remote()) < 2 * CFG.epochs and time.time() < deadline:
        time.sleep(0.1)
    assert ray.get(counter.total.remote()) == 2 * CFG.epochs


def test_a_ray_address_that_does_not_answer_is_refused_at_once(tmp_path: Path) -> None:
    """Ray retries an unreachable cluster for minutes without a word; the address is tried
    first (a closed port, a name that does not resolve) and refused at once, the run left to
    resume with another."""
    for address in ("127.0.0.1:1", "ray://no-such-host.invalid:6379"):
        with pytest.raises(UserError, match=f"could not reach Ray at {address}: "):
            _check_reachable(address)
    for left_to_ray in ("auto", "local", "::1"):
        _check_reachable(left_to_ray)
    # "no-port" was Ray's "Invalid address format", said after partition.json was written
    for malformed in (":6379", "127.0.0.1:notaport", "ray://:10001", "no-port"):
        with pytest.raises(UserError, match=f"the Ray address '{malformed}' is not HOST:PORT"):
            _check_reachable(malformed)
    if not ray.is_initialized():  # a Ray running here is used whatever the address
        job = TrainJob(Benchmark("digits"), 2, 2, TrainConfig(model="mlp", epochs=1))
        with pytest.raises(UserError, match=r"could not reach Ray at 127\.0\.0\.1:1: "):
            train_teachers(tmp_path / "run", job, Cluster(1, "127.0.0.1:1"))
        assert not list((tmp_path / "run" / "teachers").glob("shard-*"))


def test_each_shard_asks_for_no_more_cpus_than_a_node_has(ray_running) -> None:
    total = int(ray.cluster_resources()["CPU"])  # one node here: all of them on it
    assert _cpus_per_shard(Cluster(workers=1)) == total
    assert _cpus_per_shard(Cluster(workers=4 * total)) == 1


def test_an_address_that_answers_but_is_no_ray_cluster_is_refused_at_once() -> None:
    """A server that is not a cluster's gRPC port (a web server, Ray's dashboard): Ray would
    retry it for a quarter of an hour; it is refused at once."""
    server = http.server.HTTPServer(("127.0.0.1", 0), http.server.BaseHTTPRequestHandler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = f"127.0.0.1:{server.server_address[1]}"
        started = time.perf_counter()
        with pytest.raises(UserError, match=rf"{address} answers, but not as a Ray cluster "):
            _check_reachable(address)
        assert time.perf_counter() - started < 5
    finally:
        server.shutdown()


def test_shards_failed_on_ray_are_said_in_one_line() -> None:
    """A worker's UserError is given whole, once for the shards it stopped; any other error
    by its class alone (its message may hold private values); and whether any shard was saved."""
    failed = [(i, ray.exceptions.RayTaskError("train_shard", "tb", UserError(
        "model 'mymod2:f': cannot import mymod2"))) for i in (2, 0)]
    failed.append((1, ray.exceptions.RayTaskError("train_shard", "tb",
                                                  AssertionError("row 17 of patient x"))))
    said = _shards_failed(failed, 0)
    assert said == ("3 shard(s) failed (shard 0, 2: model 'mymod2:f': cannot import mymod2; "
                    "shard 1: RayTaskError); none was trained - rerun the same command to "
                    "train only the missing ones")
    assert "patient" not in said
    assert _shards_failed(failed[:1], 3).endswith(
        "; the 3 other(s) trained are saved - rerun the same command to train only the missing "
        "ones")


def test_sigterm_while_ray_starts_reaches_the_callers_handler(tmp_path: Path) -> None:
    """ray.init puts in a SIGTERM handler of its own (it exits with status 15, nothing said)
    for as long as it starts; a SIGTERM then goes on to the caller's handler (the CLI's, which
    says `pate: terminated` and cleans up), as at any other time."""
    script = tmp_path / "term.py"
    script.write_text(
        "import os, signal, sys, threading, time\n"
        "from teachers.distributed import Cluster, _ray_session\n"
        "def mine(signum, frame):\n"
        "    raise KeyboardInterrupt\n"
        "signal.signal(signal.SIGTERM, mine)\n"
        "def watch():  # once ray.init has put in its own handler, while it starts\n"
        "    while signal.getsignal(signal.SIGTERM) is mine:\n"
        "        time.sleep(0.001)\n"
        "    os.kill(os.getpid(), signal.SIGTERM)\n"
        "threading.Thread(target=watch, daemon=True).start()\n"
        "try:\n"
        "    with _ray_session(Cluster(1), None):\n"
        "        print('started')\n"
        "except KeyboardInterrupt:\n"
        "    print('the caller handled it')\n")
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120, cwd=Path(__file__).parents[2])
    assert (proc.returncode, proc.stdout) == (0, "the caller handled it\n"), proc.stderr[-2000:]
