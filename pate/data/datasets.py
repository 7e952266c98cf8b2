"""Datasets in one array convention, and the papers' public/evaluation split.

Every loader returns float32 images ``[n, C, H, W]`` scaled to [0, 1] and int64 labels. Following
Papernot et al., "Semi-supervised Knowledge Transfer for Deep Learning from Private Training Data"
(ICLR 2017) and "Scalable Private Learning with PATE" (ICLR 2018), the training split is the private
data the teachers are partitioned over; the test split's first half is the student's unlabelled
public pool and the second half the evaluation set (:func:`public_split`).

Files are checked before use: Fashion-MNIST by the sha256 of each decompressed IDX payload (the
same for Debian's ``dataset-fashion-mnist`` and the upstream ``.gz`` files), MNIST, SVHN and
CIFAR-10 by the md5 sums torchvision publishes for them. The IDX format is Y. LeCun's, described
at http://yann.lecun.com/exdb/mnist/.

torchvision is an optional dependency (``pip install 'pate-ensembles[datasets]'``): it downloads
what is missing and reads SVHN and CIFAR-10. Fashion-MNIST, MNIST files already on disk, the
digits and the glyphs load without it, so a CPU-only install needs no torchvision build matched
to its torch.
"""

from __future__ import annotations

import gzip
import hashlib
import os
from collections.abc import Callable
from pathlib import Path
from types import ModuleType

import numpy as np

from pate.data.dataset import Dataset
from pate.errors import UserError

DEBIAN_FASHION_MNIST = Path("/usr/share/datasets/fashion-mnist")
# the label names their publishers give (Zalando's Fashion-MNIST README; A. Krizhevsky's
# CIFAR-10 page), in label order
FASHION_MNIST_CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal", "Shirt",
                         "Sneaker", "Bag", "Ankle boot")
CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                   "truck")

# md5 of the upstream MNIST .gz files, as published in torchvision.datasets.MNIST.resources.
MNIST_MD5 = {
    "train-images-idx3-ubyte": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
    "train-labels-idx1-ubyte": "d53e105ee54ea40749a09fcbcd1e9432",
    "t10k-images-idx3-ubyte": "9fb629c4189551a2d022fa330f9573f3",
    "t10k-labels-idx1-ubyte": "ec29112dd5afa0611ce80d1b7f02629c",
}

# sha256 of the decompressed IDX payloads of Fashion-MNIST
# (github.com/zalandoresearch/fashion-mnist).
FASHION_MNIST_SHA256 = {
    "train-images-idx3-ubyte": "c59f468a2f672dc815687fe0f83887768d799fd8a3f3276145d20f83aa44d888",
    "train-labels-idx1-ubyte": "bad3541b69d912435c50bb6ba87bec294ff4f6a2e1246121d8633921760443d9",
    "t10k-images-idx3-ubyte": "5b4141f0afbad91edebe8549f8fcffe087ea10ca49f1dbef5c9a5cd8815ce37b",
    "t10k-labels-idx1-ubyte": "0402a96d92fd2663957122ceb108a494c5af83dab82d92729df917d7dec38c34",
}


Loader = Callable[[Path | None, bool], Dataset]
LOADERS: dict[str, Loader] = {}
# The augmentation a built-in dataset's teachers train with by default (``augment = "auto"``):
# one that keeps its labels and, measured, does not make the teachers' errors more alike. On
# Fashion-MNIST with 250 teachers, random shifts and mirroring lowered the plurality's accuracy
# (50 teachers, 2 000 pool rows: 0.79 with, 0.84 without) while barely moving the teachers'
# own (0.73 against 0.75), so the 28x28 sets train without; the colour sets keep the usual
# shifts (mirroring only where it preserves the label).
TEACHER_AUGMENT: dict[str, str] = {}
# Where a built-in dataset that reads no files comes from (a folder given for it is refused).
NO_FOLDER: dict[str, str] = {}
# The built-in dataset of a run or command that names none.
DEFAULT_DATASET = "fashion-mnist"


def register(name: str, teacher_augment: str = "none", comes_from: str | None = None
             ) -> Callable[[Loader], Loader]:
    """Add a loader ``f(data_dir, need_train) -> Dataset`` to the registry under ``name``, with
    the augmentation its teachers train with by default (:data:`TEACHER_AUGMENT`);
    ``comes_from``: where a dataset that reads no files comes from (:data:`NO_FOLDER`)."""
    def wrap(fn: Loader) -> Loader:
        LOADERS[name] = fn
        TEACHER_AUGMENT[name] = teacher_augment
        if comes_from is not None:
            NO_FOLDER[name] = comes_from
        return fn
    return wrap


def dataset_name_problem(name: str) -> str | None:
    """Why ``name`` is not a built-in dataset, or None."""
    if name in LOADERS:
        return None
    return f"unknown dataset {name!r}; choose one of {', '.join(sorted(LOADERS))}"


def data_dir_problem(name: str, data_dir: str | None) -> str | None:
    """Why a folder given for built-in dataset ``name`` would go unread (it reads no files),
    or None: refused where input comes in (flags, a config) rather than silently ignored."""
    if data_dir is None or name not in NO_FOLDER:
        return None
    return f"{name} {NO_FOLDER[name]}: it reads no folder (--data-dir, data.data_dir)"


def load_dataset(name: str, data_dir: str | Path | None = None, need_train: bool = True) -> Dataset:
    """Load dataset ``name`` (one of :data:`LOADERS`); ``data_dir`` is searched first where the
    loader reads files. With ``need_train=False`` the training files are not required."""
    problem = dataset_name_problem(name)
    if problem:
        raise UserError(problem)
    return LOADERS[name](Path(data_dir) if data_dir else None, need_train)


def public_split(ds: Dataset, pool_size: int | None = None
                 ) -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """((pool_x, pool_y), (eval_x, eval_y)): the first ``pool_size`` rows of the test split
    (default: half of it) are the student's public pool, the rest the evaluation set."""
    n = len(ds.test_y)
    k = n // 2 if pool_size is None else int(pool_size)
    if not 0 < k < n:
        raise UserError(f"the pool size (--pool-size, data.pool_size) must be between 1 and "
                        f"{n - 1} for {ds.name} ({n} test rows)")
    return (ds.test_x[:k], ds.test_y[:k]), (ds.test_x[k:], ds.test_y[k:])


def _default_cache() -> Path:
    return Path(os.environ.get("PATE_DATA") or Path.home() / ".cache" / "pate" / "data")


def _digest(data: bytes, algorithm: str) -> str:
    return hashlib.new(algorithm, data).hexdigest()


def _parse_idx(data: bytes, what: str) -> np.ndarray:
    """Decode an IDX file (unsigned-byte payload): magic 0x0000 08 ndim, big-endian dims."""
    if len(data) < 4 or data[:3] != b"\x00\x00\x08":
        raise UserError(f"{what} is not an unsigned-byte IDX file")
    ndim = data[3]
    dims = np.frombuffer(data, dtype=">u4", count=ndim, offset=4).astype(np.int64)
    return np.frombuffer(data, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)


def _find_idx(stem: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for candidate in (d / f"{stem}.gz", d / stem):
            if candidate.is_file():
                return candidate
    return None


def _read_idx(path: Path, sha256: str | None, md5: str | None) -> np.ndarray:
    """Read and verify an IDX file: the md5 of an upstream ``.gz`` or the sha256 of its payload."""
    raw = path.read_bytes()
    data = gzip.decompress(raw) if path.suffix == ".gz" else raw
    gz_ok = md5 is not None and path.suffix == ".gz" and _digest(raw, "md5") == md5
    if not (gz_ok or (sha256 is not None and _digest(data, "sha256") == sha256)):
        raise UserError(f"{path} is corrupt or unknown (checksum mismatch); delete it and "
                        "reinstall the original file")
    return _parse_idx(data, str(path))


def _idx_pair(split: str, dirs: list[Path], sums: dict[str, tuple[str | None, str | None]],
              missing: str) -> tuple[np.ndarray, np.ndarray]:
    out = []
    for kind in ("images-idx3-ubyte", "labels-idx1-ubyte"):
        stem = f"{split}-{kind}"
        path = _find_idx(stem, dirs)
        if path is None:
            raise UserError(f"{stem}(.gz) not found; {missing}")
        out.append(_read_idx(path, *sums[stem]))
    images, labels = out
    return (images[:, None].astype(np.float32) / 255.0), labels.astype(np.int64)


def _torchvision_datasets(what: str) -> ModuleType:
    """``torchvision.datasets``, imported lazily (it is heavy and optional); without it, one clear
    error naming what needed it."""
    try:
        import torchvision.datasets as tvd
    except ImportError as exc:
        raise UserError(f"{what} needs torchvision, which is not installed; install it with "
                        "pip install 'pate-ensembles[datasets]' (a build matched to your torch)"
                        ) from exc
    return tvd


def _torchvision_download(cls_name: str, root: Path, missing: str) -> None:
    tvd = _torchvision_datasets(f"{cls_name} is not on disk ({missing}); its download")
    try:
        for train in (True, False):
            getattr(tvd, cls_name)(str(root), train=train, download=True)
    except Exception as exc:  # no network or no disk: one clear line
        raise UserError(f"{cls_name} not found and its download to {root} failed ({exc}); "
                        f"{missing}") from exc


def _mnist_like(name: str, cls_name: str, sums: dict[str, tuple[str | None, str | None]],
                dirs: list[Path], missing: str, data_dir: Path | None,
                need_train: bool, class_names: tuple[str, ...] = ()) -> Dataset:
    raw_dirs = [p for d in dirs for p in (d, d / cls_name / "raw")]
    stems = [s for s in sums if need_train or s.startswith("t10k")]
    if any(_find_idx(s, raw_dirs) is None for s in stems):
        _torchvision_download(cls_name, data_dir or _default_cache(), missing)
    test_x, test_y = _idx_pair("t10k", raw_dirs, sums, missing)
    train_x, train_y = _idx_pair("train", raw_dirs, sums, missing) if need_train else (None, None)
    return Dataset(name, train_x, train_y, test_x, test_y, 10, class_names=class_names)


@register("fashion-mnist")
def _fashion_mnist(data_dir: Path | None, need_train: bool) -> Dataset:
    upstream_md5 = {  # upstream .gz md5 sums, as published in torchvision.datasets.FashionMNIST
        "train-images-idx3-ubyte": "8d4fb7e6c68d591d4c3dfef9ec88bf0d",
        "train-labels-idx1-ubyte": "25c81989df183df01b3e8a0aad5dffbe",
        "t10k-images-idx3-ubyte": "bef4ecab320f06d8554ea6380940ec79",
        "t10k-labels-idx1-ubyte": "bb300cfdad3c16e7a12a480ee83cd310",
    }
    sums = {k: (v, upstream_md5[k]) for k, v in FASHION_MNIST_SHA256.items()}
    dirs = [d for d in (data_dir, DEBIAN_FASHION_MNIST, _default_cache()) if d is not None]
    missing = ("install Debian's package (apt-get install dataset-fashion-mnist) or put the four "
               "Fashion-MNIST .gz files in $PATE_DATA or --data-dir")
    return _mnist_like("fashion-mnist", "FashionMNIST", sums, dirs, missing, data_dir, need_train,
                       FASHION_MNIST_CLASSES)


@register("mnist")
def _mnist(data_dir: Path | None, need_train: bool) -> Dataset:
    sums = {stem: (None, md5) for stem, md5 in MNIST_MD5.items()}
    dirs = [d for d in (data_dir, _default_cache()) if d is not None]
    missing = "put the MNIST .gz files (train-*, t10k-*) in --data-dir or $PATE_DATA"
    return _mnist_like("mnist", "MNIST", sums, dirs, missing, data_dir, need_train)


def _torchvision_split(cls_name: str, data_dir: Path | None, split_kw: dict, what: str):
    tvd = _torchvision_datasets(f"reading {what}")
    root = data_dir or _default_cache()
    cls = getattr(tvd, cls_name)
    try:
        ds = cls(str(root), **split_kw, download=False)
    except RuntimeError:
        try:
            ds = cls(str(root), **split_kw, download=True)  # verifies torchvision's md5 sums
        except Exception as exc:
            raise UserError(f"{what} not found or corrupt under {root} and could not be "
                            f"downloaded ({exc}); put the files there or pass --data-dir") from exc
    return ds


@register("svhn", teacher_augment="shift")
def _svhn(data_dir: Path | None, need_train: bool) -> Dataset:
    def split(name: str) -> tuple[np.ndarray, np.ndarray]:
        ds = _torchvision_split("SVHN", data_dir, {"split": name}, f"SVHN {name}_32x32.mat")
        return ds.data.astype(np.float32) / 255.0, np.asarray(ds.labels, dtype=np.int64)

    test_x, test_y = split("test")
    train_x, train_y = split("train") if need_train else (None, None)
    return Dataset("svhn", train_x, train_y, test_x, test_y, 10)


@register("cifar10", teacher_augment="shift-flip")
def _cifar10(data_dir: Path | None, need_train: bool) -> Dataset:
    def split(train: bool) -> tuple[np.ndarray, np.ndarray]:
        ds = _torchvision_split("CIFAR10", data_dir, {"train": train}, "cifar-10-batches-py")
        x = ds.data.transpose(0, 3, 1, 2).astype(np.float32) / 255.0
        return np.ascontiguousarray(x), np.asarray(ds.targets, dtype=np.int64)

    test_x, test_y = split(False)
    train_x, train_y = split(True) if need_train else (None, None)
    return Dataset("cifar10", train_x, train_y, test_x, test_y, 10, class_names=CIFAR10_CLASSES)


DIGITS_TEST = 500


@register("digits", comes_from="ships with scikit-learn")
def _digits(data_dir: Path | None, need_train: bool) -> Dataset:
    """scikit-learn's 8x8 digits (1 797 images, shipped with scikit-learn): a fixed shuffle, the
    last 500 rows are the test split."""
    from sklearn.datasets import load_digits

    bunch = load_digits()
    order = np.random.default_rng(0).permutation(len(bunch.target))
    x = (bunch.images[order, None] / 16.0).astype(np.float32)  # its pixels run 0 to 16
    y = bunch.target[order].astype(np.int64)
    n = len(y) - DIGITS_TEST
    return Dataset("digits", x[:n] if need_train else None, y[:n] if need_train else None,
                   x[n:], y[n:], 10, pixel_max=16.0)


@register("glyphs", comes_from="is drawn from the installed fonts")
def _glyphs(data_dir: Path | None, need_train: bool) -> Dataset:
    """The synthetic Glyph stand-in, rendered on the fly from the installed fonts
    (pate.data.glyphs); ``data_dir`` is not used. Sizes: ``PATE_GLYPHS_SIZE=TRAIN,TEST``."""
    from pate.data.glyphs import load_glyphs

    return load_glyphs(need_train)
