"""Benchmark of opening a ledger that holds many answered requests: the seconds ``Ledger(url)``
takes to check its totals and to gather the outcomes it replays, for ledgers of R requests of
Q pool indices each, every answer replayable (one scope: one mechanism, one votes file); and
the microseconds each new release costs the outcomes a ledger replays (``Replays.add``, which
a charge calls under the ledger's writer) once R indices are released, one index a charge.

The requests are written straight into an SQLite ledger's table (``ledger_store``), with the
same costs each, so that building it takes seconds where charging it request by request
would take minutes; opening reads them as it reads any. Prints one JSON object per case and
writes them all to results/bench_ledger.json.

    python scripts/bench_ledger.py [--requests 25000 50000 100000] [--queries 1] [--repeats 3]
                                   [--adds 10000]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import sqlalchemy as sa
from bench_common import emit

from analysis.orders import default_orders
from pate.aggregation.ledger import Ledger
from pate.aggregation.ledger_replays import Replays
from pate.aggregation.ledger_store import F64, I8, I32, I64, budget_table, requests_table, to_blob

ROOT = Path(__file__).resolve().parent.parent
DELTA = 1e-5


def build(path: Path, requests: int, queries: int) -> str:
    """An SQLite ledger at ``path`` holding ``requests`` answered requests of ``queries`` new
    pool indices each, and its totals; returns its URL."""
    url = f"sqlite:///{path}"
    Ledger(url, default_orders(), DELTA, 1e9).close()  # its schema and budget row
    cost = np.full(default_orders().size, 1e-6)
    rows = [{"request_id": f"bench/{r}", "body_digest": "-", "client": "bench",
             "created": 0.0, "mechanism": "gnmax", "queries": queries, "answered": queries,
             "labels": to_blob(np.zeros(queries), I32), "branch": to_blob(np.ones(queries), I8),
             "rdp_independent": to_blob(cost, F64), "rdp_dependent": to_blob(cost, F64),
             "epsilon_after": 0.0, "fresh": to_blob(np.ones(queries), I8),
             "indices": to_blob(np.arange(r * queries, (r + 1) * queries), I64),
             "replayable": True, "pool": "bench-votes"} for r in range(requests)]
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        conn.execute(requests_table.insert(), rows)
        conn.execute(budget_table.update().where(budget_table.c.id == 1).values(
            requests=requests, queries=requests * queries, answered=requests * queries,
            epsilon_spent=0.0, rdp_independent=to_blob(cost * requests, F64),
            rdp_dependent=to_blob(cost * requests, F64)))
    engine.dispose()
    return url


def add_microseconds(released: int, adds: int) -> float:
    """The mean microseconds of ``adds`` one-index releases into a scope holding ``released``
    (each a new index, as a round's fresh queries are)."""
    replays = Replays()
    replays.add(np.arange(released), np.zeros(released, np.int32), np.ones(released, np.int8))
    label, branch = np.zeros(1, np.int32), np.ones(1, np.int8)
    start = time.perf_counter()
    for i in range(released, released + adds):
        replays.add(np.array([i]), label, branch)
    return (time.perf_counter() - start) / adds * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, nargs="+", default=[25_000, 50_000, 100_000])
    parser.add_argument("--queries", type=int, default=1, help="pool indices per request")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--adds", type=int, default=10_000,
                        help="one-index releases timed per size (0: none)")
    args = parser.parse_args()
    out = ROOT / "results" / "bench_ledger.json"
    for requests in args.requests:
        with tempfile.TemporaryDirectory() as folder:
            url = build(Path(folder) / "ledger.db", requests, args.queries)
            seconds = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                Ledger(url, default_orders(), DELTA, 1e9).close()
                seconds.append(time.perf_counter() - start)
        emit({"case": "open", "requests": requests, "queries_per_request": args.queries,
              "open_s_median": round(float(np.median(seconds)), 3),
              "open_s": [round(s, 3) for s in seconds]}, out)
        if args.adds:
            emit({"case": "add", "released": requests * args.queries, "adds": args.adds,
                  "us_per_add": round(add_microseconds(requests * args.queries, args.adds), 1)},
                 out)


if __name__ == "__main__":
    main()
