"""``pate dpsgd train``: the DP-SGD baseline learner (``student.dpsgd``) on a run directory.

It learns the run's teachers' data unless data flags say otherwise. Writes
``DIR/dpsgd/metrics.json`` (accuracy on the test data, the RDP and the Bayesian epsilon, delta,
steps, noise multiplier, sampling rate, clipping norm), ``DIR/dpsgd/model.pt`` (the state
dict) and, private, ``DIR/dpsgd/distances.npy`` (the pair distances per step, input of
``pate epsilon bayesian``). ``--noise``, ``--encode`` and ``--denoise`` select DP-SGD with
gradient encoding and denoising (``student.encoded_dpsgd``).
"""

from __future__ import annotations

import argparse
import json

from analysis.noise_families import DEFAULT_DOF, DENOISERS, NOISE_FAMILIES
from analysis.rdp import CONVERSIONS
from pate.cli.data_flags import add_data_flags, source_from_flags
from pate.cli.paths import path_arg
from pate.errors import UserError
from pate.progress import by_epoch, progress_bar
from pate.rundir import RunDir
from student.choices import DPSGD_MODELS
from student.defaults import DPSGD


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "dpsgd", help="the DP-SGD baseline learner",
        description="DP-SGD (Opacus, Poisson sampling, per-example clipping) accounted by the "
                    "RDP core and the Bayesian accountant.")
    sub = parser.add_subparsers(dest="dpsgd_command", required=True, metavar="COMMAND")
    train = sub.add_parser("train", help="train the DP-SGD baseline",
                           description="Train a network with DP-SGD on the private data "
                                       "(default: the run's teachers') and evaluate it on the "
                                       "test data.")
    train.add_argument("--run", type=path_arg, required=True, metavar="DIR",
                       help="run directory: the model and metrics go to DIR/dpsgd/; without "
                            "data flags it learns the data of DIR's teachers")
    add_data_flags(train)
    noise = train.add_mutually_exclusive_group(required=True)
    noise.add_argument("--epsilon", type=float, metavar="E",
                       help="target epsilon; the noise multiplier is calibrated to it")
    noise.add_argument("--noise-multiplier", type=float, metavar="S",
                       help="the noise's standard deviation over the clipping norm C; the "
                            "epsilon follows from it")
    train.add_argument("--model", choices=DPSGD_MODELS, default=None,
                       help="the network: the tempered-sigmoid CNN (images' default), a linear "
                            "softmax on wavelet scattering or HOG features (images), or a "
                            "linear softmax on the inputs (feature rows' default)")
    train.add_argument("--epochs", type=int, default=DPSGD.epochs,
                       help="passes over the private data")
    train.add_argument("--delta", type=float, default=1e-5,
                       help="delta of the (epsilon, delta) guarantee, well below 1/n")
    train.add_argument("--allow-large-delta", action="store_true",
                       help="accept a delta of 1/n or more (n the private records)")
    train.add_argument("--batch-size", type=int, default=DPSGD.batch_size,
                       help="expected batch size; the Poisson sampling rate is this / n")
    train.add_argument("--lr", type=float, default=DPSGD.lr,
                       help="learning rate of SGD")
    train.add_argument("--momentum", type=float, default=DPSGD.momentum,
                       help="SGD's momentum, in [0, 1)")
    train.add_argument("--max-grad-norm", type=float, default=DPSGD.max_grad_norm, metavar="C",
                       help="each example's gradient is clipped to this L2 norm")
    train.add_argument("--conversion", choices=CONVERSIONS, default="improved",
                       help="RDP to (epsilon, delta) conversion")
    train.add_argument("--bayesian-pairs", type=int, default=DPSGD.bayesian_pairs,
                       help="gradient pairs sampled per step for the Bayesian accountant")
    train.add_argument("--noise", choices=NOISE_FAMILIES, default="gaussian",
                       help="noise family; --noise-multiplier is its standard deviation / C "
                            "(default: gaussian)")
    train.add_argument("--dof", type=float, default=DEFAULT_DOF,
                       help="degrees of freedom of Student-t noise (> 2; default 9)")
    train.add_argument("--encode", type=int, default=None, metavar="N",
                       help="encode each gradient against N preselected profiles (Nasr et al. "
                            "2020; needed by non-Gaussian noise)")
    train.add_argument("--encode-seed", type=int, default=0,
                       help="seed of the public profiles (default 0)")
    train.add_argument("--denoise", choices=DENOISERS, default="none",
                       help="ks: scale each noisy gradient by its Kolmogorov-Smirnov distance "
                            "to the noise distribution (post-processing)")
    train.add_argument("--init-seed", type=int, default=None,
                       help="seed of the weight initialisation only (offline experiments); "
                            "sampling and noise always come from the OS's entropy")
    train.add_argument("--json", action="store_true", help="print the metrics as JSON")
    train.set_defaults(handler=run_train)


def run_train(args: argparse.Namespace) -> int:
    from student.baseline import split_bayesian, train_dpsgd_baseline
    from student.dpsgd import DPSGDConfig
    from student.encoded_dpsgd import EncodingConfig
    from teachers.manifest import teachers_source

    try:
        config = DPSGDConfig(
            epochs=args.epochs, expected_batch_size=args.batch_size, lr=args.lr,
            momentum=args.momentum, max_grad_norm=args.max_grad_norm,
            target_epsilon=args.epsilon, noise_multiplier=args.noise_multiplier,
            delta=args.delta, conversion=args.conversion, bayesian_pairs=args.bayesian_pairs,
            init_seed=args.init_seed, model=args.model)
        encoding = EncodingConfig(noise=args.noise, dof=args.dof, encode=args.encode,
                                  encode_seed=args.encode_seed, denoise=args.denoise)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    run = RunDir(args.run)
    data = source_from_flags(args, teachers_source(run.root))  # default: the run's teachers'
    with progress_bar("DP-SGD", config.epochs, "epoch") as bar:
        metrics = train_dpsgd_baseline(run, config, data, by_epoch(bar, config.epochs),
                                       encoding=encoding,
                                       allow_large_delta=args.allow_large_delta)
    bayesian = (f", {metrics['epsilon_bayesian']:.3f} (Bayesian: data-dependent, private, "
                f"{run.dpsgd_bayesian.name})" if "epsilon_bayesian" in metrics else "")
    public, private = split_bayesian(metrics)  # data-dependent: marked, as on the line below
    print(json.dumps({**public, **({"private": private} if private else {})}) if args.json
          else f"accuracy {metrics['accuracy']:.4f}  epsilon {metrics['epsilon']:.3f} (RDP)"
               f"{bayesian}  delta {metrics['delta']:g}  -> {run.dpsgd_metrics}\n"
               f"{_guarantee(metrics)}")
    return 0


def _guarantee(metrics: dict) -> str:
    """What the RDP epsilon covers, in words: the line under the figures (epochs, not steps:
    with the batch, the steps would say how many private records there are)."""
    noise, epochs = metrics.get("noise", "gaussian"), metrics["config"]["epochs"]
    encoded = metrics.get("encoding", {}).get("encode")
    batches = ("every step on all the private data (sampling rate 1)"
               if metrics.get("sampling_rate") == 1.0 else "Poisson-sampled batches of "
               f"{metrics['config']['expected_batch_size']} expected")
    return (f"the guarantee: ({metrics['epsilon']:.3f}, {metrics['delta']:g})-DP for one "
            f"record added or removed; {batches}, each example's gradient "
            f"clipped to {metrics['max_grad_norm']:g}"
            + (f" and encoded against {encoded} public profiles" if encoded else "")
            + f", {noise} noise of {metrics['noise_multiplier']:.4g} times that, "
            f"{epochs} epoch{'s' * (epochs != 1)}, {metrics['conversion']} RDP conversion")
