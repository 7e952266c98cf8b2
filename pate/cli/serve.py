"""``pate serve``: the aggregation service over HTTP (DESIGN.md, "The aggregation service")."""

from __future__ import annotations

import argparse
import socket
import sys

from pate.aggregation.aggregators import add_mechanism_arguments


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="answer a student's label queries with an accounted aggregator",
        description="Serve labels over HTTP: the aggregator answers, every cost is committed to "
                    "the privacy ledger before the answer leaves, and the service refuses (403) "
                    "once the data-independent epsilon would exceed --budget-epsilon.")
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--run", metavar="DIR", help="run directory: DIR/votes.npz is the pool; "
                        "its trained teachers answer 'inputs' requests")
    source.add_argument("--votes", metavar="FILE", help="votes .npy, or .npz with 'votes' and "
                        "optional 'pool_index'")
    add_mechanism_arguments(p)
    p.add_argument("--budget-epsilon", type=float, required=True,
                   help="epsilon budget of the private data, all clients together")
    p.add_argument("--delta", type=float, required=True,
                   help="delta of the (epsilon, delta) budget")
    p.add_argument("--conversion", choices=("classic", "improved"), default="improved",
                   help="RDP to (epsilon, delta) for the budget (default: improved)")
    p.add_argument("--token-file", required=True, metavar="F",
                   help="bearer tokens, one per line; edit the file to add or revoke tokens")
    p.add_argument("--ledger", metavar="URL", help="SQLAlchemy URL (default: "
                   "sqlite:///DIR/ledger.db next to the votes; postgresql://... for PostgreSQL)")
    p.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default: loopback only)")
    p.add_argument("--port", type=int, default=8470, help="0 picks a free port (printed)")
    p.add_argument("--device", default="cpu", help="device of the teacher ensemble (inputs mode)")
    p.add_argument("--max-batch", type=int, default=4096, help="queries per request")
    p.add_argument("--max-body-bytes", type=int, default=16 * 2**20,
                   help="largest request body (default 16 MiB)")
    p.add_argument("--access-log", action="store_true", help="log every request's line")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn

    from pate.aggregation.aggregators import MechanismParams
    from pate.errors import UserError
    from pate.service.app import Limits, TokenStore, create_app, open_label_service

    try:
        params = MechanismParams.from_args(args)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if args.max_batch < 1 or args.max_body_bytes < 1024:
        raise UserError("--max-batch must be >= 1 and --max-body-bytes >= 1024")
    tokens = TokenStore(args.token_file)
    try:
        sock = socket.create_server((args.host, args.port))
        # Accepted connections inherit TCP_NODELAY (Linux): without it, a response written in
        # several pieces waits for the client's delayed ACK (~40 ms) after the first.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError as exc:
        raise UserError(f"cannot listen on {args.host}:{args.port}: {exc.strerror}") from None
    service = open_label_service(
        params, epsilon_budget=args.budget_epsilon, delta=args.delta, run_dir=args.run,
        votes_path=args.votes, ledger_url=args.ledger, conversion=args.conversion,
        device=args.device, limits=Limits(args.max_batch, args.max_body_bytes))
    host, port = sock.getsockname()[:2]
    budget = service.ledger.budget()
    modes = [m for m, on in (("indices", service.pool is not None),
                             ("inputs", service.ensemble is not None)) if on]
    shown = ", ".join(f"{k}={v}" for k, v in params.public().items() if k != "mechanism")
    print(f"pate serve: listening on http://{host}:{port} (docs at /docs)\n"
          f"pate serve: {params.mechanism} ({shown}); requests by {' and '.join(modes)}\n"
          f"pate serve: budget epsilon {budget.epsilon_budget:g} at delta {budget.delta:g}, "
          f"{budget.epsilon_spent:.4g} spent; basis: {budget.basis}\n"
          f"pate serve: ledger {service.ledger.url}", flush=True)
    config = uvicorn.Config(create_app(service, tokens), log_level="warning",
                            access_log=args.access_log, timeout_graceful_shutdown=10)
    try:
        uvicorn.Server(config).run(sockets=[sock])
    finally:
        service.close()
        print("pate serve: stopped", file=sys.stderr)
    return 0
