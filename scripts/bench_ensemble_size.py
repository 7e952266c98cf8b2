"""How many answers, and how many right, an ensemble's votes buy at a target epsilon (issue 27).

For each ``--votes`` file (the votes of one ensemble on the public pool, from ``pate teachers
votes``), Confident-GNMax with the parameters given for ``--reference-teachers`` teachers,
scaled in proportion to this ensemble's size (the same threshold and noise as fractions of the
votes), asks the pool rows in one random order. The script finds the most queries whose
smooth-sensitivity epsilon before noise (PATE 2018, App. C; ``pate analyze``'s
``smooth_sensitivity.epsilon`` of those rows) stays at or under ``--target`` (to within
``--step`` queries; where none fit, the epsilon of the first ``--step``), and prints what
they are expected to bring: answers (the sum over queries of the probability that the noisy
top count passes the threshold, Phi((max_j n_j - T) / sigma1)), right answers (that times the
probability that GNMax's noisy arg max is the true label, from ``--draws`` draws of its noise),
and the teachers' plurality accuracy on the whole pool. One JSON line per ensemble, appended to
results/bench_ensemble_size.jsonl.

It reads the votes and the pool's true labels: an offline experiment on private artifacts, to
choose an ensemble size, not a step of any release (choosing parameters from the votes is a
data-dependent choice: docs/privacy-math.md, section 5).

    python scripts/bench_ensemble_size.py --votes T250/votes.npz T500/votes.npz T1000/votes.npz
"""

from __future__ import annotations

import argparse
import warnings
from pathlib import Path

import numpy as np
from bench_common import emit
from scipy.stats import norm

from analysis.mechanisms import ConfidentGNMax
from analysis.votes_analysis import analyze_votes
from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.data.task import load_task
from pate.data.votes_file import load_pool_fingerprint, load_votes_with_index


def sanitised_before_noise(votes: np.ndarray, mechanism: ConfidentGNMax, delta: float) -> float:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # an optimum at the edge of the orders grid
        bound = analyze_votes(votes, mechanism, delta).smooth_sensitivity
    assert bound is not None
    return bound.epsilon


def most_queries(votes: np.ndarray, mechanism: ConfidentGNMax, delta: float, target: float,
                 step: int) -> tuple[int, float]:
    """The most leading rows whose epsilon is at most ``target``, to within ``step`` rows (a
    bisection: the epsilon grows with the rows asked), and their epsilon; 0 where not even
    ``step`` rows fit, with what the first ``step`` would cost."""
    whole = sanitised_before_noise(votes, mechanism, delta)
    if whole <= target:
        return len(votes), whole
    low, high, at_low = 0, len(votes), None
    while high - low > step:
        middle = (low + high) // 2
        epsilon = sanitised_before_noise(votes[:middle], mechanism, delta)
        if epsilon <= target:
            low, at_low = middle, epsilon
        else:
            high = middle
    if at_low is None:
        at_low = sanitised_before_noise(votes[:step], mechanism, delta)
    return low, at_low


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--votes", type=Path, nargs="+", required=True)
    ap.add_argument("--reference-teachers", type=int, default=250)
    ap.add_argument("--threshold", type=float, default=200.0)
    ap.add_argument("--sigma1", type=float, default=150.0)
    ap.add_argument("--sigma2", type=float, default=40.0)
    ap.add_argument("--target", type=float, default=2.0)
    ap.add_argument("--delta", type=float, default=1e-5)
    ap.add_argument("--step", type=int, default=10, help="resolution of the query count")
    ap.add_argument("--draws", type=int, default=400, help="draws of GNMax's noise per query")
    ap.add_argument("--seed", type=int, default=0, help="the order of the queries, the draws")
    ap.add_argument("--out", type=Path, default=Path("results/bench_ensemble_size.jsonl"))
    add_data_flags(ap, files=False)
    args = ap.parse_args()
    task = load_task(source_from_flags(args), need_private=False)
    if task.pool_y is None:
        ap.error("the pool's true labels are needed: a built-in dataset, or test data")
    for path in args.votes:
        if load_pool_fingerprint(path) not in (None, task.pool_fingerprint):
            ap.error(f"{path}: cast on another public pool than the data flags name")
        rng = np.random.default_rng(args.seed)
        votes, index = load_votes_with_index(path)
        truth = task.pool_y[index]
        order = rng.permutation(len(votes))
        votes, truth = votes[order], truth[order]
        teachers = int(votes[0].sum())
        scale = teachers / args.reference_teachers
        mechanism = ConfidentGNMax(threshold=args.threshold * scale, sigma1=args.sigma1 * scale,
                                   sigma2=args.sigma2 * scale)
        queries, epsilon = most_queries(votes, mechanism, args.delta, args.target, args.step)
        asked, right = votes[:queries], truth[:queries]
        answered = norm.sf((mechanism.threshold - asked.max(axis=1)) / mechanism.sigma1)
        noisy = asked[None] + rng.normal(0.0, mechanism.sigma2, (args.draws, *asked.shape))
        correct = np.mean(noisy.argmax(axis=-1) == right[None], axis=0)
        emit({"bench": "ensemble_size", "votes": str(path), "teachers": teachers,
              "plurality_accuracy": round(float(np.mean(votes.argmax(axis=1) == truth)), 4),
              "threshold": mechanism.threshold, "sigma1": mechanism.sigma1,
              "sigma2": mechanism.sigma2, "target": args.target, "queries": queries,
              # where not even the first --step rows fit: what those would cost
              "sanitised_before_noise": round(epsilon, 3),
              "expected_answers": round(float(answered.sum()), 1),
              "expected_right": round(float(np.sum(answered * correct)), 1)}, args.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
