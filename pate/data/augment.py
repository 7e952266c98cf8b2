"""Label-preserving image augmentation shared by teachers and students: random translations by
up to ``max_shift`` pixels with zero fill, and horizontal mirroring where the dataset's labels
survive it (clothes do, digits and glyphs do not). One batched gather, no loop over images.

Random shifts plus mirroring are the usual augmentation of the semi-supervised image benchmarks
(e.g. the CIFAR-10 experiments of T. Miyato et al., "Virtual Adversarial Training", TPAMI 2018).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where the functions run: the CLI's parsers import this
    import torch

AUGMENTATIONS = ("none", "shift", "shift-flip")
MAX_SHIFT = 2


def shift_flip(x: torch.Tensor, dy: torch.Tensor, dx: torch.Tensor, flip: torch.Tensor,
               max_shift: int = MAX_SHIFT) -> torch.Tensor:
    """Translate each image of ``x [N, C, H, W]`` by (dy, dx) with zero fill, then mirror those
    with ``flip``; one gather for the whole batch."""
    import torch
    import torch.nn.functional as F

    n, _, h, w = x.shape
    padded = F.pad(x, (max_shift,) * 4)
    rows = torch.arange(h, device=x.device)[None] + max_shift - dy[:, None]
    cols = torch.arange(w, device=x.device)[None].expand(n, w)
    cols = torch.where(flip[:, None], cols.flip(1), cols) + max_shift - dx[:, None]
    idx = torch.arange(n, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[idx, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2)


def random_augment(x: torch.Tensor, kind: str, generator: torch.Generator) -> torch.Tensor:
    """``x`` augmented by ``kind`` (one of :data:`AUGMENTATIONS`): independent uniform shifts in
    [-MAX_SHIFT, MAX_SHIFT] per axis and, for ``shift-flip``, a fair coin for mirroring, drawn on
    the CPU from ``generator`` (so results do not depend on the device)."""
    import torch

    if kind == "none":
        return x
    n = len(x)
    dy, dx = torch.randint(-MAX_SHIFT, MAX_SHIFT + 1, (2, n), generator=generator)
    flip = (torch.rand(n, generator=generator) < 0.5) if kind == "shift-flip" else \
        torch.zeros(n, dtype=torch.bool)
    return shift_flip(x, dy.to(x.device), dx.to(x.device), flip.to(x.device))

