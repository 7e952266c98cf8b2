"""Teachers that are linear softmax experts on fixed features: HOG, wavelet scattering, and the
pair (issue 27: can a better fixed feature lift the teachers' plurality?).

The private rows are split as ``pate teachers train`` splits them (``make_partition``, seed 0).
Each of the ``--teachers`` teachers gets a linear softmax per feature map, all trained at once as
one batched tensor, on HOG features (``teachers.hog``) and on scattering features
(``teachers.scattering``: order 2, J = 2, L = 8, each group of three maps normalised by the
example itself). ``--recipe full-batch`` (the default) trains each expert on all its rows at
once (Adam, ``--steps`` steps, an L2 penalty ``--weight-decay`` on the weights); ``--recipe
teachers`` with ``pate teachers train``'s recipe (minibatches of ``--batch-size``, ``--epochs``,
AdamW with decoupled decay ``--weight-decay``, a one-cycle schedule peaking at ``--lr``). A
teacher of the pair votes with the mean of its two experts' probabilities,
as ``teachers.models.Experts`` does. For each it prints the teachers' mean accuracy on the
evaluation half and their plurality's accuracy there and on the pool, one JSON line each,
appended to results/bench_linear_experts.jsonl.

``--whiten K`` first whitens each map's features on the public pool as the
``hog-scatter-whitened`` teachers do (``teachers.whitening.pool_whitening``): their K leading
principal components, each divided by sqrt(v_k + a * mean(v)), a the ``--shrinkage``.
``--votes-out F`` writes the pair's votes on the pool (``[pool rows, classes]``, in the pool's
order) as a ``.npy`` that ``pate student train --votes F`` and
``scripts/bench_ensemble_size.py`` read.

It reads the pool's true labels: an offline experiment to choose a teacher network, not a step of
any release.

    python scripts/bench_linear_experts.py --dataset fashion-mnist --teachers 250
    python scripts/bench_linear_experts.py --dataset fashion-mnist --teachers 250 --whiten 128 \
        --shrinkage 0.1 --weight-decay 3e-2 --votes-out white.npy
    python scripts/bench_linear_experts.py --dataset fashion-mnist --teachers 250 \
        --recipe teachers --lr 0.02 --weight-decay 1e-3 --whiten 128 --shrinkage 1
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
from teachers.whitening import SHRINKAGE, pool_whitening


def features(fixed: torch.nn.Module, x: np.ndarray) -> torch.Tensor:
    """``fixed``'s map of every row of ``x``."""
    return feature_table([fixed], torch.as_tensor(np.ascontiguousarray(x), dtype=torch.float32))


def train_experts(x: torch.Tensor, y: torch.Tensor, classes: int, steps: int, lr: float,
                  weight_decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Weights ``[T, F, C]`` and biases ``[T, 1, C]`` of T linear softmax experts, expert t on
    rows ``x[t] [m, F]`` with labels ``y[t] [m]``: full batch, Adam, an L2 penalty."""
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


def train_as_teachers(xs: list[torch.Tensor], y: torch.Tensor, classes: int, epochs: int,
                      batch_size: int, lr: float, weight_decay: float, seed: int
                      ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The teachers' own recipe (``teachers.ensemble``: the same optimiser, schedule, batches
    and initialisation bounds, not the same random numbers, so a teacher here is one of the
    same distribution as ``pate teachers train``'s) for T teachers whose experts read the
    tables ``xs`` (each ``[T, m, F_e]``, rows in the teacher's order) with labels ``y [T, m]``:
    minibatches of ``batch_size`` drawn from a fresh permutation each epoch, each expert on its
    own cross-entropy, AdamW with decoupled ``weight_decay`` and a one-cycle schedule peaking at
    ``lr``, weights started uniform in +-1/sqrt(F_e). Returns each expert's weights and biases."""
    generator = torch.Generator().manual_seed(seed)
    t, m = y.shape
    params = [(torch.empty(t, x.shape[2], classes).uniform_(-1, 1, generator=generator)
               .mul_(x.shape[2] ** -0.5).requires_grad_(),
               torch.zeros(t, 1, classes, requires_grad=True)) for x in xs]
    opt = torch.optim.AdamW([p for pair in params for p in pair], lr=lr,
                            weight_decay=weight_decay)
    per_epoch = -(-m // batch_size)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=epochs * per_epoch)
    for step in range(epochs * per_epoch):
        if step % per_epoch == 0:
            order = torch.argsort(torch.rand(t, m, generator=generator), 1)
        rows = order[:, (step % per_epoch) * batch_size:(step % per_epoch + 1) * batch_size]
        yb = y.gather(1, rows)
        loss = sum(torch.nn.functional.cross_entropy(
            (torch.einsum("tbf,tfc->tbc", x[torch.arange(t)[:, None], rows], w) + b)
            .flatten(0, 1), yb.flatten()) for x, (w, b) in zip(xs, params, strict=True)) * t
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
    return [(w.detach(), b.detach()) for w, b in params]


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
    parser.add_argument("--recipe", choices=("full-batch", "teachers"), default="full-batch",
                        help="full batch Adam with an L2 penalty, or the teachers' minibatch "
                             "AdamW with a one-cycle schedule")
    parser.add_argument("--steps", type=int, default=300, help="full-batch: Adam's steps")
    parser.add_argument("--epochs", type=int, default=20, help="teachers: epochs")
    parser.add_argument("--batch-size", type=int, default=32, help="teachers: batch size")
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--weight-decay", type=float, default=1e-2,
                        help="full-batch: the L2 penalty; teachers: AdamW's decoupled decay")
    parser.add_argument("--whiten", type=int, default=0, metavar="K",
                        help="project each map on the pool's K leading principal components")
    parser.add_argument("--shrinkage", type=float, default=SHRINKAGE,
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
    settings = {"teachers": args.teachers, "rows_each": per_teacher, "recipe": args.recipe,
                "whiten": args.whiten, "shrinkage": args.shrinkage if args.whiten else None,
                "lr": args.lr, "weight_decay": args.weight_decay}
    start = time.perf_counter()
    tables = {}
    for name, fixed in (("hog", HOG()), ("scattering", scatter)):
        private, pool, evaluation = (features(fixed, x) for x in
                                     (task.private_x, task.pool_x, task.eval_x))
        if args.whiten:
            mean, projection = pool_whitening(pool, args.whiten, args.shrinkage)
            private, pool, evaluation = ((z - mean) @ projection
                                         for z in (private, pool, evaluation))
        tables[name] = (private, pool, evaluation)
    if args.recipe == "teachers":
        trained = train_as_teachers([t[0][parts] for t in tables.values()], y, len(task.classes),
                                    args.epochs, args.batch_size, args.lr, args.weight_decay, 0)
    else:
        trained = [train_experts(t[0][parts], y, len(task.classes), args.steps, args.lr,
                                 args.weight_decay) for t in tables.values()]
    probs = {}
    for (name, (_, pool, evaluation)), (weights, bias) in zip(tables.items(), trained,
                                                              strict=True):
        probs[name] = (probabilities(evaluation, weights, bias),
                       probabilities(pool, weights, bias))
        emit({"experts": name, **settings, **scores(*probs[name], eval_y, pool_y)}, args.out,
             threads=args.threads)
    pair = [(a + b) / 2 for a, b in zip(probs["hog"], probs["scattering"], strict=True)]
    emit({"experts": "hog+scattering (mean of probabilities)", **settings,
          **scores(*pair, eval_y, pool_y), "seconds": round(time.perf_counter() - start, 1)},
         args.out, threads=args.threads)
    if args.votes_out is not None:
        # votes are a private artifact: owner-only, written whole or not at all
        write_with_atomic(args.votes_out, lambda f: np.save(f, votes(pair[1]).numpy()),
                          private=True)


if __name__ == "__main__":
    main()
