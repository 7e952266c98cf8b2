"""Levers on the ``hog-scatter-whitened`` teachers themselves (issue 27: can the teachers'
plurality pass 0.87?), each on the same split and the same whitening as a run.

``--components K`` whitens each map on its K leading components instead of the model's 128
(the network reads its width from the whitening).

- ``none``: the teachers as ``pate teachers train`` trains them (``train_shard``, one shard).
- ``mirror``: the same, each teacher also given the mirror image (left to right) of each of
  its own rows, under the same label, and the steps of twice the rows. A teacher still reads
  its own part alone: the deal stays disjoint, the privacy analysis unchanged.
- ``lda``: each teacher is the linear discriminant of its own rows in the whitened features
  (the concatenation of HOG's and scattering's components): its class means mu_c and its
  within-class covariance S, shrunk towards a multiple of the identity,
  Sigma = (1 - alpha) S + alpha (tr S / F) I (O. Ledoit, M. Wolf, J. Multivariate Anal. 88,
  2004; T. Hastie, R. Tibshirani, J. Friedman, The Elements of Statistical Learning, 2nd ed.,
  §4.3.1, regularised discriminant analysis), scores x^T Sigma^-1 mu_c - mu_c^T Sigma^-1 mu_c / 2,
  equal class priors; ``--alpha`` is alpha. Closed form, no step, no random number; every
  teacher reads the first rows of its part, as many as the smallest has.
- ``lda-shared``: the same, every teacher with the within-class covariance of **all** the
  private rows and its own class means. That covariance is a statistic of every teacher's
  data: this is not a private ensemble, only the bound of one whose teachers share a covariance
  released with noise (a Gaussian mechanism, charged to the budget besides the answers).

It prints the teachers' mean accuracy on the evaluation half and their plurality's there and on
the pool, one JSON line appended to results/bench_teacher_levers.jsonl, and with
``--votes-out F`` writes their votes on the pool as a ``.npy`` that ``pate student train
--votes F`` and ``scripts/bench_ensemble_size.py`` read. It reads the pool's true labels: an
offline experiment to choose a teacher, not a step of any release.

    python scripts/bench_teacher_levers.py --teachers 500 --lever mirror --votes-out m.npy
    python scripts/bench_teacher_levers.py --teachers 500 --lever lda --alpha 0.1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import emit

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.task import Task, load_task
from pate.io import write_with_atomic
from teachers.distributed import train_shard
from teachers.ensemble import TrainConfig
from teachers.fixed_maps import feature_table
from teachers.partition import Partition, make_partition
from teachers.votes import Ensemble
from teachers.whitening import COMPONENTS, MAPS, Whitened, fit_whitening

MODEL = "hog-scatter-whitened"


def trained(task: Task, partition: Partition, cfg: TrainConfig,
            encoder: dict[str, np.ndarray] | None, mirror: bool, threads: int) -> Ensemble:
    """The teachers ``pate teachers train`` trains with ``cfg`` on ``partition``, by its own
    code (``train_shard``, the body of a Ray task: the same batches and random numbers), all in
    one shard; with ``mirror`` each also on the mirror images of its own rows (appended after
    the private rows: row i's image is row n + i)."""
    x, y = task.private_x, task.private_y
    parts, step_rows = partition.parts(), np.asarray(partition.step_rows())
    if mirror:
        x = np.concatenate([x, np.ascontiguousarray(x[..., ::-1])])
        y = np.concatenate([y, y])
        parts = [np.concatenate([p, p + len(task.private_y)]) for p in parts]
        step_rows = 2 * step_rows
    classes = len(task.classes)
    params = train_shard(cfg, x, y, classes, range(len(parts)), parts, step_rows, "cpu",
                         threads, encoder)
    return Ensemble(cfg.model, tuple(task.pool_x.shape[1:]), classes,
                    [{k: torch.as_tensor(v) for k, v in params.items()}], encoder=encoder)


def class_statistics(z: torch.Tensor, y: torch.Tensor, classes: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """Class means ``[T, C, F]`` and within-class covariances ``[T, F, F]`` (the residuals from
    each row's class mean, divided by the rows) of T sets of rows ``z [T, m, F]`` (float64),
    labelled ``y [T, m]``."""
    onehot = torch.nn.functional.one_hot(y, classes).double()
    means = (torch.einsum("tmc,tmf->tcf", onehot, z)
             / onehot.sum(1).clamp(min=1)[..., None])
    resid = z - torch.einsum("tmc,tcf->tmf", onehot, means)
    return means, torch.einsum("tmf,tmg->tfg", resid, resid) / z.shape[1]


def discriminants(z: torch.Tensor, y: torch.Tensor, classes: int, alpha: float,
                  within: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``[T, F, C]`` and biases ``[T, C]`` of T shrunk linear discriminants, teacher t's
    from its rows ``z[t] [m, F]`` (float64) and labels ``y[t] [m]``; the within-class
    covariance its own rows', or ``within [F, F]`` for all."""
    means, own = class_statistics(z, y, classes)
    within = own if within is None else within.expand_as(own)
    scale = torch.diagonal(within, dim1=1, dim2=2).mean(1)[:, None, None]
    eye = torch.eye(z.shape[2], dtype=z.dtype)
    sigma = (1 - alpha) * within + alpha * scale * eye
    weights = torch.cholesky_solve(means.transpose(1, 2), torch.linalg.cholesky(sigma))
    return weights, -0.5 * (means * weights.transpose(1, 2)).sum(-1)


def lda_labels(task: Task, partition: Partition, encoder: dict[str, np.ndarray],
               args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray]:
    """Each discriminant teacher's labels ``[T, n]`` on the evaluation half and on the pool,
    fitted ``--group`` teachers at a time."""
    shape = tuple(task.pool_x.shape[1:])
    maps = [Whitened(name, shape, encoder) for name in MAPS]

    def table(x: np.ndarray) -> torch.Tensor:
        return feature_table(maps, torch.as_tensor(np.ascontiguousarray(x),
                                                   dtype=torch.float32)).double()

    private, evaluation, pool = (table(x) for x in (task.private_x, task.eval_x, task.pool_x))
    per_teacher = int(partition.sizes.min())
    parts = torch.as_tensor(np.stack([rows[:per_teacher] for rows in partition.parts()]))
    y = torch.as_tensor(task.private_y)[parts]
    shared = None
    if args.lever == "lda-shared":  # all the private rows': a bound, not a private teacher
        shared = class_statistics(private[None], torch.as_tensor(task.private_y)[None],
                                  len(task.classes))[1][0]
    out: list[list[torch.Tensor]] = [[], []]
    for start in range(0, args.teachers, args.group):
        group = slice(start, start + args.group)
        weights, bias = discriminants(private[parts[group]], y[group], len(task.classes),
                                      args.alpha, shared)
        for i, z in enumerate((evaluation, pool)):
            out[i].append((torch.einsum("nf,tfc->tnc", z, weights) + bias[:, None]).argmax(-1))
    return tuple(torch.cat(o).numpy() for o in out)


def summary(eval_labels: np.ndarray, pool_labels: np.ndarray, task: Task, classes: int
            ) -> tuple[dict[str, float], np.ndarray]:
    """The teachers' mean accuracy, their plurality's on both halves, and their votes on the
    pool, from their labels ``[T, n]``."""
    def votes(labels: np.ndarray) -> np.ndarray:
        return (labels[..., None] == np.arange(classes)).sum(0, dtype=np.int32)

    pool_votes = votes(pool_labels)
    return ({"mean_accuracy": round(float((eval_labels == task.eval_y).mean()), 4),
             "plurality_eval": round(float((votes(eval_labels).argmax(1) == task.eval_y).mean()),
                                     4),
             "plurality_pool": round(float((pool_votes.argmax(1) == task.pool_y).mean()), 4)},
            pool_votes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_flags(parser)
    parser.add_argument("--teachers", type=int, default=500)
    parser.add_argument("--lever", choices=("none", "mirror", "lda", "lda-shared"),
                        default="none")
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--components", type=int, default=COMPONENTS,
                        help="the whitening's components per map (the model's: 128)")
    parser.add_argument("--alpha", type=float, default=0.1,
                        help="lda: the covariance's shrinkage towards the identity, in [0, 1]")
    parser.add_argument("--group", type=int, default=250, help="lda: teachers fitted at once")
    parser.add_argument("--votes-out", type=Path, help="write the teachers' votes on the pool")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/bench_teacher_levers.jsonl"))
    args = parser.parse_args()
    if not 0 <= args.alpha <= 1 or args.group < 1 or args.components < 1:
        parser.error("--alpha must be in [0, 1], --group and --components at least 1")
    torch.set_num_threads(args.threads)
    task = load_task(source_from_flags(args))
    assert task.pool_y is not None and task.eval_y is not None, "needs a labelled benchmark"
    start = time.perf_counter()
    partition = make_partition(len(task.private_y), args.teachers, seed=0)
    encoder = fit_whitening(task.pool_x, args.components)
    if args.lever in ("lda", "lda-shared"):
        labels = lda_labels(task, partition, encoder, args)
    else:
        cfg = TrainConfig(model=MODEL, epochs=args.epochs, batch_size=args.batch_size,
                          lr=args.lr)
        ensemble = trained(task, partition, cfg, encoder, args.lever == "mirror", args.threads)
        labels = tuple(torch.cat(list(ensemble.labels(x)), 1).numpy()
                       for x in (task.eval_x, task.pool_x))
    scores, pool_votes = summary(*labels, task, len(task.classes))
    emit({"lever": args.lever, "teachers": args.teachers, "components": args.components,
          "rows_each": int(partition.sizes.min()),
          **({"alpha": args.alpha} if args.lever.startswith("lda") else
             {"epochs": args.epochs, "batch_size": args.batch_size, "lr": args.lr}),
          **scores, "seconds": round(time.perf_counter() - start, 1)}, args.out,
         threads=args.threads)
    if args.votes_out is not None:
        # votes are a private artifact: owner-only, written whole or not at all
        write_with_atomic(args.votes_out, lambda f: np.save(f, pool_votes), private=True)


if __name__ == "__main__":
    main()
