"""Counter-based random numbers keyed by (seed, teacher, stream, counter).

A teacher's initial weights, minibatch order and augmentation must not depend on which other
teachers share its vectorised group, or the group could not reproduce a teacher trained alone.
A counter-based generator gives that for free and stays vectorised: every number is a hash of its
coordinates. The mixer is SplitMix64's finaliser (G. Steele, D. Lea, C. Flood, "Fast splittable
pseudorandom number generators", OOPSLA 2014), applied to a key that folds in each coordinate.
These streams exist for offline, reproducible teacher training only; they never drive privacy
noise (docs/design.md, privacy rule 3).
"""

from __future__ import annotations

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)

# Stream identifiers: one per use, so that no two uses share numbers. PARTITION deals the private
# rows to the teachers (:mod:`teachers.partition`, keyed as teacher 0). MODULE_INIT and FORWARD
# seed torch's generator per teacher for a user's own network (:mod:`teachers.user_models`): its
# own initialisation, and the random numbers its forward draws (dropout) when trained one at a
# time. (MIXUP was 4, the partition's stream, before 2026-11-27: teacher 0's mixup weights were
# the partition's keys.)
PARTITION, INIT, ORDER, AUGMENT, MIXUP, MODULE_INIT, FORWARD = 4, 1, 2, 3, 7, 5, 6

# A seed is a non-negative int64: these streams take it as one, and so does torch's generator.
SEED_LIMIT = 2**63


def _mix(z: np.ndarray) -> np.ndarray:
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def bits(seed: int, teachers: np.ndarray, stream: int, *counters: np.ndarray) -> np.ndarray:
    """64 random bits for each element of ``[K, ...]``.

    ``teachers`` holds global teacher ids ``[K]``; every counter has the full rank, with a leading
    axis of length K or 1 (e.g. ``[1, n]`` for positions shared by all teachers).
    """
    rank = max((np.ndim(c) for c in counters), default=1)
    with np.errstate(over="ignore"):
        key = _mix(np.uint64(seed) * _GOLDEN + np.uint64(stream))
        t = np.asarray(teachers, dtype=np.uint64)
        z = _mix(key ^ (t * _GOLDEN)).reshape((-1,) + (1,) * (rank - 1))
        for c in counters:
            z = _mix(z ^ (np.asarray(c, dtype=np.uint64) + _GOLDEN))
    return z


def uniform(seed: int, teachers: np.ndarray, stream: int, *counters: np.ndarray) -> np.ndarray:
    """Floats in [0, 1) with 53 random bits, shaped like :func:`bits`."""
    return (bits(seed, teachers, stream, *counters) >> np.uint64(11)) * (1.0 / 2.0**53)
