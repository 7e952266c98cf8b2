"""``pate epsilon dpsgd`` and ``pate epsilon bayesian``: the epsilon of DP-SGD from the RDP core,
with the sampled-Gaussian accountant or the Bayesian accountant (docs/privacy-math.md §6, §7);
``--noise``/``--encode`` account DP-SGD with gradient encoding and any noise family (§10)."""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

import numpy as np

from analysis.bayesian import DEFAULT_MOMENTS, bayesian_epsilon
from analysis.encoded_rdp import encoded_accountant
from analysis.noise_families import DEFAULT_DOF, NOISE_FAMILIES
from analysis.rdp import CONVERSIONS
from pate.cli.paths import path_arg
from pate.data.votes_file import READ_ERRORS
from pate.errors import UserError
from student.choices import DEFAULT_CNN_PARAMETERS


def _moments(text: str) -> tuple[int, ...]:
    try:
        return tuple(int(m) for m in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"moments must be comma-separated integers, got {text!r}") from None


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "epsilon", help="epsilon of DP-SGD (RDP or the Bayesian accountant)",
        description="Epsilon of DP-SGD from the shared RDP core: the Poisson-subsampled "
                    "Gaussian (dpsgd) or the Bayesian accountant on sampled gradient pairs "
                    "(bayesian).")
    sub = parser.add_subparsers(dest="accountant", required=True, metavar="ACCOUNTANT")

    dp = sub.add_parser("dpsgd", help="RDP of the Poisson-subsampled Gaussian",
                        description="Epsilon of T steps of DP-SGD (Poisson sampling rate Q, "
                                    "noise multiplier S), minimised over the default orders.")
    dp.add_argument("--sampling-rate", type=float, required=True, metavar="Q")
    dp.add_argument("--noise-multiplier", type=float, required=True, metavar="S")
    dp.add_argument("--steps", type=int, required=True, metavar="T")
    dp.add_argument("--delta", type=float, required=True, metavar="D")
    dp.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                    help="RDP to (epsilon, delta) conversion (default: improved)")
    dp.add_argument("--noise", choices=NOISE_FAMILIES, default="gaussian",
                    help="noise family, S its standard deviation / C (default: gaussian)")
    dp.add_argument("--dof", type=float, default=DEFAULT_DOF,
                    help="degrees of freedom of Student-t noise (default 9)")
    dp.add_argument("--encode", type=int, default=None, metavar="N",
                    help="gradients encoded against N profiles (needed by non-Gaussian noise)")
    dp.add_argument("--dimension", type=int, default=DEFAULT_CNN_PARAMETERS, metavar="D",
                    help="number of model parameters (default: the default CNN's, "
                         f"{DEFAULT_CNN_PARAMETERS})")
    dp.add_argument("--encode-seed", type=int, default=0,
                    help="seed of the profiles (default 0, as pate dpsgd train)")
    dp.add_argument("--json", action="store_true", help="print one JSON object")
    dp.set_defaults(handler=run_dpsgd)

    ba = sub.add_parser("bayesian", help="the Bayesian accountant (Triastcyn & Faltings)",
                        description="Bayesian epsilon of DP-SGD from sampled pair distances of "
                                    "clipped per-example gradients, one row per step.")
    ba.add_argument("--distances", type=path_arg, required=True, metavar="F.npy",
                    help="float array [steps, pairs] of pair distances (gradient units)")
    ba.add_argument("--noise-std", type=float, required=True, metavar="S",
                    help="std of the noise added to the summed gradient (same units)")
    ba.add_argument("--sampling-rate", type=float, required=True, metavar="Q")
    ba.add_argument("--delta", type=float, required=True, metavar="D")
    ba.add_argument("--moments", type=_moments, default=DEFAULT_MOMENTS, metavar="1,2,4,8,16,32")
    ba.add_argument("--confidence", type=float, default=1 - 1e-16, metavar="C",
                    help="confidence of each step's estimate (default: 1 - 1e-16)")
    ba.add_argument("--json", action="store_true", help="print one JSON object")
    ba.set_defaults(handler=run_bayesian)


def run_dpsgd(args: argparse.Namespace) -> int:
    try:
        eps, order = encoded_accountant(
            args.noise, args.dof, args.encode, args.dimension, args.encode_seed
        ).epsilon(args.sampling_rate, args.noise_multiplier, args.steps, args.delta,
                  args.conversion)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    if not math.isfinite(eps):
        raise UserError(f"epsilon is unbounded at noise multiplier {args.noise_multiplier:g}: "
                        "too little noise for any order of the analysis")
    out = {"epsilon": eps, "order": order, "conversion": args.conversion}
    print(json.dumps(out) if args.json
          else f"epsilon = {eps:.6g} at order {order:g} ({args.conversion} conversion, "
               f"delta = {args.delta:g})")
    return 0


def _read_npy(path: Path) -> np.ndarray:
    """The one array of a ``.npy`` file; ``UserError`` where it is not one."""
    try:
        d = np.load(path, allow_pickle=False)
    except READ_ERRORS as exc:  # numpy's own text would advise allow_pickle
        raise UserError(f"{path}: not a readable .npy file of distances "
                        f"({exc.__class__.__name__})") from None
    if not isinstance(d, np.ndarray):  # an .npz archive
        d.close()
        raise UserError(f"{path}: a .npy file of one array [steps, pairs] is needed, not an "
                        ".npz archive")
    return d


def run_bayesian(args: argparse.Namespace) -> int:
    d = _read_npy(args.distances)
    try:
        eps, moment = bayesian_epsilon(d, args.noise_std, args.sampling_rate, args.delta,
                                       args.moments, args.confidence)
    except ValueError as exc:
        raise UserError(f"{args.distances}: {exc}" if "distances" in str(exc)
                        else str(exc)) from None
    out = {"epsilon": eps, "moment": moment}
    print(json.dumps(out) if args.json
          else f"Bayesian epsilon = {eps:.6g} at moment {moment} (delta = {args.delta:g}, "
               f"{d.shape[0]} steps, {d.shape[1]} pairs per step)")
    return 0
