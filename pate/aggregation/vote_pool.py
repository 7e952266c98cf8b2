"""The teachers' votes on the registered public pool, addressed by pool index (PRIVATE: the
votes never leave the service, docs/design.md, privacy rule 2)."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pate.data.votes_file import (
    load_pool_fingerprint,
    load_private_keys,
    load_private_records,
    load_votes_with_index,
)
from pate.errors import UserError


class VotePool:
    """Votes ``[rows, classes]`` and the pool index of each row (default ``0..rows-1``); looks up
    the rows of given pool indices in O(log rows) each (a sorted copy of the index).
    ``fingerprint``: the ``Task.pool_fingerprint`` of the pool the votes were cast on, if
    known; ``private_records``: the number of private records the teachers learnt from, if
    known (the delta the votes may be charged at depends on it); ``private_fingerprint``: the
    private data's (``Task.private_data_fingerprint``, PRIVATE), if known,
    ``former_private_fingerprint`` the key older versions knew it by (its rows' in order), and
    ``private_rows_fingerprint`` its rows' in any order and format
    (``Task.private_rows_fingerprint``), the second key of its ledgers, and
    ``private_encoded_rows_fingerprint`` the third (``Task.private_encoded_rows_fingerprint``)."""

    def __init__(self, votes: NDArray[np.integer], pool_index: NDArray[np.integer] | None = None,
                 fingerprint: str | None = None, private_records: int | None = None,
                 private_fingerprint: str | None = None,
                 former_private_fingerprint: str | None = None,
                 private_rows_fingerprint: str | None = None,
                 private_encoded_rows_fingerprint: str | None = None) -> None:
        self.votes = np.asarray(votes, np.int64)
        self.fingerprint = fingerprint
        self.private_records = private_records
        self.private_fingerprint = private_fingerprint
        self.former_private_fingerprint = former_private_fingerprint
        self.private_rows_fingerprint = private_rows_fingerprint
        self.private_encoded_rows_fingerprint = private_encoded_rows_fingerprint
        index = (np.arange(len(self.votes)) if pool_index is None
                 else np.asarray(pool_index, np.int64))
        if index.shape != (len(self.votes),):
            raise UserError(f"pool_index must be 1-d with one entry per votes row, got shape "
                            f"{list(index.shape)}")
        self._order = np.argsort(index, kind="stable")
        self._sorted = index[self._order]
        if np.any(np.diff(self._sorted) == 0):
            raise UserError("pool_index has repeated entries")

    @classmethod
    def from_file(cls, path: str | Path) -> VotePool:
        """``.npy`` votes, or ``.npz`` with ``votes`` and optional ``pool_index``,
        ``pool_fingerprint``, ``private_records`` and ``private_fingerprint`` (votes.npz)."""
        return cls(*load_votes_with_index(path), load_pool_fingerprint(path),
                   load_private_records(path), *load_private_keys(path))

    @functools.cached_property
    def digest(self) -> str:
        """sha256 of each pool index and its votes, in index order (however the rows are
        stored): which votes an answer came from (the ledger's replay scope; PRIVATE, kept in
        the ledger only)."""
        digest = hashlib.sha256(memoryview(np.ascontiguousarray(self._sorted)))
        digest.update(memoryview(np.ascontiguousarray(self.votes[self._order])))
        return digest.hexdigest()

    @property
    def pool_indices(self) -> NDArray[np.int64]:
        """The pool indices the votes cover, sorted (public: they name rows of the public
        pool)."""
        return self._sorted

    @property
    def teachers(self) -> int:
        """The number of teachers, every row's sum (public: the votes file's loader checks that
        the rows agree)."""
        return int(self.votes[0].sum()) if len(self.votes) else 0

    @property
    def classes(self) -> int:
        """The number of classes (columns of the votes)."""
        return int(self.votes.shape[1])

    def describe(self) -> dict[str, Any]:
        """What a student may know of the votes to check that they are its pool's (GET
        /v1/pool): the pool indices' count and range, the number of teachers and classes, the
        fingerprint. Public: no vote is read but every row's sum."""
        index = self._sorted
        return {"rows": int(index.size),
                "first_index": int(index[0]) if index.size else None,
                "last_index": int(index[-1]) if index.size else None,
                "teachers": self.teachers, "classes": self.classes,
                "fingerprint": self.fingerprint}

    def rows(self, indices: NDArray[np.int64]) -> NDArray[np.intp]:
        """Rows of ``votes`` holding the given pool indices. ``UserError`` for an index outside
        the pool or repeated within ``indices`` (the message names only the request's own
        indices)."""
        pos = np.searchsorted(self._sorted, indices)
        pos_c = np.minimum(pos, self._sorted.size - 1)
        unknown = self._sorted[pos_c] != indices
        if unknown.any():
            bad = indices[unknown][:5].tolist()
            raise UserError(f"indices not in the registered pool: {bad}")
        if np.unique(indices).size != indices.size:
            raise UserError("indices must not repeat within a request")
        return self._order[pos_c]
