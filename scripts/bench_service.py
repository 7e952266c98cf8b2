"""Benchmark of the aggregation service: labels per second and p50/p99 latency of POST /v1/labels
for batches of 1, 100 and 1 000 pool indices with 1 and 8 concurrent clients.

Confident-GNMax (PATE 2018, Algorithm 1; MNIST parameters T=200, sigma1=150, sigma2=40) over 250
teachers' synthetic votes, SQLite ledger (WAL, synchronous=FULL), a real ``pate serve`` process on
loopback. Pool indices are never repeated (a case ends when the pool runs out): an index asked
again would be a free replay of its first answer and flatter the figures; each case has its own
server and ledger. The pool (150 000 rows) keeps the service's table of answer costs within its
memory limit, as a real pool of that size would. Prints one JSON object per case and writes them
all to results/bench_service.json.

    python scripts/bench_service.py [--seconds 5] [--pool 150000] [--batches 1 100 1000]
                                    [--clients 1 8] [--rounds 1] [--baseline DIR]

With ``--baseline DIR`` (another checkout, e.g. ``git worktree add /tmp/before COMMIT``) every
run of a case is run on both servers, in alternating order, so that a busy machine weighs on
both alike.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import numpy as np
from service_common import votes_for_ledger

from pate.data.synthetic import dirichlet_votes

ROOT = Path(__file__).resolve().parent.parent
TOKEN = "bench-token"
MECHANISM = ["--mechanism", "confident", "--threshold", "200", "--sigma1", "150",
             "--sigma2", "40"]


def start_server(workdir: Path, case: str, code: Path = ROOT
                 ) -> tuple[subprocess.Popen[str], str]:
    """A ``pate serve`` of the checkout ``code`` on the pool of ``workdir`` with a new ledger of
    its own."""
    ledger = f"sqlite:///{workdir / case}.db"
    cmd = [sys.executable, "-m", "pate", "serve", "--votes",
           str(votes_for_ledger(workdir / "votes.npy", ledger)), *MECHANISM,
           "--budget-epsilon", "1e9", "--delta", "1e-5", "--token-file",
           str(workdir / "tokens.txt"), "--port", "0", "--ledger", ledger]
    proc = subprocess.Popen(cmd, cwd=code, env={**os.environ, "PYTHONPATH": str(code)},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        m = re.search(r"listening on (http://[\d.]+:\d+)", line)
        if m:
            url = m.group(1)
            break
    else:
        raise SystemExit("pate serve did not start")
    for _ in range(200):
        try:
            if httpx.get(url + "/healthz").status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.05)
    raise SystemExit("pate serve does not answer")


async def client(url: str, batch: int, unasked: list[int], until: float, warm_until: float,
                 latencies: list[float]) -> tuple[int, int]:
    """One client sending requests back to back, each of ``batch`` indices taken from the shared
    ``unasked`` (never asked before) until it runs out or time is up; returns (requests sent,
    errors: a refusal or a replayed label)."""
    sent = errors = 0
    async with httpx.AsyncClient(base_url=url, timeout=60,
                                 headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        while (now := time.perf_counter()) < until and len(unasked) >= batch:
            indices = unasked[-batch:]
            del unasked[-batch:]
            t0 = time.perf_counter()
            r = await http.post("/v1/labels", json={"request_id": uuid.uuid4().hex,
                                                    "indices": indices})
            t1 = time.perf_counter()
            sent += 1
            # (a server from before replays answers without "replayed")
            if r.status_code != 200 or any(r.json().get("replayed", ())):
                errors += 1
            elif now >= warm_until:
                latencies.append(t1 - t0)
    return sent, errors


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of a process (Linux /proc; nan elsewhere)."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def run_case(url: str, pid: int, batch: int, clients: int, pool: int,
                   seconds: float) -> dict:
    latencies: list[float] = []
    unasked = np.random.default_rng(batch * 100 + clients).permutation(pool).tolist()
    cpu0 = cpu_seconds(pid)
    start = time.perf_counter()
    warm_until = start + min(0.2, seconds / 5)
    until = warm_until + seconds
    counts = await asyncio.gather(*(client(url, batch, unasked, until, warm_until, latencies)
                                    for _ in range(clients)))
    measured = min(time.perf_counter(), until) - warm_until
    cpu_ms = (cpu_seconds(pid) - cpu0) * 1e3 / max(sum(c[0] for c in counts), 1)
    lat = np.array(latencies) * 1e3
    if not lat.size:
        raise SystemExit(f"no request was measured: the pool of {pool} rows ran out in the "
                         "warm-up (give a larger --pool)")
    return {"bench": "service", "mechanism": "confident", "teachers": 250, "classes": 10,
            "ledger": "sqlite-wal-full", "batch": batch, "clients": clients,
            "requests": int(lat.size), "errors": sum(c[1] for c in counts),
            "labels_per_s": round(lat.size * batch / measured, 1),
            "requests_per_s": round(lat.size / measured, 1),
            "p50_ms": round(float(np.percentile(lat, 50)), 2),
            "p99_ms": round(float(np.percentile(lat, 99)), 2),
            "server_cpu_ms_per_request": round(cpu_ms, 2),
            "seconds": round(measured, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="measured time per case")
    parser.add_argument("--pool", type=int, default=150_000,
                        help="rows of the synthetic pool (each index asked once per case)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 100, 1000])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--rounds", type=int, default=1,
                        help="runs of each case, each with its own server and ledger")
    parser.add_argument("--baseline", type=Path, metavar="DIR",
                        help="another checkout of the repository (e.g. a git worktree of an "
                             "older commit): each run of a case also runs its server, the two "
                             "in alternating order, and a summary compares the medians")
    args = parser.parse_args()
    codes = {"current": ROOT} | ({} if args.baseline is None
                                else {"baseline": args.baseline.resolve()})
    cases = []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        np.save(workdir / "votes.npy", dirichlet_votes(args.pool))
        (workdir / "tokens.txt").write_text(TOKEN + "\n")
        (workdir / "tokens.txt").chmod(0o600)
        for batch in args.batches:
            for clients in args.clients:
                for r in range(args.rounds):
                    order = list(codes.items())
                    for name, code in order[r % 2:] + order[:r % 2]:
                        proc, url = start_server(workdir, f"{name}-{batch}-{clients}-{r}",
                                                 code)
                        try:
                            case = asyncio.run(run_case(url, proc.pid, batch, clients,
                                                        args.pool, args.seconds))
                        finally:
                            proc.terminate()
                            proc.wait(30)
                        case.update(code=name, round=r, cpus=os.cpu_count(),
                                    machine=platform.machine(),
                                    load_average_1min=round(os.getloadavg()[0], 2))
                        print(json.dumps(case), flush=True)
                        cases.append(case)
                if len(codes) > 1 or args.rounds > 1:
                    print(json.dumps(summary(cases, batch, clients, list(codes))), flush=True)
    out = ROOT / "results" / "bench_service.json"
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(cases, indent=2) + "\n")


def summary(cases: list[dict], batch: int, clients: int, codes: list[str]) -> dict:
    """The medians over the runs of a case, per code, and current / baseline."""
    out: dict = {"summary": "median over runs", "batch": batch, "clients": clients}
    for name in codes:
        runs = [c for c in cases
                if (c["code"], c["batch"], c["clients"]) == (name, batch, clients)]
        for key in ("labels_per_s", "p50_ms", "p99_ms", "server_cpu_ms_per_request"):
            out[f"{name}_{key}"] = round(float(np.median([c[key] for c in runs])), 2)
    if "baseline" in codes:
        out["labels_per_s_ratio"] = round(out["current_labels_per_s"]
                                          / out["baseline_labels_per_s"], 3)
    return out


if __name__ == "__main__":
    main()
