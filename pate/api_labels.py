"""``PrivateLabels`` of the Python API (:mod:`pate.api`): the student's queries answered by a PATE
mechanism against a privacy budget, charged to the same durable ledger as ``pate serve``, and
``PublishableEpsilon``, what may be published about the answers."""

from __future__ import annotations

import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.costs import realised_rdp_independent, steps, worst_case_queries
from analysis.mechanisms import MECHANISMS, Mechanism, ParameterError, mechanism_to_dict
from analysis.rdp import Conversion
from analysis.threshold import student_baseline
from analysis.votes_analysis import EarlierRelease, PrivacyAnalysis, QuerySegment, analyze_segments
from pate.aggregation.delta_policy import check_delta
from pate.aggregation.label_service import InProcessLabels, LabelService
from pate.aggregation.ledger import Ledger
from pate.aggregation.ledger_store import ledger_url
from pate.aggregation.vote_pool import VotePool
from pate.aggregation.votes_ledger import BUDGET_SPENT_HINT, note_ledger
from pate.api_checks import checked_integer, checked_rate
from pate.api_teachers import Teachers
from pate.data.votes_file import check_votes
from pate.errors import BudgetExhausted, UserError
from student.defaults import STUDENT
from student.rounds import Received, ask
from student.sanitised import answers_digest, former_answers_digest, ledger_releases


@dataclass(frozen=True)
class PublishableEpsilon:
    """What may be published about the answers given so far, at ``delta`` (docs/privacy-math.md
    §12 says what each figure rests on): ``every_answered``, the data-independent epsilon of
    the queries asked as if the teachers had answered every one (a fixed composition of worst
    cases: of the three it rests on the least); ``data_independent``, the same of the queries
    asked and the teachers' answers as the ledger charged them (their counts, which the answers
    show anyway; a charge within the budget, PATE 2018's figure, not in itself a guarantee);
    the smooth-sensitivity-sanitised data-dependent one (None for LNMax, or where none was
    drawn); and what the ledger charged (every client of the budget). ``to_quote`` is the one
    ``pate run``'s report quotes: the sanitised one where released, else ``every_answered``.
    On few answers the sanitised figure may exceed the data-independent ones. The first three
    cover this object's answers only: a student that also learns from answers other objects
    or runs received on the ledger is covered by ``ledger_spent``. ``not_sanitised`` says why
    ``smooth_sensitivity`` is None (None where it is not)."""

    data_independent: float
    smooth_sensitivity: float | None
    ledger_spent: float
    delta: float
    not_sanitised: str | None = None
    every_answered: float = 0.0

    @property
    def to_quote(self) -> float:
        """The figure to quote, as the report takes it: the sanitised one where it was
        released, else the data-independent one with every query answered."""
        return self.every_answered if self.smooth_sensitivity is None else self.smooth_sensitivity


# why PublishableEpsilon.smooth_sensitivity is None
NOT_ASKED = "not asked for (sanitise=False)"
NO_ANALYSIS = "this mechanism has no smooth-sensitivity analysis (LNMax): publish every_answered"
NOT_RELEASED = ("no figure could be released for these answers (the data-dependent analysis "
                "does not hold for them, or a figure without noise would follow an earlier "
                "release): publish every_answered")


def _pool_indices(indices: ArrayLike) -> NDArray[np.int64]:
    """Pool row numbers: a 1-d sequence of distinct integers (``UserError`` otherwise, before
    anything is asked)."""
    try:
        a = np.asarray(indices)
    except (TypeError, ValueError):  # ragged
        a = np.zeros((0, 0))
    if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise UserError("indices must be a 1-d sequence of integer pool row numbers")
    if np.unique(a).size != a.size:
        raise UserError("indices must not repeat")
    if a.size and a.min() < 0:
        raise UserError(f"indices are pool row numbers, >= 0: got {int(a.min())}")
    return a.astype(np.int64)


class PrivateLabels:
    """The aggregator over the teachers' ``votes`` on the public pool (rows are pool indices),
    with its durable privacy ledger: ``ledger`` is a file (SQLite) or a SQLAlchemy URL
    (``postgresql://...``), the same a ``pate serve`` of this data would use: one budget per
    body of private data. Noise comes from the operating system's
    entropy; every answer is charged before it is returned, and a request whose worst case does
    not fit the budget is refused (and asked again in halves by ``ask``). Given
    ``private_records``, the number of private rows the teachers learnt from, ``delta`` must be
    below 1/n (a ``UserError`` otherwise, unless ``allow_large_delta``; a warning above
    1/(10 n)), as ``pate serve`` and ``pate run`` require. Given the ``teachers`` whose votes
    these are, n is theirs, and the ledger is entered in the registry of the ledgers of their
    private data (``pate.aggregation.budget_registry``): a ledger new to it while others
    charge the same data is warned of, as their budgets add up.

    A pool row asked again of the same ledger, mechanism and votes, by a later object or
    another process, gets its first answer again, free (a release is a release), and is marked
    in the answers' ``replayed``; other votes (teachers trained again, on the same budget)
    answer it afresh, charged, and so does Interactive-GNMax always (its answer depends on the
    student's probabilities sent with the row). This object refuses a row it has asked already
    (its answer is in ``received``).

    The sanitised epsilons released (``epsilon``) are kept in the ledger, under its write
    lock: each is drawn once per set of answers, whichever object or process of the ledger
    asks, since fresh draws for the same answers would average their noise away
    (docs/privacy-math.md §5)."""

    def __init__(self, votes: ArrayLike, mechanism: Mechanism, *, epsilon_budget: float,
                 delta: float, ledger: str | Path, conversion: Conversion = "improved",
                 private_records: int | None = None, allow_large_delta: bool = False,
                 teachers: Teachers | None = None) -> None:
        if not isinstance(mechanism, tuple(MECHANISMS.values())):
            raise UserError("mechanism must be one of analysis.mechanisms' "
                            f"{', '.join(c.__name__ for c in MECHANISMS.values())}, got "
                            f"{mechanism!r}")
        try:
            self.pool = VotePool(check_votes(np.asarray(votes)))
        except (TypeError, ValueError):  # ragged rows, not numbers
            raise UserError("votes must be a 2-d array of counts [queries, classes]") from None
        epsilon_budget = checked_rate("epsilon_budget", epsilon_budget)
        delta = checked_rate("delta", delta)
        if delta >= 1.0:  # before any warning of it
            raise UserError(f"delta must be in (0, 1), got {delta!r}")
        if not isinstance(ledger, str | Path):
            raise UserError(f"ledger must be a file path or a URL, got {ledger!r}")
        if teachers is not None and not isinstance(teachers, Teachers):
            raise UserError(f"teachers must be the Teachers whose votes these are, got "
                            f"{type(teachers).__name__}")
        if teachers is not None and teachers.ensemble_ is None:
            raise UserError("fit the teachers first")
        if teachers is not None and (self.pool.votes.shape[1] != teachers.n_classes or np.any(
                self.pool.votes.sum(axis=1) != teachers.n_teachers)):  # said without a count
            raise UserError(f"votes are not those of these teachers: each row must hold "
                            f"{teachers.n_classes} classes' counts of their "
                            f"{teachers.n_teachers} votes")
        if teachers is not None and private_records is None:
            private_records = teachers.private_records_
        if private_records is not None:
            private_records = checked_integer("private_records", private_records, 1)
        elif not allow_large_delta:
            warnings.warn("PrivateLabels: delta is not checked against the size n of the "
                          "private data (it must be well below 1/n): give teachers= (which also "
                          "warns of other ledgers charging the same data) or private_records=",
                          stacklevel=2)
        check_delta(delta, private_records, allow_large_delta, "allow_large_delta=True")
        self.mechanism = mechanism
        url = ledger_url(ledger)
        try:
            self.service = LabelService.open(mechanism, self.pool, url,
                                             epsilon_budget=epsilon_budget, delta=delta,
                                             conversion=conversion)
        except ParameterError as exc:  # a threshold outside [0, the votes' teachers]
            raise UserError(str(exc)) from None
        try:
            if teachers is not None:
                note_ledger(teachers.private_fingerprint_, url,
                            rows_fingerprints=(teachers.private_rows_fingerprint_,
                                               teachers.private_encoded_rows_fingerprint_))
        except BaseException:
            self.service.close()
            raise
        self._source = InProcessLabels(self.service)
        self.received = Received.empty()
        self._probs: list[NDArray[np.float64]] = []

    @property
    def ledger(self) -> Ledger:
        """The ledger that charges this object's answers (its service's)."""
        return self.service.ledger

    def ask(self, indices: ArrayLike, student_probs: ArrayLike | None = None,
            request_size: int = STUDENT.request_size) -> Received:
        """Labels for the pool rows ``indices`` (-1 where the aggregator declined), as many as
        the budget allows (a warning says when that is fewer than asked, the first ones);
        ``.replayed`` marks those that were earlier releases of the ledger, given again free.
        Interactive-GNMax also takes the student's probabilities. A budget that covers not one
        of them is ``BudgetExhausted``: nothing was asked or spent."""
        index = _pool_indices(indices)
        again = np.intersect1d(index, self.received.pool_index)
        if again.size:
            raise UserError(f"{again.size} of these pool rows were asked already (their "
                            "answers are in .received): nothing was asked or spent")
        try:
            probs = None if student_probs is None else np.asarray(student_probs, np.float64)
        except (TypeError, ValueError):
            raise UserError("student_probs must be numbers [queries, classes]") from None
        request_size = checked_integer("request_size", request_size, 1)
        got, exhausted = ask(self._source, index, probs, request_size)
        if exhausted and not len(got):
            raise BudgetExhausted("the privacy budget does not cover even one more query: "
                                  f"nothing was asked or spent ({BUDGET_SPENT_HINT})")
        got = replace(got, pool_size=len(self.pool.votes),  # Student.fit checks its pool
                      classes=int(self.pool.votes.shape[1]))
        self.received = self.received + got
        if probs is not None:
            self._probs.append(probs[:len(got)])
        if exhausted:
            warnings.warn(f"the privacy budget covered {len(got)} of the {index.size} queries: "
                          "the rest were not asked", stacklevel=2)
        return got

    def queries_left(self) -> int:
        """How many more queries the budget covers whatever the votes: each answered by the
        teachers, its worst case, beyond what the ledger has spent
        (``analysis.costs.worst_case_queries``); ``ask`` answers at least that many before it
        stops at the budget. Reads only public figures."""
        spent_independent, _ = self.ledger.private_totals()  # the data-dependent part unused
        return worst_case_queries(self.mechanism, self.ledger.epsilon_budget,
                                  self.ledger.delta, self.ledger.orders,
                                  conversion=self.ledger.conversion, spent=spent_independent)

    def epsilon(self, sanitise: bool = True) -> PublishableEpsilon:
        """The epsilons you may publish for every query this object asked so far.

        The data-independent one reads no vote: it is free. The sanitised one is a release of
        its own, with noise (docs/privacy-math.md §5), drawn once per set of answers (the same
        rows, votes and mechanism): asked again, by this object or another on the same ledger,
        it is the same figure, but a release for other answers (after more ``ask``) composes
        with every earlier one, so each call between asks makes the next sanitised figure
        larger. Ask for it once, at the end; with ``sanitise=False`` nothing is released and
        ``smooth_sensitivity`` is None. Publish the data-independent epsilon alone, or both
        (their guarantee is then the smaller of the sanitised one and the data-independent one
        with the release's cost added, §5); decide which before drawing the sanitised one."""
        budget = self.ledger.budget()
        why = (NOT_ASKED if not sanitise else None if
               steps(self.mechanism).answer.smooth_sensitivity else NO_ANALYSIS)
        if not len(self.received):
            return PublishableEpsilon(0.0, None if why else 0.0, budget.epsilon_spent,
                                      budget.delta, why)
        asked = len(self.received)
        independent, every = (self.ledger.epsilon(realised_rdp_independent(
            self.mechanism, asked, answered, self.ledger.orders))
            for answered in (int(self.received.by_teachers.sum()), asked))
        if why:
            return PublishableEpsilon(independent, None, budget.epsilon_spent, budget.delta, why,
                                      every)

        def analyse(earlier: list[EarlierRelease]) -> PrivacyAnalysis:  # only for a new release
            votes = self.pool.votes[self.pool.rows(self.received.pool_index)]
            baseline = (None if not self._probs
                        else student_baseline(votes, np.concatenate(self._probs)))
            return analyze_segments([QuerySegment(votes, self.mechanism, baseline)],
                                    budget.delta, conversion=self.ledger.conversion,
                                    earlier=earlier)

        order = np.argsort(self.received.pool_index)
        former = former_answers_digest(  # as versions before 2026-11-27 kept it
            mechanism_to_dict(self.mechanism), self.pool.digest, self.received.pool_index[order],
            np.concatenate(self._probs)[order] if self._probs else None)
        with ledger_releases(self.ledger) as releases:
            sanitised = releases.release(len(self.received), analyse, self.ledger.conversion,
                                         self._answers_digest(), formerly=[former])
        return PublishableEpsilon(independent, sanitised, budget.epsilon_spent, budget.delta,
                                  None if sanitised is not None else NOT_RELEASED, every)

    def _answers_digest(self) -> str:
        """Which answers a release covers (``student.sanitised.answers_digest``): the
        mechanism, the votes, the rows asked and the probabilities sent with them; the same
        as ``pate run``'s for the same rows of the same mechanism."""
        sent = bool(self._probs) and steps(self.mechanism).student_gamma is not None
        return answers_digest(self.pool.digest, [(
            self.mechanism, self.received.pool_index,
            np.concatenate(self._probs) if sent else None)])

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> PrivateLabels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
