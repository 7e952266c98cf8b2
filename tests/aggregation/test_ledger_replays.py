"""``Replays``, the outcomes a ledger replays, against a plain dict of first releases: through
many merges of its newest releases into the rest, with indices of any int64 and undone groups."""

from __future__ import annotations

import numpy as np

from pate.aggregation.ledger_replays import Replays


def test_replays_keep_each_first_release_through_merges_and_forgets() -> None:
    rng = np.random.default_rng(7)
    replays, first = Replays(), {}
    for step in range(400):
        size = int(rng.integers(1, 300 if step % 50 else 5000))  # now and then a large one
        indices = rng.integers(-(2**40), 2**40, size) if step % 7 == 0 else (
            rng.integers(0, 60_000, size))
        labels, branch = rng.integers(-1, 10, size), rng.integers(0, 3, size)
        replays.add(indices, labels, branch)
        for i, lab, br in zip(indices.tolist(), labels.tolist(), branch.tolist(), strict=True):
            first.setdefault(i, (lab << 8) | br)
        if step % 37 == 5:  # a group that could not be recorded
            undone = rng.choice(list(first), 40, replace=False)
            replays.forget(undone)
            for i in undone.tolist():
                del first[i]
        asked = np.concatenate([rng.choice(list(first), 200), rng.integers(0, 70_000, 50)])
        expected = [first.get(i, Replays.UNSET) for i in asked.tolist()]
        assert replays.lookup(asked).tolist() == expected
    assert len(first) > 50_000  # the rest was merged into many times
