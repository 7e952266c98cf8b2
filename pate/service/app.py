"""The aggregation service: validates a student's request, has the aggregator answer it, records
the cost in the ledger and only then answers (DESIGN.md, "The aggregation service" and privacy
rules 2-7).

``LabelService`` is the transport-independent core (``pate student train`` can run it in-process);
``create_app`` puts it behind FastAPI with bearer-token authentication, size limits and JSON errors
``{"error", "detail"}``: 400 malformed, 413 too large, 422 invalid, 401 no or bad token, 403 budget
exhausted, 409 request_id reused with another body, 500 (nothing released) if a cost cannot be
computed or recorded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import hashlib
import json
import logging
import os
import threading
import warnings
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
from fastapi import FastAPI, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from numpy.typing import NDArray
from pydantic import BaseModel, ConfigDict, Field, StrictInt, model_validator
from starlette.exceptions import HTTPException as StarletteHTTPException

from analysis.orders import default_orders
from analysis.rdp import Conversion
from pate.aggregation.aggregators import Aggregator, Branch, MechanismParams, check_student_probs
from pate.aggregation.ledger import (
    Budget,
    BudgetExhausted,
    Charge,
    Ledger,
    LedgerError,
    RequestConflict,
    Stored,
)
from pate.data.votes_file import load_votes
from pate.errors import UserError

log = logging.getLogger("pate.service.app")

BRANCH_NAMES = np.array([b.name.lower() for b in sorted(Branch)])  # indexed by Branch value


@dataclass(frozen=True)
class Limits:
    """Request limits: queries per request and bytes per body."""

    max_batch: int = 4096
    max_body_bytes: int = 16 * 2**20


class RequestError(Exception):
    """A request the service refuses: HTTP status, a short error code and a public detail."""

    def __init__(self, status: int, error: str, detail: Any = None) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail


# -- request and response bodies ------------------------------------------------------------


class InputsPayload(BaseModel):
    """New inputs for the teachers to vote on: a float32 array [n, C, H, W], base64 of its
    little-endian C-order bytes."""

    model_config = ConfigDict(extra="forbid")
    dtype: Literal["float32"]
    shape: list[StrictInt] = Field(min_length=2, max_length=8)
    data: str


class LabelsRequest(BaseModel):
    """POST /v1/labels: exactly one of ``indices`` (rows of the registered public pool) and
    ``inputs``; Interactive-GNMax also needs the student's probabilities, one row per query."""

    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")
    indices: list[Annotated[StrictInt, Field(ge=0, lt=2**63)]] | None = None
    inputs: InputsPayload | None = None
    student_probs: list[list[float]] | None = None

    @model_validator(mode="after")
    def _one_source(self) -> LabelsRequest:
        if (self.indices is None) == (self.inputs is None):
            raise ValueError("give exactly one of 'indices' and 'inputs'")
        return self

    def digest(self) -> str:
        """sha256 of the body's content without its request_id (what a retry must repeat)."""
        return hashlib.sha256(self.model_dump_json(exclude={"request_id"}).encode()).hexdigest()


class LabelsResponse(BaseModel):
    request_id: str
    labels: list[int] = Field(description="-1 where the aggregator declined to answer")
    branch: list[Literal["teachers", "student", "none"]]
    answered: int
    budget: Budget


class ErrorBody(BaseModel):
    error: str
    detail: Any = None


# -- the public pool's votes ---------------------------------------------------------------


class VotePool:
    """The teachers' votes on the registered public pool, addressed by pool index (PRIVATE)."""

    def __init__(self, votes: NDArray[np.integer], pool_index: NDArray[np.integer] | None = None
                 ) -> None:
        self.votes = np.asarray(votes, np.int64)
        index = (np.arange(len(self.votes)) if pool_index is None
                 else np.asarray(pool_index, np.int64))
        if index.shape != (len(self.votes),):
            raise UserError(f"pool_index must be 1-d with one entry per votes row, got shape "
                            f"{list(index.shape)}")
        self._order = np.argsort(index, kind="stable")
        self._sorted = index[self._order]
        if np.any(np.diff(self._sorted) == 0):
            raise UserError("pool_index has repeated entries")

    @classmethod
    def from_file(cls, path: str | Path) -> VotePool:
        """``.npy`` votes, or ``.npz`` with ``votes`` and optional ``pool_index`` (votes.npz)."""
        votes = load_votes(path)
        pool_index = None
        if str(path).endswith(".npz"):
            with np.load(path, allow_pickle=False) as data:
                if "pool_index" in data.files:
                    pool_index = data["pool_index"]
        if pool_index is not None and not np.issubdtype(pool_index.dtype, np.integer):
            raise UserError(f"{path}: pool_index must be integers")
        return cls(votes, pool_index)

    @property
    def classes(self) -> int:
        return int(self.votes.shape[1])

    def rows(self, indices: NDArray[np.int64]) -> NDArray[np.intp]:
        """Rows of ``votes`` holding the given pool indices; unknown or repeated indices are a
        422."""
        pos = np.searchsorted(self._sorted, indices)
        pos_c = np.minimum(pos, self._sorted.size - 1)
        unknown = self._sorted[pos_c] != indices
        if unknown.any():
            bad = indices[unknown][:5].tolist()
            raise RequestError(422, "invalid_request",
                               f"indices not in the registered pool: {bad}")
        if np.unique(indices).size != indices.size:
            raise RequestError(422, "invalid_request", "indices must not repeat within a request")
        return self._order[pos_c]


# -- tokens --------------------------------------------------------------------------------


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Bearer tokens from a file, one per line ('#' comments allowed), kept only as sha256
    hashes. The file is re-read when it changes, so deleting a line revokes that token; if the
    file cannot be read, no token is accepted (fail closed)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._hashes: frozenset[str] = frozenset()
        self._reload()
        if not self._hashes:
            raise UserError(f"{self.path}: no tokens (one per line)")
        if self.path.stat().st_mode & 0o077:
            warnings.warn(f"{self.path} is readable by other users; chmod 600 it",
                          UserWarning, stacklevel=2)

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if stamp == self._stamp:
                return
            lines = self.path.read_text().splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            if self._stamp is None:
                raise UserError(f"{self.path}: cannot read the token file "
                                f"({exc.__class__.__name__})") from None
            log.warning("token file unreadable (%s): refusing every token", type(exc).__name__)
            self._stamp, self._hashes = None, frozenset()
            return
        self._hashes = frozenset(token_hash(t) for line in lines
                                 if (t := line.strip()) and not t.startswith("#"))
        self._stamp = stamp

    def client(self, token: str) -> str | None:
        """The client id (a prefix of the token's hash) of a valid token, else None."""
        with self._lock:
            self._reload()
            h = token_hash(token)
            return h[:16] if h in self._hashes else None


# -- the transport-independent service ------------------------------------------------------


class LabelService:
    """Validate, vote, aggregate, record, answer. Thread-safe; ``close`` stops the ledger."""

    def __init__(self, aggregator: Aggregator, ledger: Ledger, pool: VotePool | None,
                 ensemble: Any = None, limits: Limits | None = None) -> None:
        if pool is None and ensemble is None:
            raise UserError("nothing to serve: no votes file and no teacher ensemble")
        if not np.array_equal(aggregator.orders, ledger.orders):
            raise ValueError("the aggregator must cost on the ledger's orders grid")
        self.aggregator = aggregator
        self.ledger = ledger
        self.pool = pool
        self.ensemble = ensemble
        self.limits = limits or Limits()
        self._mechanism = json.dumps(aggregator.params.public(), sort_keys=True)
        # the pool's data-dependent answer costs, computed once (vectorised) at start-up
        self._tabulated = pool is not None and aggregator.tabulate(pool.votes)
        self._vote_lock = threading.Lock()

    def budget(self) -> dict[str, Any]:
        return self.ledger.budget().as_json()

    def labels(self, req: LabelsRequest, client: str) -> dict[str, Any]:
        """Answer ``req`` (or replay its stored answer), waiting for the ledger's commit.
        Raises ``RequestError``; any other exception means nothing was released."""
        return self.conclude(req, self.submit(req, client))

    def submit(self, req: LabelsRequest, client: str) -> Future[tuple[Stored, Budget]]:
        """Validate ``req``, have the aggregator answer it and queue the answer and its cost
        to the ledger; nothing leaves before the returned future resolves (write-ahead).
        A stored request is not answered again: a retry draws no new noise."""
        digest = req.digest()
        if req.inputs is not None:  # the ensemble's work is worth skipping for a retry
            stored = self.ledger.lookup(req.request_id)
            if stored is not None:
                done: Future[tuple[Stored, Budget]] = Future()
                if stored.body_digest == digest:
                    done.set_result((stored, self.ledger.budget()))
                else:
                    done.set_exception(RequestConflict(req.request_id))
                return done
        if req.indices is not None:
            rows = self._pool_rows(req.indices)
            votes = self.pool.votes[rows]
        else:
            rows, votes = None, self._vote_on_inputs(req.inputs)
        probs = self._student_probs(req, votes.shape)
        answers = self.aggregator.answer(votes, probs, rows if self._tabulated else None)
        return self.ledger.submit(Charge(
            req.request_id, digest, client, self._mechanism, answers.labels,
            answers.branch, answers.total_independent(), answers.total_dependent(),
            self.aggregator.worst_case_rdp(votes.shape[0])))

    def conclude(self, req: LabelsRequest, recorded: Future[tuple[Stored, Budget]]
                 ) -> dict[str, Any]:
        """The response body once ``recorded`` (from ``submit``) has resolved."""
        try:
            stored, budget = recorded.result()
        except BudgetExhausted:
            raise RequestError(403, "budget_exhausted",
                               "the privacy budget cannot cover this request") from None
        except RequestConflict:
            raise RequestError(409, "request_id_conflict",
                               "this request_id was used with a different body") from None
        return {"request_id": req.request_id, "labels": stored.labels.tolist(),
                "branch": BRANCH_NAMES[stored.branch].tolist(),
                "answered": stored.answered, "budget": budget.as_json()}

    def _check_batch(self, n: int) -> None:
        if n < 1:
            raise RequestError(422, "invalid_request", "a request needs at least one query")
        if n > self.limits.max_batch:
            raise RequestError(413, "batch_too_large",
                               f"at most {self.limits.max_batch} queries per request")

    def _pool_rows(self, indices: list[int]) -> NDArray[np.intp]:
        self._check_batch(len(indices))
        if self.pool is None:
            raise RequestError(422, "invalid_request",
                               "no public pool is registered: send 'inputs'")
        return self.pool.rows(np.asarray(indices, np.int64))

    def _vote_on_inputs(self, inputs: InputsPayload) -> NDArray[np.int64]:
        if self.ensemble is None:
            raise RequestError(422, "invalid_request", "inputs mode is off: this server has "
                               "no teacher ensemble (start it with --run on trained teachers)")
        shape = inputs.shape
        if len(shape) != 4 or any(d < 1 for d in shape):
            raise RequestError(422, "invalid_request", "inputs.shape must be [n, C, H, W] with "
                               "positive sizes")
        self._check_batch(shape[0])
        expected = getattr(self.ensemble, "in_shape", None)
        if expected is not None and tuple(shape[1:]) != tuple(expected):
            raise RequestError(422, "invalid_request",
                               f"inputs.shape must be [n, {', '.join(map(str, expected))}]")
        size = int(np.prod(shape, dtype=np.int64)) * 4
        if size > self.limits.max_body_bytes:
            raise RequestError(413, "payload_too_large", "inputs exceed the body size limit")
        try:
            raw = base64.b64decode(inputs.data, validate=True)
        except (binascii.Error, ValueError):
            raise RequestError(400, "malformed_request", "inputs.data is not base64") from None
        if len(raw) != size:
            raise RequestError(422, "invalid_request", f"inputs.data holds {len(raw)} bytes; "
                               f"shape {shape} of float32 needs {size}")
        x = np.frombuffer(raw, dtype="<f4").reshape(shape)
        if not np.all(np.isfinite(x)):
            raise RequestError(422, "invalid_request", "inputs contain NaN or infinite values")
        with self._vote_lock:
            votes = np.asarray(self.ensemble.vote(np.ascontiguousarray(x, np.float32)))
        if votes.ndim != 2 or votes.shape[0] != shape[0] or np.any(votes < 0):
            raise RuntimeError("the ensemble returned malformed votes")
        if self.pool is not None and votes.shape[1] != self.pool.classes:
            raise RuntimeError("the ensemble's classes differ from the pool's")
        return votes.astype(np.int64)

    def _student_probs(self, req: LabelsRequest,
                       shape: tuple[int, ...]) -> NDArray[np.float64] | None:
        interactive = self.aggregator.params.mechanism == "interactive"
        if req.student_probs is None:
            if interactive:
                raise RequestError(422, "invalid_request",
                                   "interactive needs 'student_probs', one row per query")
            return None
        if not interactive:
            raise RequestError(422, "invalid_request",
                               "'student_probs' is only for the interactive mechanism")
        try:
            return check_student_probs(req.student_probs, shape)
        except ValueError as exc:
            raise RequestError(422, "invalid_request", str(exc)) from None

    def close(self) -> None:
        self.ledger.close()


def open_label_service(params: MechanismParams, *, epsilon_budget: float, delta: float,
                       run_dir: str | Path | None = None, votes_path: str | Path | None = None,
                       ledger_url: str | None = None, conversion: Conversion = "improved",
                       device: str = "cpu", limits: Limits | None = None,
                       offline_seed: int | None = None) -> LabelService:
    """The service of ``pate serve`` (and of an in-process student): votes from ``votes_path``
    or ``run_dir/votes.npz``; with ``run_dir``, the run's teacher ensemble answers ``inputs``
    (``teachers.votes.load_ensemble``); the ledger defaults to ``sqlite:///DIR/ledger.db`` in
    the run directory, or next to the votes file. Raises ``UserError``."""
    if (run_dir is None) == (votes_path is None):
        raise UserError("give exactly one of --run DIR and --votes FILE")
    pool = None
    ensemble = None
    if votes_path is not None:
        pool = VotePool.from_file(votes_path)
        home = Path(votes_path).resolve().parent
    else:
        home = Path(run_dir).resolve()
        if not home.is_dir():
            raise UserError(f"{run_dir}: no such run directory")
        if (home / "votes.npz").is_file():
            pool = VotePool.from_file(home / "votes.npz")
        ensemble = _load_ensemble(home, device)
    try:
        ledger = Ledger(ledger_url or f"sqlite:///{home / 'ledger.db'}", default_orders(),
                        delta, epsilon_budget, conversion)
        aggregator = Aggregator(params, ledger.orders, offline_seed=offline_seed)
    except (ValueError, LedgerError) as exc:
        raise UserError(str(exc)) from None
    return LabelService(aggregator, ledger, pool, ensemble, limits)


def _load_ensemble(run_dir: Path, device: str) -> Any:
    """The run's teacher ensemble (``teachers.votes.load_ensemble``: ``vote(x float32
    [n, C, H, W]) -> int32 [n, classes]``, ``in_shape``), or None when the run has none."""
    if not (run_dir / "teachers").is_dir():
        return None
    try:
        from teachers.votes import load_ensemble
    except ImportError:
        log.warning("inputs mode is off: the teachers' voting module is not available")
        return None
    return load_ensemble(run_dir, device)


# -- HTTP ----------------------------------------------------------------------------------


def _error(status: int, error: str, detail: Any = None,
           headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[Any], Awaitable[None]]], Awaitable[None]]


class _Guard:
    """ASGI middleware for /v1/: checks the bearer token before anything else (401), then reads
    the body up to the size limit (413), whether or not it declares its length."""

    def __init__(self, app: ASGIApp, tokens: TokenStore, max_body: int) -> None:
        self.app, self.tokens, self.max_body = app, tokens, max_body

    async def __call__(self, scope: MutableMapping[str, Any], receive: Callable,
                       send: Callable) -> None:
        if scope["type"] != "http" or not scope["path"].startswith("/v1/"):
            await self.app(scope, receive, send)
            return
        headers = dict(scope["headers"])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        client = (self.tokens.client(token.strip())
                  if scheme.lower() == "bearer" and token.strip() else None)
        if client is None:
            response = _error(401, "unauthorized", "a valid 'Authorization: Bearer <token>' "
                              "header is required", {"WWW-Authenticate": "Bearer"})
            await response(scope, receive, send)
            return
        scope.setdefault("state", {})["client"] = client
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await _error(413, "payload_too_large",
                         f"bodies are limited to {self.max_body} bytes")(scope, receive, send)
            return
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # the client went away
                return
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_body:
                await _error(413, "payload_too_large",
                             f"bodies are limited to {self.max_body} bytes")(scope, receive, send)
                return
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        replayed = False

        async def buffered_receive() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, buffered_receive, send)


_bearer = HTTPBearer(auto_error=False, description="one of the tokens of --token-file")


def _client(request: Request,
            _credentials: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer)],
            ) -> str:
    """The authenticated client's id (the guard middleware checked the token)."""
    return request.state.client


ClientId = Annotated[str, Security(_client)]


_ERRORS: dict[int | str, dict[str, Any]] = {
    code: {"model": ErrorBody, "description": text} for code, text in {
        400: "malformed JSON or base64", 401: "no or bad token",
        403: "privacy budget exhausted", 409: "request_id reused with a different body",
        413: "body or batch too large", 422: "invalid request",
        500: "internal error: nothing released"}.items()}


def create_app(service: LabelService, tokens: TokenStore) -> FastAPI:
    """The FastAPI application: POST /v1/labels, GET /v1/budget, GET /healthz (OpenAPI at
    /docs; the schema itself reveals nothing private and needs no token)."""
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    app = FastAPI(title="PATE aggregation service", version="1", lifespan=lifespan,
                  description="Labels for a student from a privately aggregated teacher "
                              "ensemble, every cost recorded in a durable ledger.")
    app.add_middleware(_Guard, tokens=tokens, max_body=service.limits.max_body_bytes)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _error(400, "malformed_request", "the body is not valid JSON")
        return _error(422, "invalid_request",
                      [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")} for e in errors])

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _error(exc.status_code, "http_error", exc.detail)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/budget", response_model=Budget, responses=_ERRORS, tags=["labels"])
    def budget(_client_id: ClientId) -> Response:
        try:
            body = service.budget()
        except Exception as exc:
            log.error("budget unavailable (%s)", type(exc).__name__)
            return _error(500, "internal_error", "the ledger is unavailable")
        return Response(json.dumps(body), media_type="application/json")

    @app.post("/v1/labels", response_model=LabelsResponse, responses=_ERRORS, tags=["labels"])
    async def labels(body: LabelsRequest, client_id: ClientId) -> Response:
        """Labels for pool indices or new inputs; ``-1`` where the aggregator declined. A
        retried request_id with the same body gets the stored answer, at no new cost."""
        try:
            # Pool rows are answered on the event loop (vectorised, a few ms at most); the
            # teachers' forward pass runs in a worker thread. Either way the response waits
            # for the ledger's commit without holding a thread.
            if body.inputs is None:
                recorded = service.submit(body, client_id)
            else:
                recorded = await run_in_threadpool(service.submit, body, client_id)
            with contextlib.suppress(Exception):  # conclude() sees the outcome, error or not
                await asyncio.wrap_future(recorded)
            result = service.conclude(body, recorded)
        except RequestError as exc:
            return _error(exc.status, exc.error, exc.detail)
        except Exception as exc:  # fail closed; the message may not carry private values
            log.error("request failed, nothing released (%s)", type(exc).__name__)
            return _error(500, "internal_error", "no label was released; retry with the same "
                          "request_id")
        return Response(json.dumps(result), media_type="application/json")

    return app
