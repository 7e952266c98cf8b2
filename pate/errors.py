"""The project's one error hierarchy.

Every error raised on purpose is a ``PateError``: its message is one line (whitespace runs,
newlines included, fold to single spaces) and its class names the HTTP status and the
machine-readable code the aggregation service answers it with, as the JSON body
``{"error": code, "detail": detail}`` (docs/design.md, "The aggregation service"). ``detail`` is
the message unless given (a list of schema violations, say). The CLI prints any ``PateError`` as
``pate: error: <message>`` and exits 2 (docs/cli.md).

=========================  ======  =======================  =====================================
class                      status  code                     meaning
=========================  ======  =======================  =====================================
``PateError``              500     ``internal_error``       something failed; nothing released
``LedgerError``            500     ``internal_error``       the ledger cannot be opened, is
                                                            inconsistent or cannot record
``UserError``              422     ``invalid_request``      bad input a user can fix
``MalformedRequest``       400     ``malformed_request``    a body that does not parse
``UnsupportedMediaType``   415     ``unsupported_media``    a body that is not application/json
``RequestTimeout``         408     ``request_timeout``      a body not sent in time
``PayloadTooLarge``        413     ``payload_too_large``    a body over the size limit
``BatchTooLarge``          413     ``batch_too_large``      more queries than a request may hold
``AuthenticationError``    401     ``unauthorized``         no or bad bearer token
``BudgetExhausted``        403     ``budget_exhausted``     the privacy budget cannot cover it
``RequestConflict``        409     ``request_id_conflict``  a request_id reused with another body
``RateLimited``            429     ``rate_limited``         over the client's rate limit
``RemoteServiceError``     any     the server's             a server's refusal of another kind
=========================  ======  =======================  =====================================

A refusal (status < 500) describes only the request, never a private value (docs/design.md,
privacy rules 2 and 7): the service sends its ``detail`` as it is. The service answers every
internal error (500) with a fixed public detail and logs only the exception's class.
A client turns a server's error body back into the same class (``remote_error``).
"""

from __future__ import annotations

import os
from typing import Any

# set to 1 (or true, yes) in the environment to let an unexpected error through whole: its
# message may quote private values, so the commands, and training on private rows, name its
# class only; any other value (0, false, empty) keeps them hidden
TRACEBACK_VARIABLE = "PATE_TRACEBACK"


def tracebacks_shown() -> bool:
    """Whether ``TRACEBACK_VARIABLE`` asks for unexpected errors whole (for data you may see):
    only an explicit yes, so that a value meant as "off" does not show them."""
    return os.environ.get(TRACEBACK_VARIABLE, "").strip().lower() in ("1", "true", "yes")

_MESSAGE: Any = object()  # the default detail: the message itself


class PateError(Exception):
    """An error the project raises on purpose: a one-line message, the HTTP ``status`` and the
    machine-readable ``error`` code the service maps it to, and the public ``detail``."""

    status: int = 500
    error: str = "internal_error"
    default_message: str = "internal error"

    def __init__(self, message: str | None = None, detail: Any = _MESSAGE) -> None:
        super().__init__(" ".join(str(message or self.default_message).split()))
        self.detail: Any = str(self) if detail is _MESSAGE else detail

    def __reduce__(self) -> tuple[Any, ...]:  # pickled whole (Ray workers raise them too)
        return self.__class__, (str(self), self.detail)


class LedgerError(PateError):
    """The privacy ledger cannot be opened, is inconsistent, or could not record a request:
    nothing may be released (fail closed, docs/design.md, privacy rule 7)."""


class UserError(PateError):
    """Bad input or a missing prerequisite; the message says what to do about it."""

    status = 422
    error = "invalid_request"


class MalformedRequest(UserError):
    """A request body that does not parse (not JSON, not base64)."""

    status = 400
    error = "malformed_request"


class PayloadTooLarge(UserError):
    """A request body over the size limit."""

    status = 413
    error = "payload_too_large"


class UnsupportedMediaType(MalformedRequest):
    """A body sent with a Content-Type other than application/json."""

    status = 415
    error = "unsupported_media"
    default_message = "the body must be JSON, sent with 'Content-Type: application/json'"


class RequestTimeout(MalformedRequest):
    """A body that did not arrive in full within the service's body timeout."""

    status = 408
    error = "request_timeout"
    default_message = "the request body did not arrive in time"


class BatchTooLarge(PayloadTooLarge):
    """A request with more queries than the service's batch limit."""

    error = "batch_too_large"


class AuthenticationError(PateError):
    """No bearer token, or one that is not (or no longer) accepted."""

    status = 401
    error = "unauthorized"
    default_message = "a valid 'Authorization: Bearer <token>' header is required"


class BudgetExhausted(PateError):
    """The batch's worst-case cost does not fit in what is left of the privacy budget; nothing
    was spent (docs/design.md, privacy rule 6)."""

    status = 403
    error = "budget_exhausted"
    default_message = "the privacy budget cannot cover this request"


class RequestConflict(PateError):
    """A request_id was used before with a different body (retries must repeat the body)."""

    status = 409
    error = "request_id_conflict"
    default_message = "this request_id was used with a different body"


class RateLimited(PateError):
    """More requests or labels than the client's rate limit allows; ``retry_after`` seconds
    until the request would fit (the service's ``Retry-After`` header)."""

    status = 429
    error = "rate_limited"
    default_message = "rate limit exceeded; retry later"

    def __init__(self, message: str | None = None, detail: Any = _MESSAGE,
                 retry_after: float = 1.0) -> None:
        super().__init__(message, detail)
        self.retry_after = retry_after

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (str(self), self.detail, self.retry_after)


class RemoteServiceError(PateError):
    """A refusal of the service that no other class describes (a 5xx, say), as a client saw it:
    the server's status, code and detail."""

    def __init__(self, status: int, error: str, detail: Any) -> None:
        super().__init__(f"{status} {error}: {detail}", detail)
        self.status, self.error = status, error

    def __reduce__(self) -> tuple[Any, ...]:
        return self.__class__, (self.status, self.error, self.detail)


_REFUSALS: dict[str, type[PateError]] = {cls.error: cls for cls in (
    UserError, MalformedRequest, UnsupportedMediaType, RequestTimeout, PayloadTooLarge,
    BatchTooLarge, AuthenticationError, BudgetExhausted, RequestConflict, RateLimited)}


def remote_error(status: int, error: str, detail: Any) -> PateError:
    """The error a client raises for a server's error response: the hierarchy's class of that
    code and status (so ``except BudgetExhausted`` works over HTTP as in process), else a
    ``RemoteServiceError``. The message is ``"<status> <code>: <detail>"``."""
    cls = _REFUSALS.get(error)
    if cls is None or cls.status != status:
        return RemoteServiceError(status, error, detail)
    return cls(f"{status} {error}: {detail}", detail)
