"""The service under load: 16 concurrent clients never exceed the budget nor charge twice; a
``kill -9`` under load leaves a consistent ledger whose costs cover every answer returned, and
retries get identical answers; the same against a real PostgreSQL server."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from service_common import votes_for_ledger
from service_harness import TOKENS, Server, auth, serving, write_tokens

from analysis.mechanisms import GNMax
from analysis.orders import default_orders
from pate.aggregation.aggregators import Aggregator
from pate.aggregation.ledger import Ledger
from pate.data.synthetic import dirichlet_votes

SIGMA = "40"
BUDGET = 3.0  # data-independent epsilon: 358 single-label queries at sigma 40
DELTA = 1e-5
MISMATCH = -1


@pytest.fixture(scope="module")
def workdir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("load")
    np.save(d / "votes.npy", dirichlet_votes(4000, strict=True))
    write_tokens(d / "tokens.txt")
    return d


def args_for(d: Path, ledger: str, budget: float = BUDGET) -> list[str]:
    return ["--votes", str(votes_for_ledger(d / "votes.npy", ledger)), "--mechanism",
            "gnmax", "--sigma", SIGMA,
            "--budget-epsilon", str(budget), "--delta", str(DELTA),
            "--token-file", str(d / "tokens.txt"), "--ledger", ledger]


def client_loop(url: str, k: int, n: int, results: dict[str, tuple[int, list[int]]],
                lock: threading.Lock, stop: threading.Event | None = None) -> None:
    """One client: n requests of one label each, pool index ``k * n + i`` (so no two clients
    ask the same index while ``16 * n`` fits the pool of 4000; past it, indices come round
    again and are replayed); every 5th request_id is sent again.
    ``results``: request_id -> (status, [label, index]); MISMATCH if a retry's answer differed."""
    with httpx.Client(base_url=url, headers=auth(TOKENS[k % 2]), timeout=30) as http:
        for i in range(n):
            if stop is not None and stop.is_set():
                return
            retry = i % 5 == 4
            rid = f"c{k}-{i - 1 if retry else i}"
            if retry:  # the previous request again, same body, if it was answered
                status, answer = results.get(rid, (0, []))
                if status != 200:
                    continue
                body = {"request_id": rid, "indices": answer[1:]}
            else:
                body = {"request_id": rid, "indices": [(k * n + i) % 4000]}
            try:
                r = http.post("/v1/labels", json=body)
            except httpx.HTTPError:
                continue  # the server is gone (kill -9 test)
            with lock:
                if r.status_code == 200:
                    labels = r.json()["labels"]
                    if rid in results and results[rid][1][0] != labels[0]:
                        results[rid] = (MISMATCH, [])  # a retry got another answer
                    else:
                        results[rid] = (200, [labels[0], *body["indices"]])
                else:
                    results.setdefault(rid, (r.status_code, []))


def check_ledger(ledger_url: str, results: dict[str, tuple[int, list[int]]],
                 budget: float = BUDGET) -> Ledger:
    """Every answer returned is in the ledger, identical; an index asked again got its first
    answer; totals match the queries charged, each once; epsilon <= budget."""
    ledger = Ledger(ledger_url, default_orders(), DELTA, budget)  # verifies consistency
    history = list(ledger.history())  # request ids repeat across clients (each its own)
    stored = {s.request_id: s for s in history}
    answered = {rid: v for rid, v in results.items() if v[0] == 200}
    released: dict[int, int] = {}
    for rid, (_, (label, index)) in answered.items():
        assert stored[rid].labels.tolist() == [label]
        assert released.setdefault(index, label) == label  # one release per index
    state = ledger.budget()
    assert state.epsilon_spent <= budget
    charged = sum(int(s.fresh.sum()) for s in history)
    assert state.queries == charged  # one label per charged query: none charged twice
    per_query = Aggregator(GNMax(sigma=float(SIGMA))).worst_case_rdp(1)
    ind, _ = ledger.private_totals()
    np.testing.assert_allclose(ind, charged * per_query, rtol=1e-9)
    return ledger


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_16_clients_x_200_requests_share_one_budget(workdir: Path) -> None:
    url = f"sqlite:///{workdir / 'concurrent.db'}"
    results: dict[str, tuple[int, list[int]]] = {}
    lock = threading.Lock()
    with serving(args_for(workdir, url), workdir) as server:
        threads = [threading.Thread(target=client_loop,
                                    args=(server.url, k, 200, results, lock))
                   for k in range(16)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        final = httpx.get(server.url + "/v1/budget", headers=auth()).json()
    statuses = {s for s, _ in results.values()}
    assert statuses <= {200, 403} and 403 in statuses and 200 in statuses
    assert final["epsilon_spent"] <= BUDGET
    answered = sum(1 for s, _ in results.values() if s == 200)
    assert final["queries"] == answered
    check_ledger(url, results).close()


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_kill_9_under_load_then_restart(workdir: Path) -> None:
    url = f"sqlite:///{workdir / 'crash.db'}"
    results: dict[str, tuple[int, list[int]]] = {}
    lock = threading.Lock()
    stop = threading.Event()
    server = Server(args_for(workdir, url, budget=50.0), workdir).start()
    threads = [threading.Thread(target=client_loop,
                                args=(server.url, k, 10_000, results, lock, stop))
               for k in range(8)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 30
    while sum(1 for s, _ in results.values() if s == 200) < 300:
        assert time.monotonic() < deadline, "the server answered too little"
        time.sleep(0.05)
    server.kill9()
    stop.set()
    for t in threads:
        t.join()
    assert sum(1 for s, _ in results.values() if s == 200) >= 300
    assert MISMATCH not in {s for s, _ in results.values()}

    check_ledger(url, results, budget=50.0).close()
    with serving(args_for(workdir, url, budget=50.0), workdir) as again, \
            httpx.Client(base_url=again.url, headers=auth()) as http:
        for rid, (status, answer) in list(results.items())[:400]:
            if status != 200:
                continue
            r = http.post("/v1/labels", json={"request_id": rid, "indices": answer[1:]})
            assert r.status_code == 200 and r.json()["labels"] == answer[:1]
        queries = http.get("/v1/budget").json()["queries"]
    ledger = check_ledger(url, results, budget=50.0)
    assert ledger.budget().queries == queries  # the retries cost nothing
    ledger.close()


# -- PostgreSQL ------------------------------------------------------------------------------


def _pg_bin() -> Path | None:
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    return found[-1].parent if found else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def postgres() -> Iterator[str]:
    """A throw-away PostgreSQL server from the Debian package (``postgresql``), as the
    ``postgres`` user when run as root (initdb refuses root)."""
    pytest.importorskip("psycopg", reason="the PostgreSQL driver psycopg is not installed")
    bindir = _pg_bin()
    if bindir is None:
        pytest.skip("no PostgreSQL server binaries (Debian package 'postgresql')")
    # the postgres user cannot enter pytest's private temporary directories: a top-level one
    home = Path(tempfile.mkdtemp(prefix="pate-test-pg-"))
    data = home / "data"
    run_as: list[str] = []
    if os.geteuid() == 0:
        if shutil.which("runuser") is None:
            pytest.skip("running as root without runuser to drop to the postgres user")
        run_as = ["runuser", "-u", "postgres", "--"]
        shutil.chown(home, "postgres")
    port = _free_port()
    env = {**os.environ, "LC_ALL": "C"}
    try:
        subprocess.run([*run_as, str(bindir / "initdb"), "-D", str(data), "-A", "trust",
                        "-U", "postgres", "-E", "UTF8", "--no-sync"],
                       check=True, capture_output=True, env=env)
        subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-w", "-l",
                        str(home / "log"), "-o",
                        f"-p {port} -k {home} -c listen_addresses=127.0.0.1",
                        "start"], check=True, capture_output=True, env=env, timeout=60)
    except (subprocess.CalledProcessError, subprocess.TimeoutExpired, OSError) as exc:
        shutil.rmtree(home, ignore_errors=True)
        pytest.skip(f"cannot start PostgreSQL: {exc}")
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        with contextlib.suppress(subprocess.SubprocessError):
            subprocess.run([*run_as, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate",
                            "stop"], capture_output=True, timeout=60)
        shutil.rmtree(home, ignore_errors=True)


def test_postgresql_ledger_shared_by_two_servers(workdir: Path, postgres: str) -> None:
    """Two server processes on one PostgreSQL ledger: one budget, no double charge, and the
    ledger stays consistent."""
    results: dict[str, tuple[int, list[int]]] = {}
    lock = threading.Lock()
    budget = 1.5
    with serving(args_for(workdir, postgres, budget), workdir) as one, \
            serving(args_for(workdir, postgres, budget), workdir) as two:
        threads = [threading.Thread(target=client_loop,
                                    args=((one, two)[k % 2].url, k, 80, results, lock))
                   for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert "ledger postgresql+psycopg://postgres@127.0.0.1" in one.banner
    statuses = {s for s, _ in results.values()}
    assert statuses <= {200, 403} and 403 in statuses and 200 in statuses
    check_ledger(postgres, results, budget).close()
