"""What the privacy ledger takes and gives: a request's charge (its answers and their realised
costs), its stored answer, and the public state of the budget.

``pate.aggregation.ledger`` decides and records; these are the values that cross its edge.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
from numpy.typing import NDArray

from analysis.rdp import Conversion
from pate.aggregation.ledger_store import (
    ANSWERS_UNLIKE_COUNTS,
    I8,
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


def fresh_masks(blobs: Sequence[bytes | None], queries: NDArray[np.int64]) -> NDArray[np.bool_]:
    """``fresh_mask`` of many request rows, end to end (``queries``: each row's). A mask of
    another length than its row's queries is ``LedgerError``."""
    masks, sizes = from_blobs([b"\x01" * int(n) if b is None else b
                               for b, n in zip(blobs, queries, strict=True)], I8)
    if not np.array_equal(sizes, queries):
        raise inconsistent(ANSWERS_UNLIKE_COUNTS)
    return masks.astype(bool)


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
    rdp_dependent: CostSource              # private
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
