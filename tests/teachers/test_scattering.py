"""The scattering map DP-SGD learns on: its size, its per-example normalisation, and that it is
a fixed function of each example (no parameters, no statistic of the batch)."""

from __future__ import annotations

import pytest
import torch

from teachers.scattering import MAPS, Scattering, scattering_size


@pytest.mark.parametrize("in_shape", [(1, 28, 28), (3, 32, 32), (1, 8, 8), (2, 13, 20)])
def test_the_output_has_the_announced_size(in_shape) -> None:
    x = torch.rand(4, *in_shape)
    assert Scattering(in_shape)(x).shape == (4, scattering_size(in_shape))
    assert MAPS == 81


def test_each_group_of_three_maps_is_normalised_by_the_example_itself() -> None:
    torch.manual_seed(0)
    x = torch.rand(5, 1, 28, 28)
    out = Scattering((1, 28, 28))(x).reshape(5, 27, -1)
    assert torch.allclose(out.mean(-1), torch.zeros(5, 27), atol=1e-4)
    assert torch.allclose(out.var(-1, unbiased=False), torch.ones(5, 27), atol=1e-3)


def test_a_row_maps_alike_in_any_batch_and_nothing_is_learnt() -> None:
    """The map costs no privacy only if it is the same function of each example whatever the
    data: a row's features do not depend on the rows beside it."""
    torch.manual_seed(1)
    scatter = Scattering((1, 28, 28))
    x = torch.rand(6, 1, 28, 28)
    alone = scatter(x[:1])
    beside = scatter(torch.cat([x[:1], 10 * x[1:]]))[:1]
    assert torch.allclose(alone, beside, atol=1e-5)
    assert not list(scatter.parameters())
    # and it is not a constant: two images map apart
    assert (scatter(x[1:2]) - alone).abs().max() > 0.1
