"""Files of a run directory: atomic writes (temporary file, fsync, rename) and private modes.

docs/design.md: private files (votes, ledger, teacher weights) are created 0600 and their
directories 0700; no half-written artifact is ever left behind.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

PRIVATE_FILE_MODE = 0o600
PRIVATE_DIR_MODE = 0o700


def ensure_dir(path: str | Path, private: bool = False) -> Path:
    """Create ``path`` (and parents) if needed; a private directory this creates is 0700 and
    one that existed loses every permission of others (one its owner made read-only stays so),
    a public one this creates is 0755 whatever the umask (a public file is 0644:
    ``atomic_writer``)."""
    p = Path(path)
    existed = p.is_dir()
    p.mkdir(parents=True, exist_ok=True)
    if private:
        p.chmod(p.stat().st_mode & PRIVATE_DIR_MODE if existed else PRIVATE_DIR_MODE)
    elif not existed:
        p.chmod(0o755)
    return p


@contextlib.contextmanager
def atomic_writer(path: str | Path, private: bool = False) -> Iterator[BinaryIO]:
    """Open a temporary file next to ``path`` for binary writing; on success it is fsynced and
    renamed over ``path``, on error removed. A private file is 0600 from its creation on."""
    target = Path(path)
    ensure_dir(target.parent)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        os.fchmod(fd, PRIVATE_FILE_MODE if private else 0o644)
        with os.fdopen(fd, "wb") as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


# the temporary files of atomic_writer: mkstemp's ".NAME." + 8 random characters + ".tmp"
_TEMPORARY = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


def remove_temporaries(folder: str | Path, idle: float = 600.0) -> int:
    """Remove what ``atomic_writer`` left under ``folder`` when a process was killed between
    writing a file and renaming it (nothing else removes them): its temporaries untouched for
    ``idle`` seconds, so that one another command is writing now is left alone. Returns how
    many were removed."""
    removed, before = 0, time.time() - idle
    for path in Path(folder).rglob(".*.tmp"):
        if (_TEMPORARY.fullmatch(path.name) and path.is_file() and not path.is_symlink()
                and path.stat().st_mtime < before):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
                removed += 1
    return removed


def write_bytes_atomic(path: str | Path, data: bytes, private: bool = False) -> None:
    with atomic_writer(path, private) as fh:
        fh.write(data)


def write_json_atomic(path: str | Path, obj: Any, private: bool = False) -> None:
    write_bytes_atomic(path, (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode(), private)


def write_with_atomic(path: str | Path, writer: Callable[[BinaryIO], None],
                      private: bool = False) -> None:
    """Atomically write ``path`` with a function of an open binary file (np.savez, torch.save)."""
    with atomic_writer(path, private) as fh:
        writer(fh)
