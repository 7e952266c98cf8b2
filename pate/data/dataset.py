"""The in-memory form of a labelled dataset, shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """A labelled image dataset. ``train_x``/``train_y`` are None when only the test split was
    loaded (``need_train=False``)."""

    name: str
    train_x: np.ndarray | None
    train_y: np.ndarray | None
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
