"""The command line's paths, refused as they are parsed when empty: ``--run "$DIR"`` with
``DIR`` unset would otherwise name the current folder (``Path("")`` is ``.``) or no folder at
all (a default)."""

from __future__ import annotations

import argparse
from pathlib import Path


def path_arg(value: str) -> Path:
    """argparse type: ``value`` as a ``Path``; a usage error where it is empty or blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?)")
    return Path(value)
