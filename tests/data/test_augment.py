"""pate.data.augment: random shifts and mirroring keep each image's content, draw from the given
generator only, and reach every offset; FitConfig refuses unknown kinds."""

from __future__ import annotations

import pytest
import torch

from pate.data.augment import MAX_SHIFT, random_augment, shift_flip
from student.training import FitConfig


def _images(n: int = 64) -> torch.Tensor:
    """Random images with a zero border of MAX_SHIFT pixels, so no shift can crop content."""
    x = torch.zeros(n, 1, 12, 12)
    x[:, :, MAX_SHIFT:-MAX_SHIFT, MAX_SHIFT:-MAX_SHIFT] = torch.rand(n, 1, 8, 8)
    return x


def test_none_is_the_identity_and_draws_nothing() -> None:
    x, g = _images(), torch.Generator().manual_seed(3)
    state = g.get_state()
    assert random_augment(x, "none", g) is x
    assert torch.equal(g.get_state(), state)


@pytest.mark.parametrize("kind", ["shift", "shift-flip"])
def test_each_output_is_a_shift_or_mirror_of_its_input(kind: str) -> None:
    x = _images()
    out = random_augment(x, kind, torch.Generator().manual_seed(0))
    seen = set()
    for i in range(len(x)):  # test oracle: try every offset (and mirror) per image
        matches = [(dy, dx, f) for dy in range(-MAX_SHIFT, MAX_SHIFT + 1)
                   for dx in range(-MAX_SHIFT, MAX_SHIFT + 1) for f in (False, True)
                   if torch.equal(out[i], shift_flip(x[i:i + 1], torch.tensor([dy]),
                                                     torch.tensor([dx]),
                                                     torch.tensor([f]))[0])]
        assert matches, f"image {i} is no shift of its input"
        seen.update(matches)
    assert any(f for _, _, f in seen) == (kind == "shift-flip")
    assert len({(dy, dx) for dy, dx, _ in seen}) > 10  # the offsets vary


def test_the_same_generator_state_gives_the_same_batch() -> None:
    x = _images()
    a = random_augment(x, "shift-flip", torch.Generator().manual_seed(7))
    b = random_augment(x, "shift-flip", torch.Generator().manual_seed(7))
    c = random_augment(x, "shift-flip", torch.Generator().manual_seed(8))
    assert torch.equal(a, b) and not torch.equal(a, c)


def test_fit_config_refuses_an_unknown_augmentation() -> None:
    with pytest.raises(ValueError, match="augment"):
        FitConfig(augment="rotate")
