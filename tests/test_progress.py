"""``pate.progress``: plain lines where stderr is not a terminal, at most one per ``every``
seconds and always the last, nothing when quiet."""

import pytest

from pate.progress import by_epoch, progress_bar, quiet, set_quiet


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


def test_work_stopped_short_says_where(capsys: pytest.CaptureFixture) -> None:
    """A round stopped at the budget (or interrupted) between two lines says, at its end,
    how far it went; one that stopped on a line said says nothing more."""
    with pytest.raises(KeyboardInterrupt), progress_bar("queries", 50, "query",
                                                        every=3600.0) as bar:
        for _ in range(3):
            bar.update(1)
        raise KeyboardInterrupt
    with progress_bar("queries", 50, "query") as bar:
        bar.update(2)
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(",")[0] for line in lines] == [
        "queries: query 1/50", "queries: query 3/50", "queries: query 2/50"]


def test_steps_by_epoch_say_no_count(capsys: pytest.CaptureFixture) -> None:
    """DP-SGD's steps are the private rows over the batch: its progress moves by epochs, the
    same lines whatever the number of steps."""
    said = []
    for steps in (3, 29):  # per epoch
        with progress_bar("DP-SGD", 4, "epoch") as bar:
            update = by_epoch(bar, 4)
            for step in range(1, 4 * steps + 1):
                update(step, 4 * steps)
        said.append([line.split(",")[0] for line in capsys.readouterr().err.splitlines()])
    assert said[0] == said[1] == [f"DP-SGD: epoch {k}/4" for k in range(1, 5)]


def test_quiet_silences(capsys: pytest.CaptureFixture) -> None:
    set_quiet(True)
    try:
        assert quiet()
        with progress_bar("x", 2, "step") as bar:
            bar.update(2)
    finally:
        set_quiet(False)
    assert not quiet() and capsys.readouterr().err == ""
