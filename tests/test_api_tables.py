"""``pate.api.TableEncoder``: data frames encoded as ``pate run`` encodes the same CSV files,
fitted on the public pool alone."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from pate.api import TableEncoder
from pate.data.task import DataFiles, load_task
from pate.errors import UserError


def _frame(rows: int, seed: int, shift: float) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    frame = pd.DataFrame({"age": rng.normal(40 + shift, 9, rows).round(1),
                          "visits": rng.integers(0, 9, rows),
                          "ward": rng.choice(["north", "south", " east "], rows),
                          "label": rng.choice(["ill", "well"], rows)})
    frame.loc[::7, "age"] = np.nan
    frame.loc[::5, "ward"] = None
    return frame


@pytest.mark.filterwarnings(  # small tables repeat rows by chance
    "ignore:.*some of its rows are also rows of the private data")
def test_frames_are_encoded_as_pate_run_encodes_their_csv_files(tmp_path: Path) -> None:
    """The same features as ``pate run``'s own reading of the files, private rows included
    (encoded with the pool's statistics: their own mean, 100 higher, moves nothing)."""
    private, public = _frame(300, 1, 100.0), _frame(120, 2, 0.0)
    private.loc[3, "ward"] = "west"  # a value the pool lacks: the "other" slot
    private["age"] = private["age"].astype(object)
    private.loc[4, "age"] = "?"  # a missing marker: the pool's mean in both readings
    private.to_csv(tmp_path / "private.csv", index=False)
    public.to_csv(tmp_path / "public.csv", index=False)
    task = load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                               label="label", classes=("ill", "well")))
    read = {name: pd.read_csv(tmp_path / f"{name}.csv").drop(columns="label")
            for name in ("private", "public")}
    encoder = TableEncoder("label").fit(read["public"])
    np.testing.assert_allclose(encoder.transform(read["public"]), task.pool_x, atol=1e-6)
    np.testing.assert_allclose(encoder.transform(read["private"]), task.private_x, atol=1e-6)
    assert encoder.width_ == task.pool_x.shape[1] == 2 + 3 + 1
    assert encoder.columns_["categorical"] == [{"column": "ward",
                                                "values": ["east", "north", "south"]}]
    assert encoder.columns_["means"][0] == pytest.approx(read["public"]["age"].mean())
    # the same encoder from what the task recorded, as a run's student schema holds it
    recorded = TableEncoder.from_record(task.preprocessing)
    assert recorded.record() == encoder.record()
    np.testing.assert_array_equal(recorded.transform(read["private"]),
                                  encoder.transform(read["private"]))
    with pytest.raises(UserError, match="must be one of CSV data"):
        TableEncoder.from_record({"format": "npz"})


def test_bad_frames_are_refused_in_one_line() -> None:
    public = _frame(20, 3, 0.0).drop(columns="label")
    with pytest.raises(UserError, match="not fitted"):
        TableEncoder("label").transform(public)
    with pytest.raises(UserError, match="public must be a pandas DataFrame"):
        TableEncoder("label").fit(public.to_numpy())
    encoder = TableEncoder("label").fit(public)
    with pytest.raises(UserError, match=r"missing ward; not in the public data: bed$"):
        encoder.transform(_frame(5, 4, 0.0).drop(columns="ward").assign(bed=1))
    with pytest.raises(UserError, match="public has no columns besides the label 'label'"):
        TableEncoder("label").fit(public[[]].assign(label=1))
    with pytest.raises(UserError, match="label must be a column name, got ''"):
        TableEncoder(label="")
    with pytest.raises(TypeError, match="label"):  # no default: a forgotten label is no feature
        TableEncoder()  # type: ignore[call-arg]
    with pytest.raises(UserError, match="public has no column 'label', the label left out of the "
                                        "features, but has 'Label'"):
        TableEncoder("label").fit(public.assign(Label="ill"))
    with pytest.raises(UserError, match="column age is numeric in the public data"):
        encoder.transform(public.assign(age="old"))
    texted = public.assign(age=public["age"].astype(object).where(np.arange(20) != 3, "unknown"))
    with pytest.raises(UserError, match=r"holds text here \(first in row 4 of its data, blank "
                                        r"lines not counted\): make the cell a number, or empty "
                                        r"or \? where it is"):
        encoder.transform(texted, private=False)
    with pytest.raises(UserError) as info:  # a frame not said to be public: no row named
        encoder.transform(texted)
    assert "row 4" not in str(info.value) and "not shown" in str(info.value), info.value
    with pytest.raises(UserError, match="frame has no rows"):
        encoder.transform(public.iloc[:0])
    with pytest.raises(UserError, match="names a column twice: age"):
        encoder.transform(pd.concat([public, public[["age"]]], axis=1))
    numbered = TableEncoder("label").fit(pd.DataFrame(np.arange(12.0).reshape(4, 3)))
    assert numbered.columns_["numeric"] == ["0", "1", "2"]  # as a CSV header reads back
    with pytest.raises(UserError, match="missing 2"):
        numbered.transform(pd.DataFrame(np.zeros((2, 2))))


def test_a_student_of_a_table_scores_raw_csv_files(tmp_path: Path) -> None:
    """``Student.fit(..., table=encoder)``: the student scores new raw rows from a ``.csv``
    file as it scores the encoded rows, saved or not, its outputs named by ``classes``; a
    table of other rows or a wrong list of classes is one error line."""
    from pate.api import Student, load_student
    from student.rounds import Received

    public = _frame(120, 2, 0.0)
    encoder = TableEncoder("label").fit(public)  # its label column is left out, unread
    x = encoder.transform(public.drop(columns="label"))
    np.testing.assert_array_equal(encoder.transform(public), x)
    # named another, that column is out (ward: 3 values and "other") and label in (2 and "other")
    assert TableEncoder(label="ward").fit(public).width_ == encoder.width_ - 4 + 3
    answers = Received(np.arange(60), (public["label"][:60] == "well").to_numpy().astype(int),
                       np.ones(60, np.int8))
    student = Student("supervised", epochs=2).fit(x, answers, 2, table=encoder,
                                                  classes=["ill", "well"])
    new = _frame(15, 3, 0.0)
    new.to_csv(tmp_path / "new.csv", index=False)  # with a label column: left out
    scored = student.predict_file(tmp_path / "new.csv")
    expected = student.predict(encoder.transform(new.drop(columns="label")))
    assert scored["label"].tolist() == [["ill", "well"][k] for k in expected]
    again = load_student(student.save(tmp_path / "saved")).predict_file(tmp_path / "new.csv")
    pd.testing.assert_frame_equal(again, scored)
    with pytest.raises(UserError, match="the table encoder makes rows of"):
        Student("supervised", epochs=1).fit(x[:, :-1], answers, 2, table=encoder)
    with pytest.raises(UserError, match="classes must be 2 distinct names"):
        Student("supervised", epochs=1).fit(x, answers, 2, table=encoder, classes=["a", "a"])
