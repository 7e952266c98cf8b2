"""``pate analyze``'s work: PATE 2018's Table 2 analysis of a votes file, of its first rows or of
the rows a student asked (``analyze_votes_file``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from analysis.costs import steps
from analysis.mechanisms import Mechanism, ParameterError
from analysis.rdp import Conversion
from analysis.votes_analysis import PrivacyAnalysis, analyze_votes
from pate.aggregation.vote_pool import VotePool
from pate.data.votes_file import (
    load_baseline,
    load_pool_fingerprint,
    load_pool_indices,
    load_votes,
)
from pate.errors import UserError


def analyze_votes_file(votes_path: str | Path, mechanism: Mechanism, delta: float, *,
                       queries: int | None = None, asked_path: str | Path | None = None,
                       baseline_path: str | Path | None = None, order: float | None = None,
                       beta: float | None = None, conversion: Conversion = "improved"
                       ) -> PrivacyAnalysis:
    """The analysis of answering every row of the votes file, its first ``queries`` rows, or
    the rows a student asked (``asked_path``: a ``labels.npz`` or a ``.npy`` of pool indices,
    in its order); Interactive-GNMax needs ``baseline_path`` (num_teachers * student_probs,
    row for row with the votes). ``UserError`` for settings or files that do not fit; a
    parameter error names its flag (``--sigma1``)."""
    interactive = steps(mechanism).student_gamma is not None
    if baseline_path is not None and not interactive:
        raise UserError("--baseline is for --mechanism interactive only")
    if beta is not None and not steps(mechanism).answer.smooth_sensitivity:
        raise UserError(f"--beta is for the smooth-sensitivity analysis, which "
                        f"{mechanism.title} has none of")
    if asked_path is None:
        votes, asked = load_votes(votes_path), None
    else:
        votes, asked = _votes_and_asked_rows(votes_path, asked_path, distinct=not interactive)
    baseline = None
    if interactive:
        if baseline_path is None:
            raise UserError("interactive needs --baseline (num_teachers * student_probs)")
        baseline = load_baseline(baseline_path, votes)
    if queries is not None:
        if queries > votes.shape[0]:
            raise UserError(f"--queries {queries} exceeds the {votes.shape[0]} rows of "
                            f"{votes_path}")
        votes = votes[:queries]
        baseline = None if baseline is None else baseline[:queries]
    if asked is not None:
        votes = votes[asked]
        baseline = None if baseline is None else baseline[asked]
    try:
        return analyze_votes(votes, mechanism, delta, baseline=baseline, order=order,
                             beta=beta, conversion=conversion)
    except ParameterError as exc:
        raise UserError(exc.named("--")) from None
    except ValueError as exc:
        raise UserError(str(exc)) from None


def _votes_and_asked_rows(votes_path: str | Path, asked_path: str | Path, distinct: bool
                          ) -> tuple[NDArray[np.int64], NDArray[np.int64]]:
    """The votes, and the rows holding the pool indices of ``asked_path`` in its order (the
    service's own lookup, so the rows are those its aggregator saw). With ``distinct``, an
    index asked again counts once: the service replays its first answer, free (every mechanism
    but Interactive-GNMax, docs/design.md, "The aggregation service"). A ``labels.npz`` that
    records another pool than the votes' (``pool_fingerprint``) is refused."""
    indices = load_pool_indices(asked_path)
    if distinct:
        indices = indices[np.sort(np.unique(indices, return_index=True)[1])]
    pool = VotePool.from_file(votes_path)
    asked_pool = load_pool_fingerprint(asked_path)
    if None not in (asked_pool, pool.fingerprint) and asked_pool != pool.fingerprint:
        raise UserError(f"{asked_path}: these rows were asked of another public pool than "
                        f"{votes_path} was cast on")
    try:
        return pool.votes, pool.rows(indices)
    except UserError as exc:
        raise UserError(f"{asked_path}: {exc.detail} (the pool of {votes_path})") from None
