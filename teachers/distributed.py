"""Train a run's teachers as Ray tasks, one shard of teachers per task, resumably.

The teachers are cut into shards of ``shard_size``; each shard is one Ray task
(https://docs.ray.io/en/latest/ray-core/tasks.html) that trains its teachers with the vectorised
trainer and returns their stacked parameters. The driver checkpoints each shard as soon as it
arrives and records it in the manifest, so a rerun trains only the shards that are missing, and a
worker (or the driver) killed mid-run loses only the shards in flight. Ray retries a task whose
worker died (``max_retries``). Without ``ray_address`` a private local Ray instance is started;
``workers`` bounds how many shards run at once; on ``cuda`` a task asks for ``gpus_per_shard``
of a GPU, so fractions pack several shards on one device. One local worker needs no Ray: its
shards train one after the other in this process (``Cluster.in_process``), with the same
checkpoints, saving Ray's start (seconds, most of a small job's teachers stage).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from pate.data.partitions import partition_problem
from pate.data.task import Benchmark, DataSource, Task, load_task, source_identity
from pate.devices import device_problem
from pate.errors import UserError
from pate.progress import progress_bar, say
from pate.rundir import RunDir
from teachers import checkpoints
from teachers.choices import (
    MODEL_RECORDS,
    POOL_ENCODER_MODELS,
    SIMCLR,
    gpu_share_problem,
    model_data_problem,
    ray_address_problem,
)
from teachers.ensemble import TrainConfig, vectorised
from teachers.epoch_counter import EpochCounter
from teachers.manifest import TeachersManifest
from teachers.models import check_user_model, fit_pool_encoder
from teachers.partition import (
    Partition,
    check_disjoint,
    deal_rows,
    own_rows,
    read_partition,
    verify_partition,
    write_partition,
)
from teachers.pool_encoder import EPOCHS
from teachers.user_models import (
    check_same_network,
    named_by_class,
    network_signature,
    ray_runtime_env,
)

RAY_CONNECT_TIMEOUT_S = 10.0  # a cluster's address that does not answer in this long is refused


# The most teachers a run may ask for: ten million, far beyond any ensemble PATE has used (its
# papers' largest is 5 000), and each needs at least one private row of its own.
MAX_TEACHERS = 10_000_000


@dataclass(frozen=True)
class TrainJob:
    """What ``pate teachers train`` trains; all of it but where the data lies is fixed per run.
    ``dataset`` is a data source (``pate.data.task``: a built-in dataset, or a user's files),
    or a built-in dataset's name, with its default folders and pool size."""

    dataset: str | DataSource
    num_teachers: int
    shard_size: int
    train: TrainConfig
    partition: str = "position"  # how the rows are dealt (teachers.partition.PARTITIONS)

    @property
    def source(self) -> DataSource:
        """Where the data comes from."""
        return Benchmark(self.dataset) if isinstance(self.dataset, str) else self.dataset

    def settings(self) -> dict:
        """The settings a rerun must repeat to resume (everything but where the data lives)."""
        source = self.source
        benchmark = isinstance(source, Benchmark)
        return {"dataset": source.name if benchmark else Path(source.public).stem,
                "data": source_identity(source), "num_teachers": self.num_teachers,
                "shard_size": self.shard_size, "train": asdict(self.train),
                "pool_size": source.pool_size if benchmark else None,
                # by position, recorded as older versions' runs were (without the key)
                **({} if self.partition == "position" else {"partition": self.partition})}


def shard_ranges(num_teachers: int, shard_size: int) -> list[range]:
    """Consecutive teacher ids, ``shard_size`` per shard (the last may be smaller)."""
    return [range(s, min(s + shard_size, num_teachers))
            for s in range(0, num_teachers, shard_size)]


def train_shard(cfg: TrainConfig, x: np.ndarray, y: np.ndarray, num_classes: int,
                teachers: range, parts: list[np.ndarray], step_rows: np.ndarray, device: str,
                threads: int, encoder: dict[str, np.ndarray] | None = None,
                progress: tuple[Any, int] | None = None) -> dict[str, np.ndarray]:
    """Body of one Ray task: train the teachers of one shard, return stacked parameters.
    ``progress``: an ``EpochCounter`` actor and this shard's number, told of each epoch."""
    import torch

    from teachers.ensemble import train_group

    on_epochs = None
    if progress is not None:
        counter, shard = progress
        counter.start.remote(shard)
        on_epochs = lambda n: counter.add.remote(shard, n)  # noqa: E731
    torch.set_num_threads(threads)
    xt, yt, enc = _on_device(x, y, encoder, device)
    params = train_group(cfg, xt, yt, num_classes, np.arange(teachers.start, teachers.stop),
                         parts, step_rows, enc, on_epochs, device_share(device))
    return {k: v.numpy() for k, v in params.items()}


def device_share(device: str) -> float:
    """The part of its device's memory the Ray task calling this may count on, where the tasks
    beside it look at the same free memory at about the same time: its fraction of a GPU on
    cuda (at most 1), else its CPUs over its node's (``_run`` gives each of the
    ``Cluster.workers`` shards in flight an equal part of the cluster's CPUs, at most a
    node's: :func:`_cpus_per_shard`); 1 outside a Ray task
    (the Python API's ``Teachers.fit`` trains its shards in its own process)."""
    import ray

    if not ray.is_initialized():
        return 1.0
    context = ray.get_runtime_context()
    if context.get_task_id() is None:  # the driver
        return 1.0
    held = context.get_assigned_resources()
    if device == "cuda":
        return min(1.0, held.get("GPU", 1.0))
    node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
    return min(1.0, held.get("CPU", 1.0) / node["Resources"].get("CPU", 1.0))


def _on_device(x: np.ndarray, y: np.ndarray, encoder: dict[str, np.ndarray] | None,
               device: str) -> tuple[Any, Any, dict[str, Any] | None]:
    """The private rows, their labels and the pool encoder as tensors on ``device``: copies,
    since the object store's arrays are read-only and the caller's are not ours to share."""
    import torch

    enc = None if encoder is None else {k: torch.tensor(v, device=device)
                                        for k, v in encoder.items()}
    return torch.tensor(x, device=device), torch.tensor(y, device=device), enc


@dataclass(frozen=True)
class Cluster:
    """Where shards run: a local Ray instance (``address`` None) or a cluster to join. Where
    this process has already started Ray (``ray.init``), shards run on that one and ``address``
    is not used."""

    workers: int = 1
    address: str | None = None
    device: str = "cpu"
    gpus_per_shard: float = 1.0
    max_retries: int = 3

    @property
    def in_process(self) -> bool:
        """One local worker: its shards train here, one after the other, without Ray. A Ray
        this process has started (a notebook's, a test session's) is used all the same."""
        import ray

        return self.workers == 1 and self.address is None and not ray.is_initialized()


@contextmanager
def _ray_session(cluster: Cluster, runtime_env: dict | None = None) -> Iterator[None]:
    """Start or join Ray for the ``with`` block and shut it down after; where this process has
    already started Ray itself (``ray.init`` in a notebook, a test session), that Ray is used
    as it is, and left running. ``runtime_env`` (the job's: Ray ships local ``py_modules`` only
    at this level) carries a user's model package to the workers. ``ray.init`` and
    ``ray.shutdown`` replace the caller's SIGTERM handler (the CLI's, say) with one that exits
    at once, without the caller's clean-up: it is put back after each."""
    import ray

    if ray.is_initialized():
        if runtime_env:
            raise UserError("Ray is already running in this process and cannot ship the "
                            f"model's package {runtime_env['py_modules']} to its workers: call "
                            "ray.shutdown() first, or start Ray with the runtime_env that "
                            "teachers.user_models.ray_runtime_env(MODEL) returns")
        yield
        return
    on_sigterm = signal.getsignal(signal.SIGTERM)
    try:
        if cluster.address:
            ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False,
                     runtime_env=runtime_env)
        else:
            ray.init(address="local",  # private: not a Ray running here, nor RAY_ADDRESS's
                     num_cpus=max(cluster.workers, os.cpu_count() or 1),
                     num_gpus=None if cluster.device == "cuda" else 0,
                     include_dashboard=False, logging_level="ERROR", log_to_driver=False,
                     runtime_env=runtime_env)
    except Exception as exc:  # a bad address or a failed local start
        raise UserError(f"could not start or join Ray ({cluster.address or 'local'}): "
                        f"{exc}") from exc
    except SystemExit as exc:  # SIGTERM while Ray started: its own handler exits
        if exc.code != signal.SIGTERM:
            raise
        with contextlib.suppress(Exception):
            ray.shutdown()
        _restore_sigterm(on_sigterm)
        signal.raise_signal(signal.SIGTERM)  # to the caller's handler, as if Ray were not there
        raise  # a caller without one: Ray's handler exits, as before
    finally:
        _restore_sigterm(on_sigterm)
    try:
        yield
    finally:
        ray.shutdown()
        _restore_sigterm(on_sigterm)


def _check_reachable(address: str) -> None:
    """A Ray cluster's ``host:port`` (or ``ray://host:port``) accepts a connection within
    ``RAY_CONNECT_TIMEOUT_S`` and answers as a gRPC server (:func:`_answers_http2`; not
    asked of a cluster whose gRPC is TLS's, ``RAY_USE_TLS``);
    ``UserError`` otherwise, at once (Ray itself retries for minutes, saying little), and for
    one without a host or with a port that is no number (Ray's traceback), or a name without
    a port (Ray's "Invalid address format", after the partition was written). ``auto``,
    ``local``, ``ray://`` without a port and an IPv6 address not in brackets are left to Ray."""
    host, colon, port = address.split("://", 1)[-1].rpartition(":")
    if ":" in host and not host.startswith("["):
        return
    if (colon and not (host and port.isascii() and port.isdecimal())) or (
            not colon and "://" not in address and address not in ("auto", "local")):
        raise UserError(f"the Ray address {address!r} is not HOST:PORT, ray://HOST:PORT or auto")
    if not colon:
        return
    tls = os.environ.get("RAY_USE_TLS", "0").lower() in ("1", "true")  # no plain preface
    try:
        with socket.create_connection((host.strip("[]"), int(port)),
                                      timeout=RAY_CONNECT_TIMEOUT_S) as connection:
            speaks_grpc = tls or _answers_http2(connection)
    except OSError as exc:
        raise UserError(f"could not reach Ray at {address}: "
                        f"{exc.strerror or exc.__class__.__name__}") from None
    if not speaks_grpc:  # Ray would retry it for up to a quarter of an hour
        raise UserError(f"{address} answers, but not as a Ray cluster does (its GCS port, "
                        "6379 unless `ray start --head --port` said another, or ray://HOST:10001 "
                        "for Ray Client): not the dashboard's 8265, nor another server")


# HTTP/2's connection preface and an empty SETTINGS frame (RFC 9113, §3.4 and §6.5): a gRPC
# server answers with a SETTINGS frame of its own, whose type (the header's fourth byte) is 4
_HTTP2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes([0, 0, 0, 4, 0, 0, 0, 0, 0])


def _answers_http2(connection: socket.socket) -> bool:
    """Whether the server at the other end of ``connection`` speaks HTTP/2, as the gRPC
    servers of a Ray cluster (its GCS, Ray Client's) do: it answers the client's preface with
    a SETTINGS frame. One that answers otherwise, or closes, or says nothing within the
    socket's timeout, is no Ray cluster's address."""
    try:
        connection.sendall(_HTTP2_PREFACE)
        header = b""
        while len(header) < 9:
            chunk = connection.recv(9 - len(header))
            if not chunk:
                return False
            header += chunk
    except OSError:  # reset, or the timeout
        return False
    return header[3] == 4


def _restore_sigterm(handler: Any) -> None:
    """Put the caller's own SIGTERM handler back. A caller with none (the default action)
    keeps Ray's, which shuts Ray down on the way out."""
    if callable(handler) and threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)


def _changed_settings(recorded: dict, settings: dict) -> list[str]:
    """The names of the ``settings`` (``TrainJob.settings``) that differ from those ``recorded``
    in the manifest, a section's by key (``train.epochs``, ``data.private``); names only, never
    values (the data files' are private paths)."""
    changed = []
    for key, value in settings.items():
        old = recorded.get(key)
        if isinstance(value, dict) and isinstance(old, dict):
            changed += [f"{key}.{k}" for k in sorted(value.keys() | old.keys())
                        if value.get(k) != old.get(k)]
        elif old != value:
            changed.append(key)
    return changed


def _shards_to_train(run_dir: Path, manifest: dict | None, wanted: Iterable[int]) -> list[int]:
    """The shards of ``wanted`` that the manifest does not record as trained, or whose
    checkpoint is missing or damaged."""
    done = (manifest or {}).get("shards") or {}
    return [i for i in wanted if not (
        str(i) in done and checkpoints.shard_ok(run_dir, i, done[str(i)]["sha256"]))]


def _prepare(run_dir: Path, job: TrainJob, to_train: bool) -> tuple[dict, Task, Partition]:
    """Load the data, probe a user's network (two teachers vectorised) where shards are left
    ``to_train``, record or verify the partition, and read or create the manifest."""
    if problem := partition_problem(job.partition, getattr(job.source, "key", None)):
        raise UserError(problem)
    data = load_task(job.source)
    assert data.private_x is not None and data.private_y is not None
    problem = model_data_problem(job.train.model, data.kind, data.input_shape)
    if problem:  # before the partition is recorded
        raise UserError(problem)
    network = check_user_model(job.train.model, data.input_shape,  # so is this; a user's
                               data.num_classes, job.train.batch_size)  # as its code builds it
    if network is not None and to_train:
        # two teachers of a user's network vectorised, before anything is recorded: its
        # warning line where they train one at a time, or one error line (out of memory)
        vectorised(job.train, data.input_shape, data.num_classes)
    n = len(data.private_y)
    part = deal_rows(job.partition, data.private_x, data.private_y, job.num_teachers,
                     job.train.seed, data.private_keys)
    recorded = read_partition(run_dir)
    settings = job.settings()
    if recorded is None:
        write_partition(run_dir, part, settings["dataset"])
    else:
        verify_partition(recorded, part, settings["dataset"])
    check_disjoint(part.parts(), n)
    manifest = checkpoints.read_manifest(run_dir)
    if manifest is None or not (manifest.get("shards") or manifest.get("pool_encoder")):
        # nothing trained yet (a first run, or one stopped before its first shard): these settings
        manifest = {**settings, "model": job.train.model,
                    "in_shape": list(data.input_shape), "num_classes": data.num_classes,
                    "classes": list(data.classes),
                    "shards": {}, "done": False}
    elif changed := _changed_settings(manifest, settings):
        raise UserError(f"this run's teachers were trained with other settings (other "
                        f"{', '.join(changed)}); repeat them or use a new --run directory")
    elif TeachersManifest(manifest).pool_changed(data):
        raise UserError("the public pool is not the one this run's teachers were trained beside "
                        "(its content, rows or label set changed since): restore it, or use a "
                        "new --run directory")
    elif TeachersManifest(manifest).private_changed(data):
        raise UserError("the private data is not what this run's teachers were partitioned "
                        "over (its rows, their order or their labels changed since): dealt "
                        "again, one record could reach two teachers; restore it, or use a new "
                        "--run directory")
    # recorded here for a new run, and for an older version's run that lacks them
    if network is not None:  # trained shards and new ones must be of one network
        check_same_network(job.train.model, manifest.get("model_signature"), network,
                           "this run's teachers")
        manifest.setdefault("model_signature", network_signature(network))
    manifest.setdefault("pool_fingerprint", data.pool_fingerprint)
    manifest.setdefault("private_fingerprint", data.private_fingerprint)
    manifest.setdefault("private_data_fingerprint", data.private_data_fingerprint)
    manifest.setdefault("private_rows_fingerprint", data.private_rows_fingerprint)
    manifest.setdefault("private_encoded_rows_fingerprint",
                        data.private_encoded_rows_fingerprint)
    return manifest, data, part


def _pool_encoder(run_dir: Path, job: TrainJob, manifest: dict, data: Task, device: str
                  ) -> dict[str, np.ndarray] | None:
    """The run's frozen pool encoder for the architectures that read one
    (:func:`teachers.models.fit_pool_encoder`: SimCLR, or the whitening of fixed maps): fitted
    on the public pool alone (never on the private split) and recorded in the manifest the
    first time, read back (digest checked) after. A damaged encoder is fitted again only while
    no shard depends on it; after that the run fails closed. It is fitted here, in the driver:
    on the shards' ``device`` where this machine has it (a GPU does in seconds what 2 CPU cores
    do of SimCLR in 11 minutes), else on the CPU (a cluster's head without a GPU)."""
    if job.train.model not in POOL_ENCODER_MODELS:
        return None
    recorded = manifest.get("pool_encoder")
    if recorded and checkpoints.encoder_ok(run_dir, recorded["sha256"]):
        return {k: v.numpy() for k, v in
                checkpoints.load_encoder(run_dir, recorded["sha256"]).items()}
    if recorded and manifest["shards"]:
        raise UserError(f"the pool encoder of {run_dir} is missing or corrupt and trained "
                        "teachers depend on it; use a new --run directory")
    pool_x = data.pool_x
    device = "cpu" if device_problem(device) else device
    method = MODEL_RECORDS[job.train.model].pool_encoder
    what = (f"{EPOCHS} SimCLR epochs on {device}" if method == SIMCLR
            else "the whitening of its fixed maps")
    say(f"pool encoder: {what}, on the {len(pool_x)} public pool rows")
    t0 = time.time()
    encoder = fit_pool_encoder(job.train.model, pool_x, job.train.seed, device, EPOCHS)
    say(f"pool encoder: fitted in {time.time() - t0:.1f} s")
    manifest["pool_encoder"] = checkpoints.encoder_record(
        run_dir, encoder, method, pool_rows=len(pool_x),
        **({"epochs": EPOCHS, "device": device} if method == SIMCLR else {}),
        seconds=round(time.time() - t0, 2))
    checkpoints.write_manifest(run_dir, manifest)
    return encoder


def train_teachers(run_dir: str | Path, job: TrainJob, cluster: Cluster = Cluster(),
                   only: list[int] | None = None) -> dict:
    """Train every missing shard of ``run_dir`` (or of the shards ``only``); returns
    ``{"trained": [...], "skipped": [...]}`` (shard indices). Raises UserError if a shard still
    failed after its retries. The manifest says ``done`` once every shard is trained."""
    import ray

    if cluster.workers < 1 or job.shard_size < 1:
        raise UserError("--workers and --shard-size must be at least 1")
    if job.num_teachers > MAX_TEACHERS:  # before its shards are listed (a hang, before)
        raise UserError(f"--teachers must be at most {MAX_TEACHERS:,}, got {job.num_teachers}")
    if problem := gpu_share_problem(cluster.gpus_per_shard):
        raise UserError(f"--gpus-per-shard {problem}")
    if problem := ray_address_problem(cluster.address):
        raise UserError(f"--ray-address {problem}")
    if cluster.device == "cuda":  # said before the run directory is written: the GPUs of
        if ray.is_initialized():  # the Ray running here, or of this machine for a local one
            _check_gpus(cluster)
        elif cluster.address is None and (problem := device_problem(cluster.device)):
            raise UserError(problem)
    if cluster.address and not ray.is_initialized():  # before the partition is recorded
        _check_reachable(cluster.address)
    run_dir = RunDir(run_dir).create().root
    shards = shard_ranges(job.num_teachers, job.shard_size)
    wanted = range(len(shards)) if only is None else sorted(set(only) & set(range(len(shards))))
    # the checkpoints are read once, before the probes; a manifest _prepare starts afresh
    # records none, so all wanted are then to train
    todo = _shards_to_train(run_dir, checkpoints.read_manifest(run_dir), wanted)
    manifest, data, part = _prepare(run_dir, job, bool(todo))
    if not todo:
        _pool_encoder(run_dir, job, manifest, data, cluster.device)  # the recorded one, checked
    else:
        shards_todo = [(i, shards[i]) for i in todo]
        manifest["done"] = False  # until every shard is back (a resume of a damaged run)
        in_process = cluster.in_process  # as asked: more than one worker is Ray's, retries too
        # but no more at once than there are shards to train (a local Ray gets a CPU each)
        cluster = replace(cluster, workers=min(cluster.workers, len(todo)))
        with (contextlib.nullcontext() if in_process
              else _ray_session(cluster, ray_runtime_env(job.train.model))):
            if not in_process:  # before a pool encoder's minutes
                _check_gpus(cluster)
            cpus = 0 if in_process else _cpus_per_shard(cluster)
            checkpoints.write_manifest(run_dir, manifest)  # started: pate status says so
            encoder = _pool_encoder(run_dir, job, manifest, data, cluster.device)
            if in_process:
                _run_here(run_dir, job, manifest, shards_todo, data, part, cluster.device,
                          encoder)
            else:
                _run(run_dir, job, manifest, shards_todo, data, part, cluster, cpus, encoder)
    manifest["done"] = len(manifest["shards"]) == len(shards)
    checkpoints.write_manifest(run_dir, manifest)
    return {"trained": todo, "skipped": [i for i in wanted if i not in todo]}


_PROGRESS_EVERY_S = 2.0  # how often the driver reads the shards' epochs while it waits


def _largest_node(resource: str) -> float:
    """The most of ``resource`` (``CPU``, ``GPU``) one live node of the Ray cluster has: a
    task asks one node for all it needs, so a cluster's total may be more than any task gets."""
    import ray

    return max((node["Resources"].get(resource, 0.0) for node in ray.nodes() if node["Alive"]),
               default=0.0)


def _check_gpus(cluster: Cluster) -> None:
    """Refuse shards on cuda where no node of the Ray cluster has the GPUs one shard asks
    for: they would wait forever."""
    if cluster.device != "cuda":
        return
    gpus = _largest_node("GPU")
    if gpus < cluster.gpus_per_shard:
        raise UserError(f"no node of the Ray cluster has the {cluster.gpus_per_shard:g} GPU(s) "
                        f"a shard on cuda asks for (at most {gpus:g} on one node): it would "
                        "wait for them forever")


def _cpus_per_shard(cluster: Cluster) -> int:
    """The CPUs each shard asks for: the cluster's share of ``cluster.workers``, but no more
    than its largest node has (a task runs on one node; asked for more, it waits forever);
    at least 1, which a cluster with no CPU node yet gets from its autoscaler."""
    import ray

    share = int(ray.cluster_resources().get("CPU", 1)) // cluster.workers
    return max(1, min(share, int(_largest_node("CPU"))))


def _run(run_dir: Path, job: TrainJob, manifest: dict, todo: list[tuple[int, range]],
         data: Task, part: Partition, cluster: Cluster, cpus: int,
         encoder: dict[str, np.ndarray] | None) -> None:
    """Submit the shards ``todo`` with at most ``cluster.workers`` in flight, each asking for
    ``cpus`` (:func:`_cpus_per_shard`); checkpoint each result as it arrives."""
    import ray

    task = ray.remote(train_shard).options(
        num_cpus=cpus, num_gpus=cluster.gpus_per_shard if cluster.device == "cuda" else 0,
        max_retries=cluster.max_retries)
    enc_ref = ray.put(encoder)
    counter = ray.remote(num_cpus=0)(EpochCounter).remote()
    queue, pending, failed, shown = list(todo), {}, [], 0
    total = sum(len(t) for _, t in todo) * job.train.epochs
    with progress_bar("training teachers", total, "teacher-epoch", every=10.0) as bar:
        while queue or pending:
            while queue and len(pending) < cluster.workers:
                i, teachers = queue.pop(0)
                # the shard's own rows only: no node holds more of the private data than the
                # teachers it trains read
                rows, renumbered = own_rows(part.parts(teachers))
                ref = task.remote(job.train, data.private_x[rows], data.private_y[rows],
                                  data.num_classes, teachers, renumbered,
                                  part.step_rows(teachers), cluster.device, cpus, enc_ref,
                                  (counter, i))
                pending[ref] = (i, teachers, time.time())
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=_PROGRESS_EVERY_S)
            done = min(ray.get(counter.total.remote()), total)
            bar.update(done - shown)
            shown = done
            if not ready:
                continue
            i, teachers, t0 = pending.pop(ready[0])
            try:
                params = ray.get(ready[0])
            except ray.exceptions.RayError as exc:
                failed.append((i, exc))
                continue
            _record_shard(run_dir, manifest, i, teachers, params, t0)
        if not failed:  # the last epochs' reports may reach the counter after their shards
            bar.update(total - shown)
    if failed:
        raise UserError(_shards_failed(failed, len(todo) - len(failed)))


def _shards_failed(failed: list[tuple[int, Exception]], saved: int) -> str:
    """One line for the shards that failed on Ray: each reason once, with its shards. A
    worker's ``UserError`` (the project's words: a user's module that does not import there,
    say) is given whole; any other error by its class alone (``RayTaskError(RuntimeError)``,
    ``WorkerCrashedError``), as its message may hold private values (docs/design.md, privacy
    rule 2)."""
    reasons: dict[str, list[int]] = {}
    for shard, exc in failed:
        cause = getattr(exc, "cause", None)  # a RayTaskError's: the worker's own exception
        said = str(cause) if isinstance(cause, UserError) else type(exc).__name__
        reasons.setdefault(said, []).append(shard)
    listed = "; ".join(f"shard {', '.join(map(str, sorted(shards)))}: {said}"
                       for said, shards in reasons.items())
    kept = (f"the {saved} other(s) trained are saved" if saved else "none was trained")
    return (f"{len(failed)} shard(s) failed ({listed}); {kept} - rerun the same command to "
            "train only the missing ones")


def _run_here(run_dir: Path, job: TrainJob, manifest: dict, todo: list[tuple[int, range]],
              data: Task, part: Partition, device: str,
              encoder: dict[str, np.ndarray] | None) -> None:
    """Train the shards ``todo`` one after the other in this process (``Cluster.in_process``),
    on torch's threads as they are; checkpoint each as it is done. A shard that fails (a
    user's network, the device's memory) stops the run with one ``UserError`` naming only its
    error's class, the shards before it saved, as a shard that failed on Ray would; an
    interruption (Ctrl-C) goes through as it is."""
    from teachers.ensemble import train_group

    x, y, enc = _on_device(data.private_x, data.private_y, encoder, device)
    total = sum(len(t) for _, t in todo) * job.train.epochs
    with progress_bar("training teachers", total, "teacher-epoch", every=10.0) as bar:
        for i, teachers in todo:
            t0 = time.time()
            with named_by_class(f"shard {i}", "; the shards before it are saved - rerun the "
                                "same command to train only the missing ones"):
                params = train_group(job.train, x, y, data.num_classes,
                                     np.arange(teachers.start, teachers.stop),
                                     part.parts(teachers), part.step_rows(teachers), enc,
                                     bar.update)
            _record_shard(run_dir, manifest, i, teachers,
                          {k: v.numpy() for k, v in params.items()}, t0)


def _record_shard(run_dir: Path, manifest: dict, shard: int, teachers: range,
                  params: dict[str, np.ndarray], started: float) -> None:
    """Checkpoint one trained shard and record it in the manifest, so a rerun skips it."""
    manifest["shards"][str(shard)] = {
        "teachers": [teachers.start, teachers.stop], "file": checkpoints.shard_file(shard),
        "sha256": checkpoints.save_shard(run_dir, shard, params),
        "seconds": round(time.time() - started, 2)}
    checkpoints.write_manifest(run_dir, manifest)
