"""Reproduce the shape of PATE 2018's Figure 4 and its Glyph rows of Table 1 on our synthetic
``glyphs`` task.

For each ensemble size it trains teachers on the same glyph training set (``pate teachers train``
then ``pate teachers votes``, real runs under --out), then, over the teachers' votes on the public
pool:

- Figure 4 (left): accuracy of the aggregated labels against the privacy cost of answering
  ``--queries`` queries, LNMax against GNMax over a range of noise scales;
- Figure 4 (right): the same trade-off for GNMax with more or fewer teachers;
- Table 1's Glyph rows: Confident-GNMax, queries answered, label accuracy of the answered ones and
  epsilon (data-independent, data-dependent, smooth-sensitivity-sanitised).

Label accuracies are Monte-Carlo averages over noise draws from a fixed seed (an offline
experiment, not a release). Writes reproduction.json, figures/*.png and reproduction.html under
--out and prints one JSON object per ensemble size.

    python scripts/reproduce_glyphs.py --teachers 50 100 250 --train-size 60000 --test-size 10000
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from analysis.report import figure_png, render_html
from analysis.votes_analysis import AggregatorParams, analyze_votes
from pate.datasets import load_dataset, public_split


def train_ensemble(run: Path, teachers: int, epochs: int, env: dict[str, str]) -> float:
    """Train ``teachers`` teachers on glyphs into ``run`` and collect their votes (resumable)."""
    start = time.monotonic()
    if not (run / "votes.npz").is_file():
        for argv in (["teachers", "train", "--run", str(run), "--dataset", "glyphs",
                      "--teachers", str(teachers), "--epochs", str(epochs)],
                     ["teachers", "votes", "--run", str(run)]):
            subprocess.run([sys.executable, "-m", "pate", *argv], check=True, env=env)
    return time.monotonic() - start


def noisy_argmax_accuracy(votes: NDArray[np.int64], truth: NDArray[np.int64], noise: str,
                          scale: float, rng: np.random.Generator, trials: int = 8) -> float:
    """Mean accuracy of argmax(votes + noise) over ``trials`` draws (LNMax: Laplace(scale);
    GNMax: N(0, scale^2)), vectorised over trials, queries and classes."""
    shape = (trials, *votes.shape)
    draws = (rng.laplace(0.0, scale, shape) if noise == "laplace"
             else rng.normal(0.0, scale, shape))
    return float(np.mean((votes[None] + draws).argmax(axis=2) == truth[None]))


def confident_accuracy(votes: NDArray[np.int64], truth: NDArray[np.int64],
                       params: AggregatorParams, rng: np.random.Generator,
                       trials: int = 8) -> tuple[float, float]:
    """(expected answered, accuracy of the answered labels) of Confident-GNMax (Algorithm 1)."""
    assert params.threshold is not None and params.sigma1 is not None
    top = votes.max(axis=1)
    passed = top[None] + rng.normal(0, params.sigma1, (trials, top.size)) >= params.threshold
    labels = (votes[None] + rng.normal(0, params.gnmax_sigma, (trials, *votes.shape))).argmax(2)
    return float(passed.sum() / trials), float(np.mean(labels[passed] == np.broadcast_to(
        truth, labels.shape)[passed]))


def trade_off(votes: NDArray[np.int64], truth: NDArray[np.int64], mechanism: str,
              scales: NDArray[np.float64], delta: float, rng: np.random.Generator
              ) -> list[dict[str, float]]:
    points = []
    for s in scales:
        params = (AggregatorParams("lnmax", scale=float(s)) if mechanism == "lnmax"
                  else AggregatorParams("gnmax", sigma=float(s)))
        r = analyze_votes(votes, params, delta)
        points.append({"scale": float(s), "epsilon": r["data_dependent"]["epsilon"],
                       "epsilon_data_independent": r["data_independent"]["epsilon"],
                       "label_accuracy": noisy_argmax_accuracy(
                           votes, truth, "laplace" if mechanism == "lnmax" else "gauss",
                           float(s), rng)})
    return points


def plot_trade_off(series: dict[str, list[dict[str, float]]], title: str, queries: int,
                   delta: float) -> Figure:
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for label, points in series.items():
        ax.plot([p["epsilon"] for p in points], [p["label_accuracy"] for p in points],
                marker="o", lw=2, label=label)
    ax.set_xscale("log")
    ax.set_xlabel(f"Data-dependent ε of {queries} answers at δ = {delta:g} (log scale)")
    ax.set_ylabel("Accuracy of the aggregated labels")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, nargs="+", default=[50, 100, 250])
    parser.add_argument("--train-size", type=int, default=60_000)
    parser.add_argument("--test-size", type=int, default=10_000)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--out", type=Path, default=Path("results/glyphs"))
    args = parser.parse_args()

    env = {**os.environ, "PATE_GLYPHS_SIZE": f"{args.train_size},{args.test_size}"}
    os.environ.update(env)
    ds = load_dataset("glyphs", need_train=False)
    (_, pool_y), _ = public_split(ds)
    rng = np.random.default_rng(2018)  # offline experiment: a fixed seed, not a release
    results, by_size = [], {}
    for n in sorted(args.teachers):
        run = args.out / f"teachers-{n}"
        seconds = train_ensemble(run, n, args.epochs, env)
        with np.load(run / "votes.npz") as f:
            order = np.argsort(f["pool_index"])
            votes = f["votes"][order][: args.queries].astype(np.int64)
            truth = pool_y[np.sort(f["pool_index"])][: args.queries]
        manifest = json.loads((run / "teachers" / "manifest.json").read_text())
        scale = n / 250.0  # noise grids scale with the ensemble, as vote margins do
        gnmax = trade_off(votes, truth, "gnmax", scale * np.geomspace(2, 200, 9), args.delta,
                          rng)
        lnmax = trade_off(votes, truth, "lnmax", scale * np.geomspace(1, 100, 9), args.delta,
                          rng)
        confident = AggregatorParams("confident", threshold=0.6 * n, sigma1=0.5 * n,
                                     sigma2=0.16 * n)
        analysis = analyze_votes(votes, confident, args.delta)
        answered, label_acc = confident_accuracy(votes, truth, confident, rng)
        row = {"teachers": n, "train_seconds": round(seconds, 1),
               "teacher_accuracy_mean": manifest["accuracy"]["mean"],
               "plurality_accuracy": float(np.mean(votes.argmax(1) == truth)),
               "gnmax": gnmax, "lnmax": lnmax,
               "table1": {"mechanism": "Confident-GNMax",
                          "params": {"threshold": confident.threshold,
                                     "sigma1": confident.sigma1, "sigma2": confident.sigma2},
                          "queries": args.queries, "answered": answered,
                          "label_accuracy": label_acc,
                          "epsilon_data_independent": analysis["data_independent"]["epsilon"],
                          "epsilon_data_dependent": analysis["data_dependent"]["epsilon"],
                          "epsilon_smooth_sensitivity":
                              analysis["smooth_sensitivity"]["epsilon"]}}
        print(json.dumps({k: v for k, v in row.items() if k not in ("gnmax", "lnmax")}),
              flush=True)
        results.append(row)
        by_size[n] = row

    largest = by_size[max(by_size)]
    figures = {
        "figure4_left.png": plot_trade_off(
            {"LNMax": largest["lnmax"], "GNMax": largest["gnmax"]},
            f"LNMax vs GNMax, {max(by_size)} teachers", args.queries, args.delta),
        "figure4_right.png": plot_trade_off(
            {f"GNMax, {n} teachers": by_size[n]["gnmax"] for n in sorted(by_size)},
            "GNMax with more teachers", args.queries, args.delta),
    }
    pngs = {name: figure_png(fig) for name, fig in figures.items()}
    (args.out / "figures").mkdir(parents=True, exist_ok=True)
    for name, png in pngs.items():
        (args.out / "figures" / name).write_bytes(png)
    (args.out / "reproduction.json").write_text(json.dumps(results, indent=2) + "\n")
    rows = "".join(
        f"<tr><td>{r['teachers']}</td><td>{r['teacher_accuracy_mean']:.3f}</td>"
        f"<td>{r['plurality_accuracy']:.3f}</td><td>{r['table1']['answered']:.0f}</td>"
        f"<td>{r['table1']['label_accuracy']:.3f}</td>"
        f"<td>{r['table1']['epsilon_data_independent']:.3f}</td>"
        f"<td>{r['table1']['epsilon_data_dependent']:.3f}</td>"
        f"<td>{r['table1']['epsilon_smooth_sensitivity']:.3f}</td></tr>" for r in results)
    table = ("<table><tr><th>Teachers</th><th>Mean teacher accuracy</th><th>Plurality "
             "accuracy</th><th>Answered</th><th>Label accuracy</th><th>ε data-independent</th>"
             "<th>ε data-dependent</th><th>ε smooth-sensitivity</th></tr>" + rows + "</table>")
    (args.out / "reproduction.html").write_text(render_html(
        "Glyphs: PATE 2018 Figure 4 and Table 1 (Confident-GNMax rows)",
        [(f"Table 1, Glyph rows ({args.queries} queries, δ = {args.delta:g})", table)], pngs))


if __name__ == "__main__":
    main()
