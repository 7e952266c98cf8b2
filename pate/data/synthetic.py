"""Synthetic teacher votes with realistic consensus, for benchmarks, tests and examples. These
are made-up data, not private: nothing here comes from a real ensemble."""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray


def synthetic_votes(queries: int, teachers: int, classes: int, seed: int = 0,
                    contested: float = 0.15, concentration: float = 0.3) -> NDArray[np.int32]:
    """Votes ``[queries, classes]`` (int32, rows sum to ``teachers``): a fraction ``1 - contested``
    of queries has 85-99% agreement on one class, the rest 25-70%; the remaining votes are spread
    over the other classes by a Dirichlet(concentration) draw, so a few confusable classes collect
    most of them, as with real teachers."""
    rng = np.random.default_rng(seed)
    top = rng.integers(0, classes, queries)
    is_contested = rng.random(queries) < contested
    agreement = np.where(is_contested, rng.uniform(0.25, 0.70, queries),
                         rng.uniform(0.85, 0.99, queries))
    leader_votes = np.round(agreement * teachers).astype(np.int64)
    spread = rng.dirichlet(np.full(classes, concentration), size=queries)
    spread[np.arange(queries), top] = 0.0
    spread /= spread.sum(axis=1, keepdims=True)
    votes = rng.multinomial(teachers - leader_votes, spread)
    votes[np.arange(queries), top] += leader_votes
    return votes.astype(np.int32)


def dirichlet_votes(rows: int, teachers: int = 250, classes: int = 10, seed: int = 0,
                    strict: bool = False) -> NDArray[np.int32]:
    """Votes of ``teachers`` on ``rows`` queries (int32 ``[rows, classes]``), each row's class
    shares drawn from Dirichlet(0.3): agreement from split to unanimous, for the service's
    tests, stress runs and benchmarks. With ``strict`` a row without a strict plurality is
    drawn again, so every row has one answer."""
    rng = np.random.default_rng(seed)
    votes = rng.multinomial(teachers, rng.dirichlet(np.full(classes, 0.3), size=rows))
    while strict:
        top = np.sort(votes, axis=1)
        tied = top[:, -1] <= top[:, -2]
        if not tied.any():
            break
        votes[tied] = rng.multinomial(teachers, rng.dirichlet(np.full(classes, 0.3),
                                                              size=int(tied.sum())))
    return votes.astype(np.int32)
