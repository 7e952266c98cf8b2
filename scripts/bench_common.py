"""What every benchmark records with a result row: the machine, printed and appended as JSON."""

from __future__ import annotations

import json
import os
import platform
from pathlib import Path
from typing import Any


def emit(row: dict[str, Any], out: Path, **machine: Any) -> None:
    """Print ``row`` (plus the machine's CPU count and name, and ``machine``) as one JSON line and
    append it to ``out``."""
    row = {**row, "cpus": os.cpu_count(),
           "machine": platform.processor() or platform.machine(), **machine}
    print(json.dumps(row), flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("a") as fh:
        fh.write(json.dumps(row) + "\n")
