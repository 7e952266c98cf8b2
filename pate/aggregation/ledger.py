"""The privacy ledger: every request and every cost, committed durably before an answer leaves.

docs/design.md, privacy rules 4-7. One ledger belongs to one body of private data: a single
budget row holds the running totals for all clients; each request row holds its request_id, the
digest of its body, its answers and its realised cost (data-independent and data-dependent RDP on
the orders grid, the batch's sum: RDP composes by addition, Mironov 2017, Prop. 1).

- Write-ahead: the request row and the new totals are committed in one transaction, and the caller
  releases the answer only after the commit returns. SQLite runs in WAL mode with
  ``synchronous=FULL``, so a commit is on disk (WAL fsynced) when it returns: it survives a crash
  of the process and of the machine. PostgreSQL commits with its default ``synchronous_commit``.
- Idempotent: a request_id seen before from the same client returns its stored answer (same body
  digest) or a conflict. Request ids are scoped to the client that made them (stored as
  ``client/request_id``): another client's id is neither replayed nor reported as taken.
- A release is a release (replay, docs/design.md, "The aggregation service"): a pool index
  already answered under the same mechanism parameters from the same votes (``Charge.pool``,
  their digest) gets its first stored outcome (label or refusal) again, to any client of the
  budget, without new noise and without a charge: repeating a released answer is
  post-processing (Dwork & Roth 2014, Prop. 2.1). Other votes on the same budget (teachers
  trained again) answer the index afresh, charged. Only requests marked
  ``replayable`` (pool indices, not Interactive-GNMax, no ``fresh`` opt-in) store or get
  replays. The decision is taken inside the write transaction, under the lock, against every
  outcome committed so far by any process: two replicas racing on one index store one outcome
  and charge it once.
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
import queue
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from typing import Any

import numpy as np
import sqlalchemy as sa
from numpy.typing import NDArray

from analysis.rdp import CONVERSIONS, Conversion, epsilon_from_rdp
from pate.aggregation.ledger_records import (
    AnswerBlock,
    Budget,
    Charge,
    Stored,
    budget_basis,
    fresh_mask,
)
from pate.aggregation.ledger_replays import Replays
from pate.aggregation.ledger_store import (
    F64,
    I8,
    I32,
    I64,
    LEDGER_ID,
    OPEN_HINT,
    RELEASE_FIELDS,
    ROWS_AT_ONCE,
    SCHEMA_VERSION,
    budget_table,
    engines,
    from_blob,
    meta_table,
    metadata,
    migrate,
    releases_table,
    requests_table,
    to_blob,
)
from pate.aggregation.ledger_totals import check_totals
from pate.errors import BudgetExhausted, LedgerError, RequestConflict, UserError

_GROUP_LIMIT = 256  # charges per group commit
_Scope = tuple[str, str | None]  # replays: (the mechanism's parameters, the votes' digest)

_SELECT_BUDGET = sa.select(budget_table).where(budget_table.c.id == 1).with_for_update()
_UPDATE_BUDGET = budget_table.update().where(budget_table.c.id == 1)
_INSERT_REQUESTS = requests_table.insert().returning(requests_table.c.seq)
_SELECT_STATE = sa.select(budget_table.c.epsilon_spent, budget_table.c.queries,
                          budget_table.c.answered).where(budget_table.c.id == 1)
_ANSWER_COLUMNS = (requests_table.c.request_id, requests_table.c.body_digest,
                   requests_table.c.labels, requests_table.c.branch, requests_table.c.fresh)
_SELECT_RELEASES = sa.select(
    requests_table.c.seq, requests_table.c.mechanism, requests_table.c.pool,
    requests_table.c.indices,
    requests_table.c.labels, requests_table.c.branch, requests_table.c.fresh,
).where(requests_table.c.seq > sa.bindparam("after"), requests_table.c.replayable
        ).order_by(requests_table.c.seq)
_SELECT_ID = sa.select(*_ANSWER_COLUMNS).where(
    requests_table.c.request_id == sa.bindparam("rid"))
_SELECT_IDS = sa.select(*_ANSWER_COLUMNS).where(
    requests_table.c.request_id.in_(sa.bindparam("ids", expanding=True)))


def _released_by_scope(rows: list[Any]) -> dict[_Scope, tuple[NDArray, NDArray, NDArray]]:
    """The outcomes that request rows (of ``_SELECT_RELEASES``, each with indices and a pool)
    released afresh, by scope: the pool indices, labels and branches, in the rows' order.
    ``LedgerError`` for a row whose arrays differ in length."""
    _, mechanisms, pools, indices, labels, branch, fresh = zip(*rows, strict=True)
    block = AnswerBlock.read(labels, branch, fresh, indices)
    scopes: dict[_Scope, int] = {}
    scope_of_row = np.array([scopes.setdefault(scope, len(scopes))
                             for scope in zip(mechanisms, pools, strict=True)])
    out = {}
    for scope, number in scopes.items():
        mine = block.fresh & np.repeat(scope_of_row == number, block.queries)
        out[scope] = block.indices[mine], block.labels[mine], block.branch[mine]
    return out


class Ledger:
    """The durable privacy ledger of one body of private data.

    ``record`` blocks until its charge is committed (or refused); call ``close`` to stop the
    writer thread. Delta, budget and conversion are fixed when the ledger is created; reopening
    it with others is refused. The orders grid too: a reopened ledger keeps its own (``orders``),
    on which every later cost must be computed. Raises ``UserError`` for settings out of
    range and ``LedgerError`` for a ledger that cannot be opened or reopened."""

    def __init__(self, url: str, orders: NDArray[np.float64], delta: float,
                 epsilon_budget: float, conversion: Conversion = "improved") -> None:
        if conversion not in CONVERSIONS:
            raise UserError(f"conversion must be one of {CONVERSIONS}, got {conversion!r}")
        if not 0.0 < delta < 1.0:
            raise UserError(f"delta must be in (0, 1), got {delta!r}")
        if not epsilon_budget > 0.0:
            raise UserError(f"the epsilon budget must be > 0, got {epsilon_budget!r}")
        self.orders = np.asarray(orders, np.float64)
        self.delta = float(delta)
        self.epsilon_budget = float(epsilon_budget)
        self.conversion: Conversion = conversion
        self.basis = budget_basis(conversion, self.delta)
        # outcomes released so far (``_releases``), by scope (the mechanism and the votes'
        # digest), then pool index; replicas
        # learn each other's from the request rows after ``_synced_seq``. ``_rows_seen``: the
        # request rows (the budget row's ``requests``) once synced, None before the first sync
        # under the lock; while it holds, no other process has committed and the sync is skipped
        self._releases: dict[_Scope, Replays] = {}
        self._synced_seq = 0
        self._rows_seen: int | None = None
        try:
            self._writer, self._reader = engines(url)
            self.url = self._writer.url.render_as_string(hide_password=True)
            metadata.create_all(self._writer)
            self._init_or_check_meta()
            self.verify()
            with self._reader.connect() as conn:  # the releases so far, for replays
                self._sync_releases(conn)
                conn.rollback()
        except (sa.exc.SQLAlchemyError, ValueError, ImportError) as exc:  # no such driver
            raise LedgerError(f"cannot open the ledger: {exc.__class__.__name__}{OPEN_HINT}"
                              ) from exc
        self._queue: queue.Queue[tuple[Charge, Future[tuple[Stored, Budget]]] | None] = (
            queue.Queue())
        self._thread = threading.Thread(target=self._write_loop, name="ledger-writer",
                                        daemon=True)
        self._thread.start()

    # -- set-up and consistency -----------------------------------------------------------

    def _init_or_check_meta(self) -> None:
        """Create the ledger's settings, or check them against those it was created with, and
        name it (``LEDGER_ID``: 128 random bits, given once to a ledger, older ones included,
        and never again), all in one transaction: a refusal changes nothing."""
        wanted = {"schema_version": str(SCHEMA_VERSION),
                  "orders": json.dumps(self.orders.tolist()),
                  "delta": repr(self.delta),
                  "epsilon_budget": repr(self.epsilon_budget),
                  "conversion": self.conversion}
        with self._writer.begin() as conn:
            if conn.dialect.name == "postgresql":  # replicas opening one ledger: one at a time
                conn.exec_driver_sql("LOCK TABLE ledger_meta IN SHARE ROW EXCLUSIVE MODE")
            found = dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all())
            if found.get("schema_version") in ("1", "2"):
                migrate(conn, found["schema_version"])
                found["schema_version"] = str(SCHEMA_VERSION)
            if not found:
                conn.execute(meta_table.insert(), [{"key": k, "value": v}
                                                   for k, v in wanted.items()])
                zero = to_blob(np.zeros_like(self.orders), F64)
                conn.execute(budget_table.insert().values(
                    id=1, requests=0, queries=0, answered=0, epsilon_spent=0.0,
                    rdp_independent=zero, rdp_dependent=zero))
            else:
                self._check_settings(found, wanted, conn)
            if LEDGER_ID not in found:
                found[LEDGER_ID] = secrets.token_hex(16)
                conn.execute(meta_table.insert().values(key=LEDGER_ID, value=found[LEDGER_ID]))
        self.ledger_id: str = found[LEDGER_ID]

    def _check_settings(self, found: dict[str, str], wanted: dict[str, str],
                        conn: sa.Connection) -> None:
        """Take the orders grid of an existing ledger and refuse other settings than those it
        was created with (``found``)."""
        try:
            self.orders = np.asarray(json.loads(found["orders"]), np.float64)
        except (KeyError, ValueError):
            raise LedgerError("the ledger has no valid orders grid") from None
        for key, value in wanted.items():
            if key != "orders" and found.get(key) != value:
                charged = conn.execute(sa.select(budget_table.c.requests)).scalar() or 0
                raise LedgerError(
                    f"the ledger was created with {key} {found.get(key)}; reopen it with the "
                    "same settings" + (
                        " (one body of private data has one budget: a new ledger for the same "
                        "data would be a second one)" if charged else
                        ", or, as it has charged nothing, remove it (and a ledger-url.txt that "
                        "names it) to make it again"))

    def _sync_releases(self, conn: sa.Connection) -> None:
        """Add to ``_releases`` the replayable outcomes committed since the last sync (by this
        process or another); called inside the write transaction, under the lock. The rows are
        read ``ROWS_AT_ONCE`` at a time, each column's blobs as one array, and each scope's
        outcomes merged at once, in the order they were committed (``Replays.add`` keeps the
        first release of an index), not request by request: a merge copies what the scope
        holds."""
        found: dict[_Scope, list[tuple[NDArray, NDArray, NDArray]]] = {}
        last = self._synced_seq
        rows = conn.execute(_SELECT_RELEASES, {"after": self._synced_seq},
                            execution_options={"yield_per": ROWS_AT_ONCE})
        for part in rows.partitions():
            last = part[-1].seq
            kept = [row for row in part  # not inputs, nor rows of schema 2
                    if row.indices is not None and row.pool is not None]
            if kept:
                for scope, outcomes in _released_by_scope(kept).items():
                    found.setdefault(scope, []).append(outcomes)
        for scope, parts in found.items():
            indices, labels, branch = (np.concatenate(c) for c in zip(*parts, strict=True))
            self._releases.setdefault(scope, Replays()).add(indices, labels, branch)
        self._synced_seq = last  # once its releases are kept

    def verify(self) -> None:
        """Check that the budget row equals the sum of the request rows (``check_totals``)."""
        check_totals(self._reader)

    # -- reading -----------------------------------------------------------------------------

    def epsilon(self, rdp: NDArray[np.float64]) -> float:
        """Epsilon at the ledger's delta of a data-independent RDP curve (0 when nothing is
        spent), minimised over the orders grid."""
        if not np.any(rdp > 0):
            return 0.0
        return epsilon_from_rdp(rdp, self.orders, self.delta, self.conversion,
                                warn_at_edge=False)[0]

    @contextmanager
    def sanitised_releases(self) -> Iterator[tuple[list[dict[str, Any]],
                                                   Callable[[dict[str, Any]], None]]]:
        """The sanitised epsilons released so far (``ledger_releases``: answers, queries,
        epsilon, beta, sigma; PRIVATE), and a function that adds one, under the ledger's write
        lock, held until the block ends: two users of the ledger cannot both draw a release of
        the same answers. What is added is committed when the block ends, before the caller
        may publish it; nothing is if the block raises."""
        try:
            with self._writer.begin() as conn:
                conn.execute(_SELECT_BUDGET).one()  # the write lock (SQLite: BEGIN IMMEDIATE)
                found = [dict(row._mapping) for row in conn.execute(
                    sa.select(*(releases_table.c[k] for k in RELEASE_FIELDS))
                    .order_by(releases_table.c.seq))]
                added: list[dict[str, Any]] = []
                yield found, added.append
                if added:
                    conn.execute(releases_table.insert(),
                                 [{**r, "created": time.time()} for r in added])
        except sa.exc.SQLAlchemyError as exc:
            raise LedgerError(f"the ledger could not record the release "
                              f"({exc.__class__.__name__}); nothing released") from None

    def budget(self) -> Budget:
        """The public budget state: data-independent epsilon spent, queries, answers."""
        with self._reader.connect() as conn:
            row = conn.execute(_SELECT_STATE).one()
            conn.rollback()
        return self._budget(row.epsilon_spent, row.queries, row.answered)

    def _budget(self, spent: float, queries: int, answered: int) -> Budget:
        return Budget(self.epsilon_budget, self.delta, spent, self.basis, queries, answered,
                      self.ledger_id)

    def lookup(self, client: str, request_id: str) -> Stored | None:
        """The stored answer of ``client``'s ``request_id``, if it was recorded."""
        with self._reader.connect() as conn:
            row = conn.execute(_SELECT_ID, {"rid": f"{client}/{request_id}"}).first()
            conn.rollback()
        return None if row is None else self._stored(row, retried=True)

    def private_totals(self) -> tuple[NDArray[np.float64], NDArray[np.float64]]:
        """(data-independent, data-dependent) total RDP. PRIVATE: the data-dependent curve must
        not be released without smooth-sensitivity sanitisation (docs/design.md, privacy
        rule 6)."""
        with self._reader.connect() as conn:
            row = conn.execute(sa.select(budget_table.c.rdp_independent,
                                         budget_table.c.rdp_dependent)
                               .where(budget_table.c.id == 1)).one()
            conn.rollback()
        return from_blob(row.rdp_independent, F64).copy(), from_blob(row.rdp_dependent, F64).copy()

    def history(self) -> Iterator[Stored]:
        """Every recorded request's answer, in commit order."""
        with self._reader.connect() as conn:
            rows = conn.execution_options(yield_per=ROWS_AT_ONCE).execute(
                sa.select(*_ANSWER_COLUMNS).order_by(requests_table.c.seq))
            for row in rows:
                yield self._stored(row, retried=True)

    @staticmethod
    def _stored(row: Any, retried: bool) -> Stored:
        labels = from_blob(row.labels, I32).astype(np.int64)
        fresh = fresh_mask(row.fresh, labels.size)
        return Stored(row.request_id.partition("/")[2], row.body_digest, labels,
                      from_blob(row.branch, I8).copy(), fresh, retried)

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
        added: list[tuple[_Scope, NDArray[np.int64]]] = []  # this group's, until it commits
        try:
            with self._writer.begin() as conn:
                total = conn.execute(_SELECT_BUDGET).one()
                ind = from_blob(total.rdp_independent, F64).copy()
                dep = from_blob(total.rdp_dependent, F64).copy()
                counts = [total.requests, total.queries, total.answered]
                spent = total.epsilon_spent
                known = {f"{c}/{s.request_id}": s for s, c in (
                    (self._stored(row, retried=True), row.request_id.partition("/")[0])
                    for row in conn.execute(_SELECT_IDS,
                                            {"ids": sorted({c.key for c, _ in group})}))}
                if total.requests != self._rows_seen:
                    self._sync_releases(conn)
                    self._rows_seen = total.requests
                rows = []
                for charge, fut in group:
                    outcome, spent, row = self._apply(charge, known, added, ind, dep, counts,
                                                      spent)
                    results.append((fut, outcome))
                    if row is not None:
                        rows.append(row)
                if rows:
                    # under the lock, the rows inserted are the last ones: the next sync need
                    # not read them back
                    synced = max(conn.execute(_INSERT_REQUESTS, rows).scalars())
                    conn.execute(_UPDATE_BUDGET, {
                        "requests": counts[0], "queries": counts[1], "answered": counts[2],
                        "epsilon_spent": spent, "rdp_independent": to_blob(ind, F64),
                        "rdp_dependent": to_blob(dep, F64)})
        except Exception as exc:  # fail closed: nothing of the group is released
            for scope, indices in added:  # nor kept for replay: they were new
                self._releases[scope].forget(indices)
            err = LedgerError(f"the ledger could not record the request "
                              f"({exc.__class__.__name__}); no label released")
            for _charge, fut in group:
                fut.set_exception(err)
            return
        if rows:
            self._synced_seq, self._rows_seen = synced, counts[0]
        for fut, outcome in results:
            if isinstance(outcome, Exception):
                fut.set_exception(outcome)
            else:
                fut.set_result(outcome)

    def _apply(self, charge: Charge, known: dict[str, Stored],
               added: list[tuple[_Scope, NDArray[np.int64]]], ind: NDArray[np.float64],
               dep: NDArray[np.float64], counts: list[int], spent: float
               ) -> tuple[tuple[Stored, Budget] | Exception, float, dict[str, Any] | None]:
        """Decide one charge inside the open transaction: a retry, a conflict, a refusal or a new
        row (returned for insertion) whose queries already released are replayed and the others
        charged; updates ``known``, the releases (listed in ``added``) and the running totals
        in place.
        Returns (outcome, epsilon spent after, row or None)."""
        stored = known.get(charge.key)
        if stored is not None:
            if stored.body_digest != charge.body_digest:
                return RequestConflict(), spent, None
            return (stored, self._budget(spent, counts[1], counts[2])), spent, None
        labels = np.array(charge.labels, np.int64)
        branch = np.array(charge.branch, np.int8)
        fresh = np.ones(labels.size, bool)
        replayable = (charge.replayable and charge.indices is not None
                      and charge.pool is not None)
        if replayable:
            asked = np.asarray(charge.indices, np.int64)
            released = self._releases.setdefault((charge.mechanism, charge.pool), Replays())
            outcome = released.lookup(asked)
            fresh = outcome == Replays.UNSET
            labels[~fresh], branch[~fresh] = outcome[~fresh] >> 8, outcome[~fresh] & 0xFF
        n_fresh = int(fresh.sum())
        if n_fresh and self.epsilon(ind + n_fresh * charge.worst_case_rdp) > self.epsilon_budget:
            return BudgetExhausted(), spent, None
        if n_fresh == labels.size:
            cost_ind, cost_dep = charge.rdp_independent.total(), charge.rdp_dependent.total()
        else:
            cost_ind = charge.rdp_independent.per_query()[fresh].sum(axis=0)
            cost_dep = charge.rdp_dependent.per_query()[fresh].sum(axis=0)
        if not (np.all(np.isfinite(cost_ind)) and np.all(np.isfinite(cost_dep))
                and np.all(cost_ind <= n_fresh * charge.worst_case_rdp * (1 + 1e-12))):
            raise ValueError("a cost is not finite or exceeds its worst case")
        ind += cost_ind
        dep += cost_dep
        answered = int(np.count_nonzero(labels[fresh] >= 0))
        counts[0] += 1
        counts[1] += n_fresh
        counts[2] += answered
        if n_fresh:
            spent = self.epsilon(ind)
        row = {"request_id": charge.key, "body_digest": charge.body_digest,
               "client": charge.client, "created": time.time(), "mechanism": charge.mechanism,
               "queries": labels.size, "answered": answered, "labels": to_blob(labels, I32),
               "branch": to_blob(branch, I8), "rdp_independent": to_blob(cost_ind, F64),
               "rdp_dependent": to_blob(cost_dep, F64), "epsilon_after": spent,
               "indices": None if charge.indices is None else to_blob(charge.indices, I64),
               "fresh": to_blob(fresh, I8), "replayable": replayable, "pool": charge.pool}
        if replayable:
            released.add(asked[fresh], labels[fresh], branch[fresh])
            added.append(((charge.mechanism, charge.pool), asked[fresh]))
        stored = Stored(charge.request_id, charge.body_digest, labels, branch, fresh)
        known[charge.key] = Stored(charge.request_id, charge.body_digest, labels, branch, fresh,
                                   retried=True)
        return (stored, self._budget(spent, counts[1], counts[2])), spent, row

