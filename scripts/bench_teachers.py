"""Benchmark teacher training and voting on Fashion-MNIST partitioned among 250 teachers.

Cases (one JSON object per case on stdout, also written to results/bench_teachers/CASE.json):
  one_at_a_time    plain modules, one teacher after another (teachers.ensemble.train_one)
  vectorised       one group of --group teachers in this process (teachers.ensemble.train_group)
  driver_1         the first --ray-teachers teachers through teachers.distributed (what
                   pate teachers train runs) with 1 worker: in this process, without Ray
  driver_2         the same with 2 workers: on a local Ray (shards of --group)
  votes            ensemble inference: votes per second for an ensemble of all --teachers
                   (the trained group's parameters repeated, or the teachers of --run)
Each training case reports teachers per second, the mean accuracy of its teachers on the
evaluation half, and the accuracy of their noiseless plurality there and on the pool. A model that
reads a pool encoder gets it fitted first on the pool (``teachers.models.fit_pool_encoder``):
``cnn-pool-hog-simclr`` by SimCLR on ``--device`` for ``--encoder-epochs``,
``hog-scatter-whitened`` its whitening (its seconds reported with the first training case).
Run: .venv/bin/python scripts/bench_teachers.py [--cases ...].
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch

from pate.data.datasets import load_dataset, public_split
from pate.data.partitions import PARTITIONS
from pate.io import ensure_dir, write_json_atomic
from teachers.choices import MODEL_RECORDS, POOL_ENCODER_MODELS, SIMCLR
from teachers.ensemble import TrainConfig, total_steps, train_group, train_one
from teachers.models import fit_pool_encoder
from teachers.partition import deal_rows
from teachers.pool_encoder import EPOCHS
from teachers.votes import Ensemble, load_ensemble

RESULTS = Path(__file__).resolve().parent.parent / "results" / "bench_teachers"


def emit(case: str, **fields: object) -> dict:
    """Print one JSON object and write it under results/."""
    row = {"case": case, **fields, "load_avg_1min": round(os.getloadavg()[0], 2),
           "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    print(json.dumps(row), flush=True)
    write_json_atomic(ensure_dir(RESULTS) / f"{case}.json", row)
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teachers", type=int, default=250)
    ap.add_argument("--one", type=int, default=3, help="teachers in the one-at-a-time case")
    ap.add_argument("--group", type=int, default=25, help="teachers per vectorised group/shard")
    ap.add_argument("--ray-teachers", type=int, default=50)
    ap.add_argument("--epochs", type=int, default=TrainConfig.epochs)
    ap.add_argument("--model", default=TrainConfig.model)
    ap.add_argument("--mixup", type=float, default=TrainConfig.mixup)
    ap.add_argument("--encoder-epochs", type=int, default=EPOCHS,
                    help="SimCLR epochs of the pool encoder (cnn-pool-hog-simclr)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--partition", choices=[p for p in PARTITIONS if p != "key"],
                    default="position",
                    help="how the rows are dealt: by record, each teacher takes the steps of "
                         "its own rows, so the teachers of a group take different numbers")
    ap.add_argument("--run", type=Path, help="a trained run whose ensemble votes (votes case)")
    ap.add_argument("--vote-rows", type=int, default=1000, help="pool rows voted on")
    ap.add_argument("--cases", nargs="+",
                    default=["one_at_a_time", "vectorised", "driver_1", "driver_2", "votes"])
    args = ap.parse_args()

    cfg = TrainConfig(model=args.model, epochs=args.epochs, mixup=args.mixup)
    ds = load_dataset("fashion-mnist")
    (pool_x, pool_y), (eval_x, eval_y) = public_split(ds)
    part = deal_rows(args.partition, ds.train_x, ds.train_y, args.teachers, cfg.seed)
    x = torch.as_tensor(ds.train_x, device=args.device)
    y = torch.as_tensor(ds.train_y, device=args.device)
    common = {"dataset": "fashion-mnist", "partition_teachers": args.teachers,
              "model": cfg.model, "epochs": cfg.epochs, "mixup": cfg.mixup,
              "device": args.device, "partition": args.partition}
    encoder = None
    if cfg.model in POOL_ENCODER_MODELS:
        t0 = time.perf_counter()
        encoder = {k: torch.as_tensor(v, device=args.device) for k, v in
                   fit_pool_encoder(cfg.model, pool_x, cfg.seed, args.device,
                                    args.encoder_epochs).items()}
        common.update(encoder=MODEL_RECORDS[cfg.model].pool_encoder,
                      encoder_seconds=round(time.perf_counter() - t0, 2))
        if common["encoder"] == SIMCLR:
            common["encoder_epochs"] = args.encoder_epochs

    def ensemble(shards: list[dict[str, torch.Tensor]]) -> Ensemble:
        return Ensemble(cfg.model, ds.train_x.shape[1:], 10, shards, args.device, encoder)

    def scores(ens: Ensemble) -> dict[str, float]:
        """Mean teacher accuracy and plurality accuracy on the evaluation half, and on the pool."""
        acc, plurality = ens.scores(eval_x, eval_y)
        pool_plurality = ens.scores(pool_x, pool_y)[1]
        return {"mean_accuracy": float(acc.mean()), "plurality": plurality,
                "pool_plurality": pool_plurality}

    group_params = None

    if "one_at_a_time" in args.cases:
        t0 = time.perf_counter()
        models = [train_one(cfg, x, y, 10, t, part.parts([t])[0],
                            int(part.step_rows(range(t, t + 1))[0]), encoder)
                  for t in range(args.one)]
        dt = time.perf_counter() - t0
        stacked = {n: torch.stack([dict(m.named_parameters())[n].detach() for m in models])
                   for n, _ in models[0].named_parameters()}
        emit("one_at_a_time", teachers=args.one, seconds=round(dt, 2),
             teachers_per_second=args.one / dt, **scores(ensemble([stacked])), **common)

    if "vectorised" in args.cases:
        ids = range(args.group)
        t0 = time.perf_counter()
        group_params = train_group(cfg, x, y, 10, np.arange(args.group), part.parts(ids),
                                   part.step_rows(ids), encoder)
        dt = time.perf_counter() - t0
        steps = total_steps(cfg, part.step_rows(ids))
        common.update(steps_most=int(steps.max()), steps_fewest=int(steps.min()),
                      distinct_step_counts=len(np.unique(steps)))
        group_params = {k: v.to(args.device) for k, v in group_params.items()}
        emit("vectorised", teachers=args.group, seconds=round(dt, 2),
             teachers_per_second=args.group / dt, **scores(ensemble([group_params])), **common)

    for workers in (1, 2):
        if f"driver_{workers}" not in args.cases:
            continue
        # imported for the driver cases only: a GPU machine without Ray runs the others
        from teachers.distributed import Cluster, TrainJob, train_teachers

        job = TrainJob("fashion-mnist", args.teachers, args.group, cfg, partition=args.partition)
        shards = list(range(-(-args.ray_teachers // args.group)))
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            train_teachers(tmp, job, Cluster(workers=workers, device=args.device), only=shards)
            dt = time.perf_counter() - t0
            ens = load_ensemble(Path(tmp), args.device, partial=True)
            found = scores(ens)
        emit(f"driver_{workers}", teachers=ens.num_teachers, workers=workers,
             seconds=round(dt, 2), teachers_per_second=ens.num_teachers / dt, **found,
             note="in this process, no Ray" if workers == 1 else
             "wall time includes starting Ray", **common)

    if "votes" in args.cases:
        if args.run is not None:
            ens = load_ensemble(args.run, args.device)
        else:
            if group_params is None:
                group_params = train_group(replace(cfg, epochs=1), x, y, 10,
                                           np.arange(args.group), part.parts(range(args.group)),
                                           part.step_rows(range(args.group)), encoder)
            reps = -(-args.teachers // args.group)
            ens = ensemble([{k: v.to(args.device) for k, v in group_params.items()}] * reps)
        ens.vote(pool_x[:64])  # warm-up
        t0 = time.perf_counter()
        votes = ens.vote(pool_x[:args.vote_rows])
        dt = time.perf_counter() - t0
        emit("votes", teachers=ens.num_teachers, queries=len(votes), seconds=round(dt, 2),
             votes_per_second=len(votes) / dt,
             teacher_predictions_per_second=len(votes) * ens.num_teachers / dt,
             device=args.device)


if __name__ == "__main__":
    main()
