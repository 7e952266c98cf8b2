"""A convolutional encoder learnt from the public pool alone, frozen and shared by every teacher.

SimCLR (T. Chen, S. Kornblith, M. Norouzi, G. Hinton, "A Simple Framework for Contrastive Learning
of Visual Representations", ICML 2020): each pool image gives two random views (a random resized
crop, a mirror, contrast and brightness jitter and, on half the views, a cut-out square: their
section 3 and appendix A, sized for small grey images); an encoder f and a projection head g (an
MLP) map each view to a point on the unit sphere; the NT-Xent loss (their eq. 1) at temperature tau
pulls the two views of an image together against the other 2N - 2 views of the batch. The head is
then dropped (their section 4.2). The frozen encoder folds its batch normalisation into its
convolutions (in eval mode normalisation is an affine map) and standardises its output with the
pool's mean and standard deviation, so a teacher's linear expert on it trains like the HOG one.

Privacy: the encoder reads the public pool only (:func:`pate.data.datasets.public_split`), never the
private training split, so it costs no privacy: PATE's teachers may learn from public data
(Papernot et al., ICLR 2018, section 4), and the student sees the same pool anyway.
Measured on Fashion-MNIST (60 epochs on the 5 000 pool rows, 675 s on 2 cores, 13 s on an H200):
for 25 teachers of 240 examples a linear softmax on these features alone reaches a mean accuracy
of 0.779 and a pool plurality of 0.848, as high as ``cnn-pool-hog``'s two experts together (0.802
and 0.848); as the third expert of ``cnn-pool-hog-simclr`` all 250 teachers reach 0.814 and
0.864, against 0.803 and 0.850 without it. 300 and 1 000 epochs (on the H200) gave 0.817 and
0.867 and 0.818 and 0.862: not worth the CPU's hours.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from teachers.fixed_maps import FixedMap

EPOCHS = 60
WIDTH = 32
FEATURES = 16 * WIDTH  # 4 * WIDTH channels, average-pooled to 2x2
BATCH_SIZE = 256
TEMPERATURE = 0.2
LR = 2e-3
PROJECTION = 64


def _convs(channels: int) -> list[tuple[int, int]]:
    """(in, out) channels of the encoder's three 3x3 convolutions."""
    return [(channels, WIDTH), (WIDTH, 2 * WIDTH), (2 * WIDTH, 4 * WIDTH)]


def trainable_encoder(channels: int) -> nn.Sequential:
    """f for SimCLR training: three conv-BN-ReLU stages (2x2 max-pooling after the first two),
    average-pooled to 2x2 and flattened to ``FEATURES``."""
    layers: list[nn.Module] = []
    for i, (cin, cout) in enumerate(_convs(channels)):
        layers += [nn.Conv2d(cin, cout, 3, padding=1), nn.BatchNorm2d(cout), nn.ReLU()]
        if i < 2:
            layers.append(nn.MaxPool2d(2))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(2), nn.Flatten())


def simclr_views(x: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """One random view of every image of ``x [n, C, H, W]`` (values in [0, 1]): a crop of
    55-100 % of the area with aspect ratio in [3/4, 4/3] resized back, mirrored with probability
    1/2, contrast scaled by U(0.6, 1.4) about the image mean and brightness shifted by
    U(-0.2, 0.2), and on half the views a square of side ~H/3 set to 0. The random draws come
    from ``generator`` (a CPU one) whatever device ``x`` is on, so a seed gives the same views
    on every device."""
    n, _, h, w = x.shape

    def uniform(lo: float, hi: float) -> torch.Tensor:
        return torch.empty(n).uniform_(lo, hi, generator=generator)

    area, ratio = uniform(0.55, 1.0), torch.exp(uniform(math.log(3 / 4), math.log(4 / 3)))
    sx, sy = (area * ratio).sqrt().clamp(max=1), (area / ratio).sqrt().clamp(max=1)
    theta = torch.zeros(n, 2, 3)
    theta[:, 0, 0] = sx * torch.where(uniform(0, 1) < 0.5, -1.0, 1.0)
    theta[:, 0, 2] = uniform(-1, 1) * (1 - sx)
    theta[:, 1, 1] = sy
    theta[:, 1, 2] = uniform(-1, 1) * (1 - sy)
    grid = F.affine_grid(theta.to(x.device), list(x.shape), align_corners=False)
    v = F.grid_sample(x, grid, align_corners=False)
    mean = v.mean((1, 2, 3), keepdim=True)
    contrast, brightness = uniform(0.6, 1.4), uniform(-0.2, 0.2)
    v = ((v - mean) * contrast.to(x.device).view(n, 1, 1, 1) + mean
         + brightness.to(x.device).view(n, 1, 1, 1)).clamp(0, 1)
    half = h // 6 + 1
    cy = torch.randint(0, h, (n, 1, 1), generator=generator)
    cx = torch.randint(0, w, (n, 1, 1), generator=generator)
    square = (((torch.arange(h).view(1, h, 1) - cy).abs() < half)
              & ((torch.arange(w).view(1, 1, w) - cx).abs() < half)
              & (uniform(0, 1) < 0.5).view(n, 1, 1))
    return v.masked_fill(square[:, None].to(x.device), 0.0)


def nt_xent(z: torch.Tensor, tau: float) -> torch.Tensor:
    """NT-Xent (Chen et al. 2020, eq. 1), averaged over all 2N views: ``z [2N, d]`` are the
    projections of N images' first views followed by their second views; with s the cosine
    similarity, l(i, j) = -log(exp(s(z_i, z_j) / tau) / sum_{k != i} exp(s(z_i, z_k) / tau))
    for each positive pair (i, j)."""
    z = F.normalize(z, dim=1)
    n = z.shape[0] // 2
    sim = (z @ z.T / tau).fill_diagonal_(float("-inf"))
    positive = torch.cat([torch.arange(n, 2 * n), torch.arange(n)]).to(z.device)
    return F.cross_entropy(sim, positive)


def _fold(conv: nn.Conv2d, bn: nn.BatchNorm2d) -> tuple[torch.Tensor, torch.Tensor]:
    """Weight and bias of the convolution equal to ``bn(conv(x))`` in eval mode:
    s = gamma / sqrt(var + eps), W' = s W, b' = s (b - mean) + beta."""
    s = bn.weight / torch.sqrt(bn.running_var + bn.eps)
    return conv.weight * s.view(-1, 1, 1, 1), s * (conv.bias - bn.running_mean) + bn.bias


def train_pool_encoder(pool_x: np.ndarray, epochs: int, seed: int, device: str = "cpu"
                       ) -> dict[str, np.ndarray]:
    """SimCLR on the public pool ``pool_x [n, C, H, W]``, on the torch ``device``; returns the
    frozen encoder's tensors (folded convolutions, the pool's feature mean and standard
    deviation) for :class:`FrozenEncoder`, as CPU arrays."""
    with torch.random.fork_rng(devices=[]):  # seed the initialisation, leave the caller's RNG
        torch.manual_seed(seed)
        f = trainable_encoder(pool_x.shape[1])
        g = nn.Sequential(nn.Linear(FEATURES, 256), nn.BatchNorm1d(256), nn.ReLU(),
                          nn.Linear(256, PROJECTION))
    f, g = f.to(device), g.to(device)
    generator = torch.Generator().manual_seed(seed)
    x = torch.as_tensor(pool_x, dtype=torch.float32, device=device)
    batch = min(BATCH_SIZE, len(x))
    per_epoch = len(x) // batch
    steps = max(1, epochs * per_epoch)
    params = [*f.parameters(), *g.parameters()]
    opt = torch.optim.AdamW(params, lr=LR, weight_decay=1e-4)
    # One cycle (Smith and Topin 2019), warming up over 5 % of the steps. Its phases need
    # whole steps, so a tiny run (tests) follows the start of a 41-step cycle.
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=max(steps, 41),
                                                pct_start=0.05)
    for step in range(steps):
        if step % per_epoch == 0:
            order = torch.randperm(len(x), generator=generator).to(device)
        xb = x[order[(step % per_epoch) * batch:(step % per_epoch + 1) * batch]]
        loss = nt_xent(g(f(torch.cat([simclr_views(xb, generator),
                                       simclr_views(xb, generator)]))), TEMPERATURE)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    f.eval()
    convs = [m for m in f if isinstance(m, nn.Conv2d)]
    norms = [m for m in f if isinstance(m, nn.BatchNorm2d)]
    out: dict[str, np.ndarray] = {}
    with torch.no_grad():
        for i, (conv, bn) in enumerate(zip(convs, norms, strict=True)):
            weight, bias = _fold(conv, bn)
            out[f"conv{i}.weight"] = weight.cpu().numpy()
            out[f"conv{i}.bias"] = bias.cpu().numpy()
        feats = torch.cat([f(x[i:i + 1024]) for i in range(0, len(x), 1024)])
    out["mean"] = feats.mean(0).cpu().numpy()
    out["std"] = (feats.std(0) + 1e-3).cpu().numpy()
    return out


def encoder_shapes(channels: int) -> dict[str, tuple[int, ...]]:
    """The name and shape of every tensor :func:`train_pool_encoder` returns for images of
    ``channels`` channels."""
    shapes: dict[str, tuple[int, ...]] = {}
    for i, (cin, cout) in enumerate(_convs(channels)):
        shapes[f"conv{i}.weight"], shapes[f"conv{i}.bias"] = (cout, cin, 3, 3), (cout,)
    return {**shapes, "mean": (FEATURES,), "std": (FEATURES,)}


def check_encoder(tensors: Mapping[str, np.ndarray | torch.Tensor], channels: int) -> None:
    """ValueError unless ``tensors`` are a frozen encoder for images of ``channels`` channels:
    the names and shapes of :func:`encoder_shapes`, finite values."""
    if {k: tuple(v.shape) for k, v in tensors.items()} != encoder_shapes(channels):
        raise ValueError(f"not a pool encoder for {channels}-channel images")
    if not all(torch.isfinite(torch.as_tensor(v)).all() for v in tensors.values()):
        raise ValueError("the pool encoder holds values that are not finite")


def load_encoder_file(path: Path, channels: int) -> dict[str, np.ndarray]:
    """The frozen encoder in the safetensors file ``path`` (as ``pate teachers train`` writes
    it, RUN/teachers/pool-encoder.safetensors); OSError if it cannot be read, ValueError if it is
    no encoder for ``channels``-channel images."""
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    if Path(path).is_dir():  # safetensors says "No such device (os error 19)"
        raise ValueError("a folder, not a safetensors file")
    try:
        tensors = load_file(str(path))
    except (SafetensorError, TypeError) as exc:  # the library's words on what it read
        raise ValueError(f"not a safetensors file of numeric tensors "
                         f"({exc.__class__.__name__})") from None
    check_encoder(tensors, channels)
    return tensors


class FrozenEncoder(FixedMap):
    """The trained encoder as a fixed function: its tensors are buffers, not parameters, so the
    teachers share one copy (it is never stacked per teacher nor trained), and ``vmap`` over
    the teachers evaluates it once per batch when the rows are the same for all (voting)."""

    def __init__(self, tensors: Mapping[str, np.ndarray | torch.Tensor]) -> None:
        super().__init__()
        for name, value in tensors.items():
            self.register_buffer(name.replace(".", "_"),
                                 torch.as_tensor(value, dtype=torch.float32))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for i in range(3):
            h = torch.relu(F.conv2d(h, getattr(self, f"conv{i}_weight"),
                                    getattr(self, f"conv{i}_bias"), padding=1))
            if i < 2:
                h = F.max_pool2d(h, 2)
        h = F.adaptive_avg_pool2d(h, 2).flatten(1)
        return (h - self.mean) / self.std
