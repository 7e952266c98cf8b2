"""What an audit of models finds: each attack's ROC figures and one-run epsilon lower bound on
one model (``attack_results``), one model's audit (``TargetAudit``) and the whole audit's summary
(``ModelsAudit``), with the failures that make ``pate audit models`` fail.

The attacks (``analysis.membership``): the loss-threshold attack (Yeom et al. 2018) and the
offline likelihood-ratio attack (Carlini et al. 2022); the bound is the one-run audit's
(Steinke, Nasr, Jagielski 2023), corrected for the attacks run together.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.membership import (
    OneRunBound,
    auc,
    logit_confidence,
    loss_scores,
    offline_lira,
    one_run_audit,
    tpr_at_fpr,
)
from pate.audit.model_options import ModelsAuditOptions

FPRS: tuple[float, ...] = (0.001, 0.01)
CONTROL_THRESHOLD = 1.0          # the positive control's lower bound must exceed this


@dataclass(frozen=True)
class AttackResult:
    """One attack on one model: ROC figures and the one-run epsilon lower bound."""

    attack: str
    auc: float
    tpr_at_fpr: dict[float, float]
    bound: OneRunBound

    def to_dict(self) -> dict[str, Any]:
        b = self.bound
        return {"attack": self.attack, "auc": self.auc,
                "tpr_at_fpr": {f"{k:g}": v for k, v in self.tpr_at_fpr.items()},
                "epsilon_lower": b.epsilon_lower, "guesses": b.guesses,
                "correct_guesses": b.correct, "guessed_members": b.k_plus,
                "guessed_non_members": b.k_minus, "tests_corrected_for": b.tests}


@dataclass(frozen=True)
class TargetAudit:
    """The audit of one model. ``epsilon_analytic`` is None for a model trained without privacy
    (no finite bound); ``accuracy`` is on the run's evaluation rows."""

    target: str
    description: str
    canaries: int
    members: int
    training_rows: int
    references: int
    accuracy: float | None
    epsilon_analytic: float | None
    epsilon_analytic_basis: str | None
    attacks: list[AttackResult]
    seconds: float
    chance: float | None = None  # 1 / the number of classes
    references_asked: int | None = None

    @property
    def caveats(self) -> list[str]:
        """What makes the bound say little, without failing the audit: a model near chance
        (trained too briefly, say) is not the model the run publishes; fewer reference models
        than asked (the labelled public pool held no more) make the reference attack weaker."""
        out = []
        if (self.accuracy is not None and self.chance is not None
                and self.accuracy < 2 * self.chance
                and self.target != "control"):  # learns its mislabelled canaries, not the task
            out.append(f"its accuracy {self.accuracy:.3f} is near chance ({self.chance:.3f}): a "
                       "bound on it says little of the run's own model (train it longer)")
        if self.references_asked is not None and self.references < self.references_asked:
            out.append(f"{self.references} reference models of the {self.references_asked} "
                       "asked: the public pool holds no more disjoint sets of their rows")
        return out

    @property
    def epsilon_lower(self) -> float:
        """The best attack's bound: every attack's was corrected for all of them."""
        return max(a.bound.epsilon_lower for a in self.attacks)

    @property
    def failures(self) -> list[str]:
        out = []
        if self.epsilon_analytic is not None and self.epsilon_lower > self.epsilon_analytic:
            out.append(f"privacy bug: {self.target}'s epsilon lower bound "
                       f"{self.epsilon_lower:.4g} exceeds its analytic epsilon "
                       f"{self.epsilon_analytic:.4g}")
        if self.target == "control" and not self.epsilon_lower > CONTROL_THRESHOLD:
            out.append(f"positive control failed: its epsilon lower bound "
                       f"{self.epsilon_lower:.4g} is not above {CONTROL_THRESHOLD:g}, so this "
                       "audit could not have found a leak")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "description": self.description,
                "canaries": self.canaries, "members": self.members,
                "training_rows": self.training_rows, "reference_models": self.references,
                "accuracy": self.accuracy, "epsilon_lower": self.epsilon_lower,
                "epsilon_analytic": self.epsilon_analytic,
                "epsilon_analytic_basis": self.epsilon_analytic_basis,
                "attacks": [a.to_dict() for a in self.attacks], "seconds": self.seconds,
                "passed": not self.failures, "failures": self.failures,
                "caveats": self.caveats}


@dataclass(frozen=True)
class ModelsAudit:
    """Every audited model, at one delta and confidence (each target's bound holds with that
    confidence)."""

    run: str
    delta: float
    confidence: float
    targets: list[TargetAudit]
    options: ModelsAuditOptions
    seconds: float
    records: Path | None = None
    summary: Path | None = None

    @property
    def failures(self) -> list[str]:
        return [f for t in self.targets for f in t.failures]

    @property
    def passed(self) -> bool:
        return not self.failures

    def to_dict(self) -> dict[str, Any]:
        """The summary: aggregate figures only (no record, no score, no coin flip)."""
        return {"run": self.run, "delta": self.delta, "confidence": self.confidence,
                "method": "one training run (Steinke, Nasr, Jagielski 2023), Bonferroni over "
                          "the guess counts and the attacks",
                "targets": [t.to_dict() for t in self.targets],
                "options": {k: (list(v) if isinstance(v, tuple) else v)
                            for k, v in asdict(self.options).items()},
                "seconds": self.seconds, "passed": self.passed, "failures": self.failures}


def attack_results(target_log_probs: NDArray[np.float64],
                   reference_log_probs: NDArray[np.float64] | None, labels: NDArray[np.int64],
                   members: NDArray[np.bool_], delta: float, confidence: float
                   ) -> tuple[list[AttackResult], dict[str, NDArray[np.float64]]]:
    """Both attacks on the canaries (``[n, classes]`` log-probabilities of the audited model,
    ``[references, n, classes]`` of the reference models, or None for the loss attack alone),
    each attack's one-run bound corrected for the attacks run. Returns the results and the
    per-canary scores (private)."""
    scores = {"loss": loss_scores(target_log_probs, labels)}
    if reference_log_probs is not None and len(reference_log_probs):
        scores["lira"] = offline_lira(logit_confidence(target_log_probs, labels),
                                      logit_confidence(reference_log_probs, labels)).scores
    results = []
    for name, s in scores.items():
        rates = tpr_at_fpr(s, members, FPRS)
        results.append(AttackResult(
            name, auc(s, members), {f: float(r) for f, r in zip(FPRS, rates, strict=True)},
            one_run_audit(s, members, delta, confidence, other_tests=len(scores))))
    return results, scores
