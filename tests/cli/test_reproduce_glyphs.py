"""scripts/reproduce_glyphs.py: its trade-off curves, Confident-GNMax figures and plots on votes
whose answers are known (fast), and end to end at toy size (slow: real teacher runs on Ray, real
student runs through the CLI, each row with its own ledger, the non-private baseline, the
report; about a minute, `pytest -m slow`)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest

from analysis.mechanisms import ConfidentGNMax
from pate.data.datasets import load_dataset, public_split
from pate.report.figures import figure_png

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def reproduce() -> ModuleType:
    spec = importlib.util.spec_from_file_location("reproduce_glyphs",
                                                  ROOT / "scripts" / "reproduce_glyphs.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def known_votes() -> tuple[np.ndarray, np.ndarray]:
    """200 queries, 10 classes, 50 teachers: rows 0..139 give the true class 40 votes (and
    another 10), rows 140..199 give a wrong class 25, the true one 15 and another 10. Plurality
    accuracy is 0.7, every margin at least 10 votes."""
    rng = np.random.default_rng(7)
    truth = rng.integers(0, 10, 200)
    wrong, other = (truth + 1) % 10, (truth + 2) % 10
    votes = np.zeros((200, 10), dtype=np.int64)
    rows = np.arange(200)
    right = rows < 140
    votes[rows[right], truth[right]] = 40
    votes[rows[~right], wrong[~right]] = 25
    votes[rows[~right], truth[~right]] = 15
    votes[rows, other] = 10
    return votes, truth


def test_trade_off_curves_and_least_epsilon(reproduce: ModuleType) -> None:
    votes, truth = known_votes()
    rng = np.random.default_rng(0)
    for mechanism in ("gnmax", "lnmax"):
        curve = reproduce.trade_off(votes, truth, mechanism, np.array([0.1, 3.0, 1e4]), 1e-5, rng)
        assert [p["scale"] for p in curve] == [0.1, 3.0, 1e4]
        # noise far below the 10-vote margins: the plurality, exactly; far above: chance
        assert curve[0]["label_accuracy"] == 0.7
        assert abs(curve[2]["label_accuracy"] - 0.1) < 0.05
        bound = [p["epsilon_data_independent"] for p in curve]
        assert bound[0] > bound[1] > bound[2]
        assert all(p["epsilon"] <= p["epsilon_data_independent"] + 1e-9 for p in curve)
        reaching = [p["epsilon"] for p in curve if p["label_accuracy"] >= 0.7]
        assert reproduce.least_epsilon(curve, 0.7) == min(reaching)
        assert reproduce.least_epsilon(curve, 0.71) is None


def test_confident_answers_only_the_confident_rows(reproduce: ModuleType) -> None:
    votes, truth = known_votes()
    params = ConfidentGNMax(threshold=30, sigma1=0.5, sigma2=0.1)
    # the 140 rows with 40 votes pass T = 30, the 60 with 25 do not; answered rows are right
    assert reproduce.confident_accuracy(votes, truth, params,
                                        np.random.default_rng(0)) == (140.0, 1.0)


def test_trade_off_figure_has_one_line_per_series(reproduce: ModuleType) -> None:
    votes, truth = known_votes()
    rng = np.random.default_rng(0)
    series = {name: reproduce.trade_off(votes, truth, name, np.array([1.0, 10.0]), 1e-5, rng)
              for name in ("gnmax", "lnmax")}
    figure = reproduce.plot_trade_off(series, "title", 200, 1e-5)
    lines = figure.axes[0].lines
    assert [line.get_label() for line in lines] == ["gnmax", "lnmax"]
    assert list(lines[1].get_xdata()) == [p["epsilon"] for p in series["lnmax"]]
    assert figure_png(figure).startswith(b"\x89PNG")


@pytest.mark.slow
def test_reproduction_writes_figure4_and_table1(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    out = tmp_path / "glyphs"
    argv = ["--teachers", "2", "4", "--student-teachers", "4", "--train-size", "1200",
            "--test-size", "400", "--queries", "150", "--epochs", "1", "--student-epochs", "1",
            "--lnmax", "40", "0.5", "--confident", "80", "0.5", "0.3", "0.1",
            "--interactive", "40", "40", "0.5", "0.3", "0.1",
            "--baseline-size", "600", "--baseline-epochs", "1", "--target-accuracy", "0.6",
            "--out", str(out)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "reproduce_glyphs.py"), *argv],
                   check=True, env=env, cwd=tmp_path, capture_output=True)

    result = json.loads((out / "reproduction.json").read_text())
    monkeypatch.setenv("PATE_GLYPHS_SIZE", "1200,400")
    (_, pool_y), _ = public_split(load_dataset("glyphs", need_train=False))
    assert [e["teachers"] for e in result["ensembles"]] == [2, 4]
    for ensemble in result["ensembles"]:
        assert ensemble["examples_per_teacher"] == 1200 // ensemble["teachers"]
        assert len(ensemble["shard_seconds"]) == ensemble["teachers"]  # shards of one teacher
        for curve in (ensemble["gnmax"], ensemble["lnmax"]):
            # more noise, less privacy spent (the data-dependent bound need not be monotone)
            bound = [p["epsilon_data_independent"] for p in curve]
            assert bound == sorted(bound, reverse=True) and len(set(bound)) == len(bound)
            assert all(p["epsilon"] <= p["epsilon_data_independent"] + 1e-9 for p in curve)
        # GNMax's least noise (sigma 0.02 n) only breaks ties: its label accuracy lies between
        # the share of rows whose unique plurality is right and of rows whose tied top has it
        with np.load(out / f"teachers-{ensemble['teachers']}" / "votes.npz") as f:
            order = np.argsort(f["pool_index"])
            votes = f["votes"][order][:150]
            truth = pool_y[np.sort(f["pool_index"])][:150]
        top = votes == votes.max(axis=1, keepdims=True)
        has_truth = top[np.arange(150), truth]
        unique_right = float(np.mean(has_truth & (top.sum(axis=1) == 1)))
        assert unique_right <= ensemble["gnmax"][0]["label_accuracy"] <= float(np.mean(has_truth))
        assert ensemble["plurality_accuracy"] == float(np.mean(votes.argmax(1) == truth))
        assert ensemble["confident"]["queries"] == 150
        assert ensemble["least_epsilon"]["label_accuracy"] == 0.6
        for mechanism in ("gnmax", "lnmax"):
            least = ensemble["least_epsilon"][mechanism]
            reaching = [p["epsilon"] for p in ensemble[mechanism] if p["label_accuracy"] >= 0.6]
            assert least == (min(reaching) if reaching else None)

    rows = {r["row"]: r for r in result["table1"]}
    assert set(rows) == {"LNMax", "Confident-GNMax", "Interactive-GNMax, two rounds",
                         "non-private baseline"}
    lnmax = rows["LNMax"]
    assert lnmax["queries"] == lnmax["answered"] == 40  # LNMax answers every query
    assert lnmax["epsilon_smooth_sensitivity"] is None  # no smooth-sensitivity analysis
    assert rows["Confident-GNMax"]["queries"] == 80
    two = rows["Interactive-GNMax, two rounds"]
    assert [r["mechanism"]["mechanism"] for r in two["rounds"]] == ["confident", "interactive"]
    assert two["queries"] == 80
    for name in ("LNMax", "Confident-GNMax", "Interactive-GNMax, two rounds"):
        row = rows[name]
        assert 0 < row["epsilon_data_dependent"] <= row["epsilon_data_independent"] + 1e-9
        run = out / f"student-{name.split(',')[0].lower()}"
        metrics = json.loads((run / "student" / "metrics.json").read_text())
        assert (row["student_accuracy"], row["label_accuracy"]) == (metrics["accuracy"],
                                                                    metrics["label_accuracy"])
        assert row["epsilon_sanitised_released"] == (
            metrics["epsilon"]["data_dependent_sanitised"])
    assert rows["non-private baseline"]["train_rows"] == 600
    assert rows["non-private baseline"]["test_rows"] == 400
    for name in ("figure4_left.png", "figure4_right.png"):
        assert (out / "figures" / name).read_bytes().startswith(b"\x89PNG")
    page = (out / "reproduction.html").read_text()
    assert "Interactive-GNMax, two rounds" in page and "data:image/png;base64," in page
