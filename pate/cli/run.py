"""``pate run``: the whole pipeline from a preset or a config file."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from pate.cli.paths import path_arg


def register(subparsers: argparse._SubParsersAction) -> None:
    from pate.config import preset_names

    p = subparsers.add_parser(
        "run", help="the whole pipeline: teachers, votes, service, student, report",
        description="Partition -> teachers -> votes -> a real HTTP aggregation service on "
                    "loopback -> student query rounds -> analysis -> report, in one run "
                    "directory. A stage already finished is skipped on rerun. Presets: "
                    f"{', '.join(preset_names())}; or a config .toml (docs/cli.md).")
    p.add_argument("config", metavar="PRESET_OR_TOML", help="preset name or config .toml")
    p.add_argument("--run", type=path_arg, metavar="DIR",
                   help="run directory (default: runs/<config name>)")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from pate.config import load_config

    config = load_config(args.config)  # a bad config is said before torch and Ray load

    from pate.pipeline import run_pipeline
    from pate.report.content import public_rows
    from pate.rundir import RunDir

    run_dir = Path(args.run) if args.run else Path("runs") / config.name
    start = time.monotonic()
    report = run_pipeline(config, run_dir)
    written = RunDir(run_dir).read_json(RunDir(run_dir).report_json)
    print(json.dumps({"run": str(run_dir), "report": str(report),
                      "seconds": round(time.monotonic() - start, 1),
                      "summary": public_rows(written["table"]),
                      # which figure the rows' epsilon_to_quote is (docs/privacy-math.md §12)
                      "epsilon_to_quote": written.get("epsilon_to_quote")}))
    return 0
