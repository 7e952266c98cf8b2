"""Reading votes files (``pate.data.votes_file``): a damaged ``votes.npz`` is one line naming the
file, whichever of its members is read first (the run's stages, ``pate status``, the report)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pate.data.votes_file import (
    load_partition,
    load_pool_fingerprint,
    load_private_fingerprint,
    load_private_records,
    load_votes,
    load_votes_with_index,
)
from pate.errors import UserError


def _votes_file(path: Path) -> Path:
    rng = np.random.default_rng(0)
    np.savez(path, votes=rng.multinomial(50, [0.5, 0.3, 0.2], size=2000),
             pool_index=np.arange(2000), pool_fingerprint=np.array("f" * 64),
             private_fingerprint=np.array("a" * 64), private_records=np.array(1000),
             partition=np.array("record"))
    return path


def test_a_whole_file_reads(tmp_path: Path) -> None:
    path = _votes_file(tmp_path / "votes.npz")
    votes, index = load_votes_with_index(path)
    assert votes.shape == (2000, 3) and np.array_equal(index, np.arange(2000))
    assert load_private_fingerprint(path) == "a" * 64 and load_private_records(path) == 1000
    assert load_partition(path) == "record" and load_pool_fingerprint(path) == "f" * 64


@pytest.mark.parametrize("damage", ["empty", "overwritten"])
def test_a_damaged_file_is_one_line_naming_it(tmp_path: Path, damage: str) -> None:
    path = _votes_file(tmp_path / "votes.npz")
    data = bytearray(path.read_bytes())
    if damage == "empty":
        data = bytearray()
    else:  # bytes inside the votes member, past the archive's headers
        data[3000:3008] = b"XXXXXXXX"
    path.write_bytes(bytes(data))
    with pytest.raises(UserError, match=r"not a readable \.npy/\.npz file"):
        load_votes(path)
    readers = (load_votes, load_votes_with_index, load_private_fingerprint,
               load_private_records, load_partition, load_pool_fingerprint)
    for read in readers:
        try:
            read(path)
        except UserError as exc:
            said = str(exc)
            assert said.startswith(f"{path}: ") and "\n" not in said, (read.__name__, said)
            assert "sha256" not in said and "must be" not in said  # the file, not its content
        # a member the damage left whole may read; nothing else may escape
