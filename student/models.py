"""Student architectures for small images (28x28 grey-scale, and smaller such as 8x8 digits).

- ``cnn``: the VAT paper's convolutional classifier (Miyato et al., "Virtual Adversarial Training:
  A Regularization Method for Supervised and Semi-Supervised Learning", TPAMI 2018, appendix,
  "Conv-Small": 3x3 convolutions with batch normalisation and leaky ReLU(0.1), two max-pools, a
  1x1 convolution and global average pooling), narrowed (``width`` 32 instead of 96) to train on a
  few CPU cores. No dropout: VAT compares a clean and a perturbed pass of the same network, and
  different dropout masks would dominate the xi = 1e-6 finite difference.
- ``cnn-hog``: ``cnn`` beside a linear softmax on histograms of oriented gradients (the HOG
  expert of the ``cnn-pool-hog`` teachers, :mod:`teachers.hog`), as
  :class:`teachers.models.Experts`: each expert trained on its own cross-entropy
  (``student.losses``), the prediction the mean of their probabilities. VAT's smoothness is for
  the ``cnn`` expert only (``student.choices``): one perturbation shared by the two experts
  stopped being adversarial for the ``cnn`` (its smoothness term fell threefold) and the pair
  did no better than ``cnn``. On Fashion-MNIST, four end-to-end draws averaged 0.817, as
  ``cnn``'s five did (figures in the README).
- ``cnn-hog-scatter``: ``cnn-hog`` with a third expert, a linear softmax on wavelet scattering
  features (:mod:`teachers.scattering`, the second expert of the ``hog-scatter`` teachers),
  trained as ``cnn-hog``. On the 353 answers of a main-job run (label accuracy 0.858), three
  seeds each: 0.826 ± 0.002 against 0.819 ± 0.004 for ``cnn-hog`` (docs/reproductions.md).
- ``cnn-hog-simclr``: ``cnn`` beside a linear softmax on :class:`PoolFeatures`, the HOG features
  and a frozen encoder learnt from the public pool by SimCLR (:mod:`teachers.pool_encoder`, the
  third expert of the ``cnn-pool-hog-simclr`` teachers), each standardised on the pool. Trained
  as ``cnn-hog``: each expert on its own cross-entropy, VAT's smoothness for the ``cnn`` only.
  The encoder's features, learnt from thousands of unlabelled images, carry what the few hundred
  answered labels cannot teach the ``cnn`` (figures in the README).
- ``mlp``: the VAT paper's MNIST network (§4: 784-1200-600-300-150-10, batch norm, ReLU).
- ``wn-mlp``: the improved-GAN discriminator below, as a classifier (the GAN student's network,
  and the architecture of its supervised baseline).
- ``Discriminator`` / ``Generator``: the improved-GAN MNIST networks (Salimans et al., "Improved
  Techniques for Training GANs", NeurIPS 2016, §5.1 and its released code): a K-class
  discriminator of weight-normalised dense layers 1000-500-250-250-250 with Gaussian noise on the
  input (std 0.3) and on every hidden layer (std 0.5); a generator 100-500-500-784 with softplus,
  batch norm and a weight-normalised sigmoid output layer.

A user's own network is named by its import path ``package.module:factory`` instead
(:mod:`teachers.user_models`, the resolver the teachers use too): ``factory(input_shape,
num_classes)`` returns a ``torch.nn.Module`` whose forward returns logits; vat and supervised
train it, the GAN keeps its own discriminator.

``ModelSpec`` names an architecture (a built-in or an import path) and its shapes, so that saved
weights can be rebuilt (the import path must still be importable where they are loaded).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from pate.data.preprocessing import channels_last
from pate.errors import UserError
from student.choices import ARCHITECTURE_RECORDS, ARCHITECTURES, POOL_FEATURE_ARCHS
from teachers.choices import is_import_path
from teachers.hog import hog_features, hog_size
from teachers.models import Experts, hog_linear, scatter_linear
from teachers.pool_encoder import FEATURES, FrozenEncoder
from teachers.user_models import build_user_model

Z_DIM = 100  # Salimans et al., MNIST generator input
# Where the PoolFeatures of the architectures that read them (``POOL_FEATURE_ARCHS``) sit in
# the state dict.
POOL_FEATURES_KEY = "experts.1.0."


@dataclass(frozen=True)
class ModelSpec:
    """An architecture with its input shape ``(C, H, W)`` and number of classes."""

    arch: str
    in_shape: tuple[int, int, int]
    num_classes: int
    width: int = 32

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> ModelSpec:
        return cls(data["arch"], tuple(data["in_shape"]), int(data["num_classes"]),
                   int(data.get("width", 32)))


def _conv_bn(cin: int, cout: int, k: int) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, k, padding=k // 2, bias=False), nn.BatchNorm2d(cout),
            nn.LeakyReLU(0.1)]


def conv_small(in_shape: tuple[int, int, int], num_classes: int, width: int = 32) -> nn.Module:
    """Conv-Small of the VAT paper (appendix) at ``width`` channels: [3x3 w]x2, max-pool,
    [3x3 2w]x2, max-pool, 3x3 2w, 1x1 2w, global average pool, linear. Any H, W >= 4."""
    c = in_shape[0]
    w, w2 = width, 2 * width
    return nn.Sequential(
        *_conv_bn(c, w, 3), *_conv_bn(w, w, 3), nn.MaxPool2d(2),
        *_conv_bn(w, w2, 3), *_conv_bn(w2, w2, 3), nn.MaxPool2d(2),
        *_conv_bn(w2, w2, 3), *_conv_bn(w2, w2, 1),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(w2, num_classes))


def mlp(in_shape: tuple[int, int, int], num_classes: int) -> nn.Module:
    """The VAT paper's MNIST MLP (§4): 1200-600-300-150 with batch norm and ReLU."""
    layers: list[nn.Module] = [nn.Flatten()]
    fan_in = math.prod(in_shape)
    for units in (1200, 600, 300, 150):
        layers += [nn.Linear(fan_in, units, bias=False), nn.BatchNorm1d(units), nn.ReLU()]
        fan_in = units
    layers.append(nn.Linear(fan_in, num_classes))
    return nn.Sequential(*layers)


class PoolFeatures(nn.Module):
    """Fixed features of an image: its HOG (:func:`teachers.hog.hog_features`) standardised with
    the public pool's mean and standard deviation, followed by the frozen pool encoder's
    (:class:`teachers.pool_encoder.FrozenEncoder`, already standardised on the pool), so that a
    linear softmax weighs the two alike. Buffers only: nothing here is trained, and the tensors
    travel with the student's saved weights."""

    def __init__(self, encoder: Mapping[str, np.ndarray | torch.Tensor], hog_mean: torch.Tensor,
                 hog_std: torch.Tensor) -> None:
        super().__init__()
        self.encoder = FrozenEncoder(encoder)
        self.register_buffer("hog_mean", torch.as_tensor(hog_mean, dtype=torch.float32))
        self.register_buffer("hog_std", torch.as_tensor(hog_std, dtype=torch.float32))

    @staticmethod
    def size(in_shape: tuple[int, int, int]) -> int:
        """Number of features for images of ``in_shape``."""
        return hog_size(in_shape) + FEATURES

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([(hog_features(x) - self.hog_mean) / self.hog_std, self.encoder(x)], 1)

    @classmethod
    def on_pool(cls, encoder: Mapping[str, np.ndarray | torch.Tensor], pool_x: np.ndarray
                ) -> PoolFeatures:
        """The features for ``encoder``, HOG standardised on the public pool ``pool_x``."""
        with torch.no_grad():
            hog = torch.cat([hog_features(torch.as_tensor(pool_x[i:i + 1024],
                                                          dtype=torch.float32))
                             for i in range(0, len(pool_x), 1024)])
        return cls(encoder, hog.mean(0), hog.std(0) + 1e-3)

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> PoolFeatures:
        """The features saved in a ``cnn-hog-simclr`` student's state dict."""
        prefix = POOL_FEATURES_KEY + "encoder."
        encoder = {k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)}
        return cls(encoder, state[POOL_FEATURES_KEY + "hog_mean"],
                   state[POOL_FEATURES_KEY + "hog_std"])


def same_tensors(a: nn.Module, b: nn.Module) -> bool:
    """Whether two modules hold equal parameters and buffers under the same names."""
    sa, sb = a.state_dict(), b.state_dict()
    return sa.keys() == sb.keys() and all(torch.equal(sa[k].cpu(), sb[k].cpu()) for k in sa)


def build_classifier(spec: ModelSpec, features: PoolFeatures | None = None) -> nn.Module:
    """The classifier of ``spec``: ``cnn``, ``cnn-hog``, ``cnn-hog-scatter``, ``cnn-hog-simclr``
    (which needs its ``features``; the others take none), ``mlp``, ``wn-mlp`` (the GAN's
    discriminator), or a user's network by its import path."""
    if (spec.arch in POOL_FEATURE_ARCHS) != (features is not None):
        raise ValueError(f"architecture {spec.arch} "
                         f"{'needs' if features is None else 'takes no'} pool features")
    if spec.arch == "cnn":
        return conv_small(spec.in_shape, spec.num_classes, spec.width)
    if spec.arch == "cnn-hog":
        return Experts(conv_small(spec.in_shape, spec.num_classes, spec.width),
                       hog_linear(spec.in_shape, spec.num_classes))
    if spec.arch == "cnn-hog-scatter":
        return Experts(conv_small(spec.in_shape, spec.num_classes, spec.width),
                       hog_linear(spec.in_shape, spec.num_classes),
                       scatter_linear(spec.in_shape, spec.num_classes))
    if spec.arch == "cnn-hog-simclr":
        return Experts(conv_small(spec.in_shape, spec.num_classes, spec.width),
                       nn.Sequential(features, nn.Linear(PoolFeatures.size(spec.in_shape),
                                                         spec.num_classes)))
    if spec.arch == "mlp":
        return mlp(spec.in_shape, spec.num_classes)
    if spec.arch == "wn-mlp":
        return Discriminator(spec.in_shape, spec.num_classes)
    if is_import_path(spec.arch):
        return build_user_model(spec.arch, spec.in_shape, spec.num_classes, "arch")
    raise ValueError(f"unknown architecture {spec.arch!r}; choose one of {ARCHITECTURES}")


def check_network(spec: ModelSpec) -> None:
    """Build ``spec``'s network once and run it on two blank inputs: a user's factory that
    fails, a network of the wrong output, or one its inputs are too small for (a 1x1 image
    through the CNN's pooling) fails here, before anything is asked or spent. The
    architectures on pool features are built-ins, built once the encoder is at hand. A
    built-in's smallest image side is checked first, and said in the error."""
    hint = (" (images are [C, H, W]: these look [H, W, C], channels last)"
            if channels_last(spec.in_shape) else "")
    record = ARCHITECTURE_RECORDS.get(spec.arch)
    problem = (record.min_side.problem(f"arch {spec.arch}", spec.in_shape)
               if record is not None and len(spec.in_shape) == 3 else None)
    if problem:
        raise UserError(problem + hint)
    if spec.arch in POOL_FEATURE_ARCHS:
        return
    try:
        network = build_classifier(spec, None).eval()  # a fixed map may refuse the size here
        with torch.no_grad():
            out = network(torch.zeros((2, *spec.in_shape)))
    except UserError:  # a user's factory that fails: its own line
        raise
    except Exception as exc:  # a user's forward may raise anything
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"arch {spec.arch!r} cannot take inputs of shape "
                        f"{list(spec.in_shape)}{hint}: {reason}") from None
    if not isinstance(out, torch.Tensor):
        raise UserError(f"arch {spec.arch!r} returns a "
                        f"{type(out).__name__}, not a tensor of logits")
    if tuple(out.shape) != (2, spec.num_classes):
        raise UserError(f"arch {spec.arch!r} gives outputs of shape "
                        f"{list(out.shape)[1:]} for {spec.num_classes} classes")


class GaussianNoise(nn.Module):
    """Additive N(0, std^2) noise in training mode, identity in evaluation mode."""

    def __init__(self, std: float) -> None:
        super().__init__()
        self.std = std

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.std * torch.randn_like(x) if self.training else x


class Discriminator(nn.Module):
    """The improved-GAN K-class discriminator (Salimans et al. 2016, §5.1): its logits classify,
    and ``features`` is the last hidden layer, on which the generator matches statistics (§3.1)."""

    HIDDEN = (1000, 500, 250, 250, 250)

    def __init__(self, in_shape: tuple[int, int, int], num_classes: int) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Flatten(), GaussianNoise(0.3)]
        fan_in = math.prod(in_shape)
        for i, units in enumerate(self.HIDDEN):
            if i:
                layers.append(GaussianNoise(0.5))
            layers += [weight_norm(nn.Linear(fan_in, units)), nn.ReLU()]
            fan_in = units
        self.body = nn.Sequential(*layers)
        self.head = nn.Sequential(GaussianNoise(0.5), weight_norm(nn.Linear(fan_in, num_classes)))

    def features(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class Generator(nn.Module):
    """The improved-GAN MNIST generator (Salimans et al. 2016, §5.1): z ~ U(0, 1)^100, two
    softplus layers of 500 with batch norm, a weight-normalised sigmoid output shaped like the
    images."""

    def __init__(self, out_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.out_shape = tuple(out_shape)
        self.net = nn.Sequential(
            nn.Linear(Z_DIM, 500, bias=False), nn.BatchNorm1d(500), nn.Softplus(),
            nn.Linear(500, 500, bias=False), nn.BatchNorm1d(500), nn.Softplus(),
            weight_norm(nn.Linear(500, math.prod(out_shape))), nn.Sigmoid())

    def forward(self, z: torch.Tensor) -> torch.Tensor:
        return self.net(z).view(-1, *self.out_shape)
