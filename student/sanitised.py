"""The smooth-sensitivity-sanitised epsilon, released (docs/privacy-math.md §5).

The Table-2 analysis's sanitised bound is a function of the private votes; what is published is
its GNSS release (PATE 2018, Theorem 23; ``analysis.votes_analysis.sanitised_release``), with
noise drawn from the operating system's entropy. A release is made once per set of answers and
kept: asking for the epsilon of the same answers again returns the same figure at no new cost. A
release for more (or other) answers composes with the earlier ones, whose beta and sigma are
kept in a private record (a run's ``sanitised-releases.json``; ``PrivateLabels``'s in its
ledger, under the ledger's write lock), and is written before it is returned.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from analysis.rdp import Conversion
from analysis.votes_analysis import EarlierRelease, PrivacyAnalysis, sanitised_release
from pate.errors import UserError
from pate.io import write_json_atomic


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

    @classmethod
    def from_file(cls, path: Path) -> Releases:
        """The releases of a run, kept in ``path`` (private JSON, ``sanitised-releases.json``)."""
        records: list[Release] = []
        if path.is_file():
            try:
                records = [Release(**r) for r in json.loads(path.read_text())]
                counts = [r.queries for r in records if r.answers is None]
                if counts != sorted(set(counts)):  # prefixes of a run's answers, in order
                    raise ValueError("releases out of order")
            except (TypeError, ValueError, AttributeError):
                raise UserError(f"{path}: not a record of sanitised releases (damaged: restore "
                                "it; it decides what later releases pay for)") from None
        return cls(records, lambda all_of_them: write_json_atomic(
            path, [asdict(r) for r in all_of_them], private=True))

    def release(self, queries: int,
                analyse: Callable[[list[EarlierRelease]], PrivacyAnalysis | None],
                conversion: Conversion = "improved", answers: str | None = None
                ) -> float | None:
        """The published sanitised epsilon of the first ``queries`` answers (or of the answers
        whose digest is ``answers``): the one released before for them, else a new release of
        ``analyse(earlier releases)``'s bound, composed with every earlier one (None where
        there is none: LNMax, the analysis cannot be made, or a figure without noise would
        follow a noisy release)."""
        for r in self.records:
            if (r.queries, r.answers) == (queries, answers):
                return r.epsilon
        earlier = [EarlierRelease(r.beta, r.sigma) for r in self.records
                   if r.beta is not None and r.sigma is not None]
        analysis = analyse(earlier)
        if analysis is None or analysis.smooth_sensitivity is None:
            return None
        bound = analysis.smooth_sensitivity
        noisy = not bound.fallback and bound.sigma is not None and bool(bound.value)
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

