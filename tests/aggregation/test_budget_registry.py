"""``pate.aggregation.budget_registry``: the ledgers that charge one body of private data are
entered under its fingerprint, and a second ledger for the same data is warned of when votes
are first bound to it (docs/design.md, privacy rule 5)."""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import GNMax
from pate.aggregation.budget_registry import REGISTRY_FILE, other_ledgers, state_dir
from pate.aggregation.label_service import open_label_service

SAME, OTHER = "a" * 64, "b" * 64


def _votes(folder: Path, private_fingerprint: str) -> Path:
    folder.mkdir()
    votes = np.random.default_rng(0).multinomial(20, [0.8, 0.1, 0.1], size=30)
    np.savez(folder / "votes.npz", votes=votes, private_fingerprint=np.array(private_fingerprint))
    return folder / "votes.npz"


def _open_and_close(votes: Path, ledger: Path | None = None) -> list[str]:
    """The warnings of opening the label service on ``votes`` (their own ledger by default)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        open_label_service(GNMax(sigma=5.0), epsilon_budget=50.0, delta=1e-5,
                           votes_path=votes, ledger=ledger).close()
    return [str(w.message) for w in caught]


def test_a_second_ledger_for_the_same_private_data_is_warned_of(tmp_path: Path) -> None:
    first, second = _votes(tmp_path / "a", SAME), _votes(tmp_path / "b", SAME)
    assert _open_and_close(first) == []
    shared = _votes(tmp_path / "d", SAME)  # pointed at the first ledger: one budget
    assert _open_and_close(shared, tmp_path / "a" / "ledger.db") == []
    said = _open_and_close(second)
    assert len(said) == 1 and "also charged to 1 other ledger(s)" in said[0]
    assert str(tmp_path / "a" / "ledger.db") in said[0]
    assert _open_and_close(second) == []  # said when the votes are bound, not at every open
    assert _open_and_close(first) == []
    assert _open_and_close(_votes(tmp_path / "c", OTHER)) == []  # other data: no warning
    registry = state_dir() / REGISTRY_FILE
    assert stat.S_IMODE(registry.stat().st_mode) == 0o600
    assert stat.S_IMODE(state_dir().stat().st_mode) == 0o700


def test_the_registry_keeps_the_order_and_survives_a_damaged_or_unwritable_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert other_ledgers(SAME, "sqlite:///x") == []
    assert other_ledgers(SAME, "sqlite:///y") == ["sqlite:///x"]
    assert other_ledgers(SAME, "sqlite:///z") == ["sqlite:///x", "sqlite:///y"]
    assert other_ledgers(OTHER, "sqlite:///x") == []
    (state_dir() / REGISTRY_FILE).write_text("{not json")
    assert other_ledgers(SAME, "sqlite:///x") == []  # it only warns: it starts again
    assert other_ledgers(SAME, "sqlite:///y") == ["sqlite:///x"]
    if os.geteuid() != 0:  # root writes anywhere
        state_dir().chmod(0o500)
        try:
            assert other_ledgers(SAME, "sqlite:///w") == ["sqlite:///x", "sqlite:///y"]
        finally:
            state_dir().chmod(0o700)
    monkeypatch.delenv("PATE_STATE_DIR")
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert state_dir() == tmp_path / "xdg" / "pate"
