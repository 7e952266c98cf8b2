"""The privacy ledger: every request and every cost, committed durably before an answer leaves.

DESIGN.md privacy rules 4-7. One ledger belongs to one body of private data: a single budget row
holds the running totals for all clients; each request row holds its request_id, the digest of its
body, its answers and its realised cost (data-independent and data-dependent RDP on the orders
grid, the batch's sum: RDP composes by addition, Mironov 2017, Prop. 1).

- Write-ahead: the request row and the new totals are committed in one transaction, and the caller
  releases the answer only after the commit returns. SQLite runs in WAL mode with
  ``synchronous=FULL``, so a commit is on disk (WAL fsynced) when it returns: it survives a crash
  of the process and of the machine. PostgreSQL commits with its default ``synchronous_commit``.
- Idempotent: a request_id seen before returns its stored answer (same body digest) or a conflict.
- One budget without races: every transaction first takes the write lock (SQLite:
  ``BEGIN IMMEDIATE``; PostgreSQL: ``SELECT ... FOR UPDATE`` on the budget row), then checks the
  request_id and the budget, so concurrent writers, in this process or another, serialise.
- The public decision (refusing at the budget) uses the data-independent bound of the batch's worst
  case (rule 6): it depends on no private data. The data-dependent RDP is stored but never leaves
  this module except through ``private_totals``.
- Fail closed (rule 7): any error in a transaction rolls it back and the caller releases nothing.
- Group commit: one writer thread takes the queued charges together into one transaction, which
  keeps the fsync cost per commit, not per request, under concurrent load.
"""

from __future__ import annotations

import json
import os
import queue
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from numpy.typing import NDArray

from analysis.rdp import CONVERSIONS, Conversion, epsilon_curve
from pate.io import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

SCHEMA_VERSION = 1
_GROUP_LIMIT = 256  # charges per group commit

metadata = sa.MetaData()

meta_table = sa.Table(
    "ledger_meta", metadata,
    sa.Column("key", sa.String(64), primary_key=True),
    sa.Column("value", sa.Text, nullable=False),
)

budget_table = sa.Table(
    "ledger_budget", metadata,
    sa.Column("id", sa.Integer, primary_key=True, autoincrement=False),
    sa.Column("requests", sa.BigInteger, nullable=False),
    sa.Column("queries", sa.BigInteger, nullable=False),
    sa.Column("answered", sa.BigInteger, nullable=False),
    sa.Column("epsilon_spent", sa.Float, nullable=False),
    sa.Column("rdp_independent", sa.LargeBinary, nullable=False),
    sa.Column("rdp_dependent", sa.LargeBinary, nullable=False),
)

requests_table = sa.Table(
    "ledger_requests", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("request_id", sa.String(128), nullable=False, unique=True),
    sa.Column("body_digest", sa.String(64), nullable=False),
    sa.Column("client", sa.String(64), nullable=False),
    sa.Column("created", sa.Float, nullable=False),
    sa.Column("mechanism", sa.Text, nullable=False),
    sa.Column("queries", sa.Integer, nullable=False),
    sa.Column("answered", sa.Integer, nullable=False),
    sa.Column("labels", sa.LargeBinary, nullable=False),      # int32 little-endian [queries]
    sa.Column("branch", sa.LargeBinary, nullable=False),      # int8 [queries]
    sa.Column("rdp_independent", sa.LargeBinary, nullable=False),  # float64 [orders]
    sa.Column("rdp_dependent", sa.LargeBinary, nullable=False),    # float64 [orders]
    sa.Column("epsilon_after", sa.Float, nullable=False),
)

_SELECT_BUDGET = sa.select(budget_table).where(budget_table.c.id == 1).with_for_update()
_UPDATE_BUDGET = budget_table.update().where(budget_table.c.id == 1)
_SELECT_STATE = sa.select(budget_table.c.epsilon_spent, budget_table.c.queries,
                          budget_table.c.answered).where(budget_table.c.id == 1)
_ANSWER_COLUMNS = (requests_table.c.request_id, requests_table.c.body_digest,
                   requests_table.c.labels, requests_table.c.branch)
_SELECT_ID = sa.select(*_ANSWER_COLUMNS).where(
    requests_table.c.request_id == sa.bindparam("rid"))
_SELECT_IDS = sa.select(*_ANSWER_COLUMNS).where(
    requests_table.c.request_id.in_(sa.bindparam("ids", expanding=True)))

_F64 = np.dtype("<f8")
_I32 = np.dtype("<i4")


class LedgerError(Exception):
    """The ledger cannot be opened or is inconsistent; nothing may be released."""


@dataclass(frozen=True)
class Budget:
    """The public state of the budget (GET /v1/budget)."""

    epsilon_budget: float
    delta: float
    epsilon_spent: float
    basis: str
    queries: int
    answered: int

    def as_json(self) -> dict[str, Any]:
        return {"epsilon_budget": self.epsilon_budget, "delta": self.delta,
                "epsilon_spent": self.epsilon_spent, "basis": self.basis,
                "queries": self.queries, "answered": self.answered}


@dataclass(frozen=True)
class Charge:
    """What a request asks the ledger to record: its answers and their realised costs, and the
    data-independent worst case of its batch on which the budget decision is taken."""

    request_id: str
    body_digest: str
    client: str
    mechanism: str                    # the mechanism's public parameters, JSON
    labels: NDArray[np.int64]
    branch: NDArray[np.int8]
    rdp_independent: NDArray[np.float64]
    rdp_dependent: NDArray[np.float64]
    worst_case_rdp: NDArray[np.float64]


@dataclass(frozen=True)
class Stored:
    """A request's answer as recorded in the ledger; ``replayed`` when it was recorded before."""

    request_id: str
    body_digest: str
    labels: NDArray[np.int64]
    branch: NDArray[np.int8]
    replayed: bool = False

    @property
    def answered(self) -> int:
        return int(np.count_nonzero(self.labels >= 0))


class BudgetExhausted(Exception):
    """The batch's worst-case cost does not fit in what is left of the budget; nothing spent."""


class RequestConflict(Exception):
    """A request_id was reused with a different body."""


def _blob(a: NDArray, dtype: np.dtype) -> bytes:
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def _array(b: bytes, dtype: np.dtype) -> NDArray:
    return np.frombuffer(b, dtype=dtype)


def _private_sqlite_file(url: sa.URL) -> None:
    """Create the SQLite file 0600 (its -wal and -shm files inherit the mode) in a directory
    created 0700 if missing (DESIGN.md: the ledger is private)."""
    if not url.database or url.database == ":memory:":
        return
    path = Path(url.database)
    if not path.parent.exists():
        path.parent.mkdir(parents=True, mode=PRIVATE_DIR_MODE)
    fd = os.open(path, os.O_CREAT | os.O_RDWR, PRIVATE_FILE_MODE)
    os.close(fd)
    path.chmod(PRIVATE_FILE_MODE)


def _engines(url_text: str) -> tuple[sa.Engine, sa.Engine]:
    """(writer, reader) engines. On SQLite the writer opens every transaction with
    BEGIN IMMEDIATE (the database write lock) and the reader with a plain deferred BEGIN."""
    url = sa.make_url(url_text)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    if url.get_backend_name() == "sqlite":
        _private_sqlite_file(url)

        def engine(begin: str) -> sa.Engine:
            eng = sa.create_engine(url, connect_args={"check_same_thread": False,
                                                      "timeout": 30.0})

            @sa.event.listens_for(eng, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                dbapi_conn.isolation_level = None  # we issue BEGIN ourselves
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA synchronous=FULL")
                cur.execute("PRAGMA busy_timeout=30000")
                cur.close()

            @sa.event.listens_for(eng, "begin")
            def _on_begin(conn: sa.Connection) -> None:
                conn.exec_driver_sql(begin)

            return eng

        return engine("BEGIN IMMEDIATE"), engine("BEGIN")
    eng = sa.create_engine(url, pool_pre_ping=True)
    return eng, eng


class Ledger:
    """The durable privacy ledger of one body of private data.

    ``record`` blocks until its charge is committed (or refused); call ``close`` to stop the
    writer thread. Delta, budget and conversion are fixed when the ledger is created; reopening
    it with others is refused. The orders grid too: a reopened ledger keeps its own (``orders``),
    on which every later cost must be computed."""

    def __init__(self, url: str, orders: NDArray[np.float64], delta: float,
                 epsilon_budget: float, conversion: Conversion = "improved") -> None:
        if conversion not in CONVERSIONS:
            raise ValueError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
        if not 0.0 < delta < 1.0:
            raise ValueError(f"delta must be in (0, 1), got {delta!r}")
        if not epsilon_budget > 0.0:
            raise ValueError(f"the epsilon budget must be > 0, got {epsilon_budget!r}")
        self.orders = np.asarray(orders, np.float64)
        self.delta = float(delta)
        self.epsilon_budget = float(epsilon_budget)
        self.conversion: Conversion = conversion
        self.basis = (f"data-independent RDP, {conversion} conversion at delta={self.delta:g}; "
                      "a batch is refused unless its worst case fits")
        try:
            self._writer, self._reader = _engines(url)
            self.url = self._writer.url.render_as_string(hide_password=True)
            metadata.create_all(self._writer)
            self._init_or_check_meta()
            self.verify()
        except sa.exc.SQLAlchemyError as exc:
            raise LedgerError(f"cannot open the ledger: {exc.__class__.__name__}") from exc
        self._queue: queue.Queue[tuple[Charge, Future[tuple[Stored, Budget]]] | None] = (
            queue.Queue())
        self._thread = threading.Thread(target=self._write_loop, name="ledger-writer",
                                        daemon=True)
        self._thread.start()

    # -- set-up and consistency -----------------------------------------------------------

    def _init_or_check_meta(self) -> None:
        wanted = {"schema_version": str(SCHEMA_VERSION),
                  "orders": json.dumps(self.orders.tolist()),
                  "delta": repr(self.delta),
                  "epsilon_budget": repr(self.epsilon_budget),
                  "conversion": self.conversion}
        with self._writer.begin() as conn:
            found = dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all())
            if not found:
                conn.execute(meta_table.insert(), [{"key": k, "value": v}
                                                   for k, v in wanted.items()])
                zero = _blob(np.zeros_like(self.orders), _F64)
                conn.execute(budget_table.insert().values(
                    id=1, requests=0, queries=0, answered=0, epsilon_spent=0.0,
                    rdp_independent=zero, rdp_dependent=zero))
                return
        try:
            self.orders = np.asarray(json.loads(found["orders"]), np.float64)
        except (KeyError, ValueError):
            raise LedgerError("the ledger has no valid orders grid") from None
        for key, value in wanted.items():
            if key != "orders" and found.get(key) != value:
                raise LedgerError(f"the ledger was created with {key} {found.get(key)}; reopen "
                                  f"it with the same settings or start a new ledger")

    def verify(self) -> None:
        """Check that the budget row equals the sum of the request rows (in commit order, as
        they were added): every answer ever recorded is covered by the totals."""
        ind = np.zeros_like(self.orders)
        dep = np.zeros_like(self.orders)
        requests = queries = answered = 0
        with self._reader.connect() as conn:
            rows = conn.execution_options(yield_per=1000).execute(
                sa.select(requests_table.c.queries, requests_table.c.answered,
                          requests_table.c.labels, requests_table.c.rdp_independent,
                          requests_table.c.rdp_dependent).order_by(requests_table.c.seq))
            for row in rows:
                labels = _array(row.labels, _I32)
                if labels.size != row.queries or np.count_nonzero(labels >= 0) != row.answered:
                    raise LedgerError("the ledger is inconsistent: a request's answers do not "
                                      "match its counts")
                ind = ind + _array(row.rdp_independent, _F64)
                dep = dep + _array(row.rdp_dependent, _F64)
                requests += 1
                queries += row.queries
                answered += row.answered
            total = conn.execute(sa.select(budget_table).where(budget_table.c.id == 1)).one()
        same = (total.requests == requests and total.queries == queries
                and total.answered == answered
                and np.allclose(_array(total.rdp_independent, _F64), ind, rtol=1e-9, atol=0)
                and np.allclose(_array(total.rdp_dependent, _F64), dep, rtol=1e-9, atol=0))
        if not same:
            raise LedgerError("the ledger is inconsistent: the budget totals differ from the sum "
                              "of the recorded requests")

    # -- reading -----------------------------------------------------------------------------

    def epsilon(self, rdp: NDArray[np.float64]) -> float:
        """Epsilon at the ledger's delta of a data-independent RDP curve (0 when nothing is
        spent), minimised over the orders grid."""
        if not np.any(rdp > 0):
            return 0.0
        return float(np.nanmin(epsilon_curve(rdp, self.orders, self.delta, self.conversion)))

    def budget(self) -> Budget:
        """The public budget state: data-independent epsilon spent, queries, answers."""
        with self._reader.connect() as conn:
            row = conn.execute(_SELECT_STATE).one()
            conn.rollback()
        return self._budget(row.epsilon_spent, row.queries, row.answered)

    def _budget(self, spent: float, queries: int, answered: int) -> Budget:
        return Budget(self.epsilon_budget, self.delta, spent, self.basis, queries, answered)

    def lookup(self, request_id: str) -> Stored | None:
        """The stored answer of ``request_id``, if it was recorded."""
        with self._reader.connect() as conn:
            row = conn.execute(_SELECT_ID, {"rid": request_id}).first()
            conn.rollback()
        return None if row is None else self._stored(row, replayed=True)

    def private_totals(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(data-independent, data-dependent) total RDP. PRIVATE: the data-dependent curve must
        not be released without smooth-sensitivity sanitisation (DESIGN.md rule 6)."""
        with self._reader.connect() as conn:
            row = conn.execute(sa.select(budget_table.c.rdp_independent,
                                         budget_table.c.rdp_dependent)
                               .where(budget_table.c.id == 1)).one()
            conn.rollback()
        return _array(row.rdp_independent, _F64).copy(), _array(row.rdp_dependent, _F64).copy()

    def history(self) -> Iterator[Stored]:
        """Every recorded request's answer, in commit order."""
        with self._reader.connect() as conn:
            rows = conn.execution_options(yield_per=1000).execute(
                sa.select(*_ANSWER_COLUMNS).order_by(requests_table.c.seq))
            for row in rows:
                yield self._stored(row, replayed=True)

    @staticmethod
    def _stored(row: Any, replayed: bool) -> Stored:
        return Stored(row.request_id, row.body_digest,
                      _array(row.labels, _I32).astype(np.int64),
                      _array(row.branch, np.dtype(np.int8)).copy(), replayed)

    # -- writing -----------------------------------------------------------------------------

    def submit(self, charge: Charge) -> Future[tuple[Stored, Budget]]:
        """Queue ``charge`` for the writer; the future resolves once it is durably committed
        (or its request_id found recorded) to the stored answer and the budget after it, or
        fails with ``BudgetExhausted`` or ``RequestConflict`` (nothing recorded), or
        ``LedgerError`` (fail closed)."""
        fut: Future[tuple[Stored, Budget]] = Future()
        if not self._thread.is_alive():
            raise LedgerError("the ledger is closed")
        self._queue.put((charge, fut))
        return fut

    def record(self, charge: Charge) -> tuple[Stored, Budget]:
        """``submit`` and wait for the commit."""
        return self.submit(charge).result()

    def close(self) -> None:
        """Finish the queued charges, stop the writer and release the connections."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        self._writer.dispose()
        self._reader.dispose()

    def _write_loop(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            group = [item]
            stop = False
            while len(group) < _GROUP_LIMIT:
                try:
                    nxt = self._queue.get_nowait()
                except queue.Empty:
                    break
                if nxt is None:
                    stop = True
                    break
                group.append(nxt)
            self._commit_group(group)
            if stop:
                return

    def _commit_group(self, group: list[tuple[Charge, Future]]) -> None:
        """One transaction for the queued charges: lock the budget row, look their request_ids
        up together, decide each in order, insert the new ones, update the totals, commit."""
        results: list[tuple[Future, Any]] = []
        try:
            with self._writer.begin() as conn:
                total = conn.execute(_SELECT_BUDGET).one()
                ind = _array(total.rdp_independent, _F64).copy()
                dep = _array(total.rdp_dependent, _F64).copy()
                counts = [total.requests, total.queries, total.answered]
                spent = total.epsilon_spent
                known = {row.request_id: self._stored(row, replayed=True) for row in conn.execute(
                    _SELECT_IDS, {"ids": sorted({c.request_id for c, _ in group})})}
                rows = []
                for charge, fut in group:
                    outcome, spent, row = self._apply(charge, known, ind, dep, counts, spent)
                    results.append((fut, outcome))
                    if row is not None:
                        rows.append(row)
                if rows:
                    conn.execute(requests_table.insert(), rows)
                    conn.execute(_UPDATE_BUDGET, {
                        "requests": counts[0], "queries": counts[1], "answered": counts[2],
                        "epsilon_spent": spent, "rdp_independent": _blob(ind, _F64),
                        "rdp_dependent": _blob(dep, _F64)})
        except Exception as exc:  # fail closed: nothing of the group is released
            err = LedgerError(f"the ledger could not record the request "
                              f"({exc.__class__.__name__}); no label released")
            for _charge, fut in group:
                fut.set_exception(err)
            return
        for fut, outcome in results:
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def _apply(self, charge: Charge, known: dict[str, Stored], ind: NDArray[np.float64],
               dep: NDArray[np.float64], counts: list[int], spent: float
               ) -> tuple[tuple[Stored, Budget] | Exception, float, dict[str, Any] | None]:
        """Decide one charge inside the open transaction: replay, conflict, refusal or a new row
        (returned for insertion); updates ``known`` and the running totals in place.
        Returns (outcome, epsilon spent after, row or None)."""
        stored = known.get(charge.request_id)
        if stored is not None:
            if stored.body_digest != charge.body_digest:
                return RequestConflict(charge.request_id), spent, None
            replay = Stored(stored.request_id, stored.body_digest, stored.labels, stored.branch,
                            replayed=True)
            return (replay, self._budget(spent, counts[1], counts[2])), spent, None
        if self.epsilon(ind + charge.worst_case_rdp) > self.epsilon_budget:
            return BudgetExhausted(), spent, None
        cost_ind = np.asarray(charge.rdp_independent, np.float64)
        cost_dep = np.asarray(charge.rdp_dependent, np.float64)
        if not (np.all(np.isfinite(cost_ind)) and np.all(np.isfinite(cost_dep))
                and np.all(cost_ind <= charge.worst_case_rdp * (1 + 1e-12))):
            raise ValueError("a cost is not finite or exceeds its worst case")
        ind += cost_ind
        dep += cost_dep
        labels = np.asarray(charge.labels, np.int64)
        answered = int(np.count_nonzero(labels >= 0))
        counts[0] += 1
        counts[1] += labels.size
        counts[2] += answered
        spent = self.epsilon(ind)
        row = {"request_id": charge.request_id, "body_digest": charge.body_digest,
               "client": charge.client, "created": time.time(), "mechanism": charge.mechanism,
               "queries": labels.size, "answered": answered, "labels": _blob(labels, _I32),
               "branch": _blob(charge.branch, np.int8), "rdp_independent": _blob(cost_ind, _F64),
               "rdp_dependent": _blob(cost_dep, _F64), "epsilon_after": spent}
        stored = Stored(charge.request_id, charge.body_digest, labels,
                        np.asarray(charge.branch, np.int8))
        known[charge.request_id] = stored
        return (stored, self._budget(spent, counts[1], counts[2])), spent, row

