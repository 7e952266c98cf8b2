"""A learning task as every stage sees it: the private labelled rows the teachers are partitioned
over, the public pool the student may query, the optional evaluation rows, and the label set.

Where the data comes from is described as data (``DataSource``) and interpreted in one place,
``load_task``:

- ``Benchmark(name)``: a built-in dataset (``pate.data.datasets``) with the papers' protocol: the
  training split is private; the test split's first half (``pool_size`` rows) is the public pool,
  the rest the evaluation rows.
- ``DataFiles(private, public, test)``: a user's files (``pate.data.files``).

Privacy rules of preprocessing (docs/design.md, "Your own data"): every statistic a model sees
(scaling, category vocabularies, image size and colour mode) is fitted on the public pool or
taken from the config, never from the private file; a category the public data never showed maps
to an "other" slot, a missing number to the public mean. The label set is schema, treated as
public: ``classes`` from the config, else the labels of ``test``, else the class subfolders of
an image folder; a private label outside it is an error. Accuracy is measured only on ``test``.
"""

from __future__ import annotations

import hashlib
import json
import warnings
from collections.abc import Hashable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.data import files
from pate.data.datasets import load_dataset, public_split
from pate.data.label_sets import SET_FROM, encode_labels, label_set
from pate.data.preprocessing import (
    Standardiser,
    TabularEncoder,
    as_features,
    benchmark_record,
    channels_last,
    channels_last_advice,
)
from pate.data.row_identity import (
    check_apart,
    frame_keys,
    numeric_rows_digest,
    private_rows_key,
    row_keys,
    rows_content_digest,
    rows_fingerprint,
    table_digest,
)
from pate.errors import UserError


@dataclass(frozen=True)
class Benchmark:
    """A built-in dataset by name; ``pool_size`` rows of its test split are the public pool."""

    name: str
    data_dir: str | None = None
    pool_size: int | None = None


@dataclass(frozen=True)
class DataFiles:
    """A user's files: ``private`` (labelled), ``public`` (the pool; labels unused), ``test``
    (optional, labelled). ``label``: a CSV's label column; ``classes``: the label set;
    ``image_size``: (height, width) images are resized to (default the public images');
    ``key``: a CSV's column that names whose each row is (a person), which the teachers'
    partition deals by (``teachers.partition``), never a feature."""

    private: str
    public: str
    test: str | None = None
    label: str | None = None
    classes: tuple[str, ...] | None = None
    image_size: tuple[int, int] | None = None
    key: str | None = None

    def __post_init__(self) -> None:
        if self.key is not None and self.key == self.label:
            raise UserError(f"the key column {self.key!r} is the label column: name the column "
                            "that says whose each row is")
        if self.classes is not None and len(set(self.classes)) != len(self.classes):
            raise UserError(f"the classes {list(self.classes)} repeat a name: each class once")
        if self.image_size is not None and min(self.image_size) < 1:
            raise UserError(f"the image size {list(self.image_size)} must be positive "
                            "(height, width)")


DataSource = Benchmark | DataFiles
_KIND_NAMES = {"csv": "CSV files", "npz": ".npz files", "folder": "folders of images"}


def unused_setting_problem(source: DataFiles) -> str | None:
    """Why a setting of new input has no use for its files' format (a label column for data
    that carries its labels, an image size for data that is not images), or None. Refused
    where input comes in (flags, a new run's config); ``load_task`` ignores such a setting with
    a warning (a source built in Python; a run an older version recorded with one, which still
    loads)."""
    if source.label is None and source.image_size is None and source.key is None:
        return None
    kinds = {files.kind_named(p) for p in (source.private, source.public, source.test) if p}
    if len(kinds) > 1:  # files of several formats: load_task says so, the setting is not at fault
        return None
    kind = files.kind_named(source.public)  # the files may not exist yet
    if source.key is not None and kind != "csv":
        return (f"a key column (--key, data.key) is for CSV files, not {_KIND_NAMES[kind]}")
    if source.label is not None and kind != "csv":
        return (f"a label column (--label, data.label) is for CSV files; {_KIND_NAMES[kind]} "
                "carry their labels themselves")
    if source.image_size is not None and kind != "folder":
        return (f"an image size (--image-size, data.image_size) is for folders of images, "
                f"not {_KIND_NAMES[kind]}")
    return None


def source_record(source: DataSource) -> dict[str, Any]:
    """The JSON record of a source (the teachers' manifest keeps it, so later stages reload the
    same data)."""
    kind = "benchmark" if isinstance(source, Benchmark) else "files"
    return {"kind": kind, **{k: (list(v) if isinstance(v, tuple) else v)
                             for k, v in asdict(source).items()}}


def source_identity(source: DataSource) -> dict[str, Any]:
    """``source_record`` without where a built-in dataset's files lie: what makes two sources
    the same data (a rerun elsewhere, a student of the teachers' pool)."""
    return {k: v for k, v in source_record(source).items() if k != "data_dir"}


def source_from_record(record: dict[str, Any]) -> DataSource:
    """The source of a ``source_record``."""
    fields = {k: (tuple(v) if isinstance(v, list) else v) for k, v in record.items()
              if k != "kind"}
    return Benchmark(**fields) if record.get("kind") == "benchmark" else DataFiles(**fields)


@dataclass(frozen=True)
class Task:
    """The arrays of one task. ``private_*`` are None unless asked for; ``pool_y`` is known for
    benchmarks only (a user's public labels are never read); ``eval_*`` are None without test
    data. ``classes_from`` says where the label set came from; ``pool_file`` the user's public
    file or folder the pool was read from (None for a built-in dataset), ``private_content``
    a digest of what the private one holds (where read: ``table_digest`` of a CSV,
    ``files.content_digest`` of the others), ``private_rows`` that of an ``.npz``'s feature rows
    as read, before the pool's statistics standardise them (``rows_content_digest``), or of a
    CSV's cells where all are numbers (``numeric_rows_digest``; None where one is not);
    ``preprocessing`` describes, publicly, how features were made; ``private_keys`` whose
    each private row is (a CSV's ``DataFiles.key`` column, as text; PRIVATE)."""

    name: str
    kind: str                      # "image" or "tabular"
    classes: tuple[str, ...]
    classes_from: str              # "dataset", "config", "test" or "folders"
    pool_file: str | None
    pool_x: NDArray[np.float32]
    pool_y: NDArray[np.int64] | None
    eval_x: NDArray[np.float32] | None
    eval_y: NDArray[np.int64] | None
    # the private rows and what is made of them are left out of the printed task
    private_x: NDArray[np.float32] | None = field(default=None, repr=False)
    private_y: NDArray[np.int64] | None = field(default=None, repr=False)
    preprocessing: dict[str, Any] | None = None
    private_content: str | None = field(default=None, repr=False)
    private_keys: NDArray[np.str_] | None = field(default=None, repr=False)
    private_rows: str | None = field(default=None, repr=False)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @cached_property
    def pool_fingerprint(self) -> str:
        """sha256 (hex) of what pool indices and vote columns refer to: the pool's content (a
        built-in dataset's files are checked by their checksums, so its name says it), its
        number of rows and the label set. Public, as all three are; the same wherever the
        files lie, so the teachers' votes and a student's pool can be matched by it."""
        content = (f"dataset {self.name}" if self.pool_file is None
                   else files.content_digest(self.pool_file))
        record = {"pool": content, "rows": len(self.pool_x), "classes": list(self.classes)}
        return hashlib.sha256(json.dumps(record, sort_keys=True).encode()).hexdigest()

    @cached_property
    def private_fingerprint(self) -> str | None:
        """sha256 (hex) of the private rows and labels, in order (None without them): a
        partition deals rows by position, so a resumed run must see the same rows in the same
        order. PRIVATE: a function of the private data, kept in private files only."""
        if self.private_x is None or self.private_y is None:
            return None
        return rows_fingerprint(self.private_x, self.private_y)

    @cached_property
    def private_data_fingerprint(self) -> str | None:
        """sha256 (hex) of the private data as given, however it is read (None without it): a
        user's file's content (``private_content``), a built-in dataset's name (its
        files are checked by their checksums). The same whichever label column, label set or
        public pool encodes it: the key of the ledgers that charge the data
        (``pate.aggregation.budget_registry``, docs/design.md rule 5). PRIVATE."""
        if self.private_x is None:
            return None
        content = (f"dataset {self.name}" if self.private_content is None
                   else self.private_content)
        return hashlib.sha256(f"private data {content}".encode()).hexdigest()

    @cached_property
    def private_rows_fingerprint(self) -> str | None:
        """sha256 (hex) of the private rows as read, in any order and without their labels
        (``rows_content_digest``; None without them): a second key of the ledgers that charge
        the data, the same for a built-in dataset, its images saved as an ``.npz`` (integers or
        floats in [0, 1]) or as a folder of image files at their size and mode, a CSV of
        numbers and its features saved as an ``.npz`` (``numeric_rows_digest``), and the same
        arrays given to the Python API. A CSV with a text or missing cell has its rows as
        encoded (with the pool's statistics and vocabularies) instead: those the Python API is
        given from ``load_task`` or a ``TableEncoder`` fitted on the same pool. PRIVATE."""
        if self.private_x is None:
            return None
        return private_rows_key(self.private_rows or rows_content_digest(self.private_x))

    @cached_property
    def private_encoded_rows_fingerprint(self) -> str | None:
        """The key of the private rows as encoded (``private_x``, in any order), where
        ``private_rows_fingerprint`` is of them as read before (a CSV of numbers, an ``.npz``
        of features, which the pool's statistics standardise): the key the Python API gives
        the same arrays, a third key of the ledgers. None otherwise: the second key is
        already of the rows as encoded. PRIVATE."""
        if self.private_x is None or self.private_rows is None:
            return None
        return private_rows_key(rows_content_digest(self.private_x))

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(d) for d in self.pool_x.shape[1:])


def data_kind(source: DataSource) -> str:
    """``image`` or ``tabular``, read from the public data's shape (the public file only)."""
    if isinstance(source, Benchmark):
        return "image"
    kind = files.kind_of(source.public)
    if kind == "npz":
        return "tabular" if files.read_npz(source.public, False)[0].ndim == 2 else "image"
    return "tabular" if kind == "csv" else "image"


def load_task(source: DataSource, need_private: bool = True) -> Task:
    """The task of ``source`` (``need_private=False`` leaves the private rows unread)."""
    if isinstance(source, Benchmark):
        return _benchmark(source, need_private)
    return _files(source, need_private)


def _benchmark(source: Benchmark, need_private: bool) -> Task:
    ds = load_dataset(source.name, source.data_dir, need_train=need_private)
    (pool_x, pool_y), (eval_x, eval_y) = public_split(ds, source.pool_size)
    kind = "image" if pool_x.ndim == 4 else "tabular"
    return Task(ds.name, kind, ds.classes, "dataset", None, pool_x, pool_y, eval_x, eval_y,
                ds.train_x, ds.train_y, benchmark_record(ds.name, pool_x.shape[1:], ds.pixel_max))


# --- a user's files -------------------------------------------------------------------------

def _odd_public(found: dict[str, Hashable], wanted: dict[str, tuple[str | None, bool]]) -> str:
    """The files of the other roles (``wanted[role][0]``, joined) where both agree on what
    ``found`` holds of each (its columns, its rows' shape) and the public file alone differs:
    the public file is the one to name; else ``""`` (each file that differs is named)."""
    others = {role: value for role, value in found.items() if role != "public"}
    if len(others) < 2 or len(set(others.values())) != 1 or found["public"] in others.values():
        return ""
    return " and ".join(str(wanted[role][0]) for role in others)


def _without_key(frames: dict[str, tuple[pd.DataFrame, NDArray | None]], key: str,
                 wanted: dict[str, tuple[str | None, bool]]
                 ) -> tuple[dict[str, tuple[pd.DataFrame, NDArray | None]], NDArray | None]:
    """The CSV ``frames`` without the ``key`` column (dropped where a public or test file has it
    too), and the private file's keys as text (None where the private file is not read). The
    private file must name whose every row is."""
    keys = None
    if "private" in frames:
        frame = frames["private"][0]
        path = wanted["private"][0]
        if key not in frame.columns:
            raise UserError(f"{path}: no key column {key!r} (columns: {', '.join(frame.columns)})")
        if frame[key].isna().any():  # name no private value, nor how many
            raise UserError(f"{path}: the key column {key!r} has missing values: every row must "
                            "say whose it is")
        keys = frame[key].to_numpy(dtype=str)
    out = {role: (frame.drop(columns=[key], errors="ignore"), labels)
           for role, (frame, labels) in frames.items()}
    for role, (frame, _) in out.items():
        if frame.shape[1] == 0:
            raise UserError(f"{wanted[role][0]}: no feature columns besides the label and the key")
    return out, keys


_Rows = dict[str, tuple[NDArray, NDArray | None]]  # (rows, labels or None) by role


@dataclass
class _Read:
    """What one format's reader made of a user's files: the rows and labels by role
    (``public``, ``test``, ``private``), the preprocessing fitted on the public rows, and, where
    the format gives them, the private data's digest as given, its key column and its rows'
    digest (``Task.private_content``, ``private_keys``, ``private_rows``)."""

    rows: _Rows = field(repr=False)  # the private ones among them
    preprocessing: dict[str, Any]
    private_content: str | None = field(default=None, repr=False)
    private_keys: NDArray | None = field(default=None, repr=False)
    private_rows: str | None = field(default=None, repr=False)
    row_keys: dict[str, NDArray] | None = field(default=None, repr=False)  # rows to compare as
    # read; None: as encoded


_Wanted = dict[str, tuple[str | None, bool]]  # role: (path, labelled)


def _read_csv(source: DataFiles, wanted: _Wanted) -> _Read:
    """CSV files: columns encoded as the public file's say (``TabularEncoder``)."""
    frames = {role: files.read_csv(path, source.label, labelled, role == "private")
              for role, (path, labelled) in wanted.items() if path}
    read = _Read({}, {})
    if "private" in frames:
        read.private_content = table_digest(*frames["private"], source.label)
    if source.key is not None:
        frames, read.private_keys = _without_key(frames, source.key, wanted)
    if "private" in frames:
        read.private_rows = numeric_rows_digest(frames["private"][0])
    columns = {role: frozenset(frame.columns) for role, (frame, _) in frames.items()}
    if others := _odd_public(columns, wanted):
        public, their = columns["public"], columns["test"]  # which agrees with private
        missing, extra = sorted(their - public), sorted(public - their)
        raise UserError(f"{source.public}: its columns differ from those of {others}, "
                        "which agree" + (f"; missing {', '.join(missing)}" if missing else "")
                        + (f"; not in them: {', '.join(extra)}" if extra else ""))
    encoder = TabularEncoder.fit(frames["public"][0])
    read.rows = {role: (encoder.transform(frame, str(wanted[role][0]), role == "private"), y)
                 for role, (frame, y) in frames.items()}
    order = list(frames["public"][0].columns)  # every file has them now (transform checked)
    read.row_keys = {role: frame_keys(frame, order) for role, (frame, _) in frames.items()}
    read.preprocessing = {"label": source.label, **encoder.describe(),
                          # left out of a file to score too (pate student predict)
                          **({"key": source.key} if source.key is not None else {})}
    return read


def _check_shapes(rows: _Rows, wanted: _Wanted) -> None:
    """Refuse files whose rows are not all of one shape, naming the file that differs (the
    public one where the others agree) and no count of rows. Only ``.npz`` files can differ:
    a CSV's columns are checked as read and its rows encoded alike, and images are brought to
    the public folder's size and mode."""
    pool_shape = list(rows["public"][0].shape[1:])
    shapes = {role: x.shape[1:] for role, (x, _) in rows.items()}
    if others := _odd_public(shapes, wanted):
        raise UserError(f"{wanted['public'][0]}: rows of shape {pool_shape} differ from those "
                        f"of {others}, which agree")
    for role, (x, _) in rows.items():
        if list(x.shape[1:]) != pool_shape:
            raise UserError(f"{wanted[role][0]}: rows of shape {list(x.shape[1:])} differ from "
                            f"the public data's {pool_shape}")


def _read_npz(source: DataFiles, wanted: _Wanted) -> _Read:
    """``.npz`` files: images as they are, feature rows standardised with the pool's
    statistics."""
    raw = {role: files.read_npz(path, labelled, role == "private")
           for role, (path, labelled) in wanted.items() if path}
    for role, (x, _) in raw.items():
        if x.ndim == 4 and channels_last(x.shape[1:]):
            warnings.warn(channels_last_advice(f"{wanted[role][0]}: x", x.shape[1:]),
                          stacklevel=4)
    read = _Read({role: (as_features(x, str(wanted[role][0])), y)
                  for role, (x, y) in raw.items()}, {})
    _check_shapes(read.rows, wanted)  # before the pool's statistics are applied to them
    if read.rows["public"][0].ndim == 2:  # features: standardised with the pool's statistics
        if "private" in read.rows:  # the second key is of the rows as given
            read.private_rows = rows_content_digest(read.rows["private"][0])
        standardiser = Standardiser.fit(read.rows["public"][0])
        read.rows = {role: (standardiser.transform(x), y) for role, (x, y) in read.rows.items()}
        read.preprocessing = standardiser.describe()
    return read


def _read_folders(source: DataFiles, wanted: _Wanted) -> _Read:
    """Folders of images: the public folder sets the colour mode and, unless
    ``data.image_size`` does, the size every image is brought to."""
    size = None if source.image_size is None else (source.image_size[1], source.image_size[0])
    x, _, mode, size = files.read_image_folder(source.public, False, None, size)
    rows: _Rows = {"public": (x, None)}
    for role in ("test", "private"):
        if role in wanted and wanted[role][0]:
            x, y, _, _ = files.read_image_folder(wanted[role][0], True, mode, size,
                                                 private=role == "private")
            rows[role] = (x, y)
    return _Read(rows, {"mode": mode, "height": size[1], "width": size[0]})


_READERS = {"csv": _read_csv, "npz": _read_npz, "folder": _read_folders}


def _files(source: DataFiles, need_private: bool) -> Task:
    of = {role: files.kind_of(p) for role, p in (("private", source.private),
                                                  ("public", source.public),
                                                  ("test", source.test)) if p}
    if len(set(of.values())) != 1:
        raise UserError("data.private, public and test must be of one format, got "
                        + ", ".join(f"{kind} ({role})" for role, kind in of.items()))
    kind = next(iter(of.values()))
    if problem := unused_setting_problem(source):  # refused where input comes in (flags, configs)
        warnings.warn(f"{problem}: ignored", UserWarning, stacklevel=3)
    name = Path(source.public).stem  # the public file's name: the private one's may say too much
    wanted: _Wanted = {"public": (source.public, False), "test": (source.test, True),
                       "private": (source.private, True)}
    if not need_private:
        del wanted["private"]
    private_content = (files.content_digest(source.private, private=True)
                       if need_private and kind != "csv" else None)
    read = _READERS[kind](source, wanted)
    reads = read.rows
    preprocessing = {"format": kind, "fitted_on": "public", **read.preprocessing}
    pool_x = reads["public"][0]
    if "private" in reads:
        check_apart(read.row_keys or {role: row_keys(x) for role, (x, _) in reads.items()},
                    {role: str(path) for role, (path, _) in wanted.items()}, stacklevel=3)
    test_y_raw = reads["test"][1] if "test" in reads else None
    classes, classes_from = label_set(source.classes, source.label, source.private,
                                      test_y_raw)
    if len(classes) < 2:
        raise UserError(f"the label set has {len(classes)} class(es); a task needs at least 2")
    indices = classes_from == "config"
    eval_x = eval_y = private_x = private_y = None
    if "test" in reads:
        eval_x = reads["test"][0]
        eval_y = encode_labels(reads["test"][1], classes, indices, str(source.test), False)
    if "private" in reads:
        private_x = reads["private"][0]
        private_y = encode_labels(reads["private"][1], classes, indices, str(source.private),
                                   True, SET_FROM[classes_from])
    return Task(name, "image" if pool_x.ndim == 4 else "tabular", classes, classes_from,
                source.public, pool_x, None, eval_x, eval_y, private_x, private_y,
                preprocessing, read.private_content or private_content, read.private_keys,
                read.private_rows)
