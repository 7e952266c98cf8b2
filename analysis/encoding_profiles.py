"""The preselected set Psi of gradient encoding (Nasr, Shokri, Houmansadr 2020, "Improving Deep
Learning with Differential Privacy using Gradient Encoding and Denoising", Algorithm 2): ``count``
vectors of the model's size drawn i.i.d. from a standard Gaussian, values below 1e-5 in magnitude
set to zero, each scaled to L2 norm 1 (the clipping norm is the unit). Only each vector's sorted
magnitude profile matters to the encoder and to the accountant, so that is what is returned.

Psi is public and data-independent: a seed makes it reproducible, and the accountant and the
learner rebuild the same profiles from the same (count, dimension, seed).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

# The paper's threshold below which a drawn value is set to zero.
ZERO_BELOW = 1e-5
_ROWS_PER_CHUNK = 64
# Psi is held whole (the accountant and the encoder both need every profile): a set larger than
# this is refused before anything is allocated, instead of exhausting the machine's memory.
MAX_PROFILE_BYTES = 4 * 2**30


def profiles_problem(count: int, dimension: int) -> str | None:
    """Why ``count`` profiles of ``dimension`` coordinates cannot be made (their matrix Psi
    over ``MAX_PROFILE_BYTES``), or None."""
    size = count * dimension * np.dtype(np.float64).itemsize
    if size <= MAX_PROFILE_BYTES:
        return None
    return (f"{count} profiles of {dimension} coordinates would take {size / 2**30:.3g} GiB; "
            f"Psi is limited to {MAX_PROFILE_BYTES / 2**30:g} GiB (fewer profiles)")


def sorted_profiles(count: int, dimension: int, seed: int) -> NDArray[np.float64]:
    """[count, dimension] float64: each row a unit-norm magnitude profile, sorted descending."""
    if count < 1 or dimension < 1:
        raise ValueError(f"encoding needs at least 1 profile of at least 1 coordinate (the "
                         f"model's parameters), got {count} profiles of {dimension}")
    if not 0 <= seed < 2**63:
        raise ValueError(f"the profiles' seed (encode_seed) must be in [0, 2^63), got {seed}")
    if problem := profiles_problem(count, dimension):
        raise ValueError(problem)
    rng = np.random.default_rng(seed)
    out = np.empty((count, dimension), np.float64)
    for start in range(0, count, _ROWS_PER_CHUNK):
        rows = np.abs(rng.standard_normal((min(_ROWS_PER_CHUNK, count - start), dimension)))
        rows[rows < ZERO_BELOW] = 0.0
        rows = -np.sort(-rows, axis=1)
        out[start:start + len(rows)] = rows / np.linalg.norm(rows, axis=1, keepdims=True)
    return out
