"""Reliability suite of ``pate serve`` on loopback, bounded in time: malformed requests, concurrent
clients against one budget, ``kill -9`` under load (SQLite and PostgreSQL), replicas on one
PostgreSQL ledger, and the memory and /healthz stall under oversized and half-sent requests
(issue 28; figures in docs/benchmarks.md).

Every server is a real ``pate serve`` subprocess on 127.0.0.1; PostgreSQL is a throw-away server
of the Debian package started on loopback (skipped, and said so, where it is missing). Prints one
JSON object per section and writes them all to results/stress_service.json.

    python scripts/stress_service.py [--clients 16] [--requests 200] [--kill-trials 20]
                                     [--replicas 3] [--no-postgres] [--sections ...]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import sqlalchemy as sa

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from service_common import votes_for_ledger  # noqa: E402

from analysis.orders import default_orders  # noqa: E402
from pate.aggregation.label_requests import MAX_QUERIES, Limits  # noqa: E402
from pate.aggregation.ledger import Ledger  # noqa: E402
from pate.aggregation.ledger_store import requests_table  # noqa: E402
from pate.data.synthetic import dirichlet_votes  # noqa: E402

TOKENS = ("stress-token-a-0123456789", "stress-token-b-9876543210")
POOL = 4000
CLASSES = 10
SIGMA = 40.0
DELTA = 1e-5
# what a response must never contain: internals and private statistics (docs/design.md,
# privacy rules 2 and 7)
LEAK_MARKERS = ("Traceback", "File \"", "sqlalchemy", "sqlite3", "psycopg", "votes.npy",
                "rdp_dependent", "data-dependent", "/tmp/")


GNMAX = ("--mechanism", "gnmax", "--sigma", str(SIGMA))
INTERACTIVE = ("--mechanism", "interactive", "--threshold", "200", "--sigma1", "150",
               "--sigma2", str(SIGMA), "--gamma", "0.9")


class Server:
    """A ``pate serve`` subprocess on a free loopback port (GNMax unless ``mechanism``) serving
    the pool ``workdir/votes``."""

    def __init__(self, workdir: Path, ledger: str, budget: float, *extra: str,
                 mechanism: tuple[str, ...] = GNMAX, votes: str = "votes.npy") -> None:
        cmd = [sys.executable, "-m", "pate", "serve", "--votes",
               str(votes_for_ledger(workdir / votes, ledger)),
               *mechanism, "--budget-epsilon", str(budget), "--delta", str(DELTA),
               "--token-file", str(workdir / "tokens.txt"), "--ledger", ledger, "--port", "0",
               *extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        seen: list[str] = []
        for line in self.proc.stdout:
            if m := re.search(r"listening on (http://[\d.]+:\d+)", line):
                self.url = m.group(1)
                break
            seen.append(line)
        else:
            raise SystemExit("pate serve did not start:\n" + "".join(seen[-20:]))
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()  # drain
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return
            time.sleep(0.05)
        raise SystemExit("pate serve does not answer /healthz")

    def alive(self) -> bool:
        try:
            return httpx.get(self.url + "/healthz", timeout=5).status_code == 200
        except httpx.HTTPError:
            return False

    def _status_kib(self, key: str) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith(key + ":"):
                return int(line.split()[1])
        raise SystemExit(f"no {key} in /proc/{self.proc.pid}/status")

    def reset_peak(self) -> int:
        """Reset the kernel's peak-RSS mark of the server (``/proc/PID/clear_refs``, Linux);
        its resident memory now, bytes."""
        Path(f"/proc/{self.proc.pid}/clear_refs").write_text("5")
        return self._status_kib("VmRSS") * 1024

    def peak(self) -> int:
        """The server's peak resident memory since ``reset_peak`` (VmHWM), bytes."""
        return self._status_kib("VmHWM") * 1024

    def kill9(self) -> None:
        self.proc.kill()
        self.proc.wait(30)

    def stop(self) -> int:
        self.proc.terminate()
        try:
            return self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.kill9()
            return -9


def auth(token: str = TOKENS[0]) -> dict[str, str]:
    """The Authorization header of ``token``."""
    return {"Authorization": f"Bearer {token}"}


# -- 1. malformed requests ------------------------------------------------------------------


def malformed_cases() -> list[tuple[str, dict[str, Any]]]:
    """(name, httpx request arguments) of malformed requests, one per class."""
    j = {"Content-Type": "application/json", **auth()}

    def body(obj: Any) -> dict[str, Any]:
        return {"content": json.dumps(obj).encode(), "headers": j}

    ok = {"request_id": "m"}
    cases: list[tuple[str, dict[str, Any]]] = [
        ("no token", {"json": {**ok, "indices": [1]}}),
        ("bad token", {"json": {**ok, "indices": [1]}, "headers": auth("nope")}),
        ("basic auth", {"json": {**ok, "indices": [1]},
                        "headers": {"Authorization": "Basic eDp5"}}),
        ("not JSON", {"content": b"{not json", "headers": j}),
        ("empty body", {"content": b"", "headers": j}),
        ("JSON array", body([1, 2])),
        ("JSON string", body("x")),
        ("JSON null", body(None)),
        ("text/plain", {"content": json.dumps({**ok, "indices": [1]}).encode(),
                        "headers": {**auth(), "Content-Type": "text/plain"}}),
        ("no content type", {"content": json.dumps({**ok, "indices": [1]}).encode(),
                             "headers": auth()}),
        ("form encoded", {"data": {"request_id": "m"}, "headers": auth()}),
        ("missing request_id", body({"indices": [1]})),
        ("empty request_id", body({"request_id": "", "indices": [1]})),
        ("long request_id", body({"request_id": "x" * 10_000, "indices": [1]})),
        ("request_id with slash", body({"request_id": "a/b", "indices": [1]})),
        ("request_id number", body({"request_id": 5, "indices": [1]})),
        ("no source", body(ok)),
        ("both sources", body({**ok, "indices": [1], "inputs": {
            "dtype": "float32", "shape": [1, 1, 1, 1], "data": "AAAAAA=="}})),
        ("extra field", body({**ok, "indices": [1], "admin": True})),
        ("indices not a list", body({**ok, "indices": 5})),
        ("indices strings", body({**ok, "indices": ["1"]})),
        ("indices floats", body({**ok, "indices": [1.5]})),
        ("indices bools", body({**ok, "indices": [True]})),
        ("indices null", body({**ok, "indices": [None]})),
        ("indices nested", body({**ok, "indices": [[1]]})),
        ("negative index", body({**ok, "indices": [-1]})),
        ("index 2**63", body({**ok, "indices": [2**63]})),
        ("index 10**400", {"content": b'{"request_id":"m","indices":[1' + b"0" * 400 + b"]}",
                           "headers": j}),
        ("index outside pool", body({**ok, "indices": [POOL + 5]})),
        ("repeated index", body({**ok, "indices": [3, 3]})),
        ("empty indices", body({**ok, "indices": []})),
        ("over max batch", body({**ok, "indices": list(range(5000))})),
        ("4M invalid indices", {"content": b'{"request_id":"m","indices":[' +
                                b"-1," * 4_000_000 + b"-1]}", "headers": j}),
        ("huge string", body({**ok, "indices": [1], "pad": "x" * 10_000_000})),
        ("deep nesting", {"content": b'{"request_id":"m","indices":' + b"[" * 10_000 +
                          b"]" * 10_000 + b"}", "headers": j}),
        ("NaN literal", {"content": b'{"request_id":"m","indices":[NaN]}', "headers": j}),
        ("student_probs on gnmax", body({**ok, "indices": [1], "student_probs": [[1.0]]})),
        ("student_probs strings", body({**ok, "indices": [1], "student_probs": [["0.5"]]})),
        ("fresh not a bool", body({**ok, "indices": [1], "fresh": "yes"})),
        ("inputs without ensemble", body({**ok, "inputs": {
            "dtype": "float32", "shape": [1, 1, 1, 1], "data": "AAAAAA=="}})),
        ("inputs bad dtype", body({**ok, "inputs": {
            "dtype": "float64", "shape": [1, 1, 1, 1], "data": ""}})),
        ("inputs bad base64", body({**ok, "inputs": {
            "dtype": "float32", "shape": [1, 1, 1, 1], "data": "!!!"}})),
        ("inputs long shape", body({**ok, "inputs": {
            "dtype": "float32", "shape": [1] * 100, "data": ""}})),
        ("invalid UTF-8", {"content": b'{"request_id":"\xff\xfe","indices":[1]}',
                           "headers": j}),
        ("huge Content-Length", {"raw": b"Content-Length: 999999999999\r\n\r\n{}"}),
        ("bad Content-Length", {"raw": b"Content-Length: 12abc\r\n\r\n{}"}),
        ("negative Content-Length", {"raw": b"Content-Length: -5\r\n\r\n{}"}),
        ("chunked over the limit", {"raw": b"Transfer-Encoding: chunked\r\n\r\n" +
                                    b"10000\r\n" + b"1" * 0x10000 + b"\r\n" * 8}),
    ]
    return cases


def raw_request(url: str, tail: bytes) -> tuple[int, str]:
    """POST /v1/labels written by hand (headers a client library would refuse to send):
    ``tail`` is the rest of the headers and the body; (status, response text)."""
    host, port = url.removeprefix("http://").split(":")
    head = (b"POST /v1/labels HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Authorization: Bearer " + TOKENS[0].encode() + b"\r\n")
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        with contextlib.suppress(OSError):
            sock.sendall(head + tail)
        reply = b""
        with contextlib.suppress(OSError):
            while chunk := sock.recv(65536):
                reply += chunk
                if b"\r\n\r\n" in reply:
                    break
    status = reply.split(b"\r\n", 1)[0].split(b" ")
    return (int(status[1]) if len(status) > 1 and status[1].isdigit() else 0,
            reply.decode("latin-1"))


def leaks(text: str) -> bool:
    """Whether an answer shows internals or private statistics (``LEAK_MARKERS``)."""
    return any(marker in text for marker in LEAK_MARKERS)


def section_malformed(workdir: Path) -> dict[str, Any]:
    """Every malformed request once: its status class, crashes (the server restarted) and
    answers that leak."""
    server = Server(workdir, f"sqlite:///{workdir / 'malformed.db'}", 1e6)
    out = {"section": "malformed", "classes": 0, "4xx": 0, "5xx": 0, "other": 0,
           "crashes": 0, "leaks": 0, "failures": []}
    try:
        for name, kwargs in [*malformed_cases(),
                             ("GET labels", {"method": "GET"}),
                             ("PUT labels", {"method": "PUT", "json": {}})]:
            out["classes"] += 1
            method = kwargs.pop("method", "POST")
            try:
                if "raw" in kwargs:
                    status, text = raw_request(server.url, kwargs["raw"])
                else:
                    r = httpx.request(method, server.url + "/v1/labels", timeout=60, **kwargs)
                    status, text = r.status_code, r.text
            except httpx.HTTPError as exc:
                status, text = 0, type(exc).__name__
            kind = ("4xx" if 400 <= status < 500 else "5xx" if status >= 500 else "other")
            out[kind] += 1
            if leaks(text):
                out["leaks"] += 1
            if not server.alive():
                out["crashes"] += 1
                server = Server(workdir, f"sqlite:///{workdir / 'malformed.db'}", 1e6)
            if kind != "4xx" or leaks(text):
                out["failures"].append(f"{name}: {status}")
    finally:
        server.stop()
    return out


# -- 2-4. budget under concurrency, kill -9, replicas ---------------------------------------


class Tally:
    """Answers the clients received: (client, request_id) -> (label, index)."""

    def __init__(self) -> None:
        self.answers: dict[tuple[int, str], tuple[int, int]] = {}
        self.statuses: dict[int, int] = {}
        self.lock = threading.Lock()

    def add(self, token: int, rid: str, status: int, label: int = 0, index: int = 0) -> None:
        with self.lock:
            self.statuses[status] = self.statuses.get(status, 0) + 1
            if status == 200:
                self.answers[(token, rid)] = (label, index)


def client_loop(urls: list[str], k: int, n: int, tally: Tally, stop: threading.Event,
                index_of: Callable[[int, int], int], prefix: str) -> None:
    """Client ``k``: ``n`` single-label requests (token ``k % 2``, request ids
    ``{prefix}c{k}-{i}``), round-robin over ``urls``."""
    with contextlib.ExitStack() as stack:
        https = [stack.enter_context(httpx.Client(base_url=u, headers=auth(TOKENS[k % 2]),
                                                  timeout=30)) for u in urls]
        for i in range(n):
            if stop.is_set():
                return
            rid, index = f"{prefix}c{k}-{i}", index_of(k, i)
            try:
                r = https[i % len(https)].post("/v1/labels",
                                               json={"request_id": rid, "indices": [index]})
            except httpx.HTTPError:
                continue  # a server killed under load
            if r.status_code == 200:
                tally.add(k % 2, rid, 200, r.json()["labels"][0], index)
            else:
                tally.add(k % 2, rid, r.status_code)


def run_clients(urls: list[str], clients: int, n: int, tally: Tally,
                index_of: Callable[[int, int], int], stop: threading.Event | None = None,
                prefix: str = "") -> list[threading.Thread]:
    """Start ``clients`` threads of ``client_loop`` on ``urls``; returns them."""
    stop = stop or threading.Event()
    threads = [threading.Thread(target=client_loop,
                                args=(urls, k, n, tally, stop, index_of, prefix))
               for k in range(clients)]
    for t in threads:
        t.start()
    return threads


def audit(ledger_url: str, budget: float, tally: Tally) -> dict[str, Any]:
    """Open the ledger (which verifies its totals), then: every answer a client received is
    recorded with the same label (else a lost charge); each pool index charged at most once
    (else a double charge); the data-independent epsilon within the budget (else overshoot)."""
    ledger = Ledger(ledger_url, default_orders(), DELTA, budget)
    try:
        history = list(ledger.history())
        spent = ledger.budget().epsilon_spent
    finally:
        ledger.close()
    by_key: dict[str, Any] = {}
    for s in history:
        by_key.setdefault(s.request_id, []).append(s)
    lost = 0
    for (_token, rid), (label, _index) in tally.answers.items():
        if not any(s.labels.tolist() == [label] for s in by_key.get(rid, [])):
            lost += 1
    charges = charged_indices(ledger_url)
    released: dict[int, int] = {}
    mismatched = 0
    for label, index in tally.answers.values():
        mismatched += released.setdefault(index, label) != label
    return {"answered": len(tally.answers), "statuses": dict(sorted(tally.statuses.items())),
            "charged_queries": int(charges.sum()), "lost_charges": lost,
            "double_charges": int(np.maximum(charges - 1, 0).sum()),
            "replay_mismatches": mismatched, "epsilon_spent": round(spent, 6),
            "overshoot": max(0.0, spent - budget)}


def charged_indices(ledger_url: str) -> np.ndarray:
    """How many times each pool index was charged, from the ledger's request rows."""
    url = sa.make_url(ledger_url)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg")
    engine = sa.create_engine(url)
    counts = np.zeros(POOL, np.int64)
    try:
        with engine.connect() as conn:
            for row in conn.execute(sa.select(requests_table.c.indices,
                                              requests_table.c.fresh)):
                indices = np.frombuffer(row.indices, "<i8")
                fresh = np.frombuffer(row.fresh, np.int8).astype(bool)
                np.add.at(counts, indices[fresh], 1)
    finally:
        engine.dispose()
    return counts


def section_concurrent(workdir: Path, clients: int, requests: int) -> dict[str, Any]:
    """``clients`` x ``requests`` single-label requests on one SQLite server until its budget
    runs out, then the audit."""
    url = f"sqlite:///{workdir / 'concurrent.db'}"
    budget = 3.0  # about 360 single-label queries at sigma 40: exhausted under load
    server = Server(workdir, url, budget)
    tally = Tally()
    t0 = time.perf_counter()
    try:
        for t in run_clients([server.url], clients, requests, tally,
                             lambda k, i: (k * requests + i) % POOL):
            t.join()
    finally:
        server.stop()
    return {"section": "concurrent", "ledger": "sqlite", "clients": clients,
            "requests_each": requests, "seconds": round(time.perf_counter() - t0, 1),
            **audit(url, budget, tally)}


def section_kill9(workdir: Path, ledger_url: str, backend: str, trials: int) -> dict[str, Any]:
    """``trials`` times: a server on ``ledger_url`` under 8 clients, killed (SIGKILL) 0.1 to
    1 s after its first answer; the ledger audited after each trial."""
    budget = 1e4
    rng = np.random.default_rng(1)
    results = []
    for trial in range(trials):
        server = Server(workdir, ledger_url, budget)
        tally, stop = Tally(), threading.Event()
        threads = run_clients([server.url], 8, 10_000, tally,
                              lambda k, i, t=trial: (t * 977 + k * 5000 + i) % POOL, stop,
                              prefix=f"t{trial}")
        deadline = time.monotonic() + 30
        while not tally.answers and time.monotonic() < deadline:  # under load first
            time.sleep(0.01)
        time.sleep(float(rng.uniform(0.1, 1.0)))
        server.kill9()
        stop.set()
        for t in threads:
            t.join()
        results.append(audit(ledger_url, budget, tally))
    return {"section": "kill-9", "ledger": backend, "trials": trials,
            "answered": sum(r["answered"] for r in results),
            "answered_min_per_trial": min(r["answered"] for r in results),
            "refused": sum(n for r in results for status, n in r["statuses"].items()
                           if status != 200),
            "lost_charges": sum(r["lost_charges"] for r in results),
            # the ledger is shared by the trials: its last audit counts every index charged
            "double_charges": results[-1]["double_charges"],
            "replay_mismatches": sum(r["replay_mismatches"] for r in results),
            "overshoot": max(r["overshoot"] for r in results)}


def section_replicas(workdir: Path, ledger_url: str, replicas: int, clients: int,
                     requests: int) -> dict[str, Any]:
    """``replicas`` servers on one PostgreSQL ledger, ``clients`` spread over them asking
    overlapping indices until the budget runs out, then the audit."""
    budget = 3.0
    servers = [Server(workdir, ledger_url, budget) for _ in range(replicas)]
    tally = Tally()
    # clients ask overlapping indices through every replica: replays race with first asks
    try:
        for t in run_clients([s.url for s in servers], clients, requests, tally,
                             lambda k, i: (k * requests // 2 + i) % POOL):
            t.join()
    finally:
        for s in servers:
            s.stop()
    return {"section": "replicas", "ledger": "postgresql", "replicas": replicas,
            "clients": clients, "requests_each": requests, **audit(ledger_url, budget, tally)}


# -- 5. memory and /healthz under oversized and half-sent requests ---------------------------

BODY_TIMEOUT_S = 2.0
HALF_OPEN = 300   # connections whose body never finishes
DRIBBLES = 4      # connections that send their body a byte every 0.5 s
REPEATS = 4       # concurrent copies of each oversized body
LARGE_POOL = 2**18  # rows: past pate.aggregation.aggregators.TABLE_LIMIT_BYTES of costs


def labels_json(indices: bytes, rest: bytes = b"") -> bytes:
    """A body of POST /v1/labels with the JSON text of its indices (and more fields)."""
    return b'{"request_id":"b","indices":[' + indices + b"]" + rest + b"}"


def heavy_bodies(limit: int, max_batch: int, pool: int, interactive: bool
                 ) -> list[tuple[str, bytes, bool]]:
    """(name, body, chunked) of the heaviest requests a server of body limit ``limit`` and
    ``--max-batch`` ``max_batch`` can be sent: the finding of issue 28 (4 million invalid
    indices, 16 MB) with and without a Content-Length, a list one over the batch limit, lists
    of invalid elements filling the batch or the body limit, a string filling the body limit,
    and the largest valid request (``max_batch`` distinct indices of a pool of ``pool``
    rows)."""
    finding = labels_json(b"-1," * 4_000_000 + b"-1")
    bodies = [("4M invalid indices", finding, False),
              ("4M invalid indices, chunked", finding, True),
              ("max_batch + 1 invalid indices",
               labels_json(b",".join([b"-1"] * (max_batch + 1))), False),
              ("max_batch strings", labels_json(b",".join([b'"a"'] * max_batch)), False),
              ("max_batch invalid indices", labels_json(b",".join([b"-1"] * max_batch)), False),
              ("string filling the limit", labels_json(b"1", b',"pad":"' + b"x" * (
                  limit - 64) + b'"'), False)]
    rows = min(max_batch, pool)
    valid = b",".join(b"%d" % i for i in range(rows))
    if interactive:
        row = b"[" + b",".join([b"0.1"] * CLASSES) + b"]"
        bodies.append(("largest valid request", labels_json(
            valid, b',"student_probs":[' + b",".join([row] * rows) + b"]"), False))
        bad_numbers = b"[" + b",".join([b"true"] * CLASSES) + b"]"
        bodies.append(("student_probs of booleans", labels_json(
            valid, b',"student_probs":[' + b",".join([bad_numbers] * rows) + b"]"), False))
        per_row = (limit - len(labels_json(valid)) - 64) // rows
        bad_row = b"[" + b",".join([b"[]"] * ((per_row - 3) // 3)) + b"]"
        bodies.append(("student_probs of empty lists filling the limit", labels_json(
            valid, b',"student_probs":[' + b",".join([bad_row] * rows) + b"]"), False))
    else:
        bodies.append(("largest valid request", labels_json(valid), False))
    return bodies


def open_bodies(url: str, n: int) -> list[socket.socket]:
    """``n`` connections that send headers and the start of a 1000-byte body, then nothing."""
    host, port = url.removeprefix("http://").split(":")
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)))
        s.sendall(b"POST /v1/labels HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                  b"\r\nAuthorization: Bearer " + TOKENS[0].encode() +
                  b"\r\nContent-Length: 1000\r\n\r\n{\"request_id\":")
        socks.append(s)
    return socks


def dribble(sock: socket.socket, stop: threading.Event) -> None:
    """Send one byte of the body every 0.5 s (never idle long, never finished)."""
    with contextlib.suppress(OSError):
        while not stop.wait(0.5):
            sock.sendall(b" ")


def timed_out(socks: list[socket.socket]) -> int:
    """How many of ``socks`` got a 408 answer (then closes them)."""
    count = 0
    for s in socks:
        s.settimeout(0.5)
        with contextlib.suppress(OSError):
            count += b" 408 " in s.recv(4096).split(b"\r\n")[0]
        s.close()
    return count


def bounds_server(workdir: Path, name: str, mechanism: tuple[str, ...], max_batch: int,
                  slow_bodies: bool, votes: str = "votes.npy") -> dict[str, Any]:
    """One server under the heavy bodies, one kind at a time (``REPEATS`` concurrent copies of
    each), then with ``slow_bodies`` the half-open and dribbled bodies. For each kind: the
    statuses, the server's peak memory above its memory before (VmHWM) and the longest
    /healthz answer meanwhile."""
    interactive = mechanism is INTERACTIVE
    ledger = f"sqlite:///{workdir / f'bounds-{name}-{max_batch}.db'}"
    server = Server(workdir, ledger, 1e6, "--max-batch", str(max_batch), "--body-timeout",
                    str(BODY_TIMEOUT_S), mechanism=mechanism, votes=votes)
    pool = len(np.load(workdir / votes, mmap_mode="r"))
    # the server's body limit (pate.aggregation.label_service.LabelService._query_bytes: a
    # pool index, and for Interactive-GNMax a row of probabilities of the pool's classes)
    query_bytes = 21 + (4 + 26 * CLASSES if interactive else 0)
    bodies = heavy_bodies(Limits(max_batch=max_batch).body_bytes(query_bytes), max_batch,
                          pool, interactive)
    probes: list[tuple[float, float]] = []  # (start, seconds) of each /healthz request
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            while not done.is_set():
                t0 = time.perf_counter()
                with contextlib.suppress(httpx.HTTPError):
                    http.get("/healthz")
                probes.append((t0, time.perf_counter() - t0))
                time.sleep(0.02)

    def stall(since: float) -> float:
        return round(max((d for t, d in probes if t + d >= since), default=0.0), 3)

    def send(body: bytes, chunked: bool, k: int, statuses: dict[int, int]) -> None:
        body = body.replace(b'"request_id":"b"', b'"request_id":"b%d"' % k, 1)
        content: bytes | Iterator[bytes] = body
        if chunked:
            content = (body[i:i + 65536] for i in range(0, len(body), 65536))
        try:
            status = httpx.post(server.url + "/v1/labels", content=content, timeout=120,
                                headers={**auth(), "Content-Type": "application/json"}
                                ).status_code
        except httpx.HTTPError:
            status = 0
        with lock:
            statuses[status] = statuses.get(status, 0) + 1

    lock = threading.Lock()
    kinds = []
    prober = threading.Thread(target=probe)
    prober.start()
    try:
        for what, body, chunked in bodies:
            statuses: dict[int, int] = {}
            before, t0 = server.reset_peak(), time.perf_counter()
            senders = [threading.Thread(target=send, args=(body, chunked, k, statuses))
                       for k in range(REPEATS)]
            for t in senders:
                t.start()
            for t in senders:
                t.join()
            time.sleep(0.1)  # a probe after the last answer
            kinds.append({"body": what, "bytes": len(body), "statuses": statuses,
                          "extra_memory_mb": round((server.peak() - before) / 2**20, 1),
                          "max_healthz_s": stall(t0)})
        if slow_bodies:
            before, t0 = server.reset_peak(), time.perf_counter()
            socks = open_bodies(server.url, HALF_OPEN + DRIBBLES)
            stop = threading.Event()
            dribblers = [threading.Thread(target=dribble, args=(s, stop))
                         for s in socks[HALF_OPEN:]]
            for t in dribblers:
                t.start()
            time.sleep(BODY_TIMEOUT_S + 1)
            stop.set()
            for t in dribblers:
                t.join()
            kinds.append({"body": f"{HALF_OPEN} half-open and {DRIBBLES} dribbled bodies",
                          "timed_out_408": timed_out(socks),
                          "extra_memory_mb": round((server.peak() - before) / 2**20, 1),
                          "max_healthz_s": stall(t0)})
    finally:
        done.set()
        prober.join()
        alive = server.alive()
        server.stop()
    return {"server": name, "max_batch": max_batch, "pool": pool, "concurrent_copies": REPEATS,
            "kinds": kinds, "healthz_probes": len(probes), "alive": alive,
            "extra_memory_mb": max(k["extra_memory_mb"] for k in kinds),
            "max_healthz_s": max(k["max_healthz_s"] for k in kinds)}


def section_bounds(workdir: Path) -> dict[str, Any]:
    """Three servers: GNMax at the default --max-batch, GNMax at the largest on a pool too large
    for the service's table of costs (the most work per valid query), Interactive-GNMax (the
    largest bodies) at the default."""
    np.save(workdir / "large-pool.npy", dirichlet_votes(LARGE_POOL, classes=CLASSES))
    servers = [bounds_server(workdir, "gnmax", GNMAX, 4096, slow_bodies=True),
               bounds_server(workdir, "gnmax", GNMAX, MAX_QUERIES, slow_bodies=False,
                             votes="large-pool.npy"),
               bounds_server(workdir, "interactive", INTERACTIVE, 4096, slow_bodies=False)]
    return {"section": "bounds", "servers": servers,
            "max_extra_memory_mb": max(s["extra_memory_mb"] for s in servers),
            "max_healthz_s": max(s["max_healthz_s"] for s in servers),
            "server_errors": sum(n for s in servers for k in s["kinds"]
                                 for status, n in k.get("statuses", {}).items()
                                 if status >= 500 or not status),
            "all_alive": all(s["alive"] for s in servers)}


# -- PostgreSQL ------------------------------------------------------------------------------


@contextlib.contextmanager
def postgres() -> Iterator[str | None]:
    """A throw-away PostgreSQL server on loopback (Debian's package), or None."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        yield None
        return
    bindir = found[-1].parent
    home = Path(tempfile.mkdtemp(prefix="pate-stress-pg-"))
    run_as: list[str] = []
    if os.geteuid() == 0:
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "LC_ALL": "C"}
    data = home / "data"
    try:
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres", "-E", "UTF8"], check=True, capture_output=True,
                       env=env)
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l",
                        str(home / "log"), "-o",
                        f"-p {port} -k {home} -c listen_addresses=127.0.0.1", "start"],
                       check=True, capture_output=True, env=env, timeout=60)
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                        "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def pg_database(base: str, name: str) -> str:
    """A new empty database ``name`` on the server of ``base``."""
    import psycopg

    with psycopg.connect(base, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return base.rsplit("/", 1)[0] + "/" + name


SECTIONS = ("malformed", "bounds", "concurrent", "kill9-sqlite", "kill9-postgresql",
            "replicas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--kill-trials", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    parser.add_argument("--sections", default=",".join(SECTIONS),
                        help=f"comma-separated subset of {','.join(SECTIONS)} (default: all)")
    args = parser.parse_args()
    wanted = set(args.sections.split(","))
    if not wanted <= set(SECTIONS):
        parser.error(f"unknown sections: {', '.join(sorted(wanted - set(SECTIONS)))}")
    if args.no_postgres:
        wanted -= {"kill9-postgresql", "replicas"}
    sections = []

    def report(section: dict[str, Any]) -> None:
        print(json.dumps(section), flush=True)
        sections.append(section)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        np.save(workdir / "votes.npy", dirichlet_votes(POOL, classes=CLASSES))
        (workdir / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
        (workdir / "tokens.txt").chmod(0o600)
        if "malformed" in wanted:
            report(section_malformed(workdir))
        if "bounds" in wanted:
            report(section_bounds(workdir))
        if "concurrent" in wanted:
            report(section_concurrent(workdir, args.clients, args.requests))
        if "kill9-sqlite" in wanted:
            report(section_kill9(workdir, f"sqlite:///{workdir / 'kill9.db'}", "sqlite",
                                 args.kill_trials))
        if wanted & {"kill9-postgresql", "replicas"}:
            with postgres() as pg:
                if pg is None:
                    report({"section": "postgresql", "skipped": "no PostgreSQL server binaries"})
                else:
                    if "kill9-postgresql" in wanted:
                        report(section_kill9(workdir, pg_database(pg, "kill9"), "postgresql",
                                             args.kill_trials))
                    if "replicas" in wanted:
                        report(section_replicas(workdir, pg_database(pg, "replicas"),
                                                args.replicas, args.clients, args.requests))
    out = ROOT / "results" / "stress_service.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(sections, indent=2) + "\n")


if __name__ == "__main__":
    main()
