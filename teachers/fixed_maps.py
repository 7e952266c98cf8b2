"""Fixed maps of a teacher's input, and the table of their outputs that spares computing them
again at every step.

A fixed map (histograms of oriented gradients, wavelet scattering, the frozen pool encoder) has
no parameter a teacher learns and draws no random number: its output on a row is the same at
every step, for every teacher. A network whose every path starts with one (``hog``, ``scatter``,
``hog-scatter``) is a head on the maps' outputs, so it can learn from, and vote on, a table of
those outputs computed once per row. For 250 ``hog`` teachers of 240 rows (160 steps of 32
rows each) that is HOG of 60 000 private rows once, instead of 1.28 million times, once per row
drawn (docs/benchmarks.md). The trainer uses the table only where the rows reach the network
as they are: a shift, a mirror or a mixup acts on the pixels, before the map.
"""

from __future__ import annotations

import torch
from torch import nn

# Rows per forward pass when a table is computed: the scattering of 2 048 Fashion-MNIST images
# writes about 0.5 GB of intermediate maps.
TABLE_CHUNK = 2048


class FixedMap(nn.Module):
    """A map of the input with no trained parameter and no random number; subclasses define
    ``forward(x [n, ...]) -> [n, F]``."""


class Columns(nn.Module):
    """Columns ``[start, stop)`` of a table row: what a :class:`FixedMap` gave for that row."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, table: torch.Tensor) -> torch.Tensor:
        return table[..., self.start:self.stop]


def feature_table(maps: list[FixedMap], x: torch.Tensor) -> torch.Tensor:
    """``[n, F1 + F2 + ...]``: the outputs of ``maps`` on every row of ``x`` (at least one),
    side by side in the order the head's :class:`Columns` read them; computed in chunks of
    ``TABLE_CHUNK`` rows, without gradients."""
    with torch.no_grad():
        return torch.cat([torch.cat([m(x[i:i + TABLE_CHUNK]) for m in maps], 1)
                          for i in range(0, len(x), TABLE_CHUNK)])
