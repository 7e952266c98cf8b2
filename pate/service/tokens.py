"""Bearer tokens of the aggregation service: a token file holds one per line ('#' comments
allowed); it is a secret (mode 0600): a file other users may read is refused unless allowed."""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from pathlib import Path

from pate.errors import UserError

log = logging.getLogger("pate.service.tokens")


def parse_tokens(text: str) -> list[str]:
    """The tokens of a token file's text: one per line, blank lines and '#' comments skipped."""
    return [t for line in text.splitlines() if (t := line.strip()) and not t.startswith("#")]


def shared_problem(path: Path) -> str | None:
    """Why a token file may not be used, as one that other users may read or write, or None."""
    if path.stat().st_mode & 0o077:
        return f"{path} is open to other users: chmod 600 it (a token is a secret)"
    return None


def token_hash(token: str) -> str:
    """The sha256 of a token, hex: all the service keeps of it."""
    return hashlib.sha256(token.encode()).hexdigest()


class TokenStore:
    """Bearer tokens from a file, kept only as sha256 hashes. The file is re-read when it
    changes, so deleting a line revokes that token; if the file cannot be read, no token is
    accepted (fail closed). A file that others may read or write is refused (``UserError``)
    unless ``allow_world_readable``."""

    def __init__(self, path: str | Path, allow_world_readable: bool = False) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, ...] | None = None
        self._hashes: frozenset[str] = frozenset()
        self._loaded = False  # read once: a file unreadable after that refuses, not raises
        self._reload()
        if not self._hashes:
            raise UserError(f"{self.path}: no tokens (one per line)")
        if (problem := shared_problem(self.path)) and not allow_world_readable:
            raise UserError(f"{problem}; or pass --allow-shared-token-file")

    def _reload(self) -> None:
        try:
            st = os.stat(self.path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
            if stamp == self._stamp:
                return
            tokens = parse_tokens(self.path.read_text())
        except (OSError, UnicodeDecodeError) as exc:
            if not self._loaded:
                raise UserError(f"{self.path}: cannot read the token file "
                                f"({exc.__class__.__name__})") from None
            if self._stamp is not None:  # said once, as it turns unreadable
                log.warning("token file unreadable (%s): refusing every token",
                            type(exc).__name__)
            self._stamp, self._hashes = None, frozenset()
            return
        if self._loaded and not tokens:  # emptied while serving: said, as unread
            log.warning("token file holds no token: refusing every token")
        self._hashes = frozenset(token_hash(t) for t in tokens)
        self._stamp, self._loaded = stamp, True

    def client(self, token: str) -> str | None:
        """The client id (a prefix of the token's hash) of a valid token, else None."""
        with self._lock:
            self._reload()
            h = token_hash(token)
            return h[:16] if h in self._hashes else None
