"""scripts/reproduce_glyphs.py end to end at toy size: real teacher runs (Ray), real student runs
(the CLI over the votes, each row with its own ledger), the non-private baseline, the report."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_reproduction_writes_figure4_and_table1(tmp_path: Path) -> None:
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
    assert [e["teachers"] for e in result["ensembles"]] == [2, 4]
    for ensemble in result["ensembles"]:
        assert ensemble["examples_per_teacher"] == 1200 // ensemble["teachers"]
        assert len(ensemble["shard_seconds"]) == ensemble["teachers"]  # shards of one teacher
        for curve in (ensemble["gnmax"], ensemble["lnmax"]):
            # more noise, less privacy spent (the data-dependent bound need not be monotone)
            bound = [p["epsilon_data_independent"] for p in curve]
            assert bound == sorted(bound, reverse=True) and len(set(bound)) == len(bound)
            assert all(p["epsilon"] <= p["epsilon_data_independent"] + 1e-9 for p in curve)
            assert all(0.0 <= p["label_accuracy"] <= 1.0 for p in curve)
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
        assert 0.0 <= row["student_accuracy"] <= 1.0
    assert rows["non-private baseline"]["train_rows"] == 600
    assert rows["non-private baseline"]["test_rows"] == 400
    for name in ("figure4_left.png", "figure4_right.png"):
        assert (out / "figures" / name).read_bytes().startswith(b"\x89PNG")
    page = (out / "reproduction.html").read_text()
    assert "Interactive-GNMax, two rounds" in page and "data:image/png;base64," in page
