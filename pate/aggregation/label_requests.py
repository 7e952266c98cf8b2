"""What a student sends to the aggregator and gets back, whatever the transport: the request
schema of ``POST /v1/labels`` (validated here, once, for HTTP and in-process callers alike), the
request limits, the answer, and the ``LabelSource`` protocol the student's query rounds ask
(docs/design.md, "The aggregation service")."""

from __future__ import annotations

import base64
import hashlib
import itertools
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any, Literal, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    TypeAdapter,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pate.errors import BatchTooLarge, MalformedRequest, UserError

# The ceiling of --max-batch and of any list of queries: a request of that many queries keeps the
# server within about 200 MB and 0.3 s of work even on a pool too large for its cost table
# (docs/benchmarks.md, "Reliability of the service").
MAX_QUERIES = 2**13
MAX_CLASSES = 2**12   # the schema's ceiling on a row of student_probs
SHOWN_ERRORS = 5      # schema violations listed in a 422 (then their count)


@dataclass(frozen=True)
class Limits:
    """Request limits: queries per request, bytes per body (None: derived from ``max_batch``,
    see ``body_bytes``), seconds for a body to arrive, and per-client rates (None: unlimited;
    per process, so per replica)."""

    max_batch: int = 4096
    max_body_bytes: int | None = None
    body_timeout_s: float = 10.0
    requests_per_s: float | None = None
    labels_per_min: float | None = None

    def __post_init__(self) -> None:
        """Each limit is named as a Python caller gives it, then as ``pate serve``'s flag."""
        if not 1 <= self.max_batch <= MAX_QUERIES:
            raise UserError(f"max_batch (--max-batch) must be in [1, {MAX_QUERIES}]")
        if self.max_body_bytes is not None and self.max_body_bytes < 1024:
            raise UserError("max_body_bytes (--max-body-bytes) must be >= 1024")
        if not self.body_timeout_s > 0:
            raise UserError("body_timeout_s (--body-timeout) must be > 0")
        for name in ("requests_per_s", "labels_per_min"):
            rate = getattr(self, name)
            if rate is not None and not rate > 0:
                raise UserError(f"{name} (--{name.replace('_', '-')}) must be > 0")

    def body_bytes(self, query_bytes: int) -> int:
        """The body limit: ``max_body_bytes`` if set, else what ``max_batch`` queries of
        ``query_bytes`` bytes of JSON each need, plus 4 KiB for the rest of the body."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return 4096 + self.max_batch * query_bytes


# one element of ``indices`` and of ``student_probs``
PoolIndex = Annotated[StrictInt, Field(ge=0, lt=2**63)]
ProbsRow = Annotated[list[StrictFloat], Field(max_length=MAX_CLASSES)]
_POOL_INDEX = TypeAdapter(PoolIndex)
_PROBS_ROW = TypeAdapter(ProbsRow)
_NUMBERS = frozenset({int, float})  # what StrictFloat accepts (not bool, not str)


def _indices_valid(values: list[Any]) -> bool:
    """All of ``values`` are what ``PoolIndex`` accepts (a few passes at C speed)."""
    return not values or (set(map(type, values)) == {int} and min(values) >= 0
                          and max(values) < 2**63)


def _index_valid(value: Any) -> bool:
    """``value`` is what ``PoolIndex`` accepts."""
    return type(value) is int and 0 <= value < 2**63


def _probs_valid(rows: list[Any]) -> bool:
    """All of ``rows`` are what ``ProbsRow`` accepts (a few passes at C speed)."""
    return (set(map(type, rows)) <= {list} and max(map(len, rows), default=0) <= MAX_CLASSES
            and set(map(type, itertools.chain.from_iterable(rows))) <= _NUMBERS)


def _row_valid(row: Any) -> bool:
    """``row`` is what ``ProbsRow`` accepts."""
    return type(row) is list and len(row) <= MAX_CLASSES and set(map(type, row)) <= _NUMBERS


_SCREENS: dict[str, tuple[Callable[[list[Any]], bool], Callable[[Any], bool], TypeAdapter]] = {
    "indices": (_indices_valid, _index_valid, _POOL_INDEX),
    "student_probs": (_probs_valid, _row_valid, _PROBS_ROW),
}


def _screened(value: Any, info: ValidationInfo) -> Any:
    """Bounded validation of a list of queries, before pydantic validates its elements one by
    one (which keeps one error per bad element: hundreds of megabytes for a list of a million):
    a list longer than the server's batch limit is refused (``info.context["max_batch"]``; the
    schema's ``MAX_QUERIES`` without one); a list with bad elements is refused with the
    schema's messages for the first ``SHOWN_ERRORS`` of them and their count
    (``invalid_request`` lists them). A valid list costs a few passes at C speed."""
    limit = (info.context or {}).get("max_batch", MAX_QUERIES)
    if not isinstance(value, list):
        return value
    if len(value) > limit:
        raise PydanticCustomError("batch_too_large", "at most {limit} queries per request",
                                  {"limit": limit})
    all_valid, valid, adapter = _SCREENS[info.field_name]
    if all_valid(value):
        return value
    bad = (i for i, v in enumerate(value) if not valid(v))
    first = list(itertools.islice(bad, SHOWN_ERRORS))
    count = len(first) + sum(1 for _ in bad)
    shown = []
    for i in first:
        try:
            adapter.validate_python(value[i])
        except ValidationError as exc:
            e = exc.errors(include_url=False, include_input=False, include_context=False)[0]
            shown.append({"loc": [i, *e["loc"]], "msg": e["msg"]})
    if not shown:  # only Python objects the screen does not know (not JSON): the schema decides
        return value
    raise PydanticCustomError("invalid_elements", "{count} invalid elements",
                              {"count": count, "shown": shown})


class InputsPayload(BaseModel):
    """New inputs for the teachers to vote on: a float32 array, [n, C, H, W] images or [n, d]
    rows of a table as the run's teachers take them, base64 of its little-endian C-order
    bytes."""

    model_config = ConfigDict(extra="forbid")
    dtype: Literal["float32"]
    shape: list[StrictInt] = Field(min_length=2, max_length=8)
    data: str


class LabelsRequest(BaseModel):
    """POST /v1/labels: exactly one of ``indices`` (rows of the registered public pool) and
    ``inputs``; Interactive-GNMax also needs the student's probabilities, one row per query."""

    model_config = ConfigDict(extra="forbid")
    request_id: str = Field(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9._:\-]+$")
    indices: Annotated[list[PoolIndex], Field(max_length=MAX_QUERIES)] | None = None
    inputs: InputsPayload | None = None
    student_probs: Annotated[list[ProbsRow], Field(max_length=MAX_QUERIES)] | None = None
    fresh: StrictBool = Field(False, description=(
        "draw new noise for pool indices answered before, at a new charge (default: the "
        "earlier answer is replayed, free)"))

    _bounded = field_validator("indices", "student_probs", mode="before")(_screened)

    @model_validator(mode="after")
    def _one_source(self) -> LabelsRequest:
        if (self.indices is None) == (self.inputs is None):
            raise ValueError("give exactly one of 'indices' and 'inputs'")
        return self

    def digest(self) -> str:
        """sha256 of the body's content without its request_id (what a retry must repeat).
        ``fresh`` enters only when true, so a request without it has the digest that ledgers of
        schema 1 stored (``pate.aggregation.ledger``): retries across the upgrade still match."""
        exclude = {"request_id"} if self.fresh else {"request_id", "fresh"}
        return hashlib.sha256(self.model_dump_json(exclude=exclude).encode()).hexdigest()

    @classmethod
    def parse(cls, body: bytes | Mapping[str, Any], max_batch: int = MAX_QUERIES
              ) -> LabelsRequest:
        """The request of a body (JSON bytes, or a dict), no list longer than ``max_batch``
        (``BatchTooLarge``, checked before the elements); ``UserError`` saying what is wrong."""
        context = {"max_batch": max_batch}
        try:
            if isinstance(body, bytes | bytearray):
                return cls.model_validate_json(body, context=context)
            return cls.model_validate(body, context=context)
        except ValidationError as exc:
            raise invalid_request(exc.errors(include_url=False, include_input=False)) from None


def invalid_request(errors: Iterable[Mapping[str, Any]]) -> UserError:
    """The error for the schema violations ``errors`` (pydantic's ``errors()``, with context): a
    body that is not JSON is malformed (400), a list over the batch limit too large (413),
    anything else invalid (422, the first ``SHOWN_ERRORS`` as ``{"loc", "msg"}`` and the count
    of the others; a list's bad elements come screened, see ``_screened``)."""
    errors = list(errors)
    if any(e.get("type") == "json_invalid" for e in errors):
        return MalformedRequest("the body is not valid JSON")
    too_large = next((e for e in errors if e.get("type") == "batch_too_large"), None)
    if too_large is not None:
        return BatchTooLarge(too_large.get("msg", "too many queries"))
    found: list[dict[str, Any]] = []
    unlisted = 0
    for e in errors:
        loc = list(e.get("loc", ()))
        if e.get("type") == "invalid_elements":
            shown = e["ctx"]["shown"]
            found += [{"loc": loc + s["loc"], "msg": s["msg"]} for s in shown]
            unlisted += e["ctx"]["count"] - len(shown)
        else:
            found.append({"loc": loc, "msg": e.get("msg", "")})
    detail = found[:SHOWN_ERRORS]
    more = len(found) - len(detail) + unlisted
    text = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
    if more:
        text += f"; and {more} more"
        detail.append({"loc": [], "msg": f"and {more} more"})
    return UserError("invalid request: " + text, detail)


def new_request_id() -> str:
    """A fresh random request_id (a retry must reuse the one it retries)."""
    return uuid.uuid4().hex


def encode_inputs(x: ArrayLike) -> dict[str, Any]:
    """The ``inputs`` object of a request: a float32 array ([n, C, H, W] or [n, d]) as
    base64."""
    a = np.ascontiguousarray(x, dtype="<f4")
    return {"dtype": "float32", "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def labels_body(request_id: str, indices: ArrayLike | None = None,
                inputs: ArrayLike | None = None,
                student_probs: ArrayLike | None = None, fresh: bool = False) -> dict[str, Any]:
    """The JSON body of POST /v1/labels (``LabelsRequest`` checks it)."""
    body: dict[str, Any] = {"request_id": request_id}
    if fresh:
        body["fresh"] = True
    if indices is not None:
        body["indices"] = np.asarray(indices, np.int64).reshape(-1).tolist()
    if inputs is not None:
        body["inputs"] = encode_inputs(inputs)
    if student_probs is not None:
        body["student_probs"] = np.asarray(student_probs, np.float64).tolist()
    return body


@dataclass(frozen=True)
class LabelResult:
    """An answer: labels (-1 = no answer), each label's branch, which labels replay an earlier
    release (free), the public budget after, and whether the request was a retry of one
    recorded before (its stored answer, charged once, when it was first made)."""

    request_id: str
    labels: NDArray[np.int64]
    branch: list[str]
    answered: int
    budget: dict[str, Any]
    replayed: NDArray[np.bool_]
    retried: bool = False

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabelResult:
        """The answer of a response body of POST /v1/labels."""
        return cls(data["request_id"], np.asarray(data["labels"], np.int64),
                   list(data["branch"]), int(data["answered"]), data["budget"],
                   np.asarray(data["replayed"], bool), bool(data.get("retried", False)))


class LabelSource(Protocol):
    """An aggregator a student asks for labels: ``pate.service.client.LabelClient`` over HTTP or
    ``pate.aggregation.label_service.InProcessLabels``. ``labels`` raises ``BudgetExhausted`` when
    the budget cannot cover the request (nothing spent), another ``PateError`` when refused."""

    def labels(self, indices: ArrayLike | None = None, *,
               student_probs: ArrayLike | None = None) -> LabelResult: ...

    def budget(self) -> dict[str, Any]:
        """The public budget: epsilon_budget, delta, epsilon_spent, basis, queries, answered."""
        ...

    def mechanism(self) -> dict[str, Any]:
        """The aggregator's mechanism and parameters (``analysis.mechanisms`` record)."""
        ...

    def pool(self) -> dict[str, Any]:
        """The votes' public description (``VotePool.describe``)."""
        ...
