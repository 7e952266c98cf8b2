"""Teachers dealt their rows by key (``teachers.partition``): every row of one person (a CSV's
key column) reaches one teacher, adding or removing a person changes that teacher only, and the
key is never a feature; a key goes with this partition and only with it, refused at the edge."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pate.cli.main import main
from pate.config import parse_config
from pate.data.task import DataFiles, load_task, unused_setting_problem
from pate.errors import UserError
from teachers.partition import deal_rows, verify_partition


def _people(n: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``n`` rows of 3 features and a label, each row one of about n / 4 people's."""
    x = gen.normal(size=(n, 3)).astype(np.float32)
    return x, (x[:, 0] > 0).astype(np.int64), gen.integers(0, n // 4, n).astype(str)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**40), teachers=st.integers(1, 10))
def test_a_person_reaches_one_teacher_and_removing_them_changes_it_alone(seed, teachers):
    gen = np.random.default_rng(seed % 991)
    x, y, keys = _people(400, gen)
    part = deal_rows("key", x, y, teachers, seed, keys)
    for person in np.unique(keys):  # a loop per person in a test only
        assert len(np.unique(part.assignment[keys == person])) == 1
    gone = keys[0]
    kept = keys != gone
    after = deal_rows("key", x[kept], y[kept], teachers, seed, keys[kept])
    owner = part.assignment[0]
    np.testing.assert_array_equal(after.assignment, part.assignment[kept])  # nobody else moved
    others = np.arange(teachers) != owner
    np.testing.assert_array_equal(after.sizes[others], part.sizes[others])
    np.testing.assert_array_equal(after.step_rows()[others], part.step_rows()[others])


def test_keys_are_needed_and_a_person_is_one_teacher_whatever_their_rows():
    gen = np.random.default_rng(0)
    x, y, _ = _people(200, gen)
    with pytest.raises(UserError, match="needs whose each row is"):
        deal_rows("key", x, y, 4, 0)
    with pytest.raises(UserError, match="dealt by key, some of the 4 teachers get no rows"):
        deal_rows("key", x, y, 4, 0, np.full(200, "same"))  # one person: one teacher


def _csv(path: Path, x: np.ndarray, y: np.ndarray, keys: np.ndarray | None) -> None:
    head = "a,b,c,y" + ("" if keys is None else ",id")
    rows = [",".join([*map(str, r), str(label)] + ([] if keys is None else [k]))
            for r, label, k in zip(x.round(4), y, keys if keys is not None else y, strict=True)]
    path.write_text("\n".join([head, *rows]) + "\n")


@pytest.fixture
def people_files(tmp_path: Path) -> DataFiles:
    gen = np.random.default_rng(1)
    x, y, keys = _people(240, gen)
    _csv(tmp_path / "private.csv", x, y, keys)
    _csv(tmp_path / "public.csv", *_people(80, gen)[:2], None)
    _csv(tmp_path / "test.csv", *_people(60, gen)[:2], None)
    return DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                     str(tmp_path / "test.csv"), "y", ("0", "1"), key="id")


def test_the_key_column_is_read_from_the_private_file_and_is_no_feature(people_files):
    task = load_task(people_files)
    assert task.private_keys is not None and len(task.private_keys) == 240
    assert task.private_x.shape[1] == task.pool_x.shape[1] == 3  # a, b, c: not the id
    assert "id" not in json.dumps([task.preprocessing["numeric"],
                                   task.preprocessing["categorical"]])
    assert task.preprocessing["key"] == "id"  # left out of a file to score, too
    bad = Path(people_files.private)
    bad.write_text(bad.read_text().replace(",7\n", ",\n"))  # a row that says nobody's
    with pytest.raises(UserError, match="the key column 'id' has missing values"):
        load_task(people_files)
    with pytest.raises(UserError, match="is the label column"):
        DataFiles("p.csv", "q.csv", label="y", key="y")
    assert "for CSV files, not .npz files" in unused_setting_problem(
        DataFiles("p.npz", "q.npz", key="id"))


def test_pate_teachers_train_deals_by_key(people_files, tmp_path: Path, capsys) -> None:
    run = tmp_path / "run"
    flags = ["teachers", "train", "--run", str(run), "--private", people_files.private,
             "--public", people_files.public, "--test", people_files.test, "--label", "y",
             "--classes", "0", "1", "--teachers", "3", "--epochs", "1", "--workers", "1"]
    assert main([*flags, "--key", "id"]) == 2  # a key, dealt by position
    assert "a key column (data.key, --key) is for dealing the rows by key" in (
        capsys.readouterr().err)
    assert main([*flags, "--partition", "key"]) == 2 and not run.exists()
    assert "dealing the rows by key needs the column" in capsys.readouterr().err
    assert main([*flags, "--partition", "key", "--key", "id", "--quiet"]) == 0
    recorded = json.loads((run / "partition.json").read_text())
    task = load_task(people_files)
    verify_partition(recorded, deal_rows("key", task.private_x, task.private_y, 3, 0,
                                         task.private_keys), recorded["dataset"])
    assert recorded["by"] == "key"
    # a student of these teachers scores rows in the private file's layout: the key left out
    student = ["student", "train", "--run", str(run), "--private", people_files.private,
               "--public", people_files.public, "--test", people_files.test, "--label", "y",
               "--classes", "0", "1", "--key", "id", "--method", "supervised",
               "--mechanism", "gnmax", "--sigma", "1", "--budget-epsilon", "1000",
               "--delta", "1e-5", "--queries", "20", "--epochs", "1", "--quiet"]
    assert main(["teachers", "votes", "--run", str(run), "--quiet"]) == 0
    assert main(student) == 0
    capsys.readouterr()
    assert main(["student", "predict", "--run", str(run), people_files.private, "--quiet"]) == 0
    assert len(capsys.readouterr().out.strip().splitlines()) == 1 + 240


def test_a_config_names_a_key_with_the_key_partition_only() -> None:
    base = ("name = 'x'\n[data]\nprivate = 'p.csv'\npublic = 'q.csv'\nlabel = 'y'\n{key}"
            "[teachers]\n{partition}[aggregator]\nthreshold = 200\nsigma1 = 150.0\n"
            "sigma2 = 40.0\nbudget_epsilon = 5.0\ndelta = 1e-5\n")
    with pytest.raises(UserError, match="needs the column that names whose each row is"):
        parse_config(base.format(key="", partition="partition = 'key'\n"), "c.toml")
    with pytest.raises(UserError, match="is for dealing the rows by key"):
        parse_config(base.format(key="key = 'id'\n", partition=""), "c.toml")
    config = parse_config(base.format(key="key = 'id'\n", partition="partition = 'key'\n"),
                          "c.toml")
    assert config.data.source().key == "id"


@pytest.mark.filterwarnings(  # votes on the teachers' own rows, on purpose
    "ignore:x. some of its rows are rows the teachers were trained on")
def test_the_python_teachers_deal_by_key() -> None:
    from pate.api import Teachers

    gen = np.random.default_rng(4)
    x, y, keys = _people(300, gen)
    with pytest.raises(UserError, match=r"keys= .* go with partition='key'"):
        Teachers(3, 2, epochs=1, partition="key").fit(x, y)
    with pytest.raises(UserError, match=r"keys= .* go with partition='key'"):
        Teachers(3, 2, epochs=1).fit(x, y, keys=keys)
    teachers = Teachers(3, 2, epochs=1, shard_size=3, partition="key").fit(x, y, keys=keys)
    assert teachers.vote(x[:20]).sum(axis=1).tolist() == [3] * 20


@pytest.mark.parametrize("partition", ["position", "record", "key"])
def test_the_report_says_whom_each_deal_protects(partition: str) -> None:
    from pate.data.partitions import PARTITIONS
    from pate.report.meaning import epsilon_meaning, meaning_html
    from pate.report.owner import owner_note

    assert partition in PARTITIONS
    page = meaning_html(epsilon_meaning({"delta": 1e-5, "epsilon_data_independent": 2.0}),
                        partition=partition)
    said = {"position": "changing their record", "record": "adding their record",
            "key": "adding all of their records"}
    assert said[partition] in page and sum(s in page for s in said.values()) == 1
    assert {"position": "not the same guarantee", "record": "the same guarantee",
            "key": "the student's guarantee is the stronger"}[partition] in owner_note(partition)
