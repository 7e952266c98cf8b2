"""Numerically stable log-space helpers shared by every formula."""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike, NDArray


def log1mexp(x: ArrayLike) -> NDArray[np.float64]:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Mächler 2012, "Accurately computing
    log(1 - exp(-|a|))"): log1p(-exp(x)) for x < -1, log(-expm1(x)) above, the split the published
    PATE 2018 analysis uses. Returns -inf at x = 0 and nan for x > 0."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        out = np.where(x < -1.0, np.log1p(-np.exp(np.minimum(x, -1.0))),
                       np.log(-np.expm1(np.minimum(x, 0.0))))
    return np.where(x > 0, np.nan, out)
