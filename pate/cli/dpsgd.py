"""``pate dpsgd train``: the DP-SGD baseline learner (``student.dpsgd``) on a run directory.

Writes ``DIR/dpsgd/metrics.json`` (accuracy on the evaluation half of the test split, the RDP
and the Bayesian epsilon, delta, steps, noise multiplier, sampling rate, clipping norm),
``DIR/dpsgd/model.pt`` (the state dict) and, private, ``DIR/dpsgd/distances.npy`` (the pair
distances per step, input of ``pate epsilon bayesian``).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from analysis.rdp import CONVERSIONS
from pate.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dpsgd", help="the DP-SGD baseline learner",
        description="DP-SGD (Opacus, Poisson sampling, per-example clipping) accounted by the "
                    "RDP core and the Bayesian accountant.")
    sub = parser.add_subparsers(dest="dpsgd_command", required=True, metavar="COMMAND")
    train = sub.add_parser("train", help="train the DP-SGD baseline",
                           description="Train the tempered-sigmoid CNN with DP-SGD on the "
                                       "training split and evaluate it on the second half of "
                                       "the test split.")
    train.add_argument("--run", type=Path, required=True, metavar="DIR")
    train.add_argument("--dataset", default="fashion-mnist")
    train.add_argument("--data-dir", type=Path, default=None)
    noise = train.add_mutually_exclusive_group(required=True)
    noise.add_argument("--epsilon", type=float, metavar="E",
                       help="target epsilon; the noise multiplier is calibrated to it")
    noise.add_argument("--noise-multiplier", type=float, metavar="S")
    train.add_argument("--epochs", type=int, default=40)
    train.add_argument("--delta", type=float, default=1e-5)
    train.add_argument("--batch-size", type=int, default=2048,
                       help="expected batch size; the Poisson sampling rate is this / n")
    train.add_argument("--lr", type=float, default=4.0)
    train.add_argument("--momentum", type=float, default=0.9)
    train.add_argument("--max-grad-norm", type=float, default=0.1, metavar="C")
    train.add_argument("--conversion", choices=CONVERSIONS, default="improved")
    train.add_argument("--bayesian-pairs", type=int, default=256,
                       help="gradient pairs sampled per step for the Bayesian accountant")
    train.add_argument("--init-seed", type=int, default=None,
                       help="seed of the weight initialisation only (offline experiments); "
                            "sampling and noise always come from the OS's entropy")
    train.add_argument("--json", action="store_true", help="print the metrics as JSON")
    train.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    import numpy as np
    import torch

    from pate.data.datasets import load_dataset, public_split
    from pate.io import ensure_dir, write_json_atomic, write_with_atomic
    from student.dpsgd import DPSGDConfig, train_dpsgd

    try:
        config = DPSGDConfig(
            epochs=args.epochs, expected_batch_size=args.batch_size, lr=args.lr,
            momentum=args.momentum, max_grad_norm=args.max_grad_norm,
            target_epsilon=args.epsilon, noise_multiplier=args.noise_multiplier,
            delta=args.delta, conversion=args.conversion, bayesian_pairs=args.bayesian_pairs,
            init_seed=args.init_seed)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    ds = load_dataset(args.dataset, args.data_dir)
    (pool_x, _), (eval_x, eval_y) = public_split(ds)
    norm = (float(pool_x.mean()), float(pool_x.std()))  # public data: no privacy cost

    bar = None
    if sys.stderr.isatty():
        from tqdm import tqdm

        bar = tqdm(desc="DP-SGD", unit="step", file=sys.stderr)

    def progress(step: int, total: int) -> None:
        if bar is not None:
            bar.total = total
            bar.update(1)

    try:
        result = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, ds.num_classes, config,
                             norm, progress)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    finally:
        if bar is not None:
            bar.close()
    metrics = {"dataset": ds.name, "normalisation": {"mean": norm[0], "std": norm[1]},
               **result.metrics}
    out = ensure_dir(args.run / "dpsgd", private=True)
    write_with_atomic(out / "distances.npy", lambda fh: np.save(fh, result.distances),
                      private=True)
    write_with_atomic(out / "model.pt", lambda fh: torch.save(result.model.state_dict(), fh))
    write_json_atomic(out / "metrics.json", metrics)
    print(json.dumps(metrics) if args.json
          else f"accuracy {metrics['accuracy']:.4f}  epsilon {metrics['epsilon']:.3f} (RDP), "
               f"{metrics['epsilon_bayesian']:.3f} (Bayesian)  delta {metrics['delta']:g}  "
               f"-> {out / 'metrics.json'}")
    return 0
