"""``pate serve``: the aggregation service over HTTP (docs/design.md, "The aggregation
service")."""

from __future__ import annotations

import argparse
import sys

from analysis.rdp import CONVERSIONS
from pate.cli.device_flag import add_device_flag
from pate.cli.mechanism_flags import add_mechanism_flags, mechanism_from_flags
from pate.cli.paths import path_arg, path_text


def _port(value: str) -> int:
    """argparse type: a TCP port, 0 to 65535."""
    try:
        port = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"a port is a number, 0 to 65535, got {value!r}"
                                         ) from None
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"a port is 0 to 65535, got {port}")
    return port


def _host(value: str) -> str:
    """argparse type: an address to listen on; an empty one (an unset ``$HOST``) is refused,
    as the server would take it for every interface, not the loopback of the default."""
    if not value.strip():
        raise argparse.ArgumentTypeError("an address to listen on, not an empty one (which "
                                         "would listen on every interface): 127.0.0.1 for "
                                         "this machine only, 0.0.0.0 for every interface")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="answer a student's label queries with an accounted aggregator",
        description="Serve labels over HTTP: the aggregator answers, every cost is committed to "
                    "the privacy ledger before the answer leaves, and the service refuses (403) "
                    "once the data-independent epsilon would exceed --budget-epsilon.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", type=path_arg, metavar="DIR",
                        help="run directory: DIR/votes.npz is the pool; its trained teachers "
                             "answer 'inputs' requests")
    source.add_argument("--votes", type=path_text, metavar="FILE",
                        help="votes .npy, or .npz with 'votes' and optional 'pool_index'")
    add_mechanism_flags(p)
    p.add_argument("--budget-epsilon", type=float, required=True,
                   help="epsilon budget of the private data, all clients together")
    p.add_argument("--delta", type=float, required=True,
                   help="delta of the (epsilon, delta) budget")
    p.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                   help="RDP to (epsilon, delta) for the budget (default: improved)")
    p.add_argument("--allow-large-delta", action="store_true",
                   help="accept a delta of 1/n or more (n the run's private records)")
    p.add_argument("--token-file", type=path_text, required=True, metavar="F",
                   help="bearer tokens, one per line; edit the file to add or revoke tokens")
    p.add_argument("--ledger", type=path_text, metavar="URL",
                   help="an SQLite file or a SQLAlchemy URL (default: DIR/ledger.db next to the "
                        "votes; postgresql://... for PostgreSQL)")
    p.add_argument("--host", type=_host, default="127.0.0.1",
                   help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=_port, default=8470, help="0 picks a free port (printed)")
    add_device_flag(p, "the teacher ensemble (inputs mode)")
    p.add_argument("--max-batch", type=int, default=4096,
                   help="queries per request (default 4096, at most 8192)")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="largest request body (default: what --max-batch queries need)")
    p.add_argument("--body-timeout", type=float, default=10.0, metavar="S",
                   help="seconds a request's body may take to arrive (default 10)")
    p.add_argument("--requests-per-s", type=float, default=2000.0, metavar="R",
                   help="requests per second per client, per replica (default 2000)")
    p.add_argument("--labels-per-min", type=float, default=60e6, metavar="L",
                   help="labels per minute per client, per replica (default 60 million)")
    p.add_argument("--access-log", action="store_true", help="log every request's line")
    p.add_argument("--docs", action="store_true",
                   help="serve the interactive /docs page (loads its scripts from a CDN; "
                        "the schema is always at /openapi.json)")
    p.add_argument("--allow-shared-token-file", action="store_true",
                   help="accept a token file that other users may read")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from analysis.mechanisms import parameters_text
    from pate.aggregation.label_requests import Limits
    from pate.rundir import RunDir
    from pate.service.server import open_server

    mechanism = mechanism_from_flags(args)
    server = open_server(
        mechanism, token_file=args.token_file, epsilon_budget=args.budget_epsilon,
        delta=args.delta, run_dir=args.run, votes_path=args.votes, ledger=args.ledger,
        conversion=args.conversion, host=args.host, port=args.port, device=args.device,
        limits=Limits(args.max_batch, args.max_body_bytes, args.body_timeout,
                      args.requests_per_s, args.labels_per_min),
        access_log=args.access_log, docs=args.docs,
        world_readable_tokens=args.allow_shared_token_file,
        # a votes file alone does not say how many records it protects
        private_records=None if args.run is None else RunDir(args.run).private_records(),
        allow_large_delta=args.allow_large_delta)
    service = server.service
    budget = service.ledger.budget()
    modes = [m for m, on in (("indices", service.pool is not None),
                             ("inputs", service.ensemble is not None)) if on]
    print(f"pate serve: listening on {server.url} (OpenAPI schema at /openapi.json)\n"
          f"pate serve: {mechanism.name} ({parameters_text(mechanism)}); requests by "
          f"{' and '.join(modes)}\n"
          f"pate serve: budget epsilon {budget.epsilon_budget:g} at delta {budget.delta:g}, "
          f"{budget.epsilon_spent:.4g} spent; basis: {budget.basis}\n"
          f"pate serve: ledger {service.ledger.url}", flush=True)
    try:
        server.run()
    finally:
        server.close()
        print("pate serve: stopped", file=sys.stderr)
    return 0
