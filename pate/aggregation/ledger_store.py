"""Where the privacy ledger lies: its tables and their migrations, the engines that open it
(SQLite in write-ahead mode, or PostgreSQL), and the URL that names it.

``pate.aggregation.ledger`` decides what is recorded; this module only says how it is stored
(docs/design.md, privacy rules 4-7): arrays are kept as little-endian blobs, an SQLite file and
its folders are created private (0600 and 0700), and a ledger of an older schema is brought to
this one inside the transaction that opens it.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import sqlalchemy as sa
from numpy.typing import NDArray

from pate.errors import LedgerError, UserError
from pate.io import PRIVATE_DIR_MODE, PRIVATE_FILE_MODE

SCHEMA_VERSION = 3  # 1: request_id unique over all clients, no replays; 2: replays not by
# votes, no table of sanitised releases (created on open)

metadata = sa.MetaData()

# the ledger_meta key of a ledger's name: random, made once with it (or on the first opening of
# an older ledger), so that a student's run can tell which ledger charged its answers
LEDGER_ID = "ledger_id"

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
    sa.Column("request_id", sa.String(200), nullable=False, unique=True),  # client/request_id
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
    # schema 2: the pool indices asked (int64 [queries]; NULL for inputs), which queries were
    # answered afresh and charged (int8 [queries]; NULL: all), and whether they may be replayed
    sa.Column("indices", sa.LargeBinary, nullable=True),
    sa.Column("fresh", sa.LargeBinary, nullable=True),
    sa.Column("replayable", sa.Boolean, nullable=False, server_default=sa.false()),
    # schema 3: the digest of the votes answered from (``VotePool.digest``; NULL: inputs, or
    # a row of schema 2, whose outcomes are replayed to no request of schema 3)
    sa.Column("pool", sa.String(64), nullable=True),
)

# The sanitised epsilons released from the answers (``student.sanitised.ledger_releases``: a
# student's rounds, the Python API's ``PrivateLabels``): each drawn once per set of answers
# (``answers``, their digest), the beta and sigma of its noise kept for the releases after it,
# whichever run or process made them (PRIVATE).
releases_table = sa.Table(
    "ledger_releases", metadata,
    sa.Column("seq", sa.BigInteger().with_variant(sa.Integer, "sqlite"), primary_key=True,
              autoincrement=True),
    sa.Column("answers", sa.String(64), nullable=False),
    sa.Column("queries", sa.Integer, nullable=False),
    sa.Column("epsilon", sa.Float, nullable=False),
    sa.Column("beta", sa.Float, nullable=True),
    sa.Column("sigma", sa.Float, nullable=True),
    sa.Column("created", sa.Float, nullable=False),
)
RELEASE_FIELDS = ("answers", "queries", "epsilon", "beta", "sigma")

# the dtypes of the blob columns, little-endian whatever the machine
F64 = np.dtype("<f8")
I32 = np.dtype("<i4")
I64 = np.dtype("<i8")
I8 = np.dtype(np.int8)


def to_blob(a: NDArray, dtype: np.dtype) -> bytes:
    """``a`` as the bytes of a blob column, in ``dtype`` (one of the little-endian above)."""
    return np.ascontiguousarray(a, dtype=dtype).tobytes()


def from_blob(b: bytes, dtype: np.dtype) -> NDArray:
    """The read-only array of a blob column written by ``to_blob`` with ``dtype``."""
    return np.frombuffer(b, dtype=dtype)


def inconsistent(how: str) -> LedgerError:
    """The error of a ledger whose rows disagree (``how``: in what): it is refused, whatever
    reads it."""
    return LedgerError(f"the ledger is inconsistent: {how}")


# what a request row whose answers and counts disagree makes the ledger
ANSWERS_UNLIKE_COUNTS = "a request's answers do not match its counts"

# request rows read at once when a ledger reads them all (its totals, its replays): a block's
# blobs are joined into one array per column
ROWS_AT_ONCE = 1000


def blob_sizes(blobs: Sequence[bytes], dtype: np.dtype) -> NDArray[np.int64]:
    """The length of the array each blob of one column holds (each written by ``to_blob`` with
    ``dtype``), without reading it. ``LedgerError`` for a blob that is not a whole number of
    ``dtype``'s items."""
    sizes = np.fromiter(map(len, blobs), np.int64, len(blobs))
    if np.any(sizes % dtype.itemsize):
        raise inconsistent("a stored array is cut short")
    return sizes // dtype.itemsize


def from_blobs(blobs: Sequence[bytes], dtype: np.dtype) -> tuple[NDArray, NDArray[np.int64]]:
    """Many rows' blobs of one column read at once: their arrays end to end (read-only) and
    each one's length (``blob_sizes``)."""
    sizes = blob_sizes(blobs, dtype)
    return np.frombuffer(b"".join(blobs), dtype=dtype), sizes


# said with a ledger that cannot be opened (only the error's class is named: its text may hold
# the URL's password)
OPEN_HINT = (" (a ledger is an SQLite database file, or a URL such as sqlite:///PATH or "
             "postgresql://USER@HOST/DB that this machine can reach)")


def _private_sqlite_file(url: sa.URL) -> None:
    """Create the SQLite file 0600 (its -wal and -shm files inherit the mode) in a directory
    created 0700 if missing (docs/design.md: the ledger is private), and say so: votes keep
    their first ledger for good, so a mistyped path should not pass unseen."""
    if not url.database or url.database == ":memory:":
        raise LedgerError("an SQLite ledger needs a file: one in memory would not last")
    path = Path(url.database)
    try:
        missing = [p for p in path.absolute().parents if not p.exists()]
        for folder in reversed(missing):  # each new parent private, not only the last
            folder.mkdir(mode=PRIVATE_DIR_MODE)
            folder.chmod(PRIVATE_DIR_MODE)
        if missing:
            warnings.warn(f"the ledger's folder {path.absolute().parent} did not exist: "
                          "created it (0700) for the new ledger", stacklevel=4)
        fd = os.open(path, os.O_CREAT | os.O_RDWR, PRIVATE_FILE_MODE)
        os.close(fd)
        path.chmod(PRIVATE_FILE_MODE)
    except OSError as exc:  # a parent that is a file, a folder without write permission
        raise LedgerError(f"cannot create the ledger file {path}: "
                          f"{exc.strerror or exc.__class__.__name__}") from None


def engines(url_text: str) -> tuple[sa.Engine, sa.Engine]:
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


def ledger_url(ledger: str | Path) -> str:
    """The SQLAlchemy URL of ``ledger``: a URL (``scheme://...``) as it is, a file path as
    ``sqlite:///`` its absolute path. Refused (``UserError``): a folder, and SQLite's name of a
    database in memory (it would be a file of that name: one that looks like none)."""
    text = str(ledger)
    if "://" in text:
        return text
    if text == ":memory:":
        raise UserError("ledger :memory:: a ledger in memory would not outlast the process "
                        "that charges it; give a file path or a database URL")
    path = Path(text).expanduser()
    if path.is_dir():
        raise UserError(f"ledger {text}: a folder; the ledger is a file (or a URL)")
    return f"sqlite:///{path.absolute()}"


def canonical_url(url: str) -> str:
    """``url`` as one ledger is always named: a SQLite file by its resolved path, the password
    hidden (so the result may be written down); a text that is no URL is returned as it is
    (opening it says what is wrong)."""
    try:
        parsed = sa.make_url(url)
    except sa.exc.ArgumentError:
        return url
    if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:"):
        parsed = parsed.set(database=str(Path(parsed.database).resolve()))
    return parsed.render_as_string(hide_password=True)


def stored_settings(url: str) -> dict[str, Any] | None:
    """The delta, epsilon budget and conversion the ledger at ``url`` was created with (public
    parameters), or None when it holds none yet; reads only, creates nothing."""
    return _read_stored(url, totals=False)


def stored_totals(url: str) -> dict[str, Any] | None:
    """``stored_settings`` and the running totals of the budget row (``epsilon_spent``,
    data-independent; ``queries``; ``answered``), or None when it holds none yet; reads only:
    nothing is created, migrated or checked (``pate status`` beside a running service)."""
    return _read_stored(url, totals=True)


def _read_stored(url: str, totals: bool) -> dict[str, Any] | None:
    """The settings of the ledger at ``url`` and, with ``totals``, its budget row's totals."""
    try:
        parsed = sa.make_url(url)
        if parsed.get_backend_name() == "sqlite" and not Path(parsed.database or "").is_file():
            return None
        _, reader = engines(url)
    except (sa.exc.SQLAlchemyError, ValueError, ImportError) as exc:  # not a URL, no driver
        raise LedgerError(f"cannot open the ledger: {exc.__class__.__name__}{OPEN_HINT}") from None
    try:
        with reader.connect() as conn:
            if not sa.inspect(conn).has_table(meta_table.name):
                return None
            found = dict(conn.execute(sa.select(meta_table.c.key, meta_table.c.value)).all())
            row = None if not totals else conn.execute(
                sa.select(budget_table.c.epsilon_spent, budget_table.c.queries,
                          budget_table.c.answered).where(budget_table.c.id == 1)).one_or_none()
        if not {"delta", "epsilon_budget", "conversion"} <= found.keys() or (
                totals and row is None):
            return None
        settings = {"delta": float(found["delta"]),
                    "epsilon_budget": float(found["epsilon_budget"]),
                    "conversion": found["conversion"], LEDGER_ID: found.get(LEDGER_ID)}
        return settings if row is None else {
            **settings, "epsilon_spent": float(row.epsilon_spent), "queries": int(row.queries),
            "answered": int(row.answered)}
    except (sa.exc.SQLAlchemyError, ValueError) as exc:
        raise LedgerError(f"cannot read the ledger {canonical_url(url)}: "
                          f"{exc.__class__.__name__}") from None
    finally:
        reader.dispose()


def migrate(conn: sa.Connection, version: str) -> None:
    """Bring a ledger of schema ``version`` to ``SCHEMA_VERSION`` inside the open transaction."""
    if version == "1":
        _migrate_from_1(conn)
    conn.exec_driver_sql("ALTER TABLE ledger_requests ADD COLUMN pool VARCHAR(64)")
    conn.execute(meta_table.update().where(meta_table.c.key == "schema_version")
                 .values(value=str(SCHEMA_VERSION)))


def _migrate_from_1(conn: sa.Connection) -> None:
    """Schema 1 to 2: request ids become ``client/request_id`` (they were global), and the
    columns of replays are added (NULL for the old rows: they were all charged, and their pool
    indices were not kept, so they are never replayed)."""
    blob = sa.LargeBinary().compile(dialect=conn.dialect)
    for column in ("indices", "fresh"):
        conn.exec_driver_sql(f"ALTER TABLE ledger_requests ADD COLUMN {column} {blob}")
    conn.exec_driver_sql("ALTER TABLE ledger_requests ADD COLUMN replayable BOOLEAN NOT NULL "
                         "DEFAULT FALSE")
    if conn.dialect.name == "postgresql":
        conn.exec_driver_sql("ALTER TABLE ledger_requests ALTER COLUMN request_id "
                             "TYPE VARCHAR(200)")
    conn.execute(requests_table.update().values(
        request_id=requests_table.c.client + "/" + requests_table.c.request_id))

