"""The in-memory form of a labelled dataset, shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """A labelled image dataset. ``train_x``/``train_y`` are None when only the test split was
    loaded (``need_train=False``). ``pixel_max``: the raw integer value the loader scaled to 1
    (255 for 8-bit images; new integer images are scaled the same way)."""

    name: str
    train_x: np.ndarray | None
    train_y: np.ndarray | None
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    pixel_max: float = 255.0
