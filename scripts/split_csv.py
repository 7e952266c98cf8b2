"""Split one CSV file at random, reproducibly, into parts (by default ``private.csv``,
``public.csv`` and ``test.csv``, the three files of a config's ``[data]`` section; docs/cli.md,
"Your own data").

The rows are shuffled with numpy's generator seeded by ``--seed`` and cut in the proportions of
``--fractions`` (largest-remainder rounding, so the parts add up to every row). Fields are read
with Python's ``csv`` module, leading and trailing spaces removed (UCI's ``adult.data`` separates
its fields with ", " and ends its header with a space), blank lines dropped, and written back as
plain CSV with the header row in every part; the values themselves (``?`` for a missing one
included) are kept as they are. Every part is written whole or not at all (a temporary file,
then renamed) and readable by its owner only (0600): all of them are rows of the private table
until you decide to publish one. Nothing is fetched: the input is a local file.

    python scripts/split_csv.py adult.csv --out DIR [--fractions 0.83 0.09 0.08] \
        [--names private public test] [--seed 0]
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import sys
from pathlib import Path

import numpy as np

from pate.io import write_bytes_atomic


def read_rows(path: Path) -> tuple[list[str], list[list[str]]]:
    """The header and the non-blank rows of a CSV file, each field stripped of spaces."""
    with path.open(newline="", encoding="utf-8") as f:
        rows = [[field.strip() for field in row] for row in csv.reader(f, skipinitialspace=True)]
    rows = [row for row in rows if any(row)]
    if not rows:
        raise ValueError(f"{path}: no header row")
    header, body = rows[0], rows[1:]
    bad = [i for i, row in enumerate(body, start=2) if len(row) != len(header)]
    if bad:
        raise ValueError(f"{path}: {len(bad)} row(s) without {len(header)} fields "
                         f"(first at data row {bad[0]})")
    return header, body


def part_sizes(n: int, fractions: list[float]) -> list[int]:
    """Row counts in the proportions of ``fractions`` adding up to ``n`` (largest remainder)."""
    shares = np.asarray(fractions, dtype=np.float64)
    if (shares <= 0).any():
        raise ValueError("every fraction must be positive")
    exact = n * shares / shares.sum()
    sizes = np.floor(exact).astype(np.int64)
    order = np.argsort(-(exact - sizes), kind="stable")
    sizes[order[: n - int(sizes.sum())]] += 1
    return [int(s) for s in sizes]


def split(rows: list[list[str]], fractions: list[float], seed: int) -> list[list[list[str]]]:
    """The rows shuffled with ``numpy.random.default_rng(seed)`` and cut into parts."""
    order = np.random.default_rng(seed).permutation(len(rows))
    bounds = np.cumsum([0, *part_sizes(len(rows), fractions)])
    return [[rows[i] for i in order[a:b]] for a, b in itertools.pairwise(bounds)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("csv", type=Path, help="the CSV file to split (header row first)")
    parser.add_argument("--out", type=Path, required=True, help="folder the parts are written to")
    parser.add_argument("--fractions", type=float, nargs="+", default=[0.83, 0.09, 0.08],
                        help="the parts' shares of the rows, normalised to sum to 1 "
                             "[0.83 0.09 0.08]")
    parser.add_argument("--names", nargs="+", default=["private", "public", "test"],
                        help="the parts' file names, without .csv [private public test]")
    parser.add_argument("--seed", type=int, default=0, help="seed of the shuffle [0]")
    args = parser.parse_args(argv)
    if len(args.names) != len(args.fractions):
        parser.error(f"{len(args.fractions)} fractions but {len(args.names)} names")
    try:
        header, rows = read_rows(args.csv)
        parts = split(rows, args.fractions, args.seed)
    except (OSError, ValueError) as exc:
        print(f"split_csv: error: {exc}", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    for name, part in zip(args.names, parts, strict=True):
        path = args.out / f"{name}.csv"
        text = io.StringIO(newline="")
        writer = csv.writer(text)
        writer.writerow(header)
        writer.writerows(part)
        write_bytes_atomic(path, text.getvalue().encode(), private=True)
        print(f"{path}: {len(part)} rows")
    return 0


if __name__ == "__main__":
    sys.exit(main())
