"""The command line's data flags: a built-in dataset (``--dataset``, ``--data-dir``,
``--pool-size``) or a user's files (``--private``, ``--public``, ``--test``, ``--label``,
``--classes``, ``--key``, ``--image-size``), read into one ``pate.data.task.DataSource``
(docs/cli.md, "Your own data")."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from pate.cli.paths import path_text
from pate.data.datasets import (
    DEFAULT_DATASET,
    LOADERS,
    data_dir_problem,
    dataset_name_problem,
)
from pate.data.task import Benchmark, DataFiles, DataSource, unused_setting_problem
from pate.errors import UserError


def add_data_flags(parser: argparse.ArgumentParser, *, files: bool = True) -> None:
    """The data flags, in a group of their own."""
    group = parser.add_argument_group("data (a built-in dataset, or your own files)")
    group.add_argument("--dataset", default=None,
                       help=f"{', '.join(sorted(LOADERS))} (default: the run's teachers', "
                            f"else {DEFAULT_DATASET})")
    group.add_argument("--data-dir", type=path_text, default=None,
                       help="where the dataset's files are")
    group.add_argument("--pool-size", type=int, default=None,
                       help="rows of the test split in the public pool (default: half)")
    if not files:
        return
    group.add_argument("--private", type=path_text, metavar="PATH",
                       help="your private labelled data: .npz (x, y), .csv or a folder of class "
                            "subfolders of images")
    group.add_argument("--public", type=path_text, metavar="PATH",
                       help="your public unlabelled pool, in the same format")
    group.add_argument("--test", type=path_text, metavar="PATH",
                       help="labelled evaluation data, in the same format (optional)")
    group.add_argument("--label", help="a .csv's label column")
    group.add_argument("--classes", nargs="+", metavar="C",
                       help="the label set (public schema; default: the test labels)")
    group.add_argument("--image-size", type=int, nargs=2, metavar=("H", "W"),
                       help="folders of images: the height and width every image is resized "
                            "to (default: the first public image's)")
    group.add_argument("--key", metavar="COLUMN",
                       help="a .csv's column naming whose each row is (a person's id): never a "
                            "feature; the teachers deal the rows by it (--partition key)")


def source_from_flags(args: argparse.Namespace, default: DataSource | None = None
                      ) -> DataSource:
    """The source the flags name; without any, ``default`` (the run's teachers' data; for a
    built-in dataset ``--data-dir`` and ``--pool-size`` apply to it), else the default
    dataset. Mixing a dataset with files is an error."""
    given_files = [getattr(args, k, None) for k in ("private", "public", "test", "label",
                                                    "classes", "key", "image_size")]
    if any(v is not None for v in given_files):
        if args.dataset is not None or args.pool_size is not None:
            raise UserError("give --dataset (a built-in dataset) or --private/--public (your "
                            "files), not both")
        if not (args.private and args.public):
            raise UserError("your own data needs --private and --public")
        # absolute, as a config's: a run's manifest keeps them for commands run elsewhere
        private, public, test = (None if p is None else str(Path(p).resolve())
                                 for p in (args.private, args.public, args.test))
        source = DataFiles(private, public, test, args.label,
                           None if args.classes is None else tuple(args.classes),
                           None if args.image_size is None else tuple(args.image_size),
                           key=args.key)
        problem = unused_setting_problem(source)
        if problem:
            raise UserError(problem)
        return source
    if args.dataset is None and default is not None and not isinstance(default, Benchmark):
        if args.pool_size is not None or args.data_dir is not None:
            raise UserError("--pool-size and --data-dir are for a built-in dataset; the "
                            "run's data are your files")
        return default
    base = (default if args.dataset is None and isinstance(default, Benchmark)
            else Benchmark(DEFAULT_DATASET if args.dataset is None else args.dataset))
    problem = dataset_name_problem(base.name) or data_dir_problem(base.name, args.data_dir)
    if problem:
        raise UserError(problem)
    return replace(base, data_dir=base.data_dir if args.data_dir is None
                   else str(Path(args.data_dir).resolve()),
                   pool_size=base.pool_size if args.pool_size is None else args.pool_size)
