"""Histograms of oriented gradients as a fixed, parameter-free layer.

N. Dalal, B. Triggs, "Histograms of Oriented Gradients for Human Detection", CVPR 2005: centred
[-1, 0, 1] gradients, each pixel votes its gradient magnitude into unsigned-orientation bins
(linear interpolation between the two nearest bin centres), the votes are averaged over square
cells, and each block of 2x2 cells (blocks overlap, one cell apart) is L2-normalised (their
section 6.4, "L2-norm"); then the square root is taken, the compression of their "L1-sqrt"
variant. Written with broadcasting and convolutions only (no in-place scatter, no random numbers)
so that it runs inside ``torch.func.vmap`` with the teachers' stacked parameters.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from teachers.fixed_maps import FixedMap


def hog_size(in_shape: tuple[int, int, int], cell: int = 4, bins: int = 9) -> int:
    """Length of :func:`hog_features`' output for inputs ``[C, H, W]`` (at least 2 cells a
    side)."""
    _, h, w = in_shape
    return 4 * bins * (h // cell - 1) * (w // cell - 1)


def hog_features(x: torch.Tensor, cell: int = 4, bins: int = 9) -> torch.Tensor:
    """``x [n, C, H, W]`` -> ``[n, F]`` block-normalised HOG of the channel mean, with
    ``F = 4 * bins * (H // cell - 1) * (W // cell - 1)``."""
    g = x.mean(1, keepdim=True)
    gx = F.pad(g[..., :, 2:] - g[..., :, :-2], (1, 1))
    gy = F.pad(g[..., 2:, :] - g[..., :-2, :], (0, 0, 1, 1))
    mag = torch.sqrt(gx * gx + gy * gy + 1e-12)
    pos = torch.remainder(torch.atan2(gy, gx), math.pi) * (bins / math.pi)  # in [0, bins)
    centres = torch.arange(bins, dtype=x.dtype, device=x.device).reshape(1, bins, 1, 1)
    dist = torch.remainder(pos - centres + bins / 2, bins) - bins / 2
    hist = mag * torch.relu(1 - dist.abs())  # [n, bins, H, W]
    cells = F.avg_pool2d(hist, cell)
    blocks = F.unfold(cells, 2)  # [n, bins*4, positions]
    blocks = blocks / torch.sqrt((blocks * blocks).sum(1, keepdim=True) + 1e-4)
    return torch.sqrt(blocks).flatten(1)


class HOG(FixedMap):
    """:func:`hog_features` as a module (no parameters)."""

    def __init__(self, cell: int = 4, bins: int = 9) -> None:
        super().__init__()
        self.cell, self.bins = cell, bins

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return hog_features(x, self.cell, self.bins)
