"""The teachers' manifest as its readers see it (teachers.manifest): the keys of older versions'
runs are read in one place, shards in their number's order, and a run without trained teachers
is one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pate.data.task import Benchmark, DataFiles, source_record
from pate.errors import UserError
from pate.rundir import RunDir
from teachers.manifest import TeachersManifest, teachers_source


def _write(run: Path, record: dict) -> None:
    path = RunDir(run).manifest
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record))


def test_an_older_runs_keys_are_read_as_this_versions(tmp_path: Path) -> None:
    # before the data's own fingerprint: the rows' keyed the ledgers; before partitions: position
    old = TeachersManifest({"private_fingerprint": "rows-as-read"})
    assert (old.data_fingerprint, old.former_data_fingerprint) == ("rows-as-read", None)
    assert old.partition == "position" and not old.records_pool and old.accuracy == {}
    new = TeachersManifest({"private_fingerprint": "rows-as-read",
                            "private_data_fingerprint": "as-given", "partition": "key"})
    assert (new.data_fingerprint, new.former_data_fingerprint) == ("as-given", "rows-as-read")
    assert new.partition == "key"


def test_shards_come_in_their_numbers_order(tmp_path: Path) -> None:
    shards = {str(i): {"sha256": f"s{i}", "teachers": [5 * i, 5 * i + 5]} for i in (10, 2, 0)}
    manifest = TeachersManifest({"shards": shards, "done": True})
    assert [s.index for s in manifest.shards] == [0, 2, 10]
    assert manifest.shards[1].teachers == range(10, 15) and manifest.shards[1].sha256 == "s2"
    saved = TeachersManifest({"shards": {"0": {"sha256": "x"}}})  # the Python API's save
    assert saved.shards[0].teachers is None


def test_teachers_not_trained_are_one_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no fully trained teachers"):
        TeachersManifest.trained(tmp_path)
    _write(tmp_path, {"shards": {"0": {"sha256": "x", "teachers": [0, 5]}}, "done": False})
    with pytest.raises(UserError, match="no fully trained teachers"):
        TeachersManifest.trained(tmp_path)
    assert TeachersManifest.trained(tmp_path, partial=True).shards[0].index == 0
    _write(tmp_path, [1, 2])  # not an object: no manifest
    assert TeachersManifest.read(tmp_path) is None


def test_a_data_record_of_another_version_is_no_source(tmp_path: Path) -> None:
    assert teachers_source(tmp_path) is None
    _write(tmp_path, {"data": {"kind": "from-the-future", "where": 1}})
    assert teachers_source(tmp_path) is None
    _write(tmp_path, {"data": "not a record"})
    assert teachers_source(tmp_path) is None


def test_a_data_dir_for_data_that_read_no_folder_is_refused() -> None:
    """``pate teachers votes --data-dir`` was ignored without a word for a run on a user's
    files or on digits."""
    on = {name: TeachersManifest({"data": source_record(source)}) for name, source in (
        ("mnist", Benchmark("mnist")), ("digits", Benchmark("digits")),
        ("files", DataFiles("/p.csv", "/q.csv", label="y")))}
    assert on["mnist"].data_source("/d") == Benchmark("mnist", "/d")
    assert on["digits"].data_source() == Benchmark("digits")
    with pytest.raises(UserError, match="digits ships with scikit-learn: it reads no folder"):
        on["digits"].data_source("/d")
    with pytest.raises(UserError, match="--data-dir is for a built-in dataset"):
        on["files"].data_source("/d")
