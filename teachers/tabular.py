"""scikit-learn estimators as teachers, for tabular data (PATE is model-agnostic: Papernot et
al., ICLR 2017, section 2). Each teacher is a clone of one estimator fitted on its own partition
(https://scikit-learn.org/stable/modules/generated/sklearn.base.clone.html); the fits run in
parallel with joblib. Estimators have no common vectorised form, so this path loops over
teachers inside joblib; the neural teachers use :mod:`teachers.ensemble`.
"""

from __future__ import annotations

import numpy as np
from joblib import Parallel, delayed
from sklearn.base import BaseEstimator, clone

from teachers.partition import check_disjoint


def _fit(estimator: BaseEstimator, x: np.ndarray, y: np.ndarray) -> BaseEstimator:
    return clone(estimator).fit(x, y)


def fit_teachers(estimator: BaseEstimator, x: np.ndarray, y: np.ndarray,
                 parts: list[np.ndarray], n_jobs: int = 1) -> list[BaseEstimator]:
    """One fitted clone of ``estimator`` per partition; ``x`` is ``[n, features]`` (images are
    flattened)."""
    check_disjoint(parts, len(x))
    x2 = x.reshape(len(x), -1)
    return Parallel(n_jobs=n_jobs)(delayed(_fit)(estimator, x2[p], y[p]) for p in parts)


def tabular_votes(teachers: list[BaseEstimator], x: np.ndarray, num_classes: int) -> np.ndarray:
    """Vote histograms ``int32 [n, num_classes]`` of fitted estimators on the rows of ``x``."""
    x2 = x.reshape(len(x), -1)
    labels = np.stack([t.predict(x2) for t in teachers]).astype(np.int64)  # [T, n]
    counts = np.zeros((x2.shape[0], num_classes), dtype=np.int32)
    np.add.at(counts, (np.broadcast_to(np.arange(x2.shape[0]), labels.shape), labels), 1)
    return counts
