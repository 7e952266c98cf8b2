"""How raw rows become model inputs, described as data and interpreted in one place.

A task's *preprocessing record* (``Task.preprocessing``, a JSON object) says how its rows were
read and transformed; ``encode_new_rows`` applies the same record to a file of new rows, so a
published student scores raw data the way it was trained (``pate student predict``). Every
statistic in a record is fitted on the public pool or taken from the config, never from the
private file (docs/design.md, "Your own data"), so the record is public and travels with the
student (``student/schema.json``).

Records by ``format``:

- ``benchmark``: a built-in dataset; ``channels``, ``height``, ``width``, ``pixel_max``. New
  rows are images (``.npz`` or a folder); integer pixels are divided by ``pixel_max``, as the
  dataset's loader did (255, or 16 for ``digits``), float ones taken as they are.
- ``csv``: ``label`` (the label column, dropped from new rows if present), ``numeric`` columns
  standardised with the pool's ``means`` and ``stds``, ``categorical`` columns one-hot over the
  pool's values plus an "other" slot (``TabularEncoder``).
- ``npz``: images scaled to [0, 1] if integer; feature rows standardised with the pool's
  ``mean`` and ``std`` (``Standardiser``).
- ``folder``: images converted to ``mode`` and resized to ``height`` x ``width``.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.data import files
from pate.errors import UserError

MOSTLY_NUMBERS = 0.9  # a text column this much numbers is worth a warning: a typo, perhaps
# Rows of the public data from which a column of values all different looks like an identifier.
IDENTIFIER_ROWS = 50


@dataclass(frozen=True)
class TabularEncoder:
    """Features of a table, fitted on the public pool: numeric columns standardised with the
    pool's mean and standard deviation (a missing value becomes the mean, 0); string columns
    one-hot over the pool's values plus one "other" slot (unseen values and missing ones)."""

    numeric: tuple[str, ...]
    means: tuple[float, ...]
    stds: tuple[float, ...]
    categorical: tuple[str, ...]
    vocabularies: tuple[tuple[str, ...], ...]

    @classmethod
    def fit(cls, public: pd.DataFrame) -> TabularEncoder:
        """Fitted on the pool's columns as ``files.read_csv`` reads them (text, ``NaN`` where
        missing): a column is numeric when every value it holds is a number."""
        numbers = public.apply(pd.to_numeric, errors="coerce")
        numeric = tuple(c for c in public.columns
                        if public[c].notna().any() and not (numbers[c].isna()
                                                            & public[c].notna()).any())
        categorical = tuple(c for c in public.columns if c not in numeric)
        for c in categorical:
            held, text = int(public[c].notna().sum()), int((numbers[c].isna()
                                                          & public[c].notna()).sum())
            if not held:
                warnings.warn(f"the public data's column {c} holds no value: it tells the "
                              "models nothing, whatever the other files hold there (fill it, "
                              "or drop it from every file)", stacklevel=2)
            if text and held - text >= MOSTLY_NUMBERS * held:
                warnings.warn(f"the public data's column {c} is read as categories: {text} of "
                              f"its {held} values are not numbers (if they are typos, correct "
                              "them, or empty those cells to mark them missing)", stacklevel=2)
        _warn_of_identifiers(public, numbers, numeric)
        values = _finite(numbers[list(numeric)], "the public data")
        means = np.nan_to_num(np.nanmean(values, axis=0)) if numeric else np.zeros(0)
        stds = np.nan_to_num(np.nanstd(values, axis=0)) if numeric else np.zeros(0)
        stds[stds == 0] = 1.0
        vocab = tuple(tuple(sorted(public[c].dropna().unique())) for c in categorical)
        return cls(numeric, tuple(means.tolist()), tuple(stds.tolist()), categorical, vocab)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TabularEncoder:
        """The encoder a ``describe()`` record was written from."""
        categorical = record["categorical"]
        return cls(tuple(record["numeric"]), tuple(record["means"]), tuple(record["stds"]),
                   tuple(c["column"] for c in categorical),
                   tuple(tuple(c["values"]) for c in categorical))

    @property
    def width(self) -> int:
        return len(self.numeric) + sum(len(v) + 1 for v in self.vocabularies)

    def transform(self, frame: pd.DataFrame, what: str, private: bool = False
                  ) -> NDArray[np.float32]:
        """``float32 [rows, width]``; the columns must be the pool's (any order). A cell of
        text in a numeric column is named by its row, except in ``private`` data
        (``files.place``)."""
        expected = set(self.numeric) | set(self.categorical)
        if set(frame.columns) != expected:
            missing = sorted(expected - set(frame.columns))
            extra = sorted(set(frame.columns) - expected)
            raise UserError(f"{what}: its columns differ from the public data's"
                            + (f"; missing {', '.join(missing)}" if missing else "")
                            + (f"; not in the public data: {', '.join(extra)}" if extra else ""))
        parts = []
        if self.numeric:
            raw = frame[list(self.numeric)]
            numbers = raw.apply(pd.to_numeric, errors="coerce")
            text = (numbers.isna() & raw.notna()).to_numpy()
            if text.any():  # the first such cell, by its place; its text is not shown
                row, col = np.argwhere(text)[0]
                where = (f" ({files.HIDDEN_PLACE})" if private else
                         f" (first in row {row + 1} of its data, blank lines not counted)")
                raise UserError(f"{what}: column {self.numeric[col]} is numeric in the public "
                                f"data but holds text here{where}: make the cell a number, or "
                                "empty or ? where it is missing")
            z = (_finite(numbers, what) - np.asarray(self.means)) / np.asarray(self.stds)
            parts.append(np.nan_to_num(z, nan=0.0))
        for column, vocab in zip(self.categorical, self.vocabularies, strict=True):
            values = frame[column]
            codes = pd.Index(vocab).get_indexer(values)
            codes[codes < 0] = len(vocab)  # unseen or missing: the "other" slot
            parts.append(np.eye(len(vocab) + 1)[codes])
        return np.concatenate(parts, axis=1).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        """Public description: column names, the pool's statistics and vocabularies, in the
        order of the features (lists, so a JSON writer that sorts keys keeps it)."""
        return {"fitted_on": "public", "numeric": list(self.numeric),
                "means": list(self.means), "stds": list(self.stds),
                "categorical": [{"column": c, "values": list(v)}
                                for c, v in zip(self.categorical, self.vocabularies, strict=True)],
                "features": self.width}


def _finite(numbers: pd.DataFrame, what: str) -> NDArray[np.float64]:
    """The numeric columns as float64; an infinite value, or one beyond float32, is refused."""
    values = numbers.to_numpy(np.float64)
    bad = np.abs(values) > np.finfo(np.float32).max  # NaN (missing) compares False
    if bad.any():
        column = numbers.columns[int(np.argwhere(bad)[0][1])]
        raise UserError(f"{what}: column {column} holds an infinite or too large number")
    return values


@dataclass(frozen=True)
class Standardiser:
    """Feature rows standardised with the pool's per-column mean and standard deviation (a
    constant column keeps its scale)."""

    mean: NDArray[np.float32]
    std: NDArray[np.float32]

    @classmethod
    def fit(cls, pool: NDArray[np.float32]) -> Standardiser:
        std = pool.std(axis=0)
        std[std == 0] = 1.0
        return cls(pool.mean(axis=0), std)

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> Standardiser:
        return cls(np.asarray(record["mean"], np.float32), np.asarray(record["std"], np.float32))

    def transform(self, x: NDArray[np.float32]) -> NDArray[np.float32]:
        return ((x - self.mean) / self.std).astype(np.float32)

    def describe(self) -> dict[str, Any]:
        return {"fitted_on": "public", "standardised": True, "mean": self.mean.tolist(),
                "std": self.std.tolist()}


def _whole_above_one(x: NDArray[np.floating]) -> bool:
    """Whether the finite values of ``x`` reach above 1 and are all whole numbers: integer
    pixels stored as floats. Floats in [0, 1], the usual case, are told by their maximum alone,
    without a copy of the array."""
    finite = np.isfinite(x)
    if not np.max(x, initial=-np.inf, where=finite) > 1:
        return False
    values = x[finite]
    return bool(np.all(values == np.floor(values)))


def as_features(x: NDArray, what: str, pixel_max: float = 255.0) -> NDArray[np.float32]:
    """``.npz`` arrays as float32: integer images scaled to [0, 1] (divided by ``pixel_max``),
    ``[n, H, W]`` given a channel axis. NaN, infinite values and numbers beyond float32 are
    refused, and so are float images of whole numbers above 1: integer pixels stored as
    floats, which would not be scaled as the same pixels stored as integers are (a model
    trained on one would read the other wrong)."""
    if np.issubdtype(x.dtype, np.integer) and x.ndim > 2:
        if x.size and (x.min() < 0 or x.max() > pixel_max):
            raise UserError(f"{what}: integer pixels must lie in [0, {pixel_max:g}] for this "
                            "data (give floats in [0, 1] otherwise)")
        x = x / pixel_max
    elif np.issubdtype(x.dtype, np.floating) and x.ndim > 2 and _whole_above_one(x):
        raise UserError(f"{what}: its pixels are whole numbers above 1 stored as floats, as "
                        "integer pixels are: scale them to [0, 1] (divide by the largest value "
                        "their format holds: 255 for 8-bit images, 16 for 4-bit ones), or give "
                        "8-bit images as uint8 (divided by 255 here)")
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
        x = np.asarray(x, np.float32)
    if not np.isfinite(x).all():
        raise UserError(f"{what}: its rows hold NaN, infinite or too large values")
    return x[:, None] if x.ndim == 3 else x


def _warn_of_identifiers(public: pd.DataFrame, numbers: pd.DataFrame,
                         numeric: tuple[str, ...]) -> None:
    """Warn of the public columns that look like row identifiers: a different value in every
    row (whole numbers, or text), which as a feature tells nothing of the label and, scaled
    with the pool's statistics, puts other files' rows far from it. A public statistic."""
    if len(public) < IDENTIFIER_ROWS:
        return
    for c in public.columns:
        held = public[c].dropna()
        whole = c not in numeric or bool((numbers[c].dropna() % 1 == 0).all())
        if len(held) == len(public) and held.nunique() == len(public) and whole:
            warnings.warn(f"the public data's column {c} holds a different value in every row: "
                          "an identifier? it is used as a feature, which it should not be "
                          "(drop it from every file or frame; data without it is charged to "
                          "a ledger of its own: to keep one budget, name the same ledger, as "
                          "aggregator.ledger, --ledger or ledger=)", stacklevel=3)


def channels_last(image_shape: tuple[int, ...]) -> bool:
    """Whether one image's shape looks ``[H, W, C]`` rather than ``[C, H, W]``: a last axis of
    1, 3 or 4 and a first one of none of those (images are ``[C, H, W]`` here)."""
    return (len(image_shape) == 3 and image_shape[2] in (1, 3, 4)
            and image_shape[0] not in (1, 3, 4))


def channels_last_advice(what: str, image_shape: tuple[int, ...]) -> str:
    """What to say of ``what``, images of ``image_shape`` that look channels-last (not the
    number of rows: it may be private)."""
    return (f"{what}: images of shape {list(image_shape)} look channels-last [H, W, C]; images "
            "are [C, H, W]: transpose the array with .transpose(0, 3, 1, 2) if so")


def benchmark_record(name: str, image_shape: tuple[int, ...], pixel_max: float
                     ) -> dict[str, Any]:
    """The record of a built-in image dataset of ``[C, H, W]`` images whose loader divided
    raw integer pixels by ``pixel_max``."""
    channels, height, width = image_shape
    return {"format": "benchmark", "dataset": name, "channels": channels, "height": height,
            "width": width, "pixel_max": pixel_max}


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _are_numbers(values: Any, length: int | None = None, positive: bool = False) -> bool:
    return (isinstance(values, list) and (length is None or len(values) == length)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool)
                    and np.isfinite(v) and (v > 0 or not positive) for v in values))


def are_names(values: Any) -> bool:
    """A list of distinct strings."""
    return (isinstance(values, list) and all(isinstance(v, str) for v in values)
            and len(set(values)) == len(values))


def record_problem(record: Any) -> str | None:
    """What is wrong with a preprocessing record read back from a file, or None: every key
    ``encode_new_rows`` uses, of its type and length."""
    if not isinstance(record, dict):
        return "the preprocessing is not an object"
    kind = record.get("format")
    if kind in ("benchmark", "folder"):
        if not (_is_count(record.get("height")) and _is_count(record.get("width"))):
            return "the image height and width must be positive integers"
        if kind == "benchmark":
            ok = (record.get("channels") in (1, 3)
                  and _are_numbers([record.get("pixel_max")], positive=True))
        else:
            ok = record.get("mode") in ("L", "RGB")
        return None if ok else f"the {kind} record lacks its channels or scale"
    if kind == "csv":
        numeric = record.get("numeric")
        categorical = record.get("categorical")
        if not (isinstance(record.get("label"), str) and are_names(numeric)
                and isinstance(record.get("key", ""), str)
                and _are_numbers(record.get("means"), len(numeric))
                and _are_numbers(record.get("stds"), len(numeric), True)
                and isinstance(categorical, list)
                and all(isinstance(c, dict) and isinstance(c.get("column"), str)
                        and are_names(c.get("values")) for c in categorical)):
            return "the table's columns, statistics or vocabularies are missing or malformed"
        return None
    if kind == "npz":
        if record.get("standardised"):
            mean = record.get("mean")
            if not (_are_numbers(mean) and _are_numbers(record.get("std"), len(mean), True)):
                return "the feature means and deviations are missing or malformed"
        return None
    return f"unknown format {kind!r}"


def record_shape(record: dict[str, Any]) -> tuple[int, ...] | None:
    """The shape of one input row that a record (checked by ``record_problem``) makes, or None
    where the record does not fix it (an ``.npz`` of images or of unscaled features)."""
    kind = record["format"]
    if kind in ("benchmark", "folder"):
        channels = record["channels"] if kind == "benchmark" else {"L": 1, "RGB": 3}[record["mode"]]
        return (channels, record["height"], record["width"])
    if kind == "csv":
        return (TabularEncoder.from_record(record).width,)
    return (len(record["mean"]),) if record.get("standardised") else None


def _images(path: str | Path, mode: str, height: int, width: int, pixel_max: float = 255.0
            ) -> tuple[NDArray[np.float32], list[str]]:
    """New images of ``path`` (a ``.npz`` or a folder) and their names: a folder's image paths
    relative to it, a ``.npz``'s row numbers."""
    if files.kind_of(path) == "folder":
        x, _, _, _ = files.read_image_folder(path, False, mode, (width, height))
        return x, files.image_names(path)
    if files.kind_of(path) == "csv":
        raise UserError(f"{path}: this student reads images: a .npz or a folder of images")
    x = as_features(files.read_npz(path, False)[0], str(path), pixel_max)
    return x, [str(i) for i in range(len(x))]


def encode_new_rows(record: dict[str, Any], path: str | Path
                    ) -> tuple[NDArray[np.float32], list[str]]:
    """The rows of ``path`` transformed as ``record`` (checked by ``record_problem``) says, and
    a name per row (its row number, or its image's path inside the folder). A label column, a
    ``y`` array or class subfolders are ignored: only the inputs are read."""
    kind = record["format"]
    if kind == "benchmark":
        return _images(path, "L" if record["channels"] == 1 else "RGB", record["height"],
                       record["width"], record["pixel_max"])
    if kind == "folder":
        return _images(path, record["mode"], record["height"], record["width"])
    if files.kind_of(path) != kind:
        raise UserError(f"{path}: this student was trained on .{kind} data: give a .{kind} file")
    if kind == "csv":
        frame, _ = files.read_csv(path, record["label"], False)
        frame = frame.drop(columns=[record.get("key")], errors="ignore")  # whose row: no input
        x = TabularEncoder.from_record(record).transform(frame, str(path))
    else:
        x = as_features(files.read_npz(path, False)[0], str(path))
        if record.get("standardised") and x.ndim == 2:
            if x.shape[1] != len(record["mean"]):
                raise UserError(f"{path}: rows of {x.shape[1]} features; this student takes "
                                f"{len(record['mean'])}")
            x = Standardiser.from_record(record).transform(x)
    return x, [str(i) for i in range(len(x))]
