"""``pate audit mechanism``: an empirical privacy audit of the aggregators (``pate.audit``)."""

from __future__ import annotations

import argparse
import json

from analysis.mechanisms import MECHANISMS
from analysis.rdp import CONVERSIONS
from pate.audit.mechanism import (
    DEFAULT_CONFIDENCE,
    DEFAULT_DELTA,
    DEFAULT_DRAWS,
    MechanismAudit,
    audit_mechanisms,
)
from pate.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit", help="empirical privacy audits",
        description="Empirical privacy audits: statistical lower bounds on epsilon and tests of "
                    "the noise, set against the analytic upper bounds.")
    sub = parser.add_subparsers(dest="audit", required=True, metavar="AUDIT")
    mech = sub.add_parser(
        "mechanism", help="audit the aggregators' noise and privacy loss",
        description="Run each aggregator many times on neighbouring vote histograms, derive a "
                    "lower bound on its per-query epsilon (Clopper-Pearson, Bonferroni; "
                    "Jagielski et al. 2020, Nasr et al. 2021, Bichsel et al. 2021) and test its "
                    "noise (fit, independence). Exits 1 when a lower bound exceeds the analytic "
                    "upper bound (a privacy bug) or a noise test fails. The parameters are the "
                    "defaults of pate.audit.mechanism (per-query bound near 1).")
    mech.add_argument("--mechanism", nargs="+", choices=tuple(MECHANISMS), metavar="M",
                      help=f"mechanisms to audit, of {', '.join(MECHANISMS)} (default: all)")
    mech.add_argument("--draws", type=int, default=DEFAULT_DRAWS, metavar="N",
                      help=f"answers per histogram, half to search, half to estimate "
                           f"(default: {DEFAULT_DRAWS})")
    mech.add_argument("--delta", type=float, default=DEFAULT_DELTA, metavar="D",
                      help=f"delta of both bounds (default: {DEFAULT_DELTA:g})")
    mech.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, metavar="C",
                      help=f"confidence of the lower bound (default: {DEFAULT_CONFIDENCE:g})")
    mech.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                      help="RDP to (epsilon, delta) conversion of the upper bound "
                           "(default: improved)")
    mech.add_argument("--paper", action="store_true",
                      help="also audit at the papers' parameters (reported, not relied on: "
                           "there 10^6 draws cannot tell sigma from sigma / 2)")
    mech.add_argument("--json", action="store_true", help="print one JSON object")
    mech.set_defaults(handler=run_mechanism)


def _line(audit: MechanismAudit) -> str:
    verdict = "pass" if audit.passed else "FAIL: " + "; ".join(audit.failures)
    if not audit.powered:
        verdict += " (papers' parameters: not powered, not relied on)"
    return (f"{audit.mechanism.name:<12} epsilon lower {audit.epsilon_lower:.4f}  upper "
            f"{audit.epsilon_upper:.4f} (data-independent), {audit.epsilon_upper_dependent:.4f} "
            f"(data-dependent at the pair)  {audit.seconds:.1f} s  {verdict}")


def run_mechanism(args: argparse.Namespace) -> int:
    try:
        audits = audit_mechanisms(args.mechanism, draws=args.draws, delta=args.delta,
                                  confidence=args.confidence, conversion=args.conversion,
                                  paper=args.paper)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    passed = all(a.passed for a in audits)
    if args.json:
        print(json.dumps({"passed": passed, "mechanisms": [a.to_dict() for a in audits]}))
    else:
        print(f"delta = {args.delta:g}, confidence {args.confidence:g}, {args.draws} draws per "
              f"histogram, {args.conversion} conversion")
        for a in audits:
            print(_line(a))
    return 0 if passed else 1
