"""What the privacy ledger takes and gives: a request's charge (its answers and their realised
costs), its stored answer, and the public state of the budget.

``pate.aggregation.ledger`` decides and records; these are the values that cross its edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from analysis.rdp import Conversion
from pate.aggregation.ledger_store import (
    ANSWERS_UNLIKE_COUNTS,
    I8,
    I32,
    I64,
    blob_sizes,
    from_blob,
    from_blobs,
    inconsistent,
)


@dataclass(frozen=True)
class Budget:
    """The public state of the budget (GET /v1/budget)."""

    epsilon_budget: float
    delta: float
    epsilon_spent: float
    basis: str
    queries: int
    answered: int
    ledger: str | None = None  # which ledger: a random name made with it (``LEDGER_ID``)

    def as_json(self) -> dict[str, Any]:
        return {"epsilon_budget": self.epsilon_budget, "delta": self.delta,
                "epsilon_spent": self.epsilon_spent, "basis": self.basis,
                "queries": self.queries, "answered": self.answered, "ledger": self.ledger}


def budget_basis(conversion: Conversion, delta: float) -> str:
    """What a ledger's epsilon spent is (``Budget.basis``)."""
    return (f"data-independent RDP, {conversion} conversion at delta={delta:g}; a batch is "
            "refused unless its worst case fits")


def fresh_mask(blob: bytes | None, queries: int) -> NDArray[np.bool_]:
    """A request row's ``fresh`` column: which of its ``queries`` were answered afresh and
    charged (all of them in a row written before the column existed, ``None``)."""
    return np.ones(queries, bool) if blob is None else from_blob(blob, I8).astype(bool)


@dataclass(frozen=True)
class AnswerBlock:
    """The answers of request rows read together (``ledger_store.ROWS_AT_ONCE`` at a time),
    each array the rows' end to end: each row's number of ``queries``, then per query its
    ``labels`` and whether it was charged afresh (``fresh``, ``fresh_mask``), and, where read,
    its ``branch`` and the pool ``indices`` of the rows that have them (all of them for
    replayable rows)."""

    queries: NDArray[np.int64]
    labels: NDArray[np.int32]
    fresh: NDArray[np.bool_]
    branch: NDArray[np.int8] | None
    indices: NDArray[np.int64] | None

    @classmethod
    def read(cls, labels: Sequence[bytes], branch: Sequence[bytes],
             fresh: Sequence[bytes | None], indices: Sequence[bytes | None],
             outcomes: bool = True) -> AnswerBlock:
        """The rows' blob columns, decoded at once (the branches and the indices only where
        ``outcomes``: otherwise their lengths are checked, unread); ``LedgerError`` for a row
        whose arrays differ in length."""
        label_array, queries = from_blobs(labels, I32)
        fresh_array, fresh_sizes = from_blobs(
            [b"\x01" * int(n) if b is None else b for b, n in zip(fresh, queries, strict=True)],
            I8)
        has_indices = np.fromiter((b is not None for b in indices), bool, len(indices))
        index_blobs = [b for b in indices if b is not None]
        branch_array = index_array = None
        if outcomes:
            branch_array, branch_sizes = from_blobs(branch, I8)
            index_array, index_sizes = from_blobs(index_blobs, I64)
        else:
            branch_sizes, index_sizes = blob_sizes(branch, I8), blob_sizes(index_blobs, I64)
        if not (np.array_equal(branch_sizes, queries) and np.array_equal(fresh_sizes, queries)
                and np.array_equal(index_sizes, queries[has_indices])):
            raise inconsistent(ANSWERS_UNLIKE_COUNTS)
        return cls(queries, label_array, fresh_array.astype(bool), branch_array, index_array)

    def per_row(self, marks: NDArray[np.bool_]) -> NDArray[np.int64]:
        """How many of each row's queries ``marks`` (one per query) marks."""
        counts = np.zeros(self.queries.size, np.int64)
        asked = self.queries > 0
        starts = np.cumsum(self.queries) - self.queries
        if asked.any():
            counts[asked] = np.add.reduceat(marks, starts[asked], dtype=np.int64)
        return counts


class CostSource(Protocol):
    """Each query's RDP on the orders grid, as the ledger reads it
    (``pate.aggregation.aggregators.QueryCosts`` is one)."""

    def total(self) -> NDArray[np.float64]:
        """The sum over the queries, ``[orders]``."""
        ...

    def per_query(self) -> NDArray[np.float64]:
        """``[queries, orders]``."""
        ...


@dataclass(frozen=True)
class Charge:
    """What a request asks the ledger to record: its answers and their realised costs, and the
    data-independent worst case of its batch on which the budget decision is taken."""

    request_id: str                   # the client's own id
    body_digest: str
    client: str
    mechanism: str                    # the mechanism's public parameters, JSON
    labels: NDArray[np.int64]
    branch: NDArray[np.int8]
    rdp_independent: CostSource
    rdp_dependent: CostSource = field(repr=False)  # private
    worst_case_rdp: NDArray[np.float64]    # one query's data-independent worst case [orders]
    indices: NDArray[np.int64] | None = None   # the pool indices asked (None: new inputs)
    replayable: bool = False          # may get and store replays of earlier releases
    pool: str | None = None           # the digest of the votes answered from (replay scope;
    #                                   None: not replayable)

    @property
    def key(self) -> str:
        """The ledger's key of the request: its id, scoped to its client."""
        return f"{self.client}/{self.request_id}"


@dataclass(frozen=True)
class Stored:
    """A request's answer as recorded in the ledger: ``fresh`` marks the queries answered (and
    charged) by this request, the others replay an earlier release; ``retried`` when the whole
    request was recorded before (same client and request_id)."""

    request_id: str
    body_digest: str
    labels: NDArray[np.int64]
    branch: NDArray[np.int8]
    fresh: NDArray[np.bool_]
    retried: bool = False

    @property
    def answered(self) -> int:
        return int(np.count_nonzero(self.labels >= 0))
