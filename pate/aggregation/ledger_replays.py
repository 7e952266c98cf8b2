"""The outcomes a ledger has released, by pool index, for replays (``pate.aggregation.ledger``:
a release is a release)."""

from __future__ import annotations

import math

import numpy as np
from numpy.typing import NDArray

# the fewest recent releases kept apart before they are merged into the rest
_LEAST_RECENT = 1024


class Replays:
    """The outcomes released so far in one scope (a mechanism's parameters and the votes), by
    pool index, packed as ``label << 8 | branch`` (label -1 = none), ``UNSET`` where none was:
    sorted arrays of the indices and their outcomes, so that a request's replays are one
    binary search and its new releases one merge, whatever its size and whatever the indices
    (a votes file's ``pool_index`` may hold any int64). The newest releases are kept in a
    small sorted part of their own, merged into the rest once they outnumber the square root
    of its size (and ``_LEAST_RECENT``): a charge then copies the small part, not every
    release before it, and the rest is copied once every square root of it."""

    UNSET = np.iinfo(np.int64).min

    def __init__(self) -> None:
        empty = np.zeros(0, np.int64)
        self._index, self._outcome = empty, empty  # all but the newest, sorted by index
        self._recent_index, self._recent_outcome = empty, empty  # the newest, sorted

    def lookup(self, indices: NDArray[np.int64]) -> NDArray[np.int64]:
        """The outcome released for each index, ``UNSET`` where none was."""
        out = np.full(indices.shape, self.UNSET, np.int64)
        for index, outcome in ((self._index, self._outcome),
                               (self._recent_index, self._recent_outcome)):
            if index.size:
                at = np.minimum(np.searchsorted(index, indices), index.size - 1)
                found = index[at] == indices
                out[found] = outcome[at[found]]
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
        at = np.searchsorted(self._recent_index, index)
        self._recent_index = np.insert(self._recent_index, at, index)
        self._recent_outcome = np.insert(self._recent_outcome, at, packed)
        if self._recent_index.size > max(_LEAST_RECENT, math.isqrt(self._index.size)):
            at = np.searchsorted(self._index, self._recent_index)
            self._index = np.insert(self._index, at, self._recent_index)
            self._outcome = np.insert(self._outcome, at, self._recent_outcome)
            self._recent_index = self._recent_outcome = np.zeros(0, np.int64)

    def forget(self, indices: NDArray[np.int64]) -> None:
        """Undo ``add`` of ``indices`` (released by a group that could not be recorded)."""
        keep = ~np.isin(self._index, indices)
        self._index, self._outcome = self._index[keep], self._outcome[keep]
        keep = ~np.isin(self._recent_index, indices)
        self._recent_index, self._recent_outcome = (self._recent_index[keep],
                                                    self._recent_outcome[keep])
