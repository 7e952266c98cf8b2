"""Levers on the student, measured offline on one run's answered labels (issue 27, item 3).

Trains the run's student network (default ``cnn-hog``, supervised, Adam 1e-3, batch 32 labelled
and 128 unlabelled, as ``pate student train``; ``--method vat [--entmin]`` for VAT) on the
answers in ``--labels RUN/labels.npz`` with the whole pool of ``--dataset`` (default
Fashion-MNIST; ``--data-dir``, ``--pool-size`` as for ``pate student train``) unlabelled,
evaluates on the evaluation part, and prints one JSON line per seed (appended to
results/bench_student_levers.jsonl). Nothing is asked of any aggregator: every lever reads only
the answers already paid for and the public pool.

``--lever``:
- ``none``: the student as the run trains it.
- ``fixmatch``: consistency with strong augmentation (K. Sohn et al., "FixMatch", NeurIPS 2020,
  §2.3): a pool row whose (weakly shifted) prediction has confidence >= ``--tau`` gets its
  argmax as a pseudo-label for a strongly augmented copy (random rotation, shear, scale,
  translation, mirroring, contrast and brightness, and a 11x11 cutout), weight ``--lam``.
  Mirroring only with ``--augment shift-flip``, the flag that says the labels survive it.
- ``mean-teacher``: consistency with an exponential moving average of the student (A. Tarvainen,
  H. Valpola, "Mean teachers are better role models", NeurIPS 2017, §2): the squared distance
  between the student's class probabilities on the unlabelled batch and those of its average
  (decay ``--ema``) on an independently shifted copy, weight ``--lam`` ramped up as
  exp(-5 (1 - t)^2) over the first quarter of the steps; the average is the model evaluated.
- ``gce``: the generalised cross-entropy (Z. Zhang, M. Sabuncu, "Generalized Cross Entropy Loss
  for Training Deep Neural Networks with Noisy Labels", NeurIPS 2018, eq. 6):
  (1 - p_y^q) / q with q = ``--q``, a loss bounded in the probability of the label, so a wrong
  answer the network cannot fit pulls less than under cross-entropy (q -> 0 is cross-entropy,
  q = 1 the mean absolute error); the pool unused, as ``none``.
- ``mixup``: mixup of the labelled batch (H. Zhang et al., "mixup: Beyond Empirical Risk
  Minimization", ICLR 2018, §2, whose §3.4 finds it robust to corrupted labels): each step
  trains on lam x_i + (1 - lam) x_j with the loss lam CE(y_i) + (1 - lam) CE(y_j), lam drawn
  from Beta(``--alpha``, ``--alpha``), j a permutation of the batch; the pool unused, as
  ``none``.
- ``self-train``: ``--rounds`` rounds of self-training: the pool rows the last student predicts
  with confidence >= ``--st-tau`` join the answers with its labels, and a fresh student trains
  on both (a classic of semi-supervised learning; Q. Xie et al., "Self-training with Noisy
  Student", CVPR 2020, without the noise).

``--labels-from`` (the labels any lever learns from):
- ``answers``: the run's answers, as paid for.
- ``true``: a diagnostic: the pool's true labels of the asked rows (``--true-rows 0``) or of
  the first ``--true-rows`` pool rows, which no private run has; the ceiling a student could
  reach from perfect answers.
- ``plurality``: a diagnostic too: the noiseless plurality of the run's teachers (``--votes
  RUN/votes.npz``, a private artifact read offline) on the same rows, what the teachers could
  teach with an unlimited budget.

    python scripts/bench_student_levers.py --labels RUN/labels.npz --lever fixmatch \
        --epochs 40 --seeds 0 1 2 [--augment shift-flip] [--threads 1]
    python scripts/bench_student_levers.py --labels RUN/labels.npz --lever fixmatch --width 64 \
        --batch-size 64 --unlabelled-batch-size 448 --epochs 600 --eval-every 60 --device cuda
    python scripts/bench_student_levers.py --labels MNIST/labels.npz --dataset mnist \
        --data-dir DIR --pool-size 9000 --arch cnn --method vat --entmin --augment shift --epochs 30
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from bench_common import emit

from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.augment import random_augment
from pate.data.task import load_task
from pate.data.votes_file import load_votes_with_index
from student.losses import cross_entropy
from student.models import ModelSpec, build_classifier
from student.training import (
    FitConfig,
    MethodConfig,
    accuracy,
    build_learner,
    fit,
    predict_proba,
    seed_everything,
)

OUT = Path("results/bench_student_levers.jsonl")
CUTOUT_HALF = 5  # an 11x11 square


def strong_augment(x: torch.Tensor, gen: torch.Generator, mirror: bool = True) -> torch.Tensor:
    """A RandAugment-like strong augmentation of ``x [N, 1, H, W]`` in [0, 1], one batched
    affine resampling: rotation up to 20 degrees, shear up to 0.3, scale 0.85-1.15, translation
    up to an eighth of the side, mirroring (a fair coin per image, drawn either way, applied with
    ``mirror``); then contrast 0.5-1.5 and brightness +-0.2 per image, and a square cutout."""
    n, _, h, w = x.shape

    def uniform(*shape: int) -> torch.Tensor:
        return torch.rand(*shape, generator=gen) * 2 - 1

    angle, shear, scale = uniform(n) * math.radians(20), uniform(n) * 0.3, 1 + uniform(n) * 0.15
    coin = torch.rand(n, generator=gen) < 0.5
    flip = torch.where(coin & mirror, -1.0, 1.0)
    cos, sin = torch.cos(angle), torch.sin(angle)
    theta = torch.stack([torch.stack([cos * flip, shear - sin, uniform(n) * 0.25], 1),
                         torch.stack([sin * flip, cos, uniform(n) * 0.25], 1)], 1)
    theta[:, :, :2] /= scale[:, None, None]
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    y = F.grid_sample(x, grid, align_corners=False)
    mean = y.mean(dim=(1, 2, 3), keepdim=True)
    contrast, brightness = 1 + uniform(n, 1, 1, 1) * 0.5, uniform(n, 1, 1, 1) * 0.2
    y = ((y - mean) * contrast.to(x.device) + mean + brightness.to(x.device)).clamp(0, 1)
    cy, cx = torch.randint(0, h, (n,), generator=gen), torch.randint(0, w, (n,), generator=gen)
    rows, cols = torch.arange(h)[None, :, None], torch.arange(w)[None, None, :]
    hole = ((rows - cy[:, None, None]).abs() <= CUTOUT_HALF) & (
        (cols - cx[:, None, None]).abs() <= CUTOUT_HALF)
    return y * (~hole)[:, None].to(x.device, x.dtype)


class FixMatchLearner:
    """Cross-entropy on the labelled batch plus ``lam`` times the masked cross-entropy of the
    strongly augmented unlabelled batch against the confident predictions of the unlabelled
    batch as given (FixMatch, eq. 4); one forward pass for the three. For an Experts network the
    pseudo-label is the mean of the experts' probabilities and every expert learns from it.
    ``mirror``: whether the strong augmentation mirrors."""

    def __init__(self, model: torch.nn.Module, lr: float, tau: float, lam: float,
                 seed: int, mirror: bool) -> None:
        self.model, self.tau, self.lam, self.mirror = model, tau, lam, mirror
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]
        self.gen = torch.Generator().manual_seed(seed)

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        n, m = len(x_lab), len(x_unl)
        out = self.model(torch.cat([x_lab, x_unl, strong_augment(x_unl, self.gen, self.mirror)]))
        with torch.no_grad():
            logp = out[n:n + m].log_softmax(-1)
            if logp.dim() == 3:  # Experts: the mean of the experts' probabilities
                logp = torch.logsumexp(logp, -2) - math.log(logp.shape[-2])
            confidence, pseudo = logp.exp().max(-1)
            mask = confidence >= self.tau
        sup = cross_entropy(out[:n], y_lab)
        unsup = (cross_entropy(out[n + m:][mask], pseudo[mask]) * mask.sum() / m
                 if mask.any() else out.sum() * 0)
        opt.zero_grad(set_to_none=True)
        (sup + self.lam * unsup).backward()
        opt.step()
        return {"supervised": float(sup.detach()), "consistency": float(unsup.detach()),
                "mask": float(mask.float().mean())}


class GCELearner:
    """Adam on the generalised cross-entropy (1 - p_y^q) / q of the labelled batch (Zhang and
    Sabuncu 2018, eq. 6), summed over an Experts network's experts like ``cross_entropy``."""

    def __init__(self, model: torch.nn.Module, lr: float, q: float) -> None:
        self.model, self.q = model, q
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        logits = self.model(x_lab)
        logp = torch.log_softmax(logits, dim=-1)
        index = y_lab.reshape(-1, *(1,) * (logits.dim() - 1)).expand(*logits.shape[:-1], 1)
        loss = ((1 - (self.q * logp.gather(-1, index)).exp()) / self.q).sum() / len(x_lab)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"supervised": float(loss.detach())}


class MixupLearner:
    """Adam on the mixup of the labelled batch (Zhang et al. 2018, §2): the cross-entropy of a
    convex combination of two rows against both labels, weighted alike."""

    def __init__(self, model: torch.nn.Module, lr: float, alpha: float, seed: int) -> None:
        self.model = model
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]
        self.beta = torch.distributions.Beta(alpha, alpha)
        self.gen = torch.Generator().manual_seed(seed)

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        lam = float(self.beta.sample())
        perm = torch.randperm(len(x_lab), generator=self.gen).to(x_lab.device)
        logits = self.model(lam * x_lab + (1 - lam) * x_lab[perm])
        loss = lam * cross_entropy(logits, y_lab) + (1 - lam) * cross_entropy(logits, y_lab[perm])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        return {"supervised": float(loss.detach())}


class MeanTeacherLearner:
    """Cross-entropy on the labelled batch plus ``lam * ramp(t)`` times the squared distance
    between the student's probabilities on the unlabelled batch and its moving average's on a
    shifted copy (Tarvainen & Valpola 2017, §2 and §3.1: ramp-up exp(-5 (1 - t)^2), the average
    updated after each step, its batch-norm statistics the student's). Experts networks: every
    expert against the same expert of the average."""

    def __init__(self, model: torch.nn.Module, lr: float, lam: float, ema: float,
                 ramp_steps: int, seed: int) -> None:
        self.model, self.lam, self.ema, self.ramp_steps = model, lam, ema, max(1, ramp_steps)
        self.average = copy.deepcopy(model).requires_grad_(False)
        self.optimizers = [torch.optim.Adam(model.parameters(), lr=lr)]
        self.gen = torch.Generator().manual_seed(seed)
        self.steps = 0

    def step(self, x_lab: torch.Tensor, y_lab: torch.Tensor, x_unl: torch.Tensor
             ) -> dict[str, float]:
        (opt,) = self.optimizers
        n = len(x_lab)
        out = self.model(torch.cat([x_lab, x_unl]))
        with torch.no_grad():
            target = self.average(random_augment(x_unl, "shift", self.gen)).softmax(-1)
        sup = cross_entropy(out[:n], y_lab)
        consistency = (out[n:].softmax(-1) - target).pow(2).sum(-1).mean()
        weight = self.lam * math.exp(-5 * (1 - min(1.0, self.steps / self.ramp_steps)) ** 2)
        opt.zero_grad(set_to_none=True)
        (sup + weight * consistency).backward()
        opt.step()
        self.steps += 1
        with torch.no_grad():
            for avg, cur in zip(self.average.parameters(), self.model.parameters(), strict=True):
                avg.lerp_(cur, 1 - self.ema)
            for avg, cur in zip(self.average.buffers(), self.model.buffers(), strict=True):
                avg.copy_(cur)
        return {"supervised": float(sup.detach()), "consistency": float(consistency.detach())}


def train(args: argparse.Namespace, spec: ModelSpec, seed: int, pool_x: np.ndarray,
          li: np.ndarray, ly: np.ndarray, eval_x: np.ndarray, eval_y: np.ndarray
          ) -> tuple[torch.nn.Module, float]:
    """One student ``spec`` from ``seed`` on the labelled rows ``(li, ly)``; returns it and its
    accuracy."""
    seed_everything(seed)
    method = MethodConfig(args.method, spec.arch, spec.width, entmin=args.entmin)
    model = build_classifier(spec).to(args.device)
    config = FitConfig(args.epochs, args.batch_size, args.unlabelled_batch_size,
                       lr=method.learning_rate, augment=args.augment, seed=seed,
                       device=args.device)
    if args.lever == "fixmatch":
        learner = FixMatchLearner(model, method.learning_rate, args.tau, args.lam, seed,
                                  mirror=args.augment == "shift-flip")
    elif args.lever == "mean-teacher":
        steps = len(pool_x) // min(config.unlabelled_batch_size, len(pool_x)) * args.epochs
        learner = MeanTeacherLearner(model, method.learning_rate, args.lam, args.ema,
                                     steps // 4, seed)
        model = learner.average
    elif args.lever == "gce":
        learner = GCELearner(model, method.learning_rate, args.q)
    elif args.lever == "mixup":
        learner = MixupLearner(model, method.learning_rate, args.alpha, seed)
    else:
        learner = build_learner(method, model, spec)

    def progress(epoch: int, losses: dict[str, float]) -> None:
        """Every ``--eval-every`` epochs, one line of the evaluated model's accuracy so far."""
        if args.eval_every and (epoch + 1) % args.eval_every == 0:
            acc = accuracy(model, eval_x, eval_y, args.device)
            model.train()  # back in training mode: the mean teacher's average too
            learner.model.train()
            print(json.dumps({"seed": seed, "epoch": epoch + 1, "accuracy": acc, **losses}),
                  file=sys.stderr, flush=True)

    fit(learner, pool_x[li], ly, pool_x, config, on_epoch=progress)
    return model, accuracy(model, eval_x, eval_y, args.device)


def plurality(args: argparse.Namespace, ap: argparse.ArgumentParser,
              rows: np.ndarray) -> np.ndarray:
    """The teachers' plurality on the pool rows ``rows`` (ties to the lower class)."""
    if args.votes is None:
        ap.error("--labels-from plurality needs --votes RUN/votes.npz")
    votes, index = load_votes_with_index(args.votes)
    where = np.full(int(index.max()) + 1, -1)
    where[index] = np.arange(len(index))
    if np.any(rows > index.max()) or np.any(where[rows] < 0):
        ap.error(f"{args.votes} has no votes on some of the rows asked")
    return votes[where[rows]].argmax(axis=1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--labels", type=Path, required=True, help="a run's labels.npz")
    ap.add_argument("--lever", choices=("none", "fixmatch", "mean-teacher", "gce", "mixup",
                                        "self-train"), default="none")
    ap.add_argument("--labels-from", choices=("answers", "true", "plurality"),
                    default="answers")
    ap.add_argument("--method", choices=("supervised", "vat"), default="supervised")
    ap.add_argument("--entmin", action="store_true", help="vat: add entropy minimisation")
    ap.add_argument("--arch", default="cnn-hog")
    ap.add_argument("--width", type=int, default=MethodConfig.width,
                    help="channels of the Conv-Small's first layers")
    ap.add_argument("--epochs", type=int, default=20)
    ap.add_argument("--batch-size", type=int, default=32, help="labelled rows per step")
    ap.add_argument("--unlabelled-batch-size", type=int, default=FitConfig.unlabelled_batch_size,
                    help="pool rows per step (one epoch is one pass over the pool)")
    ap.add_argument("--eval-every", type=int, default=0,
                    help="print the accuracy so far every N epochs to stderr (0: never)")
    ap.add_argument("--device", default="cpu", help="torch device of the student (cpu, cuda)")
    ap.add_argument("--augment", default="none", help="weak augmentation (pate.data.augment)")
    ap.add_argument("--tau", type=float, default=0.95, help="fixmatch: confidence threshold")
    ap.add_argument("--lam", type=float, default=1.0,
                    help="fixmatch, mean-teacher: consistency weight")
    ap.add_argument("--ema", type=float, default=0.99, help="mean-teacher: the average's decay")
    ap.add_argument("--q", type=float, default=0.7, help="gce: the loss's exponent")
    ap.add_argument("--alpha", type=float, default=0.4, help="mixup: Beta(alpha, alpha)")
    ap.add_argument("--rounds", type=int, default=1, help="self-train: rounds")
    ap.add_argument("--st-tau", type=float, default=0.9, help="self-train: confidence")
    ap.add_argument("--true-rows", type=int, default=0,
                    help="true, plurality: the first N pool rows (0: the asked rows)")
    ap.add_argument("--votes", type=Path, help="plurality: the run's votes.npz")
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--threads", type=int, default=1)
    add_data_flags(ap, files=False)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    task = load_task(source_from_flags(args), need_private=False)
    pool_x, pool_y, eval_x, eval_y = task.pool_x, task.pool_y, task.eval_x, task.eval_y
    spec = MethodConfig(args.method, args.arch, args.width).spec(task.input_shape, task.num_classes)
    with np.load(args.labels, allow_pickle=False) as data:
        answered = data["label"] >= 0
        li, ly = data["pool_index"][answered], data["label"][answered]
    if args.labels_from != "answers":
        li = np.arange(args.true_rows) if args.true_rows else li
        ly = pool_y[li] if args.labels_from == "true" else plurality(args, ap, li)
    for seed in args.seeds:
        model, acc = train(args, spec, seed, pool_x, li, ly, eval_x, eval_y)
        accs = [acc]
        for r in range(args.rounds if args.lever == "self-train" else 0):
            probs = predict_proba(model, pool_x, args.device)
            confident = probs.max(axis=1) >= args.st_tau
            confident[li] = False
            rows = np.flatnonzero(confident)
            model, acc = train(args, spec, seed + 1000 * (r + 1), pool_x,
                               np.concatenate([li, rows]),
                               np.concatenate([ly, probs[rows].argmax(axis=1)]), eval_x, eval_y)
            accs.append(acc)
        emit({"lever": args.lever, "seed": seed, "accuracy": accs[-1], "accuracies": accs,
              "dataset": task.name, "labels": len(ly),
              "label_accuracy": float(np.mean(ly == pool_y[li])),
              **{k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()
                 if k not in ("seeds", "labels", "dataset")},
              "labels_file": str(args.labels)}, OUT, torch_threads=args.threads)
    return 0


if __name__ == "__main__":
    sys.exit(main())
