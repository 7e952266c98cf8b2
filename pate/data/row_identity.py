"""How rows of data are known: digests of private data for the ledgers' keys and a resumed
run's checks, and keys that compare rows whole, to find private rows given again as public ones.

Every digest of private rows is PRIVATE: it is a key, never shown or logged.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings

import numpy as np
import pandas as pd
from numpy.typing import NDArray

from pate.errors import UserError

DIGEST_ROWS = 4096  # rows copied at a time into rows_content_digest's hash


def rows_fingerprint(x: NDArray, y: NDArray) -> str:
    """sha256 (hex) of rows ``x`` (their shape, dtype and values) and labels ``y`` (as int64),
    in order: ``Task.private_fingerprint``, and the Python API's teachers'."""
    digest = hashlib.sha256(str((x.shape, x.dtype.str)).encode())
    digest.update(np.ascontiguousarray(x).data)
    digest.update(np.ascontiguousarray(y, np.int64).data)
    return digest.hexdigest()


def rows_content_digest(x: NDArray) -> str:
    """sha256 (hex) of the rows ``x`` as a set with repeats: their shape and dtype, then each
    row's bytes, the rows in the order of their bytes. The same in any order of the rows, and
    without the labels: a second key of the ledgers of one body of private data
    (``Task.private_rows_fingerprint``), under which its copies in other formats meet. Sorted by
    index and hashed ``DIGEST_ROWS`` rows at a time, so no second copy of the data is made.
    PRIVATE for private rows."""
    rows = np.ascontiguousarray(x).reshape(len(x), math.prod(x.shape[1:]))
    digest = hashlib.sha256(str((x.shape[1:], x.dtype.str)).encode())
    if rows.size:
        order = np.argsort(rows.view(np.dtype((np.void, rows.shape[1] * rows.itemsize))).ravel(),
                           kind="stable")
        for start in range(0, len(order), DIGEST_ROWS):
            digest.update(rows[order[start:start + DIGEST_ROWS]].tobytes())
    return digest.hexdigest()


def numeric_rows_digest(frame: pd.DataFrame) -> str | None:
    """``rows_content_digest`` of a table's cells as float32 rows, its columns in their order,
    where every cell is a finite number (None where one is text or missing): the rows an
    ``.npz`` of the same features holds (``x``, one row per line, the label apart), so that a
    CSV and its conversion share the ledgers' second key. PRIVATE for the private file."""
    try:
        numbers = frame.apply(pd.to_numeric)
    except (ValueError, TypeError):
        return None
    with np.errstate(over="ignore"):  # beyond float32 becomes inf, refused below
        rows = numbers.to_numpy(np.float32)
    return rows_content_digest(rows) if np.isfinite(rows).all() else None


def private_rows_key(digest: str) -> str:
    """The registry's key of private rows whose ``rows_content_digest`` is ``digest``: the
    same for a run's data and the Python API's arrays. PRIVATE."""
    return hashlib.sha256(f"private rows {digest}".encode()).hexdigest()


def table_digest(frame: pd.DataFrame, labels: NDArray | None = None,
                 label: str | None = None) -> str:
    """sha256 (hex) of a table's cells as read (text, missing as such), its ``labels`` column
    ``label`` among them, whatever the order of its rows and columns, whichever column is the
    label and however the file was written (line ends, quotes, spaces around values): the
    rows, each its cells in the order of the sorted column names, sorted. PRIVATE for the
    private file."""
    if labels is not None and label is not None:
        frame = frame.assign(**{label: pd.Series(labels, index=frame.index).astype(str)})
    columns = sorted(frame.columns)
    cells = [frame[c].astype(str).where(frame[c].notna(), "\x00") for c in columns]
    rows = (cells[0].str.cat(cells[1:], sep="\x1f")  # cells between unit separators
            if len(cells) > 1 else cells[0])
    digest = hashlib.sha256(json.dumps(columns).encode())
    digest.update("\x1e".join(np.sort(rows.to_numpy(dtype=str))).encode())
    return digest.hexdigest()


def row_keys(x: NDArray) -> NDArray:
    """Each row's bytes as one value, so that rows compare whole (``np.isin``)."""
    flat = np.ascontiguousarray(x.reshape(len(x), -1))
    return flat.view(np.dtype((np.void, flat.dtype.itemsize * flat.shape[1]))).ravel()


def frame_keys(frame: pd.DataFrame, columns: list[str]) -> NDArray[np.uint64]:
    """Each row of a table as read, its ``columns`` in that order, as one 64-bit hash (pandas'
    ``hash_pandas_object``): rows compare as the file gives them, not as encoded (an encoding
    maps the categories the pool lacks alike)."""
    return pd.util.hash_pandas_object(frame[columns], index=False).to_numpy()


# What a public role's rows found among the private rows would do.
_SHARED_ROWS = {
    "public": ("the student trains on the pool, so they would reach the published student "
               "without the privacy guarantee"),
    "test": "the student's accuracy would be measured on rows the teachers learnt from",
}


def check_apart(keys: dict[str, NDArray], names: dict[str, str], stacklevel: int = 2) -> None:
    """Refuse a public pool or test data whose rows (``keys``: one value per row, by role:
    ``private``, ``public``, ``test``; :func:`row_keys`) are all private rows: the private data
    given again; warn where some are (rows a table of few columns repeats by chance, or private
    records copied in). ``names`` says what to call each role's data. Neither says how many: a
    count of private rows."""
    for role, harm in _SHARED_ROWS.items():
        if role not in keys or not len(keys[role]):
            continue
        shared = np.isin(keys[role], keys["private"])
        if shared.all():
            raise UserError(f"{names[role]}: its rows are all rows of the private data; {harm}")
        if shared.any():
            warnings.warn(f"{names[role]}: some of its rows are also rows of the private data: "
                          f"{harm}; unless they repeat by chance, take them out",
                          stacklevel=stacklevel + 1)
