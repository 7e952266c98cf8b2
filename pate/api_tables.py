"""Tables from Python: feature rows of pandas data frames, encoded as ``pate run`` encodes a
CSV file (:class:`pate.data.preprocessing.TabularEncoder`), for :mod:`pate.api`.

The encoder is fitted on the public pool alone: number columns standardised with the pool's mean
and deviation, text columns one-hot over the pool's values plus one slot for any other value.
Fitting it on the private rows would make their statistics part of every model's input, a
release of them (docs/design.md, "Your own data").
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.data import files
from pate.data.preprocessing import TabularEncoder
from pate.errors import UserError


def _as_text(frame: Any, name: str) -> pd.DataFrame:
    """``frame``'s cells as a CSV file's are read (``files.text_cells``: text without
    surrounding spaces, ``NaN`` where missing), so a column is of numbers exactly when every
    value is one, whatever its dtype."""
    if not isinstance(frame, pd.DataFrame):
        raise UserError(f"{name} must be a pandas DataFrame, got {type(frame).__name__}")
    if frame.empty:
        raise UserError(f"{name} has no rows or no columns")
    columns = [str(c) for c in frame.columns]  # as a CSV file's header reads back
    if len(set(columns)) != len(columns):
        repeated = sorted({c for c in columns if columns.count(c) > 1})
        raise UserError(f"{name} names a column twice: {', '.join(repeated)}")
    text = files.text_cells(frame.astype(str).where(frame.notna()))  # str() of each, by column
    text.columns = columns
    return text


class TableEncoder:
    """Feature rows ``float32 [n, d]`` of data frames, fitted on the public pool: ``fit(public)``
    then ``transform(frame)`` for the private rows, the pool and new rows alike. The ``label``
    column (required: a label encoded as a feature would be learnt from itself, and silently)
    is left out of each frame that holds it, unread, as ``pate run`` leaves out ``data.label``;
    a frame that spells it otherwise (``Y`` for ``y``) is refused. ``columns_`` and ``width_``
    (d) say what it learnt."""

    def __init__(self, label: str) -> None:
        if not isinstance(label, str) or not label:
            raise UserError(f"label must be a column name, got {label!r}")
        self.label = label
        self.encoder_: TabularEncoder | None = None

    @classmethod
    def from_record(cls, record: dict[str, Any]) -> TableEncoder:
        """The encoder of a ``record`` of CSV data as ``pate run`` and ``load_task`` make it
        (``Task.preprocessing``; a run's ``student/schema.json`` holds it as
        ``preprocessing``), fitted: what ``record()`` returns."""
        if not isinstance(record, dict) or record.get("format") != "csv":
            raise UserError("the record must be one of CSV data (format 'csv'): a Task's "
                            "preprocessing, or TableEncoder.record()")
        try:
            encoder = cls(record["label"])
            encoder.encoder_ = TabularEncoder.from_record(record)
        except (KeyError, TypeError) as exc:
            raise UserError(f"the record of CSV data lacks {exc}: not one pate wrote") from None
        return encoder

    def _features(self, frame: pd.DataFrame, name: str) -> pd.DataFrame:
        """``frame``'s cells as text (``_as_text``) without the label column."""
        text = _as_text(frame, name)
        if self.label not in text.columns:
            spelt = [c for c in text.columns if c.strip().casefold() == self.label.casefold()]
            if spelt:
                raise UserError(f"{name} has no column {self.label!r}, the label left out of "
                                f"the features, but has {spelt[0]!r}: give TableEncoder the "
                                "label column's name as the frames spell it")
        return text.drop(columns=[self.label], errors="ignore")

    def fit(self, public: pd.DataFrame) -> TableEncoder:
        """Learn the columns, the number columns' means and deviations and the text columns'
        values from the public pool (its labels, if it has them, are not read)."""
        features = self._features(public, "public")
        if features.shape[1] == 0:
            raise UserError(f"public has no columns besides the label {self.label!r}")
        self.encoder_ = TabularEncoder.fit(features)
        return self

    def record(self) -> dict[str, Any]:
        """How a raw ``.csv`` row becomes features, as ``pate run`` records it of its data
        (public: the pool's columns, statistics and vocabularies, and the label column a
        file to score may hold, left out)."""
        return {"format": "csv", "label": self.label, **self.columns_}

    def transform(self, frame: pd.DataFrame, *, private: bool = True) -> NDArray[np.float32]:
        """The rows of ``frame`` (the pool's columns, in any order) as features; a missing
        number is the pool's mean, a missing or unseen text value the "other" slot. An error
        about a cell names no row unless ``private=False`` says the frame is public: a place
        in private data is private (the last row's is the count of records), and an error
        line may reach shared logs."""
        if self.encoder_ is None:
            raise UserError("this TableEncoder is not fitted: call fit(public) first")
        return self.encoder_.transform(self._features(frame, "frame"), "frame", private)

    def fit_transform(self, public: pd.DataFrame) -> NDArray[np.float32]:
        return self.fit(public).transform(public, private=False)

    @property
    def columns_(self) -> dict[str, Any]:
        """The encoding, as ``student/schema.json`` records it (public)."""
        if self.encoder_ is None:
            raise UserError("this TableEncoder is not fitted: call fit(public) first")
        return self.encoder_.describe()

    @property
    def width_(self) -> int:
        return int(self.columns_["features"])
