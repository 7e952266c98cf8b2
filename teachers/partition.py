"""Seeded, disjoint partitions of the private training rows among the teachers.

PATE's guarantee rests on each training example reaching exactly one teacher (Papernot et al.,
ICLR 2017, section 2.1), so :func:`check_disjoint` runs before any training and refuses overlaps.
Three ways to deal the rows (``PARTITIONS``), which differ in the neighbouring datasets the
privacy analysis covers (docs/privacy-math.md, "Neighbouring datasets"):

- ``position`` (the default): a seeded permutation of the rows dealt round-robin, so sizes
  differ by at most one. Changing one record changes one teacher's rows; adding or removing one
  moves other rows between teachers.
- ``record``: each row goes to the teacher its content (features and label) hashes to, the hash
  keyed by the seed (:func:`hashed_partition`: SplitMix64 folding, :mod:`teachers.rng`). Adding or
  removing one record changes that one teacher's rows and no other's, so the analysis holds for
  adding or removing a record, DP-SGD's relation. Sizes vary (about binomially), so each teacher's
  number of steps follows its own size (:meth:`Partition.step_rows`), not the run's smallest.
- ``key``: the same, hashing the row's key (a column that names whose the row is) instead of
  its content: every row of one person reaches one teacher, and the analysis holds for adding
  or removing all of one person's rows.

``partition.json`` records the way, the seed, the sizes and the sha256 of the assignment, and a
rerun verifies it recomputes the same assignment before reusing a run directory. Dealt by
record or key it is owner-only (0600): the sizes add up to the number of private records, and
the assignment follows their content, both statistics of the data under adding or removing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from pate.data.partitions import PARTITIONS, counts_private
from pate.errors import UserError
from pate.io import write_json_atomic
from pate.rundir import RunDir
from teachers import rng


@dataclass(frozen=True)
class Partition:
    """``assignment[i]`` is the teacher that owns training row i, dealt ``by`` one of
    ``PARTITIONS``."""

    seed: int
    num_teachers: int
    assignment: np.ndarray = field(repr=False)  # private where dealt by record or key
    by: str = "position"

    @property
    def sizes(self) -> np.ndarray:
        return np.bincount(self.assignment, minlength=self.num_teachers)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.assignment.astype("<i4").tobytes()).hexdigest()

    @cached_property
    def _by_teacher(self) -> tuple[np.ndarray, np.ndarray]:
        """The row numbers sorted by teacher (stably: each teacher's in increasing order) and
        where each teacher's begin and end among them; sorted once, as ``parts`` is asked once
        per shard."""
        return (np.argsort(self.assignment, kind="stable"),
                np.concatenate([[0], np.cumsum(self.sizes)]))

    def parts(self, teachers: range | None = None) -> list[np.ndarray]:
        """Row numbers of each teacher in ``teachers`` (default: all), in increasing order."""
        teachers = teachers if teachers is not None else range(self.num_teachers)
        order, bounds = self._by_teacher
        return [order[bounds[t]:bounds[t + 1]] for t in teachers]

    def step_rows(self, teachers: range | None = None) -> np.ndarray:
        """The rows that set each teacher's number of steps (``teachers.ensemble.total_steps``):
        the smallest partition's for all, dealt by position; each teacher's own, dealt by record
        or key, so that adding or removing a record (or a person) changes no other teacher's
        training."""
        teachers = teachers if teachers is not None else range(self.num_teachers)
        sizes = self.sizes
        if self.by == "position":
            return np.full(len(teachers), sizes.min())
        return sizes[np.asarray(teachers, dtype=np.int64)]


def make_partition(num_rows: int, num_teachers: int, seed: int) -> Partition:
    """Deal a seeded permutation of ``num_rows`` rows round-robin to ``num_teachers`` teachers."""
    _check_count(num_rows, num_teachers)
    keys = rng.uniform(seed, np.zeros(1, dtype=np.int64), rng.PARTITION,
                       np.arange(num_rows)[None])
    assignment = np.empty(num_rows, dtype=np.int32)
    assignment[np.argsort(keys[0], kind="stable")] = np.arange(num_rows) % num_teachers
    return Partition(seed, num_teachers, assignment)


def _check_count(num_rows: int, num_teachers: int) -> None:
    if not 1 <= num_teachers <= num_rows:
        raise UserError(f"{num_teachers} teachers: each needs at least one of the private rows, "
                        "and there must be one teacher at least")


def hashed_partition(words: NDArray[np.uint64], num_teachers: int, seed: int, by: str
                     ) -> Partition:
    """Deal row i to teacher ``h_seed(words[i]) mod num_teachers``, ``h_seed`` the partition's
    stream of :mod:`teachers.rng` folding in the row's 64-bit words one column at a time
    (SplitMix64's finaliser, keyed by the seed). Rows of equal words reach one teacher, and no
    row's teacher depends on the other rows. A teacher left without rows is refused (fewer
    teachers, or ``position``): the one case where the deal depends on more than each row."""
    _check_count(len(words), num_teachers)
    keyed = rng.bits(seed, np.zeros(1, dtype=np.int64), rng.PARTITION,
                     *(column[None] for column in np.asarray(words, dtype=np.uint64).T))[0]
    part = Partition(seed, num_teachers, (keyed % np.uint64(num_teachers)).astype(np.int32), by)
    if (part.sizes == 0).any():  # how many is a statistic of the private rows: not said
        raise UserError(f"dealt by {by}, some of the {num_teachers} teachers get no rows: "
                        "ask for fewer teachers, or deal the rows by position")
    return part


def as_words(rows: NDArray) -> NDArray[np.uint64]:
    """Each row's bytes as little-endian 64-bit words (zero-padded), its byte count last."""
    flat = np.ascontiguousarray(rows).reshape(len(rows), -1).view(np.uint8)
    width = flat.shape[1]
    flat = np.pad(flat, ((0, 0), (0, -width % 8)))
    count = np.full((len(rows), 1), width, dtype=np.uint64)
    return np.concatenate([np.ascontiguousarray(flat).view("<u8"), count], axis=1)


def deal_rows(by: str, x: NDArray, y: NDArray, num_teachers: int, seed: int,
              keys: NDArray | None = None) -> Partition:
    """The partition of the rows ``x`` (labels ``y``) that ``by`` (one of ``PARTITIONS``) asks
    for; ``keys`` (whose each row is, as text) for ``key``."""
    if by == "position":
        return make_partition(len(y), num_teachers, seed)
    if by == "record":  # the row's bytes and its label
        words = np.concatenate([as_words(x), np.asarray(y, dtype=np.int64)[:, None]
                                .view(np.uint64)], axis=1)
        return hashed_partition(words, num_teachers, seed, by)
    if by == "key":  # the key's UTF-8 bytes
        if keys is None or len(keys) != len(y):
            raise UserError("dealing the rows by key needs whose each row is: the private "
                            "data's key column (data.key, --key)")
        utf8 = np.char.encode(np.asarray(keys).astype(str), "utf-8")
        lengths = np.char.str_len(utf8).astype(np.uint64)[:, None]
        words = np.concatenate([as_words(utf8)[:, :-1], lengths], axis=1)
        return hashed_partition(words, num_teachers, seed, by)
    raise UserError(f"the partition must be one of {', '.join(PARTITIONS)}, not {by!r}")


def own_rows(parts: list[np.ndarray]) -> tuple[np.ndarray, list[np.ndarray]]:
    """The rows a group of teachers reads (``parts``, one array of row indices per teacher,
    in order) and each teacher's rows renumbered among them: the group is given those rows
    alone (a Ray task, a table of fixed maps), and every teacher reads the same ones."""
    used = np.concatenate(parts)
    ends = np.cumsum([len(p) for p in parts])
    return used, [np.arange(end - len(p), end) for p, end in zip(parts, ends, strict=True)]


def check_disjoint(parts: list[np.ndarray], num_rows: int) -> None:
    """Refuse (UserError) parts that share a row or name a row outside ``0..num_rows-1``."""
    rows = np.concatenate([np.asarray(p, dtype=np.int64) for p in parts]) if parts else []
    if len(rows) and (rows.min() < 0 or rows.max() >= num_rows):
        raise UserError("teacher partition names rows outside the training split; refusing")
    if len(np.unique(rows)) != len(rows):
        raise UserError("teacher partitions overlap (a training row is assigned to two teachers);"
                        " refusing to train")


def write_partition(run_dir: Path, part: Partition, dataset: str) -> None:
    """Record the partition in ``run_dir/partition.json`` (owner-only where dealt by record or
    key)."""
    write_json_atomic(RunDir(run_dir).partition, {
        "dataset": dataset, "by": part.by, "seed": part.seed, "num_teachers": part.num_teachers,
        "num_rows": len(part.assignment), "sizes": part.sizes.tolist(), "sha256": part.sha256},
        private=counts_private(part.by))


def read_partition(run_dir: Path) -> dict | None:
    """The recorded ``partition.json`` of ``run_dir``, or None if there is none yet."""
    run = RunDir(run_dir)
    return run.read_json(run.partition)


def verify_partition(recorded: dict, part: Partition, dataset: str) -> None:
    """Refuse to reuse a run directory whose recorded partition differs from ``part`` (an
    older version's record, without ``by``, dealt by position)."""
    if (by := recorded.get("by", "position")) != part.by:
        raise UserError(f"this run's teachers were dealt their rows by {by}, not by {part.by}; "
                        "repeat it or use a new --run directory")
    if (recorded.get("dataset"), recorded.get("sha256")) != (dataset, part.sha256):
        what = ("dataset, seed or number of teachers" if part.by == "position" else
                "dataset, seed, number of teachers, or the private data, which it is dealt by")
        raise UserError(f"partition.json of this run records a different partition ({what}); "
                        "use a new --run directory")
