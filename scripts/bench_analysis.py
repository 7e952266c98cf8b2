"""Benchmark of the full privacy analysis (``analysis.votes_analysis.analyze_votes``), including
smooth sensitivity at the optimal order, on synthetic votes with realistic consensus.

Cases (issue 2): (a) 640 queries x 250 teachers x 10 classes, Confident-GNMax with PATE 2018's
MNIST parameters (T=200, sigma1=150, sigma2=40); (b) 12 000 queries x 5 000 teachers x 150
classes, Confident-GNMax with its Glyph parameters (T=3500, sigma1=1500, sigma2=100); (c) DP-SGD's
noise calibration (``analysis.sampled_gaussian.noise_multiplier_for_epsilon``) to epsilon 2 at
delta 1e-5 for the main job's baseline: 40 epochs of expected batches of 2 048 out of 60 000
rows.
Prints one JSON object per case and writes them to results/bench_analysis.json.

    python scripts/bench_analysis.py [--case a|b|c|all] [--repeat N]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

from analysis.mechanisms import ConfidentGNMax
from analysis.sampled_gaussian import dpsgd_epsilon, noise_multiplier_for_epsilon
from analysis.votes_analysis import analyze_votes
from pate.data.synthetic import synthetic_votes

CASES = {
    "a": dict(queries=640, teachers=250, classes=10,
              params=ConfidentGNMax(threshold=200, sigma1=150, sigma2=40)),
    "b": dict(queries=12_000, teachers=5_000, classes=150,
              params=ConfidentGNMax(threshold=3500, sigma1=1500, sigma2=100)),
}


CALIBRATION = dict(epsilon=2.0, delta=1e-5, sampling_rate=2048 / 60_000,
                   steps=40 * -(-60_000 // 2048))


def run_calibration(repeat: int) -> dict:
    """Case (c): the bisection DP-SGD runs before it trains, on the default grid of orders."""
    c = CALIBRATION
    times, sigma = [], 0.0
    for _ in range(repeat):
        start = time.perf_counter()
        sigma = noise_multiplier_for_epsilon(c["epsilon"], c["sampling_rate"], c["steps"],
                                             c["delta"])
        times.append(time.perf_counter() - start)
    epsilon, order = dpsgd_epsilon(c["sampling_rate"], sigma, c["steps"], c["delta"])
    return {"bench": "analysis", "case": "c", **c, "noise_multiplier": sigma,
            "epsilon_reached": epsilon, "order": order, "seconds": min(times),
            "seconds_all": times, "cpus": os.cpu_count(),
            "machine": platform.processor() or platform.machine()}


def run_case(name: str, repeat: int) -> dict:
    if name == "c":
        return run_calibration(repeat)
    case = CASES[name]
    votes = synthetic_votes(case["queries"], case["teachers"], case["classes"], seed=0)
    times, result = [], None
    for _ in range(repeat):
        start = time.perf_counter()
        result = analyze_votes(votes, case["params"], 1e-5)
        times.append(time.perf_counter() - start)
    assert result is not None
    return {
        "bench": "analysis", "case": name, "queries": case["queries"],
        "teachers": case["teachers"], "classes": case["classes"],
        "mechanism": case["params"].name, "seconds": min(times), "seconds_all": times,
        "epsilon": {"data_independent": result.data_independent.epsilon,
                    "data_dependent": result.data_dependent.epsilon,
                    "smooth_sensitivity": result.smooth_sensitivity.epsilon},
        "order": result.data_dependent.order,
        "expected_answered": result.expected_answered,
        "cpus": os.cpu_count(), "machine": platform.processor() or platform.machine(),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=("a", "b", "c", "all"), default="all")
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    names = ["a", "b", "c"] if args.case == "all" else [args.case]
    rows = []
    for name in names:
        row = run_case(name, max(1, args.repeat // 3) if name == "b" else args.repeat)
        print(json.dumps(row), flush=True)
        rows.append(row)
    out = Path("results")
    out.mkdir(exist_ok=True)
    (out / "bench_analysis.json").write_text("\n".join(json.dumps(r) for r in rows) + "\n")


if __name__ == "__main__":
    main()
