"""Progress of long work on stderr: a bar with rate and ETA (tqdm) on a terminal, one plain line
per step elsewhere (a log file, CI, nohup), nothing when quiet (``pate --quiet`` or
``PATE_QUIET=1``). Progress lines carry counts and times only, never a private figure."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import Protocol

_QUIET_ENV = "PATE_QUIET"


def set_quiet(quiet: bool) -> None:
    """Silence (or restore) every progress bar and line of this process and its children."""
    if quiet:
        os.environ[_QUIET_ENV] = "1"
    else:
        os.environ.pop(_QUIET_ENV, None)


def quiet() -> bool:
    """Whether progress is silenced."""
    return os.environ.get(_QUIET_ENV, "") not in ("", "0")


def say(text: str) -> None:
    """One line of news on stderr, unless quiet."""
    if not quiet():
        print(text, file=sys.stderr, flush=True)


class Progress(Protocol):
    def update(self, n: int = 1, total: int | None = None) -> None:
        """``n`` more steps are done (of ``total``, when it becomes known)."""
        ...


class _Lines:
    """Plain lines, ``desc: unit 3/10, 12.3 s``: one per update, or at most one per ``every``
    seconds (and the last); ``close`` says where the work stopped, if no line has."""

    def __init__(self, desc: str, total: int | None, unit: str, every: float) -> None:
        self.desc, self.total, self.unit, self.every = desc, total, unit, every
        self.done, self.start, self.shown = 0, time.monotonic(), -float("inf")
        self.said = 0  # the steps done at the last line

    def update(self, n: int = 1, total: int | None = None) -> None:
        self.done += n
        self.total = total or self.total
        now = time.monotonic()
        last = self.done == self.total
        if (now - self.shown < self.every and not last) or (last and self.shown == float("inf")):
            return
        self.shown = float("inf") if last else now  # the last line is said once
        self._say(now)

    def close(self) -> None:
        """The line of the steps done, where the last one said fewer (work stopped short of
        its total, as a round at the budget does, or between two lines)."""
        if self.done != self.said:
            self._say(time.monotonic())

    def _say(self, now: float) -> None:
        self.said = self.done
        of = "" if self.total is None else f"/{self.total}"
        say(f"{self.desc}: {self.unit} {self.done}{of}, {now - self.start:.1f} s")


class _Bar:
    """A tqdm bar on stderr."""

    def __init__(self, desc: str, total: int | None, unit: str) -> None:
        from tqdm import tqdm

        self.bar = tqdm(total=total, desc=desc, unit=unit, file=sys.stderr)

    def update(self, n: int = 1, total: int | None = None) -> None:
        if total is not None and self.bar.total != total:
            self.bar.total = total
        self.bar.update(n)


class _Silent:
    def update(self, n: int = 1, total: int | None = None) -> None:
        pass


def by_epoch(bar: Progress, epochs: int) -> Callable[[int, int], None]:
    """``progress(done, total)`` of ``total`` steps in ``epochs`` equal epochs, moving ``bar``
    (of ``epochs``) once per epoch done: for work whose steps per epoch are private where the
    number of private rows is (DP-SGD's are the rows over the expected batch). Any finer
    fraction would tell them (the first of 100 percents is 1/steps)."""
    shown = [0]

    def update(done: int, total: int) -> None:
        epoch = done * epochs // total
        if epoch > shown[0]:
            bar.update(epoch - shown[0], epochs)
            shown[0] = epoch

    return update


@contextlib.contextmanager
def progress_bar(desc: str, total: int | None, unit: str, every: float = 0.0,
                 silent: bool = False) -> Iterator[Progress]:
    """Progress of ``total`` steps: a tqdm bar with rate and ETA on a terminal, plain lines
    otherwise (one per step, or at most one per ``every`` seconds), nothing when quiet (or
    ``silent``)."""
    if silent or quiet():
        yield _Silent()
        return
    if not sys.stderr.isatty():
        lines = _Lines(desc, total, unit, every)
        try:
            yield lines
        finally:
            lines.close()
        return
    bar = _Bar(desc, total, unit)
    try:
        yield bar
    finally:
        bar.bar.close()
