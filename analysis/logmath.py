"""Numerically stable log-space helpers shared by every formula."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def log1mexp(x: ArrayLike) -> NDArray[np.float64]:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Mächler 2012, "Accurately computing
    log(1 - exp(-|a|))"): log1p(-exp(x)) for x < -1, log(-expm1(x)) above, the split the published
    PATE 2018 analysis uses. Returns -inf at x = 0 and nan for x > 0."""
    x = np.asarray(x, dtype=np.float64)
    flat = np.atleast_1d(x)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.log1p(-np.exp(flat))  # nan for x > 0, -inf at 0
        near_zero = (flat > -1.0) & (flat <= 0.0)
        if near_zero.any():
            out[near_zero] = np.log(-np.expm1(flat[near_zero]))
    return out.reshape(x.shape)
