"""Each semi-supervised learner beats the supervised baseline (same network, same labels, same
number of steps) on scikit-learn's digits with 50 labels; the other 1 247 training images are the
unlabelled pool, the 500 test images the evaluation set. Seeds are fixed: offline experiments."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from student_support import one_thread

from pate.data.datasets import Dataset
from pate.errors import UserError
from student.models import ModelSpec, build_classifier, check_network
from student.supervised import SupervisedLearner
from student.training import (
    FitConfig,
    MethodConfig,
    accuracy,
    build_learner,
    fit,
    seed_everything,
)
from teachers.fixed_maps import feature_table
from teachers.models import on_features, scatter_linear

LABELS = 50
pytestmark = pytest.mark.usefixtures(one_thread.__name__)


def _accuracy(digits: Dataset, method: MethodConfig, config: FitConfig) -> float:
    seed_everything(config.seed)
    spec = method.spec(digits.train_x.shape[1:], digits.num_classes)
    model = build_classifier(spec)
    pick = np.random.default_rng(0).choice(len(digits.train_y), LABELS, replace=False)
    fit(build_learner(method, model, spec), digits.train_x[pick], digits.train_y[pick],
        digits.train_x, config)
    return accuracy(model, digits.test_x, digits.test_y)


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_vat_beats_supervised(digits: Dataset) -> None:
    config = FitConfig(epochs=20)
    supervised = _accuracy(digits, MethodConfig("supervised", "mlp"), config)
    vat = _accuracy(digits, MethodConfig("vat", "mlp", vat_eps=3.0), config)
    assert vat > supervised + 0.03, (vat, supervised)


@pytest.mark.slow
def test_gan_beats_supervised(digits: Dataset) -> None:
    """Feature matching needs thousands of steps to pay off (Salimans et al. train 300
    epochs): 80 epochs of 32 unlabelled images, ~3 100 steps, minutes on two cores."""
    config = FitConfig(epochs=80, unlabelled_batch_size=32)
    supervised = _accuracy(digits, MethodConfig("supervised", "wn-mlp"), config)
    gan = _accuracy(digits, MethodConfig("gan"), config)
    assert gan > supervised, (gan, supervised)


def test_gan_learner_trains_both_networks(digits: Dataset) -> None:
    """One short epoch: the discriminator and the generator both move, and the losses are
    finite (the full comparison with the baseline is the slow test above)."""
    seed_everything(0)
    method = MethodConfig("gan")
    spec = method.spec(digits.train_x.shape[1:], digits.num_classes)
    model = build_classifier(spec)
    learner = build_learner(method, model, spec)
    before = [p.detach().clone() for p in (*model.parameters(),
                                           *learner.generator_net.parameters())]
    result = fit(learner, digits.train_x[:50], digits.train_y[:50], digits.train_x[:256],
                 FitConfig(epochs=1, unlabelled_batch_size=64))
    after = [*model.parameters(), *learner.generator_net.parameters()]
    assert all(np.isfinite(v) for v in result.losses[0].values())
    assert set(result.losses[0]) == {"supervised", "unsupervised", "generator"}
    assert sum(not torch.equal(a, b) for a, b in zip(after, before, strict=True)) == len(before)


def test_a_network_its_inputs_are_too_small_for_is_refused_before_any_query() -> None:
    """A 1x1 image passes the config's checks but not the CNN's pooling: the network's smallest
    side is said before a query is asked (it failed in training, after the round was charged);
    a user's network is built and run once on blank inputs."""
    with pytest.raises(UserError, match=r"^arch cnn needs images of at least 4x4 pixels "
                                        r"\(Conv-Small's two 2x2 max-pools\), got 1x1$"):
        check_network(ModelSpec("cnn", (1, 1, 1), 3))
    with pytest.raises(UserError, match=r"^arch cnn needs images of at least 4x4 pixels .*got "
                                        r"16x1 \(images are \[C, H, W\]: these look "
                                        r"\[H, W, C\], channels last\)$"):
        check_network(ModelSpec("cnn", (16, 16, 1), 3))
    for arch, side in (("cnn-hog", 7), ("cnn-hog-scatter", 6), ("cnn-hog-simclr", 4)):
        with pytest.raises(UserError, match=rf"^arch {arch} needs images of at least 8x8 "):
            check_network(ModelSpec(arch, (1, side, side), 3))
    check_network(ModelSpec("cnn", (1, 4, 4), 3))  # the smallest sides said are enough
    check_network(ModelSpec("cnn-hog-scatter", (3, 8, 8), 3))
    with pytest.raises(UserError, match=r"^arch '.*:tiny': its forward failed on a batch of "
                                        r"shape \[2, 1, 2, 2\]"):
        check_network(ModelSpec(f"{__name__}:tiny", (1, 2, 2), 3))


def tiny(input_shape: tuple[int, ...], num_classes: int) -> torch.nn.Module:
    """A user's network whose 3x3 convolution (no padding) needs a side of 3."""
    return torch.nn.Sequential(torch.nn.Conv2d(input_shape[0], 4, 3), torch.nn.Flatten(),
                               torch.nn.LazyLinear(num_classes))


def test_a_short_training_leaves_batch_norm_settled_on_the_pool(digits: Dataset) -> None:
    """After only a few steps, evaluation mode uses the batch-norm statistics of the whole pool
    (not the running averages that still hold their start): the first layer's mean is the mean
    of its inputs over the pool's rows, and the student scores in evaluation mode as it does
    with batch statistics."""
    seed_everything(0)
    method = MethodConfig("supervised", "mlp")
    spec = method.spec(digits.train_x.shape[1:], digits.num_classes)
    model = build_classifier(spec)
    pool = digits.train_x[:258]  # 4 batches of 64 and 2 rows: settled in 5 of 51 or 52
    fit(build_learner(method, model, spec), pool[:100], digits.train_y[:100], pool,
        FitConfig(epochs=1, unlabelled_batch_size=64))
    first = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm1d))
    inputs = []
    handle = first.register_forward_pre_hook(lambda _m, args: inputs.append(args[0]))
    with torch.no_grad():
        model.eval()(torch.as_tensor(pool))
    handle.remove()
    error = (first.running_mean - inputs[0].mean(0)).abs().max()
    assert error < 0.01 * inputs[0].std(0).mean(), error
    evaluated = accuracy(model, pool, digits.train_y[:258])
    with torch.no_grad():
        batch_stats = float((model.train()(torch.as_tensor(pool)).argmax(1).numpy()
                             == digits.train_y[:258]).mean())
    assert abs(evaluated - batch_stats) < 0.05, (evaluated, batch_stats)


class _MapsOnEveryBatch(SupervisedLearner):
    labelled_only = False  # fit runs the network's fixed maps on every batch


def _trained(learner: type[SupervisedLearner]) -> tuple[dict[str, torch.Tensor], int]:
    """A ``cnn-hog-scatter`` student trained 2 epochs on 32 of 64 images, and the rows its
    scattering ran on."""
    gen = np.random.default_rng(0)
    y = gen.integers(0, 3, 64)
    x = (gen.random((64, 1, 28, 28)) + y[:, None, None, None] * np.linspace(0, 1, 28)
         ).astype(np.float32)
    seed_everything(0)
    model = build_classifier(ModelSpec("cnn-hog-scatter", (1, 28, 28), 3))
    rows = [0]

    def count(module: torch.nn.Module, inputs: tuple, out: torch.Tensor) -> None:
        rows[0] += len(out)

    model.experts[2][0].register_forward_hook(count)
    fit(learner(model), x[:32], y[:32], x, FitConfig(epochs=2, unlabelled_batch_size=32))
    return model.state_dict(), rows[0]


def test_a_table_of_the_fixed_maps_trains_the_student_as_every_batch_does(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``cnn-hog-scatter``'s HOG and scattering, computed once per labelled row, train the
    same weights as on each batch, and run on far fewer rows; a table that would not fit in a
    quarter of the memory left is not made."""
    (table, on_table), (each, on_each) = _trained(SupervisedLearner), _trained(_MapsOnEveryBatch)
    for name, value in table.items():
        torch.testing.assert_close(value, each[name], rtol=1e-5, atol=1e-6, msg=name)
    assert on_table == 1 + 32 + 64  # its width, the table, the pool for batch norm
    assert on_each == 2 * 2 * 32 + 64
    monkeypatch.setattr("teachers.fixed_maps.available_memory", lambda: 1 << 20)
    assert _trained(SupervisedLearner)[1] == 1 + on_each  # its width; 32 rows: > 256 KiB


class _OwnSequential(torch.nn.Sequential):
    """A user's network: a Sequential with a forward of its own (here, the logits doubled)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 2 * super().forward(x)


def test_a_users_sequential_keeps_its_own_forward() -> None:
    """A subclass of ``nn.Sequential`` that starts with a fixed map is not rebuilt as a plain
    one for the table: its own forward would be lost."""
    net = _OwnSequential(*scatter_linear((1, 28, 28), 3))
    found = on_features(net, (1, 28, 28), inputs=True)
    assert found is not None and [type(m).__name__ for m in found[1]] == ["Pixels"]
    head, maps = found
    x = torch.rand(4, 1, 28, 28)
    torch.testing.assert_close(head(feature_table(maps, x)), net(x))
