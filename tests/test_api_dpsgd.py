"""DP-SGD from Python (``pate.api.DPSGD``): it trains to its epsilon, predicts, and refuses bad
input with one clear error."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from analysis.sampled_gaussian import dpsgd_epsilon
from pate.api import DPSGD, load_dpsgd
from pate.cli.main import main
from pate.data.datasets import load_dataset
from pate.data.task import Benchmark, load_task
from pate.errors import UserError


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds.train_x, ds.train_y, ds.test_x, ds.test_y


@pytest.mark.parametrize("model", ["scatter-linear", "tempered-cnn"])
def test_it_learns_at_its_epsilon(digits, model) -> None:
    x, y, test_x, test_y = digits
    dp = DPSGD(8.0, model=model, epochs=4, batch_size=128, lr=2.0, seed=0)
    assert dp.fit(x, y, 10, x_public=test_x[:200]) is dp
    assert 7.9 < dp.epsilon_ <= 8.0
    assert dp.model_name_ == model and dp.metrics_["config"]["model"] == model
    assert "accuracy" not in dp.metrics_  # no evaluation data was given to fit
    # the Bayesian accountant's epsilon comes from the private gradients: kept apart
    assert set(dp.bayesian_) == {"epsilon_bayesian", "bayesian_moment"}
    assert not set(dp.bayesian_) & set(dp.metrics_)
    accuracy = dp.score(test_x, test_y)
    assert accuracy > 0.5  # chance is 0.1
    assert np.array_equal(dp.predict(test_x), dp.predict_proba(test_x).argmax(1))
    assert np.allclose(dp.predict_proba(test_x[:5]).sum(1), 1.0)


def test_feature_rows_take_the_linear_model_and_refuse_an_image_one() -> None:
    rng = np.random.default_rng(0)
    x = rng.normal(size=(3000, 5)).astype(np.float32)
    y = (x[:, 0] > 0).astype(np.int64)
    dp = DPSGD(4.0, epochs=3, batch_size=256, lr=1.0).fit(x, y, 2)
    assert dp.model_name_ == "linear" and dp.score(x[:500], y[:500]) > 0.7
    with pytest.raises(UserError, match="'hog-linear' is for images"):
        DPSGD(4.0, model="hog-linear").fit(x, y, 2)
    # an expected batch of all the rows or more: every step takes them all, which is said
    with pytest.warns(UserWarning, match=r"the expected batch \(4096\) is not smaller than the "
                                         r"private data: .* one step per epoch, 2 in all"):
        DPSGD(4.0, epochs=2, batch_size=4096, lr=1.0).fit(x, y, 2)


def test_a_second_fit_takes_the_default_of_its_own_data(digits) -> None:
    """The network left unnamed is chosen per fit, from the data of that fit."""
    images, labels, _, _ = digits
    rows = images.reshape(len(images), -1)
    dp = DPSGD(8.0, epochs=1, batch_size=256, allow_large_delta=False)
    assert dp.fit(images, labels, 10).model_name_ == "tempered-cnn"
    assert dp.fit(rows, labels, 10).model_name_ == "linear"
    assert dp.config.model is None


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"epsilon": 0}, "epsilon must be a finite number > 0"),
    ({"epsilon": 1.0, "model": "resnet"}, "model must be one of"),
    ({"epsilon": 1.0, "momentum": 1.5}, "momentum must be in \\[0, 1\\)"),
    ({"epsilon": 1.0, "momentum": "high"}, "momentum must be a number"),
    ({"epsilon": 1.0, "epochs": 0}, "epochs must be an integer >= 1"),
    ({"epsilon": 1.0, "delta": 2.0}, "delta must be in"),
    ({"epsilon": 1.0, "seed": 2 ** 70}, "seed must be an integer in"),
    ({"epsilon": 1.0, "allow_large_delta": "no"}, "allow_large_delta must be True or False"),
    ({}, "give exactly one of epsilon .* and noise_multiplier"),
    ({"epsilon": 1.0, "noise_multiplier": 1.0}, "give exactly one of epsilon"),
    ({"noise_multiplier": -1.0}, "noise_multiplier must be a finite number > 0"),
    ({"epsilon": 1.0, "conversion": "tight"}, "conversion must be one of classic, improved"),
])
def test_bad_settings_are_refused_in_one_line(kwargs, message) -> None:
    with pytest.raises(UserError, match=message):
        DPSGD(**kwargs)


@pytest.mark.filterwarnings("ignore:optimal Rényi order")  # the unreachable epsilon's search
def test_bad_data_is_refused_before_any_training(digits) -> None:
    x, y, test_x, _ = digits
    with pytest.raises(UserError, match="y must be integer class indices"):
        DPSGD(1.0).fit(x, y + 10, 10)
    with pytest.raises(UserError, match=r"one label per row of x_private, got fewer labels "
                                        r"than rows$"):  # not how many: they may be private
        DPSGD(1.0).fit(x, y[:-1], 10)
    with pytest.raises(UserError, match="at least 1/n"):
        DPSGD(1.0, delta=1e-2).fit(x, y, 10)
    with pytest.raises(UserError, match="x_public has rows of shape"):
        DPSGD(1.0).fit(x, y, 10, x_public=test_x[:, :, :4])
    with pytest.raises(UserError, match="x_private must be numbers"):
        DPSGD(1.0).fit(np.array([["a"] * 4] * 3), [0, 1, 0], 2)
    with pytest.raises(UserError, match="'scatter-linear' needs images of at least 4x4"):
        DPSGD(1.0, model="scatter-linear").fit(np.zeros((50, 1, 3, 3)), np.arange(50) % 2, 2)
    with pytest.raises(UserError, match="'hog-linear' needs images of at least 8x8"):
        DPSGD(1.0, model="hog-linear").fit(np.zeros((50, 1, 6, 6)), np.arange(50) % 2, 2)
    with pytest.raises(UserError, match="no noise multiplier"):
        DPSGD(1e-6, epochs=1, batch_size=64).fit(x, y, 10)
    with pytest.raises(UserError, match="fit the model first"):
        DPSGD(1.0).predict(test_x)
    with pytest.raises(UserError, match="fit the model first"):
        _ = DPSGD(1.0).epsilon_


@pytest.mark.parametrize("model", ["hog-linear"])  # a fixed map, then the trained layer
def test_a_runs_model_loads_back_and_predicts_as_it_was_measured(tmp_path: Path, model: str,
                                                                 capsys) -> None:
    """``load_dpsgd`` rebuilds the network ``pate dpsgd train`` wrote from its public metrics
    (a fixed feature map and its linear layer, or a CNN with the pool's standardisation): on
    the evaluation rows it scores exactly what the training measured."""
    run = tmp_path / "run"
    assert main(["dpsgd", "train", "--run", str(run), "--dataset", "digits", "--model", model,
                 "--epsilon", "8", "--epochs", "1", "--batch-size", "256", "--bayesian-pairs", "3",
                 "-q"]) == 0
    capsys.readouterr()
    task = load_task(Benchmark("digits"), need_private=False)
    for path in (run, run / "dpsgd"):
        loaded = load_dpsgd(path)
        assert loaded.model_name_ == model and loaded.classes_ == task.classes
        assert loaded.epsilon_ == loaded.metrics_["epsilon"] <= 8.0
        assert loaded.score(task.eval_x, task.eval_y) == loaded.metrics_["accuracy"]
        assert loaded.config.epochs == 1 and loaded.config.expected_batch_size == 256
        assert loaded.config.noise_multiplier == loaded.metrics_["noise_multiplier"]
    with pytest.raises(UserError, match=r"no DP-SGD model \(model\.pt and metrics\.json"):
        load_dpsgd(tmp_path)
    metrics = json.loads((run / "dpsgd" / "metrics.json").read_text())
    (run / "dpsgd" / "metrics.json").write_text(json.dumps(
        {**metrics, "config": {**metrics["config"], "model": "resnet"}}))  # edited by hand
    with pytest.raises(UserError, match=r"not the metrics of a DP-SGD model"):
        load_dpsgd(run)
    del metrics["in_shape"]  # as an older version wrote it
    (run / "dpsgd" / "metrics.json").write_text(json.dumps(metrics))
    with pytest.raises(UserError, match=r"an older version recorded no input shape"):
        load_dpsgd(run)


def test_a_noise_multiplier_gives_the_epsilon_the_accountant_computes(digits) -> None:
    """As ``pate dpsgd train --noise-multiplier``: the epsilon follows from the noise, through
    the same accountant and the conversion asked for."""
    x, y, _, _ = digits
    dp = DPSGD(noise_multiplier=2.0, model="linear", epochs=1, batch_size=256,
               conversion="classic", seed=0)
    dp.fit(x.reshape(len(x), -1), y, 10)
    m = dp.metrics_
    assert m["noise_multiplier"] == 2.0 and m["conversion"] == "classic"
    assert dp.epsilon_ == dpsgd_epsilon(m["sampling_rate"], 2.0, m["steps"], 1e-5,
                                        conversion="classic")[0]
