"""The synthetic Glyph task: determinism, imbalance, label noise and the font split."""

from pathlib import Path

import numpy as np
import pytest

from pate.data.datasets import load_dataset
from pate.data.glyphs import IMBALANCE, _family, build_spec, is_heldout, render
from pate.errors import UserError


def test_same_index_same_example_whatever_the_chunking() -> None:
    x1, y1, c1 = render("train", 100, 300, workers=1)
    x2, y2, c2 = render("train", 0, 600, workers=2)
    np.testing.assert_array_equal(x1, x2[100:400])
    np.testing.assert_array_equal(y1, y2[100:400])
    np.testing.assert_array_equal(c1, c2[100:400])
    x3, _, _ = render("train", 100, 300, seed=1, workers=1)
    assert not np.array_equal(x1, x3)
    assert x1.shape == (300, 1, 28, 28) and x1.dtype == np.float32
    assert x1.min() >= 0.0 and x1.max() <= 1.0 and x1.std() > 0.1


def test_imbalance_and_label_noise() -> None:
    spec = build_spec()
    prior = np.array(spec.class_prior)
    assert len(spec.symbols) == 150 and prior.max() / prior.min() == pytest.approx(IMBALANCE)
    _, labels, classes = render("train", 0, 6000)
    counts = np.bincount(classes, minlength=150)
    frequent, rare = np.argsort(prior)[-3:], np.argsort(prior)[:15]
    assert counts[frequent].min() >= 5 * counts[rare].mean()
    noise = np.mean(labels != classes)
    assert 0.08 <= noise <= 0.12
    partner = np.array(spec.partner)
    wrong = labels != classes
    has_partner = wrong & (partner[classes] >= 0)
    swapped = has_partner & (partner[classes] == labels)
    assert 0.35 <= swapped.sum() / has_partner.sum() <= 0.65  # e.g. comma <-> apostrophe
    comma, apostrophe = spec.symbols.index(","), spec.symbols.index("'")
    assert spec.partner[comma] == apostrophe
    _, test_labels, test_classes = render("test", 0, 1000)
    np.testing.assert_array_equal(test_labels, test_classes)  # evaluation labels are clean


def test_fonts_are_split_by_family() -> None:
    spec = build_spec()
    train = {_family(Path(p)) for fonts in spec.train_fonts for p in fonts}
    heldout = {_family(Path(p)) for fonts in spec.heldout_fonts for p in fonts}
    assert train and heldout and not train & heldout
    assert all(is_heldout(f) for f in heldout) and not any(is_heldout(f) for f in train)


def test_too_few_fonts_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(UserError, match="install fonts-dejavu-core"):
        build_spec(font_dirs=(tmp_path,))


def test_registered_as_a_dataset(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATE_GLYPHS_SIZE", "300,200")
    ds = load_dataset("glyphs")
    assert ds.train_x.shape == (300, 1, 28, 28) and ds.test_x.shape == (200, 1, 28, 28)
    assert ds.num_classes == 150 and ds.test_y.max() < 150
    only_test = load_dataset("glyphs", need_train=False)
    assert only_test.train_x is None
    np.testing.assert_array_equal(only_test.test_x, ds.test_x)
