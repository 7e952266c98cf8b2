"""pate.cli.data_flags: the data a command's flags name."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.task import Benchmark, DataFiles
from pate.errors import UserError


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
    bench = _source(["--dataset", "mnist", "--data-dir", "data"])
    assert isinstance(bench, Benchmark) and bench.data_dir == str(tmp_path / "data")


def test_a_folder_for_a_dataset_that_reads_none_and_an_empty_name_are_refused() -> None:
    """digits ships with scikit-learn and glyphs are drawn: a --data-dir for them was ignored
    without a word; --dataset "" ran the default dataset."""
    with pytest.raises(UserError, match="digits ships with scikit-learn: it reads no folder"):
        _source(["--dataset", "digits", "--data-dir", "data"])
    parser = argparse.ArgumentParser()
    add_data_flags(parser)
    with pytest.raises(UserError, match="glyphs is drawn from the installed fonts"):
        source_from_flags(parser.parse_args(["--data-dir", "d"]), Benchmark("glyphs"))
    with pytest.raises(UserError, match="unknown dataset ''; choose one of"):
        _source(["--dataset", ""])


def test_a_runs_data_is_the_default_and_a_pool_size_applies_to_it(tmp_path: Path) -> None:
    """Without --dataset, the run's teachers' data: --pool-size and --data-dir change that
    dataset's (never switch to the default dataset); for a user's files they are an error."""
    parser = argparse.ArgumentParser()
    add_data_flags(parser)
    teachers = Benchmark("digits", None, 200)
    assert source_from_flags(parser.parse_args([]), teachers) == teachers
    assert source_from_flags(parser.parse_args(["--pool-size", "150"]), teachers) == Benchmark(
        "digits", None, 150)
    files = DataFiles(str(tmp_path / "p.csv"), str(tmp_path / "q.csv"))
    assert source_from_flags(parser.parse_args([]), files) == files
    with pytest.raises(UserError, match="are for a built-in dataset"):
        source_from_flags(parser.parse_args(["--pool-size", "150"]), files)


def test_folders_of_images_take_an_image_size_and_other_files_refuse_it(tmp_path: Path) -> None:
    (tmp_path / "public").mkdir()
    folders = _source(["--private", str(tmp_path / "private"), "--public",
                       str(tmp_path / "public"), "--image-size", "16", "12"])
    assert isinstance(folders, DataFiles) and folders.image_size == (16, 12)
    with pytest.raises(UserError, match=r"an image size \(--image-size, data.image_size\) is "
                                        "for folders of images, not CSV files"):
        _source(["--private", "p.csv", "--public", "q.csv", "--label", "y",
                 "--image-size", "16", "16"])
