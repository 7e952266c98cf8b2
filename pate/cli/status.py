"""``pate status``: a run's stages and privacy budget (``pate.status``)."""

from __future__ import annotations

import argparse
import json

from pate.cli.paths import path_arg
from pate.status import run_status


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "status", help="a run's stages and the privacy budget spent and left",
        description="The stages of a run directory (done, running or stopped, pending) and "
                    "its ledger's budget: the data-independent epsilon spent and left. Works "
                    "while the run goes on.")
    p.add_argument("--run", type=path_arg, required=True, metavar="DIR")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    status = run_status(args.run)
    if args.json:
        print(json.dumps(status))
        return 0
    print(f"run {status['run']}" + (f" ({status['name']})" if status["name"] else ""))
    for s in status["stages"]:
        seconds = f" ({s['seconds']:.1f} s)" if "seconds" in s else ""
        trained = ("" if "trained" not in s
                   else f", {s['trained']} of {s['teachers']} teachers trained")
        print(f"  {s['stage']:<20} {s['state']}{trained}{seconds}")
    networks = [f"{whose} {name}" for whose, name in status["networks"].items() if name]
    if networks:
        print(f"  networks: {', '.join(networks)}")
    b = status["budget"]
    if b is None and status["answers_in_hand"]:
        print("  budget: no ledger here, though answers were charged to one (it is elsewhere: "
              "--ledger or beside the votes, or it is missing)")
    elif b is None:
        print("  budget: no ledger yet")
    elif "unreadable" in b:
        why, ledger = b["unreadable"], b["ledger"]  # the reason names the ledger, or not
        print(f"  budget: its ledger cannot be read here: "
              f"{why if ledger in why else f'{ledger}: {why}'}")
    else:
        print(f"  budget: epsilon {b['epsilon_spent']:.4g} spent of {b['epsilon_budget']:g}, "
              f"{b['epsilon_left']:.4g} left, at delta {b['delta']:g} (data-independent); "
              f"{b['queries']} queries, {b['answered']} answered")
        if b["other_ledgers"]:
            print(f"  the same private data is also charged to {len(b['other_ledgers'])} other "
                  f"ledger(s), whose budgets add up with this one: "
                  f"{', '.join(b['other_ledgers'])}")
    quoted = status["epsilon_to_quote"]
    if quoted:
        print(f"  epsilon to quote: {quoted['epsilon']:.4g} at delta {quoted['delta']:g} "
              f"({quoted['figure']}; the report says what it rests on)")
        if quoted.get("above_budget"):
            print(f"  {quoted['above_budget']}")
    if status["last_log"]:
        print(f"  last: {status['last_log']}")
    return 0
