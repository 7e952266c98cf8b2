"""Reliability suite of ``pate serve`` on loopback, bounded in time: malformed requests, concurrent
clients against one budget, ``kill -9`` under load (SQLite and PostgreSQL), replicas on one
PostgreSQL ledger, and the memory and /healthz stall under oversized and half-sent requests
(issue 28; figures in docs/benchmarks.md).

Every server is a real ``pate serve`` subprocess on 127.0.0.1; PostgreSQL is a throw-away server
of the Debian package started on loopback (skipped, and said so, where it is missing). Prints one
JSON object per section and writes them all to results/stress_service.json.

    python scripts/stress_service.py [--clients 16] [--requests 200] [--kill-trials 20]
                                     [--replicas 3] [--no-postgres]
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

from analysis.orders import default_orders  # noqa: E402
from pate.aggregation.ledger import Ledger, requests_table  # noqa: E402

TOKENS = ("stress-token-a-0123456789", "stress-token-b-9876543210")
POOL = 4000
SIGMA = 40.0
DELTA = 1e-5
# what a response must never contain: internals and private statistics (docs/design.md,
# privacy rules 2 and 7)
LEAK_MARKERS = ("Traceback", "File \"", "sqlalchemy", "sqlite3", "psycopg", "votes.npy",
                "rdp_dependent", "data-dependent", "/tmp/")


def synthetic_votes(rows: int, teachers: int = 250, classes: int = 10) -> np.ndarray:
    rng = np.random.default_rng(0)
    return rng.multinomial(teachers, rng.dirichlet(np.full(classes, 0.3), size=rows)
                           ).astype(np.int32)


class Server:
    """A ``pate serve`` subprocess on a free loopback port."""

    def __init__(self, workdir: Path, ledger: str, budget: float, *extra: str) -> None:
        cmd = [sys.executable, "-m", "pate", "serve", "--votes", str(workdir / "votes.npy"),
               "--mechanism", "gnmax", "--sigma", str(SIGMA), "--budget-epsilon", str(budget),
               "--delta", str(DELTA), "--token-file", str(workdir / "tokens.txt"),
               "--ledger", ledger, "--port", "0", *extra]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            if m := re.search(r"listening on (http://[\d.]+:\d+)", line):
                self.url = m.group(1)
                break
        else:
            raise SystemExit("pate serve did not start")
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

    def rss(self) -> int:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
        return 0

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
    return any(marker in text for marker in LEAK_MARKERS)


def section_malformed(workdir: Path) -> dict[str, Any]:
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
    url = f"sqlite:///{workdir / 'concurrent.db'}"
    budget = 3.0  # about 1,500 single-label queries at sigma 40: exhausted under load
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
    budget = 1e4
    rng = np.random.default_rng(1)
    results = []
    for trial in range(trials):
        server = Server(workdir, ledger_url, budget)
        tally, stop = Tally(), threading.Event()
        threads = run_clients([server.url], 8, 10_000, tally,
                              lambda k, i, t=trial: (t * 977 + k * 5000 + i) % POOL, stop,
                              prefix=f"t{trial}")
        time.sleep(float(rng.uniform(0.3, 1.2)))
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
            "double_charges": sum(r["double_charges"] for r in results),
            "replay_mismatches": sum(r["replay_mismatches"] for r in results),
            "overshoot": max(r["overshoot"] for r in results)}


def section_replicas(workdir: Path, ledger_url: str, replicas: int, clients: int,
                     requests: int) -> dict[str, Any]:
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


def section_bounds(workdir: Path) -> dict[str, Any]:
    server = Server(workdir, f"sqlite:///{workdir / 'bounds.db'}", 1e6, "--body-timeout", "2")
    before = server.rss()
    peak = before
    stalls: list[float] = []
    done = threading.Event()

    def probe() -> None:
        nonlocal peak
        while not done.is_set():
            t0 = time.perf_counter()
            with contextlib.suppress(httpx.HTTPError):
                httpx.get(server.url + "/healthz", timeout=30)
            stalls.append(time.perf_counter() - t0)
            peak = max(peak, server.rss())
            time.sleep(0.02)

    prober = threading.Thread(target=probe)
    prober.start()
    host, port = server.url.removeprefix("http://").split(":")
    statuses: dict[int, int] = {}
    try:
        big = b'{"request_id":"m","indices":[' + b"-1," * 4_000_000 + b"-1]}"
        near = json.dumps({"request_id": "m", "indices": ["a"] * 4096}).encode()

        def send(body: bytes) -> None:
            with contextlib.suppress(httpx.HTTPError):
                r = httpx.post(server.url + "/v1/labels", content=body, timeout=60,
                               headers={**auth(), "Content-Type": "application/json"})
                statuses[r.status_code] = statuses.get(r.status_code, 0) + 1

        senders = [threading.Thread(target=send, args=(b,)) for b in [big] * 8 + [near] * 8]
        half_open = []
        for _ in range(300):  # bodies that never finish
            s = socket.create_connection((host, int(port)))
            s.sendall(b"POST /v1/labels HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                      b"\r\nAuthorization: Bearer " + TOKENS[0].encode() +
                      b"\r\nContent-Length: 1000\r\n\r\n{\"request_id\":")
            half_open.append(s)
        for t in senders:
            t.start()
        for t in senders:
            t.join()
        time.sleep(3)  # past the body timeout
        closed = 0
        for s in half_open:
            s.settimeout(0.5)
            with contextlib.suppress(OSError):
                if b" 408 " in s.recv(4096).split(b"\r\n")[0]:
                    closed += 1
            s.close()
    finally:
        done.set()
        prober.join()
        alive = server.alive()
        server.stop()
    return {"section": "bounds", "statuses": statuses, "half_open_timed_out": closed,
            "half_open": 300, "extra_memory_mb": round((peak - before) / 2**20, 1),
            "max_healthz_s": round(max(stalls), 3), "alive": alive}


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--requests", type=int, default=200, help="requests per client")
    parser.add_argument("--kill-trials", type=int, default=20)
    parser.add_argument("--replicas", type=int, default=3)
    parser.add_argument("--no-postgres", action="store_true")
    args = parser.parse_args()
    sections = []

    def report(section: dict[str, Any]) -> None:
        print(json.dumps(section), flush=True)
        sections.append(section)

    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        np.save(workdir / "votes.npy", synthetic_votes(POOL))
        (workdir / "tokens.txt").write_text("\n".join(TOKENS) + "\n")
        (workdir / "tokens.txt").chmod(0o600)
        report(section_malformed(workdir))
        report(section_bounds(workdir))
        report(section_concurrent(workdir, args.clients, args.requests))
        report(section_kill9(workdir, f"sqlite:///{workdir / 'kill9.db'}", "sqlite",
                             args.kill_trials))
        with contextlib.ExitStack() as stack:
            pg = None if args.no_postgres else stack.enter_context(postgres())
            if pg is None:
                report({"section": "postgresql", "skipped": "no PostgreSQL server binaries"})
            else:
                report(section_kill9(workdir, pg_database(pg, "kill9"), "postgresql",
                                     args.kill_trials))
                report(section_replicas(workdir, pg_database(pg, "replicas"), args.replicas,
                                        args.clients, args.requests))
    out = ROOT / "results" / "stress_service.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(sections, indent=2) + "\n")


if __name__ == "__main__":
    main()
