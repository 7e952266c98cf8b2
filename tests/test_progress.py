"""``pate.progress``: plain lines where stderr is not a terminal, at most one per ``every``
seconds and always the last, nothing when quiet."""

import pytest

from pate.progress import in_percent, progress_bar, quiet, set_quiet


def test_plain_lines_off_a_terminal(capsys: pytest.CaptureFixture) -> None:
    with progress_bar("student vat", 3, "epoch") as bar:
        for _ in range(3):
            bar.update(1)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "student vat: epoch 1/3", "student vat: epoch 2/3", "student vat: epoch 3/3"]


def test_throttled_lines_keep_the_last(capsys: pytest.CaptureFixture) -> None:
    with progress_bar("DP-SGD", None, "step", every=3600.0) as bar:
        for _ in range(50):
            bar.update(1, total=50)
        bar.update(0)  # nothing more: the last line is not said again
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == ["DP-SGD: step 1/50", "DP-SGD: step 50/50"]


def test_steps_in_percent_say_no_count(capsys: pytest.CaptureFixture) -> None:
    """DP-SGD's steps are the private rows over the batch: its progress moves in percents."""
    with progress_bar("DP-SGD", 100, "percent") as bar:
        update = in_percent(bar)
        for step in range(1, 1161):
            update(step, 1160)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 100 and "1160" not in "".join(lines)
    assert [line.split(",")[0] for line in lines[:2] + lines[-1:]] == [
        "DP-SGD: percent 1/100", "DP-SGD: percent 2/100", "DP-SGD: percent 100/100"]


def test_quiet_silences(capsys: pytest.CaptureFixture) -> None:
    set_quiet(True)
    try:
        assert quiet()
        with progress_bar("x", 2, "step") as bar:
            bar.update(2)
    finally:
        set_quiet(False)
    assert not quiet() and capsys.readouterr().err == ""
