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
  the ``cnn`` expert only (``SMOOTHED_EXPERT``): one perturbation shared by the two experts
  stopped being adversarial for the ``cnn`` (its smoothness term fell threefold) and the pair
  did no better than ``cnn``. On Fashion-MNIST, four end-to-end draws averaged 0.817, as
  ``cnn``'s five did (figures in the README).
- ``mlp``: the VAT paper's MNIST network (§4: 784-1200-600-300-150-10, batch norm, ReLU).
- ``wn-mlp``: the improved-GAN discriminator below, as a classifier (the GAN student's network,
  and the architecture of its supervised baseline).
- ``Discriminator`` / ``Generator``: the improved-GAN MNIST networks (Salimans et al., "Improved
  Techniques for Training GANs", NeurIPS 2016, §5.1 and its released code): a K-class
  discriminator of weight-normalised dense layers 1000-500-250-250-250 with Gaussian noise on the
  input (std 0.3) and on every hidden layer (std 0.5); a generator 100-500-500-784 with softplus,
  batch norm and a weight-normalised sigmoid output layer.

``ModelSpec`` names an architecture and its shapes, so that saved weights can be rebuilt.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
from torch import nn
from torch.nn.utils.parametrizations import weight_norm

from student.choices import ARCHITECTURES
from teachers.models import Experts, hog_linear

Z_DIM = 100  # Salimans et al., MNIST generator input
SMOOTHED_EXPERT = {"cnn-hog": 0}  # the expert VAT's smoothness is for, per Experts architecture


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


def build_classifier(spec: ModelSpec) -> nn.Module:
    """The classifier of ``spec``: ``cnn``, ``cnn-hog``, ``mlp`` or ``wn-mlp`` (the GAN's
    discriminator)."""
    if spec.arch == "cnn":
        return conv_small(spec.in_shape, spec.num_classes, spec.width)
    if spec.arch == "cnn-hog":
        return Experts(conv_small(spec.in_shape, spec.num_classes, spec.width),
                       hog_linear(spec.in_shape, spec.num_classes))
    if spec.arch == "mlp":
        return mlp(spec.in_shape, spec.num_classes)
    if spec.arch == "wn-mlp":
        return Discriminator(spec.in_shape, spec.num_classes)
    raise ValueError(f"unknown architecture {spec.arch!r}; choose one of {ARCHITECTURES}")


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
