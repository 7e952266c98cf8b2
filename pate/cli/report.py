"""``pate report``: the privacy-utility report of a run, or a comparison of several runs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from pate.cli.paths import path_arg, path_text
from pate.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="privacy-utility report of a run (or compare runs)",
        description="Writes report/report.json, report/report.html (self-contained) and "
                    "report/figures/*.png for a run directory; with --runs, a comparison of "
                    "several runs under --out.")
    group = p.add_mutually_exclusive_group(required=True)
    group.add_argument("--run", type=path_arg, metavar="DIR", help="run directory")
    group.add_argument("--runs", type=path_text, metavar="DIR", nargs="+",
                       help="run directories to compare (two or more)")
    p.add_argument("--out", type=path_text, metavar="DIR",
                   help="where --runs writes its comparison (default: ./report-comparison); a "
                        "run's own report is always DIR/report")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pate.report.run_report import write_comparison, write_run_report

    if args.run:
        if args.out is not None:
            raise UserError("--out is for --runs: a run's report is written in its own "
                            f"directory, {Path(args.run) / 'report'}")
        path = write_run_report(Path(args.run))
    else:
        if len(args.runs) < 2:
            raise UserError("--runs needs at least two run directories")
        path = write_comparison([Path(r) for r in args.runs],
                                Path(args.out or "report-comparison"))
    print(json.dumps({"report": str(path)}))
    return 0
