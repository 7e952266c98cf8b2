"""``pate student predict`` and ``Student.predict_file``: a trained student scores new raw rows
read the way its training data were (the public pool's scaling and vocabularies, the image size
and colour mode), so a published student is usable on its own. Real CLI runs on files made
here: a census-like CSV, folders of PNGs and a built-in dataset."""

from __future__ import annotations

import json
from io import StringIO
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image
from student_support import one_thread, votes_for

from pate.api import Student, load_student
from pate.cli.main import main
from pate.data.datasets import load_dataset, public_split
from pate.errors import UserError

pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def _census(n: int, rng: np.random.Generator, unseen: bool = False) -> pd.DataFrame:
    """Census-like rows: numbers, string categories, missing values; the label follows hours
    and education."""
    work = ["Private", "State-gov", "Self-emp"] + (["Never-seen"] if unseen else [])
    hours = rng.normal(40, 10, n).round(1)
    edu = rng.choice(["HS-grad", "Bachelors", "Masters"], n)
    rich = hours + 15 * (edu != "HS-grad") + rng.normal(0, 3, n) > 50
    frame = pd.DataFrame({"age": rng.integers(18, 80, n).astype(float), "hours": hours,
                          "workclass": rng.choice(work, n), "education": edu,
                          "income": np.where(rich, ">50K", "<=50K")})
    frame.loc[rng.random(n) < 0.05, "age"] = np.nan
    frame.loc[rng.random(n) < 0.05, "workclass"] = np.nan
    return frame


def _train(tmp_path: Path, data: list[str], votes: np.ndarray, extra: list[str]) -> Path:
    np.savez(tmp_path / "votes.npz", votes=votes)
    run = tmp_path / "run"
    assert main(["--quiet", "student", "train", "--run", str(run), "--votes",
                 str(tmp_path / "votes.npz"), *data, "--method", "supervised",
                 "--mechanism", "gnmax", "--sigma", "1", "--budget-epsilon", "1000",
                 "--delta", "1e-5", "--json", *extra]) == 0
    return run


@pytest.fixture(scope="module")
def csv_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    tmp_path = tmp_path_factory.mktemp("csv")
    rng = np.random.default_rng(0)
    public = _census(300, rng)
    public.to_csv(tmp_path / "public.csv", index=False, na_rep="?")
    _census(200, rng).to_csv(tmp_path / "private.csv", index=False, na_rep="?")
    _census(200, rng).to_csv(tmp_path / "test.csv", index=False, na_rep="?")
    truth = (public["income"] == ">50K").to_numpy().astype(int)
    run = _train(tmp_path, ["--private", str(tmp_path / "private.csv"), "--public",
                            str(tmp_path / "public.csv"), "--test", str(tmp_path / "test.csv"),
                            "--label", "income", "--classes", "<=50K", ">50K"],
                 votes_for(truth, teachers=20, classes=2), ["--queries", "300", "--epochs", "20"])
    return tmp_path, json.loads((run / "student" / "metrics.json").read_text())


def test_csv_rows_are_scored_as_the_test_rows_were(
        csv_run: tuple[Path, dict], capsys: pytest.CaptureFixture) -> None:
    """Scoring the test file (its label column ignored) reproduces the run's own test accuracy
    to the row: the same encoding (public means, vocabularies, the "other" slot) is applied."""
    tmp_path, metrics = csv_run
    capsys.readouterr()
    out = tmp_path / "scored.csv"
    assert main(["student", "predict", "--run", str(tmp_path / "run"), str(tmp_path / "test.csv"),
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"200 rows scored -> {out}"
    scored = pd.read_csv(out)
    assert list(scored.columns) == ["row", "label", "confidence", "p_<=50K", "p_>50K"]
    assert scored["row"].tolist() == list(range(200))
    assert np.allclose(scored[["p_<=50K", "p_>50K"]].sum(axis=1), 1.0)
    assert main(["student", "predict", "--run", str(tmp_path / "run"), str(tmp_path / "test.csv"),
                 "--out", str(out)]) == 0  # earlier predictions may be written over
    assert np.allclose(scored["confidence"], scored[["p_<=50K", "p_>50K"]].max(axis=1))
    truth = pd.read_csv(tmp_path / "test.csv")["income"]
    assert metrics["accuracy"] > 0.7
    assert np.mean(scored["label"] == truth) == pytest.approx(metrics["accuracy"], abs=1e-12)


def test_csv_columns_in_any_order_unseen_categories_and_stdout(
        csv_run: tuple[Path, dict], capsys: pytest.CaptureFixture) -> None:
    """New rows without the label column, their columns shuffled, with a category the pool
    never showed: scored, to standard output, the same as with the columns in order."""
    tmp_path, _ = csv_run
    rows = _census(50, np.random.default_rng(5), unseen=True)
    rows.drop(columns="income")[["workclass", "hours", "education", "age"]].to_csv(
        tmp_path / "new.csv", index=False)
    rows.to_csv(tmp_path / "new-ordered.csv", index=False)
    capsys.readouterr()
    assert main(["student", "predict", "--student", str(tmp_path / "run" / "student"),
                 str(tmp_path / "new.csv")]) == 0
    shuffled = pd.read_csv(StringIO(capsys.readouterr().out))
    ordered = load_student(tmp_path / "run").predict_file(tmp_path / "new-ordered.csv")
    assert len(shuffled) == 50 and (rows["workclass"] == "Never-seen").any()
    assert shuffled["label"].tolist() == ordered["label"].tolist()
    assert np.allclose(shuffled["p_>50K"], ordered["p_>50K"])
    # --student takes the run directory too, and --run its student folder, as load_student does
    for flag, path in (("--student", tmp_path / "run"), ("--run", tmp_path / "run" / "student")):
        assert main(["student", "predict", flag, str(path), str(tmp_path / "new.csv")]) == 0
        assert pd.read_csv(StringIO(capsys.readouterr().out))["label"].tolist() == (
            shuffled["label"].tolist())
    # --out through a link writes its target and keeps the link; "-" is standard output
    (tmp_path / "target.csv").write_text("")
    (tmp_path / "link.csv").symlink_to(tmp_path / "target.csv")
    assert main(["student", "predict", "--run", str(tmp_path / "run"), str(tmp_path / "new.csv"),
                 "--out", str(tmp_path / "link.csv")]) == 0
    assert (tmp_path / "link.csv").is_symlink()
    assert pd.read_csv(tmp_path / "target.csv")["label"].tolist() == ordered["label"].tolist()
    capsys.readouterr()
    assert main(["student", "predict", "--run", str(tmp_path / "run"), str(tmp_path / "new.csv"),
                 "--out", "-"]) == 0
    assert len(pd.read_csv(StringIO(capsys.readouterr().out))) == 50


def test_bad_inputs_are_one_line(csv_run: tuple[Path, dict], capsys: pytest.CaptureFixture
                                 ) -> None:
    tmp_path, _ = csv_run
    run = str(tmp_path / "run")
    _census(5, np.random.default_rng(6)).drop(columns="age").to_csv(tmp_path / "narrow.csv",
                                                                     index=False)
    np.savez(tmp_path / "x.npz", x=np.zeros((3, 4), np.float32))
    (tmp_path / "inf.csv").write_text("age,hours,workclass,education\ninf,40,Private,HS-grad\n")
    (tmp_path / "twice.csv").write_text("age,hours,workclass,education,age \n1,2,a,b,3\n")
    (tmp_path / "file").write_text("")
    cases = [
        ([str(tmp_path / "narrow.csv")], "its columns differ from the public data's; missing age"),
        ([str(tmp_path / "x.npz")], "trained on .csv data"),
        ([str(tmp_path / "nothing.csv")], "no such file or folder"),
        ([str(tmp_path / "inf.csv")], "column age holds an infinite or too large number"),
        ([str(tmp_path / "twice.csv")], "the column 'age' appears more than once"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path)], "not a regular file"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path / "file" / "x.csv")],
         "no such folder"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path / "new" / "x.csv")],
         "no such folder"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path / "x.npz")],  # a ledger, say
         "would be overwritten, and it is not a file of predictions"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path / "inf.csv")],  # data, not scores
         "would be overwritten, and it is not a file of predictions"),
        ([str(tmp_path / "test.csv"), "--out", str(tmp_path / "test.csv")],
         "would be overwritten"),
    ]
    for argv, message in cases:
        capsys.readouterr()
        assert main(["student", "predict", "--run", run, *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert not (tmp_path / "new").exists()
    assert main(["student", "predict", "--run", str(tmp_path / "none"),
                 str(tmp_path / "test.csv")]) == 2
    assert "no saved student" in capsys.readouterr().err


def test_a_student_without_a_schema_says_how_to_get_one(
        csv_run: tuple[Path, dict], tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Saved by ``Student.save`` it keeps its schema; without one (fitted on arrays, or an older
    run) it says what to do; a damaged schema is one line."""
    source, _ = csv_run
    saved = load_student(source / "run").save(tmp_path / "copy")
    assert (saved / "schema.json").is_file()
    again = load_student(saved).predict_file(source / "test.csv")
    assert len(again) == 200
    good = json.loads((saved / "schema.json").read_text())
    damaged = [({"classes": ["a"]}, "1 classes for a student of 2"),
               ({"classes": ["a", "a"]}, "the classes must be distinct names"),
               ({"classes": [["a"], {"b": 1}]}, "the classes must be distinct names"),
               ({"preprocessing": {**good["preprocessing"], "categorical": [
                   {"column": "workclass", "values": ["Private", "Private"]}]}}, "malformed"),
               ({"preprocessing": {**good["preprocessing"], "means": [1.0]}}, "malformed"),
               ({"preprocessing": {**good["preprocessing"], "categorical": {}}}, "malformed"),
               ({"preprocessing": {"format": "parquet"}}, "unknown format 'parquet'"),
               ({"preprocessing": {**good["preprocessing"],  # well formed, but not its own
                                   "numeric": [*good["preprocessing"]["numeric"], "extra"],
                                   "means": [*good["preprocessing"]["means"], 0.0],
                                   "stds": [*good["preprocessing"]["stds"], 1.0]}},
                "its preprocessing makes rows of shape")]
    for change, message in damaged:
        (saved / "schema.json").write_text(json.dumps({**good, **change}))
        assert main(["student", "predict", "--student", str(saved),
                     str(source / "test.csv")]) == 2
        err = capsys.readouterr().err
        assert message in err and "damaged" in err and err.count("\n") == 1, err
    (saved / "schema.json").unlink()
    assert main(["student", "predict", "--student", str(saved), str(source / "test.csv")]) == 2
    assert "retrains the student" in capsys.readouterr().err
    # a student fitted on arrays saved over the folder leaves no stale schema behind
    fitted = Student("supervised", arch="mlp", epochs=1)
    fitted.model_, fitted.spec_ = load_student(saved).model_, load_student(saved).spec_
    with pytest.raises(UserError, match="fitted on arrays"):
        fitted.predict_file(source / "test.csv")
    (saved / "schema.json").write_text(json.dumps(good))
    fitted.save(saved)
    assert not (saved / "schema.json").exists()


def _pngs(folder: Path, x: np.ndarray, y: np.ndarray | None, size: int, mode: str) -> None:
    for i, image in enumerate(x):
        where = folder if y is None else folder / ["dark", "bright"][y[i]]
        where.mkdir(parents=True, exist_ok=True)
        Image.fromarray(image, "L").resize((size, size)).convert(mode).save(where / f"{i:04d}.png")


def test_image_folder_rows_are_resized_and_named(tmp_path: Path,
                                                 capsys: pytest.CaptureFixture) -> None:
    """A student trained on 8x8 grey PNGs scores a folder of 24x24 colour ones (converted and
    resized as the schema says), each row named by its path."""
    rng = np.random.default_rng(2)

    def images(n: int) -> tuple[np.ndarray, np.ndarray]:
        y = rng.integers(0, 2, n)
        x = rng.integers(0, 60, (n, 8, 8)).astype(np.uint8)
        x[y == 1, :, :4] += 180
        x[y == 0, :, 4:] += 180
        return x, y

    pool_x, pool_y = images(120)
    _pngs(tmp_path / "public", pool_x, None, 8, "L")
    _pngs(tmp_path / "private", *images(40), 8, "L")
    run = _train(tmp_path, ["--private", str(tmp_path / "private"), "--public",
                            str(tmp_path / "public"), "--classes", "bright", "dark"],
                 votes_for(1 - pool_y, teachers=20, classes=2),
                 ["--queries", "120", "--epochs", "15", "--arch", "mlp"])
    schema = json.loads((run / "student" / "schema.json").read_text())
    assert schema == {"classes": ["bright", "dark"], "preprocessing": {
        "format": "folder", "mode": "L", "height": 8, "width": 8, "fitted_on": "public"}}
    new_x, new_y = images(60)
    _pngs(tmp_path / "new", new_x, new_y, 24, "RGB")
    capsys.readouterr()
    assert main(["student", "predict", "--run", str(run), str(tmp_path / "new"),
                 "--out", str(tmp_path / "scored.csv")]) == 0
    scored = pd.read_csv(tmp_path / "scored.csv")
    assert scored["row"].iloc[0].split("/")[0] in ("bright", "dark")
    truth = [name.split("/")[0] for name in scored["row"]]
    assert np.mean(scored["label"] == truth) > 0.9


def test_benchmark_student_scores_npz_images(tmp_path: Path) -> None:
    """A built-in dataset's student scores a .npz of images as the dataset's loader scaled
    them: the evaluation rows give the run's own accuracy."""
    digits = load_dataset("digits")
    (_, pool_y), (eval_x, eval_y) = public_split(digits)
    run = _train(tmp_path, ["--dataset", "digits"], votes_for(pool_y, teachers=20),
                 ["--queries", "200", "--epochs", "10", "--arch", "mlp"])
    metrics = json.loads((run / "student" / "metrics.json").read_text())
    np.savez(tmp_path / "eval.npz", x=eval_x[:, 0])  # [n, H, W] floats: a channel is added
    scored = load_student(run).predict_file(tmp_path / "eval.npz")
    assert np.mean(scored["label"].astype(int) == eval_y) == pytest.approx(metrics["accuracy"])
