"""The outcomes a ledger has released, by pool index, for replays (``pate.aggregation.ledger``:
a release is a release)."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


class Replays:
    """The outcomes released so far in one scope (a mechanism's parameters and the votes), by
    pool index, packed as ``label << 8 | branch`` (label -1 = none), ``UNSET`` where none was:
    sorted arrays of the indices and their outcomes, so that a request's replays are one
    binary search and its new releases one merge, whatever its size and whatever the indices
    (a votes file's ``pool_index`` may hold any int64)."""

    UNSET = np.iinfo(np.int64).min

    def __init__(self) -> None:
        self._index = np.zeros(0, np.int64)
        self._outcome = np.zeros(0, np.int64)

    def lookup(self, indices: NDArray[np.int64]) -> NDArray[np.int64]:
        """The outcome released for each index, ``UNSET`` where none was."""
        out = np.full(indices.shape, self.UNSET, np.int64)
        if self._index.size:
            at = np.minimum(np.searchsorted(self._index, indices), self._index.size - 1)
            found = self._index[at] == indices
            out[found] = self._outcome[at[found]]
        return out

    def add(self, indices: NDArray[np.int64], labels: NDArray[np.integer],
            branch: NDArray[np.integer]) -> None:
        """Keep the outcomes of indices released for the first time (the first release of an
        index stands: a later one, by another process, is not replayed)."""
        index, first = np.unique(indices, return_index=True)
        new = self.lookup(index) == self.UNSET
        index, first = index[new], first[new]
        if not index.size:
            return
        packed = (labels[first].astype(np.int64) << 8) | branch[first].astype(np.int64)
        at = np.searchsorted(self._index, index)
        self._index = np.insert(self._index, at, index)
        self._outcome = np.insert(self._outcome, at, packed)

    def forget(self, indices: NDArray[np.int64]) -> None:
        """Undo ``add`` of ``indices`` (released by a group that could not be recorded)."""
        keep = ~np.isin(self._index, indices)
        self._index, self._outcome = self._index[keep], self._outcome[keep]
