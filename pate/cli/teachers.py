"""``pate teachers train`` and ``pate teachers votes``: partition the private training split,
train the teachers (resumably, on Ray) and record the ensemble's votes on the public pool."""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.cli.device_flag import add_device_flag
from pate.cli.paths import path_arg, path_text
from pate.data.augment import AUGMENTATIONS
from pate.data.partitions import PARTITIONS, partition_problem
from pate.errors import UserError
from pate.rundir import RunDir
from teachers.choices import MODELS
from teachers.defaults import TEACHERS


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser("teachers", help="train teachers and collect their votes",
                                   description=__doc__)
    sub = parser.add_subparsers(dest="teachers_command", required=True, metavar="ACTION")

    train = sub.add_parser("train", help="partition the private data and train the teachers",
                           description="Partition the training split among the teachers and "
                           "train them on Ray; rerunning trains only missing shards.")
    train.add_argument("--run", required=True, type=path_arg, help="run directory")
    train.add_argument("--teachers", type=int, default=TEACHERS.count, help="number of teachers")
    train.add_argument("--seed", type=int, default=0,
                       help="seed of the partition and of training (offline experiments only)")
    # None: the default of teachers.ensemble.TrainConfig (teachers.defaults).
    train.add_argument("--model", metavar="MODEL",
                       help=f"{', '.join(MODELS)}, or your own network's import path "
                            "package.module:factory (importable from the working directory; "
                            "factory(input_shape, num_classes) -> torch.nn.Module); default: "
                            "cnn for images, mlp for tabular data")
    train.add_argument("--epochs", type=int, help=f"default: {TEACHERS.epochs}")
    train.add_argument("--batch-size", type=int, help=f"default: {TEACHERS.batch_size}")
    train.add_argument("--lr", type=float,
                       help=f"peak learning rate (one-cycle); default: {TEACHERS.lr:g}")
    train.add_argument("--mixup", type=float, default=None,
                       help="mixup's Beta(alpha, alpha) within each teacher's own batch; "
                            f"default: {TEACHERS.mixup:g} (off)")
    train.add_argument("--augment", choices=["auto", *AUGMENTATIONS],
                       default="auto", help="random shifts (and mirroring); auto picks what "
                       "preserves the dataset's labels")
    train.add_argument("--partition", choices=PARTITIONS, default="position",
                       help="deal the private rows by position (the ε covers changing one "
                            "record), by a hash of each record (it covers adding or removing "
                            "one, as DP-SGD's does) or by a hash of each row's key column "
                            "(--key: adding or removing all of one person's rows)")
    train.add_argument("--shard-size", type=int, default=TEACHERS.shard_size,
                       help="teachers per Ray task (trained together, vectorised)")
    train.add_argument("--workers", type=int, default=os.cpu_count() or 1,
                       help="shards trained at once (default: one per CPU core)")
    train.add_argument("--ray-address", default=None,
                       help="join this Ray cluster (HOST:PORT, ray://HOST:PORT or auto; local "
                       "starts a new local Ray) instead of starting a private local one")
    train.add_argument("--device", choices=["cpu", "cuda"], default="cpu",
                       help="where the shards train (checked against the Ray cluster's GPUs)")
    train.add_argument("--gpus-per-shard", type=float, default=1.0,
                       help="GPU share of one shard on cuda, at most 1 or a whole number "
                       "(e.g. 0.25 packs four per GPU)")
    add_data_flags(train)
    train.set_defaults(handler=_train)

    votes = sub.add_parser("votes", help="vote on the public pool -> votes.npz",
                           description="Batched ensemble inference over the public pool; "
                           "writes votes.npz (private) and the teachers' accuracy on the "
                           "evaluation half into teachers/manifest.json.")
    votes.add_argument("--run", required=True, type=path_arg, help="run directory")
    add_device_flag(votes, "the teachers' inference")
    votes.add_argument("--data-dir", type=path_text, default=None,
                       help="where the dataset files are")
    votes.add_argument("--batch-size", type=int, default=None,
                       help="rows per inference batch (default: 32 on cpu, 1024 on cuda)")
    votes.set_defaults(handler=_votes)


def _train(args: argparse.Namespace) -> int:
    from pate.data.task import data_kind
    from teachers.distributed import Cluster, TrainJob, train_teachers
    from teachers.ensemble import train_config_for
    from teachers.manifest import teachers_source

    source = source_from_flags(args, teachers_source(Path(args.run)))  # a rerun: the run's
    cfg = train_config_for(source, data_kind(source), model=args.model, augment=args.augment,
                           seed=args.seed, epochs=args.epochs, batch_size=args.batch_size,
                           lr=args.lr, mixup=args.mixup)
    if problem := partition_problem(args.partition, getattr(source, "key", None)):
        raise UserError(problem)  # before the run directory is made
    job = TrainJob(source, args.teachers, args.shard_size, cfg, args.partition)
    cluster = Cluster(args.workers, args.ray_address, args.device, args.gpus_per_shard)
    t0 = time.time()
    with RunDir(args.run).create().exclusive():
        result = train_teachers(args.run, job, cluster)
    print(f"teachers: trained {len(result['trained'])} shard(s), {len(result['skipped'])} "
          f"already done, in {time.time() - t0:.1f} s -> {RunDir(args.run).teachers}")
    return 0


def _votes(args: argparse.Namespace) -> int:
    from teachers.votes import collect_votes

    t0 = time.time()
    with RunDir(args.run).exclusive():
        queries = collect_votes(args.run, args.device, args.data_dir, args.batch_size)
    print(f"votes: {queries} queries in {time.time() - t0:.1f} s -> {RunDir(args.run).votes}")
    return 0
