"""``Task.pool_fingerprint``: what pool indices and vote columns refer to, the same wherever the
files lie, and different once the pool's content, rows or label set change."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import numpy as np
from PIL import Image

from pate.data.files import content_digest
from pate.data.task import Benchmark, DataFiles, load_task


def _csv(path: Path, rows: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lines = ["a,b,label"] + [f"{rng.normal():.4f},{rng.normal():.4f},{rng.integers(0, 2)}"
                             for _ in range(rows)]
    path.write_text("\n".join(lines) + "\n")


def _fingerprint(folder: Path, classes: tuple[str, ...] = ("0", "1")) -> str:
    source = DataFiles(str(folder / "private.csv"), str(folder / "public.csv"),
                       label="label", classes=classes)
    return load_task(source, need_private=False).pool_fingerprint


def test_a_copied_pool_is_the_same_pool_and_an_edited_one_is_not(tmp_path: Path) -> None:
    here, there = tmp_path / "here", tmp_path / "there"
    here.mkdir()
    _csv(here / "private.csv", 40, 0)
    _csv(here / "public.csv", 30, 1)
    shutil.copytree(here, there)
    _csv(there / "private.csv", 50, 2)  # the student never reads the private file
    first = _fingerprint(here)
    assert len(first) == 64 and first == _fingerprint(there)
    assert _fingerprint(here, ("0", "1", "2")) != first  # another label set
    lines = (there / "public.csv").read_text().splitlines()
    lines[5] = lines[6]  # one row of the pool changed
    (there / "public.csv").write_text("\n".join(lines) + "\n")
    assert _fingerprint(there) != first


def test_an_image_folder_is_known_by_its_names_and_bytes(tmp_path: Path) -> None:
    pool = tmp_path / "pool"
    pool.mkdir()
    for i in range(3):
        Image.fromarray(np.full((4, 4), 40 * i, np.uint8), "L").save(pool / f"{i}.png")
    digest = content_digest(pool)
    shutil.copytree(pool, tmp_path / "copy")
    assert content_digest(tmp_path / "copy") == digest
    (pool / "2.png").rename(pool / "9.png")  # the same bytes under another name: another row
    assert content_digest(pool) != digest
    (pool / "9.png").rename(pool / os.fsdecode(b"\xff.png"))  # a name that is no UTF-8
    assert len(content_digest(pool)) == 64


def test_a_benchmark_pool_is_known_by_its_name_and_rows() -> None:
    default = load_task(Benchmark("digits"), need_private=False)
    explicit = load_task(Benchmark("digits", pool_size=len(default.pool_x)), need_private=False)
    smaller = load_task(Benchmark("digits", pool_size=len(default.pool_x) - 1),
                        need_private=False)
    assert default.pool_fingerprint == explicit.pool_fingerprint != smaller.pool_fingerprint
