"""``pate audit mechanism``: an empirical privacy audit of the real aggregators.

Each mechanism is run through ``Aggregator.answer`` (the code that answers a student) many times
on a ladder of vote histograms in which consecutive rungs are neighbours (one teacher moves its
vote between class 0 and class 1). For every neighbouring pair the output counts give an epsilon
lower bound at the given delta (``analysis.audit``: events and pairs searched on one half of the
draws, estimated with Clopper-Pearson and Bonferroni on the other; Jagielski et al. 2020, Nasr
et al. 2021, Bichsel et al. 2021), which is set against the analytic per-query upper bound at the
same delta and conversion: the data-independent bound of one query (threshold step plus GNMax for
the thresholded mechanisms, as if answered) and the data-dependent bound at the audited pair (the
larger of its two histograms' bounds). A lower bound above an upper bound is a privacy bug.

The noise is also tested directly, as the aggregator draws it (``Aggregator.noise``): its fit to
the family and scale the analysis assumes, its independence across the queries of a batch, and
the independence of the answers to adjacent queries of one ``answer`` call.

The ladders (all public, synthetic; no private data is read), 250 teachers and 10 classes; at
most ``MAX_PAIRS`` neighbouring pairs, evenly spread, when the ladder has more:

* argmax mechanisms (LNMax, GNMax): the teachers split between classes 0 and 1 with a gap
  n_0 - n_1 from 0 up to ``ARGMAX_SPAN`` noise scales in steps of 2 (a tie is not the worst case
  for a label output: the best pair has the runner-up a few scales behind);
* thresholded mechanisms (Confident-, Interactive-GNMax): the thresholded value
  max_j (n_j - N p_j) from T down to T - ``THRESHOLD_SPAN`` sigma1 in steps of 1 (or as far as
  class 0 stays on top), the rest of the votes spread over the other classes; at the defaults
  the runner-up is > 7 sigma2 behind, so the audit targets the threshold step (answered or not).

Default parameters (``DEFAULT_MECHANISMS``) put the data-independent per-query bound near 1 at
delta = 1e-5 (LNMax 1.00, GNMax 0.95, Confident and Interactive 0.99), where 10^6 draws can tell
sigma from sigma / 2 (``tests/audit``). At the papers' parameters (``PAPER_MECHANISMS``: the bound
is 0.10 to 0.12) no feasible number of draws could: those audits are reported (``powered`` false)
but not relied on; a lower bound above the upper one still fails them.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.audit import (
    NoiseFamily,
    adjacent_correlation_pvalue,
    audit_counts,
    noise_fit,
    pairs_independence_pvalue,
)
from analysis.costs import GaussianArgmax, LaplaceArgmax, ThresholdStep, steps
from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    Mechanism,
    mechanism_to_dict,
)
from analysis.orders import default_orders
from analysis.rdp import Conversion, epsilon_from_rdp
from analysis.threshold import student_baseline
from pate.aggregation.aggregators import Aggregator, Answers

DEFAULT_MECHANISMS: dict[str, Mechanism] = {
    "lnmax": LNMax(scale=2.0),
    "gnmax": GNMax(sigma=6.0),
    "confident": ConfidentGNMax(threshold=150.0, sigma1=5.0, sigma2=10.0),
    "interactive": InteractiveGNMax(threshold=150.0, sigma1=5.0, sigma2=10.0, gamma=0.8),
}
# PATE 2017's and PATE 2018's MNIST parameters for 250 teachers (LNMax: gamma = 0.05, b = 20;
# Confident-GNMax: Table 1), with the gamma of the fashion-mnist preset for Interactive.
PAPER_MECHANISMS: dict[str, Mechanism] = {
    "lnmax": LNMax(scale=20.0),
    "gnmax": GNMax(sigma=40.0),
    "confident": ConfidentGNMax(threshold=200.0, sigma1=150.0, sigma2=40.0),
    "interactive": InteractiveGNMax(threshold=200.0, sigma1=150.0, sigma2=40.0, gamma=0.9),
}
NUM_TEACHERS = 250
NUM_CLASSES = 10
# Interactive-GNMax's student: confident (0.82 > gamma) in the last class, so an unanswered query
# gets a label no teacher answer gives; N p_j is a whole number of votes.
STUDENT_PROBS = np.array([0.02] * (NUM_CLASSES - 1) + [0.82])
ARGMAX_SPAN = 6.0      # largest gap between the top two counts, in noise scales
THRESHOLD_SPAN = 4.0   # deepest thresholded value below T, in sigma1
MAX_PAIRS = 20         # neighbouring pairs searched at most (the defaults' ladders are whole)
DEFAULT_DRAWS = 1_000_000
POWERED_DRAWS = DEFAULT_DRAWS  # fewer cannot tell sigma from sigma / 2: not powered
MAX_DRAWS = 10**10     # about 16 s per 10^6 draws on 2 cores: this is days, not a typo's years
DEFAULT_DELTA = 1e-5
DEFAULT_CONFIDENCE = 0.95
# A direct noise test failing below this p-value fails the audit: spurious failures are rarer
# than one audit in 10^5, while a sigma off by 10% has p ~ 0 at 10^5 draws.
NOISE_TEST_LEVEL = 1e-6
NOISE_TEST_DRAWS = 100_000   # queries drawn for the direct noise tests (at most)
BATCH_TEST_DRAWS = 65_536    # queries answered, 64 a call, for the answers' independence
BATCH_TEST_SIZE = 64
CHUNK = 1 << 17              # rows answered per call in the audit proper (bounds memory)

# The family and scale each step's noise must have (analysis.costs: the scale the cost assumes).
_DECLARED: dict[type, tuple[NoiseFamily, str]] = {
    LaplaceArgmax: ("laplace", "scale"),
    GaussianArgmax: ("gaussian", "sigma"),
    ThresholdStep: ("gaussian", "sigma1"),
}


def build_aggregator(mechanism: Mechanism) -> Aggregator:
    """The aggregator the service would build for ``mechanism`` (noise from the OS's entropy)."""
    return Aggregator(mechanism)


@dataclass(frozen=True)
class Ladder:
    """Vote histograms ``[rungs, classes]``, the neighbouring pairs among them ``[pairs, 2]``
    (rung indices; the second is the first with one vote moved between classes 0 and 1; rung 0,
    the most balanced, is in the first pair), and Interactive's student probabilities
    ``[classes]`` (None for the others)."""

    histograms: NDArray[np.int64]
    pairs: NDArray[np.intp]
    student_probs: NDArray[np.float64] | None

    def baseline(self) -> NDArray[np.float64] | None:
        """N p_j per rung, what Interactive's threshold step subtracts."""
        if self.student_probs is None:
            return None
        return student_baseline(self.histograms, self.student_probs[None, :])


def ladder(mechanism: Mechanism, num_teachers: int = NUM_TEACHERS,
           num_classes: int = NUM_CLASSES) -> Ladder:
    """The histograms the audit searches for ``mechanism`` (module docstring). Rung k has k
    votes moved from rung 0, so rungs k and k + 1 are neighbours; when there are more than
    ``MAX_PAIRS`` such pairs, ``MAX_PAIRS`` evenly spread ones are searched."""
    plan = steps(mechanism)
    probs = STUDENT_PROBS if plan.student_gamma is not None else None
    if plan.select is None:
        # rung k: n_0 - n_1 = (N mod 2) + 2k, up to ARGMAX_SPAN scales
        deepest = min(num_teachers // 2, math.ceil(ARGMAX_SPAN * _scale(plan.answer) / 2))
        moved = np.arange(deepest + 1)

        def rung(k: NDArray[np.int64]) -> NDArray[np.int64]:
            rows = np.zeros((k.size, num_classes), np.int64)
            rows[:, 0] = (num_teachers + 1) // 2 + k
            rows[:, 1] = num_teachers // 2 - k
            return rows
    else:
        # rung k: the thresholded value T - k, the runner-up far behind
        shift = 0.0 if probs is None else num_teachers * float(probs[0])
        top = math.ceil(plan.select.threshold + shift)
        rest = num_teachers - top
        if rest < 0:
            raise ValueError(f"threshold {plan.select.threshold:g} does not fit "
                             f"{num_teachers} teachers")
        base = np.full(num_classes - 1, rest // (num_classes - 1), np.int64)
        base[: rest % (num_classes - 1)] += 1
        deepest = min(math.ceil(THRESHOLD_SPAN * plan.select.sigma1),
                      (top - int(base[0]) - 1) // 2)  # class 0 stays the top class
        moved = np.arange(deepest + 1)

        def rung(k: NDArray[np.int64]) -> NDArray[np.int64]:
            rows = np.zeros((k.size, num_classes), np.int64)
            rows[:, 0] = top - k
            rows[:, 1:] = base
            rows[:, 1] += k
            return rows
    starts = moved[:-1]
    if starts.size > MAX_PAIRS:
        starts = np.unique(np.round(np.linspace(0, starts[-1], MAX_PAIRS)).astype(np.int64))
    ks, index = np.unique(np.concatenate([starts, starts + 1]), return_inverse=True)
    return Ladder(rung(ks), index.reshape(2, -1).T.copy(), probs)


def _scale(step: ThresholdStep | LaplaceArgmax | GaussianArgmax) -> float:
    return float(getattr(step, _DECLARED[type(step)][1]))


def _outcome_counts(aggregator: Aggregator, ladder_: Ladder, draws: int,
                    ) -> NDArray[np.float64]:
    """Outcome counts ``[rungs, classes + 1]`` (column 0: no answer, column 1 + j: label j) of
    ``draws`` answers on every rung, through ``Aggregator.answer`` with the rungs tabulated."""
    rungs, classes = ladder_.histograms.shape
    counts = np.zeros((rungs, classes + 1))
    for i in range(rungs):
        done = 0
        while done < draws:
            n = min(CHUNK, draws - done)
            labels = _answer(aggregator, ladder_, i, n).labels
            counts[i] += np.bincount(labels + 1, minlength=classes + 1)
            done += n
    return counts


def _answer(aggregator: Aggregator, ladder_: Ladder, rung: int, n: int) -> Answers:
    """``n`` answers on one rung of the tabulated ladder."""
    votes = np.broadcast_to(ladder_.histograms[rung], (n, ladder_.histograms.shape[1]))
    probs = (None if ladder_.student_probs is None
             else np.broadcast_to(ladder_.student_probs, votes.shape))
    return aggregator.answer(votes, probs, pool_rows=np.full(n, rung, np.intp))


def per_query_bounds(mechanism: Mechanism, ladder_: Ladder, pair: int, delta: float,
                     conversion: Conversion) -> tuple[float, float]:
    """(data-independent, data-dependent at the ladder's pair ``pair``) epsilon of one query at
    ``delta`` (docs/privacy-math.md §1-4): the threshold step plus the answering step, as if
    answered; the data-dependent RDP is the larger of the pair's two histograms'."""
    plan = steps(mechanism)
    orders = default_orders()
    rungs = ladder_.pairs[pair]
    votes = ladder_.histograms[rungs]
    independent = plan.answer.rdp_independent(orders)
    dependent = plan.answer.rdp_dependent(votes, orders)
    if plan.select is not None:
        independent = independent + plan.select.rdp_independent(orders)
        baseline = ladder_.baseline()
        inputs = plan.select.inputs(votes, None if baseline is None
                                    else baseline[rungs])
        dependent = dependent + plan.select.rdp_dependent(plan.select.logpr_answered(inputs),
                                                          orders)
    # LNMax is pure DP: its optimum sits at the grid's highest order, as it should
    eps_ind, _ = epsilon_from_rdp(independent, orders, delta, conversion, warn_at_edge=False)
    eps_dep, _ = epsilon_from_rdp(dependent.max(axis=0), orders, delta, conversion,
                                  warn_at_edge=False)
    return eps_ind, eps_dep


@dataclass(frozen=True)
class NoiseTest:
    """One direct test of the aggregator's noise: what, and its p-value."""

    test: str
    pvalue: float

    @property
    def passed(self) -> bool:
        return self.pvalue >= NOISE_TEST_LEVEL


def noise_tests(mechanism: Mechanism, aggregator: Aggregator, ladder_: Ladder,
                draws: int) -> list[NoiseTest]:
    """Each step's noise as ``aggregator.noise`` draws it, against the family and scale
    ``mechanism`` declares (fit) and across queries (adjacent correlation), and the answers to
    adjacent queries of one call on the most balanced rung (pairs chi-square)."""
    declared, used = steps(mechanism), aggregator.steps
    classes = ladder_.histograms.shape[1]
    n = min(draws, NOISE_TEST_DRAWS)
    out: list[NoiseTest] = []
    for name, want, got, shape in (("threshold step", declared.select, used.select, (n,)),
                                   ("answer step", declared.answer, used.answer, (n, classes))):
        if want is None or got is None:
            continue
        family = _DECLARED[type(want)][0]
        samples = aggregator.noise(got, shape)
        fit = noise_fit(samples, family, _scale(want))
        out.append(NoiseTest(f"{name}: {family} noise of scale {_scale(want):g} "
                             "(Kolmogorov-Smirnov, Cramér-von Mises)", fit.pvalue))
        out.append(NoiseTest(f"{name}: noise independent across queries (adjacent "
                             "correlation)", adjacent_correlation_pvalue(samples)))
    labels = np.concatenate([_answer(aggregator, ladder_, 0, BATCH_TEST_SIZE).labels
                             for _ in range(max(1, min(draws, BATCH_TEST_DRAWS)
                                                // BATCH_TEST_SIZE))])
    out.append(NoiseTest(f"answers to adjacent queries of one call independent (chi-square, "
                         f"{BATCH_TEST_SIZE} queries a call)", pairs_independence_pvalue(labels)))
    return out


@dataclass(frozen=True)
class MechanismAudit:
    """One mechanism's audit. ``pair`` is the two neighbouring histograms of the best estimate
    (the second is the first with one vote moved); ``event`` the outputs it counts (-1: no
    answer), more likely on ``pair[0]`` when ``forward``, else on ``pair[1]``."""

    mechanism: Mechanism
    powered: bool
    epsilon_lower: float
    epsilon_upper: float
    epsilon_upper_dependent: float
    delta: float
    confidence: float
    conversion: Conversion
    draws: int
    pairs: int
    pair: tuple[list[int], list[int]] | None
    event: list[int] | None
    forward: bool | None
    candidates: int
    noise: list[NoiseTest]
    seconds: float
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """The JSON row of ``pate audit mechanism --json``."""
        return {
            "mechanism": self.mechanism.name,
            "parameters": {k: v for k, v in mechanism_to_dict(self.mechanism).items()
                           if k != "mechanism"},
            "powered": self.powered,
            "epsilon_lower": self.epsilon_lower,
            "epsilon_upper": self.epsilon_upper,
            "epsilon_upper_bound": "data-independent, one query",
            "epsilon_upper_dependent": self.epsilon_upper_dependent,
            "delta": self.delta,
            "confidence": self.confidence,
            "conversion": self.conversion,
            "draws": self.draws,
            "pairs_searched": self.pairs,
            "candidates_estimated": self.candidates,
            "pair": None if self.pair is None else list(self.pair),
            "event": self.event,
            "event_more_likely_on": None if self.forward is None else (0 if self.forward else 1),
            "noise_tests": [{"test": t.test, "pvalue": t.pvalue, "passed": t.passed}
                            for t in self.noise],
            "seconds": self.seconds,
            "passed": self.passed,
            "failures": self.failures,
        }


def audit_mechanism(mechanism: Mechanism, *, draws: int = DEFAULT_DRAWS,
                    delta: float = DEFAULT_DELTA, confidence: float = DEFAULT_CONFIDENCE,
                    conversion: Conversion = "improved",
                    aggregator: Aggregator | None = None, powered: bool = True
                    ) -> MechanismAudit:
    """Audit ``aggregator`` (by default ``build_aggregator(mechanism)``) against the bounds of
    ``mechanism``: ``draws`` answers per histogram, half to search, half to estimate.
    ``powered``: whether the parameters let the audit catch a noise bug (module docstring)."""
    if not 2 * BATCH_TEST_SIZE <= draws <= MAX_DRAWS:
        raise ValueError(f"draws must be in [{2 * BATCH_TEST_SIZE}, {MAX_DRAWS:.0e}], got "
                         f"{draws!r}")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1), got {confidence!r}")
    if not 0.0 < delta < 1.0:
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")
    start = time.perf_counter()
    agg = build_aggregator(mechanism) if aggregator is None else aggregator
    rungs = ladder(mechanism)
    agg.tabulate(rungs.histograms)
    half = draws // 2
    selection = _outcome_counts(agg, rungs, half)
    estimation = _outcome_counts(agg, rungs, half)

    best = audit_counts(selection[rungs.pairs], estimation[rungs.pairs], half, delta,
                        confidence)
    pair = 0 if best is None else best.candidate.pair
    eps_ind, eps_dep = per_query_bounds(mechanism, rungs, pair, delta, conversion)
    eps_lower = 0.0 if best is None else best.epsilon_lower
    noise = noise_tests(mechanism, agg, rungs, draws)
    failures = [f"privacy bug: epsilon lower bound {eps_lower:.4g} exceeds the {name} upper "
                f"bound {bound:.4g}"
                for name, bound in (("data-independent", eps_ind),
                                    ("data-dependent", eps_dep)) if eps_lower > bound]
    failures += [f"noise test failed (p = {t.pvalue:.3g} < {NOISE_TEST_LEVEL:g}): {t.test}"
                 for t in noise if not t.passed]
    return MechanismAudit(
        mechanism, powered, eps_lower, eps_ind, eps_dep, delta, confidence, conversion, draws,
        rungs.pairs.shape[0],
        None if best is None else tuple(rungs.histograms[rungs.pairs[pair]].tolist()),
        None if best is None else (np.flatnonzero(best.candidate.event) - 1).tolist(),
        None if best is None else best.candidate.forward,
        0 if best is None else best.candidates, noise, time.perf_counter() - start, failures)


def audit_mechanisms(names: Sequence[str] | None = None, *, draws: int = DEFAULT_DRAWS,
                     delta: float = DEFAULT_DELTA, confidence: float = DEFAULT_CONFIDENCE,
                     conversion: Conversion = "improved", paper: bool = False
                     ) -> list[MechanismAudit]:
    """Audit the named mechanisms (default: all four) at ``DEFAULT_MECHANISMS``, and with
    ``paper`` also at ``PAPER_MECHANISMS`` (not powered); with fewer than ``POWERED_DRAWS``
    draws none is powered."""
    chosen = list(MECHANISMS) if not names else list(dict.fromkeys(names))
    unknown = [n for n in chosen if n not in DEFAULT_MECHANISMS]
    if unknown:
        raise ValueError(f"mechanism must be one of {', '.join(MECHANISMS)}, "
                         f"got {', '.join(unknown)}")
    cases = [(DEFAULT_MECHANISMS[n], True) for n in chosen]
    if paper:
        cases += [(PAPER_MECHANISMS[n], False) for n in chosen]
    return [audit_mechanism(m, draws=draws, delta=delta, confidence=confidence,
                            conversion=conversion, powered=powered and draws >= POWERED_DRAWS)
            for m, powered in cases]
