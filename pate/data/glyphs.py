"""``glyphs``: a synthetic stand-in for PATE 2018's private Glyph task (§5.1: ~150 classes of
Unicode symbols, uncurated, imbalanced and noisily labelled).

Grayscale 28x28 images of ~150 symbols (digits, letters, punctuation, Latin-1, math, currency and
Greek signs) rendered with Pillow from the fonts installed on the machine, with random scale,
rotation, shift, stroke weight, blur and noise. Classes are imbalanced (Zipf-like: the most
frequent is 12x the rarest, the three most frequent each about 7x or more) and about 10% of the
training labels are wrong; for a class with a near-ambiguous partner (comma/apostrophe, O/0,
l/1, ...) half of its wrong labels are that partner, the rest are uniform. Font families are
split: a held-out fifth renders the test split (the student's public pool and the evaluation
set), whose labels are clean.

Every example is a pure function of (seed, split, index), so any slice can be rendered on the fly,
in parallel, in any order, and millions of examples need no disk.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from numpy.typing import NDArray
from PIL import Image, ImageDraw, ImageFilter, ImageFont

from pate.data.dataset import Dataset
from pate.errors import UserError

FONT_DIRS = (Path("/usr/share/fonts"), Path("/usr/local/share/fonts"),
             Path("/usr/share/texmf/fonts/opentype"))
FONT_PACKAGES = ("fonts-dejavu-core fonts-liberation2 fonts-freefont-ttf fonts-urw-base35 "
                 "fonts-texgyre fonts-croscore")

CANDIDATES = (
    "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"
    "¡¢£¤¥¦§©ª«¬®°±²³µ¶·¹º»¼½¾¿×÷"
    "−≠≤≥∞∑√∫≈π∂∆∏∈∩∪∀∃→←↑↓↔"
    "€₹₽₩₺₱₦₪₫₴"
    "αβγδεθλσφωΩΣΦΨΓΛ"
)
CONFUSABLE = [(",", "'"), (".", "·"), ("-", "−"), ("O", "0"), ("l", "1"), ("I", "|"),
              ("o", "°"), ("x", "×"), ("S", "5"), ("B", "8"), ("Z", "2"), ("`", "'"),
              (":", ";"), ("u", "µ"), ("C", "("), ("v", "ν"), ("e", "€"), ("t", "+")]
NUM_CLASSES = 150
NOISE_RATE = 0.10
IMBALANCE = 12.0         # frequency of the most common class / the rarest
CANVAS = 64
SIZE = 28


@dataclass(frozen=True)
class GlyphSpec:
    """The task: which symbols, which fonts may draw each in each split, the class prior and the
    confusable partner of each class (-1 for none)."""

    symbols: tuple[str, ...]
    train_fonts: tuple[tuple[str, ...], ...]    # per class
    heldout_fonts: tuple[tuple[str, ...], ...]  # per class
    class_prior: tuple[float, ...]
    partner: tuple[int, ...]
    seed: int


def discover_fonts(dirs: tuple[Path, ...] = FONT_DIRS) -> list[Path]:
    return sorted(p for d in dirs if d.is_dir() for p in d.rglob("*")
                  if p.suffix.lower() in (".ttf", ".otf"))


_STYLE = re.compile(r"(regular|book|roman|bold|italic|oblique|light|medium|semibold|condensed"
                    r"|narrow)+$")


def _family(path: Path) -> str:
    """Font family of a font file: its name before any style (DejaVuSans-Bold, FreeMonoBold,
    texgyreheros-italic -> dejavusans, freemono, texgyreheros), so that no family is split."""
    stem = path.stem.split("-")[0].split("_")[0].lower()
    return _STYLE.sub("", stem) or stem


@functools.cache
def _coverage(path: str) -> frozenset[int]:
    from fontTools.ttLib import TTFont

    try:
        with TTFont(path, lazy=True, fontNumber=0) as font:
            return frozenset((font.getBestCmap() or {}).keys())
    except Exception:  # an unreadable font file is no font at all
        return frozenset()


def is_heldout(family: str) -> bool:
    """A fixed fifth of font families, by a hash of the family name."""
    return hashlib.sha256(family.encode()).digest()[0] % 5 == 0


@functools.cache
def build_spec(seed: int = 0, num_classes: int = NUM_CLASSES,
               font_dirs: tuple[Path, ...] = FONT_DIRS) -> GlyphSpec:
    """Choose the symbols that enough fonts of both splits can draw; fail clearly otherwise."""
    fonts = [p for p in discover_fonts(font_dirs) if _coverage(str(p))]
    train = [p for p in fonts if not is_heldout(_family(p))]
    heldout = [p for p in fonts if is_heldout(_family(p))]
    families = {_family(p) for p in fonts}
    if len({_family(p) for p in heldout}) < 2 or len({_family(p) for p in train}) < 6:
        raise UserError(f"glyphs needs more fonts: found {len(fonts)} files in "
                        f"{len(families)} families; install {FONT_PACKAGES}")
    chosen, per_train, per_heldout = [], [], []
    for ch in CANDIDATES:
        t = tuple(str(p) for p in train if ord(ch) in _coverage(str(p)))
        h = tuple(str(p) for p in heldout if ord(ch) in _coverage(str(p)))
        if len(t) >= 3 and len(h) >= 1:
            chosen.append(ch)
            per_train.append(t)
            per_heldout.append(h)
        if len(chosen) == num_classes:
            break
    if len(chosen) < num_classes:
        raise UserError(f"glyphs needs {num_classes} symbols drawable by the installed fonts, "
                        f"found {len(chosen)}; install {FONT_PACKAGES}")
    rng = np.random.default_rng([seed, 7])
    ranks = rng.permutation(num_classes)
    prior = (ranks + 1.0) ** -(np.log(IMBALANCE) / np.log(num_classes))
    prior /= prior.sum()
    index = {ch: i for i, ch in enumerate(chosen)}
    partner = [-1] * num_classes
    for a, b in CONFUSABLE:
        if a in index and b in index:
            partner[index[a]], partner[index[b]] = index[b], index[a]
    return GlyphSpec(tuple(chosen), tuple(per_train), tuple(per_heldout), tuple(prior.tolist()),
                     tuple(partner), seed)


@functools.cache
def _font(path: str, size: int) -> ImageFont.FreeTypeFont:
    return ImageFont.truetype(path, size)


_SPLITS = {"train": 0, "test": 1}


def _render_one(spec: GlyphSpec, split: str, index: int) -> tuple[NDArray[np.float32], int, int]:
    """(image [28, 28] in [0, 1], label, true class) of example ``index`` of ``split``."""
    rng = np.random.default_rng([spec.seed, _SPLITS[split], index])
    cls = int(rng.choice(len(spec.symbols), p=spec.class_prior))
    fonts = spec.train_fonts[cls] if split == "train" else spec.heldout_fonts[cls]
    font = _font(fonts[int(rng.integers(len(fonts)))], int(CANVAS * rng.uniform(0.5, 0.85)))
    canvas = Image.new("L", (CANVAS, CANVAS), 0)
    shift = rng.uniform(-0.09, 0.09, 2) * CANVAS
    ImageDraw.Draw(canvas).text((CANVAS / 2 + shift[0], CANVAS / 2 + shift[1]),
                                spec.symbols[cls], fill=255, font=font, anchor="mm",
                                stroke_width=int(rng.integers(0, 3)), stroke_fill=255)
    canvas = canvas.rotate(float(rng.uniform(-15, 15)), resample=Image.BILINEAR)
    canvas = canvas.resize((SIZE, SIZE), Image.LANCZOS)
    canvas = canvas.filter(ImageFilter.GaussianBlur(float(rng.uniform(0.0, 0.8))))
    image = np.asarray(canvas, np.float32) / 255.0
    image = np.clip(image + rng.normal(0.0, rng.uniform(0.0, 0.08), image.shape), 0.0, 1.0)
    label = cls
    if split == "train" and rng.random() < NOISE_RATE:
        if spec.partner[cls] >= 0 and rng.random() < 0.5:
            label = spec.partner[cls]
        else:
            label = int((cls + rng.integers(1, len(spec.symbols))) % len(spec.symbols))
    return image.astype(np.float32), label, cls


def _render_range(args: tuple[GlyphSpec, str, int, int]) -> tuple[NDArray, NDArray, NDArray]:
    spec, split, start, stop = args
    out = [_render_one(spec, split, i) for i in range(start, stop)]
    return (np.stack([o[0] for o in out])[:, None], np.array([o[1] for o in out], np.int64),
            np.array([o[2] for o in out], np.int64))


def render(split: str, start: int, count: int, seed: int = 0, workers: int | None = None
           ) -> tuple[NDArray[np.float32], NDArray[np.int64], NDArray[np.int64]]:
    """Examples start..start+count-1 of ``split``: images [n, 1, 28, 28], labels (noisy in train),
    true classes. The same index always gives the same example, whatever the chunking."""
    if split not in _SPLITS:
        raise ValueError(f"split must be one of {tuple(_SPLITS)}")
    spec = build_spec(seed)
    workers = workers or os.cpu_count() or 1
    chunk = max(256, -(-count // (4 * workers)))
    jobs = [(spec, split, s, min(s + chunk, start + count))
            for s in range(start, start + count, chunk)]
    if workers == 1 or len(jobs) == 1:
        parts = [_render_range(j) for j in jobs]
    else:
        with ProcessPoolExecutor(workers, mp_context=get_context("fork")) as pool:
            parts = list(pool.map(_render_range, jobs))
    return (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]),
            np.concatenate([p[2] for p in parts]))


def dataset_sizes() -> tuple[int, int]:
    """(train, test) sizes of the ``glyphs`` dataset: ``PATE_GLYPHS_SIZE=TRAIN,TEST`` or
    120 000 and 20 000."""
    raw = os.environ.get("PATE_GLYPHS_SIZE", "120000,20000")
    try:
        train, test = (int(x) for x in raw.split(","))
    except ValueError:
        raise UserError(f"PATE_GLYPHS_SIZE must be TRAIN,TEST (two integers), got {raw!r}") \
            from None
    if train < 1 or test < 2:
        raise UserError("PATE_GLYPHS_SIZE must be positive")
    return train, test


def load_glyphs(need_train: bool = True, seed: int = 0) -> Dataset:
    """The ``glyphs`` dataset at ``dataset_sizes()``: the training split from the training fonts
    (noisy labels), the test split from the held-out fonts (clean labels)."""
    train_size, test_size = dataset_sizes()
    train_x = train_y = None
    if need_train:
        train_x, train_y, _ = render("train", 0, train_size, seed)
    test_x, _, test_y = render("test", 0, test_size, seed)
    symbols = build_spec(seed).symbols
    return Dataset("glyphs", train_x, train_y, test_x, test_y, len(symbols), class_names=symbols)
