"""Reading a ledger's totals without opening it for writing: the check that its budget row is
the sum of its request rows, and its budget for ``pate status``."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import sqlalchemy as sa
from numpy.typing import NDArray

from pate.aggregation.ledger_records import AnswerBlock, Budget, budget_basis
from pate.aggregation.ledger_store import (
    ANSWERS_UNLIKE_COUNTS,
    F64,
    LEDGER_ID,
    ROWS_AT_ONCE,
    budget_table,
    canonical_url,
    engines,
    from_blob,
    from_blobs,
    inconsistent,
    requests_table,
    stored_totals,
)
from pate.errors import LedgerError


def check_totals(reader: sa.Engine) -> None:
    """Check that a ledger's budget row equals the sum of its request rows (in commit order, as
    they were added): every answer ever recorded is covered by the totals. ``LedgerError``
    otherwise; reads only (``Ledger.verify``, and ``stored_budget`` for ``pate status``). The
    rows are read ``ROWS_AT_ONCE`` at a time, each column's blobs as one array."""
    requests = queries = answered = 0
    with reader.connect() as conn:
        if conn.dialect.name == "postgresql":  # one snapshot for both reads, as SQLite's
            conn = conn.execution_options(isolation_level="REPEATABLE READ")  # BEGIN gives
        total = conn.execute(sa.select(budget_table).where(budget_table.c.id == 1)).one()
        ind = np.zeros_like(from_blob(total.rdp_independent, F64))
        dep = np.zeros_like(ind)
        rows = conn.execute(
            sa.select(requests_table.c.queries, requests_table.c.answered,
                      requests_table.c.labels, requests_table.c.branch,
                      requests_table.c.fresh, requests_table.c.indices,
                      requests_table.c.rdp_independent,
                      requests_table.c.rdp_dependent).order_by(requests_table.c.seq),
            execution_options={"yield_per": ROWS_AT_ONCE})
        for part in rows.partitions():
            counts, answers, labels, branch, fresh, indices, independent, dependent = zip(
                *part, strict=True)
            block = AnswerBlock.read(labels, branch, fresh, indices, outcomes=False)
            answered_by_row = block.per_row(block.fresh & (block.labels >= 0))
            if not (np.array_equal(block.queries, counts)
                    and np.array_equal(answered_by_row, answers)):
                raise inconsistent(ANSWERS_UNLIKE_COUNTS)
            ind = ind + _cost_curves(independent, ind.size).sum(axis=0)
            dep = dep + _cost_curves(dependent, ind.size).sum(axis=0)
            requests += block.queries.size
            queries += int(block.fresh.sum())
            answered += int(answered_by_row.sum())
    same = (total.requests == requests and total.queries == queries
            and total.answered == answered
            and np.allclose(from_blob(total.rdp_independent, F64), ind, rtol=1e-9, atol=0)
            and np.allclose(from_blob(total.rdp_dependent, F64), dep, rtol=1e-9, atol=0))
    if not same:
        raise inconsistent("the budget totals differ from the sum of the recorded requests")


def _cost_curves(blobs: Sequence[bytes], orders: int) -> NDArray[np.float64]:
    """Request rows' cost curves (one column), ``[rows, orders]``; ``LedgerError`` for a curve
    of another length than the budget's."""
    curves, sizes = from_blobs(blobs, F64)
    if np.any(sizes != orders):
        raise inconsistent("a request's costs are not on the ledger's orders")
    return curves.reshape(sizes.size, orders)


def stored_budget(url: str) -> Budget | None:
    """The budget of the ledger at ``url`` as ``Ledger.budget`` gives it, read without opening
    the ledger for writing (``ledger_store.stored_totals``: nothing created or migrated), its
    totals checked against its requests (``check_totals``); None when it holds none yet."""
    found = stored_totals(url)
    if found is None:
        return None
    _, reader = engines(url)
    try:
        check_totals(reader)
    except sa.exc.SQLAlchemyError as exc:
        raise LedgerError(f"cannot read the ledger {canonical_url(url)}: "
                          f"{exc.__class__.__name__}") from None
    finally:
        reader.dispose()
    return Budget(found["epsilon_budget"], found["delta"], found["epsilon_spent"],
                  budget_basis(found["conversion"], found["delta"]), found["queries"],
                  found["answered"], found.get(LEDGER_ID))
