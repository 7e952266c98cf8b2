"""Helpers of the service tests: synthetic votes, token files and a real ``pate serve`` process
on a free loopback port."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

TOKENS = ("token-alpha-0123456789", "token-beta-9876543210")


def write_tokens(path: Path, tokens: tuple[str, ...] = TOKENS) -> Path:
    path.write_text("# test tokens\n" + "\n".join(tokens) + "\n")
    path.chmod(0o600)
    return path


class Server:
    """A ``pate serve`` subprocess; ``url`` once it answers /healthz."""

    def __init__(self, args: list[str], cwd: Path) -> None:
        self.args = args
        self.cwd = cwd
        self.proc: subprocess.Popen[str] | None = None
        self.url = ""
        self.banner = ""

    def start(self, timeout: float = 60.0) -> Server:
        cmd = [sys.executable, "-m", "pate", "serve", *self.args, "--port", "0"]
        self.proc = subprocess.Popen(cmd, cwd=self.cwd, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        deadline = time.monotonic() + timeout
        lines = []
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                raise RuntimeError("pate serve exited:\n" + "".join(lines))
            lines.append(line)
            m = re.search(r"listening on (http://[\d.]+:\d+)", line)
            if m:
                self.url = m.group(1)
                break
        else:
            raise RuntimeError("pate serve did not start:\n" + "".join(lines))
        for _ in range(3):  # the rest of the banner
            lines.append(self.proc.stdout.readline())
        self.banner = "".join(lines)
        while time.monotonic() < deadline:
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(self.url + "/healthz", timeout=2).status_code == 200:
                    return self
            time.sleep(0.05)
        raise RuntimeError("pate serve does not answer /healthz")

    def kill9(self) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> str:
        """SIGTERM, wait, and return what the server printed after its banner."""
        if self.proc is None or self.proc.poll() is not None:
            return ""
        self.proc.terminate()
        try:
            out, _ = self.proc.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


@contextlib.contextmanager
def serving(args: list[str], cwd: Path) -> Iterator[Server]:
    server = Server(args, cwd).start()
    try:
        yield server
    finally:
        server.stop()


def auth(token: str = TOKENS[0]) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}
