"""scripts/split_csv.py: one table cut at random into the three files of a config's [data],
every row in one part, each part whole and readable by its owner only."""

from __future__ import annotations

import csv
import stat
from pathlib import Path

from split_csv import main


def test_parts_cover_the_rows_once_and_are_private(tmp_path: Path, capsys) -> None:
    table = tmp_path / "people.csv"
    table.write_text("id, age ,label\n" + "".join(f"{i}, {20 + i},{i % 2}\n" for i in range(50))
                     + "\n")
    assert main([str(table), "--out", str(tmp_path / "parts"), "--seed", "3"]) == 0
    parts = {name: list(csv.reader((tmp_path / "parts" / f"{name}.csv").open()))
             for name in ("private", "public", "test")}
    assert all(rows[0] == ["id", "age", "label"] for rows in parts.values())
    assert [len(rows) - 1 for rows in parts.values()] == [42, 4, 4]  # 0.83, 0.09, 0.08 of 50
    ids = sorted(int(row[0]) for rows in parts.values() for row in rows[1:])
    assert ids == list(range(50))
    for name in parts:
        mode = stat.S_IMODE((tmp_path / "parts" / f"{name}.csv").stat().st_mode)
        assert mode == 0o600, name
    assert not [p for p in (tmp_path / "parts").iterdir() if p.suffix != ".csv"]  # no temporary
    assert "private.csv: 42 rows" in capsys.readouterr().out
    (tmp_path / "ragged.csv").write_text("a,b\n1\n")
    assert main([str(tmp_path / "ragged.csv"), "--out", str(tmp_path / "none")]) == 2
    assert not (tmp_path / "none").exists()
