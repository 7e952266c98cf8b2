"""A run's ``teachers/`` directory: one safetensors file of stacked parameters per shard, the
frozen pool encoder of the architectures that use one, and ``manifest.json`` saying which shards
are done and, after ``pate teachers votes``, how accurate the teachers are. Teacher weights are
private (docs/design.md): files 0600 in a 0700 directory, written to a temporary file and renamed
(:mod:`pate.io`), so a killed run leaves either a whole checkpoint or none. safetensors: https://huggingface.co/docs/safetensors.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from safetensors.numpy import load, save

from pate.errors import UserError
from pate.io import ensure_dir, write_bytes_atomic, write_json_atomic
from pate.rundir import RunDir

if TYPE_CHECKING:  # torch is imported where tensors are loaded: `pate report` needs none
    import torch

ENCODER_FILE = "pool-encoder.safetensors"


def teachers_dir(run_dir: Path) -> Path:
    """The run's ``teachers/`` folder, created 0700."""
    return ensure_dir(RunDir(run_dir).teachers, private=True)


def shard_file(index: int) -> str:
    return f"shard-{index:05d}.safetensors"


def read_manifest(run_dir: Path) -> dict | None:
    """The manifest as its writers keep it, a JSON object to add to (its readers:
    :class:`teachers.manifest.TeachersManifest`)."""
    run = RunDir(run_dir)
    return run.read_json(run.manifest)


def write_manifest(run_dir: Path, manifest: dict) -> None:
    teachers_dir(run_dir)
    write_json_atomic(RunDir(run_dir).manifest, manifest, private=True)


def _save(run_dir: Path, name: str, tensors: dict[str, np.ndarray]) -> str:
    data = save({k: np.ascontiguousarray(v) for k, v in tensors.items()})
    write_bytes_atomic(teachers_dir(run_dir) / name, data, private=True)
    return hashlib.sha256(data).hexdigest()


def _ok(run_dir: Path, name: str, sha256: str) -> bool:
    path = RunDir(run_dir).teachers / name
    return path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() == sha256


def _load(run_dir: Path, name: str, sha256: str, device: str, what: str
          ) -> dict[str, torch.Tensor]:
    path = RunDir(run_dir).teachers / name
    data = path.read_bytes() if path.is_file() else b""
    if hashlib.sha256(data).hexdigest() != sha256:
        raise UserError(f"{what} {path} is missing or corrupt; rerun `pate teachers train` "
                        "with the same --run to retrain it")
    import torch

    return {k: torch.from_numpy(v).to(device) for k, v in load(data).items()}


def save_shard(run_dir: Path, index: int, params: dict[str, np.ndarray]) -> str:
    """Write shard ``index``'s stacked parameters; returns the file's sha256."""
    return _save(run_dir, shard_file(index), params)


def shard_ok(run_dir: Path, index: int, sha256: str) -> bool:
    """Whether shard ``index``'s checkpoint exists with the recorded digest."""
    return _ok(run_dir, shard_file(index), sha256)


def load_shard(run_dir: Path, index: int, sha256: str, device: str = "cpu"
               ) -> dict[str, torch.Tensor]:
    """Stacked parameters of shard ``index``, verified against the manifest's digest."""
    return _load(run_dir, shard_file(index), sha256, device, "teacher checkpoint")


def save_encoder(run_dir: Path, tensors: dict[str, np.ndarray]) -> str:
    """Write the run's frozen pool encoder (SimCLR's, :mod:`teachers.pool_encoder`, or a
    whitening, :mod:`teachers.whitening`); returns its sha256."""
    return _save(run_dir, ENCODER_FILE, tensors)


def encoder_record(run_dir: Path, tensors: dict[str, np.ndarray], method: str | None,
                   **details: Any) -> dict[str, Any]:
    """Write the pool encoder ``tensors`` (:func:`save_encoder`) and return the manifest's
    record of it: its file, digest, ``method`` (``simclr`` or ``whitening``) and ``details``
    (the pool's rows, SimCLR's epochs and device, the seconds it took)."""
    return {"file": ENCODER_FILE, "sha256": save_encoder(run_dir, tensors), "method": method,
            **details}


def encoder_ok(run_dir: Path, sha256: str) -> bool:
    """Whether the pool encoder's file exists with the recorded digest."""
    return _ok(run_dir, ENCODER_FILE, sha256)


def load_encoder(run_dir: Path, sha256: str, device: str = "cpu") -> dict[str, torch.Tensor]:
    """The run's pool encoder tensors, verified against the manifest's digest."""
    return _load(run_dir, ENCODER_FILE, sha256, device, "pool encoder")
