"""teachers.partition: seeded, deterministic, disjoint, balanced; overlaps are refused."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pate.errors import UserError
from teachers.ensemble import TrainConfig, train_group
from teachers.partition import (
    check_disjoint,
    make_partition,
    read_partition,
    verify_partition,
    write_partition,
)


@settings(max_examples=50, deadline=None)
@given(n=st.integers(1, 3000), k=st.integers(1, 300), seed=st.integers(0, 2**32))
def test_disjoint_complete_and_balanced(n, k, seed):
    if k > n:
        with pytest.raises(UserError):
            make_partition(n, k, seed)
        return
    part = make_partition(n, k, seed)
    rows = np.concatenate(part.parts())
    assert np.array_equal(np.sort(rows), np.arange(n))  # every row exactly once
    assert part.sizes.max() - part.sizes.min() <= 1
    assert [len(p) for p in part.parts()] == part.sizes.tolist()
    check_disjoint(part.parts(), n)


def test_deterministic_for_a_seed():
    a, b, c = make_partition(5000, 37, 7), make_partition(5000, 37, 7), make_partition(5000, 37, 8)
    assert np.array_equal(a.assignment, b.assignment) and a.sha256 == b.sha256
    assert not np.array_equal(a.assignment, c.assignment) and a.sha256 != c.sha256
    assert not np.array_equal(a.parts()[0], np.arange(len(a.parts()[0])))  # shuffled


def test_overlap_and_out_of_range_are_refused():
    with pytest.raises(UserError, match="overlap"):
        check_disjoint([np.array([0, 1, 2]), np.array([2, 3])], 10)
    with pytest.raises(UserError, match="outside"):
        check_disjoint([np.array([0, 10])], 10)


def test_training_refuses_overlapping_parts(digits):
    x, y = torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y)
    parts = [np.arange(0, 60), np.arange(50, 110)]
    with pytest.raises(UserError, match="overlap"):
        train_group(TrainConfig(epochs=1), x, y, 10, np.arange(2), parts, 60)


def test_partition_json_round_trip_and_mismatch(tmp_path):
    part = make_partition(1000, 10, 3)
    write_partition(tmp_path, part, "digits")
    recorded = read_partition(tmp_path)
    assert recorded["sizes"] == [100] * 10 and recorded["seed"] == 3
    verify_partition(recorded, part, "digits")
    with pytest.raises(UserError, match="different partition"):
        verify_partition(recorded, make_partition(1000, 10, 4), "digits")
