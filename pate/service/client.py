"""The student's HTTP client of the aggregation service (docs/design.md, "The aggregation
service"), a ``pate.aggregation.label_requests.LabelSource`` like the in-process
``pate.aggregation.label_service.InProcessLabels``. Retries (lost connections, timeouts, 5xx)
reuse the request_id, so the service answers a retry from its ledger at no new privacy cost
(privacy rule 4). A refusal raises the ``pate.errors`` class the server named
(``pate.errors.remote_error``).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx
from numpy.typing import ArrayLike

from pate.aggregation.label_requests import LabelResult, labels_body, new_request_id
from pate.errors import UserError, remote_error
from pate.service.tokens import parse_tokens, shared_problem

_RETRY_STATUS = frozenset({429, 500, 502, 503, 504})  # 429: after its Retry-After


def said_url(server: str) -> str:
    """``server`` as a message names it: a password in it shown as ``***`` (the message may
    reach a log)."""
    try:
        parts = urlsplit(server)
        password = parts.password
    except ValueError:  # a bracket left open, say: said whole unless it may hold a password
        return "the server's URL" if "@" in server else server
    if password is None:
        return server
    netloc = parts.netloc.replace(f":{password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


class LabelClient:
    """HTTP client of ``pate serve``.

    >>> with LabelClient("http://127.0.0.1:8470", token) as c:   # doctest: +SKIP
    ...     result = c.labels(indices=[0, 1, 2])                   # labels, -1 = no answer
    """

    def __init__(self, base_url: str, token: str, *, timeout: float = 60.0, retries: int = 5,
                 backoff: float = 0.25, transport: httpx.BaseTransport | None = None) -> None:
        if not str(base_url).startswith(("http://", "https://")):
            raise UserError(f"{said_url(str(base_url))}: the server's URL starts with "
                            "http:// or https://")
        self.retries, self.backoff = retries, backoff
        self._http = httpx.Client(base_url=base_url, timeout=timeout, transport=transport,
                                  headers={"Authorization": f"Bearer {token}"})

    @classmethod
    def from_token_file(cls, base_url: str, token_file: str | Path, **kwargs: Any
                        ) -> LabelClient:
        """A client using the first token of a token file (one per line, '#' comments); a
        file other users may read is refused, as the server refuses its own."""
        if problem := shared_problem(Path(token_file)):
            raise UserError(problem)
        tokens = parse_tokens(Path(token_file).read_text())
        if not tokens:
            raise UserError(f"{token_file}: no token")
        return cls(base_url, tokens[0], **kwargs)

    def labels(self, indices: ArrayLike | None = None, *, inputs: ArrayLike | None = None,
               student_probs: ArrayLike | None = None, request_id: str | None = None,
               fresh: bool = False) -> LabelResult:
        """Ask for labels of pool ``indices`` or of new ``inputs`` (float32 [n, C, H, W]);
        Interactive-GNMax needs ``student_probs`` [n, classes]. An index answered before is
        replayed (free) unless ``fresh`` (new noise, charged). Raises the server's refusal as
        a ``PateError`` (``BudgetExhausted`` for 403, ...)."""
        body = labels_body(request_id or new_request_id(), indices, inputs, student_probs,
                           fresh)
        return LabelResult.from_json(self._request("POST", "/v1/labels", body))

    def budget(self) -> dict[str, Any]:
        """GET /v1/budget: epsilon_budget, delta, epsilon_spent, basis, queries, answered."""
        return self._request("GET", "/v1/budget")

    def mechanism(self) -> dict[str, Any]:
        """GET /v1/mechanism: the aggregator's mechanism and its parameters."""
        return self._request("GET", "/v1/mechanism")

    def pool(self) -> dict[str, Any]:
        """GET /v1/pool: the votes' public description (rows, first and last pool index,
        teachers, classes, the pool's fingerprint)."""
        return self._request("GET", "/v1/pool")

    def healthy(self) -> bool:
        """Whether the server answers GET /healthz."""
        try:
            return self._http.get("/healthz").status_code == 200
        except httpx.HTTPError:
            return False

    def _request(self, method: str, path: str, body: Any = None) -> Any:
        for attempt in range(self.retries + 1):
            last = attempt == self.retries
            response = None
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
                    raise remote_error(response.status_code, err.get("error", "error"),
                                       err.get("detail"))
            wait = self.backoff * 2**attempt
            if response is not None and response.status_code == 429:
                wait = max(wait, float(response.headers.get("Retry-After", 1)))
            time.sleep(wait)
        raise AssertionError("unreachable")

    def close(self) -> None:
        """Close the HTTP connections."""
        self._http.close()

    def __enter__(self) -> LabelClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
