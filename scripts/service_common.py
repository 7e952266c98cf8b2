"""What the service's scripts and tests share: a votes file of its own for each ledger."""

from __future__ import annotations

import re
import shutil
from pathlib import Path


def votes_for_ledger(votes: Path, ledger: str) -> Path:
    """A copy of ``votes`` in a folder of its own per ledger URL: votes have one ledger for
    good (``open_label_service``), and the service's tests and benchmarks start many servers on
    the same synthetic votes, each with a ledger of its own (servers sharing a ledger share the
    copy)."""
    folder = votes.parent / ("votes-for-" + re.sub(r"[^\w.-]", "_", ledger))
    folder.mkdir(exist_ok=True)
    copy = folder / votes.name
    if not copy.exists():
        shutil.copyfile(votes, copy)
    return copy
