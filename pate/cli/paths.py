"""The command line's paths, refused as they are parsed when empty: ``--run "$DIR"`` with
``DIR`` unset would otherwise name the current folder (``Path("")`` is ``.``, and a data file
or folder is resolved against it) or no path at all (a default)."""

from __future__ import annotations

import argparse
from pathlib import Path


def path_text(value: str) -> str:
    """argparse type: ``value`` as given (a path, or a URL such as a ledger's); a usage error
    where it is empty or blank."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path (an unset shell variable?)")
    return value


def path_arg(value: str) -> Path:
    """argparse type: :func:`path_text`, as a ``Path``."""
    return Path(path_text(value))
