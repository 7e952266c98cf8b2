"""What a run's report is made of, as plain arrays and dictionaries; reading a run directory into
it is :mod:`pate.report.run_report`'s job."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.mechanisms import Mechanism


@dataclass(frozen=True)
class Segment:
    """Queries answered by one aggregator: rows of the votes matrix, what came back, and which
    answers the teachers gave (the rest of the answers are Interactive-GNMax's student label)."""

    rows: NDArray[np.int64]
    mechanism: Mechanism
    labels: NDArray[np.int64]                 # -1 = no answer
    by_teachers: NDArray[np.bool_]
    baseline: NDArray[np.float64] | None = None


@dataclass(frozen=True)
class RunData:
    name: str
    dataset: str
    delta: float
    votes: NDArray[np.int64] = field(repr=False)  # PRIVATE: every pool row
    pool_labels: NDArray[np.int64] | None     # true labels of the pool rows (public data)
    segments: list[Segment]
    lnmax_scale: float
    teacher_accuracies: NDArray[np.float64] | None = None
    student: dict[str, Any] | None = None
    dpsgd: dict[str, Any] | None = field(default=None, repr=False)  # with the Bayesian ε
    comparison: dict[str, Any] | None = field(default=None, repr=False)  # PRIVATE: owner only
    classes_from: str | None = None           # where the label set came from (public schema)
    extra: dict[str, Any] = field(default_factory=dict)
