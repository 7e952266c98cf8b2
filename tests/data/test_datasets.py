"""pate.data.datasets: array convention, split protocol, checksums and clear errors."""

from __future__ import annotations

import gzip
import shutil
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from pate.data.datasets import DEBIAN_FASHION_MNIST, LOADERS, load_dataset, public_split
from pate.data.task import Benchmark, load_task
from pate.errors import UserError

needs_fashion = pytest.mark.skipif(
    not (DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").is_file(),
    reason="apt-get install dataset-fashion-mnist")


def test_digits_convention(digits):
    assert digits.train_x.dtype == np.float32 and digits.train_x.shape[1:] == (1, 8, 8)
    assert digits.train_y.dtype == np.int64 and len(digits.train_y) == len(digits.train_x)
    assert digits.train_x.min() >= 0.0 and digits.train_x.max() <= 1.0
    assert digits.num_classes == 10 and set(np.unique(digits.test_y)) == set(range(10))
    assert digits.classes == tuple("0123456789")  # no published names: the indices


def test_class_names_must_name_every_class(digits):
    with pytest.raises(ValueError, match="9 class names for 10 classes"):
        replace(digits, class_names=tuple("abcdefghi"))


def test_public_split_halves_and_pool_size(digits):
    (px, py), (ex, ey) = public_split(digits)
    n = len(digits.test_y)
    assert len(px) == n // 2 and len(ex) == n - n // 2
    np.testing.assert_array_equal(np.concatenate([py, ey]), digits.test_y)
    (px, _), (ex, _) = public_split(digits, pool_size=100)
    assert len(px) == 100 and len(ex) == n - 100
    np.testing.assert_array_equal(px, digits.test_x[:100])
    with pytest.raises(UserError, match="pool-size"):
        public_split(digits, pool_size=n)


def test_unknown_dataset_is_a_user_error():
    with pytest.raises(UserError, match="unknown dataset"):
        load_dataset("imagenet")
    assert {"fashion-mnist", "mnist", "svhn", "cifar10", "digits"} <= set(LOADERS)


@needs_fashion
def test_fashion_mnist_test_split_only(tmp_path):
    for name in ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"):
        shutil.copy(DEBIAN_FASHION_MNIST / name, tmp_path / name)
    ds = load_dataset("fashion-mnist", tmp_path, need_train=False)
    assert ds.train_x is None and ds.train_y is None
    assert ds.test_x.shape == (10000, 1, 28, 28) and ds.test_x.dtype == np.float32
    assert np.bincount(ds.test_y).tolist() == [1000] * 10
    task = load_task(Benchmark("fashion-mnist", str(tmp_path)), need_private=False)
    assert task.classes[0] == "T-shirt/top" and task.classes[6] == "Shirt"
    assert task.classes[9] == "Ankle boot" and task.classes_from == "dataset"


@needs_fashion
def test_uncompressed_copy_is_verified_too(tmp_path):
    for name in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        data = gzip.decompress((DEBIAN_FASHION_MNIST / f"{name}.gz").read_bytes())
        (tmp_path / name).write_bytes(data)
    ds = load_dataset("fashion-mnist", tmp_path, need_train=False)
    assert len(ds.test_y) == 10000


@needs_fashion
def test_corrupt_file_is_one_clear_error(tmp_path: Path):
    shutil.copy(DEBIAN_FASHION_MNIST / "t10k-images-idx3-ubyte.gz", tmp_path)
    labels = bytearray(gzip.decompress(
        (DEBIAN_FASHION_MNIST / "t10k-labels-idx1-ubyte.gz").read_bytes()))
    labels[100] = (labels[100] + 1) % 10  # one flipped label
    (tmp_path / "t10k-labels-idx1-ubyte.gz").write_bytes(gzip.compress(bytes(labels)))
    with pytest.raises(UserError, match="corrupt"):
        load_dataset("fashion-mnist", tmp_path, need_train=False)


@pytest.mark.parametrize("name", ["mnist", "svhn", "cifar10"])
def test_missing_files_are_one_clear_error(name: str, tmp_path: Path, monkeypatch):
    """Not on disk and not downloadable here (torchvision absent, or no network): one line."""
    monkeypatch.setenv("PATE_DATA", str(tmp_path / "cache"))
    with pytest.raises(UserError) as info:
        load_dataset(name, tmp_path / "data", need_train=False)
    assert "\n" not in str(info.value)


def test_mnist_files_are_verified_without_torchvision(tmp_path: Path, monkeypatch):
    """MNIST's checksums are the project's own, so files on disk are checked with no torchvision."""
    monkeypatch.setitem(sys.modules, "torchvision", None)  # import now fails
    for stem in ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"):
        (tmp_path / f"{stem}.gz").write_bytes(gzip.compress(b"\x00\x00\x08\x01" + bytes(8)))
    with pytest.raises(UserError, match="corrupt"):
        load_dataset("mnist", tmp_path, need_train=False)


def test_a_wrapped_multi_line_error_folds_to_one_line():
    """torchvision's failed download lists one URL error per line; the CLI prints one line."""
    exc = UserError("MNIST download failed (Error downloading x:\n  <urlopen error>\n\n)")
    assert str(exc) == "MNIST download failed (Error downloading x: <urlopen error> )"
