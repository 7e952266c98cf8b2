"""Shared fixtures: scikit-learn's 8x8 digits (small, shipped with scikit-learn) as the private
data of fast tests, and one local Ray for the tests that train teachers in this process. Under
pytest-xdist each worker takes its share of the cores' threads."""

from __future__ import annotations

import faulthandler
import os
from collections.abc import Iterator
from contextlib import ExitStack

import pytest
import torch
from threadpoolctl import threadpool_limits

from pate.data.datasets import Dataset, load_dataset
from teachers.distributed import Cluster, _ray_session


def _share_the_cores() -> None:
    """Under pytest-xdist, each worker's PyTorch, BLAS and OpenMP threads (and those of the
    processes its tests start) number the cores over the workers: with one thread per core in
    each of them the workers would fight for the cores (the suite took 390 s on 2 cores so, 224 s
    with one thread each)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    if workers < 2:
        return
    threads = max(1, (os.cpu_count() or 1) // workers)
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[name] = str(threads)
    torch.set_num_threads(threads)
    threadpool_limits(threads)


_share_the_cores()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    """Keep Python's fault handler on through the interpreter's exit (pytest's own turns it off
    here), so that a crash in an extension's teardown says where it happened."""
    faulthandler.enable()


@pytest.fixture(autouse=True)
def _own_budget_registry(tmp_path_factory: pytest.TempPathFactory,
                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test its own registry of the ledgers per body of private data
    (``pate.aggregation.budget_registry``; the processes it starts inherit it): the tests'
    runs on one dataset would otherwise warn of each other, and write to the user's home."""
    monkeypatch.setenv("PATE_STATE_DIR", str(tmp_path_factory.mktemp("state")))


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_dataset("digits")


@pytest.fixture(scope="session")
def _ray_sessions() -> Iterator[ExitStack]:
    with ExitStack() as sessions:  # each Ray started below is stopped at the end
        yield sessions


@pytest.fixture
def ray_running(_ray_sessions: ExitStack) -> None:
    """One local Ray for the whole test session, started by the first test that asks and
    stopped at the end: ``train_teachers`` runs its shards on a Ray this process has started.
    Each start costs seconds, and starting and stopping Ray again and again in one process is
    fragile (ray-project/ray#31145)."""
    import ray

    if not ray.is_initialized():  # started as train_teachers starts it
        _ray_sessions.enter_context(_ray_session(Cluster()))


@pytest.fixture
def ray_stopped() -> None:
    """No Ray in this process, so that ``train_teachers`` starts (and stops) its own."""
    import ray

    ray.shutdown()
