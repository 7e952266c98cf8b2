"""The error hierarchy: one-line messages, the status and code the service answers with, and a
client's reconstruction of a server's refusal (``remote_error``)."""

from __future__ import annotations

import pickle

import pytest

from pate.errors import (
    AuthenticationError,
    BatchTooLarge,
    BudgetExhausted,
    LedgerError,
    MalformedRequest,
    PateError,
    PayloadTooLarge,
    RemoteServiceError,
    RequestConflict,
    UserError,
    remote_error,
)

REFUSALS = [(UserError, 422, "invalid_request"), (MalformedRequest, 400, "malformed_request"),
            (PayloadTooLarge, 413, "payload_too_large"), (BatchTooLarge, 413, "batch_too_large"),
            (AuthenticationError, 401, "unauthorized"), (BudgetExhausted, 403, "budget_exhausted"),
            (RequestConflict, 409, "request_id_conflict")]


def test_messages_fold_to_one_line_and_are_the_default_detail() -> None:
    exc = UserError("download failed (Error:\n  <urlopen error>\n\n)")
    assert str(exc) == "download failed (Error: <urlopen error> )" == exc.detail
    listed = UserError("invalid request", [{"loc": ["body"], "msg": "bad"}])
    assert listed.detail == [{"loc": ["body"], "msg": "bad"}]
    assert str(BudgetExhausted()) == "the privacy budget cannot cover this request"
    assert (LedgerError("x").status, LedgerError("x").error) == (500, "internal_error")


@pytest.mark.parametrize(("cls", "status", "code"), REFUSALS)
def test_a_refusal_comes_back_as_its_own_class(cls: type[PateError], status: int,
                                               code: str) -> None:
    assert (cls.status, cls.error) == (status, code)
    exc = remote_error(status, code, "why")
    assert type(exc) is cls
    assert (exc.status, exc.error, exc.detail, str(exc)) == (status, code, "why",
                                                             f"{status} {code}: why")


@pytest.mark.parametrize(("status", "code"), [(500, "internal_error"), (404, "http_error"),
                                              (403, "invalid_request")])
def test_other_answers_are_remote_service_errors(status: int, code: str) -> None:
    exc = remote_error(status, code, {"any": "detail"})
    assert type(exc) is RemoteServiceError
    assert (exc.status, exc.error, exc.detail) == (status, code, {"any": "detail"})


@pytest.mark.parametrize("exc", [UserError("bad", ["why"]), BudgetExhausted(),
                                 RemoteServiceError(502, "bad_gateway", None)])
def test_errors_survive_pickling(exc: PateError) -> None:
    back = pickle.loads(pickle.dumps(exc))
    assert (type(back), str(back), back.status, back.error, back.detail) == (
        type(exc), str(exc), exc.status, exc.error, exc.detail)
