"""pate.cli.data_flags: the data a command's flags name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.task import Benchmark, DataFiles


def _source(argv: list[str]) -> DataFiles | Benchmark:
    parser = argparse.ArgumentParser()
    add_data_flags(parser)
    return source_from_flags(parser.parse_args(argv))


def test_file_paths_are_made_absolute_where_they_are_given(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A run's manifest records the source, and later commands may run from elsewhere: a
    relative path must not come to mean another file."""
    monkeypatch.chdir(tmp_path)
    files = _source(["--private", "p.csv", "--public", "sub/q.csv", "--label", "y"])
    assert isinstance(files, DataFiles)
    assert (files.private, files.public, files.test) == (
        str(tmp_path / "p.csv"), str(tmp_path / "sub" / "q.csv"), None)
    bench = _source(["--dataset", "digits", "--data-dir", "data"])
    assert isinstance(bench, Benchmark) and bench.data_dir == str(tmp_path / "data")
