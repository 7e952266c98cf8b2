"""Which ledgers charge each body of private data on this machine, so that a second budget for
the same data does not start unnoticed (docs/design.md, privacy rule 5).

A votes file records the fingerprint of the private rows its teachers learnt from
(``Task.private_fingerprint``, PRIVATE); each ledger that charges such votes is entered under
that fingerprint in one file per user, ``budgets.json`` in ``$PATE_STATE_DIR`` (default
``$XDG_STATE_HOME/pate``, else ``~/.local/state/pate``), created 0600 in a 0700 folder and
written atomically under a lock. A ledger newly used for data that other ledgers already
charge is warned of (``pate.aggregation.votes_ledger.note_ledger``): the budgets of one body of
private data add up.
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pate.io import PRIVATE_FILE_MODE, ensure_dir, write_json_atomic

REGISTRY_FILE = "budgets.json"
_VERSION = 1


def state_dir() -> Path:
    """Where the registry lies: ``$PATE_STATE_DIR``, else ``$XDG_STATE_HOME/pate``, else
    ``~/.local/state/pate``."""
    named = os.environ.get("PATE_STATE_DIR")
    if named:
        return Path(named).expanduser()
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "pate"


@contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """An exclusive lock on the registry, across processes, for the ``with`` block."""
    fd = os.open(folder / f"{REGISTRY_FILE}.lock", os.O_CREAT | os.O_RDWR, PRIVATE_FILE_MODE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # releases the lock


def _read(path: Path) -> dict[str, list[str]]:
    """The registry's entries, fingerprint -> ledger URLs; a missing or unreadable file is an
    empty registry (it only warns: it may be deleted)."""
    try:
        found: Any = json.loads(path.read_text(encoding="utf-8"))
        entries = found["data"] if found.get("version") == _VERSION else {}
        return {str(k): [str(u) for u in v] for k, v in entries.items() if isinstance(v, list)}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return {}


def _still_there(url: str) -> bool:
    """Whether a ledger entered before may still charge the data: an SQLite file that is gone
    (deleted, or moved with its run directory and entered again under its new path) does
    not; a server's database is taken to be there."""
    prefix = "sqlite:///"
    return not url.startswith(prefix) or Path(url[len(prefix):]).is_file()


def ledgers_of(private_fingerprint: str) -> list[str]:
    """The ledgers entered under the private data's fingerprint that are still there, in the
    order they were entered; reads only (nothing where there is no registry)."""
    try:
        path = state_dir() / REGISTRY_FILE
    except RuntimeError:  # no home: no registry
        return []
    return [url for url in _read(path).get(private_fingerprint, []) if _still_there(url)]


def other_ledgers(fingerprints: Iterable[str | None], ledger: str) -> list[str]:
    """The ledgers still there entered under any of ``fingerprints`` (one body of private
    data's: its own, and the one older versions knew it by; None ignored) but ``ledger`` (a
    canonical URL), in the order they were entered, each once; reads only."""
    return list(dict.fromkeys(other for key in fingerprints if key is not None
                              for other in ledgers_of(key) if other != ledger))


def enter_ledger(private_fingerprint: str, ledger: str) -> tuple[list[str], bool]:
    """Enter ``ledger`` (a canonical URL: ``ledger_store.canonical_url``) under the private
    data's fingerprint. Returns the other ledgers entered under it that are still there, in
    the order they were entered (those gone are dropped), and whether ``ledger`` is new to
    the registry. A registry that cannot be written (a read-only home, no home at all)
    answers from what it holds, if anything, and never fails the caller: it only warns."""
    try:
        folder = state_dir()
    except RuntimeError:  # no HOME and no passwd entry: nowhere to keep it
        return [], False
    path = folder / REGISTRY_FILE
    try:
        ensure_dir(folder, private=True)
        with _locked(folder):
            entries = _read(path)
            entered = entries.get(private_fingerprint, [])
            known = [url for url in entered if _still_there(url)]
            new = ledger not in known
            if new or known != entered:  # written only when it changes
                entries[private_fingerprint] = known + ([ledger] if new else [])
                write_json_atomic(path, {"version": _VERSION, "data": entries}, private=True)
    except OSError:
        known, new = ledgers_of(private_fingerprint), False
    return [url for url in known if url != ledger], new


def ledgers_said(urls: list[str], shown: int = 3) -> str:
    """``urls`` as a warning says them: the first ``shown``, then how many more (``pate
    status --run`` lists a run's)."""
    more = len(urls) - shown
    return ", ".join(urls[:shown]) + (f", and {more} more" if more > 0 else "")
