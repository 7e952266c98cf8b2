"""The student's client of the aggregation service (DESIGN.md, "The aggregation service").

``LabelClient`` talks HTTP (httpx); ``LocalLabelClient`` calls a
``pate.service.app.LabelService`` in the same process with the same interface, for
``pate student train --votes FILE``. Retries (lost connections, timeouts, 5xx) reuse the
request_id, so the service answers a retry from its ledger at no new privacy cost (privacy rule 4).
"""

from __future__ import annotations

import base64
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
import numpy as np
from numpy.typing import ArrayLike, NDArray

if TYPE_CHECKING:
    from pate.service.app import LabelService

_RETRY_STATUS = frozenset({500, 502, 503, 504})


class ServiceError(Exception):
    """The service refused a request: HTTP status, error code, public detail."""

    def __init__(self, status: int, error: str, detail: Any = None) -> None:
        super().__init__(f"{status} {error}: {detail}")
        self.status, self.error, self.detail = status, error, detail


class BudgetExhaustedError(ServiceError):
    """403: the privacy budget cannot cover the request; nothing was spent."""


class AuthError(ServiceError):
    """401: no or bad token (revoked tokens included)."""


def _service_error(status: int, error: str, detail: Any) -> ServiceError:
    cls = {403: BudgetExhaustedError, 401: AuthError}.get(status, ServiceError)
    return cls(status, error, detail)


@dataclass(frozen=True)
class LabelResult:
    """An answer: labels (-1 = no answer), each label's branch, and the public budget after."""

    request_id: str
    labels: NDArray[np.int64]
    branch: list[str]
    answered: int
    budget: dict[str, Any]


def new_request_id() -> str:
    return uuid.uuid4().hex


def encode_inputs(x: ArrayLike) -> dict[str, Any]:
    """The ``inputs`` object of a request: a float32 array [n, C, H, W] as base64."""
    a = np.ascontiguousarray(x, dtype="<f4")
    return {"dtype": "float32", "shape": list(a.shape),
            "data": base64.b64encode(a.tobytes()).decode("ascii")}


def labels_body(request_id: str, indices: ArrayLike | None = None,
                inputs: ArrayLike | None = None,
                student_probs: ArrayLike | None = None) -> dict[str, Any]:
    """The JSON body of POST /v1/labels."""
    if (indices is None) == (inputs is None):
        raise ValueError("give exactly one of indices and inputs")
    body: dict[str, Any] = {"request_id": request_id}
    if indices is not None:
        body["indices"] = np.asarray(indices, np.int64).reshape(-1).tolist()
    else:
        body["inputs"] = encode_inputs(inputs)
    if student_probs is not None:
        body["student_probs"] = np.asarray(student_probs, np.float64).tolist()
    return body


def _result(data: dict[str, Any]) -> LabelResult:
    return LabelResult(data["request_id"], np.asarray(data["labels"], np.int64),
                       list(data["branch"]), int(data["answered"]), data["budget"])


class LabelClient:
    """HTTP client of ``pate serve``.

    >>> with LabelClient("http://127.0.0.1:8470", token) as c:   # doctest: +SKIP
    ...     result = c.labels(indices=[0, 1, 2])                   # labels, -1 = no answer
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, retries: int = 5,
                 backoff: float = 0.25, transport: httpx.BaseTransport | None = None) -> None:
        self.retries, self.backoff = retries, backoff
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_token_file(cls, base_url: str, token_file: str | Path, **kwargs: Any
                        ) -> LabelClient:
        """A client using the first token of a token file (one per line, '#' comments)."""
        tokens = [t for line in Path(token_file).read_text().splitlines()
                  if (t := line.strip()) and not t.startswith("#")]
        if not tokens:
            raise ValueError(f"{token_file}: no token")
        return cls(base_url, tokens[0], **kwargs)

    def labels(self, indices: ArrayLike | None = None, *, inputs: ArrayLike | None = None,
               student_probs: ArrayLike | None = None,
               request_id: str | None = None) -> LabelResult:
        """Ask for labels of pool ``indices`` or of new ``inputs`` (float32 [n, C, H, W]);
        Interactive-GNMax needs ``student_probs`` [n, classes]. Raises ``ServiceError``."""
        body = labels_body(request_id or new_request_id(), indices, inputs, student_probs)
        return _result(self._request("POST", "/v1/labels", body))

    def budget(self) -> dict[str, Any]:
        """GET /v1/budget: epsilon_budget, delta, epsilon_spent, basis, queries, answered."""
        return self._request("GET", "/v1/budget")

    def healthy(self) -> bool:
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            try:
                response = self._http.request(method, path, json=body)
            except (httpx.TransportError, httpx.TimeoutException):
                if last:
                    raise
            else:
                if response.status_code < 400:
                    return response.json()
                if response.status_code not in _RETRY_STATUS or last:
                    try:
                        err = response.json()
                    except ValueError:
                        err = {"error": response.reason_phrase, "detail": None}
                    raise _service_error(response.status_code, err.get("error", "error"),
                                         err.get("detail"))
            time.sleep(self.backoff * 2**attempt)
        raise AssertionError("unreachable")

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> LabelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class LocalLabelClient:
    """The same interface over a ``LabelService`` in this process (same ledger, same rules)."""

    def __init__(self, service: LabelService, client: str = "in-process") -> None:
        self.service, self.client = service, client

    def labels(self, indices: ArrayLike | None = None, *, inputs: ArrayLike | None = None,
               student_probs: ArrayLike | None = None,
               request_id: str | None = None) -> LabelResult:
        from pydantic import ValidationError

        from pate.service.app import LabelsRequest, RequestError

        body = labels_body(request_id or new_request_id(), indices, inputs, student_probs)
        try:
            return _result(self.service.labels(LabelsRequest.model_validate(body), self.client))
        except RequestError as exc:
            raise _service_error(exc.status, exc.error, exc.detail) from None
        except ValidationError as exc:
            raise ServiceError(422, "invalid_request", str(exc)) from None

    def budget(self) -> dict[str, Any]:
        return self.service.budget()

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> LocalLabelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
