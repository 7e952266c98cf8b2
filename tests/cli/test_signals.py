"""Signals a command meets in a shell: a reader of standard output that leaves early (`pate ...
| head -1`) ends it quietly with exit status 141, and SIGTERM ends it as Ctrl-C does, cleanly
(`pate: terminated`, 143, the stage marked stopped and resumable), Ray's own handler kept out."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pate.cli.main import main
from pate.config import dump_config, load_config


def test_a_closed_pipe_ends_the_command_quietly() -> None:
    cmd = [sys.executable, "-m", "pate", "epsilon", "dpsgd", "--noise-multiplier", "1.1",
           "--sampling-rate", "0.01", "--steps", "1000", "--delta", "1e-5"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # gone long before the command (seconds of imports) prints
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == 141, err
    assert "Traceback" not in err and "BrokenPipeError" not in err and "Exception" not in err


def test_ctrl_c_while_the_command_loads_is_one_line(monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture) -> None:
    """Ctrl-C in the second or more a command spends importing its modules (building its
    parser): ``pate: interrupted`` and 130, as later, not a traceback of the import it
    stopped."""
    def interrupted(argv: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr("pate.cli.main.build_parser", interrupted)
    assert main(["run", "digits-tiny"]) == 130
    assert capsys.readouterr().err == "pate: interrupted\n"


def test_a_broken_pipe_that_is_not_stdout_stays_an_error(monkeypatch, tmp_path: Path) -> None:
    """A socket or a child process whose reader left is a real failure: not turned into a
    quiet 141 (and stdout is left alone)."""
    def broken(run: object) -> None:
        raise BrokenPipeError("the other end of a socket")

    monkeypatch.setattr("pate.cli.status.run_status", broken)
    with pytest.raises(BrokenPipeError, match="socket"):
        main(["status", "--run", str(tmp_path)])


def test_an_unexpected_error_is_one_line_without_its_message(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """An exception the project did not raise on purpose may carry private values in its
    message (numpy's shapes of private arrays, a user's network printing a row): one line naming
    its class and place, exit 70; PATE_TRACEBACK lets it through for debugging."""
    def faulty(run: object) -> None:
        raise ValueError("operands could not be broadcast together with shapes (2000,19)")

    monkeypatch.setattr("pate.cli.status.run_status", faulty)
    monkeypatch.setenv("PATE_TRACEBACK", "0")  # meant as off: hidden, as when it is not set
    assert main(["status", "--run", str(tmp_path)]) == 70
    err = capsys.readouterr().err
    assert re.fullmatch(r"pate: internal error: ValueError at test_signals\.py:\d+, under "
                        r"status\.py:\d+; its "
                        r"message is not shown, as it may hold private values "
                        r"\(PATE_TRACEBACK=1 shows the traceback, for data you may see\)\n",
                        err), err
    monkeypatch.setenv("PATE_TRACEBACK", "1")
    with pytest.raises(ValueError, match="2000"):
        main(["status", "--run", str(tmp_path)])

    def in_numpy(run: object) -> None:  # the project's line that called numpy is named too
        from pate.api_checks import warn_if_private_rows
        from pate.data.row_identity import row_keys

        warn_if_private_rows(np.zeros((2, 19), np.float32),
                             row_keys(np.zeros((2, 20), np.float32)))

    monkeypatch.setattr("pate.cli.status.run_status", in_numpy)
    monkeypatch.delenv("PATE_TRACEBACK")
    assert main(["status", "--run", str(tmp_path)]) == 70
    assert re.search(r"at \w+\.py:\d+, under api_checks\.py:\d+;", capsys.readouterr().err)


@pytest.mark.parametrize("workers", [1, 2])  # in this process; on a local Ray
def test_sigterm_while_teachers_train_stops_cleanly(tmp_path: Path, workers: int,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "slow.toml"
    text = dump_config(load_config("digits-tiny"))
    text = re.sub(r"(\[teachers\][^\[]*?)epochs = \d+", r"\1epochs = 2000", text, flags=re.S)
    assert text.count("workers = 1") == 1
    config.write_text(text.replace("workers = 1", f"workers = {workers}"))
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pate", "run", str(config), "--run", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    manifest = run / "teachers" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.is_file() and time.monotonic() < deadline:  # once training starts
        time.sleep(0.2)
    assert manifest.is_file()
    time.sleep(1)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == "pate: terminated"
    assert "SIGTERM received" not in err and "Traceback" not in err
    capsys.readouterr()
    assert main(["status", "--run", str(run)]) == 0  # in this process: no second start-up
    status = capsys.readouterr().out
    assert re.search(r"teachers\s+stopped", status), status
    assert (run / "log.txt").read_text().splitlines()[-1].endswith("teachers: interrupted")


def test_ctrl_c_twice_while_ray_shuts_down_is_no_traceback(tmp_path: Path) -> None:
    """A second Ctrl-C while the first one's clean-up shuts a local Ray down (Ray's own exit
    handler, seconds) is said to be waited on, not raised into it: no traceback of Ray's.
    The local Ray is a private one: ``RAY_ADDRESS`` (as inside ``ray job submit``) names a
    closed port, which a Ray joining it would wait on instead of training."""
    config = tmp_path / "slow.toml"
    text = dump_config(load_config("digits-tiny"))
    text = re.sub(r"(\[teachers\][^\[]*?)epochs = \d+", r"\1epochs = 2000", text, flags=re.S)
    config.write_text(text.replace("workers = 1", "workers = 2"))
    run = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "pate", "run", str(config), "--run", str(run)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "RAY_ADDRESS": "127.0.0.1:1"})
    manifest = run / "teachers" / "manifest.json"
    deadline = time.monotonic() + 120
    while not manifest.is_file() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert manifest.is_file()  # written once Ray has started (a Ray joined would not)
    time.sleep(1)
    proc.send_signal(signal.SIGINT)
    time.sleep(1)  # in the clean-up (Ray's shutdown takes seconds on 2 cores)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode in (130, -signal.SIGINT), err  # the latter: as the interpreter ended
    assert "Traceback" not in err and "Exception ignored" not in err, err
    said = [line for line in err.splitlines() if line.startswith("pate: ")]
    assert said[-1] in ("pate: interrupted",
                        "pate: stopping cleanly, a few seconds; Ctrl-C again leaves at once"), err
