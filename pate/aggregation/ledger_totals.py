"""Reading a ledger's totals without opening it for writing: the check that its budget row is
the sum of its request rows, and its budget for ``pate status``."""

from __future__ import annotations

import numpy as np
import sqlalchemy as sa

from pate.aggregation.ledger_records import Budget, budget_basis, fresh_mask
from pate.aggregation.ledger_store import (
    F64,
    I32,
    LEDGER_ID,
    budget_table,
    canonical_url,
    engines,
    from_blob,
    requests_table,
    stored_totals,
)
from pate.errors import LedgerError


def check_totals(reader: sa.Engine) -> None:
    """Check that a ledger's budget row equals the sum of its request rows (in commit order, as
    they were added): every answer ever recorded is covered by the totals. ``LedgerError``
    otherwise; reads only (``Ledger.verify``, and ``stored_budget`` for ``pate status``)."""
    requests = queries = answered = 0
    with reader.connect() as conn:
        if conn.dialect.name == "postgresql":  # one snapshot for both reads, as SQLite's
            conn = conn.execution_options(isolation_level="REPEATABLE READ")  # BEGIN gives
        total = conn.execute(sa.select(budget_table).where(budget_table.c.id == 1)).one()
        ind = np.zeros_like(from_blob(total.rdp_independent, F64))
        dep = np.zeros_like(ind)
        rows = conn.execution_options(yield_per=1000).execute(
            sa.select(requests_table.c.queries, requests_table.c.answered,
                      requests_table.c.labels, requests_table.c.fresh,
                      requests_table.c.rdp_independent,
                      requests_table.c.rdp_dependent).order_by(requests_table.c.seq))
        for row in rows:
            labels = from_blob(row.labels, I32)
            fresh = fresh_mask(row.fresh, labels.size)
            if (labels.size != row.queries or fresh.size != labels.size
                    or np.count_nonzero(labels[fresh] >= 0) != row.answered):
                raise LedgerError("the ledger is inconsistent: a request's answers do not "
                                  "match its counts")
            ind = ind + from_blob(row.rdp_independent, F64)
            dep = dep + from_blob(row.rdp_dependent, F64)
            requests += 1
            queries += int(fresh.sum())
            answered += row.answered
    same = (total.requests == requests and total.queries == queries
            and total.answered == answered
            and np.allclose(from_blob(total.rdp_independent, F64), ind, rtol=1e-9, atol=0)
            and np.allclose(from_blob(total.rdp_dependent, F64), dep, rtol=1e-9, atol=0))
    if not same:
        raise LedgerError("the ledger is inconsistent: the budget totals differ from the sum "
                          "of the recorded requests")


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
