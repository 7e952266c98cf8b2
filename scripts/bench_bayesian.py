"""Benchmark of the Bayesian accountant (``analysis.bayesian.BayesianAccountant``) at DP-SGD's
sizes: the cost of ``steps`` steps of ``pairs`` sampled gradient pairs (256, ``pate dpsgd
train``'s default), accumulated step by step (as DP-SGD does while it trains) and from one
array (``accumulate_each``, as ``pate epsilon bayesian`` does with a file of distances), with
the peak memory of the latter (traced in a second run, untimed); both must agree. Rows go to
results/bench_bayesian.json.

    python scripts/bench_bayesian.py [--steps 800 10000] [--pairs 256]
"""

from __future__ import annotations

import argparse
import time
import tracemalloc
from pathlib import Path

import numpy as np
from bench_common import emit

from analysis.bayesian import BayesianAccountant

NOISE_STD, SAMPLING_RATE = 1.1, 256 / 60_000  # Fashion-MNIST's DP-SGD: batch 256 of 60 000


def run(steps: int, pairs: int) -> dict:
    distances = np.random.default_rng(0).uniform(0.0, 2.0, (steps, pairs))
    one_by_one = BayesianAccountant(total_steps=steps)
    start = time.perf_counter()
    for row in distances:
        one_by_one.accumulate(row, NOISE_STD, SAMPLING_RATE)
    per_step = time.perf_counter() - start
    at_once = BayesianAccountant(total_steps=steps)
    start = time.perf_counter()
    at_once.accumulate_each(distances, NOISE_STD, SAMPLING_RATE)
    each = time.perf_counter() - start
    tracemalloc.start()  # apart from the timing: tracing slows every allocation down
    BayesianAccountant(total_steps=steps).accumulate_each(distances, NOISE_STD, SAMPLING_RATE)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    if not np.allclose(one_by_one.cost, at_once.cost, rtol=1e-12):
        raise AssertionError("accumulate_each differs from accumulate step by step")
    return {"bench": "bayesian", "steps": steps, "pairs": pairs,
            "seconds_step_by_step": per_step, "seconds_at_once": each,
            "peak_mb_at_once": peak / 1e6,
            "epsilon": at_once.epsilon_and_moment(1e-5)[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, nargs="+", default=[800, 10_000])
    parser.add_argument("--pairs", type=int, default=256)
    args = parser.parse_args()
    for steps in args.steps:
        emit(run(steps, args.pairs), Path("results") / "bench_bayesian.json")


if __name__ == "__main__":
    main()
