"""Shared fixtures: scikit-learn's 8x8 digits (small, shipped with scikit-learn) as the private
data of fast tests."""

from __future__ import annotations

import pytest

from pate.data.datasets import Dataset, load_dataset


@pytest.fixture(scope="session")
def digits() -> Dataset:
    return load_dataset("digits")
