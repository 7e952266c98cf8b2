"""Query rounds: which pool rows the student asks about, asking, and what it received.

PATE 2018 (Papernot et al., "Scalable Private Learning with PATE", ICLR 2018), §4.2-4.3: a first
round asks Confident-GNMax for labels of part of the public pool and the student trains on the
answers; a second round asks Interactive-GNMax, sending the student's own class probabilities for
each query, and receives a teacher label, the student's label reinforced, or nothing. Each call of
``ask`` is one round against one aggregator (a ``pate.aggregation.label_requests.LabelSource``:
the HTTP client of ``pate serve`` or the in-process service); the round's kind follows the
aggregator's mechanism.

Selection (``select_queries``): ``first`` rows of the pool, a ``random`` subset, or
``uncertainty``: the rows where the current student is least confident (lowest top probability;
"least confident" sampling, B. Settles, "Active Learning Literature Survey", 2009, §3.1).

What was received is ``labels.npz`` of the run directory (docs/design.md): ``pool_index`` int64,
``label`` int64 (-1 = no answer), plus ``branch`` int8 (0 none, 1 teachers, 2 student) and the
``pool_fingerprint`` of the public pool asked about (``Task.pool_fingerprint``), written
atomically after every request so that nothing paid for is lost.
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.costs import steps
from analysis.mechanisms import Mechanism, mechanism_from_dict
from analysis.threshold import student_baseline
from analysis.votes_analysis import (
    EarlierRelease,
    PrivacyAnalysis,
    QuerySegment,
    analyze_segments,
)
from pate.aggregation.aggregators import BRANCH_NAMES, Branch
from pate.aggregation.label_requests import LabelSource
from pate.data.votes_file import load_pool_fingerprint
from pate.errors import BudgetExhausted, PayloadTooLarge, UserError
from pate.io import write_bytes_atomic
from pate.rundir import RunDir
from student.choices import SELECTIONS
from student.defaults import STUDENT


@dataclass(frozen=True)
class Received:
    """Answers received so far, one row per asked pool index; ``pool_fingerprint``: the pool's
    ``Task.pool_fingerprint`` where known (public); ``pool_size`` and ``classes``: how many
    rows and classes the votes asked of hold, where known (``pate.api.PrivateLabels``'; in
    memory only, not saved). ``replayed``: the rows whose answer was an earlier release of the
    ledger given again, free (the service's ``replayed`` marks; in memory only: False for rows
    loaded from ``labels.npz`` or given without marks)."""

    pool_index: NDArray[np.int64]
    label: NDArray[np.int64]
    branch: NDArray[np.int8]
    pool_fingerprint: str | None = None
    pool_size: int | None = None
    classes: int | None = None
    replayed: NDArray[np.bool_] = None  # None: no marks, all False (__post_init__)

    def __post_init__(self) -> None:
        marks = (np.zeros(len(self.pool_index), bool) if self.replayed is None
                 else np.asarray(self.replayed, bool))
        if marks.shape != np.shape(self.pool_index):
            raise ValueError("replayed must mark each asked row once")
        object.__setattr__(self, "replayed", marks)

    @classmethod
    def empty(cls) -> Received:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0, np.int8))

    @classmethod
    def load(cls, path: Path) -> Received:
        """``labels.npz``; a file without ``branch`` counts every answer as the teachers', one
        without ``pool_fingerprint`` (an older version's) leaves it None."""
        try:
            with np.load(path, allow_pickle=False) as data:
                index = data["pool_index"].astype(np.int64)
                label = data["label"].astype(np.int64)
                branch = (data["branch"].astype(np.int8) if "branch" in data.files
                          else np.where(label >= 0, 1, 0).astype(np.int8))
        except (OSError, ValueError, KeyError, EOFError, zipfile.BadZipFile, TypeError):
            raise UserError(f"{path}: not a labels file (.npz with pool_index and label): this "
                            "run directory is damaged") from None
        if not index.shape == label.shape == branch.shape or index.ndim != 1:
            raise UserError(f"{path}: pool_index, label and branch must be 1-d of one length")
        if (np.any((branch < 0) | (branch >= len(BRANCH_NAMES)))
                or np.any((branch == 0) != (label < 0))):
            raise UserError(f"{path}: branch must be 1 or 2 where a label came back, 0 where none "
                            "did: this run directory is damaged")
        return cls(index, label, branch, load_pool_fingerprint(path))

    def save(self, path: Path) -> None:
        buf = io.BytesIO()
        pool = {} if self.pool_fingerprint is None else {"pool_fingerprint": self.pool_fingerprint}
        np.savez(buf, pool_index=self.pool_index, label=self.label, branch=self.branch, **pool)
        write_bytes_atomic(path, buf.getvalue())

    def __add__(self, other: Received) -> Received:
        if np.intersect1d(self.pool_index, other.pool_index).size:
            raise ValueError("a pool index was asked twice")
        known = [{getattr(r, name) for r in (self, other)} - {None}
                 for name in ("pool_fingerprint", "pool_size", "classes")]
        if any(len(values) > 1 for values in known):
            raise ValueError("answers about two different pools")
        return Received(np.concatenate([self.pool_index, other.pool_index]),
                        np.concatenate([self.label, other.label]),
                        np.concatenate([self.branch, other.branch]),
                        *(next(iter(values), None) for values in known),
                        replayed=np.concatenate([self.replayed, other.replayed]))

    def __len__(self) -> int:
        return int(self.pool_index.size)

    def first(self, n: int) -> Received:
        """The first ``n`` rows asked (a prefix in asking order)."""
        return replace(self, pool_index=self.pool_index[:n], label=self.label[:n],
                       branch=self.branch[:n], replayed=self.replayed[:n])

    def since(self, n: int) -> Received:
        """The rows asked after the first ``n``."""
        return replace(self, pool_index=self.pool_index[n:], label=self.label[n:],
                       branch=self.branch[n:], replayed=self.replayed[n:])

    @property
    def answered(self) -> NDArray[np.bool_]:
        return self.label >= 0

    @property
    def by_teachers(self) -> NDArray[np.bool_]:
        """The answers the teachers gave: the queries whose answering step ran and was charged
        (an Interactive-GNMax answer of the student's own label was not)."""
        return self.branch == Branch.TEACHERS

    def counts(self) -> dict[str, int]:
        """Queries asked, answered, and answered by each branch."""
        return {"queries": len(self), "answered": int(self.answered.sum()),
                **{f"answered_by_{name}": int(np.sum(self.branch == code))
                   for code, name in enumerate(BRANCH_NAMES) if code}}


def select_queries(candidates: NDArray[np.int64], n: int, how: str,
                   rng: np.random.Generator | None = None,
                   probs: NDArray[np.float64] | None = None) -> NDArray[np.int64]:
    """Up to ``n`` of ``candidates`` (pool indices), in the order to ask them: the ``first``
    ones, ``random`` ones (with ``rng``; in a random order, so that a round the budget cuts
    short keeps a random part of them, not the lowest indices), or by ``uncertainty``
    (``probs[i]`` the student's probabilities for ``candidates[i]``; least confident first,
    ties by pool index)."""
    candidates = np.asarray(candidates, np.int64)
    n = min(int(n), candidates.size)
    if n == 0 and how in SELECTIONS:  # nothing to choose (a round that asks nothing)
        return np.zeros(0, np.int64)
    if how == "first":
        return np.sort(candidates)[:n]
    if how == "random":
        if rng is None:
            raise ValueError("random selection needs a generator")
        return rng.choice(candidates, n, replace=False)
    if how == "uncertainty":
        if probs is None or len(probs) != candidates.size:
            raise ValueError("uncertainty selection needs the student's probabilities of every "
                             "candidate")
        order = np.lexsort((candidates, np.max(probs, axis=1)))
        return candidates[order[:n]]
    raise ValueError(f"selection must be one of {SELECTIONS}, got {how!r}")


def ask(source: LabelSource, indices: NDArray[np.int64],
        student_probs: NDArray[np.float64] | None = None,
        request_size: int = STUDENT.request_size,
        on_request: Callable[[Received], None] | None = None) -> tuple[Received, bool]:
    """One round: ask ``source`` about ``indices`` in requests of ``request_size``, with the
    student's probabilities of each (Interactive-GNMax) when given. After every answered request
    ``on_request`` gets everything received in this round. A request refused at the budget (403:
    its worst case does not fit, and nothing was spent) is asked again in halves, so the round
    gets as many answers as the budget allows; it stops when even one query is refused: returns
    (received, True). A request larger than the service takes (413: refused before anything
    was asked or spent) is asked again in halves too, for the rest of the round."""
    indices = np.asarray(indices, np.int64)
    got = Received.empty()
    start, size = 0, request_size
    while start < indices.size:
        part = indices[start:start + size]
        probs = None if student_probs is None else student_probs[start:start + size]
        try:
            result = source.labels(part, student_probs=probs)
        except BudgetExhausted:
            if part.size == 1:
                return got, True
            size = (part.size + 1) // 2
            continue
        except PayloadTooLarge:  # the service's batch or body limit: smaller requests
            if part.size == 1:
                raise
            size = (part.size + 1) // 2
            continue
        names, which = np.unique(np.asarray(result.branch, str), return_inverse=True)
        branch = np.array([BRANCH_NAMES.index(n) for n in names], np.int8)[which]  # by name, once
        got = got + Received(part, np.asarray(result.labels, np.int64), branch,
                             replayed=result.replayed)
        start += part.size
        if on_request is not None:
            on_request(got)
    return got, False


def load_sent_probs(probs_path: Path) -> tuple[NDArray[np.int64], NDArray[np.float64]]:
    """``student/probs.npz``: the pool rows asked of Interactive-GNMax and the probabilities the
    student sent with them (empty where none was)."""
    if not probs_path.is_file():
        return np.zeros(0, np.int64), np.zeros((0, 0))
    with np.load(probs_path, allow_pickle=False) as data:
        return data["pool_index"].astype(np.int64), data["probs"]


def append_sent_probs(probs_path: Path, index: NDArray[np.int64],
                      probs: NDArray[np.float64]) -> None:
    """Add the rows ``index`` and the probabilities sent with them to ``probs_path``; a row it
    holds already (sent by a request whose answer was never saved) takes the new ones."""
    old_index, old_probs = load_sent_probs(probs_path)
    kept = ~np.isin(old_index, index)
    buf = io.BytesIO()
    np.savez(buf, pool_index=np.concatenate([old_index[kept], index]),
             probs=np.concatenate([old_probs.reshape(-1, probs.shape[1])[kept], probs]))
    write_bytes_atomic(probs_path, buf.getvalue())


def interactive_baseline(probs_path: Path, index: NDArray[np.int64], num_teachers: float
                         ) -> NDArray[np.float64]:
    """The baseline num_teachers * student_probs that Interactive-GNMax's threshold step
    subtracted (PATE 2018, Alg. 2) for the pool rows ``index``, from the probabilities the
    student sent (``student/probs.npz``). UserError when a row's probabilities are missing."""
    return num_teachers * sent_probs_of(probs_path, index)


def sent_probs_of(probs_path: Path, index: NDArray[np.int64]) -> NDArray[np.float64]:
    """The probabilities the student sent with the pool rows ``index`` (``student/probs.npz``),
    float64, in the order of ``index``. UserError when a row's are missing."""
    index = np.asarray(index, np.int64)
    sent_index, probs = load_sent_probs(probs_path)
    missing, rows = index.size, np.zeros(0, np.int64)
    if sent_index.size:
        order = np.argsort(sent_index)
        found = np.searchsorted(sent_index, index, sorter=order)
        rows = order[np.minimum(found, sent_index.size - 1)]
        missing = int(np.sum(sent_index[rows] != index))
    if missing:
        raise UserError(f"{probs_path}: no student probabilities for {missing} interactive "
                        "queries")
    return probs[rows].astype(np.float64)


def read_rounds(run: RunDir) -> list[dict[str, Any]]:
    """The rounds of ``student/rounds.json`` (``[]`` where there is none), each checked to be
    what ``pate student train`` writes: a record with the ``mechanism`` it asked (an object
    naming one) and its count of ``queries``; ``UserError`` otherwise (a damaged run
    directory)."""
    rounds = run.read_json(run.rounds)
    if rounds is None:
        return []
    if not isinstance(rounds, list) or not all(
            isinstance(r, dict) and isinstance(r.get("mechanism"), dict)
            and isinstance(r["mechanism"].get("mechanism"), str)
            and type(r.get("queries")) is int and r["queries"] >= 0 for r in rounds):
        raise UserError(f"{run.rounds}: not a record of query rounds: this run directory is "
                        "damaged (restore the file, or start a new --run directory)")
    return rounds


def round_plan(rounds: list[dict], received: Received,
               by_name: Callable[[str], Mechanism] | None = None
               ) -> list[tuple[Mechanism, slice]]:
    """Each round's mechanism and the rows of ``received`` it asked, in order: the mechanism as
    ``student/rounds.json`` records it or, where it records only the name (older versions, for
    a remote service), ``by_name(name)`` (the run's configuration). ``UserError`` where neither
    gives it, or the rounds do not account for every received row."""
    asked = sum(r["queries"] for r in rounds)
    if asked != len(received):
        raise UserError(f"student/rounds.json: its rounds ask {asked} rows, labels.npz holds "
                        f"{len(received)}: this run directory is damaged")
    plan, start = [], 0
    for r in rounds:
        record = r["mechanism"]
        try:
            if set(record) == {"mechanism"}:
                if by_name is None:
                    raise UserError("a round's aggregator parameters are not recorded (in "
                                    "student/rounds.json), and no config.toml gives them")
                mechanism = by_name(record["mechanism"])
            else:
                mechanism = mechanism_from_dict(record)
        except ValueError as exc:
            raise UserError(f"student/rounds.json: {exc}") from None
        plan.append((mechanism, slice(start, start + r["queries"])))
        start += r["queries"]
    return plan


def round_answers(rounds: list[dict], received: Received, probs_path: Path
                  ) -> list[tuple[Mechanism, NDArray[np.int64], NDArray[np.float64] | None]] | None:
    """What a run's rounds (``student/rounds.json``, in order, and the rows of ``received`` they
    asked, in the same order) asked: per round, its mechanism, the pool rows and, for
    Interactive-GNMax, the probabilities the student sent with them (``sent_probs_of``). None
    when a round's parameters were not recorded (by an older version, for a remote service) or
    the rounds do not account for every received row."""
    if sum(r["queries"] for r in rounds) != len(received) or any(
            set(r["mechanism"]) == {"mechanism"} for r in rounds):
        return None
    asked = []
    for mechanism, rows in round_plan(rounds, received):
        index = received.pool_index[rows]
        probs = (sent_probs_of(probs_path, index)
                 if steps(mechanism).student_gamma is not None else None)
        asked.append((mechanism, index, probs))
    return asked


def round_segments(rounds: list[dict], received: Received,
                   votes_of: Callable[[NDArray[np.int64]], NDArray[np.int64]],
                   probs_path: Path) -> list[QuerySegment] | None:
    """The privacy analysis's view of a run's rounds (``round_answers``): one ``QuerySegment``
    per round, with the votes ``votes_of(pool_index)`` and, for Interactive-GNMax, the baseline
    num_teachers * the probabilities sent (``interactive_baseline``); None where
    ``round_answers`` is."""
    asked = round_answers(rounds, received, probs_path)
    if asked is None:
        return None
    segments = []
    for mechanism, index, probs in asked:
        votes = votes_of(index)
        baseline = None if probs is None else student_baseline(votes, probs)
        segments.append(QuerySegment(votes, mechanism, baseline))
    return segments


def analyze_rounds(rounds: list[dict], received: Received,
                   votes_of: Callable[[NDArray[np.int64]], NDArray[np.int64]],
                   probs_path: Path, delta: float, conversion: str = "improved",
                   earlier: list[EarlierRelease] | None = None) -> PrivacyAnalysis | None:
    """``analysis.votes_analysis.analyze_segments`` (PATE 2018's Table 2 analysis, rounds
    composed) of the rounds' ``round_segments``; None where those are unknown. The full result
    holds the raw data-dependent epsilon: callers release only the data-independent and
    sanitised bounds (docs/design.md, privacy rule 6)."""
    segments = round_segments(rounds, received, votes_of, probs_path)
    if segments is None:
        return None
    return analyze_segments(segments, delta, conversion=conversion, earlier=earlier)
