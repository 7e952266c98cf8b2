"""The privacy ledger: write-ahead records, idempotency, one race-free budget, consistency checks
and fail-closed behaviour (docs/design.md, privacy rules 4-7)."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import stat
import threading
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import GNMax
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from pate.aggregation import ledger as ledger_module
from pate.aggregation import ledger_totals
from pate.aggregation.aggregators import Aggregator
from pate.aggregation.label_requests import LabelsRequest
from pate.aggregation.ledger import Ledger
from pate.aggregation.ledger_records import Charge
from pate.aggregation.ledger_store import SCHEMA_VERSION
from pate.aggregation.ledger_totals import stored_budget
from pate.errors import BudgetExhausted, LedgerError, RequestConflict

ORDERS = default_orders()
VOTES = np.tile([200, 40, 10], (4, 1))


def charge(agg: Aggregator, request_id: str, digest: str = "d", rows: int = 4,
           client: str = "client", indices: list[int] | None = None) -> Charge:
    """A charge of ``rows`` queries; with ``indices`` (pool indices), a replayable one, from
    the votes whose digest is "votes"."""
    votes = VOTES[:rows] if indices is None else np.tile([200, 40, 10], (len(indices), 1))
    out = agg.answer(votes)
    return Charge(request_id, digest, client, '{"mechanism": "gnmax"}', out.labels,
                  out.branch, out.independent, out.dependent, agg.worst_case_rdp(1),
                  None if indices is None else np.asarray(indices, np.int64),
                  replayable=indices is not None, pool=None if indices is None else "votes")


@pytest.fixture
def agg() -> Aggregator:
    return Aggregator(GNMax(sigma=20.0))


def open_ledger(path: Path, budget: float = 2.0) -> Ledger:
    return Ledger(f"sqlite:///{path}", ORDERS, 1e-5, budget)


def test_records_replays_and_persists(tmp_path: Path, agg: Aggregator) -> None:
    db = tmp_path / "run" / "ledger.db"
    db.parent.mkdir(mode=0o700)
    ledger = open_ledger(db)
    stored, budget = ledger.record(charge(agg, "r1"))
    assert not stored.retried and budget.queries == 4 and budget.answered == 4
    again, budget2 = ledger.record(charge(agg, "r1"))  # new noise offered, old answer kept
    assert again.retried
    np.testing.assert_array_equal(again.labels, stored.labels)
    assert budget2.queries == 4 and budget2.epsilon_spent == budget.epsilon_spent
    with pytest.raises(RequestConflict):
        ledger.record(charge(agg, "r1", digest="other"))
    ledger.close()

    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    assert stat.S_IMODE(db.parent.stat().st_mode) == 0o700
    reopened = open_ledger(db)
    assert reopened.lookup("client", "r1").labels.tolist() == stored.labels.tolist()
    assert reopened.budget().queries == 4
    ind, dep = reopened.private_totals()
    np.testing.assert_allclose(ind, Aggregator(agg.mechanism).worst_case_rdp(4))
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


def test_reopening_with_other_settings_is_refused(tmp_path: Path, agg: Aggregator) -> None:
    """Refused; the error says a ledger that has charged nothing may be deleted, and never
    suggests a new ledger for a budget in use (one body of private data has one budget)."""
    open_ledger(tmp_path / "ledger.db").close()
    with pytest.raises(LedgerError, match=r"delta.*as it has charged nothing, remove it"):
        Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS, 1e-6, 2.0)
    kept = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS[:50], 1e-5, 2.0)
    np.testing.assert_array_equal(kept.orders, ORDERS)  # a ledger keeps its own grid
    kept.record(charge(agg, "r1"))
    kept.close()
    with pytest.raises(LedgerError, match=r"epsilon_budget.*a new ledger for the same data "
                                          r"would be a second one") as refused:
        Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", ORDERS, 1e-5, 3.0)
    assert "remove it" not in str(refused.value)


def test_a_ledger_is_named_once_and_for_good(tmp_path: Path) -> None:
    """``Budget.ledger``: 128 random bits made with the ledger, the same on every opening and
    as read without opening (``stored_budget``), another for another ledger; an older ledger
    without one is named on its first opening, and a refused opening names nothing."""
    first = open_ledger(tmp_path / "a.db")
    name = first.budget().ledger
    first.close()
    assert name is not None and len(name) == 32
    again = open_ledger(tmp_path / "a.db")
    assert again.budget().ledger == name and again.budget().as_json()["ledger"] == name
    again.close()
    assert stored_budget(f"sqlite:///{tmp_path / 'a.db'}").ledger == name
    other = open_ledger(tmp_path / "b.db")
    assert other.budget().ledger not in (None, name)
    other.close()
    with sqlite3.connect(tmp_path / "b.db") as db:  # as a version before names made it
        db.execute("DELETE FROM ledger_meta WHERE key = 'ledger_id'")
    db.close()
    assert stored_budget(f"sqlite:///{tmp_path / 'b.db'}").ledger is None
    with pytest.raises(LedgerError, match="delta"):
        Ledger(f"sqlite:///{tmp_path / 'b.db'}", ORDERS, 1e-6, 2.0)
    assert stored_budget(f"sqlite:///{tmp_path / 'b.db'}").ledger is None
    named = open_ledger(tmp_path / "b.db")
    assert named.budget().ledger not in (None, name)
    named.close()


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


@dataclass(frozen=True)
class PerQueryCosts:
    """A ``CostSource`` of an array ``[queries, orders]``."""

    rdp: np.ndarray

    def total(self) -> np.ndarray:
        return self.rdp.sum(axis=0)

    def per_query(self) -> np.ndarray:
        return self.rdp


def test_an_unrecordable_cost_releases_nothing(tmp_path: Path, agg: Aggregator) -> None:
    ledger = open_ledger(tmp_path / "ledger.db")
    good = charge(agg, "r1")
    bad = Charge("r2", "d", "c", "{}", good.labels, good.branch,
                 PerQueryCosts(np.full((4, ORDERS.size), np.nan)), good.rdp_dependent,
                 good.worst_case_rdp)
    with pytest.raises(LedgerError, match="no label released"):
        ledger.record(bad)
    assert ledger.lookup("c", "r2") is None and ledger.budget().queries == 0
    ledger.close()


def _hammer(ledger: Ledger, agg: Aggregator, prefix: str, n: int,
            outcomes: list[tuple[str, str]]) -> None:
    for i in range(n):
        rid = f"{prefix}-{i % (n // 2)}"  # every id is sent twice
        try:
            stored, _ = ledger.record(charge(agg, rid, rows=1))
            outcomes.append((rid, "replayed" if stored.retried else "new"))
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


def test_request_ids_are_scoped_to_their_client(tmp_path: Path, agg: Aggregator) -> None:
    """Another client's request_id is neither replayed to it nor reported taken (issue 28)."""
    ledger = open_ledger(tmp_path / "ledger.db")
    ledger.record(charge(agg, "r1", client="alice"))
    same, budget = ledger.record(charge(agg, "r1", client="bob"))  # same id and body
    assert not same.retried and budget.queries == 8  # bob's own request, charged
    other, budget = ledger.record(charge(agg, "r1", digest="other", client="carol"))
    assert not other.retried and budget.queries == 12  # no 409: nothing to learn
    with pytest.raises(RequestConflict):  # a client's own id reused with another body
        ledger.record(charge(agg, "r1", digest="other", client="alice"))
    assert ledger.lookup("alice", "r1") is not None and ledger.lookup("dave", "r1") is None
    ledger.close()


def test_a_pool_index_asked_again_replays_its_release(tmp_path: Path,
                                                      agg: Aggregator) -> None:
    """The first outcome of a pool index is replayed to any client, free (issue 28)."""
    db = tmp_path / "ledger.db"
    ledger = open_ledger(db)
    first, budget = ledger.record(charge(agg, "a1", client="alice", indices=[5, 6, 7]))
    assert first.fresh.all() and budget.queries == 3
    spent = budget.epsilon_spent
    second, budget = ledger.record(charge(agg, "b1", client="bob", indices=[7, 8, 5]))
    assert second.fresh.tolist() == [False, True, False] and budget.queries == 4
    assert second.labels[[0, 2]].tolist() == first.labels[[2, 0]].tolist()
    assert budget.epsilon_spent > spent
    fresh_noise = charge(agg, "b2", client="bob", indices=[5])
    fresh_noise = Charge(*[getattr(fresh_noise, f) for f in (
        "request_id", "body_digest", "client", "mechanism", "labels", "branch",
        "rdp_independent", "rdp_dependent", "worst_case_rdp", "indices")], replayable=False)
    third, budget = ledger.record(fresh_noise)  # explicit fresh noise: charged again
    assert third.fresh.all() and budget.queries == 5
    ledger.close()
    reopened = open_ledger(db)  # the releases survive a restart
    again, budget = reopened.record(charge(agg, "c1", client="carol", indices=[6]))
    assert not again.fresh.any() and again.labels[0] == first.labels[1] and budget.queries == 5
    reopened.close()


@pytest.mark.parametrize("rows_at_once", [1, 2, 1000])
def test_a_reopened_ledger_replays_the_first_releases_whatever_its_reading_blocks(
        tmp_path: Path, agg: Aggregator, monkeypatch: pytest.MonkeyPatch,
        rows_at_once: int) -> None:
    """A ledger reads its request rows in blocks (its totals, its replays): whatever their
    size, the totals check and each scope's first release of an index is the one replayed,
    an index asked twice in one request included."""
    db = tmp_path / "ledger.db"
    ledger = open_ledger(db, budget=100.0)
    rng = np.random.default_rng(0)
    first: dict[tuple[str, int], int] = {}
    asked = [("votes-a", [0, 1, 2]), ("votes-b", [1, 2]), ("votes-a", [2, 3]),
             ("votes-a", [4, 4]), ("votes-b", [0, 2]), ("votes-a", [5])]
    for k, (pool, indices) in enumerate(asked):
        labels = rng.permutation(3)[:len(indices)]  # labels that tell one release from another
        stored, _ = ledger.record(replace(charge(agg, f"r{k}", indices=indices), pool=pool,
                                          labels=labels))
        for index, label, fresh in zip(indices, stored.labels.tolist(), stored.fresh,
                                       strict=True):
            known = first.setdefault((pool, index), label)
            assert fresh or known == label  # a replay gives the first release
    assert first["votes-a", 4] != ledger.lookup("client", "r3").labels[1]  # released twice
    ledger.record(replace(charge(agg, "again", indices=[0, 1]), pool="votes-a",
                          labels=np.array([2, 2]), replayable=False))  # never replayed
    spent = ledger.budget()
    ledger.close()
    monkeypatch.setattr(ledger_module, "ROWS_AT_ONCE", rows_at_once)
    monkeypatch.setattr(ledger_totals, "ROWS_AT_ONCE", rows_at_once)
    reopened = open_ledger(db, budget=100.0)
    assert reopened.budget() == spent
    for pool, indices in (("votes-a", [5, 4, 3, 2, 1, 0]), ("votes-b", [0, 1, 2])):
        stored, budget = reopened.record(replace(charge(agg, f"re-{pool}", indices=indices),
                                                 pool=pool))
        assert not stored.fresh.any()
        assert stored.labels.tolist() == [first[pool, i] for i in indices]
    assert budget.queries == spent.queries
    reopened.close()


def test_a_request_row_with_arrays_out_of_step_is_refused(tmp_path: Path,
                                                          agg: Aggregator) -> None:
    """A request row whose arrays disagree in length (a cost curve off the orders grid, pool
    indices or branches of another count than its labels, labels cut short) makes the ledger
    inconsistent, said as such by its opening and by ``pate status``'s reading."""
    for column, value in (("rdp_dependent", np.zeros(ORDERS.size - 1).tobytes()),
                          ("indices", np.arange(2, dtype="<i8").tobytes()),
                          ("branch", np.ones(2, dtype="i1").tobytes()),
                          ("labels", b"\x00\x00")):
        db = tmp_path / f"{column}.db"
        ledger = open_ledger(db)
        ledger.record(charge(agg, "r1", indices=[5, 6, 7]))
        ledger.close()
        with sqlite3.connect(db) as con:
            con.execute(f"UPDATE ledger_requests SET {column} = ?", (value,))
        con.close()
        with pytest.raises(LedgerError, match="inconsistent"):
            open_ledger(db)
        with pytest.raises(LedgerError, match="inconsistent"):  # pate status reads it so too
            stored_budget(f"sqlite:///{db}")


def test_two_replicas_racing_on_one_index_charge_it_once(tmp_path: Path,
                                                         agg: Aggregator) -> None:
    """Two Ledger objects on one file (two processes) asking the same indices at once: one
    outcome per index, each charged once."""
    ledgers = [open_ledger(tmp_path / "ledger.db") for _ in range(2)]
    results: list[tuple[np.ndarray, np.ndarray]] = []
    lock = threading.Lock()

    def ask(k: int) -> None:
        for i in range(20):
            stored, _ = ledgers[k % 2].record(charge(agg, f"r{k}-{i}", client=f"c{k}",
                                                     indices=[i, i + 1]))
            with lock:
                results.append((np.array([i, i + 1]), stored.labels))

    threads = [threading.Thread(target=ask, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    seen: dict[int, int] = {}
    for indices, labels in results:
        for index, label in zip(indices.tolist(), labels.tolist(), strict=True):
            assert seen.setdefault(index, label) == label
    assert ledgers[0].budget().queries == 21  # indices 0..20, each charged once
    for ledger in ledgers:
        ledger.close()


def test_replays_are_scoped_by_the_votes_and_a_schema_2_ledger_migrates(
        tmp_path: Path, agg: Aggregator) -> None:
    """A pool index answered from some votes is replayed to requests answered from the same
    votes only: other votes on the same budget (teachers trained again) answer it afresh,
    charged. A schema-2 ledger gets the column; its rows replay to no request after."""
    db = tmp_path / "ledger.db"
    ledger = open_ledger(db, budget=100.0)
    ledger.record(replace(charge(agg, "r1", indices=[0, 1]), pool="votes-a"))
    replayed, _ = ledger.record(replace(charge(agg, "r2", indices=[1, 2]), pool="votes-a"))
    assert replayed.fresh.tolist() == [False, True]
    other, budget = ledger.record(replace(charge(agg, "r3", indices=[0, 1]), pool="votes-b"))
    assert other.fresh.all() and budget.queries == 5
    ledger.close()
    con = sqlite3.connect(db)  # back to the layout of schema 2
    con.execute("ALTER TABLE ledger_requests DROP COLUMN pool")
    con.execute("UPDATE ledger_meta SET value = '2' WHERE key = 'schema_version'")
    con.commit()
    con.close()
    ledger = open_ledger(db, budget=100.0)
    again, budget = ledger.record(replace(charge(agg, "r4", indices=[0]), pool="votes-a"))
    assert again.fresh.all() and budget.queries == 6
    unscoped, budget = ledger.record(replace(charge(agg, "r5", indices=[0]), pool=None))
    assert unscoped.fresh.all() and budget.queries == 7  # no votes digest: never replayed
    assert ledger.lookup("client", "r2").fresh.tolist() == [False, True]
    ledger.close()
    con = sqlite3.connect(db)
    assert con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'"
                       ).fetchone() == (str(SCHEMA_VERSION),)
    con.close()


def test_a_schema_1_ledger_migrates_on_open(tmp_path: Path, agg: Aggregator) -> None:
    """A ledger.db written with the schema-1 layout (request_id unique over all clients) gets
    the client-scoped ids and the replay columns, its totals kept (issue 28)."""
    db = tmp_path / "ledger.db"
    con = sqlite3.connect(db)
    con.executescript("""
        CREATE TABLE ledger_meta (key VARCHAR(64) NOT NULL PRIMARY KEY, value TEXT NOT NULL);
        CREATE TABLE ledger_budget (id INTEGER NOT NULL PRIMARY KEY, requests BIGINT NOT NULL,
            queries BIGINT NOT NULL, answered BIGINT NOT NULL, epsilon_spent FLOAT NOT NULL,
            rdp_independent BLOB NOT NULL, rdp_dependent BLOB NOT NULL);
        CREATE TABLE ledger_requests (seq INTEGER NOT NULL PRIMARY KEY AUTOINCREMENT,
            request_id VARCHAR(128) NOT NULL UNIQUE, body_digest VARCHAR(64) NOT NULL,
            client VARCHAR(64) NOT NULL, created FLOAT NOT NULL, mechanism TEXT NOT NULL,
            queries INTEGER NOT NULL, answered INTEGER NOT NULL, labels BLOB NOT NULL,
            branch BLOB NOT NULL, rdp_independent BLOB NOT NULL, rdp_dependent BLOB NOT NULL,
            epsilon_after FLOAT NOT NULL);
    """)
    out = agg.answer(VOTES)
    ind, dep = out.total_independent(), out.total_dependent()
    # the schema-1 code's digest of the body {"request_id": "r1", "indices": [0, 1, 2, 3]}
    old_digest = hashlib.sha256(b'{"indices":[0,1,2,3],"inputs":null,"student_probs":null}'
                                ).hexdigest()
    meta = {"schema_version": "1", "orders": json.dumps(ORDERS.tolist()), "delta": repr(1e-5),
            "epsilon_budget": repr(2.0), "conversion": "improved"}
    con.executemany("INSERT INTO ledger_meta VALUES (?, ?)", meta.items())
    spent = float(epsilon_from_rdp(ind, ORDERS, 1e-5, "improved")[0])
    labels = out.labels.astype("<i4").tobytes()
    con.execute("INSERT INTO ledger_budget VALUES (1, 1, 4, ?, ?, ?, ?)",
                (out.answered, spent, ind.tobytes(), dep.tobytes()))
    con.execute("INSERT INTO ledger_requests (request_id, body_digest, client, created, "
                "mechanism, queries, answered, labels, branch, rdp_independent, rdp_dependent, "
                "epsilon_after) VALUES ('r1', ?, 'alice', 0, '{}', 4, ?, ?, ?, ?, ?, ?)",
                (old_digest, out.answered, labels, out.branch.astype(np.int8).tobytes(),
                 ind.tobytes(), dep.tobytes(), spent))
    con.commit()
    con.close()
    ledger = open_ledger(db)
    assert ledger.lookup("alice", "r1").labels.tolist() == out.labels.tolist()
    assert ledger.lookup("bob", "r1") is None
    # alice retries with the same body: the digest of today's request matches the stored one
    digest = LabelsRequest.parse({"request_id": "r1", "indices": [0, 1, 2, 3]}).digest()
    again, budget = ledger.record(charge(agg, "r1", digest, client="alice"))
    assert again.retried and budget.queries == 4
    _, budget = ledger.record(charge(agg, "r1", client="bob"))
    assert budget.queries == 8
    ledger.close()
    con = sqlite3.connect(db)
    version = (
        con.execute("SELECT value FROM ledger_meta WHERE key = 'schema_version'").fetchone())
    con.close()
    assert version == (str(SCHEMA_VERSION),)
    open_ledger(db).close()  # consistent on reopening


def test_a_damaged_ledger_is_named_where_it_cannot_be_read(tmp_path: Path) -> None:
    """A ledger file cut short (a disk full, a copy stopped): the error says which ledger, so
    that a run resumed, a status or a service on several ledgers points at the file."""
    path = tmp_path / "ledger.db"
    open_ledger(path).close()
    with path.open("r+b") as fh:
        fh.truncate(4096)
    with pytest.raises(LedgerError, match=rf"^cannot read the ledger sqlite:///{path}: "):
        stored_budget(f"sqlite:///{path}")
