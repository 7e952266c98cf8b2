"""One query round of the student against an aggregator (PATE 2018, §4.2-4.3): the rows to ask
chosen, asked in requests, every answer saved as it arrives (``labels.npz``) and accounted for
(``student/rounds.json``, ``student/probs.npz`` for Interactive-GNMax), and the round's
epsilons: the ledger's data-independent one and the sanitised release.

The aggregator is any ``pate.aggregation.label_requests.LabelSource``: the HTTP client of a
running ``pate serve``, or the label service in this process over a votes file (then
``AggregatorSession.service`` is set, and the round's candidates and its sanitised epsilon come
from its votes). The round's kind follows the mechanism: Confident-GNMax (or GNMax, LNMax)
answers pool indices; Interactive-GNMax also gets the current student's probabilities, so it
needs the student a previous round left."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.mechanisms import mechanism_from_dict, mechanism_to_dict
from pate.aggregation.label_requests import LabelSource
from pate.aggregation.label_service import LabelService
from pate.aggregation.vote_pool import VotePool
from pate.aggregation.votes_ledger import BUDGET_SPENT_HINT
from pate.data.task import Task
from pate.errors import PateError, RemoteServiceError, UserError
from pate.progress import Progress, progress_bar
from pate.rundir import RunDir
from student.checks import check_votes
from student.models import ModelSpec
from student.options import StudentOptions
from student.rounds import (
    Received,
    analyze_rounds,
    append_sent_probs,
    ask,
    load_sent_probs,
    round_answers,
    select_queries,
)
from student.sanitised import (
    answers_digest,
    former_answers_digest,
    ledger_releases,
    run_file_releases,
)
from student.training import predict_proba


@dataclass
class AggregatorSession:
    """An open label source; ``service`` is the label service in this process when there is
    one (``pate student train --votes``; ``pate run``'s own server, whose round releases the
    sanitised epsilon): its votes bound the candidates, and its votes and ledger give the
    sanitised epsilon, unless ``release_sanitised`` is off (decided before the round: where
    the teachers are few it would exceed the data-independent one). None for a remote one."""

    source: LabelSource
    mechanism: str
    service: LabelService | None = None
    release_sanitised: bool = True

    def close(self) -> None:
        self.source.close()


def _described(session: AggregatorSession, what: str, optional: bool = False
               ) -> dict[str, Any]:
    """The aggregator's public description ``what`` (``mechanism`` or ``pool``, a
    ``LabelSource`` method and a GET route); ``UserError`` when it is refused, or missing
    unless ``optional`` (then ``{}``: a server of an older version)."""
    try:
        record = getattr(session.source, what)()
    except RemoteServiceError as exc:
        if exc.status == 404 and optional:
            return {}
        if exc.status == 404:
            raise UserError(f"the server has no GET /v1/{what}: not a pate serve of this "
                            "version (or not a pate serve)") from None
        raise UserError(f"the aggregator refused: {exc}") from None
    except PateError as exc:
        raise UserError(f"the aggregator refused: {exc}") from None
    if not isinstance(record, dict):
        raise UserError(f"the aggregator's GET /v1/{what} is not a record")
    return record


def _served_mechanism(session: AggregatorSession) -> dict[str, Any]:
    """The mechanism and parameters the aggregator answers with (``LabelSource.mechanism``),
    which must be the one the round was told; ``UserError`` otherwise, before any query."""
    record = _described(session, "mechanism")
    try:
        mechanism = mechanism_from_dict(record)
    except (ValueError, TypeError, AttributeError):
        raise UserError("the aggregator's GET /v1/mechanism is not a mechanism record") from None
    if mechanism.name != session.mechanism:
        raise UserError(f"the aggregator answers with {mechanism.name!r}, not the "
                        f"{session.mechanism!r} this round was told to ask (--mechanism)")
    return mechanism_to_dict(mechanism)


def _with_round(run: RunDir, rounds: list[dict[str, Any]], record: dict[str, Any],
                got: Received) -> list[dict[str, Any]]:
    """``rounds`` (``rounds.json`` as read before the round) and this round, ``record`` (public:
    the aggregator's mechanism record and parameters, the selection, the stage) with the
    counts of ``got``, written; a round that has asked nothing is left out."""
    rounds = [*rounds, {**record, **got.counts()}] if len(got) else list(rounds)
    run.write_json(run.rounds, rounds)
    return rounds


def settled_rounds(run: RunDir, before: Received,
                    rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rounds.json`` made to account for every row of ``labels.npz`` after a round was
    stopped while it asked: the round is recorded before its first request (its mechanism),
    and its counts after each answer is saved, so rows saved beyond the counts are the last
    round's, and a round that never got an answer is dropped. Rewritten where it changed."""
    settled = [r for r in rounds if r["queries"]]
    recorded = sum(r["queries"] for r in settled)
    if settled and len(before) > recorded:
        start = recorded - settled[-1]["queries"]
        settled[-1] = {**settled[-1], **before.since(start).counts()}
    if settled != rounds:
        run.write_json(run.rounds, settled)
    return settled


def _sanitised_epsilon(run: RunDir, session: AggregatorSession, received: Received,
                       rounds: list[dict[str, Any]], delta: float, conversion: str
                       ) -> float | None:
    """The published smooth-sensitivity-sanitised epsilon of every round so far: the release
    (``student.sanitised``, noise from the OS's entropy) of ``student.rounds.analyze_rounds``'s
    bound (PATE 2018's Table 2 analysis of the asked rows, rounds composed; docs/design.md,
    privacy rule 6), made once per set of answers and kept in the ledger that charged them: the
    same answers, asked again from this run or another, get the same figure, and a release
    of others composes with every earlier one. None without the service in this process (or
    with rows its votes do not cover), with LNMax, or when a round's parameters or rows are
    unknown."""
    service = session.service
    if service is None or service.pool is None or not len(received):
        return None
    pool = service.pool
    if not np.isin(received.pool_index, pool.pool_indices).all():
        return None  # rows another aggregator answered (a remote one), of votes not here
    asked = round_answers(rounds, received, run.probs)  # None: a round's parameters unknown
    digest = None if asked is None else answers_digest(pool.digest, asked)
    former = former_answers_digest([{k: v for k, v in r.items() if k != "round"} for r in rounds],
                                   pool.digest, received.pool_index,
                                   load_sent_probs(run.probs)[1])
    with ledger_releases(service.ledger, run_file_releases(run.releases)) as releases:
        return releases.release(
            len(received), lambda earlier: analyze_rounds(
                rounds, received, lambda index: pool.votes[pool.rows(index)], run.probs, delta,
                conversion, earlier), conversion, digest, formerly=[former])


def _saving(run: RunDir, before: Received, rounds: list[dict[str, Any]],
            record: dict[str, Any], probs: NDArray[np.float64] | None,
            bar: Progress) -> Callable[[Received], None]:
    """An ``on_request`` that saves everything received so far, so that nothing paid for is
    lost and every saved answer is accounted for: the probabilities sent with the new rows
    (Interactive-GNMax; its analysis needs them), then the answers (``labels.npz``), then the
    round's counts (``rounds.json``); and advances the round's progress."""
    done = [0]

    def on_request(got: Received) -> None:
        if probs is not None:
            append_sent_probs(run.probs, got.pool_index[done[0]:], probs[done[0]:len(got)])
        (before + got).save(run.labels)
        _with_round(run, rounds, record, got)
        bar.update(len(got) - done[0])
        done[0] = len(got)
    return on_request


def asks_with_student(mechanism: str | None, options: StudentOptions) -> bool:
    """Whether the round asks with the probabilities of a previous round's student (an
    interactive round, or rows chosen by its uncertainty)."""
    return bool(options.queries) and (mechanism == "interactive"
                                      or options.select == "uncertainty")


def needs_previous_student(run: RunDir, mechanism: str | None, options: StudentOptions,
                            previous: tuple[Any, ModelSpec] | None) -> bool:
    """:func:`asks_with_student`; ``UserError`` where it does and there is no student."""
    needs = asks_with_student(mechanism, options)
    if needs and previous is None:
        raise UserError("interactive rounds and --select uncertainty need the student of a "
                        f"previous round in {run.student}")
    return needs


def check_same_ledger(rounds_before: list[dict[str, Any]], ledger: str | None) -> None:
    """Refuse an aggregator whose ledger (``Budget.ledger``, its random name) is not the one
    that charged the run's answers so far, as its rounds record it: the same private data
    charged to a second ledger would have a second budget (docs/design.md, privacy rule 5).
    Rounds of versions that recorded no ledger are not checked."""
    charged = {r["ledger"] for r in rounds_before
               if isinstance(r.get("ledger"), str) and r["queries"]}
    if charged and ledger not in charged:
        raise UserError("the aggregator charges another ledger than the one that charged this "
                        "run's answers: one body of private data has one budget, and a second "
                        "ledger would be a second (ask the aggregator that answered them, or "
                        "start a new run)")


def ask_round(run: RunDir, session: AggregatorSession, task: Task, options: StudentOptions,
               before: Received, previous: tuple[Any, ModelSpec] | None,
               rounds_before: list[dict[str, Any]], conversion: str, spent_is_final: bool,
               name: str | None = None) -> tuple[Received, list[dict[str, Any]], dict[str, Any]]:
    """One query round against ``session`` (closed at the end; ``train_student``): every
    answer so far, saved as it arrives, every round so far, and the epsilons of the answers
    (the ledger's data-independent one, the sanitised release). ``labels.npz`` records the
    pool's fingerprint. A round cut short (the budget, the pool's rows left) is warned of."""
    interactive = session.mechanism == "interactive"
    before = replace(before, pool_fingerprint=task.pool_fingerprint)
    try:
        mechanism = _served_mechanism(session)
        if session.service is None:  # a remote aggregator's votes, by their description
            check_votes(run, _described(session, "pool", optional=True), task)
        ledger = session.source.budget().get("ledger")
        check_same_ledger(rounds_before, ledger)
        run.student.mkdir(exist_ok=True)  # once the aggregator has accepted the round
        candidates = np.setdiff1d(np.arange(len(task.pool_x)), before.pool_index)
        if session.service is not None and session.service.pool is not None:
            candidates = np.intersect1d(candidates, session.service.pool.pool_indices)
        if options.queries and not candidates.size:
            raise UserError("every pool row the votes cover has been asked already: nothing "
                            "is left to ask (--queries 0, with the same aggregator, trains on "
                            "the answers so far)")
        probs_all = None
        if needs_previous_student(run, session.mechanism, options, previous):
            assert previous is not None
            probs_all = predict_proba(previous[0].to(options.device), task.pool_x[candidates],
                                      options.device)
        chosen = select_queries(candidates, options.queries, options.select,
                                np.random.default_rng(options.seed), probs_all)
        probs = None
        if interactive and chosen.size:
            assert probs_all is not None
            probs = probs_all[np.searchsorted(candidates, chosen)]
        record = {"mechanism": mechanism, "select": options.select, "ledger": ledger,
                  **({} if name is None else {"round": name})}
        if chosen.size:  # recorded before its first request: whose rows a stop leaves
            run.write_json(run.rounds, [*rounds_before, {**record,
                                                          **Received.empty().counts()}])
        try:
            with progress_bar(f"queries ({session.mechanism})", int(chosen.size), "query",
                              every=10.0) as bar:
                got, exhausted = ask(session.source, chosen, probs, options.request_size,
                                     on_request=_saving(run, before, rounds_before, record,
                                                        probs, bar))
        except PateError as exc:
            raise UserError(f"the aggregator refused: {exc}") from None
        received = before + got
        received.save(run.labels)
        rounds = _with_round(run, rounds_before, record, got)  # as it ended (saved per request)
        if exhausted and not len(got) and (spent_is_final or not len(before)):
            hint = ("--queries 0 retrains on the answers so far" if len(before)
                    else BUDGET_SPENT_HINT)
            raise UserError("the privacy budget does not cover even one more query: nothing "
                            f"was asked or spent ({hint})")
        short = ([f"{options.queries} queries asked for, {candidates.size} pool rows were "
                  "left to ask: asked those"] if options.queries > candidates.size else [])
        budget = session.source.budget()
        sanitised = (_sanitised_epsilon(run, session, received, rounds, budget["delta"],
                                       conversion) if session.release_sanitised else None)
    finally:
        session.close()
    if exhausted:
        short.append(f"budget exhausted after {len(got)} of {chosen.size} queries")

    if not received.answered.any() and exhausted:
        queries = "query" if len(received) == 1 else "queries"
        raise UserError(f"the privacy budget (epsilon {budget['epsilon_budget']:g}) is spent and "
                        f"none of the {len(received)} {queries} asked was answered: nothing to "
                        "train on, and nothing more can be asked of this ledger (a new run with "
                        "a larger budget or a lower threshold)")
    for said in short:  # once the round's answers, records and release are kept
        warnings.warn(said, stacklevel=3)
    return received, rounds, {
        "delta": budget["delta"],
        "data_independent": budget["epsilon_spent"],  # the ledger's, all its clients
        "basis": budget["basis"],
        "data_dependent_sanitised": sanitised,
    }


def answers_in_hand(run: RunDir, before: Received, rounds_before: list[dict[str, Any]],
                     task: Task, pool_recorded: bool
                     ) -> tuple[Received, list[dict[str, Any]], dict[str, Any]]:
    """``--queries 0`` with no aggregator named: the answers so far, their rounds and the
    epsilons the round that asked them gave (``student/metrics.json``), once the answers are
    known to be of the student's pool (``pool_recorded``: ``check_answers_pool`` found it
    recorded; else by the run's votes). Training again on them asks, spends and releases
    nothing."""
    last = run.read_json(run.student_metrics)
    if not (len(before) and isinstance(last, dict) and isinstance(last.get("epsilon"), dict)
            and last.get("queries") == len(before)):
        if not len(before):
            raise UserError("training on the answers in hand needs a round that asked them "
                            f"here ({run.labels} and {run.student_metrics}); else name the "
                            "aggregator (--mechanism and its flags, or --server)")
        raise UserError(f"the answers in hand ({run.labels}) have no epsilons of their own "
                        f"yet ({run.student_metrics}: the training after their round did not "
                        "finish): name their aggregator again with --queries 0 (--mechanism and "
                        "its flags, or --server): it asks nothing more and trains on them")
    if not pool_recorded and run.votes.is_file():  # labels and metrics of an older version
        check_votes(run, VotePool.from_file(run.votes).describe(), task)
    return before, rounds_before, last["epsilon"]
