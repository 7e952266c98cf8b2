"""``pate run my.toml`` on a user's own files, generated here: images in ``.npz``, a census-like
CSV (string categories, numbers, missing values) and a folder of class subfolders of PNGs. Each
run goes through every stage for real (Ray teachers, the HTTP service, the student, the report)."""

from __future__ import annotations

import json
import re
import struct
import subprocess
import sys
import warnings
import zlib
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from PIL import Image

from pate.cli.main import main
from pate.data.files import read_image_folder
from pate.data.row_identity import private_rows_key, rows_content_digest
from pate.data.task import DataFiles, Task, load_task, unused_setting_problem
from pate.errors import UserError

TINY = """
[teachers]
count = 4
epochs = 3
[aggregator]
threshold = 2
sigma1 = 1.0
sigma2 = 1.0
budget_epsilon = 1000.0
delta = 1e-5
[student]
method = "supervised"
queries = 40
epochs = 40
unlabelled_batch_size = 32
"""


def _images(n: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """8x8 grey images: class 1 is bright on the left half, class 0 on the right."""
    y = rng.integers(0, 2, n)
    x = rng.integers(0, 60, (n, 8, 8)).astype(np.uint8)
    x[y == 1, :, :4] += 180
    x[y == 0, :, 4:] += 180
    return x, y


def census(n: int, rng: np.random.Generator, unseen: bool = False) -> str:
    """A CSV like UCI Adult: numbers, string categories, '?' for missing; the label follows
    hours and education."""
    rows = ["age,hours,workclass,education,income"]
    work = ["Private", "State-gov", "Self-emp"] + (["Never-seen"] if unseen else [])
    for _ in range(n):
        age = rng.integers(18, 80)
        hours = rng.normal(40, 10)
        edu = rng.choice(["HS-grad", "Bachelors", "Masters"])
        rich = hours + 15 * (edu != "HS-grad") + rng.normal(0, 3) > 50
        rows.append(",".join([
            "?" if rng.random() < 0.05 else str(age), f"{hours:.1f}",
            "?" if rng.random() < 0.05 else str(rng.choice(work)), str(edu),
            ">50K" if rich else "<=50K"]))
    return "\n".join(rows) + "\n"


def _run(tmp_path: Path, data: str, capsys: pytest.CaptureFixture) -> dict:
    cfg = tmp_path / "my.toml"
    cfg.write_text(f'name = "mine"\n[data]\n{data}\n' + TINY)
    run = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "pate", "--quiet", "run", str(cfg), "--run",
                           str(run)], capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert (run / "report" / "report.html").is_file()
    metrics = json.loads((run / "student" / "metrics.json").read_text())
    assert out["summary"][0]["queries_answered"] == metrics["answered"] > 0
    schema = json.loads((run / "student" / "schema.json").read_text())
    assert schema["classes"] == metrics["classes"]
    assert schema["preprocessing"]["fitted_on"] == "public"
    return metrics


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_npz_images(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(0)
    for name, n in (("private", 300), ("public", 120), ("test", 80)):
        x, y = _images(n, rng)
        np.savez(tmp_path / f"{name}.npz", x=x, y=y)
    metrics = _run(tmp_path, 'private = "private.npz"\npublic = "public.npz"\n'
                             'test = "test.npz"', capsys)
    assert metrics["classes"] == ["0", "1"] and metrics["classes_from"] == "test"
    assert metrics["accuracy"] > 0.8 and metrics["label_accuracy"] is None


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_census_csv(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(1)
    (tmp_path / "private.csv").write_text(census(400, rng, unseen=True))
    (tmp_path / "public.csv").write_text(census(150, rng))
    (tmp_path / "test.csv").write_text(census(100, rng))
    metrics = _run(tmp_path, 'private = "private.csv"\npublic = "public.csv"\n'
                             'test = "test.csv"\nlabel = "income"\n'
                             'classes = ["<=50K", ">50K"]', capsys)
    assert metrics["arch"] == "mlp" and metrics["classes_from"] == "config"
    manifest = json.loads((tmp_path / "run" / "teachers" / "manifest.json").read_text())
    assert manifest["model"] == "mlp"  # the default for tabular data
    assert metrics["accuracy"] > 0.7


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_image_folder(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(2)
    for role, n in (("private", 200), ("public", 100), ("test", 60)):
        x, y = _images(n, rng)
        for i, (image, label) in enumerate(zip(x, y, strict=True)):
            folder = tmp_path / role / ("" if role == "public" else ["dark", "bright"][label])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image, "L").save(folder / f"{i}.png")
    metrics = _run(tmp_path, 'private = "private"\npublic = "public"\ntest = "test"', capsys)
    assert metrics["classes"] == ["bright", "dark"] and metrics["accuracy"] > 0.8


def test_preprocessing_is_fitted_on_public_data_only(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    (tmp_path / "private.csv").write_text(census(200, rng, unseen=True))
    (tmp_path / "public.csv").write_text(census(100, rng))
    source = DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                       label="income", classes=(">50K", "<=50K"))
    task = load_task(source)
    public = task.preprocessing
    assert public["fitted_on"] == "public"
    assert [c["column"] for c in public["categorical"]] == ["workclass", "education"]
    workclass = public["categorical"][0]["values"]
    assert "Never-seen" not in workclass  # a private-only category
    # the private rows of the unseen category land in the "other" slot of workclass
    width = len(workclass) + 1
    start = len(public["numeric"])
    other = task.private_x[:, start + width - 1]
    assert other.sum() > 0 and task.private_x.shape[1] == public["features"]
    assert np.allclose(task.pool_x[:, :start].mean(axis=0), 0, atol=1e-6)
    assert task.classes == (">50K", "<=50K") and set(task.private_y.tolist()) == {0, 1}


def test_the_private_data_is_known_by_its_content_however_it_is_read(tmp_path: Path) -> None:
    """The budget registry's key is the private file as given: the same for another label set
    order or another public pool (other encoded rows, so another ``private_fingerprint``, which
    a resume checks), another for other private rows."""
    rng = np.random.default_rng(4)
    for name, n in (("private.csv", 120), ("public.csv", 60), ("public2.csv", 60),
                    ("other.csv", 120)):
        (tmp_path / name).write_text(census(n, rng))

    def task(private: str, public: str, classes: tuple[str, ...]) -> Task:
        return load_task(DataFiles(str(tmp_path / private), str(tmp_path / public),
                                   label="income", classes=classes))

    first = task("private.csv", "public.csv", (">50K", "<=50K"))
    for again in (task("private.csv", "public.csv", ("<=50K", ">50K")),
                  task("private.csv", "public2.csv", (">50K", "<=50K"))):
        assert again.private_fingerprint != first.private_fingerprint
        assert again.private_data_fingerprint == first.private_data_fingerprint
    other = task("other.csv", "public.csv", (">50K", "<=50K"))
    assert other.private_data_fingerprint != first.private_data_fingerprint
    # the same table written otherwise (line ends, rows shuffled, columns reordered): the same
    lines = (tmp_path / "private.csv").read_text().splitlines()
    header, rows = lines[0].split(","), lines[1:]
    order = [4, 2, 0, 1, 3]
    rewritten = [",".join(header[i] for i in order)] + [
        ",".join(r.split(",")[i] for i in order) for r in rows[::-1]]
    (tmp_path / "resaved.csv").write_bytes("\r\n".join(rewritten).encode() + b"\r\n")
    resaved = task("resaved.csv", "public.csv", (">50K", "<=50K"))
    assert resaved.private_data_fingerprint == first.private_data_fingerprint
    # another column taken for the label: the same table, the same data
    education = load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                                    label="education",
                                    classes=("HS-grad", "Bachelors", "Masters")))
    assert education.private_data_fingerprint == first.private_data_fingerprint
    assert load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                               label="income", classes=(">50K", "<=50K")),
                     need_private=False).private_data_fingerprint is None
    # text cells: the second key is of its rows as encoded, the Python API's arrays of it
    assert first.private_rows_fingerprint == private_rows_key(rows_content_digest(
        first.private_x))


def test_a_csv_of_numbers_and_its_npz_share_the_second_key(tmp_path: Path) -> None:
    """A CSV whose every feature cell is a number and its features saved as an ``.npz``
    (``x`` as float32, the label apart), in another order of the rows, share the ledgers'
    second key; their first keys differ. The key column is not a feature; one changed cell
    gives another key; a text cell, that of the rows as encoded."""
    rng = np.random.default_rng(6)
    x, y = rng.normal(size=(50, 3)).astype(np.float32), rng.integers(0, 2, 50)
    public = rng.normal(size=(20, 3)).astype(np.float32)

    def table(features: np.ndarray, **more: object) -> str:
        columns = {"a": features[:, 0], "b": features[:, 1], "c": features[:, 2], **more}
        lines = [",".join(columns)] + [",".join(str(v[i]) for v in columns.values())
                                       for i in range(len(features))]
        return "\n".join(lines) + "\n"

    (tmp_path / "public.csv").write_text(table(public))
    (tmp_path / "private.csv").write_text(table(x, label=y, person=np.arange(50) % 7))
    changed = x.copy()
    changed[7, 1] += 1
    (tmp_path / "changed.csv").write_text(table(changed, label=y))
    (tmp_path / "text.csv").write_text(table(x, label=y, town=np.array(["a", "b"])[y]))
    (tmp_path / "public-text.csv").write_text(table(public, town=["a"] * 20))
    order = rng.permutation(50)
    np.savez(tmp_path / "private.npz", x=x[order], y=y[order])
    np.savez(tmp_path / "public.npz", x=public)

    def task(private: str, public: str = "public.csv", key: str | None = None) -> Task:
        label = "label" if private.endswith(".csv") else None  # .npz files carry their labels
        return load_task(DataFiles(str(tmp_path / private), str(tmp_path / public),
                                   label=label, classes=("0", "1"), key=key))

    csv, npz = task("private.csv", key="person"), task("private.npz", "public.npz")
    assert csv.private_rows_fingerprint is not None
    assert csv.private_rows_fingerprint == npz.private_rows_fingerprint
    assert csv.private_data_fingerprint != npz.private_data_fingerprint
    assert task("changed.csv").private_rows_fingerprint != csv.private_rows_fingerprint
    text = task("text.csv", "public-text.csv")  # a text cell: its rows as encoded
    assert text.private_rows_fingerprint not in (None, csv.private_rows_fingerprint)


def test_the_same_images_in_another_format_or_order_share_the_second_key(tmp_path: Path
                                                                          ) -> None:
    """The ledgers' second key (``private_rows_fingerprint``) is of the private images as read:
    the same as integers in an ``.npz``, as floats in [0, 1], as a folder of PNG files, shuffled
    and relabelled, and for the Python API's teachers given the arrays; another where one pixel
    differs. The first key, of the file as given, differs between the formats."""
    from pate.api import Teachers

    rng = np.random.default_rng(5)
    x, y = _images(40, rng)
    public, _ = _images(10, rng)
    np.savez(tmp_path / "public.npz", x=public)
    for role, pixels in (("public", public), ("private", x)):
        for i, image in enumerate(pixels):
            folder = tmp_path / f"{role}-png" / ("" if role == "public" else ["a", "b"][y[i]])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image, "L").save(folder / f"{i}.png")
    order = rng.permutation(len(x))
    changed = x.copy()
    changed[3, 0, 0] ^= 1
    for name, (xs, ys) in {"ints": (x, y), "floats": (x / np.float32(255), y),
                           "shuffled": (x[order], 1 - y[order]), "changed": (changed, y)}.items():
        np.savez(tmp_path / f"{name}.npz", x=xs, y=ys)

    def task(private: str, public: str = "public.npz") -> Task:
        return load_task(DataFiles(str(tmp_path / private), str(tmp_path / public),
                                   classes=("0", "1") if private.endswith("npz") else None))

    ints = task("ints.npz")
    assert ints.private_rows_fingerprint is not None
    for same in (task("floats.npz"), task("shuffled.npz"), task("private-png", "public-png")):
        assert same.private_rows_fingerprint == ints.private_rows_fingerprint
        assert same.private_data_fingerprint != ints.private_data_fingerprint
    assert task("changed.npz").private_rows_fingerprint != ints.private_rows_fingerprint
    teachers = Teachers(2, 2, epochs=1, model="mlp").fit(x[order], y[order])
    assert teachers.private_rows_fingerprint_ == ints.private_rows_fingerprint
    assert Teachers.load(teachers.save(tmp_path / "t")).private_rows_fingerprint_ == \
        ints.private_rows_fingerprint


def test_a_public_file_unlike_both_others_is_the_one_named(tmp_path: Path) -> None:
    """A column renamed in the public CSV alone: the error names the public file, not the test
    file checked against it."""
    rng = np.random.default_rng(6)
    for name in ("private", "public", "test"):
        (tmp_path / f"{name}.csv").write_text(census(40, rng))
    public = tmp_path / "public.csv"
    public.write_text(public.read_text().replace("hours,", "weekly_hours,", 1))
    with pytest.raises(UserError, match=r"public\.csv: its columns differ from those of "
                                        r".*test\.csv and .*private\.csv, which agree; missing "
                                        r"hours; not in them: weekly_hours"):
        load_task(DataFiles(str(tmp_path / "private.csv"), str(public),
                            str(tmp_path / "test.csv"), label="income"))


def test_a_new_runs_setting_its_format_has_no_use_for_is_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    rng = np.random.default_rng(3)
    (tmp_path / "private.csv").write_text(census(60, rng))
    (tmp_path / "public.csv").write_text(census(30, rng))
    cfg = tmp_path / "my.toml"
    cfg.write_text('name = "mine"\n[data]\nprivate = "private.csv"\npublic = "public.csv"\n'
                   'label = "income"\nclasses = ["<=50K", ">50K"]\nimage_size = [16, 16]\n'
                   + TINY)
    assert main(["run", str(cfg), "--run", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "pate: error: [data]: an image size (--image-size, data.image_size) is for folders of "
        "images, not CSV files"]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("change", "message"), [
    ({"label": None}, "needs data.label"),
    ({"label": "salary"}, "no label column 'salary'"),
    ({"classes": ("<=50K", "unknown")},
     "labels outside the label set (<=50K, unknown; from data.classes)"),
    ({"classes": None}, "the label set is unknown"),
    ({"test": "TMP/images"}, "must be of one format, got csv (private), csv (public), folder "
                             "(test)"),
])
def test_bad_files_are_one_line(tmp_path: Path, change: dict, message: str) -> None:
    rng = np.random.default_rng(4)
    (tmp_path / "private.csv").write_text(census(50, rng))
    (tmp_path / "public.csv").write_text(census(50, rng))
    (tmp_path / "images").mkdir()
    base = {"private": str(tmp_path / "private.csv"), "public": str(tmp_path / "public.csv"),
            "label": "income", "classes": ("<=50K", ">50K")}
    change = {k: v.replace("TMP", str(tmp_path)) if isinstance(v, str) else v
              for k, v in change.items()}
    with pytest.raises(UserError, match=re.escape(message)) as info:
        load_task(DataFiles(**{**base, **change}))
    assert "\n" not in str(info.value)
    if "outside" in message:  # a private label is never named
        assert ">50K" not in str(info.value).split("(")[0]


def test_a_csv_that_is_not_utf8_says_so(tmp_path: Path) -> None:
    """UTF-16 (as some spreadsheets save) was read as bytes and refused for short rows."""
    text = census(20, np.random.default_rng(4))
    (tmp_path / "public.csv").write_text(text)
    for encoding, said in (("utf-16", "not UTF-8 text (it is UTF-16): save it as UTF-8"),
                           ("latin-1", "not UTF-8 text: save it as UTF-8")):
        body = text.replace("Masters", "Maîtrise") if encoding == "latin-1" else text
        (tmp_path / "private.csv").write_bytes(body.encode(encoding))
        with pytest.raises(UserError, match=re.escape(f"private.csv: {said}")):
            load_task(DataFiles(str(tmp_path / "private.csv"), str(tmp_path / "public.csv"),
                                label="income", classes=("<=50K", ">50K")), need_private=True)


def test_errors_about_a_private_csv_name_no_place_in_it(tmp_path: Path) -> None:
    """A public or test file's bad line is named by number; the private file's is not: the
    place of its last row is the count of records."""
    text = census(20, np.random.default_rng(6))
    lines = text.splitlines(keepends=True)
    head, last = "".join(lines[:-1]), lines[-1]
    after_age = last.split(",", 1)[1]  # the last row without its first field
    quoted = lines[0] + '"' + lines[1].rstrip("\n").replace(",", '","') + '"\n'
    bad = {"a short last line": head + after_age,
           "a short last row, in a file with quotes": quoted + "".join(lines[2:-1]) + after_age,
           "a long line": head + last.rstrip("\n") + ",7\n",
           "a carriage return inside a line": head + last.replace(",", "\r,", 1),
           "text in a numeric column": head + "old," + after_age}
    (tmp_path / "public.csv").write_text(text)
    for what, body in bad.items():
        for role in ("private", "test"):
            other = "test" if role == "private" else "private"
            (tmp_path / f"{role}.csv").write_text(body)
            (tmp_path / f"{other}.csv").write_text(text)
            with pytest.raises(UserError) as info:
                load_task(DataFiles(*(str(tmp_path / f"{r}.csv")
                                      for r in ("private", "public", "test")),
                                    label="income", classes=("<=50K", ">50K")),
                          need_private=True)
            said = str(info.value)
            assert said.startswith(str(tmp_path / f"{role}.csv")), (what, said)
            places = re.findall(r"\b(?:line|row) \d+", said)
            assert (places == []) == (role == "private"), (what, role, said)


def test_errors_and_warnings_about_a_private_npz_count_no_rows(tmp_path: Path) -> None:
    """The number of private rows is private where the teachers are dealt by record or key:
    an error or a warning about the private file says shapes without it; the public file's
    say it."""
    x, y = _images(30, np.random.default_rng(7))
    np.savez(tmp_path / "public.npz", x=x)
    np.savez(tmp_path / "private.npz", x=x, y=y[:-1])  # one label short
    with pytest.raises(UserError) as info:
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz")),
                  need_private=True)
    assert str(info.value) == (f"{tmp_path / 'private.npz'}: y must be 1-d with one label per "
                               "row of x, got fewer labels than rows")
    np.savez(tmp_path / "private.npz", x=x[..., None], y=y)
    with pytest.warns(UserWarning) as warned, pytest.raises(UserError):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz")),
                  need_private=True)
    assert str(warned[0].message).startswith(f"{tmp_path / 'private.npz'}: x: images of shape "
                                             "[8, 8, 1] look channels-last")
    for role in ("public", "private", "test"):  # feature rows
        np.savez(tmp_path / f"{role}.npz", x=x[:, 0], y=y)
    for role in ("private", "test"):
        np.savez(tmp_path / f"{role}.npz", x=np.zeros((30, 0)), y=y)
        with pytest.raises(UserError) as info:
            load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz"),
                                str(tmp_path / "test.npz")), need_private=True)
        assert str(info.value).endswith("got shape [n, 0]" if role == "private"
                                        else "got shape [30, 0]"), str(info.value)
        np.savez(tmp_path / f"{role}.npz", x=x[:, 0], y=y)


def test_shape_mismatch_and_unknown_test_class(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    x, y = _images(30, rng)
    np.savez(tmp_path / "private.npz", x=x, y=y)
    np.savez(tmp_path / "public.npz", x=x[:, :4])
    np.savez(tmp_path / "test.npz", x=x, y=np.where(y == 1, "a", "c"))
    with pytest.raises(UserError, match="differ from the public data's"):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz")),
                  need_private=True)
    np.savez(tmp_path / "public.npz", x=x[..., None])  # channels last
    with (pytest.warns(UserWarning, match=r"public\.npz: x: images of shape \[8, 8, 1\] look "
                                          r"channels-last \[H, W, C\]"),
          pytest.raises(UserError, match="differ from the public data's")):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz")))
    np.savez(tmp_path / "test.npz", x=x, y=y)
    with (pytest.warns(UserWarning, match="look channels-last"),
          pytest.raises(UserError, match=r"public\.npz: rows of shape \[8, 8, 1\] differ from "
                                         r"those of .*test\.npz and .*private\.npz, which "
                                         "agree")):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz"),
                            str(tmp_path / "test.npz")))
    features = rng.normal(size=(30, 20))  # feature rows: refused before they are standardised
    np.savez(tmp_path / "public.npz", x=features)
    np.savez(tmp_path / "private.npz", x=features[:, :19], y=y)
    with pytest.raises(UserError, match=r"private\.npz: rows of shape \[19\] differ from the "
                                        r"public data's \[20\]$"):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz")),
                  need_private=True)
    np.savez(tmp_path / "private.npz", x=x, y=y)
    np.savez(tmp_path / "test.npz", x=_images(30, rng)[0], y=np.where(y == 1, "a", "c"))
    np.savez(tmp_path / "public.npz", x=_images(30, rng)[0])
    with pytest.raises(UserError, match="unknown to the label set: c"):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz"),
                            str(tmp_path / "test.npz"), classes=("a", "b")))
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "x.png").write_bytes(b"not a png")
    with pytest.raises(UserError, match="unreadable image"):
        load_task(DataFiles(str(tmp_path / "broken"), str(tmp_path / "broken")))
    # a header claiming 2 billion pixels (a decompression bomb): refused, not a traceback
    def chunk(kind: bytes, data: bytes) -> bytes:
        return (struct.pack(">I", len(data)) + kind + data
                + struct.pack(">I", zlib.crc32(kind + data)))
    (tmp_path / "broken" / "x.png").write_bytes(
        b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 50000, 40000, 8, 0, 0, 0, 0))
        + chunk(b"IEND", b""))
    with pytest.raises(UserError, match=r"unreadable image \(DecompressionBombError\)"):
        load_task(DataFiles(str(tmp_path / "broken"), str(tmp_path / "broken")))


def test_images_too_small_for_a_models_fixed_map_are_one_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """6x6 images: HOG's blocks need 8x8 (a traceback of Ray's before), scattering 4x4; the
    check is made before the partition or any shard is written."""
    rng = np.random.default_rng(6)
    x, y = _images(60, rng)
    np.savez(tmp_path / "private.npz", x=x[:40, :6, :6], y=y[:40])
    np.savez(tmp_path / "public.npz", x=x[40:, :6, :6])
    for model, message in (("hog-scatter", "model hog-scatter needs images of at least 8x8 "
                                           "pixels (HOG's blocks of 2x2 cells of 4 pixels), "
                                           "got 6x6"),
                           ("cnn-pool-hog", "at least 8x8")):
        run = tmp_path / model
        assert main(["--quiet", "teachers", "train", "--run", str(run), "--teachers", "2",
                     "--model", model, "--private", str(tmp_path / "private.npz"),
                     "--public", str(tmp_path / "public.npz"), "--classes", "0", "1"]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
        assert not (run / "partition.json").exists() and not (run / "teachers").exists()


def test_student_by_hand_on_a_csv_without_test_data_prints_its_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Own data has no true pool labels and, here, no test file: the printed line says what it
    knows (no accuracy, no label accuracy) instead of failing after the queries were paid."""
    rng = np.random.default_rng(7)
    (tmp_path / "private.csv").write_text(census(200, rng))
    (tmp_path / "public.csv").write_text(census(150, rng))
    np.savez(tmp_path / "votes.npz", votes=rng.multinomial(20, [0.8, 0.2], size=150))
    assert main(["--quiet", "student", "train", "--run", str(tmp_path / "run"), "--votes",
                 str(tmp_path / "votes.npz"), "--private", str(tmp_path / "private.csv"),
                 "--public", str(tmp_path / "public.csv"),
                 "--label", "income", "--classes", "<=50K", ">50K", "--method", "supervised",
                 "--mechanism", "gnmax", "--sigma", "4", "--budget-epsilon", "1000",
                 "--delta", "1e-5", "--queries", "30", "--epochs", "1"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith("accuracy –  labels ") and "label accuracy" not in out, out


def test_image_folders_skip_hidden_entries_and_refuse_a_mix(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A hidden folder (.ipynb_checkpoints) is no class and no pool; loose images beside class
    subfolders are refused; a path that is not there says so; classes and sizes are checked."""
    rng = np.random.default_rng(8)
    for role in ("private", "public"):
        x, y = _images(40, rng)
        for i, (image, label) in enumerate(zip(x, y, strict=True)):
            folder = tmp_path / role / ("" if role == "public" else ["dark", "bright"][label])
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image, "L").save(folder / f"{i}.png")
        hidden = tmp_path / role / ".ipynb_checkpoints"
        hidden.mkdir()
        Image.fromarray(x[0], "L").save(hidden / "0-checkpoint.png")
    task = load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                               classes=("bright", "dark")), need_private=True)
    assert len(task.pool_x) == 40 and len(task.private_y) == 40
    Image.fromarray(x[0], "L").save(tmp_path / "private" / "loose.png")
    with pytest.raises(UserError, match="holds both images and subfolders"):
        load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                            classes=("bright", "dark")), need_private=True)
    with pytest.raises(UserError, match="no such file or folder"):
        load_task(DataFiles(str(tmp_path / "nosuchdir"), str(tmp_path / "public")))
    # a private file's name is private data: errors and warnings say where it is, not its name
    (tmp_path / "private" / "loose.png").unlink()
    (tmp_path / "private" / "dark" / "patient-jones.png").write_bytes(b"not a png")
    (tmp_path / "private" / "dark" / "notes-on-jones.txt").write_text("x")
    with pytest.warns(UserWarning) as warned, pytest.raises(UserError) as info:
        load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                            classes=("bright", "dark")), need_private=True)
    assert str(info.value) == (  # nor its place: the last one's is the class's count
        f"{tmp_path / 'private'}/dark/: an image (names and places of private files are not "
        "shown): unreadable image (UnidentifiedImageError)")
    assert [str(w.message) for w in warned] == [  # nor how many images a private class holds
        f"{tmp_path / 'private'}: entries skipped, not .png/.jpg/.jpeg images one level down "
        "(their number and names are private data, not shown)"]
    assert "jones" not in str(info.value) + str(warned[0].message)
    (tmp_path / "private" / "dark" / "patient-jones.png").unlink()
    # nor when the file cannot even be read to be hashed (here a read that fails with EIO)
    (tmp_path / "private" / "dark" / "patient-jones.png").symlink_to("/proc/self/mem")
    with pytest.raises(UserError) as info:
        load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                            classes=("bright", "dark")), need_private=True)
    assert str(info.value) == (
        f"{tmp_path / 'private'}/dark/: an image (names and places of private files are not "
        "shown): unreadable image (OSError)")
    # nor Pillow's own warnings, which quote an image's size: here one of 144 pixels over a
    # limit of 100 (over twice the limit Pillow refuses it: unreadable, as above)
    (tmp_path / "private" / "dark" / "patient-jones.png").unlink()
    Image.fromarray(np.zeros((12, 12), np.uint8), "L").save(tmp_path / "private" / "dark"
                                                             / "patient-jones.png")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.warns(UserWarning) as warned:
        load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                            classes=("bright", "dark")), need_private=True)
    said = [str(w.message) for w in warned]  # and the skipped entries', as above
    assert said[-1] == (
        f"{tmp_path / 'private'}/dark/: an image (names and places of private files are not "
        "shown): Pillow warned of it (DecompressionBombWarning)")
    assert not any("144 pixels" in line or "jones" in line for line in said)
    monkeypatch.undo()
    (tmp_path / "private" / "dark" / "patient-jones.png").unlink()
    (tmp_path / "private" / "dark" / "notes-on-jones.txt").unlink()
    with pytest.raises(UserError, match="repeat a name"):
        DataFiles("p", "q", classes=("a", "b", "a"))
    with pytest.raises(UserError, match="must be positive"):
        DataFiles("p", "q", image_size=(0, 16))
    # settings a format has no use for are refused where they come in (here the flags); from
    # Python, and for a run an older version recorded with one, they are ignored with a warning
    images = DataFiles(str(tmp_path / "private"), str(tmp_path / "public"), label="y")
    assert unused_setting_problem(images) == (
        "a label column (--label, data.label) is for CSV files; folders of images carry their "
        "labels themselves")
    with pytest.warns(UserWarning, match=r"^a label column .* themselves: ignored$"):
        assert len(load_task(images).pool_x) == 40
    assert main(["teachers", "train", "--run", str(tmp_path / "r"), "--private",
                 str(tmp_path / "private"), "--public", str(tmp_path / "public"), "--label",
                 "y"]) == 2
    assert not (tmp_path / "r").exists()
    # a size no memory holds is one line, before any image is resized (not the kernel's kill)
    with pytest.raises(UserError, match=r"public: 40 images of 100000x100000 pixels need "
                                        r"1490\.1 GiB as float32, more than the [0-9.]+ GiB"):
        load_task(DataFiles(str(tmp_path / "private"), str(tmp_path / "public"),
                            image_size=(100000, 100000)), need_private=True)
    # the private folder's says neither its count nor the memory (which would tell it)
    with pytest.raises(UserError, match=r"private: its images need more memory as float32 "
                                        r"than the [0-9.]+ GiB of memory available"):
        read_image_folder(tmp_path / "private", True, size=(100000, 100000), private=True)


def test_the_students_data_is_the_teachers_pool_wherever_its_files_lie(
        tmp_path: Path, capsys: pytest.CaptureFixture, ray_running: None) -> None:
    """The student's data flags must name the pool the teachers voted on: the same files moved
    elsewhere are (the pool's fingerprint, not its path, is compared); a pool with one row
    changed is not, and is refused before anything is asked."""
    rng = np.random.default_rng(3)
    here = tmp_path / "here"
    here.mkdir()
    (here / "private.csv").write_text(census(240, rng))
    (here / "public.csv").write_text(census(120, rng))
    run = tmp_path / "run"
    data = ["--label", "income", "--classes", "<=50K", ">50K"]
    assert main(["--quiet", "teachers", "train", "--run", str(run), "--private",
                 str(here / "private.csv"), "--public", str(here / "public.csv"), *data,
                 "--teachers", "3", "--epochs", "2", "--workers", "1"]) == 0
    assert main(["--quiet", "teachers", "votes", "--run", str(run)]) == 0
    manifest = json.loads((run / "teachers" / "manifest.json").read_text())
    with np.load(run / "votes.npz") as votes:
        assert str(votes["pool_fingerprint"]) == manifest["pool_fingerprint"]
    moved = tmp_path / "moved"
    here.rename(moved)
    student = ["--quiet", "student", "train", "--run", str(run), "--private",
               str(moved / "private.csv"), "--public", str(moved / "public.csv"), *data,
               "--mechanism", "gnmax", "--sigma", "1", "--budget-epsilon", "1000",
               "--delta", "1e-4", "--method", "supervised", "--epochs", "1"]
    assert main([*student, "--queries", "10"]) == 0
    lines = (moved / "public.csv").read_text().splitlines()
    lines[3] = lines[4]
    (moved / "public.csv").write_text("\n".join(lines) + "\n")
    assert main([*student, "--queries", "10"]) == 2
    assert "the student's pool must be theirs" in capsys.readouterr().err
    assert len(np.load(run / "labels.npz")["pool_index"]) == 10  # nothing more was asked
    moved.rename(here)  # nor is it voted on where the teachers' manifest says it lies
    assert main(["--quiet", "teachers", "votes", "--run", str(run)]) == 2
    assert "not the one the teachers were trained beside" in capsys.readouterr().err
    assert main(["--quiet", "teachers", "train", "--run", str(run), "--private",
                 str(here / "private.csv"), "--public", str(here / "public.csv"), *data,
                 "--teachers", "3", "--epochs", "2", "--workers", "1"]) == 2
    assert "not the one this run's teachers were trained beside" in capsys.readouterr().err


def test_dpsgd_learns_feature_rows_and_refuses_an_image_network_before_the_run(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """DP-SGD on a CSV trains a linear softmax on the encoded rows (the tabular default); a
    run whose DP-SGD (or comparison) would use a network for images is refused before its
    directory exists, not after the student has spent the budget."""
    rng = np.random.default_rng(3)
    for name, n in (("private", 600), ("public", 150), ("test", 200)):
        (tmp_path / f"{name}.csv").write_text(census(n, rng))
    files = ["--private", str(tmp_path / "private.csv"), "--public", str(tmp_path / "public.csv"),
             "--test", str(tmp_path / "test.csv"), "--label", "income"]
    run = tmp_path / "dp"
    assert main(["dpsgd", "train", "--run", str(run), *files, "--epsilon", "8", "--epochs",
                 "20", "--batch-size", "64", "--lr", "0.5", "--max-grad-norm", "1",
                 "--json"]) == 0
    metrics = json.loads(capsys.readouterr().out)
    assert metrics["config"]["model"] == "linear" and metrics["accuracy"] > 0.75
    assert main(["dpsgd", "train", "--run", str(tmp_path / "dp2"), *files, "--epsilon", "8",
                 "--model", "hog-linear"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model 'hog-linear' is for images" in err[0], err
    cfg = tmp_path / "my.toml"
    data = ('[data]\nprivate = "private.csv"\npublic = "public.csv"\ntest = "test.csv"\n'
            'label = "income"\n')
    cfg.write_text(f'name = "mine"\n{data}{TINY}[compare]\nenabled = true\n[dpsgd]\n'
                   'model = "tempered-cnn"\n')
    assert main(["run", str(cfg), "--run", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("pate: error: dpsgd.model 'tempered-cnn' is for images"), err
    assert not (tmp_path / "run").exists()


@pytest.mark.filterwarnings(  # small tables repeat rows by chance
    "ignore:.*some of its rows are also rows of the private data")
def test_public_or_test_rows_that_are_private_rows_are_refused_or_warned_of(
        tmp_path: Path) -> None:
    """The private file given again as the pool or the test data is refused (the pool's rows
    would reach the published student unprotected; the accuracy would be measured on training
    rows); some private rows copied in are warned of; neither says how many. Rows compare as
    the files give them: a table's categories the pool lacks do not make rows alike."""
    rng = np.random.default_rng(21)
    private, public, test = (tmp_path / f"{r}.csv" for r in ("private", "public", "test"))
    private.write_text(census(200, rng))
    public.write_text(census(120, rng))
    test.write_text(census(80, rng))
    source = DataFiles(str(private), str(public), str(test), "income")
    for role, harm in (("public", "the student trains"), ("test", "the student's accuracy")):
        with pytest.raises(UserError, match=f"private.csv: its rows are all rows of the private "
                                            f"data; {harm}"):
            load_task(DataFiles(str(private), str(private if role == "public" else public),
                                str(private if role == "test" else test), "income"))
    lines = private.read_text().splitlines()
    public.write_text("\n".join([lines[0], *lines[1:4], *public.read_text().splitlines()[1:]])
                      + "\n")
    with pytest.warns(UserWarning, match=r"public\.csv: some of its rows are also rows of the "
                                         r"private data: the student trains on the pool") as w:
        load_task(source)
    for warned in w:  # (the test rows may repeat a private row by chance: said alike)
        assert not re.search(r"\d", str(warned.message).split(":", 1)[1]), warned.message
    # images in .npz files: compared as read
    x, y = _images(30, rng)
    np.savez(tmp_path / "private.npz", x=x, y=y)
    np.savez(tmp_path / "public.npz", x=np.concatenate([x[:2], _images(20, rng)[0]]))
    with pytest.warns(UserWarning, match="some of its rows are also rows of the private data"):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz"),
                            classes=("0", "1")))
    with pytest.raises(UserError, match="its rows are all rows of the private data"):
        load_task(DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "private.npz"),
                            classes=("0", "1")))


def test_integer_labels_against_numbered_classes_say_they_are_positions(tmp_path: Path) -> None:
    """Given data.classes, integer labels are positions in it: classes named by numbers other
    than 0, 1, ... are warned of, and a label beyond the list says it is a position."""
    rng = np.random.default_rng(22)
    for role in ("private", "public", "test"):
        x, y = _images(30, rng)
        np.savez(tmp_path / f"{role}.npz", x=x, y=y + (role == "test"))  # test: 1 and 2
    source = DataFiles(*(str(tmp_path / f"{r}.npz") for r in ("private", "public", "test")),
                       classes=("1", "2"))
    with (pytest.warns(UserWarning, match=r"data.classes are numbers \(1, 2\) and the labels "
                                          r"integers: a label is a position in data.classes "
                                          r"\(label 0 is class '1'\)"),
          pytest.raises(UserError, match=r"label\(s\) unknown to the label set: 2 \(integer "
                                         r"labels are positions in data.classes, 0 to 1\)")):
        load_task(source)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # named as their positions: nothing to say
        np.savez(tmp_path / "test.npz", x=_images(30, rng)[0], y=rng.integers(0, 2, 30))
        assert load_task(replace(source, classes=("0", "1"))).classes == ("0", "1")


def test_labels_written_as_decimals_are_said_to_be(tmp_path: Path) -> None:
    """A CSV written from floats spells its labels 1.0: refused with the reason, not only as
    labels outside the set (which the test file's integer labels make 0 and 1)."""
    rng = np.random.default_rng(6)
    for role, as_float in (("private", True), ("test", False), ("public", None)):
        x = rng.normal(size=(40, 2))
        frame = pd.DataFrame({"a": x[:, 0], "b": x[:, 1]})
        if as_float is not None:
            frame["y"] = (x[:, 0] > 0).astype(float if as_float else int)
        frame.to_csv(tmp_path / f"{role}.csv", index=False)
    with pytest.raises(UserError, match=r"private\.csv: labels outside the label set \(0, 1; "
                                        r"from the test data's labels; if they are written as "
                                        r"decimals \(1\.0 for 1\), write them as the label set "
                                        r"does\)"):
        load_task(DataFiles(*(str(tmp_path / f"{r}.csv") for r in ("private", "public", "test")),
                            label="y"), need_private=True)


def test_files_of_several_formats_are_said_to_be_whatever_else_is_set(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A label column beside a private CSV and a public .npz: the formats are at fault, not
    the label column (which the public file's format alone would make look unused)."""
    rng = np.random.default_rng(7)
    (tmp_path / "private.csv").write_text(census(60, rng))
    np.savez(tmp_path / "public.npz", x=rng.normal(size=(30, 4)))
    cfg = tmp_path / "my.toml"
    cfg.write_text('name = "mine"\n[data]\nprivate = "private.csv"\npublic = "public.npz"\n'
                   'label = "income"\nclasses = ["<=50K", ">50K"]\n' + TINY)
    assert main(["run", str(cfg), "--run", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "pate: error: data.private, public and test must be of one format, got csv (private), "
        "npz (public)"]
    assert not (tmp_path / "run").exists()
