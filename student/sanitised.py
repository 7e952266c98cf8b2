"""The smooth-sensitivity-sanitised epsilon, released (docs/privacy-math.md §5).

The Table-2 analysis's sanitised bound is a function of the private votes; what is published is
its GNSS release (PATE 2018, Theorem 23; ``analysis.votes_analysis.sanitised_release``), with
noise drawn from the operating system's entropy. A release is made once per set of answers and
kept: asking for the epsilon of the same answers again returns the same figure at no new cost. A
release for more (or other) answers composes with every earlier one on the same private data,
whose beta and sigma are kept in the ledger that charges the votes, under its write lock
(``ledger_releases``), and is written there before it is returned. (Runs of an earlier version
kept theirs in the run's ``sanitised-releases.json``: still composed with, never written.)
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.mechanisms import Mechanism, mechanism_to_dict
from analysis.rdp import Conversion
from analysis.votes_analysis import EarlierRelease, PrivacyAnalysis, sanitised_release
from pate.aggregation.ledger import Ledger
from pate.errors import LedgerError, UserError


@dataclass(frozen=True)
class Release:
    """One release: the number of answers it covers, the epsilon published, the beta and
    sigma of its noise (None: no noise was needed, nothing more to compose), and ``answers``,
    a digest of which answers it covers where they are not the first ``queries`` of a run's
    (``PrivateLabels``: any set of rows, by any of the ledger's users)."""

    queries: int
    epsilon: float
    beta: float | None = None
    sigma: float | None = None
    answers: str | None = None

    def __post_init__(self) -> None:
        """Checked as read back: a record that cannot be one (a hand-edited file) is refused,
        since it decides what later releases pay for."""
        noise = (self.beta, self.sigma)
        positive = all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in noise)
        noise_ok = noise == (None, None) or (positive and self.beta < 0.5)
        if not (type(self.queries) is int and self.queries >= 1 and noise_ok
                and isinstance(self.epsilon, float) and math.isfinite(self.epsilon)
                and (self.answers is None or isinstance(self.answers, str))):
            raise ValueError("not a release")


class Releases:
    """The releases made from one body of votes, in order: ``records``, and ``keep``, called
    with every one of them before a new figure leaves (none: in memory)."""

    def __init__(self, records: list[Release] | None = None,
                 keep: Callable[[list[Release]], None] | None = None) -> None:
        self.records = list(records or [])
        self.keep = keep

    def release(self, queries: int,
                analyse: Callable[[list[EarlierRelease]], PrivacyAnalysis | None],
                conversion: Conversion = "improved", answers: str | None = None,
                formerly: Sequence[str] = ()) -> float | None:
        """The published sanitised epsilon of the first ``queries`` answers (or of the answers
        whose digest is ``answers``, or was one of ``formerly`` in earlier versions): the one
        released before for them, else a new release of ``analyse(earlier releases)``'s bound,
        composed with every earlier one (None where there is none: LNMax, the analysis cannot
        be made, its conditions C5/C6 fail, or a figure without noise would follow a noisy
        release; the data-independent epsilon stands)."""
        known = (answers, *formerly, None)  # a run file's (None): that run's first queries
        for r in self.records:
            if r.queries == queries and r.answers in known:
                return r.epsilon
        earlier = [EarlierRelease(r.beta, r.sigma) for r in self.records
                   if r.beta is not None and r.sigma is not None]
        analysis = analyse(earlier)
        if analysis is None or analysis.smooth_sensitivity is None:
            return None
        bound = analysis.smooth_sensitivity
        if bound.fallback:
            # the proof does not hold at this order (C5/C6): the figure would be the
            # data-independent bound of every query answered, never below the one the ledger
            # charged for the answers, and once published it would be the guarantee
            return None
        noisy = bound.sigma is not None and bool(bound.value)
        if earlier and not noisy:
            # a figure with no noise would carry the earlier releases' cost, whose sigma_ss
            # was chosen from the votes: nothing is released (the data-independent one stands)
            return None
        z = float(np.random.default_rng().standard_normal())  # seeded from the OS's entropy
        epsilon = sanitised_release(bound, z, analysis.delta, conversion)
        self.records.append(Release(queries, epsilon, bound.beta if noisy else None,
                                    bound.sigma if noisy else None, answers))
        if self.keep is not None:  # kept before the figure leaves
            self.keep(self.records)
        return epsilon


def run_file_releases(path: Path) -> list[Release]:
    """The releases an earlier version kept in a run's ``sanitised-releases.json`` (private
    JSON; none where it is not there): later releases compose with them."""
    if not path.is_file():
        return []
    try:
        return [Release(**r) for r in json.loads(path.read_text())]
    except (TypeError, ValueError, AttributeError):
        raise UserError(f"{path}: not a record of sanitised releases (damaged: restore it; it "
                        "decides what later releases pay for)") from None


@contextmanager
def ledger_releases(ledger: Ledger, also: list[Release] | None = None) -> Iterator[Releases]:
    """The releases kept in ``ledger`` (``Ledger.sanitised_releases``), after ``also`` (kept
    elsewhere, composed with, not written), under the ledger's write lock until the block ends:
    two users of the ledger cannot both draw a release of the same answers. A new one is
    committed when the block ends, before the caller may publish it."""
    with ledger.sanitised_releases() as (kept, add):
        try:
            records = [Release(**r) for r in kept]
        except (TypeError, ValueError):
            raise LedgerError("the ledger's record of sanitised releases is damaged: nothing "
                              "released") from None
        yield Releases([*(also or []), *records],
                       lambda all_of_them: add(asdict(all_of_them[-1])))


def answers_digest(votes: str, asked: Iterable[tuple[Mechanism, NDArray[np.int64],
                                                    NDArray[np.float64] | None]]) -> str:
    """Which answers a release covers (sha256, kept in the ledger only), however they were
    asked: the votes (``VotePool.digest``) and, per mechanism that answered (its JSON record,
    in sorted order), the rows it was asked, sorted, with the probabilities sent with them
    (Interactive-GNMax). ``asked`` holds (mechanism, pool rows, probabilities or None) per
    round or request: the rounds of ``pate run`` and one ``pate.api.PrivateLabels`` asking the
    same rows of the same mechanism (whose answers the ledger gives again) have one digest, so
    one release (docs/privacy-math.md §5); the analysis sums its costs over the rows, so their
    order and rounds change nothing."""
    by_mechanism: dict[str, list[tuple[NDArray[np.int64], NDArray[np.float64] | None]]] = {}
    for mechanism, index, probs in asked:
        record = json.dumps(mechanism_to_dict(mechanism), sort_keys=True)
        by_mechanism.setdefault(record, []).append((np.asarray(index, np.int64), probs))
    digest = hashlib.sha256(votes.encode())
    for record in sorted(by_mechanism):
        parts = by_mechanism[record]
        index = np.concatenate([i for i, _ in parts])
        order = np.argsort(index, kind="stable")
        digest.update(record.encode())
        digest.update(index[order].tobytes())
        if all(p is not None for _, p in parts):
            probs = np.concatenate([np.asarray(p, np.float64).reshape(len(i), -1)
                                    for i, p in parts])
            digest.update(np.ascontiguousarray(probs[order]).tobytes())
    return digest.hexdigest()


def former_answers_digest(mechanisms: Any, votes: str, pool_index: NDArray[np.int64],
                          probs: NDArray[np.float64] | None = None) -> str:
    """The digest versions before 2026-11-27 kept their releases under, so that the same
    answers still find theirs (``Releases.release``'s ``formerly``): ``mechanisms``' JSON
    records (``pate run``: its rounds' records but their stage; ``PrivateLabels``: its
    mechanism's), the votes, the rows and the probabilities sent, in the order given
    (``PrivateLabels``: by row)."""
    digest = hashlib.sha256(json.dumps(mechanisms).encode())
    digest.update(votes.encode())
    digest.update(np.ascontiguousarray(pool_index, np.int64).tobytes())
    if probs is not None and probs.size:
        digest.update(np.ascontiguousarray(probs, np.float64).tobytes())
    return digest.hexdigest()
