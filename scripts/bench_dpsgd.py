"""Benchmark of the DP-SGD baseline (``student.dpsgd``) on Fashion-MNIST (issue 7).

Cases: ``eps=E`` trains the network ``--model`` (default the tempered-sigmoid CNN) at target
epsilon E (delta 1e-5 by default) and reports accuracy on the evaluation half of the test split
with the RDP and the Bayesian epsilon of the same run; ``speed`` times one epoch of our learner
(ghost clipping, Bayesian pair sampling included) against one epoch of plain Opacus
(``PrivacyEngine.make_private``: every per-example gradient formed, Poisson sampling, the same
trained part on the same fixed features, the same hyper-parameters). Prints one JSON object per
case and appends it to results/bench_dpsgd.jsonl.

    python scripts/bench_dpsgd.py [--model hog-linear] [--epsilons 1 2 3] [--epochs 40] \
        [--speed]
"""

from __future__ import annotations

import argparse
import sys
import time
import warnings
from pathlib import Path

import torch
from bench_common import emit

from pate.data.datasets import load_dataset, public_split
from student.choices import DPSGD_MODELS
from student.dpsgd import (
    DPSGDConfig,
    WholeBatches,
    dpsgd_network,
    fixed_features,
    train_dpsgd,
)

OUT = Path("results/bench_dpsgd.jsonl")


def _emit(row: dict) -> None:
    emit(row, OUT, torch_threads=torch.get_num_threads())


def _progress(step: int, total: int) -> None:
    """A line on stderr at every tenth of the run."""
    if step % max(1, total // 10) == 0 or step == total:
        print(f"step {step}/{total} at {time.strftime('%H:%M:%S')}", file=sys.stderr, flush=True)


def plain_opacus_steps_per_second(ds, norm: tuple[float, float], config: DPSGDConfig,
                                  sigma: float) -> tuple[float, int]:
    """One epoch of the same trained part, on the same fixed features, with stock Opacus (its
    Poisson loader over the learner's batch fetch, its per-example gradients and accountant)."""
    from opacus import PrivacyEngine
    from torch.utils.data import DataLoader

    fixed, model = dpsgd_network(config.model, tuple(ds.train_x.shape[1:]), ds.num_classes,
                                 *norm)
    features = fixed_features(fixed, ds.train_x)
    engine = PrivacyEngine(accountant="rdp")
    loader = DataLoader(WholeBatches(torch.from_numpy(features), torch.from_numpy(ds.train_y)),
                        batch_size=config.expected_batch_size, collate_fn=WholeBatches.collate)
    model, optimizer, loader = engine.make_private(
        module=model, optimizer=torch.optim.SGD(model.parameters(), lr=config.lr,
                                                momentum=config.momentum),
        data_loader=loader, noise_multiplier=sigma, max_grad_norm=config.max_grad_norm,
        poisson_sampling=True)
    loss_fn = torch.nn.CrossEntropyLoss()
    start, steps = time.perf_counter(), 0
    for xb, yb in loader:
        optimizer.zero_grad(set_to_none=True)
        loss_fn(model(xb), yb).backward()
        optimizer.step()
        steps += 1
    return steps / (time.perf_counter() - start), steps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", choices=DPSGD_MODELS, default="tempered-cnn")
    parser.add_argument("--epsilons", type=float, nargs="*", default=[1.0, 2.0, 3.0])
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--speed", action="store_true", help="also run the speed case")
    args = parser.parse_args()
    warnings.filterwarnings("ignore", message="Full backward hook is firing")

    ds = load_dataset("fashion-mnist")
    (pool_x, _), (eval_x, eval_y) = public_split(ds)
    norm = (float(pool_x.mean()), float(pool_x.std()))
    for eps in args.epsilons:
        config = DPSGDConfig(epochs=args.epochs, target_epsilon=eps, delta=args.delta,
                             model=args.model)
        m = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, ds.num_classes, config,
                        norm, _progress).metrics
        _emit({"bench": "dpsgd", "case": f"eps={eps:g}", "model": args.model,
               "target_epsilon": eps,
               **{k: m[k] for k in ("accuracy", "epsilon", "rdp_order", "epsilon_bayesian",
                                    "bayesian_moment", "delta", "steps", "noise_multiplier",
                                    "sampling_rate", "max_grad_norm", "steps_per_second",
                                    "train_seconds", "noise_source")},
               "epochs": args.epochs, "expected_batch_size": config.expected_batch_size,
               "lr": config.lr, "momentum": config.momentum})
    if args.speed:
        config = DPSGDConfig(epochs=1, noise_multiplier=2.0, delta=args.delta, model=args.model)
        ours = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, ds.num_classes, config,
                           norm).metrics
        plain, steps = plain_opacus_steps_per_second(ds, norm, config, 2.0)
        _emit({"bench": "dpsgd", "case": "speed", "model": args.model, "steps": steps,
               "steps_per_second": ours["steps_per_second"],
               "plain_opacus_steps_per_second": plain,
               "speedup": ours["steps_per_second"] / plain,
               "expected_batch_size": config.expected_batch_size,
               "bayesian_pairs": config.bayesian_pairs})


if __name__ == "__main__":
    main()
