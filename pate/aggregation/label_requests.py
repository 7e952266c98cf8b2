"""What a student sends to the aggregator and gets back, whatever the transport: the request
schema of ``POST /v1/labels`` (validated here, once, for HTTP and in-process callers alike), the
request limits, the answer, and the ``LabelSource`` protocol the student's query rounds ask
(docs/design.md, "The aggregation service")."""

from __future__ import annotations

import base64
import hashlib
import uuid
from collections.abc import Iterable, Mapping
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
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from pate.errors import BatchTooLarge, MalformedRequest, UserError

MAX_QUERIES = 2**20   # the schema's ceiling on any list of queries (a server's own is lower)
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
        if not 1 <= self.max_batch <= MAX_QUERIES:
            raise UserError(f"--max-batch must be in [1, {MAX_QUERIES}]")
        if self.max_body_bytes is not None and self.max_body_bytes < 1024:
            raise UserError("--max-body-bytes must be >= 1024")
        if not self.body_timeout_s > 0:
            raise UserError("--body-timeout must be > 0")
        for name in ("requests_per_s", "labels_per_min"):
            rate = getattr(self, name)
            if rate is not None and not rate > 0:
                raise UserError(f"--{name.replace('_', '-')} must be > 0")

    def body_bytes(self, query_bytes: int) -> int:
        """The body limit: ``max_body_bytes`` if set, else what ``max_batch`` queries of
        ``query_bytes`` bytes of JSON each need, plus 4 KiB for the rest of the body."""
        if self.max_body_bytes is not None:
            return self.max_body_bytes
        return 4096 + self.max_batch * query_bytes


def _checked_length(value: Any, info: ValidationInfo) -> Any:
    """Refuse a list longer than the server's batch limit before its elements are validated
    (``info.context["max_batch"]``; the schema's ``MAX_QUERIES`` without one)."""
    limit = (info.context or {}).get("max_batch", MAX_QUERIES)
    if isinstance(value, list) and len(value) > limit:
        raise PydanticCustomError("batch_too_large", "at most {limit} queries per request",
                                  {"limit": limit})
    return value


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
    indices: Annotated[list[Annotated[StrictInt, Field(ge=0, lt=2**63)]],
                       Field(max_length=MAX_QUERIES)] | None = None
    inputs: InputsPayload | None = None
    student_probs: Annotated[
        list[Annotated[list[StrictFloat], Field(max_length=MAX_CLASSES)]],
        Field(max_length=MAX_QUERIES)] | None = None
    fresh: StrictBool = Field(False, description=(
        "draw new noise for pool indices answered before, at a new charge (default: the "
        "earlier answer is replayed, free)"))

    _lengths = field_validator("indices", "student_probs", mode="before")(_checked_length)

    @model_validator(mode="after")
    def _one_source(self) -> LabelsRequest:
        if (self.indices is None) == (self.inputs is None):
            raise ValueError("give exactly one of 'indices' and 'inputs'")
        return self

    def digest(self) -> str:
        """sha256 of the body's content without its request_id (what a retry must repeat)."""
        return hashlib.sha256(self.model_dump_json(exclude={"request_id"}).encode()).hexdigest()

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
            raise invalid_request(exc.errors(include_url=False, include_input=False,
                                             include_context=False)) from None


def invalid_request(errors: Iterable[Mapping[str, Any]]) -> UserError:
    """The error for the schema violations ``errors`` (pydantic's ``errors()``): a body that is not
    JSON is malformed (400), a list over the batch limit too large (413), anything else invalid
    (422, the first ``SHOWN_ERRORS`` as ``{"loc", "msg"}`` and the count of the others)."""
    errors = list(errors)
    if any(e.get("type") == "json_invalid" for e in errors):
        return MalformedRequest("the body is not valid JSON")
    too_large = next((e for e in errors if e.get("type") == "batch_too_large"), None)
    if too_large is not None:
        return BatchTooLarge(too_large.get("msg", "too many queries"))
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", "")}
              for e in errors[:SHOWN_ERRORS]]
    more = len(errors) - len(detail)
    text = "; ".join(f"{'.'.join(map(str, d['loc']))}: {d['msg']}" for d in detail)
    if more:
        text += f"; and {more} more"
        detail.append({"loc": [], "msg": f"and {more} more"})
    return UserError("invalid request: " + text, detail)


def new_request_id() -> str:
    """A fresh random request_id (a retry must reuse the one it retries)."""
    return uuid.uuid4().hex


def encode_inputs(x: ArrayLike) -> dict[str, Any]:
    """The ``inputs`` object of a request: a float32 array [n, C, H, W] as base64."""
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
    release (free), and the public budget after."""

    request_id: str
    labels: NDArray[np.int64]
    branch: list[str]
    answered: int
    budget: dict[str, Any]
    replayed: NDArray[np.bool_]

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabelResult:
        """The answer of a response body of POST /v1/labels."""
        return cls(data["request_id"], np.asarray(data["labels"], np.int64),
                   list(data["branch"]), int(data["answered"]), data["budget"],
                   np.asarray(data["replayed"], bool))


class LabelSource(Protocol):
    """An aggregator a student asks for labels: ``pate.service.client.LabelClient`` over HTTP or
    ``pate.aggregation.label_service.InProcessLabels``. ``labels`` raises ``BudgetExhausted`` when
    the budget cannot cover the request (nothing spent), another ``PateError`` when refused."""

    def labels(self, indices: ArrayLike | None = None, *,
               student_probs: ArrayLike | None = None) -> LabelResult: ...

    def budget(self) -> dict[str, Any]:
        """The public budget: epsilon_budget, delta, epsilon_spent, basis, queries, answered."""
        ...
