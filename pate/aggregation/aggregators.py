"""The PATE aggregators, vectorised over a batch of queries: LNMax, GNMax, Confident-GNMax and
Interactive-GNMax, each answer with its branch and its realised privacy cost.

Sources: LNMax, PATE 2017 (Papernot et al., arXiv 1610.05755, §2.2); GNMax, PATE 2018 (Papernot et
al., arXiv 1802.08908, §4.1); Confident-GNMax, PATE 2018 §4.2 and Algorithm 1; Interactive-GNMax,
PATE 2018 §4.3 and Algorithm 2. The costs come from ``analysis`` (privacy-math.md §2-4): this module
draws the noise and decides which cost each query pays, it derives no formula.

Noise comes from a generator seeded from the operating system's entropy (DESIGN.md, privacy
rule 3). A fixed seed exists only through ``offline_seed``, for offline experiments, and warns.
"""

from __future__ import annotations

import argparse
import enum
import math
import threading
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.gaussian import gnmax_logq, gnmax_rdp_dependent, gnmax_rdp_independent
from analysis.lnmax import lnmax_rdp_dependent, lnmax_rdp_independent
from analysis.orders import as_orders
from analysis.threshold import (
    threshold_inputs,
    threshold_logpr_answered,
    threshold_rdp_dependent,
    threshold_rdp_independent,
)

MECHANISMS: tuple[str, ...] = ("lnmax", "gnmax", "confident", "interactive")
PARAMETERS: dict[str, tuple[str, ...]] = {
    "lnmax": ("scale",),
    "gnmax": ("sigma",),
    "confident": ("threshold", "sigma1", "sigma2"),
    "interactive": ("threshold", "sigma1", "sigma2", "gamma"),
}
_ALL_PARAMETERS = ("scale", "sigma", "threshold", "sigma1", "sigma2", "gamma")

# Distinct threshold-step inputs whose data-dependent cost is memoised (2N + 1 at most for N
# teachers; beyond the limit costs are computed afresh).
_STEP_MEMO_LIMIT = 100_000

# Largest per-pool table of data-dependent costs kept in memory (``Aggregator.tabulate``).
TABLE_LIMIT_BYTES = 512 * 2**20

# Student probabilities may be off a distribution by float rounding, not more.
PROBABILITY_TOLERANCE = 1e-4


class Branch(enum.IntEnum):
    """Which branch of the aggregator produced an answer (PATE 2018, Algorithm 2)."""

    NONE = 0       # no answer: label -1
    TEACHERS = 1   # the noisy plurality of the teachers' votes
    STUDENT = 2    # Interactive-GNMax's "reinforced student": the student's own argmax


@dataclass(frozen=True)
class MechanismParams:
    """A mechanism and its public parameters (the names of the ``pate serve`` flags)."""

    mechanism: str
    scale: float | None = None       # LNMax: Laplace scale b
    sigma: float | None = None       # GNMax: Gaussian sigma
    threshold: float | None = None   # Confident/Interactive: T
    sigma1: float | None = None      # Confident/Interactive: threshold-step noise
    sigma2: float | None = None      # Confident/Interactive: GNMax-step noise
    gamma: float | None = None       # Interactive: student-confidence threshold

    def __post_init__(self) -> None:
        if self.mechanism not in MECHANISMS:
            raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, "
                             f"got {self.mechanism!r}")
        for name in PARAMETERS[self.mechanism]:
            value = getattr(self, name)
            if value is None:
                raise ValueError(f"mechanism {self.mechanism} needs --{name}")
            if not math.isfinite(value):
                raise ValueError(f"--{name} must be finite, got {value!r}")
        for name in ("scale", "sigma", "sigma1", "sigma2"):
            value = getattr(self, name)
            if name in PARAMETERS[self.mechanism] and value <= 0:
                raise ValueError(f"--{name} must be > 0, got {value!r}")
        if self.mechanism == "interactive" and not 0.0 <= self.gamma <= 1.0:
            raise ValueError(f"--gamma must be a probability in [0, 1], got {self.gamma!r}")

    def public(self) -> dict[str, Any]:
        """The mechanism and the parameters it uses (public: they are part of the guarantee)."""
        return {"mechanism": self.mechanism,
                **{name: getattr(self, name) for name in PARAMETERS[self.mechanism]}}

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> MechanismParams:
        """Parameters from the flags of ``add_mechanism_arguments``; only the mechanism's own
        parameters are kept, the others must not be given."""
        names = PARAMETERS.get(args.mechanism, ())
        extra = [f"--{n}" for n in _ALL_PARAMETERS
                 if n not in names and getattr(args, n, None) is not None]
        if extra:
            raise ValueError(f"mechanism {args.mechanism} does not take {', '.join(extra)}")
        return cls(args.mechanism, **{n: getattr(args, n) for n in names})


def add_mechanism_arguments(parser: argparse.ArgumentParser) -> None:
    """The mechanism flags shared by ``pate serve`` and ``pate student train`` (DESIGN.md)."""
    group = parser.add_argument_group("aggregator (PATE 2017 §2.2; PATE 2018 §4, Alg. 1-2)")
    group.add_argument("--mechanism", required=True, choices=MECHANISMS)
    group.add_argument("--scale", type=float, help="LNMax: Laplace scale b (each answer is "
                       "pure 2/b-DP)")
    group.add_argument("--sigma", type=float, help="GNMax: std of the Gaussian noise")
    group.add_argument("--threshold", type=float, help="Confident/Interactive: threshold T")
    group.add_argument("--sigma1", type=float, help="Confident/Interactive: threshold-step noise")
    group.add_argument("--sigma2", type=float, help="Confident/Interactive: GNMax-step noise")
    group.add_argument("--gamma", type=float, help="Interactive: answer with the student's own "
                       "label when its top probability exceeds gamma")


@dataclass(frozen=True)
class QueryCosts:
    """Per-query RDP ``[queries, orders]`` kept factored: query q pays, for each part
    ``(rows, index)``, ``rows[index[q]]`` (nothing where ``index[q] == -1``). A batch's total is a
    count-weighted sum of the distinct rows, so it never materialises ``[queries, orders]``."""

    queries: int
    parts: tuple[tuple[NDArray[np.float64], NDArray[np.intp]], ...]

    def total(self) -> NDArray[np.float64]:
        """The batch's RDP: costs compose by addition (Mironov 2017, Prop. 1)."""
        out = np.zeros(self.parts[0][0].shape[1])
        for rows, index in self.parts:
            charged = index[index >= 0]
            if len(rows) > charged.size:  # a table larger than the batch (a pool's costs)
                out += rows[charged].sum(axis=0)
            else:
                out += np.bincount(charged, minlength=len(rows)).astype(np.float64) @ rows
        return out

    def per_query(self) -> NDArray[np.float64]:
        """Each query's RDP, ``[queries, orders]``."""
        out = np.zeros((self.queries, self.parts[0][0].shape[1]))
        for rows, index in self.parts:
            charged = index >= 0
            out[charged] += rows[index[charged]]
        return out


@dataclass(frozen=True)
class Answers:
    """A batch's answers: label (-1 = none), branch, and each query's realised cost as RDP on the
    orders grid, data-independent and data-dependent."""

    labels: NDArray[np.int64]
    branch: NDArray[np.int8]
    independent: QueryCosts
    dependent: QueryCosts

    @property
    def answered(self) -> int:
        """Number of queries that received a label."""
        return int(np.count_nonzero(self.labels >= 0))

    @property
    def rdp_independent(self) -> NDArray[np.float64]:
        """Each query's data-independent RDP, ``[queries, orders]``."""
        return self.independent.per_query()

    @property
    def rdp_dependent(self) -> NDArray[np.float64]:
        """Each query's data-dependent RDP, ``[queries, orders]`` (private)."""
        return self.dependent.per_query()

    def total_independent(self) -> NDArray[np.float64]:
        """The batch's data-independent RDP."""
        return self.independent.total()

    def total_dependent(self) -> NDArray[np.float64]:
        """The batch's data-dependent RDP (private: never released without sanitisation)."""
        return self.dependent.total()


class Aggregator:
    """One mechanism on one orders grid, answering batches of vote vectors.

    ``answer`` is safe to call from several threads: the generator is used under a lock.
    """

    def __init__(self, params: MechanismParams, orders: ArrayLike | None = None,
                 offline_seed: int | None = None) -> None:
        self.params = params
        self.orders = as_orders(orders)
        if offline_seed is None:
            self._rng = np.random.default_rng()  # seeded from the OS's entropy
        else:
            warnings.warn(f"aggregator noise seeded with the fixed seed {offline_seed}: "
                          "for offline experiments only, the answers are not private",
                          RuntimeWarning, stacklevel=2)
            self._rng = np.random.default_rng(offline_seed)
        self._lock = threading.Lock()
        self._memo_lock = threading.Lock()
        self._step_memo: dict[float, NDArray[np.float64]] = {}
        self._table: NDArray[np.float64] | None = None
        self._table_votes: NDArray[np.float64] | None = None
        p = params
        if p.mechanism == "lnmax":
            self._answer_cost = lnmax_rdp_independent(p.scale, self.orders)
            self._step_cost = np.zeros_like(self.orders)
        elif p.mechanism == "gnmax":
            self._answer_cost = gnmax_rdp_independent(p.sigma, self.orders)
            self._step_cost = np.zeros_like(self.orders)
        else:
            self._answer_cost = gnmax_rdp_independent(p.sigma2, self.orders)
            self._step_cost = threshold_rdp_independent(p.sigma1, self.orders)

    def worst_case_rdp(self, queries: int) -> NDArray[np.float64]:
        """Data-independent RDP of ``queries`` queries if every one is answered by the teachers:
        an upper bound on the batch's realised cost that depends on no private data, so it is
        safe to act on in public (DESIGN.md, privacy rule 6)."""
        return queries * (self._step_cost + self._answer_cost)

    def tabulate(self, pool_votes: ArrayLike) -> bool:
        """Compute once the data-dependent RDP of the teachers' answer (the LNMax/GNMax step)
        for every row of a fixed pool, so that ``answer(..., pool_rows=)`` gathers it instead of
        recomputing it per request. Skipped (False) when the table would exceed
        ``TABLE_LIMIT_BYTES``."""
        v = np.asarray(pool_votes, np.float64)
        if v.shape[0] * self.orders.size * 8 > TABLE_LIMIT_BYTES:
            return False
        self._table = self._answer_dependent(v)
        self._table_votes = v
        return True

    def answer(self, votes: ArrayLike, student_probs: ArrayLike | None = None,
               pool_rows: NDArray[np.intp] | None = None) -> Answers:
        """Answer every row of ``votes`` (``[queries, classes]`` counts); Interactive-GNMax also
        takes the student's probabilities ``[queries, classes]`` for the same queries.
        ``pool_rows``: where the votes sit in the pool given to ``tabulate``."""
        v = np.asarray(votes, np.float64)
        if v.ndim != 2 or v.shape[0] == 0 or v.shape[1] < 2:
            raise ValueError(f"votes must be [queries >= 1, classes >= 2], got {list(v.shape)}")
        if pool_rows is not None and (self._table is None
                                      or not np.array_equal(self._table_votes[pool_rows], v)):
            raise ValueError("pool_rows given without a tabulated pool holding these votes")
        mech = self.params.mechanism
        if (student_probs is not None) != (mech == "interactive"):
            raise ValueError("student_probs are required by, and only by, interactive")
        if mech == "lnmax":  # argmax_j (n_j + Lap(b)) (PATE 2017, §2.2, eq. 1)
            labels = np.argmax(v + self._noise("laplace", self.params.scale, v.shape), axis=1)
        elif mech == "gnmax":  # argmax_j (n_j + N(0, sigma^2)) (PATE 2018, §4.1)
            labels = np.argmax(v + self._noise("normal", self.params.sigma, v.shape), axis=1)
        else:
            return self._thresholded(v, None if student_probs is None
                                     else check_student_probs(student_probs, v.shape),
                                     pool_rows)
        n = v.shape[0]
        return Answers(labels.astype(np.int64), np.full(n, Branch.TEACHERS, np.int8),
                       QueryCosts(n, ((self._answer_cost[None, :], np.zeros(n, np.intp)),)),
                       self._dependent_of_answers(v, np.ones(n, bool), pool_rows))

    # -- mechanisms -------------------------------------------------------------------------

    def _noise(self, kind: str, scale: float, shape: tuple[int, ...]) -> NDArray[np.float64]:
        with self._lock:
            if kind == "laplace":
                return self._rng.laplace(0.0, scale, shape)
            return self._rng.normal(0.0, scale, shape)

    def _answer_dependent(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """Data-dependent RDP of the teachers' noisy plurality on each row of ``v``: LNMax
        (PATE 2017, Thm. 3), else GNMax with sigma (GNMax) or sigma2 (the answering step)."""
        p = self.params
        if p.mechanism == "lnmax":
            return lnmax_rdp_dependent(v, p.scale, self.orders)
        sigma = p.sigma if p.mechanism == "gnmax" else p.sigma2
        return gnmax_rdp_dependent(gnmax_logq(v, sigma), sigma, self.orders)

    def _dependent_of_answers(self, v: NDArray[np.float64], answered: NDArray[np.bool_],
                              pool_rows: NDArray[np.intp] | None
                              ) -> QueryCosts:
        """Data-dependent cost of the teachers' answer for the ``answered`` queries (from the
        pool's table when there is one)."""
        n = v.shape[0]
        if pool_rows is not None:
            return QueryCosts(n, ((self._table, np.where(answered, pool_rows, -1)),))
        return QueryCosts(n, ((self._answer_dependent(v[answered]),
                               np.where(answered, np.cumsum(answered) - 1, -1)),))

    def _thresholded(self, v: NDArray[np.float64], probs: NDArray[np.float64] | None,
                     pool_rows: NDArray[np.intp] | None) -> Answers:
        """Confident-GNMax (PATE 2018, Algorithm 1) and, with the student's probabilities,
        Interactive-GNMax (Algorithm 2).

        Threshold step: max_j (n_j - N p_j) + N(0, sigma1^2) >= T, with N p_j = 0 for Confident
        and N the number of teachers (each row's vote total). Passed: GNMax with sigma2 on the
        votes. Failed: Interactive answers with the student's argmax if its top probability
        exceeds gamma (no private data: no cost beyond the step), otherwise nobody answers.
        The step is charged on every query, the GNMax step only where it ran (privacy-math.md §3:
        a live service charges the realised cost)."""
        p = self.params
        n = v.shape[0]
        baseline = None if probs is None else v.sum(axis=1, keepdims=True) * probs
        shifted = v if baseline is None else v - baseline
        step_noise = self._noise("normal", p.sigma1, (n,))
        passed = shifted.max(axis=1) + step_noise >= p.threshold
        teacher = np.argmax(v + self._noise("normal", p.sigma2, v.shape), axis=1)
        labels = np.where(passed, teacher, -1).astype(np.int64)
        branch = np.where(passed, Branch.TEACHERS, Branch.NONE).astype(np.int8)
        if probs is not None:
            student = ~passed & (probs.max(axis=1) > p.gamma)
            labels[student] = np.argmax(probs[student], axis=1)
            branch[student] = Branch.STUDENT

        independent = QueryCosts(n, ((np.stack([self._step_cost,
                                                self._step_cost + self._answer_cost]),
                                      passed.astype(np.intp)),))
        # The step's data-dependent cost is a function of its rounded input alone; the GNMax
        # step's is computed only for the queries where it ran.
        step_in, inverse = np.unique(threshold_inputs(v, baseline), return_inverse=True)
        answer = self._dependent_of_answers(v, passed, pool_rows)
        dependent = QueryCosts(n, ((self._step_dependent(step_in), inverse.reshape(-1)),
                                   *answer.parts))
        return Answers(labels, branch, independent, dependent)


    def _step_dependent(self, step_in: NDArray[np.float64]) -> NDArray[np.float64]:
        """Data-dependent RDP of the threshold step for each distinct rounded input
        (``threshold_rdp_dependent``), memoised: the input is an integer in [-N, N]."""
        keys = step_in.tolist()
        with self._memo_lock:
            known = {x: self._step_memo[x] for x in keys if x in self._step_memo}
        missing = [x for x in keys if x not in known]
        if missing:
            p = self.params
            rows = threshold_rdp_dependent(
                threshold_logpr_answered(p.threshold, p.sigma1, missing), p.sigma1, self.orders)
            known.update(zip(missing, rows, strict=True))
            with self._memo_lock:
                if len(self._step_memo) < _STEP_MEMO_LIMIT:
                    self._step_memo.update(zip(missing, rows, strict=True))
        return np.stack([known[x] for x in keys])


def check_student_probs(probs: ArrayLike, shape: tuple[int, int]) -> NDArray[np.float64]:
    """Student probabilities: finite, in [0, 1], one distribution per query of ``shape``
    (``[queries, classes]``); raises ValueError."""
    try:
        p = np.asarray(probs, np.float64)
    except (ValueError, TypeError):
        raise ValueError(f"student_probs must be a [{shape[0]}, {shape[1]}] array") from None
    if p.shape != shape:
        raise ValueError(f"student_probs must have the votes' shape {list(shape)}, "
                         f"got {list(p.shape)}")
    if not np.all(np.isfinite(p)):
        raise ValueError("student_probs must be finite")
    if np.any(p < 0.0) or np.any(p > 1.0):
        raise ValueError("student_probs must lie in [0, 1]")
    if np.any(np.abs(p.sum(axis=1) - 1.0) > PROBABILITY_TOLERANCE):
        raise ValueError("every row of student_probs must sum to 1")
    return p
