"""The process of ``pate serve``: a listening socket, the label service of a run or a votes
file, and uvicorn running its HTTP app, in the foreground (``run``) or in a background thread
(``running``) (docs/design.md, "The aggregation service")."""

from __future__ import annotations

import contextlib
import logging
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path
from types import FrameType

import uvicorn

from analysis.mechanisms import Mechanism
from analysis.rdp import Conversion
from pate.aggregation.delta_policy import check_delta
from pate.aggregation.label_requests import Limits
from pate.aggregation.label_service import (
    LabelService,
    LedgerKeys,
    TeacherEnsemble,
    open_label_service,
)
from pate.errors import UserError
from pate.rundir import RunDir
from pate.service.app import create_app
from pate.service.tokens import TokenStore
from teachers.manifest import TeachersManifest


def load_run_ensemble(run_dir: str | Path, device: str = "cpu") -> TeacherEnsemble | None:
    """The run's teachers (``teachers.votes.load_ensemble``), which answer ``inputs``
    requests; None when the run has no teachers. ``UserError`` if they are not all trained."""
    if not RunDir(run_dir).teachers.is_dir():
        return None
    from teachers.votes import load_ensemble  # torch: only where a run's teachers vote

    return load_ensemble(run_dir, device)


def teachers_keys(run_dir: str | Path) -> LedgerKeys | None:
    """The ledger keys of the private data the run's teachers learnt from, as their manifest
    records them (None without one)."""
    manifest = TeachersManifest.read(run_dir)
    return None if manifest is None else LedgerKeys(
        manifest.data_fingerprint, manifest.former_data_fingerprint, manifest.rows_fingerprint,
        manifest.encoded_rows_fingerprint)


class _Server(uvicorn.Server):
    """uvicorn's server, but a SIGTERM is an ordinary request to stop: uvicorn re-raises the
    signal once it has shut down gracefully, which kills the process (exit -15) before its
    stop message; here ``run`` returns and the process exits 0."""

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        super().handle_exit(sig, frame)
        if sig == signal.SIGTERM:
            self._captured_signals.remove(sig)


class LabelServer:
    """A ``LabelService`` behind its HTTP app on a listening socket; ``close`` stops the
    service (uvicorn's shutdown does too). ``access_log`` logs one line per request (to
    stdout); ``docs`` serves /docs (its scripts come from a CDN)."""

    def __init__(self, service: LabelService, tokens: TokenStore, sock: socket.socket,
                 access_log: bool = False, docs: bool = False) -> None:
        self.service, self.sock = service, sock
        # uvicorn's own logging configuration (dictConfig) closes every handler the process
        # has (a Python caller's, another library's): only the access log, of pate serve
        # alone, needs its handlers; warnings reach stderr without them.
        self._config = uvicorn.Config(
            create_app(service, tokens, docs), log_level="warning", access_log=access_log,
            log_config=uvicorn.config.LOGGING_CONFIG if access_log else None,
            timeout_graceful_shutdown=10, timeout_keep_alive=5)
        if access_log:  # the config set every uvicorn logger to warning, access lines are info
            logging.getLogger("uvicorn.access").setLevel(logging.INFO)

    @property
    def url(self) -> str:
        """``http://host:port`` of the listening socket."""
        host, port = self.sock.getsockname()[:2]
        return f"http://{host}:{port}"

    def run(self) -> None:
        """Serve until interrupted (SIGINT, SIGTERM)."""
        _Server(self._config).run(sockets=[self.sock])

    @contextlib.contextmanager
    def running(self) -> Iterator[str]:
        """Serve in a background thread of this process; yields the URL once it accepts
        requests, stops the server on exit."""
        server = _Server(self._config)
        thread = threading.Thread(target=server.run, kwargs={"sockets": [self.sock]},
                                  name="label-server", daemon=True)
        thread.start()
        try:
            while not server.started:
                if not thread.is_alive():
                    raise UserError(f"the label server on {self.url} stopped at start-up")
                thread.join(0.05)
            yield self.url
        finally:
            server.should_exit = True
            thread.join(30)

    def close(self) -> None:
        """Stop the service and close the socket."""
        self.service.close()
        self.sock.close()


def open_server(mechanism: Mechanism, *, token_file: str | Path, epsilon_budget: float,
                delta: float, run_dir: str | Path | None = None,
                votes_path: str | Path | None = None, ledger: str | Path | None = None,
                conversion: Conversion = "improved", host: str = "127.0.0.1", port: int = 8470,
                device: str = "cpu", limits: Limits | None = None,
                access_log: bool = False, docs: bool = False,
                world_readable_tokens: bool = False, private_records: int | None = None,
                allow_large_delta: bool = False,
                allow_name: str = "--allow-large-delta") -> LabelServer:
    """Check ``delta`` against the ``private_records`` the votes protect, where known (as
    ``open_label_service`` does), read the tokens, listen on ``host:port`` (0 picks a free
    port), open the label service (with ``run_dir``, its trained teachers answer ``inputs``)
    and put it behind the HTTP app. Raises ``UserError`` (or ``LedgerError``) before anything
    is served."""
    check_delta(delta, private_records, allow_large_delta, allow_name)  # before the tokens
    tokens = TokenStore(token_file, allow_world_readable=world_readable_tokens)
    try:
        sock = socket.create_server((host, port))
        # Accepted connections inherit TCP_NODELAY (Linux): without it, a response written in
        # several pieces waits for the client's delayed ACK (~40 ms) after the first.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        raise UserError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    try:
        ensemble = None if run_dir is None else load_run_ensemble(run_dir, device)
        service = open_label_service(
            mechanism, epsilon_budget=epsilon_budget, delta=delta, run_dir=run_dir,
            votes_path=votes_path, ensemble=ensemble, ledger=ledger,
            conversion=conversion, limits=limits, private_records=private_records,
            allow_large_delta=allow_large_delta, allow_name=allow_name,
            ensemble_keys=None if ensemble is None else teachers_keys(run_dir))
    except BaseException:
        sock.close()
        raise
    return LabelServer(service, tokens, sock, access_log, docs)
