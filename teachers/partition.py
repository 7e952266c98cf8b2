"""Seeded, disjoint partitions of the private training rows among the teachers.

PATE's guarantee rests on each training example reaching exactly one teacher (Papernot et al.,
ICLR 2017, section 2.1), so :func:`check_disjoint` runs before any training and refuses overlaps.
A partition is a seeded permutation of the rows dealt round-robin, so sizes differ by at most
one; ``partition.json`` records the seed, the sizes and the sha256 of the assignment, and a rerun
verifies it recomputes the same assignment before reusing a run directory.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pate.errors import UserError
from pate.io import write_json_atomic
from pate.rundir import RunDir
from teachers import rng


@dataclass(frozen=True)
class Partition:
    """``assignment[i]`` is the teacher that owns training row i."""

    seed: int
    num_teachers: int
    assignment: np.ndarray

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.assignment, minlength=self.num_teachers)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.assignment.astype("<i4").tobytes()).hexdigest()

    def parts(self, teachers: range | None = None) -> list[np.ndarray]:
        """Row numbers of each teacher in ``teachers`` (default: all), in increasing order."""
        teachers = teachers if teachers is not None else range(self.num_teachers)
        order = np.argsort(self.assignment, kind="stable")
        bounds = np.concatenate([[0], np.cumsum(self.sizes)])
        return [order[bounds[t]:bounds[t + 1]] for t in teachers]


def make_partition(num_rows: int, num_teachers: int, seed: int) -> Partition:
    """Deal a seeded permutation of ``num_rows`` rows round-robin to ``num_teachers`` teachers."""
    if not 1 <= num_teachers <= num_rows:
        raise UserError(f"the number of teachers must be between 1 and {num_rows} (the training "
                        "rows)")
    keys = rng.uniform(seed, np.zeros(1, dtype=np.int64), rng.PARTITION,
                       np.arange(num_rows)[None])
    assignment = np.empty(num_rows, dtype=np.int32)
    assignment[np.argsort(keys[0], kind="stable")] = np.arange(num_rows) % num_teachers
    return Partition(seed, num_teachers, assignment)


def check_disjoint(parts: list[np.ndarray], num_rows: int) -> None:
    """Refuse (UserError) parts that share a row or name a row outside ``0..num_rows-1``."""
    rows = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else []
    if len(rows) and (rows.min() < 0 or rows.max() >= num_rows):
        raise UserError("teacher partition names rows outside the training split; refusing")
    if len(np.unique(rows)) != len(rows):
        raise UserError("teacher partitions overlap (a training row is assigned to two teachers);"
                        " refusing to train")


def write_partition(run_dir: Path, part: Partition, dataset: str) -> None:
    """Record the partition in ``run_dir/partition.json``."""
    write_json_atomic(RunDir(run_dir).partition, {
        "dataset": dataset, "seed": part.seed, "num_teachers": part.num_teachers,
        "num_rows": len(part.assignment), "sizes": part.sizes.tolist(), "sha256": part.sha256})


def read_partition(run_dir: Path) -> dict | None:
    """The recorded ``partition.json`` of ``run_dir``, or None if there is none yet."""
    run = RunDir(run_dir)
    return run.read_json(run.partition)


def verify_partition(recorded: dict, part: Partition, dataset: str) -> None:
    """Refuse to reuse a run directory whose recorded partition differs from ``part``."""
    if (recorded.get("dataset"), recorded.get("sha256")) != (dataset, part.sha256):
        raise UserError("partition.json of this run records a different partition (dataset, "
                        "seed or number of teachers); use a new --run directory")
