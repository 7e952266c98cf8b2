"""The privacy ledger: write-ahead records, idempotency, one race-free budget, consistency checks
and fail-closed behaviour (DESIGN.md privacy rules 4-7)."""

from __future__ import annotations

import sqlite3
import stat
import threading
from pathlib import Path

import numpy as np
import pytest

from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from pate.aggregation.aggregators import Aggregator, MechanismParams
from pate.aggregation.ledger import BudgetExhausted, Charge, Ledger, LedgerError, RequestConflict

ORDERS = default_orders()
VOTES = np.tile([200, 40, 10], (4, 1))


def charge(agg: Aggregator, request_id: str, digest: str = "d", rows: int = 4) -> Charge:
    out = agg.answer(VOTES[:rows])
    return Charge(request_id, digest, "client", '{"mechanism": "gnmax"}', out.labels,
                  out.branch, out.total_independent(), out.total_dependent(),
                  agg.worst_case_rdp(rows))


@pytest.fixture
def agg() -> Aggregator:
    return Aggregator(MechanismParams("gnmax", sigma=20.0))


def open_ledger(path: Path, budget: float = 2.0) -> Ledger:
    return Ledger(f"sqlite:///{path}", ORDERS, 1e-5, budget)


def test_records_replays_and_persists(tmp_path: Path, agg: Aggregator) -> None:
    db = tmp_path / "run" / "ledger.db"
    ledger = open_ledger(db)
    stored, budget = ledger.record(charge(agg, "r1"))
    assert not stored.replayed and budget.queries == 4 and budget.answered == 4
    again, budget2 = ledger.record(charge(agg, "r1"))  # new noise offered, old answer kept
    assert again.replayed
    np.testing.assert_array_equal(again.labels, stored.labels)
    assert budget2.queries == 4 and budget2.epsilon_spent == budget.epsilon_spent
    with pytest.raises(RequestConflict):
        ledger.record(charge(agg, "r1", digest="other"))
    ledger.close()

    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    reopened = open_ledger(db)
    assert reopened.lookup("r1").labels.tolist() == stored.labels.tolist()
    assert reopened.budget().queries == 4
    ind, dep = reopened.private_totals()
    np.testing.assert_allclose(ind, Aggregator(agg.params).worst_case_rdp(4))
    assert np.all(dep <= ind)
    expected, _ = epsilon_from_rdp(ind, ORDERS, 1e-5, "improved")
    assert reopened.budget().epsilon_spent == pytest.approx(expected)
    reopened.close()


def test_budget_refuses_and_spends_nothing(tmp_path: Path, agg: Aggregator) -> None:
    ledger = open_ledger(tmp_path / "ledger.db", budget=1.0)
    answered = 0
    with pytest.raises(BudgetExhausted):  # loop until refused
        for i in range(10_000):
            ledger.record(charge(agg, f"r{i}"))
            answered += 1
    before = ledger.budget()
    assert 0 < before.epsilon_spent <= 1.0 and before.queries == 4 * answered
    for i in range(5):
        with pytest.raises(BudgetExhausted):
            ledger.record(charge(agg, f"late{i}"))
    assert ledger.budget() == before
    ledger.close()


def test_reopening_with_other_settings_is_refused(tmp_path: Path) -> None:
    open_ledger(tmp_path / "ledger.db").close()
    with pytest.raises(LedgerError, match="delta"):
        Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS, 1e-6, 2.0)
    with pytest.raises(LedgerError, match="epsilon_budget"):
        Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS, 1e-5, 3.0)
    kept = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS[:50], 1e-5, 2.0)
    np.testing.assert_array_equal(kept.orders, ORDERS)  # a ledger keeps its own grid
    kept.close()


def test_tampered_totals_are_detected(tmp_path: Path, agg: Aggregator) -> None:
    db = tmp_path / "ledger.db"
    ledger = open_ledger(db)
    ledger.record(charge(agg, "r1"))
    ledger.close()
    con = sqlite3.connect(db)
    con.execute("UPDATE ledger_budget SET rdp_independent = ?",
                (np.zeros_like(ORDERS).tobytes(),))
    con.commit()
    con.close()
    with pytest.raises(LedgerError, match="inconsistent"):
        open_ledger(db)


def test_an_unrecordable_cost_releases_nothing(tmp_path: Path, agg: Aggregator) -> None:
    ledger = open_ledger(tmp_path / "ledger.db")
    good = charge(agg, "r1")
    bad = Charge("r2", "d", "c", "{}", good.labels, good.branch,
                 np.full_like(ORDERS, np.nan), good.rdp_dependent, good.worst_case_rdp)
    with pytest.raises(LedgerError, match="no label released"):
        ledger.record(bad)
    assert ledger.lookup("r2") is None and ledger.budget().queries == 0
    ledger.close()


def _hammer(ledger: Ledger, agg: Aggregator, prefix: str, n: int,
            outcomes: list[tuple[str, str]]) -> None:
    for i in range(n):
        rid = f"{prefix}-{i % (n // 2)}"  # every id is sent twice
        try:
            stored, _ = ledger.record(charge(agg, rid, rows=1))
            outcomes.append((rid, "replayed" if stored.replayed else "new"))
        except BudgetExhausted:
            outcomes.append((rid, "refused"))


@pytest.mark.parametrize("processes", [1, 2])
def test_concurrent_writers_share_one_budget(tmp_path: Path, agg: Aggregator,
                                             processes: int) -> None:
    """16 threads (over one or two Ledger objects on the same file, as two server processes
    would be) never exceed the budget and never charge an id twice."""
    ledgers = [open_ledger(tmp_path / "ledger.db", budget=0.8) for _ in range(processes)]
    outcomes: list[tuple[str, str]] = []
    threads = [threading.Thread(target=_hammer,
                                args=(ledgers[k % processes], agg, f"c{k}", 40, outcomes))
               for k in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    new = [rid for rid, o in outcomes if o == "new"]
    assert len(new) == len(set(new))  # no id charged twice
    assert any(o == "refused" for _, o in outcomes)
    budget = ledgers[0].budget()
    assert budget.queries == len(new) and budget.epsilon_spent <= 0.8
    ind, _ = ledgers[0].private_totals()
    np.testing.assert_allclose(ind, len(new) * agg.worst_case_rdp(1))
    for ledger in ledgers:
        ledger.close()
    open_ledger(tmp_path / "ledger.db", budget=0.8).close()  # consistent on reopening
