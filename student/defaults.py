"""The student's and DP-SGD's settings where none is given, as data importable without torch:
the one place the library (``student.training``, ``student.options``, ``student.dpsgd``),
the command line, the config's ``[student]`` and ``[dpsgd]`` and the Python API read them."""

from dataclasses import dataclass


@dataclass(frozen=True)
class StudentDefaults:
    """``queries`` pool rows asked in requests of ``request_size``; ``epochs`` passes over the
    pool in steps of ``batch_size`` answered and ``unlabelled_batch_size`` pool rows;
    ``width``: the channels of the CNNs' first layer; ``vat_eps``: the norm of VAT's
    perturbation."""

    queries: int = 1000
    request_size: int = 512
    epochs: int = 30
    batch_size: int = 32
    unlabelled_batch_size: int = 128
    width: int = 32
    vat_eps: float = 2.0


@dataclass(frozen=True)
class DPSGDDefaults:
    """F. Tramèr and D. Boneh's Fashion-MNIST end-to-end CNN setting ("Differentially Private
    Learning Needs Better Features", ICLR 2021): expected batch 2048, learning rate 4,
    momentum 0.9, clipping norm C = 0.1, 40 epochs. ``bayesian_pairs``: the gradient pairs
    sampled per step for the Bayesian accountant."""

    epochs: int = 40
    batch_size: int = 2048
    lr: float = 4.0
    momentum: float = 0.9
    max_grad_norm: float = 0.1
    bayesian_pairs: int = 256


STUDENT = StudentDefaults()
DPSGD = DPSGDDefaults()
# The widest student network: channels beyond this exhaust any memory before they train
MOST_WIDTH = 65_536
