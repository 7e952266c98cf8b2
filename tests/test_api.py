"""The Python API (``pate.api``): the README's example runs as written, and the pieces keep
their contracts (the ledger is charged before labels are returned, the student reloads)."""

from __future__ import annotations

import re
import runpy
from pathlib import Path

import numpy as np
import pytest

from analysis.mechanisms import GNMax
from pate.api import PrivateLabels, Student, load_student
from pate.errors import UserError

README = Path(__file__).resolve().parents[1] / "README.md"


def readme_example() -> str:
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert len(blocks) == 1, "the README has one Python example"
    return blocks[0]


def test_the_readme_example_runs(tmp_path: Path, capsys: pytest.CaptureFixture,
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "example.py"
    script.write_text(readme_example())
    monkeypatch.chdir(tmp_path)
    scope = runpy.run_path(str(script))
    accuracy = float(capsys.readouterr().out.split()[0])
    assert accuracy > 0.6  # 0.70-0.84 over repeated runs (noisy labels); chance is 0.1
    eps = scope["labels"].epsilon()
    assert eps.smooth_sensitivity > 0 and eps.data_independent > 0
    assert eps.ledger_spent == pytest.approx(scope["labels"].ledger.budget().epsilon_spent)
    student = scope["student"]
    student.save(tmp_path / "saved")
    again = load_student(tmp_path / "saved")
    np.testing.assert_array_equal(again.predict(scope["x_test"]),
                                  student.predict(scope["x_test"]))


def test_labels_stop_at_the_budget_and_the_ledger_persists(tmp_path: Path) -> None:
    rng = np.random.default_rng(0)
    votes = rng.multinomial(50, [0.8, 0.1, 0.1], size=300)
    ledger = tmp_path / "ledger.db"
    labels = PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                           ledger=ledger)
    got = labels.ask(np.arange(300), request_size=64)
    assert 0 < len(got) < 300 and labels.epsilon().ledger_spent <= 2.0
    labels.close()
    again = PrivateLabels(votes, GNMax(sigma=10.0), epsilon_budget=2.0, delta=1e-5,
                          ledger=ledger)
    assert again.ledger.budget().epsilon_spent == pytest.approx(labels.epsilon().ledger_spent)
    assert len(again.ask(np.arange(300, 300))) == 0
    again.close()


def test_load_student_says_what_is_missing(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="no saved student"):
        load_student(tmp_path)
    with pytest.raises(UserError, match="fit the student first"):
        Student().save(tmp_path)
