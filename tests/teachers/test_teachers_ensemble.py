"""teachers.ensemble: a vectorised group equals its teachers trained one by one, training is
deterministic, and a teacher reads nothing outside its own partition."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import functional_call

from pate.data.augment import shift_flip
from pate.data.datasets import public_split
from teachers import rng
from teachers.ensemble import (
    TrainConfig,
    example_order,
    train_group,
    train_one,
)
from teachers.models import build_model, fit_pool_encoder, init_stacked
from teachers.partition import make_partition
from teachers.votes import Ensemble

CFG = TrainConfig(model="cnn", epochs=4, batch_size=8, lr=3e-3, augment="shift-flip", mixup=0.4,
                  seed=5)


@pytest.fixture(scope="module")
def data(digits):
    part = make_partition(len(digits.train_y), 24, CFG.seed)
    return (torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y), part,
            int(part.sizes.min()))


@pytest.fixture(scope="module")
def pool_encoders(digits):
    """Each kind of pool encoder, by the model that reads it (SimCLR for 2 epochs)."""
    (pool_x, _), _ = public_split(digits)
    return {name: {k: torch.as_tensor(v) for k, v in fit_pool_encoder(name, pool_x, 0,
                                                                        epochs=2).items()}
            for name in ("cnn-pool-hog-simclr", "hog-scatter-whitened")}


def _group(cfg, data, ids, encoder=None):
    x, y, part, min_size = data
    return train_group(cfg, x, y, 10, np.array(ids), part.parts(ids), min_size, encoder)


# hog, scatter, hog-scatter, hog-scatter-whitened: networks on fixed maps alone. With shifts and
# mixup (CFG) the group maps each step's rows outside vmap; with the rows as they are ("table")
# it maps each row once before training (teachers.fixed_maps). The teacher alone always maps its
# pixels.
@pytest.mark.parametrize("model", ["cnn", "cnn-pool", "resnet", "mlp", "cnn-pool-hog",
                                   "cnn-pool-hog-simclr", "hog", "scatter", "hog-scatter",
                                   "hog-scatter-whitened", "hog table", "scatter table",
                                   "hog-scatter table", "hog-scatter-whitened table"])
def test_vectorised_group_equals_one_by_one(digits, data, pool_encoders, model):
    model, _, table = model.partition(" ")
    scattering = "scatter" in model  # kymatio's transform: tens of ms a batch, the test's cost
    epochs = 1 if model == "resnet" else 2 if scattering else 4
    cfg = TrainConfig(**{**CFG.__dict__, "model": model, "epochs": epochs,
                         **({"augment": "none", "mixup": 0.0} if table else {})})
    x, y, part, min_size = data
    encoder = pool_encoders.get(model)
    ids = [0, 1] if scattering else [0, 1, 2, 3]
    group = _group(cfg, data, ids, encoder)
    ens = Ensemble(model, (1, 8, 8), 10, [group], encoder=encoder)
    on_maps = model in ("hog", "scatter", "hog-scatter", "hog-scatter-whitened")
    assert (ens.inputs(x[:200]).dim() == 2) == on_maps  # a table row, or the image
    logits = ens._forward(group, ens.inputs(x[:200]))
    for k, t in enumerate(ids):
        alone = train_one(cfg, x, y, 10, t, part.parts([t])[0], min_size, encoder).eval()
        with torch.no_grad():
            ref = alone(x[:200])
        if model == "resnet":  # Adam amplifies float noise in near-zero GroupNorm gradients
            torch.testing.assert_close(logits[k], ref, rtol=0.0, atol=0.1)
            assert (logits[k].argmax(1) == ref.argmax(1)).float().mean() >= 0.98
            continue
        torch.testing.assert_close(logits[k], ref, rtol=1e-3, atol=1e-3)
        for name, p in alone.named_parameters():
            torch.testing.assert_close(group[name][k], p.detach(), rtol=1e-4, atol=1e-5)
            assert not torch.equal(p, init_stacked(alone, np.array([t]), 5)[name][0])


@pytest.mark.parametrize("short", ["memory", "share"])
def test_a_table_that_would_not_fit_leaves_the_maps_on_each_batch(data, monkeypatch, short):
    """Where the group's table would take over a quarter of its share of the memory left (a
    machine with little left, or a small share of it: a Ray shard beside many others), the maps
    run on each batch of rows instead (``teachers.fixed_maps.table_fits``): the same
    teachers."""
    cfg = TrainConfig(**{**CFG.__dict__, "model": "hog", "augment": "none", "mixup": 0.0,
                         "epochs": 2})
    tabled = _group(cfg, data, [0, 1])
    calls = []
    monkeypatch.setattr("teachers.ensemble._mapped_rows", lambda *a: calls.append(a))
    if short == "memory":
        monkeypatch.setattr("teachers.fixed_maps.available_memory", lambda: 1 << 10)
        each = _group(cfg, data, [0, 1])
    else:
        x, y, part, min_size = data
        each = train_group(cfg, x, y, 10, np.array([0, 1]), part.parts([0, 1]), min_size,
                           memory_share=1e-9)
    assert calls == []  # no table was made
    for name, value in tabled.items():
        torch.testing.assert_close(each[name], value, rtol=1e-4, atol=1e-5)


def test_teacher_does_not_depend_on_its_group(data):
    a = _group(CFG, data, [0, 1, 2, 3])
    b = _group(CFG, data, [2, 7])
    for name in a:
        torch.testing.assert_close(a[name][2], b[name][0], rtol=1e-4, atol=1e-5)


def test_deterministic_for_a_seed(data):
    a, b = _group(CFG, data, [0, 1, 2]), _group(CFG, data, [0, 1, 2])
    c = _group(TrainConfig(**{**CFG.__dict__, "seed": 6}), data, [0, 1, 2])
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert not all(torch.equal(a[k], c[k]) for k in a)


@pytest.mark.parametrize("cfg", [CFG, TrainConfig(model="hog-scatter", epochs=2, seed=5)],
                         ids=["cnn", "hog-scatter table"])
def test_teachers_read_only_their_partition(data, cfg):
    """Every row outside the group's partitions is NaN: no teacher's weight may become NaN,
    whether it reads pixels or the table of the fixed maps of its group's rows."""
    x, y, part, min_size = data
    ids = [3, 4, 5]
    own = np.concatenate(part.parts(ids))
    poisoned = torch.full_like(x, float("nan"))
    poisoned[own] = x[own]
    params = train_group(cfg, poisoned, y, 10, np.array(ids), part.parts(ids), min_size)
    assert all(torch.isfinite(v).all() for v in params.values())


def test_each_epoch_is_a_permutation_of_the_partition():
    sizes = np.array([7, 6, 7])
    order = example_order(0, np.array([4, 5, 6]), sizes, 7 * 3)
    for k, n in enumerate(sizes):
        for e in range(3 * 6 // n):
            assert sorted(order[k, e * n:(e + 1) * n]) == list(range(n))
    assert not np.array_equal(order[0, :7], order[0, 7:14])  # reshuffled per epoch


def test_shift_flip_matches_a_reference():
    x = torch.arange(2 * 1 * 5 * 5, dtype=torch.float32).reshape(2, 1, 5, 5)
    out = shift_flip(x, torch.tensor([1, -2]), torch.tensor([-1, 0]), torch.tensor([False, True]))
    ref0 = torch.zeros(5, 5)
    ref0[1:, :4] = x[0, 0, :4, 1:]  # down by 1, left by 1
    ref1 = torch.zeros(5, 5)
    ref1[:3] = x[1, 0, 2:].flip(1)  # up by 2, mirrored
    assert torch.equal(out[0, 0], ref0) and torch.equal(out[1, 0], ref1)


def test_counter_based_streams_ignore_the_group():
    a = rng.uniform(1, np.arange(10), rng.ORDER, np.arange(50)[None])
    b = rng.uniform(1, np.array([7]), rng.ORDER, np.arange(50)[None])
    assert np.array_equal(a[7], b[0]) and a.min() >= 0 and a.max() < 1
    assert abs(a.mean() - 0.5) < 0.05


def test_every_use_of_the_counter_based_numbers_has_its_own_stream():
    """No two uses share numbers: the partition's keys are not teacher 0's mixup weights."""
    streams = {name: getattr(rng, name) for name in dir(rng)
               if name.isupper() and not name.startswith("_") and name != "SEED_LIMIT"}
    assert {"PARTITION", "MIXUP", "ORDER"} <= streams.keys()
    assert len(set(streams.values())) == len(streams)
    keys = rng.uniform(0, np.zeros(1, np.int64), rng.PARTITION, np.arange(20)[None])
    mixup = rng.uniform(0, np.zeros(1, np.int64), rng.MIXUP, np.arange(20)[None])
    assert not np.isin(mixup, keys).any()


def test_teachers_learn(digits, data):
    x, y, part, _ = data
    cfg = TrainConfig(model="cnn", epochs=12, batch_size=16, augment="none", seed=0)
    part = make_partition(len(digits.train_y), 10, 0)
    params = train_group(cfg, x, y, 10, np.arange(4), part.parts(range(4)), int(part.sizes.min()))
    ens = Ensemble("cnn", (1, 8, 8), 10, [params])
    assert ens.accuracy(digits.test_x, digits.test_y).mean() > 0.6  # chance: 0.1
    base = build_model("cnn", (1, 8, 8), 10)
    one = functional_call(base, {k: v[1] for k, v in params.items()},
                          (torch.as_tensor(digits.test_x),)).argmax(1).numpy()
    assert np.array_equal(one, next(ens.labels(digits.test_x, batch_size=500))[1].numpy())
