"""``pate run``: private data to a published student in one command.

Stages (each one a ``pate`` sub-command, run as a child process, so every stage is exactly what a
user could run by hand): teachers -> votes -> student round 1 (Confident-GNMax) and, if asked for,
round 2 (Interactive-GNMax), each against a real ``pate serve`` process on loopback with a
generated token and the run's one ledger -> dpsgd (optional baseline) -> report. A finished stage
is recorded in ``stages.json`` and skipped on rerun, so a round that was paid for is never asked
again; an interrupted stage is rerun (teachers resume by shard).
"""

from __future__ import annotations

import contextlib
import json
import re
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO

import httpx

from analysis.mechanisms import mechanism_to_dict
from pate.config import RunConfig, dump_config, parse_config
from pate.errors import UserError
from pate.io import ensure_dir, write_bytes_atomic, write_json_atomic

STAGES = ("teachers", "votes", "student-confident", "student-interactive", "dpsgd", "report")
_LISTENING = re.compile(r"listening on (http://[^\s]+)")


def _pate(*args: str) -> list[str]:
    return [sys.executable, "-m", "pate", *args]


def _run_stage(name: str, argv: list[str]) -> None:
    print(f"pate run: {name}: {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.run(argv, stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise UserError(f"stage {name} failed (exit {proc.returncode}); see the lines above")


class StageLog:
    """Which stages of a run are finished (``stages.json``, written atomically)."""

    def __init__(self, run_dir: Path) -> None:
        self.path = run_dir / "stages.json"
        self.done: dict[str, float] = (json.loads(self.path.read_text())
                                       if self.path.is_file() else {})

    def finish(self, stage: str, seconds: float) -> None:
        self.done[stage] = round(seconds, 3)
        write_json_atomic(self.path, self.done)


@contextlib.contextmanager
def label_service(run_dir: Path, config: RunConfig, mechanism: str,
                  token_file: Path) -> Iterator[str]:
    """A real ``pate serve`` process on a free loopback port; yields its URL, stops it after."""
    argv = _pate("serve", "--run", str(run_dir), *_aggregator_args(config, mechanism),
                 "--token-file", str(token_file), "--host", "127.0.0.1", "--port", "0")
    print(f"pate run: serve: {' '.join(argv[2:])}", file=sys.stderr, flush=True)
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, text=True)
    try:
        url = _wait_for_url(proc)
        yield url
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _wait_for_url(proc: subprocess.Popen, timeout: float = 120.0) -> str:
    assert proc.stdout is not None
    deadline = time.monotonic() + timeout
    url = None
    for line in proc.stdout:
        print(line, end="", file=sys.stderr, flush=True)
        match = _LISTENING.search(line)
        if match:
            url = match.group(1)
            break
        if time.monotonic() > deadline:
            break
    if url is None:
        proc.wait(timeout=10)
        raise UserError(f"pate serve did not start (exit {proc.returncode}); see above")
    threading.Thread(target=_forward, args=(proc.stdout,), daemon=True).start()
    while time.monotonic() < deadline:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"{url}/healthz", timeout=2.0).status_code == 200:
                return url
        if proc.poll() is not None:
            raise UserError(f"pate serve exited ({proc.returncode}) before answering /healthz")
        time.sleep(0.2)
    raise UserError("pate serve did not answer /healthz in time")


def _forward(stream: IO[str]) -> None:
    """Copy the server's further output to our stderr, so its pipe never fills."""
    for line in stream:
        print(line, end="", file=sys.stderr, flush=True)


def _token(run_dir: Path) -> Path:
    """A fresh random bearer token for this run's student, private to the run directory."""
    path = run_dir / "service.token"
    if not path.is_file():
        write_bytes_atomic(path, (secrets.token_urlsafe(32) + "\n").encode(), private=True)
    return path


def prepare_run_dir(config: RunConfig, run_dir: Path) -> None:
    """Create the run directory (0700) and its config.toml; a rerun must use the same config."""
    ensure_dir(run_dir, private=True)
    path = run_dir / "config.toml"
    text = dump_config(config)
    if path.is_file():
        if parse_config(path.read_text(), str(path)) != config:
            raise UserError(f"{run_dir} was started with a different configuration; use a new "
                            f"--run directory (or delete {path})")
        return
    write_bytes_atomic(path, text.encode())


def _teachers_argv(config: RunConfig, run_dir: Path) -> list[str]:
    t, d = config.teachers, config.data
    argv = _pate("teachers", "train", "--run", str(run_dir), "--dataset", d.dataset,
                 "--teachers", str(t.count), "--seed", str(t.seed), "--model", t.model,
                 "--epochs", str(t.epochs), "--mixup", repr(t.mixup), "--workers",
                 str(t.workers), "--device", t.device)
    if t.shard_size:
        argv += ["--shard-size", str(t.shard_size)]
    return argv + _data_args(config) + list(t.extra_args)


def _data_args(config: RunConfig) -> list[str]:
    out = []
    if config.data.data_dir:
        out += ["--data-dir", config.data.data_dir]
    if config.data.pool_size:
        out += ["--pool-size", str(config.data.pool_size)]
    return out


def _aggregator_args(config: RunConfig, mechanism: str) -> list[str]:
    a = config.aggregator
    record = mechanism_to_dict(a.round_mechanism(mechanism))
    return ["--mechanism", record.pop("mechanism"),
            *(arg for name, value in record.items() for arg in (f"--{name}", repr(value))),
            "--budget-epsilon", repr(a.budget_epsilon), "--delta", repr(a.delta)]


def _student_args(config: RunConfig) -> list[str]:
    """``pate student train``'s options from the config's student section (not the round's)."""
    s = config.student
    return ["--method", s.method, *(["--arch", s.arch] if s.arch else []),
            "--dataset", config.data.dataset, "--select", s.select, "--epochs", str(s.epochs),
            "--device", s.device, *_data_args(config), *s.extra_args]


def _student_round(config: RunConfig, run_dir: Path, mechanism: str, queries: int) -> None:
    """One query round of the student against a ``pate serve`` of ``mechanism``."""
    token = _token(run_dir)
    with label_service(run_dir, config, mechanism, token) as url:
        _run_stage(f"student-{mechanism}", _pate(
            "student", "train", "--run", str(run_dir), "--server", url, "--token-file",
            str(token), "--mechanism", mechanism, "--queries", str(queries),
            *_student_args(config)))


def _dpsgd_stage(config: RunConfig, run_dir: Path) -> None:
    p = config.dpsgd
    _run_stage("dpsgd", _pate("dpsgd", "train", "--run", str(run_dir), "--dataset",
                              config.data.dataset, "--epsilon", repr(p.epsilon), "--delta",
                              repr(config.aggregator.delta), "--epochs", str(p.epochs),
                              *p.extra_args))


def _report_stage(config: RunConfig, run_dir: Path) -> None:
    from pate.report.run_report import write_run_report

    print(f"pate run: report: {write_run_report(run_dir)}", file=sys.stderr, flush=True)


def run_pipeline(config: RunConfig, run_dir: Path) -> Path:
    """Run every unfinished stage in order; returns the report's path."""
    prepare_run_dir(config, run_dir)
    log = StageLog(run_dir)
    actions: dict[str, Callable[[], None]] = {
        "teachers": lambda: _run_stage("teachers", _teachers_argv(config, run_dir)),
        "votes": lambda: _run_stage("votes", _pate("teachers", "votes", "--run", str(run_dir),
                                                   "--device", config.teachers.device)),
        "student-confident": lambda: _student_round(config, run_dir, "confident",
                                                    config.student.queries),
        "student-interactive": lambda: _student_round(config, run_dir, "interactive",
                                                      config.student.interactive_queries),
        "dpsgd": lambda: _dpsgd_stage(config, run_dir),
        "report": lambda: _report_stage(config, run_dir),
    }
    for stage in STAGES:
        if (stage == "dpsgd" and not config.dpsgd.enabled) or (
                stage == "student-interactive" and not config.student.interactive_queries):
            continue
        if stage in log.done:
            print(f"pate run: {stage}: done already, skipped", file=sys.stderr, flush=True)
            continue
        start = time.monotonic()
        actions[stage]()
        log.finish(stage, time.monotonic() - start)
    return run_dir / "report" / "report.html"
