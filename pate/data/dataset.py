"""The in-memory form of a labelled dataset, shared by every loader."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Dataset:
    """A labelled image dataset. ``train_x``/``train_y`` are None when only the test split was
    loaded (``need_train=False``). ``pixel_max``: the raw integer value the loader scaled to 1
    (255 for 8-bit images; new integer images are scaled the same way). ``class_names``: the
    name of each label index, as the dataset's publishers give them (empty: the indices)."""

    name: str
    train_x: np.ndarray | None
    train_y: np.ndarray | None
    test_x: np.ndarray
    test_y: np.ndarray
    num_classes: int
    pixel_max: float = 255.0
    class_names: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.class_names and len(self.class_names) != self.num_classes:
            raise ValueError(f"{len(self.class_names)} class names for {self.num_classes} classes")

    @property
    def classes(self) -> tuple[str, ...]:
        """The name of each class: ``class_names``, else the label indices as text."""
        return self.class_names or tuple(str(c) for c in range(self.num_classes))
