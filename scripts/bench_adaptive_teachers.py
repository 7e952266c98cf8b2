"""Teachers that learn the labels already released, before a second round (issue 27, item 3).

A round's answers are public: each teacher may train again on its own private rows plus
``--shared`` of the released labelled pool rows (a random choice per teacher), before the next
round. The round's privacy analysis is unchanged: given the released labels, adding or removing
one private record still changes one teacher's vote, and Rényi DP composes over rounds chosen
adaptively (PATE 2018's Interactive-GNMax rests on the same argument). What it changes is the
votes: the teachers agree more, so Confident-GNMax answers more rows for less data-dependent ε,
but they share the released labels' mistakes.

On a finished run of ``fashion-mnist-small``'s kind (``--run``: its ``labels.npz``, ``votes.npz``
and teachers with their pool encoder; its first ``--first-round`` queries, all by default, are
the first round), this retrains the run's teachers (the preset's settings, ``--config``) each on
its part plus ``--shared`` of the first round's released rows (copies per teacher, so the parts
stay disjoint) and compares, on the pool rows the first round did not ask:
- the teachers' noiseless plurality (its accuracy, its top share, the rows over the threshold's
  share T / teachers), old teachers against the new;
- the Table-2 analysis (``analysis.votes_analysis.analyze_segments``) of the first round's rows
  (old votes) followed by ``--rows`` rows it did not ask (old or new votes): the
  smooth-sensitivity-sanitised ε before its noise, the data-dependent and data-independent ε,
  and the expected answers of the second round and how many of them are right.

Every figure comes from the private data (owner only). One JSON line per second-round size,
appended to results/bench_adaptive_teachers.jsonl::

    python scripts/bench_adaptive_teachers.py --run runs/fashion-mnist-small --shared 100
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import emit

from analysis.costs import expected_costs
from analysis.mechanisms import ConfidentGNMax
from analysis.orders import default_orders
from analysis.votes_analysis import QuerySegment, analyze_segments
from pate.config import load_config
from pate.data.task import Task, load_task
from teachers import checkpoints
from teachers.ensemble import train_config_for, train_group
from teachers.manifest import TeachersManifest
from teachers.partition import deal_rows
from teachers.votes import Ensemble


def _first_round(run: Path, first: int | None) -> tuple[np.ndarray, np.ndarray]:
    """The pool rows of the run's first ``first`` queries (all by default), in asking order,
    and their released labels (-1: not answered)."""
    released = np.load(run / "labels.npz")
    return released["pool_index"][:first], released["label"][:first]


def _teachers_with_shared(run: Path, config_name: str, shared: int, epochs: int | None,
                          seed: int, first: int | None
                          ) -> tuple[np.ndarray, Task, np.ndarray, float]:
    """The new votes on the pool, the task, the pool rows not asked in the first round and the
    training's seconds."""
    config = load_config(config_name)
    task = load_task(config.data.source())
    t = config.teachers
    train = train_config_for(config.data.source(), task.kind, model=t.model, augment=t.augment,
                             seed=t.seed, epochs=epochs or t.epochs, batch_size=t.batch_size,
                             lr=t.lr, mixup=t.mixup)
    part = deal_rows(t.partition, task.private_x, task.private_y, t.count, train.seed,
                     task.private_keys)
    manifest = TeachersManifest.trained(run)
    sha256 = manifest.pool_encoder_sha256
    assert sha256 is not None, "the preset's teachers read a pool encoder"
    encoder = checkpoints.load_encoder(run, sha256)
    asked, released = _first_round(run, first)
    rows, labels = asked[released >= 0], released[released >= 0]
    rng = np.random.default_rng(seed)
    chosen = np.concatenate([np.sort(rng.choice(len(rows), shared, replace=False))
                             for _ in range(t.count)])  # teacher k's: [k * shared, (k+1) * shared)
    n = len(task.private_y)
    x = np.concatenate([task.private_x, task.pool_x[rows[chosen]]])
    y = np.concatenate([task.private_y, labels[chosen]]).astype(np.int64)
    parts = [np.concatenate([p, n + k * shared + np.arange(shared)])
             for k, p in enumerate(part.parts())]
    started = time.perf_counter()
    group = train_group(train, torch.as_tensor(x), torch.as_tensor(y), task.num_classes,
                        np.arange(t.count), parts, part.step_rows() + shared, encoder)
    seconds = time.perf_counter() - started
    ensemble = Ensemble(manifest.model, manifest.in_shape, task.num_classes,
                        [group], "cpu", encoder)
    never = np.setdiff1d(np.arange(len(task.pool_x)), asked)
    return ensemble.vote(task.pool_x), task, never, seconds


def _plurality(votes: np.ndarray, truth: np.ndarray, share: float) -> dict[str, float]:
    top = votes.max(1) / votes.sum(1)
    right = votes.argmax(1) == truth
    over = top >= share
    return {"accuracy": float(right.mean()), "top_share": float(top.mean()),
            "over_threshold": float(over.mean()), "right_over_threshold": float(right[over].mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", type=Path, required=True)
    p.add_argument("--config", default="fashion-mnist-small", help="the run's preset or TOML")
    p.add_argument("--shared", type=int, default=100, help="released rows per teacher")
    p.add_argument("--epochs", type=int, default=None, help="default: the config's")
    p.add_argument("--seed", type=int, default=0, help="the choice of released rows")
    p.add_argument("--first-round", type=int, default=None, metavar="K",
                   help="the run's first K queries are the first round (default: all)")
    p.add_argument("--rows", type=int, nargs="+", default=[300, 700, 1500, 2700])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=Path("results/bench_adaptive_teachers.jsonl"))
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    new, task, never, seconds = _teachers_with_shared(args.run, args.config, args.shared,
                                                      args.epochs, args.seed, args.first_round)
    old = np.load(args.run / "votes.npz")["votes"]
    a = load_config(args.config).aggregator
    mechanism = ConfidentGNMax(a.threshold, a.sigma1, a.sigma2)
    share = a.threshold / int(old[0].sum())
    asked, _ = _first_round(args.run, args.first_round)
    truth = task.pool_y
    orders = default_orders()
    plurality = {name: _plurality(v[never], truth[never], share)
                 for name, v in (("old", old), ("new", new))}
    rng = np.random.default_rng(args.seed)
    order = rng.permutation(never)
    for size in args.rows:
        second = np.sort(order[:size])
        for name, votes in (("old", old), ("new", new)):
            analysis = analyze_segments([QuerySegment(old[asked], mechanism),
                                         QuerySegment(votes[second], mechanism)], 1e-5)
            chance = expected_costs(votes[second], mechanism, orders, None).pr_answered
            right = votes[second].argmax(1) == truth[second]
            emit({"bench": "adaptive_teachers", "run": str(args.run), "shared": args.shared,
                  "teachers": name, "second_round_rows": size,
                  "first_round_rows": len(asked),
                  "epsilon_sanitised_before_noise": analysis.smooth_sensitivity.epsilon,
                  "epsilon_data_dependent": analysis.data_dependent.epsilon,
                  "epsilon_data_independent": analysis.data_independent.epsilon,
                  "second_round_expected_answers": float(chance.sum()),
                  "second_round_expected_right": float((chance * right).sum()),
                  "plurality_never_asked": plurality[name], "train_seconds": seconds},
                 args.out, threads=args.threads)


if __name__ == "__main__":
    main()
