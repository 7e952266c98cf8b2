"""The DP-SGD baseline learner (Abadi et al. 2016, "Deep Learning with Differential Privacy",
Algorithm 1) on Opacus, accounted by our own RDP core.

- Per-example gradients clipped to L2 norm C, Poisson sampling with rate q, Gaussian noise of std
  sigma * C on the sum (Opacus ``DPDataLoader``). The clipped sum comes from Opacus's ghost
  clipping (``GradSampleModuleFastGradientClipping``, ``DPOptimizerFastGradientClipping``,
  ``DPLossFastGradientClipping``; J. Lee, D. Kifer, "Scaling up Differentially Private Deep
  Learning with Fast Per-Example Gradient Clipping", PoPETs 2021; X. Li et al., "Large Language
  Models Can Be Strong Differentially Private Learners", ICLR 2022, §4): each example's gradient
  norm from a first backward pass without forming the gradient (for a linear layer
  ||a_i|| ||e_i||), then one backward pass of the loss weighted by the clipping factors. The
  update is the same as with every per-example gradient formed; a step of a linear model on
  1 296 HOG features, the Bayesian pairs included, is about 5 times faster (docs/benchmarks.md).
  Once trained, the published model is left without Opacus's hooks and gradients.
- Sampling and noise come from a generator seeded from the operating system's entropy
  (docs/design.md privacy rule 3): torchcsprng's /dev/urandom device generator when it is installed
  (Opacus's ``secure_mode``), else a ``torch.Generator`` seeded with 64 bits from ``os.urandom``.
- Epsilon is ``analysis.sampled_gaussian`` (docs/privacy-math.md §6), not Opacus's accountant; with
  a target epsilon the noise multiplier is found by bisection on it.
- Every step samples pairs of examples of the batch, takes the distances between their clipped
  gradients (for one linear layer from the factorised gradient e a^T, none formed; else
  ``torch.func``, a vmap of the per-example gradient over those rows only) and feeds them to
  ``analysis.bayesian.BayesianAccountant`` (Triastcyn & Faltings 2020, §4.2: pairs of examples
  from the data, noise std sigma * C in the same units).
- The model is the tempered-sigmoid CNN of Papernot et al. 2021 ("Tempered Sigmoid Activations
  for Deep Learning with Differential Privacy", AAAI, Table 1: MNIST/Fashion-MNIST architecture)
  with tanh, trained with momentum SGD and large batches as Tramèr & Boneh 2021 ("Differentially
  Private Learning Needs Better Features", §3) do for their end-to-end CNN baseline. Or
  (``model = "scatter-linear"``) their handcrafted-features model (§3): a linear softmax on
  wavelet scattering features (:mod:`teachers.scattering`), computed once per example; or
  (``model = "hog-linear"``) the same with HOG in place of the scattering, two to three times
  faster and about a point weaker. Or (``model = "linear"``, the default for feature rows) a
  linear softmax on the inputs, for any data.
"""

from __future__ import annotations

import copy
import importlib.util
import math
import os
import time
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import nn
from torch.utils.data import TensorDataset

from analysis.bayesian import DEFAULT_MOMENTS, BayesianAccountant, failure_probability
from analysis.rdp import Conversion
from analysis.sampled_gaussian import dpsgd_epsilon, noise_multiplier_for_epsilon
from pate.errors import UserError
from student.choices import DPSGD_MODELS, dpsgd_model_for
from student.defaults import DPSGD
from student.gradient_encoding import clip_factors
from student.training import accuracy
from teachers.choices import HOG_SIDE, SCATTERING_SIDE
from teachers.fixed_maps import feature_table
from teachers.hog import HOG, hog_size
from teachers.rng import SEED_LIMIT
from teachers.scattering import Scattering, scattering_size

if TYPE_CHECKING:
    from opacus.data_loader import DPDataLoader
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

_MIN_SIDE = 28
# what a float32 network and its noise can hold: a larger learning rate or clipping norm would
# overflow in the first step
_FLOAT32_MAX = float(np.finfo(np.float32).max)
# the Bayesian accountant's distances are kept for every step (8 bytes each): at most 2 GiB
_MOST_DISTANCES = 2**28
# said where a run's gradients or weights are no longer finite numbers
DIVERGED = ("DP-SGD diverged (its gradients or weights are no longer finite numbers): a smaller "
            "learning rate (--lr, [dpsgd] lr)")


@dataclass(frozen=True)
class DPSGDConfig:
    """Hyper-parameters; ``target_epsilon`` or ``noise_multiplier`` (exactly one) sets the noise.
    The defaults are :data:`student.defaults.DPSGD`, Tramèr & Boneh's Fashion-MNIST
    end-to-end CNN setting."""

    epochs: int = DPSGD.epochs
    expected_batch_size: int = DPSGD.batch_size
    lr: float = DPSGD.lr
    momentum: float = DPSGD.momentum
    max_grad_norm: float = DPSGD.max_grad_norm
    target_epsilon: float | None = None
    noise_multiplier: float | None = None
    delta: float = 1e-5
    conversion: Conversion = "improved"
    bayesian_pairs: int = DPSGD.bayesian_pairs
    moments: tuple[int, ...] = field(default=DEFAULT_MOMENTS)
    eval_batch_size: int = 4096
    init_seed: int | None = None
    model: str | None = None  # None: the data's default (DEFAULT_DPSGD_MODEL)

    def __post_init__(self) -> None:
        if self.model is not None and self.model not in DPSGD_MODELS:
            raise ValueError(f"model must be one of {DPSGD_MODELS}, got {self.model!r}")
        if (self.target_epsilon is None) == (self.noise_multiplier is None):
            raise ValueError("give exactly one of target_epsilon and noise_multiplier")
        if self.epochs < 1 or self.expected_batch_size < 1 or self.bayesian_pairs < 3:
            raise ValueError("epochs and expected_batch_size must be >= 1, bayesian_pairs >= 3")
        for name in ("max_grad_norm", "lr", "target_epsilon", "noise_multiplier"):
            value = getattr(self, name)
            if value is not None and not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0, got {value!r}")
            if value is not None and value >= _FLOAT32_MAX:
                raise ValueError(f"{name} must be below float32's largest number "
                                 f"({_FLOAT32_MAX:.3g}), got {value!r}")
        if not 0 <= self.momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.init_seed is not None and not 0 <= self.init_seed < SEED_LIMIT:
            raise ValueError(f"init_seed must be in [0, 2^63), got {self.init_seed}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta!r}")


def tempered_cnn(in_shape: tuple[int, int, int], num_classes: int, mean: float,
                 std: float) -> nn.Sequential:
    """Papernot et al. 2021's CNN with tanh: conv 16@8x8/2, max-pool 2/1, conv 32@4x4/2,
    max-pool 2/1, dense 32, dense classes. Inputs are standardised with ``mean``/``std`` (taken
    from public data) and images smaller than 28x28 are first upsampled to 28x28."""
    c, h, w = in_shape
    layers: list[nn.Module] = []
    if min(h, w) < _MIN_SIDE:
        layers.append(nn.Upsample(size=(max(h, _MIN_SIDE), max(w, _MIN_SIDE)), mode="nearest"))
    features = nn.Sequential(
        *layers, _Standardise(mean, std),
        nn.Conv2d(c, 16, 8, stride=2, padding=3), nn.Tanh(), nn.MaxPool2d(2, 1),
        nn.Conv2d(16, 32, 4, stride=2), nn.Tanh(), nn.MaxPool2d(2, 1), nn.Flatten())
    with torch.no_grad():
        flat = features(torch.zeros(1, c, h, w)).shape[1]
    return nn.Sequential(*features, nn.Linear(flat, 32), nn.Tanh(), nn.Linear(32, num_classes))


# The smallest image side each fixed feature map takes.
_MIN_IMAGE_SIDE = {"scatter-linear": SCATTERING_SIDE, "hog-linear": HOG_SIDE}


def with_model(config: DPSGDConfig, train_x: np.ndarray) -> DPSGDConfig:
    """``config`` with its network named: ``config.model``, else the default for the kind of
    ``train_x`` (feature rows ``[n, d]``, or images); ``ValueError`` for a network that does not
    suit it, images too small for its feature map included."""
    kind = "tabular" if train_x.ndim == 2 else "image"
    model = dpsgd_model_for(config.model, kind)
    side = _MIN_IMAGE_SIDE.get(model)
    problem = None if side is None else side.problem(f"model {model!r}", train_x.shape[1:])
    if problem:
        raise ValueError(f"{problem} (images are [n, C, H, W])")
    return replace(config, model=model)


def trained_parameters(model: nn.Module) -> int:
    """How many parameters of ``model`` DP-SGD trains: the coordinates of each gradient (and
    of the profiles that encode them, ``student.encoded_dpsgd``)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def dpsgd_network(name: str, in_shape: tuple[int, ...], num_classes: int, mean: float,
                  std: float) -> tuple[nn.Module | None, nn.Module]:
    """The network ``name`` of ``DPSGD_MODELS`` as (fixed feature map or None, trained part):
    :func:`tempered_cnn`, trained whole; a linear softmax on scattering features
    (:class:`teachers.scattering.Scattering`), Tramer & Boneh 2021's handcrafted features with a
    linear model, or on HOG features (``teachers.hog.HOG``) in place of their ScatterNet (both
    parameter-free, computed once per example before training, and normalised per example, so
    they need no ``mean``/``std``); or a linear softmax on the inputs, standardised with
    ``mean``/``std`` (logistic regression, for any data)."""
    if name == "scatter-linear":
        return Scattering(in_shape), nn.Linear(scattering_size(in_shape), num_classes)
    if name == "hog-linear":
        return HOG(), nn.Linear(hog_size(in_shape), num_classes)
    if name == "linear":
        return None, nn.Sequential(_Standardise(mean, std), nn.Flatten(),
                                   nn.Linear(int(np.prod(in_shape)), num_classes))
    if name == "tempered-cnn":
        return None, tempered_cnn(in_shape, num_classes, mean, std)
    raise ValueError(f"unknown DP-SGD network {name!r}; choose one of {', '.join(DPSGD_MODELS)}")


def fixed_features(fixed: nn.Module | None, x: np.ndarray) -> np.ndarray:
    """``fixed`` applied to every row of ``x`` (``teachers.fixed_maps.feature_table``), or
    ``x`` itself. A fixed map is the same function of each example whatever the data: it costs
    no privacy."""
    return x if fixed is None else feature_table([fixed], torch.from_numpy(x)).numpy()


def whole_model(fixed: nn.Module | None, trained: nn.Module) -> nn.Module:
    """The published model: the fixed map, then the trained part."""
    return trained if fixed is None else nn.Sequential(fixed, trained)


class _Standardise(nn.Module):
    """(x - mean) / std with fixed public constants (no parameters, so nothing to clip)."""

    def __init__(self, mean: float, std: float) -> None:
        super().__init__()
        self.mean, self.std = float(mean), float(std)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std


def secure_generator() -> tuple[torch.Generator, str]:
    """A generator for sampling and noise seeded from the OS, and a description of it."""
    if importlib.util.find_spec("torchcsprng") is not None:
        import torchcsprng

        return (torchcsprng.create_random_device_generator("/dev/urandom"),
                "torchcsprng /dev/urandom device generator")
    gen = torch.Generator()
    gen.manual_seed(int.from_bytes(os.urandom(8), "little"))
    return gen, "torch.Generator (mt19937) seeded with 64 bits from os.urandom; torchcsprng " \
                "not installed"


def per_example_gradients(network: nn.Module, parameters: dict[str, torch.Tensor],
                          x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """The gradient of each row's cross-entropy loss on (x, y) with respect to ``parameters``
    (name to tensor, in ``network``'s naming), for ``network`` evaluated at them, flattened in
    their order: ``[n, parameters]``. A vmap of ``torch.func.grad`` over the rows; ``network``
    must carry no backward hooks (torch.func cannot pass them), and is not changed."""
    from torch.func import functional_call, grad, vmap

    fixed = {k: p.detach() for k, p in parameters.items()}
    buffers = dict(network.named_buffers())

    def loss(p: dict[str, torch.Tensor], xi: torch.Tensor, yi: torch.Tensor) -> torch.Tensor:
        logits = functional_call(network, (p, buffers), (xi.unsqueeze(0),))
        return nn.functional.cross_entropy(logits, yi.unsqueeze(0))

    grads = vmap(grad(loss), in_dims=(None, 0, 0))(fixed, x, y)
    return torch.cat([grads[k].reshape(len(y), -1) for k in fixed], dim=1)


def _linear_gradient_products(layer: nn.Linear, parameters: dict[str, torch.Tensor],
                              x: torch.Tensor, y: torch.Tensor
                              ) -> tuple[torch.Tensor, torch.Tensor]:
    """For one linear layer under the cross-entropy loss, each row's gradient with respect to
    (W, b) is the outer product e a^T, e = softmax(W x + b) - onehot(y) and a = (x, 1) (the
    1 where the bias is trained), so ||g_i||^2 = ||e_i||^2 ||a_i||^2 and <g_i, g_j> =
    <e_i, e_j> <a_i, a_j> without forming a gradient (I. Goodfellow, "Efficient Per-Example
    Gradient Computations", arXiv 1510.01799, 2015; the factorisation ghost clipping uses).
    For 2p rows, the first p paired with the last p, in float64: every row's ||g||^2 and each
    pair's <g_i, g_j>."""
    a = x.double()
    bias = layer.bias  # in the logits even where it is frozen (then not in ``parameters``)
    logits = a @ parameters["weight"].detach().double().T
    if bias is not None:
        logits = logits + bias.detach().double()
    e = torch.softmax(logits, dim=1)
    e[torch.arange(len(y)), y] -= 1.0
    ones = 1.0 if "bias" in parameters else 0.0
    p = len(y) // 2
    return ((e * e).sum(1) * ((a * a).sum(1) + ones),
            (e[:p] * e[p:]).sum(1) * ((a[:p] * a[p:]).sum(1) + ones))


def pair_distances(network: nn.Module, parameters: dict[str, torch.Tensor], x: torch.Tensor,
                   y: torch.Tensor, max_grad_norm: float, pairs: int,
                   generator: torch.Generator) -> torch.Tensor:
    """Distances ||c_i g_i - c_j g_j|| between ``pairs`` random pairs (i != j) of the batch
    (x, y)'s clipped per-example gradients (Opacus's flat clipping,
    ``student.gradient_encoding.clip_factors``); i.i.d. pairs, as the Student-t estimate of the
    Bayesian accountant assumes. From the squared norms and inner products of the pairs'
    gradients, in float64: for a network that is one linear layer by
    :func:`_linear_gradient_products`, else from the pairs' rows' :func:`per_example_gradients`.
    A batch of fewer than two examples gives the worst case C for every pair."""
    b = len(y)
    if b < 2:
        return torch.full((pairs,), float(max_grad_norm), dtype=torch.float64)
    i = torch.randint(b, (pairs,), generator=generator)
    j = (i + torch.randint(1, b, (pairs,), generator=generator)) % b
    rows = torch.cat([i, j])
    if isinstance(network, nn.Linear):
        squares, inner = _linear_gradient_products(network, parameters, x[rows], y[rows])
    else:
        grads = per_example_gradients(network, parameters, x[rows], y[rows]).double()
        squares, inner = (grads * grads).sum(1), (grads[:pairs] * grads[pairs:]).sum(1)
    c = clip_factors(squares.sqrt(), max_grad_norm)
    squared = (c**2 * squares).view(2, pairs).sum(0) - 2 * c[:pairs] * c[pairs:] * inner
    return squared.clamp(min=0.0).sqrt()


@dataclass
class DPSGDResult:
    """What a run produced: the metrics (JSON-ready), the trained model, and the pair distances
    [steps, pairs] (private: they depend on the training data)."""

    metrics: dict = field(repr=False)  # with the Bayesian figures, private
    model: nn.Module
    distances: np.ndarray = field(repr=False)


@dataclass
class DPSGDSetup:
    """What both DP-SGD learners share: the sampling rate q = min(1, batch / n), the
    Poisson-sampled loader over the training rows (after the fixed feature map) drawing from an
    OS-seeded generator, the number of steps, and the network as (fixed map, trained part)."""

    q: float
    loader: DPDataLoader
    total_steps: int
    fixed: nn.Module | None
    model: nn.Module
    sample_generator: torch.Generator


class WholeBatches(TensorDataset):
    """A ``TensorDataset`` that fetches a batch by one index of its tensors (``__getitems__``,
    which torch's fetcher prefers) rather than a Python call per row and a stack of them: the
    same rows in the same order, about 9 times faster to fetch (60 000 rows in batches of 2 048).
    Its batches are whole: a loader over it takes ``collate_fn=WholeBatches.collate``."""

    def __getitems__(self, rows: list[int]) -> tuple[torch.Tensor, ...]:
        index = torch.as_tensor(rows, dtype=torch.int64)
        return tuple(t[index] for t in self.tensors)

    @staticmethod
    def collate(batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
        """The loader's collate function: the batch as fetched."""
        return batch


@contextmanager
def refusals() -> Iterator[None]:
    """What a DP-SGD learner refuses before it trains (its settings, an epsilon no noise
    reaches, a network that does not suit the data, a run too long to account), raised as
    ``ValueError`` inside the block, as one ``UserError``. Not around the training itself: an
    error there may quote the private rows."""
    try:
        yield
    except ValueError as exc:
        raise UserError(str(exc)) from None


def dpsgd_setup(train_x: np.ndarray, train_y: np.ndarray, num_classes: int,
                config: DPSGDConfig, norm: tuple[float, float]) -> DPSGDSetup:
    """The :class:`DPSGDSetup` of a run; the network is initialised from ``config.init_seed``
    when given (sampling and noise never are)."""
    from opacus.data_loader import DPDataLoader

    q = min(1.0, config.expected_batch_size / len(train_y))
    if q == 1.0:  # said without the number of rows (private where dealt by record or key)
        warnings.warn(f"the expected batch ({config.expected_batch_size}) is not smaller than "
                      "the private data: every step takes all of it (sampling rate 1), one "
                      f"step per epoch, {config.epochs} in all; a smaller batch trains more "
                      "steps", stacklevel=2)
    assert config.model is not None, "name the network first (with_model)"
    seeded = config.init_seed is not None
    with torch.random.fork_rng(devices=[], enabled=seeded):  # the caller's generator untouched
        if seeded:
            torch.manual_seed(config.init_seed)
        fixed, model = dpsgd_network(config.model, tuple(train_x.shape[1:]), num_classes, *norm)
    features = fixed_features(fixed, train_x)
    sample_gen, _ = secure_generator()
    loader = DPDataLoader(WholeBatches(torch.from_numpy(features), torch.from_numpy(train_y)),
                          sample_rate=q, generator=sample_gen, collate_fn=WholeBatches.collate)
    return DPSGDSetup(q, loader, config.epochs * len(loader), fixed, model, sample_gen)


def training_batches(setup: DPSGDSetup, module: nn.Module, epochs: int,
                     progress: Callable[[int, int], None] | None
                     ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Every Poisson batch of every epoch, ``module`` in training mode; ``progress(step,
    total)`` once the caller is done with each batch."""
    step = 0
    with warnings.catch_warnings():
        # Opacus's hooks on a model whose input needs no gradient make torch warn on every step.
        warnings.filterwarnings("ignore", message="Full backward hook is firing")
        for _ in range(epochs):
            module.train()
            for batch in setup.loader:
                yield batch
                step += 1
                if progress is not None:
                    progress(step, setup.total_steps)


def ghost_clipped_sgd(model: nn.Module, config: DPSGDConfig, sigma: float,
                      expected_batch_size: int, generator: torch.Generator
                      ) -> tuple[GradSampleModuleFastGradientClipping,
                                 DPOptimizerFastGradientClipping, DPLossFastGradientClipping]:
    """Opacus's ghost clipping around ``model``: the wrapped model, the noisy momentum SGD
    (noise std ``sigma`` C on the clipped sum, drawn from ``generator``, divided by the expected
    batch size) and the loss whose ``backward()`` leaves the clipped sum in the gradients."""
    from opacus.grad_sample import GradSampleModuleFastGradientClipping
    from opacus.optimizers import DPOptimizerFastGradientClipping
    from opacus.utils.fast_gradient_clipping_utils import DPLossFastGradientClipping

    gsm = GradSampleModuleFastGradientClipping(model, max_grad_norm=config.max_grad_norm,
                                               use_ghost_clipping=True)
    optimizer = DPOptimizerFastGradientClipping(
        torch.optim.SGD(gsm.parameters(), lr=config.lr, momentum=config.momentum),
        noise_multiplier=sigma, max_grad_norm=config.max_grad_norm,
        expected_batch_size=expected_batch_size, generator=generator)
    return gsm, optimizer, DPLossFastGradientClipping(gsm, optimizer, nn.CrossEntropyLoss())


def train_dpsgd(train_x: np.ndarray, train_y: np.ndarray, eval_x: np.ndarray | None,
                eval_y: np.ndarray | None, num_classes: int, config: DPSGDConfig,
                norm: tuple[float, float],
                progress: Callable[[int, int], None] | None = None) -> DPSGDResult:
    """Train the network ``config.model`` (``with_model``: None takes the data's default)
    with DP-SGD on (train_x, train_y), report accuracy on
    (eval_x, eval_y) (None without them), and account the run with the RDP and the Bayesian
    accountant. ``norm`` is the (mean, std) used to standardise inputs, from public data.
    ``progress(step, total)`` is called after every step."""
    with refusals():
        config = with_model(config, train_x)
        setup = dpsgd_setup(train_x, train_y, num_classes, config, norm)
        q, total_steps, n = setup.q, setup.total_steps, len(train_y)
        if total_steps * config.bayesian_pairs > _MOST_DISTANCES:  # said without the steps,
            # which tell the number of private rows
            raise ValueError(f"the run's steps of {config.bayesian_pairs} Bayesian pairs each: "
                             "their distances would not fit in 2 GiB; fewer epochs, a larger "
                             "batch or fewer pairs")
        bayes = BayesianAccountant(config.moments, total_steps=total_steps)
        if not failure_probability(bayes.gamma, total_steps) < config.delta:  # refused
            # after training otherwise, when the accountant converts
            raise ValueError(f"delta {config.delta:g} is not above the Bayesian accountant's "
                             "failure probability over the run's steps: a larger delta or "
                             "fewer steps")
        sigma = (config.noise_multiplier if config.noise_multiplier is not None
                 else noise_multiplier_for_epsilon(config.target_epsilon, q, total_steps,
                                                   config.delta, config.conversion))
    noise_gen, noise_source = secure_generator()
    twin = copy.deepcopy(setup.model)  # for the pairs' gradients: without Opacus's hooks
    trained = {k: p for k, p in setup.model.named_parameters() if p.requires_grad}
    gsm, optimizer, loss_fn = ghost_clipped_sgd(setup.model, config, sigma,
                                                max(1, round(q * n)), noise_gen)
    distances = np.empty((total_steps, config.bayesian_pairs), np.float64)

    start = time.perf_counter()
    for step, (xb, yb) in enumerate(training_batches(setup, gsm, config.epochs, progress)):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(gsm(xb), yb).backward()
        distances[step] = pair_distances(twin, trained, xb, yb, config.max_grad_norm,
                                         config.bayesian_pairs, setup.sample_generator).numpy()
        if not np.isfinite(distances[step]).all():
            raise UserError(DIVERGED)
        bayes.accumulate(distances[step], sigma * config.max_grad_norm, q)
        optimizer.step()
    seconds = time.perf_counter() - start
    optimizer.zero_grad(set_to_none=True)  # the last clipped sum, before its noise, is private
    gsm.cleanup()  # Opacus's hooks and the last batch's gradient norms off the published model

    published = whole_model(setup.fixed, setup.model)
    eps_rdp, order = dpsgd_epsilon(q, sigma, total_steps, config.delta, config.conversion)
    eps_bayes, moment = bayes.epsilon_and_moment(config.delta)
    metrics = {
        "accuracy": (None if eval_x is None or eval_y is None
                     else accuracy(published, eval_x, eval_y, batch_size=config.eval_batch_size)),
        "eval_examples": 0 if eval_y is None else len(eval_y),
        "epsilon": eps_rdp, "rdp_order": order, "conversion": config.conversion,
        "epsilon_bayesian": eps_bayes, "bayesian_moment": moment,
        "bayesian_failure_probability": bayes.failure_probability,
        "delta": config.delta, "steps": total_steps, "noise_multiplier": sigma,
        "sampling_rate": q, "max_grad_norm": config.max_grad_norm,
        "train_seconds": seconds, "steps_per_second": total_steps / seconds,
        "noise_source": noise_source, "config": asdict(config),
    }
    return DPSGDResult(metrics, published, distances)
