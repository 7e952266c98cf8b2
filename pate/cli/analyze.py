"""``pate analyze``: privacy analysis of a votes file (docs/cli.md)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING

from analysis.orders import MAX_FIXED_ORDER
from analysis.rdp import CONVERSIONS
from pate.cli.mechanism_flags import add_mechanism_flags, mechanism_from_flags
from pate.cli.paths import path_text
from pate.errors import UserError

if TYPE_CHECKING:
    from analysis.votes_analysis import PrivacyAnalysis


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze", help="privacy analysis of a votes file",
        description="Data-independent, data-dependent and smooth-sensitivity-sanitised epsilon of "
                    "answering every row of a votes matrix, as PATE 2018's Table 2 analysis does "
                    "(threshold step paid on every query, GNMax weighted by the probability of "
                    "answering).")
    p.add_argument("--votes", type=path_text, required=True, metavar="FILE",
                   help=".npy or .npz (key 'votes') int matrix [queries, classes]")
    p.add_argument("--delta", required=True, type=float, help="target delta, in (0, 1)")
    add_mechanism_flags(p, costed_only=True)
    p.add_argument("--baseline", type=path_text, metavar="FILE",
                   help="interactive only: num_teachers * student_probs, same shape as votes")
    p.add_argument("--queries", type=int, help="analyse only the first N rows")
    p.add_argument("--asked", type=path_text, metavar="FILE",
                   help="analyse only the rows a student asked about, in its order: its run's "
                        "labels.npz (key 'pool_index') or a .npy of pool indices, found through "
                        "the votes file's 'pool_index' (row numbers without one); every row must "
                        "have gone to the aggregator described here")
    p.add_argument("--order", type=float, help="fix the Rényi order (default: best of the grid)")
    p.add_argument("--beta", type=float,
                   help="fix the smooth-sensitivity beta (default: optimised)")
    p.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                   help="RDP to (epsilon, delta): classic (Mironov 2017, as PATE 2018 reports) or "
                        "improved (Canonne et al. 2020; default)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(handler=run)


def _check_args(args: argparse.Namespace) -> None:
    if not 0.0 < args.delta < 1.0:
        raise UserError(f"--delta must be in (0, 1), got {args.delta:g}")
    if args.order is not None and not 1.0 < args.order <= MAX_FIXED_ORDER:
        raise UserError(f"--order must be in (1, {MAX_FIXED_ORDER:g}], got {args.order:g} (past "
                        "a million the conversion's term in log(1/delta) is gone: no bound "
                        "gains)")
    if args.beta is not None and not args.beta >= 0.0:
        raise UserError(f"--beta must be >= 0, got {args.beta:g}")
    if args.queries is not None and args.queries < 1:
        raise UserError(f"--queries must be >= 1, got {args.queries}")
    if args.queries is not None and args.asked is not None:
        raise UserError("give --queries or --asked, not both")


def run(args: argparse.Namespace) -> int:
    _check_args(args)
    from pate.analyze import analyze_votes_file

    # Interactive-GNMax's gamma does not enter the cost: the analysis takes no --gamma.
    result = analyze_votes_file(
        args.votes, mechanism_from_flags(args, costed_only=True), args.delta,
        queries=args.queries, asked_path=args.asked, baseline_path=args.baseline,
        order=args.order, beta=args.beta, conversion=args.conversion)
    if args.json:
        json.dump(result.to_json(), sys.stdout)
        sys.stdout.write("\n")
    else:
        sys.stdout.write(format_analysis(result))
    return 0


def format_analysis(r: PrivacyAnalysis) -> str:
    """A short human-readable summary of an analysis result."""
    thresholded = any(name in r.mechanism.split("+") for name in ("confident", "interactive"))
    lines = [
        "computed from the private votes: every figure below is private (publish only the "
        "data-independent epsilon of the counts answered, or a sanitised one as released)",
        f"{r.mechanism}: {r.queries} queries, {r.teachers} teachers, "
        f"{r.classes} classes, expected answered {r.expected_answered:.1f}",
        f"epsilon at delta={r.delta:g} ({r.conversion} conversion):",
        f"  data-independent   {r.data_independent.epsilon:.4f} "
        f"(order {r.data_independent.order:g}"
        f"{'; expected over the threshold: depends on the votes' if thresholded else ''})",
        f"  data-dependent     {r.data_dependent.epsilon:.4f} "
        f"(order {r.data_dependent.order:g}; not releasable as is)",
    ]
    ss = r.smooth_sensitivity
    if ss and ss.fallback:
        lines.append(f"  smooth-sensitivity {ss.epsilon:.4f} (order {ss.order:g}; conditions "
                     "C5/C6 fail: the data-independent bound of every query answered)")
    elif ss:
        lines.append(f"  smooth-sensitivity {ss.epsilon:.4f} (beta {ss.beta:.4g}, "
                     f"SS {ss.value:.4g}, release cost {ss.rdp_cost:.4g}; before its noise)")
    return "\n".join(lines) + "\n"
