"""The aggregation service over HTTP (docs/design.md, "The aggregation service"): a
``pate.aggregation.label_service.LabelService`` behind FastAPI with bearer-token authentication,
size limits and JSON errors ``{"error", "detail"}`` with the status and code of the
``pate.errors`` class raised: 400 malformed, 408 body too slow, 413 too large, 415 not JSON,
422 invalid, 401 no or bad token, 403 budget exhausted, 409 request_id reused with another body,
429 over the client's rate limit (with ``Retry-After``), 500 (nothing released) if a cost cannot
be computed or recorded.

Bounded work per request (docs/design.md, "The aggregation service"): the token is checked
before the body is read; the body must arrive within ``Limits.body_timeout_s`` and fit the body
limit, which is derived from ``--max-batch`` (``LabelService.body_limit``); a body with more
values than the batch needs is refused before it is parsed (``LabelService.parse``), a list
longer than the batch limit before its elements are validated; a 422 lists the first few schema
violations and the count of the others; heavy jobs run in a worker thread, one at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, MutableMapping
from concurrent.futures import Future
from typing import Annotated, Any, Literal

from fastapi import FastAPI, Request, Security
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException

from pate.aggregation.label_requests import LabelsRequest, invalid_request
from pate.aggregation.label_service import LabelService
from pate.aggregation.ledger_records import Budget
from pate.errors import (
    AuthenticationError,
    PateError,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    UnsupportedMediaType,
)
from pate.service.rate_limits import RateLimits
from pate.service.tokens import TokenStore

# Heavy work runs in a worker thread, one job at a time: parsing a body over 64 KiB, answering
# more than 1 024 pool indices (on a pool too large for the cost table, ~25 us a query), voting
# on new inputs. Pydantic holds the GIL while it parses, so jobs run back to back on the event
# loop would stall it (and /healthz) for their sum, and their memory would add up.
_PARSE_IN_THREAD_BYTES = 2**16
_ANSWER_IN_THREAD_QUERIES = 1024

log = logging.getLogger("pate.service.app")


class LabelsResponse(BaseModel):
    request_id: str
    labels: list[int] = Field(description="-1 where the aggregator declined to answer")
    branch: list[Literal["teachers", "student", "none"]]
    answered: int
    budget: Budget
    replayed: list[bool] = Field(description="true where the label replays an earlier release "
                                             "(no new noise, no charge)")
    retried: bool = Field(description="true when this request_id was recorded before: its stored "
                                      "answer as first sent, charged nothing again")


class PoolDescription(BaseModel):
    """GET /v1/pool (``VotePool.describe``)."""

    rows: int
    first_index: int | None
    last_index: int | None
    teachers: int | None
    classes: int | None
    fingerprint: str | None


class ErrorBody(BaseModel):
    error: str
    detail: Any = None


def _json_error(status: int, error: str, detail: Any,
                headers: dict[str, str] | None = None) -> JSONResponse:
    return JSONResponse({"error": error, "detail": detail}, status_code=status, headers=headers)


def error_response(exc: PateError) -> JSONResponse:
    """The response to a ``PateError``: its status and ``{"error": code, "detail": detail}``
    (a 401 with the ``WWW-Authenticate: Bearer`` challenge, a 429 with ``Retry-After``)."""
    headers = None
    if isinstance(exc, AuthenticationError):
        headers = {"WWW-Authenticate": "Bearer"}
    elif isinstance(exc, RateLimited):
        headers = {"Retry-After": str(max(1, math.ceil(exc.retry_after)))}
    return _json_error(exc.status, exc.error, exc.detail, headers)


class _FixedFailure(PateError):
    """A failure answered with a fixed public detail (``_fail_closed``): nothing of the
    exception's message leaves the process."""


@contextlib.contextmanager
def _fail_closed(what: str, detail: str) -> Iterator[None]:
    """Refusals (a ``PateError`` below 500) pass; any other failure becomes a 500 with the fixed
    public ``detail``, logged by its class only: its message may carry private values
    (docs/design.md, privacy rule 7)."""
    try:
        yield
    except Exception as exc:
        if isinstance(exc, PateError) and exc.status < 500:
            raise
        log.error("%s (%s)", what, type(exc).__name__)
        raise _FixedFailure(detail) from None


async def _settled(future: Future[Any]) -> None:
    """Wait for ``future`` to resolve, whatever its outcome (the caller reads it)."""
    with contextlib.suppress(Exception):
        await asyncio.wrap_future(future)


ASGIApp = Callable[[MutableMapping[str, Any], Callable[[], Awaitable[Any]],
                    Callable[[Any], Awaitable[None]]], Awaitable[None]]


class _Guard:
    """ASGI middleware for /v1/: checks the bearer token before anything else (401), then the
    client's request rate (429), the Content-Type and Content-Encoding of a POST
    (415: plain JSON only), and reads the body up to the
    size limit (413), whether or not it declares its length, within the body timeout (408)."""

    def __init__(self, app: ASGIApp, tokens: TokenStore, max_body: int, body_timeout_s: float,
                 rates: RateLimits) -> None:
        self.app, self.tokens, self.max_body = app, tokens, max_body
        self.body_timeout_s, self.rates = body_timeout_s, rates

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
            await error_response(AuthenticationError())(scope, receive, send)
            return
        scope.setdefault("state", {})["client"] = client
        try:
            self.rates.admit_request(client)
        except RateLimited as exc:
            await error_response(exc)(scope, receive, send)
            return
        media = headers.get(b"content-type", b"").split(b";")[0].strip().lower()
        if scope["method"] == "POST" and media != b"application/json":
            shown = media.decode("latin-1")[:60] or "none"
            await error_response(UnsupportedMediaType(
                f"the body must be JSON sent with 'Content-Type: application/json' (got "
                f"{shown})"))(scope, receive, send)
            return
        codings = [c.strip().lower() for name, value in scope["headers"]
                   if name == b"content-encoding" for c in value.split(b",")]  # every one given
        coding = next((c for c in codings if c not in (b"identity", b"")), None)
        if scope["method"] == "POST" and coding is not None:
            await error_response(UnsupportedMediaType(
                f"the body must be sent unencoded (got Content-Encoding "
                f"{coding.decode('latin-1')[:40]}): the service reads plain JSON"
                ))(scope, receive, send)
            return
        length = headers.get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body):
            await error_response(self._too_large())(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.body_timeout_s):
                body = await self._read_body(receive)
        except TimeoutError:
            await error_response(RequestTimeout(
                f"the body did not arrive within {self.body_timeout_s:g} s"))(scope, receive, send)
            return
        except PayloadTooLarge as exc:
            await error_response(exc)(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        replayed = False

        async def buffered_receive() -> dict[str, Any]:
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, buffered_receive, send)

    def _too_large(self) -> PayloadTooLarge:
        return PayloadTooLarge(f"bodies are limited to {self.max_body} bytes (from --max-batch)")

    async def _read_body(self, receive: Callable) -> bytes | None:
        """The whole body, or None if the client went away; ``PayloadTooLarge`` past the limit."""
        chunks: list[bytes] = []
        seen = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return None
            chunks.append(message.get("body", b""))
            seen += len(chunks[-1])
            if seen > self.max_body:
                raise self._too_large()
            if not message.get("more_body", False):
                return b"".join(chunks)


_INTERNAL = "internal error: nothing released"

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
        403: "privacy budget exhausted", 408: "body not sent in time",
        409: "request_id reused with a different body", 413: "body or batch too large",
        415: "body not sent as application/json", 422: "invalid request",
        429: "over the client's rate limit (see Retry-After)",
        500: _INTERNAL}.items()}


def create_app(service: LabelService, tokens: TokenStore, docs: bool = False) -> FastAPI:
    """The FastAPI application: POST /v1/labels, GET /v1/budget, GET /v1/mechanism, GET /healthz
    and the OpenAPI schema at /openapi.json (it reveals nothing private and needs no token).
    ``docs`` serves the interactive page /docs too, which loads its scripts from a CDN (off by
    default: the service works offline)."""
    @contextlib.asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        yield
        service.close()

    # redirect_slashes off: /v1/budget/ is a JSON 404 like any unknown route, not a bare 307
    app = FastAPI(title="PATE aggregation service", version="1", lifespan=lifespan,
                  docs_url="/docs" if docs else None, redoc_url=None, redirect_slashes=False,
                  description="Labels for a student from a privately aggregated teacher "
                              "ensemble, every cost recorded in a durable ledger.")
    limits = service.limits
    rates = RateLimits(limits.requests_per_s, limits.labels_per_min)
    heavy_work = asyncio.Semaphore(1)
    app.add_middleware(_Guard, tokens=tokens, max_body=service.body_limit,
                       body_timeout_s=limits.body_timeout_s, rates=rates)

    @app.exception_handler(PateError)
    async def _refused(_request: Request, exc: PateError) -> JSONResponse:
        if exc.status >= 500 and not isinstance(exc, _FixedFailure):  # not by _fail_closed
            log.error("request failed, nothing released (%s)", type(exc).__name__)
            exc = _FixedFailure(_INTERNAL)
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def _invalid(_request: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(invalid_request(exc.errors()))

    @app.exception_handler(StarletteHTTPException)
    async def _http(_request: Request, exc: StarletteHTTPException) -> JSONResponse:
        return _json_error(exc.status_code, "http_error", exc.detail)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.get("/v1/budget", response_model=Budget, responses=_ERRORS, tags=["labels"])
    def budget(_client_id: ClientId) -> Response:
        with _fail_closed("budget unavailable", "the ledger is unavailable"):
            body = service.budget()
        return Response(json.dumps(body), media_type="application/json")

    @app.get("/v1/mechanism", response_model=dict[str, str | float], responses=_ERRORS,
             tags=["labels"])
    def mechanism(_client_id: ClientId) -> dict[str, Any]:
        """The aggregator's mechanism and its parameters: public, as the privacy analysis of
        the answers needs them."""
        with _fail_closed("mechanism unavailable", _INTERNAL):
            return service.mechanism()

    @app.get("/v1/pool", response_model=PoolDescription, responses=_ERRORS, tags=["labels"])
    def pool(_client_id: ClientId) -> dict[str, Any]:
        """The public description of the votes the service answers from: how many pool rows
        they cover, the first and last pool index, the number of teachers and classes, and the
        fingerprint of the pool they were cast on (null if unknown), so that a student can
        check, before it asks, that they are its pool's."""
        with _fail_closed("pool description unavailable", _INTERNAL):
            return service.describe_pool()

    @app.post("/v1/labels", response_model=LabelsResponse, responses=_ERRORS, tags=["labels"],
              openapi_extra={"requestBody": {"required": True, "content": {
                  "application/json": {"schema": {
                      "$ref": "#/components/schemas/LabelsRequest"}}}}})
    async def labels(request: Request, client_id: ClientId) -> Response:
        """Labels for pool indices or new inputs; ``-1`` where the aggregator declined. A
        retried request_id with the same body gets the stored answer, at no new cost; a pool
        index answered before gets its first answer again (``replayed``), free, unless the
        request asks for ``fresh`` noise (charged)."""
        raw = await request.body()
        with _fail_closed("request not read, nothing released", _INTERNAL):
            if len(raw) > _PARSE_IN_THREAD_BYTES:
                async with heavy_work:
                    body = await run_in_threadpool(service.parse, raw)
            else:
                body = service.parse(raw)
        n = len(body.indices) if body.indices is not None else body.inputs.shape[0]
        rates.admit_labels(client_id, n)
        with _fail_closed("request failed, nothing released",
                          "no label was released; retry with the same request_id"):
            # A few pool rows are answered on the event loop (vectorised, a few ms at most);
            # more, and the teachers' forward pass, in a worker thread, one job at a time until
            # its charge is committed (its costs stay in memory until then). Either way the
            # response waits for the ledger's commit without holding a thread.
            if body.inputs is None and n <= _ANSWER_IN_THREAD_QUERIES:
                recorded = service.submit(body, client_id)
                await _settled(recorded)
            else:
                async with heavy_work:
                    recorded = await run_in_threadpool(service.submit, body, client_id)
                    await _settled(recorded)
            answer = json.dumps(service.conclude(body, recorded))
        return Response(answer, media_type="application/json")

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version,
                                 description=app.description, routes=app.routes)
            request = LabelsRequest.model_json_schema(
                ref_template="#/components/schemas/{model}")
            components = schema.setdefault("components", {}).setdefault("schemas", {})
            components.update(request.pop("$defs", {}))
            components["LabelsRequest"] = request
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app
