"""Benchmark of DP-SGD with gradient encoding and denoising (``student.encoded_dpsgd``, issue 30)
against plain DP-SGD (``student.dpsgd``) on Fashion-MNIST (MNIST too where its files are on disk).

Variants, all with the same tempered-sigmoid CNN, hyper-parameters, epochs and training rows:
``plain`` (the project's DP-SGD learner), ``plain-ks`` (plain clipping, Gaussian noise, KS
denoising), ``enc-gauss``, ``enc-gauss-ks``, ``enc-t``, ``enc-t-ks`` (encoding against 1 000
profiles; Gaussian or Student-t noise with 9 degrees of freedom; with or without denoising). For
each target epsilon (delta 1e-5) the noise multiplier of each family is calibrated once by its
accountant, so every variant runs at the same epsilon; every (epsilon, seed) trains each variant
once (``--seeds`` seeds the weight initialisation; sampling and noise come from the OS). One JSON
row per run (accuracy, epsilon, noise multiplier, seconds per epoch) is appended to ``--out``;
``--summary`` reads those rows and prints mean and standard deviation per variant and epsilon;
``--grid`` prints the accountant's epsilon against the size of its shift grid.

Full size (every private training row, 40 epochs as the DP-SGD benchmark, 3 seeds):

    python scripts/bench_dpsgd_encoding.py --epsilons 1 2 4 8 --seeds 0 1 2 --epochs 40

Reduced (docs/benchmarks.md): ``--rows 8192 --epochs 4``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch
from bench_common import emit

from analysis.encoded_rdp import EncodedAccountant, encoded_accountant
from analysis.encoding_profiles import sorted_profiles
from analysis.noise_families import noise_family
from pate.data.datasets import load_dataset, public_split
from pate.errors import UserError
from student.choices import DEFAULT_CNN_PARAMETERS
from student.dpsgd import DPSGDConfig, train_dpsgd
from student.encoded_dpsgd import EncodingConfig, train_encoded_dpsgd

OUT = Path("results/bench_dpsgd_encoding.jsonl")
PROFILES = 1000
VARIANTS: dict[str, EncodingConfig | None] = {
    "plain": None,
    "plain-ks": EncodingConfig(denoise="ks"),
    "enc-gauss": EncodingConfig(encode=PROFILES),
    "enc-gauss-ks": EncodingConfig(encode=PROFILES, denoise="ks"),
    "enc-t": EncodingConfig(noise="student-t", encode=PROFILES),
    "enc-t-ks": EncodingConfig(noise="student-t", encode=PROFILES, denoise="ks"),
}
_KEYS = ("accuracy", "epsilon", "rdp_order", "noise_multiplier", "sampling_rate", "steps",
         "train_seconds", "noise_source")


def _datasets(names: list[str]) -> list:
    out = []
    for name in names:
        try:
            out.append(load_dataset(name))
        except UserError as exc:
            print(f"skipping {name}: {exc}", file=sys.stderr)
    return out


def _noise_multipliers(variants: list[str], eps: float, q: float, steps: int, delta: float,
                       dimension: int) -> dict[str, float]:
    """The noise multiplier of each variant at ``eps``: one calibration per noise family."""
    by_family: dict[str, float] = {}
    out = {}
    for v in variants:
        encoding = VARIANTS[v] or EncodingConfig()
        if encoding.noise not in by_family:
            by_family[encoding.noise] = encoded_accountant(
                encoding.noise, encoding.dof, encoding.encode, dimension, encoding.encode_seed
            ).noise_multiplier_for_epsilon(eps, q, steps, delta)
        out[v] = by_family[encoding.noise]
    return out


def train(args: argparse.Namespace) -> None:
    for ds in _datasets(args.datasets):
        (pool_x, _), (eval_x, eval_y) = public_split(ds)
        norm = (float(pool_x.mean()), float(pool_x.std()))
        rows = np.random.default_rng(0).permutation(len(ds.train_y))[:args.rows]
        train_x, train_y = ds.train_x[np.sort(rows)], ds.train_y[np.sort(rows)]
        n = len(train_y)
        q = min(1.0, args.batch_size / n)
        # Opacus's DPDataLoader takes int(1 / q) batches per epoch.
        steps = args.epochs * int(1 / q)
        dimension = sum(p.numel() for p in _model(ds, norm).parameters())
        sigmas = {eps: _noise_multipliers(args.variants, eps, q, steps, args.delta, dimension)
                  for eps in args.epsilons}
        # Seeds outermost, so that a run cut short still covers every epsilon and variant.
        for seed in args.seeds:
            for eps in args.epsilons:
                for v in args.variants:
                    config = DPSGDConfig(epochs=args.epochs, expected_batch_size=args.batch_size,
                                         noise_multiplier=sigmas[eps][v], delta=args.delta,
                                         init_seed=seed)
                    start = time.perf_counter()
                    m = (train_dpsgd(train_x, train_y, eval_x, eval_y, ds.num_classes, config,
                                     norm) if VARIANTS[v] is None else
                         train_encoded_dpsgd(train_x, train_y, eval_x, eval_y, ds.num_classes,
                                             config, VARIANTS[v], norm)).metrics
                    emit({"bench": "dpsgd_encoding", "dataset": ds.name, "variant": v,
                          "target_epsilon": eps, "seed": seed, "rows": n,
                          "epochs": args.epochs, "batch_size": args.batch_size,
                          **{k: m[k] for k in _KEYS},
                          "seconds_per_epoch": m["train_seconds"] / args.epochs,
                          "denoise_mean_factor": m.get("denoise_mean_factor"),
                          "wall_seconds": time.perf_counter() - start},
                         args.out, torch_threads=torch.get_num_threads())


def _model(ds, norm: tuple[float, float]) -> torch.nn.Module:
    from student.dpsgd import tempered_cnn

    return tempered_cnn(tuple(ds.train_x.shape[1:]), ds.num_classes, *norm)


def summary(args: argparse.Namespace) -> None:
    """Mean and standard deviation (ddof 1) of accuracy per (dataset, variant, epsilon), and the
    mean seconds per epoch per variant, as one JSON object."""
    rows = [json.loads(line) for line in args.out.read_text().splitlines() if line.strip()]
    groups: dict[tuple[str, str, float], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["variant"], r["target_epsilon"]), []).append(r)
    table = [{"dataset": d, "variant": v, "target_epsilon": e, "runs": len(g),
              "accuracy_mean": float(np.mean([r["accuracy"] for r in g])),
              "accuracy_std": float(np.std([r["accuracy"] for r in g], ddof=1))
              if len(g) > 1 else None,
              "epsilon": float(np.max([r["epsilon"] for r in g])),
              "noise_multiplier": g[0]["noise_multiplier"]}
             for (d, v, e), g in sorted(groups.items())]
    speed: dict[str, list[float]] = {}
    for r in rows:
        speed.setdefault(r["variant"], []).append(r["seconds_per_epoch"])
    print(json.dumps({"table": table,
                      "seconds_per_epoch": {v: {"mean": float(np.mean(s)),
                                                "std": float(np.std(s, ddof=1))
                                                if len(s) > 1 else None, "runs": len(s)}
                                            for v, s in speed.items()}}, indent=1))
    if args.plot is not None:
        _plot(table, args.plot)


def _plot(table: list[dict], out: Path) -> None:
    """Accuracy (mean, bars one standard deviation) against target epsilon per variant, in the
    style of the report's figures (pate.report.figures)."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    styles = {"plain": ("tab:red", "s--"), "plain-ks": ("tab:red", "s:"),
              "enc-gauss": ("tab:blue", "o-"), "enc-gauss-ks": ("tab:blue", "o:"),
              "enc-t": ("tab:green", "^-"), "enc-t-ks": ("tab:green", "^:")}
    for v, (colour, style) in styles.items():
        pts = sorted((r for r in table if r["variant"] == v), key=lambda r: r["target_epsilon"])
        if pts:
            ax.errorbar([r["target_epsilon"] for r in pts], [r["accuracy_mean"] for r in pts],
                        yerr=[r["accuracy_std"] or 0.0 for r in pts], fmt=style, color=colour,
                        capsize=3, label=v)
    ax.set_xscale("log", base=2)
    ticks = sorted({r["target_epsilon"] for r in table})
    ax.set_xticks(ticks, [f"{e:g}" for e in ticks])
    ax.set_xlabel("ε (δ = 1e-5)")
    ax.set_ylabel("Accuracy on the evaluation data")
    ax.set_title("DP-SGD: gradient encoding, noise family, denoising")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, format="png", dpi=110)


def grid(args: argparse.Namespace) -> None:
    """Epsilon of one full-size setting (q = 2048 / 60000, 40 epochs of 29 steps, the noise
    multiplier ``--sigma``) against the grid size, per non-Gaussian family."""
    profiles = sorted_profiles(PROFILES, args.dimension, 0)
    q, steps = 2048 / 60000, 40 * 29
    for family in ("student-t", "laplace"):
        for size in args.grid_sizes:
            start = time.perf_counter()
            eps, order = EncodedAccountant(noise_family(family), profiles, size).epsilon(
                q, args.sigma, steps, args.delta)
            print(json.dumps({"family": family, "grid_size": size, "epsilon": eps,
                              "order": order, "sigma": args.sigma,
                              "seconds": time.perf_counter() - start}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--datasets", nargs="*", default=["fashion-mnist", "mnist"])
    parser.add_argument("--epsilons", type=float, nargs="*", default=[1.0, 2.0, 4.0, 8.0])
    parser.add_argument("--seeds", type=int, nargs="*", default=[0, 1, 2])
    parser.add_argument("--variants", nargs="*", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--epochs", type=int, default=40)
    parser.add_argument("--rows", type=int, default=None,
                        help="train on a fixed random subset of this many private rows")
    parser.add_argument("--batch-size", type=int, default=2048)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--summary", action="store_true", help="summarise --out and stop")
    parser.add_argument("--plot", type=Path, default=None,
                        help="with --summary: accuracy against epsilon, as a PNG")
    parser.add_argument("--grid", action="store_true", help="epsilon against grid size, stop")
    parser.add_argument("--grid-sizes", type=int, nargs="*", default=[250, 500, 1000, 2000, 4000,
                                                                       8000])
    parser.add_argument("--sigma", type=float, default=1.0)
    parser.add_argument("--dimension", type=int, default=DEFAULT_CNN_PARAMETERS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.summary:
        summary(args)
    elif args.grid:
        grid(args)
    else:
        train(args)


if __name__ == "__main__":
    main()
