"""A reader of standard output that leaves early (`pate ... | head -1`): the command stops
quietly, exit status 141, no traceback."""

from __future__ import annotations

import subprocess
import sys


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    cmd = [sys.executable, "-m", "pate", "epsilon", "dpsgd", "--noise-multiplier", "1.1",
           "--sampling-rate", "0.01", "--steps", "1000", "--delta", "1e-5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # gone long before the command (seconds of imports) prints
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception" not in err
