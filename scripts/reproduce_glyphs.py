"""Reproduce the shape of PATE 2018's Figure 4 and its Glyph rows of Table 1 on our synthetic
``glyphs`` task.

As in the paper (§5.2), every ensemble size splits the *same* training set (``--train-size``
rendered examples), so more teachers means less data per teacher. For each size it trains the
teachers (``pate teachers train`` then ``pate teachers votes``: real, resumable runs under --out),
then, over the teachers' votes on the public pool:

- Figure 4 (left): accuracy of the aggregated labels against the data-dependent privacy cost of
  answering ``--queries`` queries (4 000 in the paper), LNMax against GNMax over noise scales;
- Figure 4 (right): the same trade-off for GNMax with more or fewer teachers;
- per ensemble, Confident-GNMax at thresholds and noise proportional to the ensemble: queries
  answered, label accuracy of the answers, epsilon (data-independent, data-dependent, smooth-
  sensitivity-sanitised).

Table 1's Glyph rows then train VAT students (``pate student train``, each row its own run and
ledger) on the answers of one ensemble (``--student-teachers``, default 100): LNMax;
Confident-GNMax; Confident-GNMax then Interactive-GNMax (two rounds); and the non-private
baseline, the same network trained on ``--baseline-size`` rows of the sensitive training split.
Each row gives queries asked and answered, the students' accuracy on the evaluation half, and
epsilon at ``--delta``.

Label accuracies are Monte-Carlo averages over noise draws from a fixed seed (an offline
experiment, not a release; the data-dependent epsilon is shown for comparison with the paper,
which a release would not do, docs/design.md, privacy rule 6). Writes reproduction.json,
figures/*.png and reproduction.html under --out and prints one JSON object per ensemble and per
student.

    python scripts/reproduce_glyphs.py --teachers 25 50 100 200 --student-teachers 100
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from numpy.typing import NDArray

from analysis.mechanisms import ConfidentGNMax, GNMax, LNMax
from analysis.votes_analysis import analyze_votes
from pate.data.datasets import load_dataset, public_split
from pate.io import ensure_dir, write_bytes_atomic, write_json_atomic
from pate.report.figures import figure_png
from pate.report.page import render_html
from student.rounds import Received, analyze_rounds


def pate_cli(*argv: str, env: dict[str, str]) -> None:
    """Run ``pate ARGV``: a real CLI run, its one-line summaries on stderr."""
    subprocess.run([sys.executable, "-m", "pate", *argv], check=True, env=env,
                   stdout=sys.stderr)


def train_ensemble(run: Path, teachers: int, args: argparse.Namespace, env: dict[str, str]
                   ) -> None:
    """Train ``teachers`` teachers on glyphs into ``run`` and collect their votes (resumable:
    a finished run is reused). Four shards, two trained at a time, so both CPU cores
    stay busy."""
    if not (run / "votes.npz").is_file():
        pate_cli("teachers", "train", "--run", str(run), "--dataset", "glyphs",
                 "--teachers", str(teachers), "--model", args.model, "--epochs",
                 str(args.epochs), "--batch-size", str(args.batch_size),
                 "--shard-size", str(-(-teachers // 4)), "--workers", "2", env=env)
        pate_cli("teachers", "votes", "--run", str(run), env=env)


def noisy_argmax_accuracy(votes: NDArray[np.int64], truth: NDArray[np.int64], noise: str,
                          scale: float, rng: np.random.Generator, trials: int = 8) -> float:
    """Mean accuracy of argmax(votes + noise) over ``trials`` draws (LNMax: Laplace(scale);
    GNMax: N(0, scale^2)), vectorised over trials, queries and classes."""
    shape = (trials, *votes.shape)
    draws = (rng.laplace(0.0, scale, shape) if noise == "laplace"
             else rng.normal(0.0, scale, shape))
    return float(np.mean((votes[None] + draws).argmax(axis=2) == truth[None]))


def confident_accuracy(votes: NDArray[np.int64], truth: NDArray[np.int64],
                       params: ConfidentGNMax, rng: np.random.Generator,
                       trials: int = 8) -> tuple[float, float]:
    """(expected answered, accuracy of the answered labels) of Confident-GNMax (Algorithm 1)."""
    top = votes.max(axis=1)
    passed = top[None] + rng.normal(0, params.sigma1, (trials, top.size)) >= params.threshold
    labels = (votes[None] + rng.normal(0, params.sigma2, (trials, *votes.shape))).argmax(2)
    return float(passed.sum() / trials), float(np.mean(labels[passed] == np.broadcast_to(
        truth, labels.shape)[passed]))


def trade_off(votes: NDArray[np.int64], truth: NDArray[np.int64], mechanism: str,
              scales: NDArray[np.float64], delta: float, rng: np.random.Generator
              ) -> list[dict[str, float]]:
    points = []
    for s in scales:
        params = (LNMax(scale=float(s)) if mechanism == "lnmax"
                  else GNMax(sigma=float(s)))
        r = analyze_votes(votes, params, delta)
        points.append({"scale": float(s), "epsilon": r.data_dependent.epsilon,
                       "epsilon_data_independent": r.data_independent.epsilon,
                       "label_accuracy": noisy_argmax_accuracy(
                           votes, truth, "laplace" if mechanism == "lnmax" else "gauss",
                           float(s), rng)})
    return points


def least_epsilon(curve: list[dict[str, float]], accuracy: float) -> float | None:
    """The smallest data-dependent epsilon on ``curve`` whose label accuracy reaches
    ``accuracy`` (None if no point does): one number per curve to compare mechanisms and
    ensembles at equal label accuracy."""
    return min((p["epsilon"] for p in curve if p["label_accuracy"] >= accuracy), default=None)


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


def student_row(name: str, run: Path, votes_path: Path, rounds: list[list[str]],
                args: argparse.Namespace, env: dict[str, str]) -> dict:
    """One of Table 1's student rows: ``pate student train`` once per round (each list of
    flags: mechanism, its parameters, queries), on its own run directory and ledger, then the
    data-dependent epsilon of everything asked (``student.rounds.analyze_rounds`` over the
    recorded rounds, for comparison with the paper; the CLI itself releases only the sanitised
    bound, with its noise, which the row gives too)."""
    metrics_path, rounds_path = run / "student" / "metrics.json", run / "student" / "rounds.json"
    done = len(json.loads(rounds_path.read_text())) if rounds_path.is_file() else 0
    # Each row is an experiment of its own, with a ledger of its own: its own copy of the votes
    # (votes have one ledger for good, as one body of private data has one budget).
    run.mkdir(parents=True, exist_ok=True)
    if not (run / "votes.npz").is_file():
        shutil.copyfile(votes_path, run / "votes.npz")
    votes_path = run / "votes.npz"
    for flags in rounds[done:]:  # resumable: the rounds already run are not asked again
        pate_cli("student", "train", "--run", str(run), "--votes", str(votes_path),
                 "--budget-epsilon",
                 str(args.student_budget), "--delta", str(args.delta), "--dataset", "glyphs",
                 "--method", "vat", "--select", "random", "--epochs",
                 str(args.student_epochs), "--threads", "2", *flags, env=env)
    metrics = json.loads(metrics_path.read_text())
    with np.load(votes_path) as f:
        votes, rows = f["votes"].astype(np.int64), np.argsort(f["pool_index"])
        pool_index = np.sort(f["pool_index"])
    received = Received.load(run / "labels.npz")
    analysis = analyze_rounds(metrics["rounds"], received,
                              lambda index: votes[rows[np.searchsorted(pool_index, index)]],
                              run / "student" / "probs.npz", args.delta)
    assert analysis is not None, "the local aggregator records every round's parameters"
    return {"row": name, "rounds": metrics["rounds"], "queries": metrics["queries"],
            "answered": metrics["answered"], "label_accuracy": metrics["label_accuracy"],
            "student_accuracy": metrics["accuracy"],
            "epsilon_data_independent": analysis.data_independent.epsilon,
            "epsilon_data_dependent": analysis.data_dependent.epsilon,
            "epsilon_smooth_sensitivity": (None if analysis.smooth_sensitivity is None
                                           else analysis.smooth_sensitivity.epsilon),
            "epsilon_sanitised_released": metrics["epsilon"]["data_dependent_sanitised"],
            "seconds_per_epoch": metrics["seconds_per_epoch"]}


def baseline_accuracy(args: argparse.Namespace) -> dict:
    """The non-private baseline (PATE 2018 §5.3): the students' network, supervised on the first
    ``--baseline-size`` rows of the sensitive training split (noisy labels and all), accuracy on
    the evaluation half. Kept in ``--out``/baseline.json and reused while its settings (training
    rows, epochs, test rows) hold."""
    import torch

    saved = args.out / "baseline.json"
    if saved.is_file():
        row = json.loads(saved.read_text())
        if (row["train_rows"], row["epochs"], row.get("test_rows")) == (
                args.baseline_size, args.baseline_epochs, args.test_size):
            return row

    from student.models import build_classifier
    from student.training import FitConfig, MethodConfig, accuracy, build_learner, fit

    torch.set_num_threads(2)
    os.environ["PATE_GLYPHS_SIZE"] = f"{args.baseline_size},{args.test_size}"
    ds = load_dataset("glyphs")
    _, (eval_x, eval_y) = public_split(ds)
    method = MethodConfig("supervised")
    spec = method.spec(ds.train_x.shape[1:], ds.num_classes)
    model = build_classifier(spec)
    config = FitConfig(args.baseline_epochs, 128, 128, method.learning_rate)
    started = time.monotonic()
    fit(build_learner(method, model, spec), ds.train_x, ds.train_y, ds.train_x, config)
    row = {"row": "non-private baseline", "train_rows": len(ds.train_y),
           "epochs": args.baseline_epochs, "test_rows": args.test_size,
           "student_accuracy": accuracy(model, eval_x, eval_y),
           "seconds": round(time.monotonic() - started, 1)}
    write_json_atomic(saved, row)
    return row


def flags(mechanism: str, queries: int, **params: float) -> list[str]:
    return ["--mechanism", mechanism, "--queries", str(queries),
            *(x for k, v in params.items() for x in (f"--{k}", f"{v:g}"))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--teachers", type=int, nargs="+", default=[25, 50, 100, 200])
    parser.add_argument("--train-size", type=int, default=600_000)
    parser.add_argument("--test-size", type=int, default=20_000)
    parser.add_argument("--model", default="cnn-pool")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--queries", type=int, default=4000)
    parser.add_argument("--delta", type=float, default=1e-5)
    parser.add_argument("--target-accuracy", type=float, default=0.4,
                        help="label accuracy at which the ensembles' epsilons are compared")
    parser.add_argument("--students", action=argparse.BooleanOptionalAction, default=True,
                        help="train Table 1's students (default: yes)")
    parser.add_argument("--student-teachers", type=int, default=100,
                        help="the ensemble Table 1's students learn from (one of --teachers; "
                        "0: the largest)")
    parser.add_argument("--student-epochs", type=int, default=20)
    parser.add_argument("--student-budget", type=float, default=1000.0,
                        help="each student row's ledger budget (data-independent epsilon); "
                        "high because Table 1 compares data-dependent bounds, and LNMax's "
                        "data-independent one is far above them")
    parser.add_argument("--lnmax", nargs=2, type=float, default=[2000, 0.05],
                        metavar=("QUERIES", "SCALE"), help="LNMax row: queries, Laplace scale "
                        "as a fraction of the number of teachers")
    parser.add_argument("--confident", nargs=4, type=float, default=[6000, 0.7, 0.3, 0.1],
                        metavar=("QUERIES", "T", "SIGMA1", "SIGMA2"),
                        help="Confident-GNMax row and the interactive row's first round; "
                        "T and the sigmas as fractions of the number of teachers")
    parser.add_argument("--interactive", nargs=5, type=float,
                        default=[3000, 3000, 0.5, 0.3, 0.1],
                        metavar=("QUERIES1", "QUERIES2", "T", "SIGMA1", "SIGMA2"),
                        help="two-round row: Confident-GNMax queries (with --confident's "
                        "parameters), then Interactive-GNMax queries and parameters")
    parser.add_argument("--gamma", type=float, default=0.9)
    parser.add_argument("--baseline-size", type=int, default=200_000)
    parser.add_argument("--baseline-epochs", type=int, default=2)
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
        train_ensemble(run, n, args, env)
        with np.load(run / "votes.npz") as f:
            order = np.argsort(f["pool_index"])
            votes = f["votes"][order][: args.queries].astype(np.int64)
            truth = pool_y[np.sort(f["pool_index"])][: args.queries]
        manifest = json.loads((run / "teachers" / "manifest.json").read_text())
        scale = n / 100.0  # noise grids scale with the ensemble, as vote margins do
        gnmax = trade_off(votes, truth, "gnmax", scale * np.geomspace(2, 200, 9), args.delta,
                          rng)
        lnmax = trade_off(votes, truth, "lnmax", scale * np.geomspace(1, 100, 9), args.delta,
                          rng)
        confident = ConfidentGNMax(threshold=args.confident[1] * n,
                                     sigma1=args.confident[2] * n, sigma2=args.confident[3] * n)
        analysis = analyze_votes(votes, confident, args.delta)
        answered, label_acc = confident_accuracy(votes, truth, confident, rng)
        row = {"teachers": n, "examples_per_teacher": args.train_size // n,
               "shard_seconds": [s["seconds"] for s in manifest["shards"].values()],
               "teacher_accuracy_mean": manifest["accuracy"]["mean"],
               "plurality_accuracy": float(np.mean(votes.argmax(1) == truth)),
               "gnmax": gnmax, "lnmax": lnmax,
               "least_epsilon": {"label_accuracy": args.target_accuracy,
                                 "gnmax": least_epsilon(gnmax, args.target_accuracy),
                                 "lnmax": least_epsilon(lnmax, args.target_accuracy)},
               "confident": {"params": {"threshold": confident.threshold,
                                        "sigma1": confident.sigma1, "sigma2": confident.sigma2},
                             "queries": len(votes), "answered": answered,
                             "label_accuracy": label_acc,
                             "epsilon_data_independent": analysis.data_independent.epsilon,
                             "epsilon_data_dependent": analysis.data_dependent.epsilon,
                             "epsilon_smooth_sensitivity":
                                 analysis.smooth_sensitivity.epsilon}}
        print(json.dumps({k: v for k, v in row.items() if k not in ("gnmax", "lnmax")}),
              flush=True)
        results.append(row)
        by_size[n] = row

    largest = max(by_size)
    chosen = args.student_teachers or largest
    if chosen not in by_size:
        parser.error(f"--student-teachers {chosen} is not one of --teachers")
    students: list[dict] = []
    if args.students:
        votes_path = args.out / f"teachers-{chosen}" / "votes.npz"
        conf = dict(threshold=args.confident[1] * chosen, sigma1=args.confident[2] * chosen,
                    sigma2=args.confident[3] * chosen)
        q1, q2, *inter = args.interactive
        rows = {
            "LNMax": [flags("lnmax", int(args.lnmax[0]), scale=args.lnmax[1] * chosen)],
            "Confident-GNMax": [flags("confident", int(args.confident[0]), **conf)],
            "Interactive-GNMax, two rounds": [
                flags("confident", int(q1), **conf),
                flags("interactive", int(q2), threshold=inter[0] * chosen,
                      sigma1=inter[1] * chosen, sigma2=inter[2] * chosen, gamma=args.gamma)],
        }
        for name, rounds in rows.items():
            run = args.out / f"student-{name.split(',')[0].lower()}"
            students.append(student_row(name, run, votes_path, rounds, args, env))
            print(json.dumps(students[-1]), flush=True)
        students.append(baseline_accuracy(args))
        print(json.dumps(students[-1]), flush=True)

    figures = {
        "figure4_left.png": plot_trade_off(
            {"LNMax": by_size[largest]["lnmax"], "GNMax": by_size[largest]["gnmax"]},
            f"LNMax vs GNMax, {largest} teachers", args.queries, args.delta),
        "figure4_right.png": plot_trade_off(
            {f"GNMax, {n} teachers ({by_size[n]['examples_per_teacher']} examples each)":
             by_size[n]["gnmax"] for n in sorted(by_size)},
            "GNMax with more teachers, same training set", args.queries, args.delta),
    }
    pngs = {name: figure_png(fig) for name, fig in figures.items()}
    figures_dir = ensure_dir(args.out / "figures")
    for name, png in pngs.items():
        write_bytes_atomic(figures_dir / name, png)
    write_json_atomic(args.out / "reproduction.json", {
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "ensembles": results, "table1": students})
    write_bytes_atomic(args.out / "reproduction.html", render_html(
        "Glyphs: PATE 2018 Figure 4 and Table 1",
        [(f"Ensembles on {args.train_size} training rows, Confident-GNMax on {args.queries} "
          f"queries (δ = {args.delta:g})", ensembles_table(results)),
         (f"Table 1, Glyph rows ({chosen} teachers, VAT students)", students_table(students))],
        pngs).encode())


def html_table(header: list[str], rows: list[list[object]]) -> str:
    def cell(v: object) -> str:
        return "–" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)
    return ("<table><tr>" + "".join(f"<th>{h}</th>" for h in header) + "</tr>" + "".join(
        "<tr>" + "".join(f"<td>{cell(v)}</td>" for v in r) + "</tr>" for r in rows) + "</table>")


def ensembles_table(results: list[dict]) -> str:
    return html_table(
        ["Teachers", "Examples each", "Mean teacher accuracy", "Plurality accuracy",
         f"GNMax: least ε for label accuracy ≥ {results[0]['least_epsilon']['label_accuracy']}",
         "LNMax: the same", "Confident: answered",
         "Label accuracy", "ε data-independent", "ε data-dependent",
         "ε smooth-sensitivity bound (before its release's noise)"],
        [[r["teachers"], r["examples_per_teacher"], r["teacher_accuracy_mean"],
          r["plurality_accuracy"], r["least_epsilon"]["gnmax"], r["least_epsilon"]["lnmax"],
          round(r["confident"]["answered"]),
          r["confident"]["label_accuracy"], r["confident"]["epsilon_data_independent"],
          r["confident"]["epsilon_data_dependent"], r["confident"]["epsilon_smooth_sensitivity"]]
         for r in results])


def students_table(students: list[dict]) -> str:
    return html_table(
        ["Aggregator", "Queries", "Answered", "Label accuracy", "Student accuracy",
         "ε data-independent", "ε data-dependent",
         "ε smooth-sensitivity bound (before its release's noise)", "ε sanitised, released"],
        [[s["row"], s.get("queries"), s.get("answered"), s.get("label_accuracy"),
          s["student_accuracy"], s.get("epsilon_data_independent"),
          s.get("epsilon_data_dependent"), s.get("epsilon_smooth_sensitivity"),
          s.get("epsilon_sanitised_released")]
         for s in students])


if __name__ == "__main__":
    main()
