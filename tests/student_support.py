"""Helpers of the student tests: one torch thread (the tests share two cores with everything
else; several threads contending are slower than one) and votes that agree with true labels."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch


@pytest.fixture(scope="module")
def one_thread() -> Iterator[None]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def votes_for(labels: np.ndarray, teachers: int = 250, classes: int = 10,
              seed: int = 0) -> np.ndarray:
    """Made-up votes ``[rows, classes]`` int32: each row's share of teachers voting for the true
    label is drawn around 0.6, the rest vote uniformly (not private: synthetic)."""
    rng = np.random.default_rng(seed)
    share = np.clip(rng.normal(0.6, 0.2, len(labels)), 0.05, 1.0)
    right = rng.binomial(teachers, share)
    votes = np.stack([rng.multinomial(teachers - r, np.full(classes, 1 / classes))
                      for r in right])
    votes[np.arange(len(labels)), labels] += right
    return votes.astype(np.int32)


def released(ledger: Path) -> list[tuple[int, float]]:
    """(queries, epsilon) of each sanitised release kept in the SQLite ledger ``ledger``."""
    with sqlite3.connect(ledger) as db:
        return [(int(q), float(e)) for q, e in db.execute(
            "SELECT queries, epsilon FROM ledger_releases ORDER BY seq")]
