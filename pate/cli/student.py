"""``pate student train``: one query round against an aggregator, then semi-supervised training.

The aggregator is a running service (``--server URL --token-file F``) or, in this process, the
service core over a votes file (``--votes FILE``, default ``DIR/votes.npz``) with the flags of
``pate serve`` and the same ledger. The round's kind follows the mechanism (PATE 2018, §4.2-4.3):
Confident-GNMax (or GNMax, LNMax) answers pool indices; Interactive-GNMax also gets the current
student's probabilities, so it needs the student a previous round left in ``DIR/student``. Every
call adds its answers to ``DIR/labels.npz`` and trains on all of them (continuing from the saved
weights when the network is the same, for ``cnn-hog-simclr`` its pool encoder too); ``--queries 0``
only retrains.

Writes ``DIR/labels.npz``, ``DIR/student/model.safetensors`` (+ ``model.json``, the network; the
GAN's generator as ``generator.safetensors``), ``DIR/student/rounds.json`` (one public record per
round), ``DIR/student/probs.npz`` (the probabilities sent to Interactive-GNMax, which its analysis
needs) and ``DIR/student/metrics.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from pate.cli.mechanism_flags import add_mechanism_flags, given_parameters, mechanism_from_flags
from pate.data.augment import AUGMENTATIONS
from pate.errors import UserError


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
    p.add_argument("--run", type=Path, required=True, metavar="DIR")
    p.add_argument("--method", choices=METHODS, required=True)
    source = p.add_mutually_exclusive_group()
    source.add_argument("--server", metavar="URL", help="a running `pate serve`")
    source.add_argument("--votes", type=Path, metavar="FILE",
                        help="aggregate in this process over a votes file (default: "
                             "DIR/votes.npz)")
    p.add_argument("--token-file", type=Path, metavar="F", help="with --server: bearer token")
    add_mechanism_flags(p)
    local = p.add_argument_group("local aggregator (with --votes)")
    local.add_argument("--budget-epsilon", type=float, help="epsilon budget of the private data")
    local.add_argument("--delta", type=float, default=1e-5)
    local.add_argument("--conversion", choices=("classic", "improved"), default="improved")
    local.add_argument("--ledger", metavar="URL",
                       help="SQLAlchemy URL (default: sqlite:///ledger.db next to the votes)")
    data = p.add_argument_group("data")
    data.add_argument("--dataset", default="fashion-mnist")
    data.add_argument("--data-dir", type=Path, default=None)
    data.add_argument("--pool-size", type=int, default=None,
                      help="rows of the test split in the public pool (default: half)")
    rnd = p.add_argument_group("query round")
    rnd.add_argument("--queries", type=int, default=1000, help="pool rows to ask about")
    rnd.add_argument("--select", choices=SELECTIONS, default="first")
    rnd.add_argument("--request-size", type=int, default=512, help="queries per request")
    tr = p.add_argument_group("training")
    tr.add_argument("--arch", choices=ARCHITECTURES, default=None,
                    help="network (default: cnn; the GAN's wn-mlp discriminator)")
    tr.add_argument("--width", type=int, default=32, help="cnn channels")
    tr.add_argument("--pool-encoder", type=Path, metavar="FILE",
                    help="cnn-hog-simclr: the frozen encoder learnt from the public pool "
                         "(`pate teachers train` writes RUN/teachers/pool-encoder.safetensors; "
                         "default: that of --run's teachers, else one learnt here from the pool)")
    tr.add_argument("--encoder-epochs", type=int, default=None,
                    help="cnn-hog-simclr: SimCLR epochs of an encoder learnt here (default: the "
                         "teachers')")
    tr.add_argument("--epochs", type=int, default=30, help="passes over the pool")
    tr.add_argument("--batch-size", type=int, default=32, help="labelled examples per step")
    tr.add_argument("--unlabelled-batch-size", type=int, default=128)
    tr.add_argument("--lr", type=float, default=None, help="Adam (default: per method)")
    tr.add_argument("--augment", choices=AUGMENTATIONS, default="none",
                    help="random 2-pixel shifts (and mirroring: only where labels survive it) "
                         "of every batch; on Fashion-MNIST with 500 labels and 30 epochs VAT "
                         "measured 0.817 with shift-flip, 0.823 without")
    tr.add_argument("--balance-classes", action="store_true",
                    help="oversample the rarer answered labels so every class is drawn equally "
                         "often (the aggregator answers the classes the teachers agree on more "
                         "often)")
    tr.add_argument("--vat-eps", type=float, default=2.0, help="VAT: norm of the perturbation")
    tr.add_argument("--entmin", action="store_true", help="VAT: add entropy minimisation")
    tr.add_argument("--seed", type=int, default=0,
                    help="seed of initialisation and training order (offline experiments; the "
                         "aggregator's noise is never seeded)")
    tr.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    tr.add_argument("--threads", type=int, default=None,
                    help="torch CPU threads (default: torch's; 1 is fastest on a busy machine)")
    p.add_argument("--json", action="store_true", help="print the metrics as JSON")
    p.set_defaults(handler=run_train)


def _open_source(args: argparse.Namespace) -> tuple[Any, Any]:
    """(label source, votes pool or None): the HTTP client, or the in-process service."""
    from pate.aggregation.label_service import InProcessLabels
    from pate.service.client import LabelClient

    if args.server:
        given = given_parameters(args)
        if given or args.budget_epsilon is not None or args.ledger:
            raise UserError("with --server the mechanism's parameters, budget and ledger are the "
                            "server's: give only --mechanism")
        if args.token_file is None:
            raise UserError("--server needs --token-file")
        try:
            return LabelClient.from_token_file(args.server, args.token_file), None
        except (OSError, ValueError) as exc:
            raise UserError(f"{args.token_file}: {exc}") from None
    from pate.aggregation.label_service import open_label_service

    votes = args.votes or args.run / "votes.npz"
    if not votes.is_file():
        raise UserError(f"{votes}: no votes file (give --votes FILE or --server URL)")
    if args.budget_epsilon is None:
        raise UserError("the local aggregator needs --budget-epsilon")
    service = open_label_service(mechanism_from_flags(args),
                                 epsilon_budget=args.budget_epsilon, delta=args.delta,
                                 votes_path=votes, ledger_url=args.ledger,
                                 conversion=args.conversion)
    return InProcessLabels(service), service


def _votes_pool_index(path: Path) -> Any:
    """The pool rows a votes file covers: its ``pool_index`` (public), else 0..rows-1."""
    import numpy as np

    data = np.load(path, allow_pickle=False)
    if isinstance(data, np.ndarray):
        return np.arange(len(data))
    with data:
        if "pool_index" in data.files:
            return np.sort(data["pool_index"].astype(np.int64))
        return np.arange(len(data[data.files[0]]))


def _record_round(out: Path, args: argparse.Namespace, service: Any, got: Any,
                  probs: Any) -> list[dict[str, Any]]:
    """Append this round to ``out/rounds.json`` (public: the mechanism and its parameters, the
    selection, the counts) and the probabilities sent to Interactive-GNMax to ``out/probs.npz``
    (the analysis needs them as the baseline). Returns every round so far."""
    import io

    import numpy as np

    from analysis.mechanisms import mechanism_to_dict
    from pate.io import write_bytes_atomic, write_json_atomic

    rounds_path, probs_path = out / "rounds.json", out / "probs.npz"
    rounds = json.loads(rounds_path.read_text()) if rounds_path.is_file() else []
    if not len(got):
        return rounds
    if probs is not None:
        index, sent = got.pool_index, probs[:len(got)]
        if probs_path.is_file():
            with np.load(probs_path, allow_pickle=False) as old:
                index = np.concatenate([old["pool_index"], index])
                sent = np.concatenate([old["probs"], sent])
        buf = io.BytesIO()
        np.savez(buf, pool_index=index, probs=sent)
        write_bytes_atomic(probs_path, buf.getvalue())
    mechanism = ({"mechanism": args.mechanism} if service is None
                 else mechanism_to_dict(service.aggregator.mechanism))
    rounds.append({"mechanism": mechanism, "select": args.select, **got.counts()})
    write_json_atomic(rounds_path, rounds)
    return rounds


def _sanitised_epsilon(service: Any, received: Any, rounds: list[dict[str, Any]], out: Path,
                       delta: float, conversion: str) -> dict[str, Any] | None:
    """Epsilon of every round so far from ``student.rounds.analyze_rounds`` (PATE 2018's Table 2
    analysis of the asked rows, rounds composed): the data-independent bound and the
    smooth-sensitivity-sanitised data-dependent one; only these are released (DESIGN.md rule 6).
    None without local votes, with LNMax, or when a round's parameters or rows are unknown."""
    from student.rounds import analyze_rounds

    if service is None:
        return None
    result = analyze_rounds(rounds, received,
                            lambda index: service.pool.votes[service.pool.rows(index)],
                            out / "probs.npz", delta, conversion)
    if result is None or result.smooth_sensitivity is None:  # LNMax has no sanitised bound
        return None
    ss = result.smooth_sensitivity.to_json()
    return {"data_independent": result.data_independent.epsilon,
            "smooth_sensitivity": {k: ss.get(k) for k in ("epsilon", "order", "beta", "sigma",
                                                            "fallback")}}


def _given_encoder(args: argparse.Namespace, channels: int) -> Any:
    """The pool encoder the ``cnn-hog-simclr`` student is told to use, read and checked before
    any query is asked (a bad one spends nothing): ``--pool-encoder``'s, else the one ``--run``'s
    teachers learnt (digest checked); None when there is neither. Both are derived from the
    public pool alone (teachers.pool_encoder), so the student may read them."""
    from teachers import checkpoints
    from teachers.pool_encoder import check_encoder, load_encoder_file

    if args.pool_encoder is not None:
        try:
            return load_encoder_file(args.pool_encoder, channels)
        except (OSError, ValueError) as exc:
            raise UserError(f"--pool-encoder {args.pool_encoder}: {exc}") from None
    manifest = args.run / checkpoints.DIR / checkpoints.MANIFEST
    try:
        recorded = (checkpoints.read_manifest(args.run) or {}).get("pool_encoder")
        tensors = None if not recorded else checkpoints.load_encoder(args.run,
                                                                     recorded["sha256"])
        if tensors is not None:
            check_encoder(tensors, channels)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{manifest}: no readable pool encoder ({exc.__class__.__name__})"
                        ) from None
    return tensors


def _pool_features(args: argparse.Namespace, given: Any, previous: Any, pool_x: Any) -> Any:
    """The ``cnn-hog-simclr`` student's :class:`student.models.PoolFeatures`: on the encoder
    ``given`` (:func:`_given_encoder`), else that of the student saved by a previous round,
    else one learnt here by SimCLR from the public pool (``--encoder-epochs``)."""
    from student.models import POOL_FEATURE_ARCHS, PoolFeatures
    from teachers.pool_encoder import EPOCHS, train_pool_encoder

    encoder = given
    if encoder is None and previous is not None and previous[1].arch in POOL_FEATURE_ARCHS:
        encoder = previous[0].experts[1][0].encoder.state_dict()
    if encoder is None:
        epochs = EPOCHS if args.encoder_epochs is None else args.encoder_epochs
        print(f"pate student: learning a pool encoder ({epochs} SimCLR epochs on the "
              f"{len(pool_x)} pool rows)", file=sys.stderr, flush=True)
        encoder = train_pool_encoder(pool_x, epochs, args.seed)
    return PoolFeatures.on_pool(encoder, pool_x)


def run_train(args: argparse.Namespace) -> int:
    import httpx
    import numpy as np
    import torch

    from pate.data.datasets import load_dataset, public_split
    from pate.errors import PateError
    from pate.io import ensure_dir, write_json_atomic
    from student.models import POOL_FEATURE_ARCHS, build_classifier, same_tensors
    from student.rounds import Received, ask, select_queries
    from student.training import (
        FitConfig,
        MethodConfig,
        accuracy,
        build_learner,
        fit,
        load_classifier,
        load_spec,
        load_weights,
        predict_proba,
        save_model,
        seed_everything,
    )

    started = time.perf_counter()
    if (args.queries < 0 or args.request_size < 1 or args.epochs < 1
            or (args.encoder_epochs is not None and args.encoder_epochs < 1)):
        raise UserError("--queries must be >= 0, --request-size, --epochs and --encoder-epochs "
                        ">= 1")
    if args.pool_encoder is not None and args.encoder_epochs is not None:
        raise UserError("give --pool-encoder (an encoder) or --encoder-epochs (learn one), "
                        "not both")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise UserError(f"--device {args.device}: CUDA is not available")
    if args.threads is not None:
        if args.threads < 1:
            raise UserError("--threads must be >= 1")
        torch.set_num_threads(args.threads)
    try:
        method = MethodConfig(args.method, args.arch, args.width, args.lr, args.vat_eps,
                              args.entmin)
        fit_config = FitConfig(args.epochs, args.batch_size, args.unlabelled_batch_size,
                               method.learning_rate, augment=args.augment,
                               balance_classes=args.balance_classes, seed=args.seed,
                               device=args.device)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    ds = load_dataset(args.dataset, args.data_dir, need_train=False)
    (pool_x, pool_y), (eval_x, eval_y) = public_split(ds, args.pool_size)
    spec = method.spec(pool_x.shape[1:], ds.num_classes)
    pool_features = spec.arch in POOL_FEATURE_ARCHS
    if not pool_features and (args.pool_encoder or args.encoder_epochs):
        raise UserError("--pool-encoder and --encoder-epochs are for --arch "
                        f"{', '.join(sorted(POOL_FEATURE_ARCHS))} only")
    given = _given_encoder(args, pool_x.shape[1]) if pool_features else None
    run = ensure_dir(args.run)
    out = ensure_dir(run / "student")
    labels_path = run / "labels.npz"
    before = Received.load(labels_path) if labels_path.is_file() else Received.empty()
    if np.any(before.pool_index >= len(pool_y)):
        raise UserError(f"{labels_path} has pool indices beyond --pool-size {len(pool_y)}")
    previous = load_classifier(out)
    interactive = args.mechanism == "interactive"

    source, service = _open_source(args)
    try:
        candidates = np.setdiff1d(np.arange(len(pool_y)), before.pool_index)
        if service is not None:
            candidates = np.intersect1d(candidates, _votes_pool_index(args.votes or
                                                                      args.run / "votes.npz"))
        probs_all = None
        if args.queries and (interactive or args.select == "uncertainty"):
            if previous is None:
                raise UserError("interactive rounds and --select uncertainty need the student "
                                f"of a previous round in {out}")
            probs_all = predict_proba(previous[0].to(args.device), pool_x[candidates],
                                      args.device)
        chosen = select_queries(candidates, args.queries, args.select,
                                np.random.default_rng(args.seed), probs_all)
        probs = None
        if interactive and chosen.size:
            probs = probs_all[np.searchsorted(candidates, chosen)]
        try:
            got, exhausted = ask(source, chosen, probs, args.request_size,
                                 on_request=lambda r: (before + r).save(labels_path))
        except PateError as exc:
            raise UserError(f"the aggregator refused: {exc}") from None
        except httpx.HTTPError as exc:
            raise UserError(f"cannot reach {args.server}: {exc.__class__.__name__}") from None
        budget = source.budget()
        received = before + got
        received.save(labels_path)
        rounds = _record_round(out, args, service, got, probs)
        analysed = _sanitised_epsilon(service, received, rounds, out, budget["delta"],
                                      args.conversion)
    finally:
        source.close()
    if exhausted:
        print(f"pate student: budget exhausted after {len(got)} of {chosen.size} queries",
              file=sys.stderr)

    answered = received.answered
    if not answered.any():
        raise UserError("no labels received yet: nothing to train on (more queries or a lower "
                        "threshold)")
    lab_index = received.pool_index[answered]
    lab_y = received.label[answered]
    continued = previous is not None and previous[1] == spec and (
        load_spec(out, "generator") is not None or args.method != "gan")
    features = None
    if pool_features:  # continue only on the same encoder
        features = _pool_features(args, given, previous, pool_x)
        continued = continued and same_tensors(previous[0].experts[1][0].encoder,
                                               features.encoder)
    seed_everything(args.seed)
    model = build_classifier(spec, features).to(args.device)
    if continued:
        load_weights(model, out)
    learner = build_learner(method, model, spec)
    if continued and args.method == "gan":
        load_weights(learner.generator_net, out, "generator")
    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(total=args.epochs, desc=f"student {args.method}", unit="epoch",
                   file=sys.stderr)
    try:
        result = fit(learner, pool_x[lab_index], lab_y, pool_x, fit_config,
                     on_epoch=None if bar is None else lambda _e, _l: bar.update(1))
    finally:
        if bar is not None:
            bar.close()
    acc = accuracy(model, eval_x, eval_y, args.device)
    save_model(model, spec, out)
    if args.method == "gan":
        save_model(learner.generator_net, spec, out, "generator")

    counts = received.counts()
    metrics = {
        "method": args.method, "arch": spec.arch, "dataset": ds.name,
        "accuracy": acc, "eval_size": len(eval_y), "pool_size": len(pool_y),
        **counts,
        "labels_used": int(answered.sum()),
        "label_accuracy": float(np.mean(lab_y == pool_y[lab_index])),
        "epsilon": {
            "delta": budget["delta"],
            "data_independent": budget["epsilon_spent"],  # the ledger's, all its clients
            "basis": budget["basis"],
            "data_dependent_sanitised": (None if analysed is None
                                         else analysed["smooth_sensitivity"]["epsilon"]),
            "analysis": analysed,
        },
        "rounds": rounds,
        "continued_from_previous": continued,
        "training": {"width": spec.width, **asdict(fit_config),
                     **({"vat_eps": method.vat_eps, "entmin": method.entmin}
                        if args.method == "vat" else {})},
        "epochs": args.epochs, "seconds_per_epoch": float(np.mean(result.seconds_per_epoch)),
        "seconds": time.perf_counter() - started,
    }
    write_json_atomic(out / "metrics.json", metrics)
    if args.json:
        print(json.dumps(metrics))
    else:
        eps = metrics["epsilon"]
        shown = ("" if eps["data_dependent_sanitised"] is None
                 else f", {eps['data_dependent_sanitised']:.3f} data-dependent (sanitised)")
        print(f"accuracy {acc:.4f}  labels {metrics['labels_used']} "
              f"(label accuracy {metrics['label_accuracy']:.3f})  epsilon "
              f"{eps['data_independent']:.3f} data-independent{shown} at delta "
              f"{eps['delta']:g}  -> {out / 'metrics.json'}")
    return 0
