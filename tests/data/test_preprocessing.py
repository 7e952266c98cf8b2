"""``pate.data.preprocessing`` on files made here: a table's columns are read the same way in
every file (codes that look like numbers stay codes, spaces and trailing commas do not move
values), feature rows of another width and integer pixels of a built-in dataset are handled as
the record says, and image folders read 16-bit grey and say what they skip."""

from __future__ import annotations

import warnings
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pate.data import files
from pate.data.preprocessing import (
    TabularEncoder,
    benchmark_record,
    encode_new_rows,
    record_shape,
)
from pate.data.task import DataFiles, load_task
from pate.errors import UserError


def _record(tmp_path: Path, public: str) -> dict:
    (tmp_path / "public.csv").write_text(public)
    frame, _ = files.read_csv(tmp_path / "public.csv", "y", False)
    return {"format": "csv", "label": "y", **TabularEncoder.fit(frame).describe()}


def test_codes_that_look_like_numbers_stay_codes(tmp_path: Path) -> None:
    record = _record(tmp_path, "code,x,y\n01,1,a\nA,2,b\n02,3,a\n1,4,b\n")
    assert record["numeric"] == ["x"]
    assert record["categorical"] == [{"column": "code", "values": ["01", "02", "1", "A"]}]
    # a file holding only number-like codes, a missing value, trailing spaces and commas
    (tmp_path / "new.csv").write_text("code,x\n01 ,1,\n02,?,\n1,3,\n?,4,\n")
    x, names = encode_new_rows(record, tmp_path / "new.csv")
    assert names == ["0", "1", "2", "3"]
    one_hot = x[:, 1:]
    assert one_hot.argmax(axis=1).tolist() == [0, 1, 2, 4]  # 4: the "other" slot (missing)
    assert x[1, 0] == 0.0  # a missing number is the public mean


def test_a_number_column_with_a_few_words_is_warned_about(tmp_path: Path) -> None:
    rows = "".join(f"{a},{c},y{a % 2}\n" for a, c in zip(range(20, 40), "AB" * 10, strict=True))
    with pytest.warns(UserWarning, match=r"column age is read as categories: 1 of its 21 values"
                                         r" are not numbers") as caught:
        record = _record(tmp_path, "age,code,y\n" + rows + "forty,A,y0\n")
    assert record["numeric"] == [] and len(caught) == 1  # the column of codes: no warning
    assert "forty" not in str(caught[0].message)  # counts only, never a value


def test_a_public_column_with_no_value_is_warned_about(tmp_path: Path) -> None:
    """Empty in the public pool, a column is a category with no value: it tells the models
    nothing, whatever the private file holds there. Said from the public file alone."""
    with pytest.warns(UserWarning, match=r"column age holds no value: it tells the models "
                                         r"nothing") as caught:
        record = _record(tmp_path, "age,x,y\n,1,a\n?,2,b\n,3,a\n")
    assert record["categorical"] == [{"column": "age", "values": []}] and len(caught) == 1


def test_labels_are_integers_only_when_all_are(tmp_path: Path) -> None:
    (tmp_path / "a.csv").write_text("x,y\n1,3\n2,-1\n")
    (tmp_path / "b.csv").write_text("x,y\n1,3\n2,1.5\n")
    assert files.read_csv(tmp_path / "a.csv", "y", True)[1].tolist() == [3, -1]
    assert files.read_csv(tmp_path / "b.csv", "y", True)[1].tolist() == ["3", "1.5"]


def test_feature_rows_of_another_width_are_refused_before_scaling(tmp_path: Path) -> None:
    record = {"format": "npz", "standardised": True, "mean": [0.0] * 5, "std": [1.0] * 5}
    for width in (1, 6):
        np.savez(tmp_path / "x.npz", x=np.zeros((3, width), np.float32))
        with pytest.raises(UserError, match=f"rows of {width} features; this student takes 5"):
            encode_new_rows(record, tmp_path / "x.npz")
    np.savez(tmp_path / "x.npz", x=np.full((3, 5), 1e39))
    with pytest.raises(UserError, match="too large"):
        encode_new_rows(record, tmp_path / "x.npz")


def test_integer_pixels_are_scaled_as_the_dataset_was(tmp_path: Path) -> None:
    np.savez(tmp_path / "d.npz", x=np.full((2, 8, 8), 8, np.int64))
    x, _ = encode_new_rows(benchmark_record("digits", (1, 8, 8), 16.0), tmp_path / "d.npz")
    assert x.shape == (2, 1, 8, 8) and np.allclose(x, 0.5)


def test_sixteen_bit_grey_and_skipped_entries(tmp_path: Path) -> None:
    folder = tmp_path / "new"
    folder.mkdir()
    Image.fromarray(np.full((4, 4), 32768, np.uint16)).save(folder / "a.png")
    (folder / "notes.txt").write_text("not an image")
    with pytest.warns(UserWarning, match="1 entry skipped.*notes.txt"):
        x, names = encode_new_rows({"format": "folder", "mode": "L", "height": 4, "width": 4},
                                   folder)
    assert names == ["a.png"] and np.allclose(x, 128 / 255)


def test_public_images_of_mixed_sizes_are_said_to_be_resized(tmp_path: Path) -> None:
    """Without a size given, every image takes the first public image's: a public image of
    another size is said (once, with a count); with the size given, nothing is."""
    for role, count in (("private", 6), ("public", 4)):
        for c in ("cat", "dog"):
            (tmp_path / role / c).mkdir(parents=True)
            for i in range(count):
                shape = (12, 10) if (role, c, i) == ("public", "dog", 3) else (8, 8)
                Image.fromarray(np.full(shape, 40 * i + len(role) + len(c), np.uint8)).save(
                    tmp_path / role / c / f"{i}.png")
    source = DataFiles(str(tmp_path / "private"), str(tmp_path / "public"))
    with pytest.warns(UserWarning, match=r"1 of its 8 images is not the size of the first "
                                         r"\(cat/0.png\), 8 high and 8 wide: every image is "
                                         r"resized to it"):
        assert load_task(source).pool_x.shape == (8, 1, 8, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load_task(replace(source, image_size=(8, 8))).pool_x.shape == (8, 1, 8, 8)


def test_ragged_rows_repeated_headers_and_out_of_range_pixels_are_refused(tmp_path: Path
                                                                         ) -> None:
    record = _record(tmp_path, "code,x,y\n01,1,a\nA,2,b\n")
    (tmp_path / "ragged.csv").write_text("code,x\nSelf,emp,3\n01,2\n")
    with pytest.raises(UserError, match="line 2 has more fields than the header"):
        encode_new_rows(record, tmp_path / "ragged.csv")
    # a later row too, and one with fewer fields (pandas fills it with missing values unsaid),
    # with quotes too, where a comma or a line break may sit inside a value (the line named is
    # the file's)
    for text, message in (("code,x\n01,2\n\n02,3\r\n03,4,5\n", "line 5 has more fields"),
                          ("code,x\n01,2\n02\n", "line 3 has fewer fields"),
                          ('code,x\n"0,1",2\n02,3,4\n', "line 3 has more fields"),
                          ('code,x\n"0,1",2\n02\n03,4\n', "row 2 after the header has fewer"),
                          ('code,x\n"0\n1",2\n"say ""a,b""",3\n02\n', "row 3 after the header"
                                                                       " has fewer"),
                          # a carriage return pasted into a line: pandas splits it there,
                          # quotes elsewhere in the file or not
                          ("code,x\n01,2\n02,3\r,4\n", "line 3 holds a carriage return that "
                                                      "ends no line"),
                          ('code,x\n"01",2\n02,3\r,4\n', "line 3 holds a carriage return")):
        (tmp_path / "ragged.csv").write_text(text)
        with pytest.raises(UserError, match=message):
            encode_new_rows(record, tmp_path / "ragged.csv")
    (tmp_path / "fine.csv").write_text('code,x\n"0,1",2\n\n02,3\n')
    assert len(encode_new_rows(record, tmp_path / "fine.csv")[0]) == 2
    for fine in ("code,x\r01,2\r02,3\r",  # classic Mac line ends
                 "code,x\n01,2\n02,3\r",  # a carriage return ending the file
                 "code,x\r\r\n01,2\r\r\n02,3\r\r\n",  # CR CR LF, as some tools write
                 'code,x\n"0\r1",2\n02,3\n'):  # one inside a quoted value
        (tmp_path / "fine.csv").write_text(fine)
        assert len(encode_new_rows(record, tmp_path / "fine.csv")[0]) == 2, repr(fine)
    (tmp_path / "fine.csv").write_text("code,x\n01,\n02,3\n")  # an empty last field
    assert len(encode_new_rows(record, tmp_path / "fine.csv")[0]) == 2
    (tmp_path / "fine.csv").write_text("code,x,\n01,2,\n02,3,\n")  # a comma ending every line
    assert len(encode_new_rows(record, tmp_path / "fine.csv")[0]) == 2
    (tmp_path / "fine.csv").write_text("code,x\n5'11\",2\n6'0\",3\n")  # a quote in a value
    assert len(encode_new_rows(record, tmp_path / "fine.csv")[0]) == 2
    (tmp_path / "twice.csv").write_text("code,x,x\n01,1,2\n")
    with pytest.raises(UserError, match="the column 'x' appears more than once"):
        encode_new_rows(record, tmp_path / "twice.csv")
    np.savez(tmp_path / "d.npz", x=np.full((2, 8, 8), 255, np.uint8))
    with pytest.raises(UserError, match=r"integer pixels must lie in \[0, 16\]"):
        encode_new_rows(benchmark_record("digits", (1, 8, 8), 16.0), tmp_path / "d.npz")


def test_record_shape_is_the_shape_the_record_makes(tmp_path: Path) -> None:
    assert record_shape(benchmark_record("fashion-mnist", (1, 28, 28), 255.0)) == (1, 28, 28)
    assert record_shape({"format": "folder", "mode": "RGB", "height": 6, "width": 4}) == (3, 6, 4)
    assert record_shape({"format": "npz"}) is None  # images or unscaled features: not fixed
    assert record_shape({"format": "npz", "standardised": True, "mean": [0.0] * 5,
                         "std": [1.0] * 5}) == (5,)
    record = _record(tmp_path, "x,c,y\n1,a,p\n2,b,q\n")
    assert record_shape(record) == (1 + 3,)  # a number, two categories and the "other" slot


def test_a_label_column_of_many_numbers_is_refused_unless_its_classes_are_named(
        tmp_path: Path) -> None:
    """A numeric column given as the label makes a class of every value; the run would spend
    its budget on queries no teacher majority answers: refused, unless the label set is given."""
    for c, role in zip("abc", ("private", "public", "test"), strict=True):  # no row in two
        rows = "".join(f"{20 + i % 40},{c}{i % 2},{i % 2}\n" for i in range(120))
        (tmp_path / f"{role}.csv").write_text("age,c,y\n" + rows)
    source = DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                       str(tmp_path / "test.csv"), "age")
    with pytest.raises(UserError, match=r"the test labels \(age\) hold 40 distinct numbers, "
                                        r"each would be a class: if that is not the label"):
        load_task(source)
    named = tuple(f"age {v}" for v in range(60))  # integer labels: positions in it
    assert load_task(replace(source, classes=named)).classes == named
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the label meant: two classes, no warning
        assert load_task(replace(source, label="y")).classes == ("0", "1")


def test_a_column_of_all_different_values_is_warned_of_as_an_identifier() -> None:
    """A row id (whole numbers or text, a different one in every public row) would be scaled as
    a feature; a measurement that never repeats (decimals) or a column that repeats is not one."""
    rng = np.random.default_rng(0)
    n = 60
    public = pd.DataFrame({"loan_id": [str(1000 + i) for i in rng.permutation(n)],
                           "ref": [f"L{i}" for i in range(n)],
                           "income": [f"{v:.3f}" for v in rng.normal(50, 10, n)],
                           "age": [str(v) for v in rng.integers(18, 30, n)]})
    with pytest.warns(UserWarning) as warned:
        TabularEncoder.fit(public)
    said = [str(w.message) for w in warned]
    assert len(said) == 2 and all("holds a different value in every row: an identifier" in m
                                  for m in said)
    assert "loan_id" in said[0] and "ref" in said[1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TabularEncoder.fit(public.drop(columns=["loan_id", "ref"]))
        TabularEncoder.fit(public.iloc[:20])  # too few rows to tell


def test_a_printed_task_shows_no_private_row(tmp_path: Path) -> None:
    """A task printed (a notebook's echo, a log line) leaves out the private rows, labels and
    keys, and the digests made of them: only public parts are shown."""
    for role, offset in (("private", 7000), ("public", 0), ("test", 100)):
        rows = "".join(f"{offset + i}.5,person{offset + i},{'ab'[i % 2]}\n" for i in range(40))
        (tmp_path / f"{role}.csv").write_text("x,who,y\n" + rows)
    task = load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                               str(tmp_path / "test.csv"), "y", key="who"))
    assert task.private_x is not None and task.private_keys is not None
    shown = repr(task)
    assert "pool_x=" in shown and "person7" not in shown
    for name in ("private_x", "private_y", "private_keys", "private_content", "private_rows"):
        assert f"{name}=" not in shown
    for value in (task.private_content, task.private_rows):
        assert value is None or value not in shown
