"""Fixed maps of a teacher's input, and the table of their outputs that spares computing them
again at every step.

A fixed map (histograms of oriented gradients, wavelet scattering, the frozen pool encoder) has
no parameter a teacher learns, draws no random number, and maps each row by itself (no statistic
of the batch): its output on a row is the same at every step, for every teacher, whatever rows
share its batch. A network whose every path starts with one (``hog``, ``scatter``,
``hog-scatter``, ``hog-scatter-whitened``) is a head on the maps' outputs. Where its rows reach
it as they are, it can learn from, and vote on, a table of those outputs computed once per row:
for 250 ``hog`` teachers of 240 rows (160 steps of 32 rows each) that is HOG of 60 000 private
rows once, instead of 1.28 million times, once per row drawn (docs/benchmarks.md). Where a
shift, a mirror or a mixup changes the pixels first, the maps run on each batch's changed rows,
outside ``torch.func.vmap`` (Kymatio's scattering writes in place and cannot run inside it), and
only the head is mapped over the teachers.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from pate.data.files import available_memory

# Input floats per forward pass of the maps while a table is computed: 2 048 Fashion-MNIST
# images, whose scattering writes about 0.35 GB of intermediate maps; fewer rows of larger images.
TABLE_FLOATS = 2048 * 784


class FixedMap(nn.Module):
    """A map of the input with no trained parameter, no random number, and each output row a
    function of its own input row alone; subclasses define ``forward(x [n, ...]) -> [n, F]``."""


class Pixels(FixedMap):
    """The input itself, each row flattened: the map that lets a path that reads the input (a
    student's convolutions) take its rows from the same table as the maps beside it."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.flatten(1)


class Columns(nn.Module):
    """Columns ``[start, stop)`` of a table row: what a :class:`FixedMap` gave for that row."""

    def __init__(self, start: int, stop: int) -> None:
        super().__init__()
        self.start, self.stop = start, stop

    def forward(self, table: torch.Tensor) -> torch.Tensor:
        return table[..., self.start:self.stop]


def table_width(head: nn.Module) -> int:
    """The width of the table ``head``'s :class:`Columns` read: as far as the last reaches."""
    return max(m.stop for m in head.modules() if isinstance(m, Columns))


def table_fits(rows: int, width: int, device: torch.device, share: float = 1.0) -> bool:
    """Whether a float32 table of ``rows`` x ``width`` takes at most a quarter of this
    process's ``share`` of the memory left on ``device`` (a GPU's free memory; else the
    machine's, ``files.available_memory``; True where unknown): a table of large images'
    scattering may not, and then the maps run on each batch instead. ``share``: the part of the
    device this process holds, under 1 where others share it and check at the same time (a Ray
    task's CPUs over its node's, ``teachers.distributed.device_share``)."""
    room = (torch.cuda.mem_get_info(device)[0] if device.type == "cuda"
            else available_memory())
    return room is None or rows * width * 4 <= room * share / 4


def table_rows(row_shape: torch.Size | tuple[int, ...]) -> int:
    """Rows per forward pass of the maps for inputs of ``row_shape``: ``TABLE_FLOATS`` floats."""
    return max(1, TABLE_FLOATS // max(1, int(torch.Size(row_shape).numel())))


def feature_table(maps: Sequence[nn.Module], x: torch.Tensor) -> torch.Tensor:
    """``[n, F1 + F2 + ...]``: the outputs of ``maps`` on every row of ``x`` (at least one),
    side by side in the order the head's :class:`Columns` read them; computed without
    gradients, :func:`table_rows` rows at a time, into one preallocated table."""
    rows = table_rows(x.shape[1:])
    table: torch.Tensor | None = None
    with torch.no_grad():
        for i in range(0, len(x), rows):
            part = torch.cat([m(x[i:i + rows]) for m in maps], 1)
            if table is None:
                table = part.new_empty((len(x), part.shape[1]))
            table[i:i + len(part)] = part
    assert table is not None, "feature_table needs at least one row"
    return table
