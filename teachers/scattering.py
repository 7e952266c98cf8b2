"""Wavelet scattering features: a fixed, parameter-free map of an image, for DP-SGD and the
``scatter`` teachers.

The scattering transform (S. Mallat, "Group Invariant Scattering", Comm. Pure Appl. Math. 2012;
J. Bruna, S. Mallat, "Invariant Scattering Convolution Networks", IEEE TPAMI 2013, §2-3) cascades
Morlet wavelet convolutions and complex moduli, then averages with a low-pass filter and
subsamples by 2^J. At J = 2 scales, L = 8 orientations and order 2 it gives, per channel,
1 + J L + L² J (J - 1) / 2 = 81 maps of size ⌊H / 4⌋ x ⌊W / 4⌋: 3 969 numbers for a
28x28 image. It is computed by Kymatio (M. Andreux et al., "Kymatio: Scattering Transforms in
Python", JMLR 21, 2020).

F. Tramèr, D. Boneh ("Differentially Private Learning Needs Better Features (or Much More
Data)", ICLR 2021, §3) train a linear model on these features with DP-SGD and find it better than
any end-to-end CNN at small epsilon. They normalise the maps, among other options, by group
normalisation without a learnt scale (Y. Wu, K. He, ECCV 2018): each example's own mean and
deviation over a group of maps. That is the normalisation here (27 groups a channel, three maps
each), so the map uses no statistic of any data and costs no privacy. On Fashion-MNIST at the
main job's sanitised epsilon 2.37 it gave DP-SGD 0.888 to 0.893 where HOG gave 0.879
(docs/reproductions.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

# The 2-D torch frontend, imported alone: ``kymatio.torch`` also loads the 3-D transform, whose
# filter bank imports ``scipy.special.sph_harm``, which SciPy 1.17 removed.
from kymatio.scattering2d.frontend.torch_frontend import ScatteringTorch2D

from teachers.fixed_maps import FixedMap

SCALES = 2
ORIENTATIONS = 8
MAPS = 1 + SCALES * ORIENTATIONS + ORIENTATIONS ** 2 * SCALES * (SCALES - 1) // 2  # 81
GROUP_MAPS = 3


class Scattering(FixedMap):
    """``x [n, C, H, W]`` -> ``[n, C * 81 * (H // 4) * (W // 4)]``: order-2 scattering
    (J = 2, L = 8) of each channel, each group of 3 maps normalised by the example's own mean and
    standard deviation. The wavelet filters are fixed buffers; nothing is learnt."""

    def __init__(self, in_shape: tuple[int, int, int]) -> None:
        super().__init__()
        self.channels = in_shape[0]
        self.transform = ScatteringTorch2D(J=SCALES, shape=tuple(in_shape[1:]), L=ORIENTATIONS)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        maps = self.transform(x.contiguous())  # [n, C, 81, h, w]
        maps = maps.flatten(1, 2)
        # a tiny eps: a group of order-2 maps of a [0, 1] image has a variance of about 1e-5,
        # which GroupNorm's default eps (1e-5, added to the variance) would halve
        return F.group_norm(maps, self.channels * MAPS // GROUP_MAPS, eps=1e-10).flatten(1)


def scattering_size(in_shape: tuple[int, int, int]) -> int:
    """Length of :class:`Scattering`'s output for inputs ``[C, H, W]``."""
    c, h, w = in_shape
    side = 2 ** SCALES
    return c * MAPS * (h // side) * (w // side)
