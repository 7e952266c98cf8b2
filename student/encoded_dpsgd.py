"""DP-SGD with gradient encoding and denoising (Nasr, Shokri, Houmansadr 2020, "Improving Deep
Learning with Differential Privacy using Gradient Encoding and Denoising", Algorithms 1 and 2,
§3.2), beside the plain learner of ``student.dpsgd``: same model, Poisson sampling and
hyper-parameters (``DPSGDConfig``), per-example gradients from Opacus's ``GradSampleModule``
(micro-batches of one, so one record changes one encoded vector), then per step:

1. each gradient encoded against Psi (``student.gradient_encoding.encode``), or, without
   encoding, clipped to norm C as plain DP-SGD does;
2. the sum plus i.i.d. noise of the chosen family at standard deviation sigma * C per coordinate,
   drawn from an OS-seeded generator (``student.dpsgd.secure_generator``);
3. optionally multiplied by its Kolmogorov-Smirnov distance to the noise distribution
   (denoising, post-processing), divided by the expected batch size, and an SGD step.

Epsilon is ``analysis.encoded_rdp.encoded_accountant`` (docs/privacy-math.md §10): the sampled
Gaussian for Gaussian noise, the numerical bound of the paper's Theorem 1 otherwise. A family
other than the Gaussian needs encoding (the bound is for gradients dominated by a profile).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn

from analysis.encoded_rdp import DEFAULT_GRID_SIZE, encoded_accountant
from analysis.encoding_profiles import sorted_profiles
from analysis.noise_families import DEFAULT_DOF, DENOISERS, ks_distance, noise_family
from pate.errors import UserError
from student.dpsgd import (
    DIVERGED,
    DPSGDConfig,
    DPSGDResult,
    dpsgd_setup,
    refusals,
    secure_generator,
    trained_parameters,
    training_batches,
    whole_model,
    with_model,
)
from student.gradient_encoding import (
    ProfileChooser,
    clip_flat,
    draw_noise,
    encode,
    float32_profiles,
)
from student.training import accuracy
from teachers.rng import SEED_LIMIT


@dataclass(frozen=True)
class EncodingConfig:
    """The noise family (``NOISE_FAMILIES``; Student-t with ``dof``), the size of Psi
    (``encode``, None: no encoding) and its seed, the denoiser, and the accountant's grid."""

    noise: str = "gaussian"
    dof: float = DEFAULT_DOF
    encode: int | None = None
    encode_seed: int = 0
    denoise: str = "none"
    grid_size: int = DEFAULT_GRID_SIZE

    def __post_init__(self) -> None:
        noise_family(self.noise, self.dof)
        if self.encode is not None and self.encode < 1:
            raise ValueError(f"encode must be >= 1 profiles, got {self.encode!r}")
        if not 0 <= self.encode_seed < SEED_LIMIT:
            raise ValueError(f"encode_seed must be in [0, 2^63), got {self.encode_seed}")
        if self.noise != "gaussian" and self.encode is None:
            raise ValueError(f"{self.noise} noise is accounted for encoded gradients only: "
                             "give encode (the number of profiles)")
        if self.denoise not in DENOISERS:
            raise ValueError(f"denoise must be one of {DENOISERS}, got {self.denoise!r}")

    @property
    def plain(self) -> bool:
        """True when this is today's DP-SGD (Gaussian, no encoding, no denoising)."""
        return self.noise == "gaussian" and self.encode is None and self.denoise == "none"


def train_encoded_dpsgd(train_x: np.ndarray, train_y: np.ndarray, eval_x: np.ndarray,
                        eval_y: np.ndarray, num_classes: int, config: DPSGDConfig,
                        encoding: EncodingConfig, norm: tuple[float, float],
                        progress: Callable[[int, int], None] | None = None) -> DPSGDResult:
    """Train ``config.model`` with encoded (or plain-clipped) DP-SGD and the chosen noise and
    denoiser; metrics as ``student.dpsgd.train_dpsgd``'s less the Bayesian accountant's."""
    from opacus import GradSampleModule

    with refusals():
        config = with_model(config, train_x)
        setup = dpsgd_setup(train_x, train_y, num_classes, config, norm)
        q, total_steps, n = setup.q, setup.total_steps, len(train_y)
        params = [p for p in setup.model.parameters() if p.requires_grad]
        dimension = trained_parameters(setup.model)
        accountant = encoded_accountant(encoding.noise, encoding.dof, encoding.encode,
                                        dimension, encoding.encode_seed, encoding.grid_size)
        sigma = (config.noise_multiplier if config.noise_multiplier is not None
                 else accountant.noise_multiplier_for_epsilon(
                     config.target_epsilon, q, total_steps, config.delta, config.conversion))
        family = accountant.family
        chooser = (None if encoding.encode is None else ProfileChooser(float32_profiles(
            sorted_profiles(encoding.encode, dimension, encoding.encode_seed),
            config.max_grad_norm)))
    noise_gen, noise_source = secure_generator()
    std = sigma * config.max_grad_norm
    gsm = GradSampleModule(setup.model)
    optimizer = torch.optim.SGD(params, lr=config.lr, momentum=config.momentum)
    loss_fn = nn.CrossEntropyLoss()
    factors: list[float] = []

    start = time.perf_counter()
    for xb, yb in training_batches(setup, gsm, config.epochs, progress):
        optimizer.zero_grad(set_to_none=True)
        total = torch.zeros(dimension)
        if len(yb) > 0:
            loss_fn(gsm(xb), yb).backward()
            grads = torch.cat([p.grad_sample.reshape(len(yb), -1) for p in params], 1)
            if not torch.isfinite(grads).all():  # an encoding's argmax fails on them
                raise UserError(DIVERGED)
            per_example = (clip_flat(grads, config.max_grad_norm) if chooser is None
                           else encode(grads, chooser))
            total = per_example.sum(dim=0)
        noisy = total + draw_noise(family, std, dimension, noise_gen)
        if encoding.denoise == "ks":
            factors.append(ks_distance(noisy.numpy(), family, std))
            noisy = noisy * factors[-1]
        _set_grads(params, noisy / max(1.0, q * n))
        optimizer.step()
    if not all(torch.isfinite(p).all() for p in params):  # not written out as the baseline
        raise UserError(DIVERGED)
    seconds = time.perf_counter() - start
    gsm.cleanup()  # Opacus's hooks and attributes off the published model
    published = whole_model(setup.fixed, setup.model)

    eps, order = accountant.epsilon(q, sigma, total_steps, config.delta, config.conversion)
    metrics = {
        "accuracy": accuracy(published, eval_x, eval_y, batch_size=config.eval_batch_size),
        "eval_examples": len(eval_y), "epsilon": eps, "rdp_order": order,
        "conversion": config.conversion, "delta": config.delta, "steps": total_steps,
        "noise_multiplier": sigma, "noise": encoding.noise, "sampling_rate": q,
        "max_grad_norm": config.max_grad_norm, "parameters": dimension,
        "denoise_mean_factor": float(np.mean(factors)) if factors else None,
        "train_seconds": seconds, "seconds_per_epoch": seconds / config.epochs,
        "steps_per_second": total_steps / seconds, "noise_source": noise_source,
        "config": asdict(config), "encoding": asdict(encoding),
    }
    return DPSGDResult(metrics, published, np.empty((total_steps, 0)))


def _set_grads(params: list[nn.Parameter], flat: torch.Tensor) -> None:
    """Write the flat gradient into the parameters' ``.grad`` and drop Opacus's grad samples."""
    offset = 0
    for p in params:
        p.grad = flat[offset:offset + p.numel()].view_as(p).clone()
        p.grad_sample = None
        offset += p.numel()
