"""Teachers that are linear softmax experts on fixed features: HOG, wavelet scattering, and the
pair (issue 27: can a better fixed feature lift the teachers' plurality?).

The private rows are split as ``pate teachers train`` splits them (``make_partition``, seed 0).
Each of the ``--teachers`` teachers gets a linear softmax per feature map, all trained at once as
one batched tensor (full batch, Adam, ``--steps`` steps, an L2 penalty ``--weight-decay`` on the
weights), on HOG features (``teachers.hog``) and on scattering features
(``teachers.scattering``: order 2, J = 2, L = 8, each group of three maps normalised by the
example itself). A teacher of the pair votes with the mean of its two experts' probabilities,
as ``teachers.models.Experts`` does. For each it prints the teachers' mean accuracy on the
evaluation half and their plurality's accuracy there and on the pool, one JSON line each,
appended to results/bench_linear_experts.jsonl.

``--whiten K`` first projects each map's features on the K leading principal components of the
public pool's features, each divided by sqrt(v_k + a * mean(v)), v_k the pool's variance along
component k and a the ``--shrinkage`` (a = 0: whitened; large a: the plain projection, scaled):
a map fitted on the public pool alone, so it costs no privacy. ``--votes-out F`` writes the
pair's votes on the pool (``[pool rows, classes]``, in the pool's order) as a ``.npy`` that
``pate student train --votes F`` and ``scripts/bench_ensemble_size.py`` read.

It reads the pool's true labels: an offline experiment to choose a teacher network, not a step of
any release.

    python scripts/bench_linear_experts.py --dataset fashion-mnist --teachers 250
    python scripts/bench_linear_experts.py --dataset fashion-mnist --teachers 250 --whiten 128 \
        --shrinkage 0.1 --weight-decay 3e-2 --votes-out white.npy
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import emit

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.task import load_task
from pate.io import write_with_atomic
from teachers.fixed_maps import feature_table
from teachers.hog import HOG
from teachers.partition import make_partition
from teachers.scattering import Scattering


def features(fixed: torch.nn.Module, x: np.ndarray) -> torch.Tensor:
    """``fixed``'s map of every row of ``x``."""
    return feature_table([fixed], torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32))


def pool_whitening(pool: torch.Tensor, components: int, shrinkage: float
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(mean [F], projection [F, K])``: ``(z - mean) @ projection`` is a row's coordinates on
    the K leading principal components of the pool's rows ``pool [n, F]``, component k divided
    by sqrt(v_k + shrinkage * mean(v)), v the pool's variances along the K components (a
    shrunk PCA whitening; for PCA whitening: A. Kessy, A. Lewin, K. Strimmer, "Optimal
    Whitening and Decorrelation", The American Statistician 2018)."""
    mean = pool.mean(0)
    _, singular, vt = torch.linalg.svd((pool - mean).double(), full_matrices=False)
    variance = singular[:components] ** 2 / len(pool)
    scale = torch.rsqrt(variance + shrinkage * variance.mean())
    return mean, (vt[:components].T * scale).float()


def train_experts(x: torch.Tensor, y: torch.Tensor, classes: int, steps: int, lr: float,
                  weight_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``[T, F, C]`` and biases ``[T, 1, C]`` of T linear softmax experts, expert t on
    rows ``x[t] [m, F]`` with labels ``y[t] [m]``."""
    t, _, f = x.shape
    weights = torch.zeros(t, f, classes, requires_grad=True)
    bias = torch.zeros(t, 1, classes, requires_grad=True)
    opt = torch.optim.Adam([weights, bias], lr=lr)
    for _ in range(steps):
        logits = x @ weights + bias
        loss = (torch.nn.functional.cross_entropy(logits.flatten(0, 1), y.flatten())
                + weight_decay * (weights * weights).sum() / t)
        opt.zero_grad()
        loss.backward()
        opt.step()
    return weights.detach(), bias.detach()


def probabilities(x: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``[T, n, C]``: every expert's class probabilities on the rows ``x [n, F]``."""
    return torch.softmax(torch.einsum("nf,tfc->tnc", x, weights) + bias, -1)


def votes(p: torch.Tensor) -> torch.Tensor:
    """``[n, C]``: how many of the T teachers give each class its top probability in
    ``p [T, n, C]``."""
    return torch.nn.functional.one_hot(p.argmax(-1), p.shape[-1]).sum(0)


def scores(p_eval: torch.Tensor, p_pool: torch.Tensor, eval_y: torch.Tensor,
           pool_y: torch.Tensor) -> dict[str, float]:
    def plurality(p: torch.Tensor, y: torch.Tensor) -> float:
        return float((votes(p).argmax(-1) == y).float().mean())

    return {"mean_accuracy": round(float((p_eval.argmax(-1) == eval_y).float().mean()), 4),
            "plurality_eval": round(plurality(p_eval, eval_y), 4),
            "plurality_pool": round(plurality(p_pool, pool_y), 4)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_data_flags(parser)
    parser.add_argument("--teachers", type=int, default=250)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=1e-2)
    parser.add_argument("--whiten", type=int, default=0, metavar="K",
                        help="project each map on the pool's K leading principal components")
    parser.add_argument("--shrinkage", type=float, default=0.1,
                        help="with --whiten: add this times the mean variance to each one")
    parser.add_argument("--votes-out", type=Path, help="write the pair's votes on the pool")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=Path("results/bench_linear_experts.jsonl"))
    args = parser.parse_args()
    if args.whiten < 0 or args.shrinkage < 0:
        parser.error("--whiten and --shrinkage must be at least 0")
    torch.set_num_threads(args.threads)
    task = load_task(source_from_flags(args))
    assert task.pool_y is not None and task.eval_y is not None, "needs a labelled benchmark"
    partition = make_partition(len(task.private_y), args.teachers, seed=0)
    per_teacher = int(partition.sizes.min())  # as many rows each, to stack them in one tensor
    parts = np.stack([rows[:per_teacher] for rows in partition.parts()])
    y = torch.as_tensor(task.private_y)[parts]
    eval_y, pool_y = torch.as_tensor(task.eval_y), torch.as_tensor(task.pool_y)
    scatter = Scattering(tuple(task.pool_x.shape[1:]))
    settings = {"teachers": args.teachers, "rows_each": per_teacher, "whiten": args.whiten,
                "shrinkage": args.shrinkage if args.whiten else None,
                "weight_decay": args.weight_decay}
    probs = {}
    for name, fixed in (("hog", HOG()), ("scattering", scatter)):
        start = time.perf_counter()
        private, pool, evaluation = (features(fixed, x) for x in
                                     (task.private_x, task.pool_x, task.eval_x))
        if args.whiten:
            mean, projection = pool_whitening(pool, args.whiten, args.shrinkage)
            private, pool, evaluation = ((z - mean) @ projection
                                         for z in (private, pool, evaluation))
        weights, bias = train_experts(private[parts], y, len(task.classes), args.steps, args.lr,
                                      args.weight_decay)
        probs[name] = (probabilities(evaluation, weights, bias),
                       probabilities(pool, weights, bias))
        emit({"experts": name, **settings, **scores(*probs[name], eval_y, pool_y),
              "seconds": round(time.perf_counter() - start, 1)}, args.out, threads=args.threads)
    pair = [(a + b) / 2 for a, b in zip(probs["hog"], probs["scattering"], strict=True)]
    emit({"experts": "hog+scattering (mean of probabilities)", **settings,
          **scores(*pair, eval_y, pool_y)}, args.out, threads=args.threads)
    if args.votes_out is not None:
        # votes are a private artifact: owner-only, written whole or not at all
        write_with_atomic(args.votes_out, lambda f: np.save(f, votes(pair[1]).numpy()),
                          private=True)


if __name__ == "__main__":
    main()
