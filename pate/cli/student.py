"""``pate student train``: one query round against an aggregator, then semi-supervised training;
``pate student predict``: the trained student on new raw rows.

The aggregator is a running service (``--server URL --token-file F``) or, in this process, the
service core over a votes file (``--votes FILE``, default ``DIR/votes.npz``) with the flags of
``pate serve`` and the same ledger. The round's kind follows the mechanism (PATE 2018, §4.2-4.3):
Confident-GNMax (or GNMax, LNMax) answers pool indices; Interactive-GNMax also gets the current
student's probabilities, so it needs the student a previous round left in ``DIR/student``. Every
call adds its answers to ``DIR/labels.npz`` and trains on all of them (continuing from the saved
weights when the network is the same, for ``cnn-hog-simclr`` its pool encoder too). ``--queries 0``
with no aggregator named trains again on the answers in hand, asking and releasing nothing.

Writes ``DIR/labels.npz``, ``DIR/student/model.safetensors`` (+ ``model.json``, the network; the
GAN's generator as ``generator.safetensors``), ``DIR/student/rounds.json`` (one public record per
round), ``DIR/student/probs.npz`` (the probabilities sent to Interactive-GNMax, which its analysis
needs) and ``DIR/student/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
from typing import TYPE_CHECKING

from analysis.rdp import CONVERSIONS
from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.cli.device_flag import add_device_flag
from pate.cli.mechanism_flags import add_mechanism_flags, given_parameters, mechanism_from_flags
from pate.cli.paths import path_arg, path_text
from pate.data.augment import AUGMENTATIONS
from pate.errors import UserError
from pate.progress import progress_bar
from pate.rundir import RunDir
from student.defaults import STUDENT

if TYPE_CHECKING:
    from collections.abc import Callable

    from pate.aggregation.vote_pool import VotePool
    from student.asking import AggregatorSession


def register(subparsers: argparse._SubParsersAction) -> None:
    from student.choices import ARCHITECTURES, METHODS, SELECTIONS

    parser = subparsers.add_parser(
        "student", help="train the student on the aggregator's answers",
        description="Query rounds against the aggregator and semi-supervised training of the "
                    "student (VAT, improved GAN, or the supervised baseline).")
    sub = parser.add_subparsers(dest="student_command", required=True, metavar="COMMAND")
    p = sub.add_parser(
        "train", help="ask for labels (one round) and train the student",
        description=__doc__.split("\n\n")[1])
    p.add_argument("--run", type=path_arg, required=True, metavar="DIR")
    p.add_argument("--method", choices=METHODS, required=True)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--server", metavar="URL", help="a running `pate serve`")
    source.add_argument("--votes", type=path_arg, metavar="FILE",
                        help="aggregate in this process over a votes file (default: "
                             "DIR/votes.npz)")
    p.add_argument("--token-file", type=path_arg, metavar="F",
                   help="with --server: a file whose first token is sent (Bearer)")
    add_mechanism_flags(p, required=False)
    local = p.add_argument_group("local aggregator (with --votes)")
    local.add_argument("--budget-epsilon", type=float, help="epsilon budget of the private data")
    local.add_argument("--delta", type=float, default=1e-5)
    local.add_argument("--conversion", choices=CONVERSIONS, default="improved")
    local.add_argument("--allow-large-delta", action="store_true",
                       help="accept a delta of 1/n or more (n the run's private records)")
    local.add_argument("--ledger", type=path_text, metavar="URL",
                       help="an SQLite file or a SQLAlchemy URL (default: ledger.db next to "
                       "the votes)")
    local.add_argument("--no-sanitised-epsilon", action="store_true",
                       help="release no sanitised epsilon of the answers, only the "
                            "data-independent one (decide before asking: with few teachers "
                            "the sanitised one is the larger)")
    add_data_flags(p)
    rnd = p.add_argument_group("query round")
    rnd.add_argument("--queries", type=int, default=STUDENT.queries, help="pool rows to ask about")
    rnd.add_argument("--select", choices=SELECTIONS, default="first",
                     help="which pool rows: the first ones (default), random ones, or those the "
                          "previous student is least sure of")
    rnd.add_argument("--request-size", type=int, default=STUDENT.request_size,
                     help="queries per request")
    tr = p.add_argument_group("training")
    tr.add_argument("--arch", default=None, metavar="ARCH",
                    help=f"network: {', '.join(ARCHITECTURES)}, or your own network's import "
                         "path package.module:factory (importable from the working directory; "
                         "factory(input_shape, num_classes) -> torch.nn.Module returning "
                         "logits; not with gan); default: cnn on images, mlp on a table, the "
                         "GAN's wn-mlp discriminator")
    tr.add_argument("--width", type=int, default=STUDENT.width, help="cnn channels")
    tr.add_argument("--pool-encoder", type=path_arg, metavar="FILE",
                    help="cnn-hog-simclr: the frozen encoder learnt from the public pool "
                         "(`pate teachers train` writes RUN/teachers/pool-encoder.safetensors; "
                         "default: that of --run's teachers where they learnt one by SimCLR, "
                         "else one learnt here from the pool)")
    tr.add_argument("--encoder-epochs", type=int, default=None,
                    help="cnn-hog-simclr: SimCLR epochs of an encoder learnt here (default: the "
                         "teachers')")
    tr.add_argument("--epochs", type=int, default=STUDENT.epochs, help="passes over the pool")
    tr.add_argument("--batch-size", type=int, default=STUDENT.batch_size,
                    help="labelled examples per step")
    tr.add_argument("--unlabelled-batch-size", type=int, default=STUDENT.unlabelled_batch_size)
    tr.add_argument("--lr", type=float, default=None, help="Adam (default: per method)")
    tr.add_argument("--augment", choices=AUGMENTATIONS, default="none",
                    help="random 2-pixel shifts (and mirroring: only where labels survive it) "
                         "of every batch; on Fashion-MNIST with 500 labels and 30 epochs VAT "
                         "measured 0.817 with shift-flip, 0.823 without")
    tr.add_argument("--balance-classes", action="store_true",
                    help="oversample the rarer answered labels so every class is drawn equally "
                         "often (the aggregator answers the classes the teachers agree on more "
                         "often)")
    tr.add_argument("--vat-eps", type=float, default=STUDENT.vat_eps,
                    help="VAT: norm of the perturbation")
    tr.add_argument("--entmin", action="store_true", help="VAT: add entropy minimisation")
    tr.add_argument("--seed", type=int, default=0,
                    help="seed of initialisation and training order (offline experiments; the "
                         "aggregator's noise is never seeded)")
    add_device_flag(tr, "the student")
    tr.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(handler=run_train)

    pr = sub.add_parser(
        "predict", help="score new raw rows with a trained student (spends no privacy)",
        description="Read a file of new rows the way the student's training data were read "
                    "(student/schema.json: the public pool's scaling and vocabularies, the "
                    "image size and colour mode) and write one CSV row per input: row, label, "
                    "confidence, p_<class> for every class. Asks the aggregator nothing.")
    where = pr.add_mutually_exclusive_group(required=True)
    where.add_argument("--run", type=path_arg, metavar="DIR", help="the run whose student scores")
    where.add_argument("--student", type=path_arg, metavar="FOLDER",
                       help="a student folder (a run's student/, or Student.save's), or a run "
                            "directory")
    pr.add_argument("data", type=path_arg, metavar="DATA",
                    help="new rows in the training data's format: a .csv (a label column is "
                         "ignored), a .npz with x, or a folder of images")
    pr.add_argument("--out", type=path_arg, metavar="FILE",
                    help="write the CSV here (atomically; a link's target, in a folder that "
                         "exists; an existing file only if empty or of earlier predictions) "
                         "instead of to standard output (also: -)")
    add_device_flag(pr, "the student")
    pr.set_defaults(handler=run_predict)


def _session(args: argparse.Namespace, check_votes: Callable[[VotePool], None]
             ) -> AggregatorSession:
    """The label source the flags name (``pate.service.sessions``): the HTTP client of
    ``--server``, or the label service in this process over ``--votes`` (default the run's
    votes), which ``check_votes`` sees before the ledger opens."""
    from pate.service.sessions import local_session, remote_session

    if args.server is not None:
        if given_parameters(args) or args.budget_epsilon is not None or args.ledger:
            raise UserError("with --server the mechanism's parameters, budget and ledger are the "
                            "server's: give only --mechanism")
        if args.token_file is None:
            raise UserError("--server needs --token-file")
        return remote_session(args.server, args.token_file, args.mechanism)
    if args.budget_epsilon is None:
        raise UserError("the local aggregator needs --budget-epsilon")
    return local_session(RunDir(args.run), mechanism_from_flags(args), args.votes,
                         epsilon_budget=args.budget_epsilon, delta=args.delta,
                         ledger=args.ledger, conversion=args.conversion,
                         check_votes=check_votes, allow_large_delta=args.allow_large_delta,
                         release_sanitised=not args.no_sanitised_epsilon)


def run_train(args: argparse.Namespace) -> int:
    import httpx
    import torch

    from pate.service.client import said_url
    from student.options import StudentOptions
    from student.workflow import train_student
    from teachers.manifest import teachers_source

    if args.threads is not None:
        if args.threads < 1:
            raise UserError("--threads must be >= 1")
        try:
            torch.set_num_threads(args.threads)
        except (ValueError, RuntimeError, OverflowError):  # beyond a C int
            raise UserError(f"--threads {args.threads}: more than torch can take") from None
    options = StudentOptions(
        method=args.method, arch=args.arch, width=args.width, queries=args.queries,
        select=args.select, request_size=args.request_size, epochs=args.epochs,
        batch_size=args.batch_size, unlabelled_batch_size=args.unlabelled_batch_size,
        lr=args.lr, augment=args.augment, balance_classes=args.balance_classes,
        vat_eps=args.vat_eps, entmin=args.entmin, pool_encoder=args.pool_encoder,
        encoder_epochs=args.encoder_epochs, seed=args.seed, device=args.device)
    named = (args.server, args.votes, args.token_file, args.budget_epsilon, args.ledger,
             *given_parameters(args))
    if args.mechanism is None and (args.queries or any(v is not None for v in named)):
        raise UserError("--mechanism names the aggregator to ask (with --queries 0 and no "
                        "aggregator, the student trains again on the answers in hand)")
    run = RunDir(args.run)
    data = source_from_flags(args, teachers_source(run.root))
    with run.create().exclusive(), progress_bar(f"student {args.method}", args.epochs,
                                                  "epoch") as bar:
        try:
            metrics = train_student(run, None if args.mechanism is None
                                    else lambda check: _session(args, check), options, data,
                                    conversion=args.conversion, mechanism=args.mechanism,
                                    on_epoch=lambda _e, _loss: bar.update(1))
        except httpx.HTTPError as exc:
            kept = ("" if not run.labels.is_file() else
                    f"; the answers received so far are kept ({run.labels}): a rerun asks "
                    "--queries more rows, so give it the number still wanted, or --queries 0 "
                    "with the same --server to train on those in hand")
            raise UserError(f"cannot reach {said_url(args.server or '')}: "
                            f"{exc.__class__.__name__}{kept}") from None
    if args.json:
        print(json.dumps(metrics))
    else:
        eps = metrics["epsilon"]
        shown = ("" if eps["data_dependent_sanitised"] is None
                 else f", {eps['data_dependent_sanitised']:.3f} data-dependent (sanitised)")
        accuracy = ("accuracy –" if metrics["accuracy"] is None  # no test data
                    else f"accuracy {metrics['accuracy']:.4f}")
        labels = f"labels {metrics['labels_used']}"
        if metrics["label_accuracy"] is not None:  # the pool's true labels known (benchmarks)
            labels += f" (label accuracy {metrics['label_accuracy']:.3f})"
        carried = "" if args.mechanism else " (as the round that asked them gave)"
        print(f"{accuracy}  {labels}  epsilon {eps['data_independent']:.3f} data-independent "
              "(the ledger's, every client's queries)"
              f"{shown} at delta {eps['delta']:g}{carried}  -> {run.student_metrics}")
    return 0


def run_predict(args: argparse.Namespace) -> int:
    from student.predict import predict_file

    folder = args.student if args.student is not None else args.run  # either form, both
    to_stdout = args.out is None or str(args.out) == "-"
    scored = predict_file(folder, args.data, None if to_stdout else args.out, args.device)
    if to_stdout:
        print(scored.to_csv(index=False), end="")
    else:
        print(f"{len(scored)} rows scored -> {args.out}")
    return 0
