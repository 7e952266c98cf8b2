"""The PATE aggregators, vectorised over a batch of queries: LNMax, GNMax, Confident-GNMax and
Interactive-GNMax, each answer with its branch and its realised privacy cost.

Sources: LNMax, PATE 2017 (Papernot et al., arXiv 1610.05755, §2.2); GNMax, PATE 2018 (Papernot et
al., arXiv 1802.08908, §4.1); Confident-GNMax, PATE 2018 §4.2 and Algorithm 1; Interactive-GNMax,
PATE 2018 §4.3 and Algorithm 2. The mechanism's steps and their costs come from
``analysis.costs`` (docs/privacy-math.md §2-4): this module draws the noise and decides which
cost each query pays (the realised cost), it derives no formula.

Noise comes from a generator seeded from the operating system's entropy (docs/design.md, privacy
rule 3). A fixed seed exists only through ``offline_seed``, for offline experiments, and warns.
"""

from __future__ import annotations

import enum
import threading
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from analysis.costs import (
    AnswerStep,
    GaussianArgmax,
    LaplaceArgmax,
    ThresholdStep,
    realised_rdp_independent,
    steps,
)
from analysis.mechanisms import Mechanism
from analysis.orders import as_orders
from analysis.threshold import student_baseline

# Distinct threshold-step inputs whose data-dependent cost is memoised (2N + 1 at most for N
# teachers; beyond the limit costs are computed afresh).
_STEP_MEMO_LIMIT = 100_000

# Largest per-pool table of data-dependent costs kept in memory (``Aggregator.tabulate``).
TABLE_LIMIT_BYTES = 512 * 2**20

# Queries whose data-dependent answer costs are computed together: the computation's temporaries
# are several times its ``[queries, orders]`` result, so a large batch goes in slices.
COST_SLICE = 1024

# Student probabilities may be off a distribution by float rounding, not more.
PROBABILITY_TOLERANCE = 1e-4


class Branch(enum.IntEnum):
    """Which branch of the aggregator produced an answer (PATE 2018, Algorithm 2)."""

    NONE = 0       # no answer: label -1
    TEACHERS = 1   # the noisy plurality of the teachers' votes
    STUDENT = 2    # Interactive-GNMax's "reinforced student": the student's own argmax


# The branches' names as the service and ``labels.npz``'s readers say them, indexed by value.
BRANCH_NAMES: tuple[str, ...] = tuple(b.name.lower() for b in sorted(Branch))


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
    dependent: QueryCosts = field(repr=False)  # private

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


# One noise sampler per step kind of ``analysis.costs``: the noise added to what the step
# compares (every count for an argmax, the thresholded maximum for the selection).
NoiseSampler = Callable[[np.random.Generator, Any, tuple[int, ...]], NDArray[np.float64]]
NOISE: dict[type, NoiseSampler] = {
    LaplaceArgmax: lambda rng, step, shape: rng.laplace(0.0, step.scale, shape),
    GaussianArgmax: lambda rng, step, shape: rng.normal(0.0, step.sigma, shape),
    ThresholdStep: lambda rng, step, shape: rng.normal(0.0, step.sigma1, shape),
}


class Aggregator:
    """One mechanism on one orders grid, answering batches of vote vectors. The mechanism is run
    as its steps (``analysis.costs.steps``): the noise of each step is drawn by ``NOISE`` and its
    cost comes from the step.

    ``answer`` is safe to call from several threads: the generator is used under a lock.
    """

    def __init__(self, mechanism: Mechanism, orders: ArrayLike | None = None,
                 offline_seed: int | None = None) -> None:
        self.mechanism = mechanism
        self.steps = steps(mechanism)
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
        self._step_table: NDArray[np.float64] | None = None  # inputs 0..N, once tabulated
        self._table: NDArray[np.float64] | None = None
        self._table_votes: NDArray[np.float64] | None = None
        select = self.steps.select
        self._answer_cost = self.steps.answer.rdp_independent(self.orders)
        self._step_cost = (np.zeros_like(self.orders) if select is None
                           else select.rdp_independent(self.orders))

    @property
    def takes_student_probs(self) -> bool:
        """Whether queries come with the student's probabilities (Interactive-GNMax)."""
        return self.steps.student_gamma is not None

    def worst_case_rdp(self, queries: int) -> NDArray[np.float64]:
        """Data-independent RDP of ``queries`` queries if every one is answered by the teachers:
        an upper bound on the batch's realised cost that depends on no private data, so it is
        safe to act on in public (docs/design.md, privacy rule 6)."""
        return realised_rdp_independent(self.mechanism, queries, queries, self.orders)

    def tabulate(self, pool_votes: ArrayLike) -> bool:
        """Compute once the data-dependent RDP of the teachers' answer (the answering step)
        for every row of a fixed pool, so that ``answer(..., pool_rows=)`` gathers it instead of
        recomputing it per request. Skipped (False) when the table would exceed
        ``TABLE_LIMIT_BYTES``. The selection's cost is computed for every input it can see, 0
        to N, N the number of teachers (max_j (n_j - N p_j) is at least 0): the time a request
        takes then does not tell whether a vote maximum was seen before."""
        v = np.asarray(pool_votes, np.float64)
        select = self.steps.select
        teachers = int(v[0].sum()) if len(v) else 0
        if select is not None and teachers < _STEP_MEMO_LIMIT:
            every = np.arange(teachers + 1, dtype=np.float64)
            self._step_table = select.rdp_dependent(select.logpr_answered(every), self.orders)
        if v.shape[0] * self.orders.size * 8 > TABLE_LIMIT_BYTES:
            return False
        self._table = self._answer_dependent(v)
        self._table_votes = v
        return True

    def _answer_dependent(self, v: NDArray[np.float64]) -> NDArray[np.float64]:
        """Data-dependent RDP of the answering step on each row of ``v``, ``[rows, orders]``,
        computed ``COST_SLICE`` rows at a time (each row's cost depends on that row alone)."""
        answer = self.steps.answer
        if v.shape[0] <= COST_SLICE:
            return answer.rdp_dependent(v, self.orders)
        out = np.empty((v.shape[0], self.orders.size))
        for start in range(0, v.shape[0], COST_SLICE):
            out[start:start + COST_SLICE] = answer.rdp_dependent(v[start:start + COST_SLICE],
                                                                  self.orders)
        return out

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
        if (student_probs is not None) != self.takes_student_probs:
            raise ValueError("student_probs are required by, and only by, interactive")
        if self.steps.select is not None:
            return self._thresholded(v, None if student_probs is None
                                     else check_student_probs(student_probs, v.shape),
                                     pool_rows)
        # argmax_j (n_j + noise_j) (PATE 2017, §2.2, eq. 1; PATE 2018, §4.1)
        labels = np.argmax(v + self.noise(self.steps.answer, v.shape), axis=1)
        n = v.shape[0]
        return Answers(labels.astype(np.int64), np.full(n, Branch.TEACHERS, np.int8),
                       QueryCosts(n, ((self._answer_cost[None, :], np.zeros(n, np.intp)),)),
                       self._dependent_of_answers(v, np.ones(n, bool), pool_rows))

    # -- steps ------------------------------------------------------------------------------

    def noise(self, step: ThresholdStep | AnswerStep,
              shape: tuple[int, ...]) -> NDArray[np.float64]:
        """The step's noise (``NOISE``) of ``shape``, drawn under the generator's lock: every
        noise the aggregator adds comes from here (``pate.audit`` tests it)."""
        with self._lock:
            return NOISE[type(step)](self._rng, step, shape)

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
        """A selection step, then the answering step: Confident-GNMax (PATE 2018, Algorithm 1)
        and, with the student's probabilities, Interactive-GNMax (Algorithm 2).

        Selection: max_j (n_j - N p_j) + N(0, sigma1^2) >= T, with N p_j = 0 for Confident
        and N the number of teachers (each row's vote total). Passed: the answering step on the
        votes. Failed: Interactive answers with the student's argmax if its top probability
        exceeds gamma (no private data: no cost beyond the step), otherwise nobody answers.
        The selection is charged on every query, the answering step only where it ran
        (docs/privacy-math.md §3: a live service charges the realised cost)."""
        select, gamma = self.steps.select, self.steps.student_gamma
        assert select is not None
        n = v.shape[0]
        baseline = None if probs is None else student_baseline(v, probs)
        shifted = v if baseline is None else v - baseline
        step_noise = self.noise(select, (n,))
        passed = shifted.max(axis=1) + step_noise >= select.threshold
        teacher = np.argmax(v + self.noise(self.steps.answer, v.shape), axis=1)
        labels = np.where(passed, teacher, -1).astype(np.int64)
        branch = np.where(passed, Branch.TEACHERS, Branch.NONE).astype(np.int8)
        if probs is not None:
            student = ~passed & (probs.max(axis=1) > gamma)
            labels[student] = np.argmax(probs[student], axis=1)
            branch[student] = Branch.STUDENT

        independent = QueryCosts(n, ((np.stack([self._step_cost,
                                                self._step_cost + self._answer_cost]),
                                      passed.astype(np.intp)),))
        # The selection's data-dependent cost is a function of its rounded input alone; the
        # answering step's is computed only for the queries where it ran.
        step_in, inverse = np.unique(select.inputs(v, baseline), return_inverse=True)
        answer = self._dependent_of_answers(v, passed, pool_rows)
        dependent = QueryCosts(n, ((self._step_dependent(select, step_in), inverse.reshape(-1)),
                                   *answer.parts))
        return Answers(labels, branch, independent, dependent)

    def _step_dependent(self, select: ThresholdStep,
                        step_in: NDArray[np.float64]) -> NDArray[np.float64]:
        """Data-dependent RDP of the selection for each distinct rounded input (sorted, as
        ``np.unique`` gives them): gathered from the table of 0..N that ``tabulate`` made, else
        memoised (the input is an integer in [-N, N])."""
        table = self._step_table
        if table is not None and step_in.size and step_in[0] >= 0 and step_in[-1] < len(table):
            at = step_in.astype(np.intp)
            if np.array_equal(at, step_in):
                return table[at]
        keys = step_in.tolist()
        with self._memo_lock:
            known = {x: self._step_memo[x] for x in keys if x in self._step_memo}
        missing = [x for x in keys if x not in known]
        if missing:
            rows = select.rdp_dependent(select.logpr_answered(missing), self.orders)
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
