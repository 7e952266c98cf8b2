"""Numerically stable log-space helpers shared by every formula."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import logsumexp


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


def log_plurality_miss(votes: ArrayLike,
                       log_overturn: Callable[[NDArray[np.float64]], NDArray[np.float64]]
                       ) -> NDArray[np.float64]:
    """log q, the union bound on the probability that a noisy argmax of the counts ``votes``
    (``[queries, classes]``) does not return the plurality class i*: q <= sum over j != i* of
    P[the noise overturns the gap n_i* - n_j], capped at 1 - 1/m for m classes (PATE 2017,
    Lemma 4; PATE 2018, Prop. 7). ``log_overturn(gaps)`` is the log of that probability for
    the mechanism's noise, elementwise on ``[queries, classes]``. One class (m = 1) gives
    log q = -inf: the output is fixed. Returns ``[queries]``."""
    v = np.atleast_2d(np.asarray(votes, np.float64))
    m = v.shape[1]
    top = np.argmax(v, axis=1)
    terms = log_overturn(v[np.arange(v.shape[0]), top][:, None] - v)
    terms[np.arange(v.shape[0]), top] = -np.inf  # exclude one index of the maximum
    with np.errstate(divide="ignore"):
        logq = logsumexp(terms, axis=1) if m > 1 else np.full(v.shape[0], -np.inf)
        return np.minimum(logq, np.log1p(-1.0 / m))
