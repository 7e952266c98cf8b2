"""Benchmark of the students (issue 5): accuracy against the number of answered labels.

For each number of labels N (default 100, 300, 1000) and each method (supervised, VAT, GAN) the
student trains on the first N answered rows of the Fashion-MNIST public pool (the test split's
first half) with the whole pool unlabelled, and is evaluated on the second half. Labels come from
the teachers' votes (``--votes FILE``, e.g. a 250-teacher run's votes.npz) answered by
Confident-GNMax in this process (``pate.aggregation.aggregators``; offline: no ledger, noise
from the OS), or,
without votes, from the true labels with a fraction ``--synthetic-noise`` replaced by another
class at random (a stand-in matched to ~0.85 label accuracy; the case says so). Prints one JSON
object per case (accuracy, label accuracy, seconds per epoch) and appends it to
results/bench_student.jsonl.

    python scripts/bench_student.py [--votes RUN/votes.npz --threshold T --sigma1 S1 --sigma2 S2]
        [--labels 100 300 1000] [--methods supervised vat gan] [--epochs 30] [--threads 1]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch
from bench_common import emit

from analysis.mechanisms import ConfidentGNMax
from pate.aggregation.aggregators import Aggregator
from pate.data.datasets import load_dataset, public_split
from pate.data.votes_file import load_votes_with_index
from student.choices import POOL_FEATURE_ARCHS
from student.models import PoolFeatures, build_classifier
from student.training import (
    FitConfig,
    MethodConfig,
    accuracy,
    build_learner,
    fit,
    seed_everything,
)
from teachers.pool_encoder import load_encoder_file

OUT = Path("results/bench_student.jsonl")


def _emit(row: dict) -> None:
    emit(row, OUT, torch_threads=torch.get_num_threads())


def teacher_labels(args: argparse.Namespace, pool_size: int) -> tuple[np.ndarray, np.ndarray]:
    """(pool indices, labels) of every pool row Confident-GNMax answered, in pool order."""
    votes, index = load_votes_with_index(args.votes)
    keep = index < pool_size
    order = np.argsort(index[keep])
    votes, index = votes[keep][order], index[keep][order]
    params = ConfidentGNMax(threshold=args.threshold, sigma1=args.sigma1,
                             sigma2=args.sigma2)
    labels = Aggregator(params).answer(votes).labels
    return index[labels >= 0], labels[labels >= 0]


def synthetic_labels(pool_y: np.ndarray, noise: float, seed: int
                     ) -> tuple[np.ndarray, np.ndarray]:
    """(pool indices, labels): the true label, replaced w.p. ``noise`` by another class."""
    rng = np.random.default_rng(seed)
    flip = rng.random(len(pool_y)) < noise
    other = (pool_y + rng.integers(1, 10, len(pool_y))) % 10
    return np.arange(len(pool_y)), np.where(flip, other, pool_y)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--votes", type=Path, help="votes.npz of a teacher run (Fashion-MNIST)")
    ap.add_argument("--threshold", type=float, default=200.0)
    ap.add_argument("--sigma1", type=float, default=150.0)
    ap.add_argument("--sigma2", type=float, default=40.0)
    ap.add_argument("--synthetic-noise", type=float, default=0.15)
    ap.add_argument("--labels", type=int, nargs="+", default=[100, 300, 1000])
    ap.add_argument("--methods", nargs="+", default=["supervised", "vat", "gan"])
    ap.add_argument("--arch", default=None, help="network of vat and supervised (default cnn)")
    ap.add_argument("--pool-encoder", type=Path,
                    help="cnn-hog-simclr: the pool encoder (RUN/teachers/pool-encoder.safetensors)")
    ap.add_argument("--width", type=int, default=32)
    ap.add_argument("--epochs", type=int, default=30)
    ap.add_argument("--vat-eps", type=float, default=2.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (the box is shared)")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    ds = load_dataset("fashion-mnist", need_train=False)
    (pool_x, pool_y), (eval_x, eval_y) = public_split(ds)
    features = None
    if args.arch in POOL_FEATURE_ARCHS:
        if args.pool_encoder is None:
            ap.error(f"--arch {args.arch} needs --pool-encoder")
        try:
            encoder = load_encoder_file(args.pool_encoder, pool_x.shape[1])
        except (OSError, ValueError) as exc:
            ap.error(f"--pool-encoder {args.pool_encoder}: {exc}")
        features = PoolFeatures.on_pool(encoder, pool_x)
    if args.votes:
        index, labels = teacher_labels(args, len(pool_y))
        source = {"labels_from": f"confident-gnmax over {args.votes}",
                  "threshold": args.threshold, "sigma1": args.sigma1, "sigma2": args.sigma2}
    else:
        index, labels = synthetic_labels(pool_y, args.synthetic_noise, args.seed)
        source = {"labels_from": f"synthetic: true labels with {args.synthetic_noise:g} "
                                 "replaced at random (no teachers' votes given)"}
    for n in args.labels:
        if n > len(index):
            print(f"only {len(index)} answered rows: skipping {n}", file=sys.stderr)
            continue
        li, ly = index[:n], labels[:n]
        for name in args.methods:
            seed_everything(args.seed)
            method = MethodConfig(name, None if name == "gan" else args.arch, args.width,
                                  vat_eps=args.vat_eps)
            spec = method.spec(pool_x.shape[1:], ds.num_classes)
            model = build_classifier(
                spec, features if spec.arch in POOL_FEATURE_ARCHS else None).to(args.device)
            config = FitConfig(args.epochs, lr=method.learning_rate, seed=args.seed,
                               device=args.device)
            result = fit(build_learner(method, model, spec), pool_x[li], ly, pool_x, config)
            _emit({"case": f"{name}-{n}", "method": name, "arch": spec.arch, "labels": n,
                   "label_accuracy": float(np.mean(ly == pool_y[li])),
                   "accuracy": accuracy(model, eval_x, eval_y, args.device),
                   "epochs": args.epochs,
                   "seconds_per_epoch": float(np.mean(result.seconds_per_epoch)),
                   "pool": len(pool_y), "eval": len(eval_y), **source})
    return 0


if __name__ == "__main__":
    sys.exit(main())
