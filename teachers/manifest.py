"""The teachers' manifest (``teachers/manifest.json``) as its readers see it: typed, with the
keys of older versions' runs read in one place.

Two writers keep the file as a JSON object and add to it as they go: ``pate teachers train``
(:mod:`teachers.distributed`: the settings, then a record per trained shard, ``done`` at the
end; ``pate teachers votes`` adds the teachers' accuracy) and ``Teachers.save`` of the Python
API (every shard at once). Everything else reads it through :class:`TeachersManifest`. The
manifest is private (teacher accuracies, fingerprints of the private data): 0600, as the
weights it lists.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pate.data.datasets import data_dir_problem
from pate.data.task import Benchmark, DataSource, Task, source_from_record
from pate.errors import UserError
from pate.rundir import RunDir


@dataclass(frozen=True)
class ShardRecord:
    """One trained shard: its index (its file's number), the sha256 of its checkpoint and the
    teachers it holds (None in a save of the Python API, whose shards are not ranges of a
    run's partition)."""

    index: int
    sha256: str
    teachers: range | None


@dataclass(frozen=True)
class TeachersManifest:
    """A run's teachers' manifest as read; ``record`` is the file's object, as it was written."""

    record: Mapping[str, Any] = field(repr=False)  # with the private data's fingerprints

    @classmethod
    def read(cls, run_dir: str | Path) -> TeachersManifest | None:
        """The manifest of ``run_dir``'s teachers; None where there is none (or it is not a JSON
        object)."""
        run = RunDir(run_dir)
        record = run.read_json(run.manifest)
        return cls(record) if isinstance(record, dict) else None

    @classmethod
    def trained(cls, run_dir: str | Path, partial: bool = False) -> TeachersManifest:
        """The manifest of ``run_dir``'s teachers, every shard trained (with ``partial``, at
        least one); UserError otherwise."""
        manifest = cls.read(run_dir)
        if manifest is None or not (manifest.done or (partial and manifest.shards)):
            raise UserError(f"{run_dir} has no fully trained teachers; run `pate run`, or "
                            f"`pate teachers train --run {run_dir}`, first")
        return manifest

    @property
    def done(self) -> bool:
        """Whether every shard is trained."""
        return bool(self.record.get("done"))

    @property
    def shards(self) -> list[ShardRecord]:
        """The trained shards, by index."""
        shards = [ShardRecord(int(i), s["sha256"],
                              range(*s["teachers"]) if "teachers" in s else None)
                  for i, s in (self.record.get("shards") or {}).items()]
        return sorted(shards, key=lambda s: s.index)

    @property
    def model(self) -> str:
        return str(self.record["model"])

    @property
    def in_shape(self) -> tuple[int, ...]:
        """One row's shape (images ``[C, H, W]``)."""
        return tuple(int(d) for d in self.record["in_shape"])

    @property
    def num_classes(self) -> int:
        return int(self.record["num_classes"])

    @property
    def num_teachers(self) -> int:
        return int(self.record["num_teachers"])

    @property
    def train_settings(self) -> dict[str, Any]:
        """``teachers.ensemble.TrainConfig``'s fields, as the teachers were trained."""
        return dict(self.record["train"])

    @property
    def partition(self) -> str:
        """How the private rows were dealt (``teachers.partition``); runs of versions before
        the choice dealt them by position."""
        return str(self.record.get("partition", "position"))

    @property
    def pool_encoder(self) -> Mapping[str, Any] | None:
        """The record of the frozen pool encoder (its ``sha256``, its ``method``), or None."""
        return self.record.get("pool_encoder")

    @property
    def pool_encoder_sha256(self) -> str | None:
        encoder = self.pool_encoder
        return None if encoder is None else str(encoder["sha256"])

    @property
    def private_records(self) -> int | None:
        """How many private records the teachers were trained on (a save of the Python API
        records it here; a run's is ``RunDir.private_records``)."""
        return self.record.get("private_records")

    @property
    def data_fingerprint(self) -> str | None:
        """The key of the private data's ledgers: the data as given
        (``Task.private_data_fingerprint``); a run of an older version recorded only its rows
        as read, which keyed its ledgers then."""
        return (self.record.get("private_data_fingerprint")
                or self.record.get("private_fingerprint"))

    @property
    def former_data_fingerprint(self) -> str | None:
        """The key under which older versions entered the same data's ledgers (its rows as
        read), where the manifest has a newer one too; None otherwise."""
        return (self.record.get("private_fingerprint")
                if self.record.get("private_data_fingerprint") else None)

    @property
    def rows_fingerprint(self) -> str | None:
        """The private rows' fingerprint in any order and format (the ledgers' second key,
        ``Task.private_rows_fingerprint``)."""
        return self.record.get("private_rows_fingerprint")

    @property
    def encoded_rows_fingerprint(self) -> str | None:
        """The private rows' fingerprint as encoded, where the second key is of them as read
        before (the ledgers' third key, ``Task.private_encoded_rows_fingerprint``)."""
        return self.record.get("private_encoded_rows_fingerprint")

    @property
    def accuracy(self) -> Mapping[str, Any]:
        """What ``pate teachers votes`` measured (``per_teacher``, ``plurality``, ...); empty
        before it ran."""
        return self.record.get("accuracy") or {}

    def data_source(self, data_dir: str | Path | None = None) -> DataSource:
        """Where the teachers' data came from (the manifest's record); a built-in dataset's
        files are looked for in ``data_dir`` when given (``UserError`` where the data read no
        folder: a user's files, ``digits``). ``KeyError``, ``TypeError`` or ``ValueError`` for
        a record of another version."""
        source = source_from_record(self.record["data"])
        if data_dir is None:
            return source
        if not isinstance(source, Benchmark):
            raise UserError("--data-dir is for a built-in dataset; the run's data are your files")
        problem = data_dir_problem(source.name, str(data_dir))
        if problem:
            raise UserError(problem)
        return replace(source, data_dir=str(data_dir))

    def readable_source(self) -> DataSource | None:
        """:meth:`data_source`, or None where the manifest holds no data record this version
        reads."""
        if not isinstance(self.record.get("data"), dict):
            return None
        try:
            return self.data_source()
        except (TypeError, ValueError):  # a record of unknown fields: not this version's
            return None

    def pool_changed(self, task: Task) -> bool:
        """Whether ``task``'s public pool is another than the one the teachers were trained
        beside (``Task.pool_fingerprint``); False where none is recorded (an older run)."""
        recorded = self.record.get("pool_fingerprint")
        return recorded is not None and recorded != task.pool_fingerprint

    def private_changed(self, task: Task) -> bool:
        """Whether ``task``'s private rows are not those (in that order) the teachers were
        partitioned over (``Task.private_fingerprint``); False where none is recorded."""
        recorded = self.record.get("private_fingerprint")
        return recorded is not None and recorded != task.private_fingerprint

    @property
    def records_pool(self) -> bool:
        """Whether the manifest records its pool's fingerprint (runs of older versions do
        not)."""
        return "pool_fingerprint" in self.record


def teachers_source(run_dir: str | Path) -> DataSource | None:
    """The data the run's teachers were trained on, from their manifest; None when there is no
    manifest or it holds no readable data record."""
    manifest = TeachersManifest.read(run_dir)
    return None if manifest is None else manifest.readable_source()
