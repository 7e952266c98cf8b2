"""``pate audit mechanism`` and ``pate audit models``: empirical privacy audits of the aggregators
and of a run's models (``pate.audit``)."""

from __future__ import annotations

import argparse
import json

from analysis.mechanisms import MECHANISMS, parameters_text
from analysis.rdp import CONVERSIONS
from pate.audit.mechanism import (
    DEFAULT_CONFIDENCE,
    DEFAULT_DELTA,
    DEFAULT_DRAWS,
    POWERED_DRAWS,
    MechanismAudit,
    audit_mechanisms,
)
from pate.audit.model_options import CONTROL_LABELS, TARGETS, ModelsAuditOptions
from pate.audit.model_options import DEFAULT_CONFIDENCE as MODELS_CONFIDENCE
from pate.cli.device_flag import add_device_flag
from pate.cli.paths import path_arg
from pate.errors import UserError


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "audit", help="empirical privacy audits",
        description="Empirical privacy audits: statistical lower bounds on epsilon and tests of "
                    "the noise, set against the analytic upper bounds.")
    sub = parser.add_subparsers(dest="audit", required=True, metavar="AUDIT")
    mech = sub.add_parser(
        "mechanism", help="audit the aggregators' noise and privacy loss",
        description="Run each aggregator many times on neighbouring vote histograms, derive a "
                    "lower bound on its per-query epsilon (Clopper-Pearson, Bonferroni; "
                    "Jagielski et al. 2020, Nasr et al. 2021, Bichsel et al. 2021) and test its "
                    "noise (fit, independence). Exits 1 when a lower bound exceeds the analytic "
                    "upper bound (a privacy bug) or a noise test fails. The parameters are the "
                    "defaults of pate.audit.mechanism (per-query bound near 1).")
    mech.add_argument("--mechanism", nargs="+", choices=tuple(MECHANISMS), metavar="M",
                      help=f"mechanisms to audit, of {', '.join(MECHANISMS)} (default: all)")
    mech.add_argument("--draws", type=int, default=DEFAULT_DRAWS, metavar="N",
                      help=f"answers per histogram, half to search, half to estimate "
                           f"(default: {DEFAULT_DRAWS})")
    mech.add_argument("--delta", type=float, default=DEFAULT_DELTA, metavar="D",
                      help=f"delta of both bounds (default: {DEFAULT_DELTA:g})")
    mech.add_argument("--confidence", type=float, default=DEFAULT_CONFIDENCE, metavar="C",
                      help=f"confidence of the lower bound (default: {DEFAULT_CONFIDENCE:g})")
    mech.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                      help="RDP to (epsilon, delta) conversion of the upper bound "
                           "(default: improved)")
    mech.add_argument("--paper", action="store_true",
                      help="also audit at the papers' parameters (reported, not relied on: "
                           "there 10^6 draws cannot tell sigma from sigma / 2)")
    mech.add_argument("--json", action="store_true", help="print one JSON object")
    mech.set_defaults(handler=run_mechanism)
    _register_models(sub)


def _register_models(sub: argparse._SubParsersAction) -> None:
    d = ModelsAuditOptions()
    models = sub.add_parser(
        "models", help="membership inference against a run's models",
        description="Retrain a run's models with audit records (canaries) from the private data, "
                    "each included by an independent coin flip: some teachers on their own "
                    "partitions, the student through the whole pipeline (votes, the real "
                    "aggregators, its training), a non-private model and a positive control. "
                    "Attack them (loss threshold, offline likelihood ratio with reference models "
                    "trained on public data only) and derive an epsilon lower bound from one "
                    "training run (Steinke, Nasr, Jagielski 2023). Per-record results go to "
                    "DIR/audit/ (0600); only aggregate figures are printed. Exits 1 when a lower "
                    "bound exceeds its analytic epsilon (a privacy bug) or the positive control "
                    "finds no epsilon above 1 (the audit could not see a leak).")
    models.add_argument("--run", type=path_arg, required=True, metavar="DIR",
                        help="the run directory")
    models.add_argument("--targets", nargs="+", choices=TARGETS, default=list(TARGETS),
                        metavar="T", help=f"models to audit, of {', '.join(TARGETS)} "
                                          "(default: all)")
    models.add_argument("--teachers", type=int, default=d.teachers, metavar="N",
                        help=f"teachers retrained with canaries (default: {d.teachers})")
    models.add_argument("--canary-fraction", type=float, default=d.canary_fraction,
                        metavar="F", help="part of each audited teacher's partition set aside "
                                          f"as canaries (default: {d.canary_fraction:g})")
    models.add_argument("--nonprivate-rows", type=int, default=d.nonprivate_rows, metavar="N",
                        help="fixed private rows of the non-private model "
                             f"(default: {d.nonprivate_rows})")
    models.add_argument("--nonprivate-canaries", type=int, default=d.nonprivate_canaries,
                        metavar="N", help="canaries of the non-private model "
                                          f"(default: {d.nonprivate_canaries})")
    models.add_argument("--control-rows", type=int, default=d.control_rows, metavar="N",
                        help="fixed private rows of the positive control "
                             f"(default: {d.control_rows})")
    models.add_argument("--control-canaries", type=int, default=d.control_canaries,
                        metavar="N", help="canaries of the positive control "
                                          f"(default: {d.control_canaries})")
    models.add_argument("--control-epochs", type=int, default=d.control_epochs, metavar="N",
                        help=f"the positive control's epochs (default: {d.control_epochs})")
    models.add_argument("--control-labels", choices=CONTROL_LABELS, default=d.control_labels,
                        help="the control's canaries carry a random wrong label "
                             "(mislabelled: memorised, so surely leaked) or their own "
                             f"(default: {d.control_labels})")
    models.add_argument("--references", type=int, default=d.references, metavar="N",
                        help="reference models per teacher-kind target, on disjoint public "
                             f"subsets (default: {d.references}; 0: loss attack only)")
    models.add_argument("--student-references", type=int, default=d.student_references,
                        metavar="N", help="reference students, trained on public labels "
                                          f"(default: {d.student_references})")
    models.add_argument("--student-epochs", type=int, default=None, metavar="N",
                        help="epochs of the retrained student (default: the run's)")
    models.add_argument("--confidence", type=float, default=MODELS_CONFIDENCE, metavar="C",
                        help=f"confidence of each lower bound (default: {MODELS_CONFIDENCE:g})")
    models.add_argument("--delta", type=float, default=None, metavar="D",
                        help="delta of the bounds (default: the run's)")
    models.add_argument("--seed", type=int, default=None, metavar="S",
                        help="fix the audit's choices and coin flips (offline experiments "
                             "only; default: the operating system's entropy)")
    add_device_flag(models, "the retraining")
    models.add_argument("--json", action="store_true", help="print one JSON object")
    models.set_defaults(handler=run_models)


def _line(audit: MechanismAudit) -> str:
    verdict = "pass" if audit.passed else "FAIL: " + "; ".join(audit.failures)
    if not audit.powered:
        why = ("too few draws to tell the noise from half of it" if audit.draws < POWERED_DRAWS
               else "the papers' parameters")
        verdict += f" (not powered, not relied on: {why})"
    return (f"{audit.mechanism.name} ({parameters_text(audit.mechanism)}): epsilon lower "
            f"{audit.epsilon_lower:.4f}, upper {audit.epsilon_upper:.4f} (data-independent), "
            f"{audit.epsilon_upper_dependent:.4f} (data-dependent at the pair); "
            f"{audit.seconds:.1f} s; {verdict}")


def run_mechanism(args: argparse.Namespace) -> int:
    try:
        audits = audit_mechanisms(args.mechanism, draws=args.draws, delta=args.delta,
                                  confidence=args.confidence, conversion=args.conversion,
                                  paper=args.paper)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    passed = all(a.passed for a in audits)
    if args.json:
        print(json.dumps({"passed": passed, "mechanisms": [a.to_dict() for a in audits]}))
    else:
        print(f"delta = {args.delta:g}, confidence {args.confidence:g}, {args.draws} draws per "
              f"histogram, {args.conversion} conversion")
        for a in audits:
            print(_line(a))
    return 0 if passed else 1


def _models_line(t: dict) -> str:
    bound = ("none (no privacy)" if t["epsilon_analytic"] is None
             else f"{t['epsilon_analytic']:.4f}")
    attacks = "; ".join(
        f"{a['attack']}: AUC {a['auc']:.3f}, TPR {a['tpr_at_fpr']['0.001']:.3f} at 0.1% FPR, "
        f"{a['tpr_at_fpr']['0.01']:.3f} at 1%, epsilon >= {a['epsilon_lower']:.3f}"
        for a in t["attacks"])
    verdict = "pass" if t["passed"] else "FAIL: " + "; ".join(t["failures"])
    if t["caveats"]:
        verdict += " (but " + "; ".join(t["caveats"]) + ")"
    accuracy = "-" if t["accuracy"] is None else f"{t['accuracy']:.3f}"
    return (f"{t['target']:<10} epsilon lower {t['epsilon_lower']:.3f}, analytic {bound}, "
            f"accuracy {accuracy}, {t['canaries']} canaries, {t['seconds']:.0f} s  "
            f"[{attacks}]  {verdict}")


def run_models(args: argparse.Namespace) -> int:
    options = ModelsAuditOptions(
        targets=tuple(dict.fromkeys(args.targets)), teachers=args.teachers,
        canary_fraction=args.canary_fraction, nonprivate_rows=args.nonprivate_rows,
        nonprivate_canaries=args.nonprivate_canaries, control_rows=args.control_rows,
        control_canaries=args.control_canaries,
        control_epochs=args.control_epochs, control_labels=args.control_labels,
        references=args.references,
        student_references=args.student_references, student_epochs=args.student_epochs,
        confidence=args.confidence, delta=args.delta, seed=args.seed, device=args.device)
    from pate.audit.models import audit_models  # torch and the models: only when asked for

    audit = audit_models(args.run, options)
    if args.json:
        print(json.dumps(audit.to_dict()))
    else:
        print(f"delta = {audit.delta:g}, confidence {audit.confidence:g} per model; per-record "
              f"results (private) in {audit.records}, the summary in {audit.summary}; the "
              "models below were trained on the private data outside any budget: their "
              "figures are private")
        for t in audit.to_dict()["targets"]:
            print(_models_line(t))
    return 0 if audit.passed else 1
