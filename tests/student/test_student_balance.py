"""Class-balanced drawing of the labelled set (``FitConfig.balance_classes``)."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

from student.training import FitConfig, balanced_indices, fit


def test_balanced_indices_repeat_every_class_to_the_largest() -> None:
    labels = np.array([3, 0, 3, 3, 7, 3, 0])          # 4 threes, 2 zeros, 1 seven
    index = balanced_indices(labels)
    assert np.bincount(labels[index], minlength=8)[[0, 3, 7]].tolist() == [4, 4, 4]
    assert set(index.tolist()) == set(range(len(labels)))   # every example is kept
    zeros = index[labels[index] == 0]                        # rows 1 and 6, each twice
    assert np.bincount(zeros, minlength=7)[[1, 6]].tolist() == [2, 2]
    np.testing.assert_array_equal(balanced_indices(np.array([5, 5])), [0, 1])


class LabelRecorder:
    """A learner that only records the labels ``fit`` hands it (the loop is what is tested)."""

    def __init__(self) -> None:
        self.model = nn.Linear(1, 1)
        self.optimizers = [torch.optim.SGD(self.model.parameters(), lr=0.0)]
        self.seen: list[np.ndarray] = []

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        self.seen.append(y_lab.numpy().copy())
        return {}


def _drawn(balance: bool) -> np.ndarray:
    y = np.array([0] * 90 + [1] * 10)
    x = np.zeros((100, 1, 2, 2), np.float32)
    recorder = LabelRecorder()
    fit(recorder, x, y, np.zeros((1800, 1, 2, 2), np.float32),
        FitConfig(epochs=1, batch_size=10, unlabelled_batch_size=10, balance_classes=balance))
    return np.bincount(np.concatenate(recorder.seen), minlength=2)


def test_fit_draws_the_classes_equally_often_when_balanced() -> None:
    plain, balanced = _drawn(False), _drawn(True)    # 180 batches of 10 labels each
    assert plain.tolist() == [1620, 180]             # 9:1, as the labels are
    assert balanced.tolist() == [900, 900]
