"""The label service, independent of any transport: validates a student's request, has the
aggregator answer it, records the cost in the ledger and only then answers (docs/design.md,
"The aggregation service" and privacy rules 2-7).

``pate serve`` puts a ``LabelService`` behind HTTP (``pate.service.app``); ``InProcessLabels``
is the same service as a ``LabelSource`` in the student's own process. Refusals are the
``pate.errors`` hierarchy (the HTTP app sends their status and JSON body); any other exception
means nothing was released.

Replays: a pool index already answered under the same mechanism parameters gets its stored
outcome again (``replayed``), free and without new noise (``pate.aggregation.ledger``); a request
with ``"fresh": true`` draws new noise for every query and is charged for every one. Requests
of new ``inputs`` are never replayed (only retried by request_id). Interactive-GNMax is never
replayed either: its answer depends on the student's probabilities sent with the query, so an
index asked again is a new query, answered afresh and charged.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import threading
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.costs import check_threshold, worst_case_queries
from analysis.mechanisms import Mechanism, mechanism_to_dict
from analysis.orders import default_orders
from analysis.rdp import CONVERSIONS, Conversion
from pate.aggregation.aggregators import BRANCH_NAMES, Aggregator, check_student_probs
from pate.aggregation.delta_policy import check_delta
from pate.aggregation.label_requests import (
    MAX_CLASSES,
    InputsPayload,
    LabelResult,
    LabelsRequest,
    Limits,
    labels_body,
    new_request_id,
)
from pate.aggregation.ledger import Ledger
from pate.aggregation.ledger_records import Budget, Charge, Stored
from pate.aggregation.vote_pool import VotePool
from pate.aggregation.votes_ledger import ledger_of_votes, note_ledger
from pate.errors import (
    BatchTooLarge,
    MalformedRequest,
    PayloadTooLarge,
    RequestConflict,
    UserError,
)
from pate.io import write_bytes_atomic
from pate.rundir import LEDGER_RECORD, RunDir

NOTHING_TO_SERVE = "nothing to serve: no votes file and no teacher ensemble"


class TeacherEnsemble(Protocol):
    """Teachers that vote on new inputs (``teachers.votes.Ensemble``, loaded by the application
    layer): ``vote(x float32 [n, *in_shape]) -> int [n, classes]`` vote counts."""

    in_shape: tuple[int, ...]

    def vote(self, x: NDArray[np.float32]) -> NDArray[np.integer]: ...


class LabelService:
    """Validate, vote, aggregate, record, answer. Thread-safe; ``close`` stops the ledger."""

    def __init__(self, aggregator: Aggregator, ledger: Ledger, pool: VotePool | None,
                 ensemble: TeacherEnsemble | None = None, limits: Limits | None = None) -> None:
        if pool is None and ensemble is None:
            raise UserError(NOTHING_TO_SERVE)
        if not np.array_equal(aggregator.orders, ledger.orders):
            raise ValueError("the aggregator must cost on the ledger's orders grid")
        self.aggregator = aggregator
        self.ledger = ledger
        self.pool = pool
        self.ensemble = ensemble
        self.limits = limits or Limits()
        self._mechanism = json.dumps(mechanism_to_dict(aggregator.mechanism), sort_keys=True)
        self._votes_digest = None if pool is None else pool.digest  # the replay scope, once
        # the pool's data-dependent answer costs, computed once (vectorised) at start-up
        self._tabulated = pool is not None and aggregator.tabulate(pool.votes)
        self._vote_lock = threading.Lock()
        self.body_limit = self.limits.body_bytes(self._query_bytes())
        # The most of each JSON token a valid body holds: a comma per pool index and per
        # probability, a bracket per row of probabilities, a few more between the fields, in
        # inputs.shape and around the few strings (request ids, base64 and numbers hold none).
        rows = self.limits.max_batch if self.aggregator.takes_student_probs else 0
        self._max_tokens = {b",": 64 + self.limits.max_batch + rows * self._classes(),
                            b"[": 16 + rows, b"{": 16, b'"': 64}

    @classmethod
    def open(cls, mechanism: Mechanism, pool: VotePool | None, url: str, *,
             epsilon_budget: float, delta: float, conversion: Conversion = "improved",
             ensemble: TeacherEnsemble | None = None, limits: Limits | None = None
             ) -> LabelService:
        """Check that there is something to serve, ``mechanism``'s threshold against the
        votes' number of teachers (``analysis.mechanisms.ParameterError``) and the budget
        (``check_budget``) before the ledger exists, then open the ledger at ``url`` and serve
        through it."""
        if pool is None and ensemble is None:
            raise UserError(NOTHING_TO_SERVE)
        if pool is not None:
            check_threshold(mechanism, pool.teachers)
        check_budget(mechanism, epsilon_budget, delta, conversion)
        ledger = Ledger(url, default_orders(), delta, epsilon_budget, conversion)
        try:
            return cls(Aggregator(mechanism, ledger.orders), ledger, pool, ensemble, limits)
        except BaseException:
            ledger.close()
            raise

    def _query_bytes(self) -> int:
        """The most JSON bytes one query may take in a body: a pool index (up to 19 digits and a
        separator), the student's probabilities (classes numbers of up to 24 characters), the
        base64 of one float32 input."""
        size = 21
        if self.aggregator.takes_student_probs:
            size += 4 + 26 * self._classes()
        if self.ensemble is not None:
            size = max(size, 4 * -(-4 * int(np.prod(self.ensemble.in_shape)) // 3))
        return size

    def _classes(self) -> int:
        """Classes of a row of student_probs: the pool's, or the schema's ceiling."""
        return self.pool.classes if self.pool is not None else MAX_CLASSES

    def parse(self, body: bytes) -> LabelsRequest:
        """The request of a JSON body, lists checked against the batch limit first. A body
        with more JSON values, arrays, objects or strings than a request of ``max_batch``
        queries holds is refused before it is parsed (``PayloadTooLarge``): parsing costs time
        and memory per value, most for arrays, objects and strings."""
        if any(body.count(token) > most for token, most in self._max_tokens.items()):
            raise PayloadTooLarge(f"the body holds more JSON values than a request of "
                                  f"{self.limits.max_batch} queries (--max-batch)")
        return LabelsRequest.parse(body, self.limits.max_batch)

    def budget(self) -> dict[str, Any]:
        """The public budget (GET /v1/budget)."""
        return self.ledger.budget().as_json()

    def mechanism(self) -> dict[str, Any]:
        """The aggregator's mechanism and its parameters (GET /v1/mechanism): public, as the
        privacy analysis of the answers needs them."""
        return mechanism_to_dict(self.aggregator.mechanism)

    def describe_pool(self) -> dict[str, Any]:
        """The votes' public description (GET /v1/pool, ``VotePool.describe``); ``rows`` 0 and
        the rest None when only new inputs are answered."""
        if self.pool is None:
            return {"rows": 0, "first_index": None, "last_index": None, "teachers": None,
                    "classes": None, "fingerprint": None}
        return self.pool.describe()

    def labels(self, req: LabelsRequest, client: str) -> dict[str, Any]:
        """Answer ``req`` (or replay its stored answer), waiting for the ledger's commit.
        Raises a ``PateError`` refusal; any other exception means nothing was released."""
        return self.conclude(req, self.submit(req, client))

    def submit(self, req: LabelsRequest, client: str) -> Future[tuple[Stored, Budget]]:
        """Validate ``req``, have the aggregator answer it and queue the answer and its cost
        to the ledger; nothing leaves before the returned future resolves (write-ahead).
        A stored request is not answered again: a retry draws no new noise."""
        digest = req.digest()
        if req.inputs is not None:  # the ensemble's work is worth skipping for a retry
            stored = self.ledger.lookup(client, req.request_id)
            if stored is not None:
                done: Future[tuple[Stored, Budget]] = Future()
                if stored.body_digest == digest:
                    done.set_result((stored, self.ledger.budget()))
                else:
                    done.set_exception(RequestConflict())
                return done
        if req.indices is not None:
            rows = self._pool_rows(req.indices)
            votes = self.pool.votes[rows]
        else:
            rows, votes = None, self._vote_on_inputs(req.inputs)
        probs = self._student_probs(req, votes.shape)
        answers = self.aggregator.answer(votes, probs, rows if self._tabulated else None)
        indices = None if req.indices is None else np.asarray(req.indices, np.int64)
        return self.ledger.submit(Charge(
            req.request_id, digest, client, self._mechanism, answers.labels,
            answers.branch, answers.independent, answers.dependent,
            self.aggregator.worst_case_rdp(1), indices,
            replayable=indices is not None and probs is None and not req.fresh,
            pool=self._votes_digest))

    @staticmethod
    def conclude(req: LabelsRequest, recorded: Future[tuple[Stored, Budget]]
                 ) -> dict[str, Any]:
        """The response body once ``recorded`` (from ``submit``) has resolved; raises its
        refusal (``BudgetExhausted``, ``RequestConflict``) or failure. A retry (``retried``)
        gets the stored answer as it was first sent, ``replayed`` included: the queries it
        marks ``False`` were charged then, and nothing is charged again."""
        stored, budget = recorded.result()
        return {"request_id": req.request_id, "labels": stored.labels.tolist(),
                "branch": np.asarray(BRANCH_NAMES)[stored.branch].tolist(),
                "answered": stored.answered, "budget": budget.as_json(),
                "replayed": (~stored.fresh).tolist(), "retried": stored.retried}

    def _check_batch(self, n: int) -> None:
        if n < 1:
            raise UserError("a request needs at least one query")
        if n > self.limits.max_batch:
            raise BatchTooLarge(f"at most {self.limits.max_batch} queries per request")

    def _pool_rows(self, indices: list[int]) -> NDArray[np.intp]:
        self._check_batch(len(indices))
        if self.pool is None:
            raise UserError("no public pool is registered: send 'inputs'")
        return self.pool.rows(np.asarray(indices, np.int64))

    def _vote_on_inputs(self, inputs: InputsPayload) -> NDArray[np.int64]:
        if self.ensemble is None:
            raise UserError("inputs mode is off: this server has no teacher ensemble (start it "
                            "with --run on trained teachers)")
        shape = inputs.shape
        expected = tuple(self.ensemble.in_shape)  # (C, H, W) of images, (d,) of a table's rows
        if len(shape) != 1 + len(expected) or any(d < 1 for d in shape):
            raise UserError(f"inputs.shape must be [n, {', '.join(map(str, expected))}] with "
                            "n >= 1")
        self._check_batch(shape[0])
        if tuple(shape[1:]) != expected:
            raise UserError(f"inputs.shape must be [n, {', '.join(map(str, expected))}]")
        size = int(np.prod(shape, dtype=np.int64)) * 4
        if size > self.body_limit:
            raise PayloadTooLarge("inputs exceed the body size limit")
        try:
            raw = base64.b64decode(inputs.data, validate=True)
        except (binascii.Error, ValueError):
            raise MalformedRequest("inputs.data is not base64") from None
        if len(raw) != size:
            raise UserError(f"inputs.data holds {len(raw)} bytes; shape {shape} of float32 "
                            f"needs {size}")
        x = np.frombuffer(raw, dtype="<f4").reshape(shape).copy()  # writable, as torch wants
        if not np.all(np.isfinite(x)):
            raise UserError("inputs contain NaN or infinite values")
        with self._vote_lock:
            votes = np.asarray(self.ensemble.vote(np.ascontiguousarray(x, np.float32)))
        if votes.ndim != 2 or votes.shape[0] != shape[0] or np.any(votes < 0):
            raise RuntimeError("the ensemble returned malformed votes")
        if self.pool is not None and votes.shape[1] != self.pool.classes:
            raise RuntimeError("the ensemble's classes differ from the pool's")
        return votes.astype(np.int64)

    def _student_probs(self, req: LabelsRequest,
                       shape: tuple[int, ...]) -> NDArray[np.float64] | None:
        interactive = self.aggregator.takes_student_probs
        if req.student_probs is None:
            if interactive:
                raise UserError("interactive needs 'student_probs', one row per query")
            return None
        if not interactive:
            raise UserError("'student_probs' is only for the interactive mechanism")
        try:
            return check_student_probs(req.student_probs, shape)
        except ValueError as exc:
            raise UserError(str(exc)) from None

    def close(self) -> None:
        """Finish the queued charges and stop the ledger."""
        self.ledger.close()


@dataclass(frozen=True)
class LedgerKeys:
    """The keys the user's registry enters a ledger under, of the private data votes were cast
    or teachers trained on (``note_ledger``'s: the data's fingerprint, the one older versions
    knew it by, its rows' in any order and as encoded; None where not known). PRIVATE."""

    fingerprint: str | None
    former: str | None = None
    rows: str | None = None
    encoded_rows: str | None = None


def open_label_service(mechanism: Mechanism, *, epsilon_budget: float, delta: float,
                       run_dir: str | Path | None = None, votes_path: str | Path | None = None,
                       ensemble: TeacherEnsemble | None = None,
                       ledger: str | Path | None = None,
                       conversion: Conversion = "improved", limits: Limits | None = None,
                       check_pool: Callable[[VotePool], None] | None = None,
                       charged_before: bool = False, private_records: int | None = None,
                       allow_large_delta: bool = False,
                       allow_name: str = "--allow-large-delta",
                       ensemble_keys: LedgerKeys | None = None) -> LabelService:
    """The service of ``pate serve`` (and of an in-process student): the pool's votes from
    ``votes_path`` or ``run_dir/votes.npz`` (if there), new inputs answered by ``ensemble`` (the
    run's teachers, loaded by the caller); ``ledger``, a URL or an SQLite file's path
    (``ledger_store.ledger_url``), defaults to ``ledger.db`` in the run directory, or next to
    the votes file, and a votes' ledger is theirs for good (``ledger_of_votes``).
    ``check_pool`` may refuse the votes before the ledger exists.
    Where answers were charged before (``charged_before``: a student's ``labels.npz``; a run
    directory's own is looked for), the ledger must exist: a new one would be a second budget.
    ``delta`` must be below 1/n for the ``private_records`` the votes protect (the caller's, else
    the votes file's own), where known (``delta_policy.check_delta``: unless
    ``allow_large_delta``, the option the caller calls ``allow_name``). Raises ``UserError``,
    ``LedgerError``, and ``analysis.mechanisms.ParameterError`` for a threshold outside [0, the
    votes' number of teachers]. The ledger is entered in the user's registry under the private
    data's keys (``note_ledger``): the votes', else ``ensemble_keys``, those of the data the
    ``ensemble`` learnt from (its teachers' manifest's), so that teachers answering new inputs
    are one budget with every other use of their data."""
    if (run_dir is None) == (votes_path is None):
        raise UserError("give exactly one of --run DIR and --votes FILE")
    pool = None
    if votes_path is not None:
        pool = VotePool.from_file(votes_path)
        home = Path(votes_path).resolve().parent
    else:
        home = Path(run_dir).resolve()
        if not home.is_dir():
            raise UserError(f"{run_dir}: no such run directory")
        if RunDir(home).votes.is_file():
            pool = VotePool.from_file(RunDir(home).votes)
    if private_records is None and pool is not None:  # the votes' own, wherever they lie
        private_records = pool.private_records
    check_delta(delta, private_records, allow_large_delta, allow_name)
    if private_records is None and 1e-3 <= delta < 1:  # not checked: said, not passed over
        warnings.warn(f"delta {delta:g} cannot be checked against 1/n: these votes do not say "
                      "how many private records the teachers learnt from (those of pate "
                      "teachers votes do); a delta well below 1/n is the usual choice",
                      stacklevel=2)
    if pool is not None and check_pool is not None:
        check_pool(pool)
    url, record = ledger_of_votes(home, ledger, charged_before or (
        run_dir is not None and RunDir(home).labels.is_file()))
    service = LabelService.open(mechanism, pool, url, epsilon_budget=epsilon_budget, delta=delta,
                                conversion=conversion, ensemble=ensemble, limits=limits)
    try:
        if record is not None:
            write_bytes_atomic(home / LEDGER_RECORD, (record + "\n").encode(), private=True)
        keys = (LedgerKeys(pool.private_fingerprint, pool.former_private_fingerprint,
                           pool.private_rows_fingerprint, pool.private_encoded_rows_fingerprint)
                if pool is not None and pool.private_fingerprint is not None
                else ensemble_keys if ensemble is not None else None)  # votes that record none
        if keys is not None:
            note_ledger(keys.fingerprint, url, keys.former, (keys.rows, keys.encoded_rows))
    except BaseException:
        service.close()
        raise
    return service


def check_budget(mechanism: Mechanism, epsilon_budget: float, delta: float,
                 conversion: Conversion = "improved") -> None:
    """Refuse (``UserError``), before any ledger is made, an unknown conversion, an epsilon
    budget that is not a finite number > 0, or one that covers not even one query of
    ``mechanism`` at its worst (``analysis.costs.worst_case_queries``): the ledger would keep
    that budget for good."""
    if conversion not in CONVERSIONS:
        raise UserError(f"conversion must be one of {', '.join(CONVERSIONS)}, got "
                        f"{conversion!r}")
    if not (math.isfinite(epsilon_budget) and epsilon_budget > 0):
        raise UserError(f"the epsilon budget must be a finite number > 0, got {epsilon_budget!r}")
    if 0.0 < delta < 1.0 and not worst_case_queries(
            mechanism, epsilon_budget, delta, default_orders(), conversion=conversion, limit=1):
        raise UserError(f"the budget, epsilon {epsilon_budget:g} at delta {delta:g}, does not "
                        "cover even one query of this aggregator: nothing was created (a larger "
                        "budget, or more noise)")


class InProcessLabels:
    """A ``LabelSource`` over a ``LabelService`` in this process: the same schema, rules, ledger
    and errors as over HTTP (``pate student train --votes FILE``)."""

    def __init__(self, service: LabelService, client: str = "in-process") -> None:
        self.service, self.client = service, client

    def labels(self, indices: ArrayLike | None = None, *, inputs: ArrayLike | None = None,
               student_probs: ArrayLike | None = None, request_id: str | None = None,
               fresh: bool = False) -> LabelResult:
        """Labels of pool ``indices`` or of new ``inputs``, as ``LabelClient.labels``."""
        body = labels_body(request_id or new_request_id(), indices, inputs, student_probs, fresh)
        req = LabelsRequest.parse(body, self.service.limits.max_batch)
        return LabelResult.from_json(self.service.labels(req, self.client))

    def budget(self) -> dict[str, Any]:
        """The public budget, as ``LabelClient.budget``."""
        return self.service.budget()

    def mechanism(self) -> dict[str, Any]:
        """The mechanism and its parameters, as ``LabelClient.mechanism``."""
        return self.service.mechanism()

    def pool(self) -> dict[str, Any]:
        """The votes' public description, as ``LabelClient.pool``."""
        return self.service.describe_pool()

    def close(self) -> None:
        """Stop the service (its ledger)."""
        self.service.close()

    def __enter__(self) -> InProcessLabels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
