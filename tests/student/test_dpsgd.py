"""The DP-SGD learner: pair sampling of clipped gradients, the model, a tiny run on digits and the
``pate dpsgd train`` command. The Fashion-MNIST accuracy run is behind the slow marker."""

from __future__ import annotations

import copy
import json
import stat
from pathlib import Path

import numpy as np
import pytest
import torch

from analysis.sampled_gaussian import dpsgd_epsilon
from pate.cli.main import main
from pate.data.datasets import load_dataset, public_split
from pate.data.task import Benchmark, load_task
from student.dpsgd import (
    DPSGDConfig,
    dpsgd_network,
    dpsgd_setup,
    ghost_clipped_sgd,
    pair_distances,
    per_example_gradients,
    secure_generator,
    tempered_cnn,
    train_dpsgd,
)
from student.encoded_dpsgd import EncodingConfig, train_encoded_dpsgd
from student.training import accuracy
from teachers.hog import HOG, hog_size
from teachers.scattering import Scattering, scattering_size

# Opacus's hooks on a network whose input needs no gradient make torch warn on every step; the
# learner silences it (train_dpsgd), the tests that step by hand run outside it.
pytestmark = pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")


@pytest.fixture(scope="module")
def digits():
    ds = load_dataset("digits")
    return ds, public_split(ds)


def _loop_gradients(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Each row's gradient by its own backward pass: what the vectorised forms must equal."""
    rows = []
    for xi, yi in zip(x, y, strict=True):
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(xi[None]), yi[None]).backward()
        rows.append(torch.cat([p.grad.reshape(-1) for p in model.parameters()
                               if p.requires_grad]))
    return torch.stack(rows)


def test_pair_distances_are_those_of_clipped_per_example_gradients() -> None:
    """Three rows, two gradients of norm above C and one below: every distance drawn is one of
    the three between their clipped gradients (Opacus's factor min(1, C / (norm + 1e-6))), at most
    2C; a batch of one gives C."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    x = torch.tensor([[30.0, 0, 0, 0], [0.01, 0, 0, 0], [0, 2.0, 0, 1.0]])
    y = torch.tensor([0, 1, 2])
    grads = _loop_gradients(model, x, y)
    clip = 1.0
    norms = grads.norm(dim=1)
    assert norms[0] > clip > norms[1]
    clipped = grads * (clip / (norms + 1e-6)).clamp(max=1.0)[:, None]
    possible = {round(float((clipped[i] - clipped[j]).norm()), 5)
                for i in range(3) for j in range(3) if i != j}
    params = dict(model.named_parameters())
    for network in (model, torch.nn.Sequential(model)):  # the linear layer's closed form, vmap
        names = dict(network.named_parameters())
        d = pair_distances(network, names, x, y, clip, 500, torch.Generator().manual_seed(0))
        assert {round(float(v), 5) for v in d} == possible
        assert float(d.max()) <= 2 * clip
    np.testing.assert_allclose(
        pair_distances(model, params, x[:1], y[:1], 0.7, 4, torch.Generator()).numpy(), 0.7)


@pytest.mark.parametrize("bias", ["trained", "frozen", None])
def test_a_linear_layers_pairs_are_those_of_its_formed_gradients(bias) -> None:
    """One linear layer's pair distances come from e a^T's factorisation, without forming a
    gradient: the same pairs' distances as from the formed per-example gradients (the same
    layer wrapped, so that it takes the vmap), clipped rows among them; a frozen bias is in the
    logits and not in the gradient."""
    torch.manual_seed(1)
    layer = torch.nn.Linear(20, 5, bias=bias is not None)
    if bias == "frozen":
        layer.bias.data = torch.tensor([3.0, -3.0, 0.0, 1.0, 0.0])
        layer.bias.requires_grad_(False)
    x, y = torch.randn(64, 20) * 3, torch.randint(0, 5, (64,))
    wrapped = torch.nn.Sequential(layer)
    assert (_loop_gradients(layer, x, y).norm(dim=1) > 0.5).any()
    closed, formed = (pair_distances(net, {k: p for k, p in net.named_parameters()
                                           if p.requires_grad},
                                     x, y, 0.5, 200, torch.Generator().manual_seed(2))
                      for net in (layer, wrapped))
    torch.testing.assert_close(closed, formed, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("network", ["linear", "tempered-cnn"])
def test_ghost_clipping_steps_by_the_clipped_per_example_gradients(network) -> None:
    """Without noise, one step of Opacus's ghost clipping moves the parameters by minus the
    learning rate times the sum of the clipped per-example gradients (formed one backward pass
    per row) over the expected batch size; an empty batch leaves them where they were."""
    torch.manual_seed(0)
    shape = (1, 12, 12)
    _, model = dpsgd_network(network, shape, 4, 0.0, 1.0)
    x, y = torch.randn(9, *shape), torch.randint(0, 4, (9,))
    clip, expected_batch = 0.05, 7
    per_example = _loop_gradients(model, x, y)
    assert (per_example.norm(dim=1) > clip).any()  # some rows are clipped
    torch.testing.assert_close(per_example_gradients(model, dict(model.named_parameters()), x, y),
                               per_example, atol=1e-6, rtol=1e-4)
    clipped = per_example * (clip / (per_example.norm(dim=1) + 1e-6)).clamp(max=1.0)[:, None]
    config = DPSGDConfig(noise_multiplier=1.0, lr=1.0, momentum=0.0, max_grad_norm=clip)
    # the noise is the sigma given to ghost_clipped_sgd below: none
    gsm, optimizer, loss_fn = ghost_clipped_sgd(model, config, 0.0, expected_batch,
                                                torch.Generator())
    before = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    for xb, yb in ((x, y), (x[:0], y[:0])):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(gsm(xb), yb).backward()
        optimizer.step()
        after = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
        step = clipped.sum(dim=0) / expected_batch if len(yb) else torch.zeros_like(before)
        torch.testing.assert_close(before - after, step, atol=1e-6, rtol=1e-4)
        before = after


@pytest.mark.parametrize("network", ["linear", "hog-linear", "tempered-cnn"])
def test_ghost_clipping_is_opacus_dpsgd_step_for_step(network) -> None:
    """With noise and momentum, steps by ghost clipping and by Opacus's classic DP-SGD (every
    per-example gradient formed) from the same start, on the same batches, with noise from
    generators seeded alike, end at the same parameters; an empty batch (Poisson sampling draws
    them) is noise alone in both."""
    from opacus import GradSampleModule
    from opacus.optimizers import DPOptimizer

    shape = (1, 16, 16)
    torch.manual_seed(0)
    _, ghost_model = dpsgd_network(network, shape, 4, 0.0, 1.0)
    classic_model = copy.deepcopy(ghost_model)
    x = torch.randn(10, *shape) if network != "hog-linear" else torch.randn(10, hog_size(shape))
    y = torch.randint(0, 4, (10,))
    config = DPSGDConfig(noise_multiplier=1.3, lr=0.5, momentum=0.9, max_grad_norm=0.05)
    gsm, optimizer, loss_fn = ghost_clipped_sgd(ghost_model, config, 1.3, 8,
                                                torch.Generator().manual_seed(7))
    classic = GradSampleModule(classic_model)
    classic_optimizer = DPOptimizer(
        torch.optim.SGD(classic.parameters(), lr=0.5, momentum=0.9), noise_multiplier=1.3,
        max_grad_norm=0.05, expected_batch_size=8, generator=torch.Generator().manual_seed(7))
    start = [p.detach().clone() for p in ghost_model.parameters()]
    for rows in (slice(0, 6), slice(0, 0), slice(3, 10)):
        optimizer.zero_grad(set_to_none=True)
        loss_fn(gsm(x[rows]), y[rows]).backward()
        optimizer.step()
        classic_optimizer.zero_grad(set_to_none=True)
        torch.nn.functional.cross_entropy(classic(x[rows]), y[rows]).backward()
        classic_optimizer.step()
    for ghost_p, classic_p, p0 in zip(ghost_model.parameters(), classic_model.parameters(), start,
                                      strict=True):
        assert not torch.equal(ghost_p, p0)
        torch.testing.assert_close(ghost_p, classic_p, atol=1e-6, rtol=1e-5)


def test_the_published_model_carries_nothing_of_the_training(digits) -> None:
    """After ``train_dpsgd`` the published network holds no gradient (the last clipped sum
    before its noise is private), no per-example norm and no Opacus hook: it trains again like
    any module."""
    ds, ((pool_x, _), (eval_x, eval_y)) = digits
    config = DPSGDConfig(epochs=1, expected_batch_size=128, noise_multiplier=1.0,
                         bayesian_pairs=8, model="linear")
    model = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, 10, config,
                        (float(pool_x.mean()), float(pool_x.std()))).model
    for p in model.parameters():
        assert p.grad is None
        for left in ("summed_grad", "_norm_sample", "_forward_counter", "grad_sample"):
            assert getattr(p, left, None) is None
    model.train()
    x = torch.from_numpy(eval_x[:4])
    for _ in range(2):
        model(x).sum().backward()


def test_model_shapes() -> None:
    for shape in ((1, 28, 28), (1, 8, 8), (3, 32, 32)):
        model = tempered_cnn(shape, 10, 0.5, 0.25)
        assert model(torch.zeros(5, *shape)).shape == (5, 10)


def test_config_needs_exactly_one_noise_setting() -> None:
    with pytest.raises(ValueError):
        DPSGDConfig()
    with pytest.raises(ValueError):
        DPSGDConfig(target_epsilon=1.0, noise_multiplier=1.0)


def test_tiny_run_is_accounted_by_our_core(digits) -> None:
    ds, ((pool_x, _), (eval_x, eval_y)) = digits
    config = DPSGDConfig(epochs=4, expected_batch_size=128, lr=2.0, target_epsilon=8.0,
                         bayesian_pairs=32, init_seed=0)
    result = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, 10, config,
                         (float(pool_x.mean()), float(pool_x.std())))
    m = result.metrics
    q = 128 / len(ds.train_y)
    assert m["sampling_rate"] == pytest.approx(q)
    assert m["steps"] == 4 * int(1 / q)
    # calibrated on our accountant: at most the target, and close to it
    assert 7.9 < m["epsilon"] <= 8.0
    assert m["epsilon"] == pytest.approx(
        dpsgd_epsilon(q, m["noise_multiplier"], m["steps"], 1e-5)[0])
    assert result.distances.shape == (m["steps"], 32)
    assert np.all(result.distances <= 2 * config.max_grad_norm + 1e-6)
    assert 0 < m["epsilon_bayesian"] < np.inf
    assert m["accuracy"] > 0.5  # chance is 0.1


def test_a_seeded_network_leaves_the_callers_generator_alone(digits) -> None:
    """``init_seed`` seeds the network's initialisation only: the same seed gives the same start,
    and torch's global generator is where the caller left it."""
    ds, ((pool_x, _), _) = digits
    config = DPSGDConfig(epochs=1, expected_batch_size=128, noise_multiplier=1.0, init_seed=3,
                         model="hog-linear")
    norm = (float(pool_x.mean()), float(pool_x.std()))
    torch.manual_seed(11)
    expected = torch.rand(4)
    torch.manual_seed(11)
    first = dpsgd_setup(ds.train_x, ds.train_y, 10, config, norm).model
    assert torch.equal(torch.rand(4), expected)
    again = dpsgd_setup(ds.train_x, ds.train_y, 10, config, norm).model
    assert all(torch.equal(a, b) for a, b in zip(first.state_dict().values(),
                                                  again.state_dict().values(), strict=True))


@pytest.mark.parametrize(("model", "fixed_map", "size", "encoded"), [
    ("hog-linear", HOG, hog_size, False), ("hog-linear", HOG, hog_size, True),
    ("scatter-linear", Scattering, scattering_size, False)])
def test_a_linear_model_on_fixed_features_trains_only_its_linear_layer(
        digits, model, fixed_map, size, encoded) -> None:
    """The HOG or scattering map is applied once to every example and never trained: the
    published model is the map then the one trained linear layer, and its accuracy on raw inputs
    is the one reported."""
    ds, ((pool_x, _), (eval_x, eval_y)) = digits
    config = DPSGDConfig(epochs=4, expected_batch_size=128, lr=2.0, target_epsilon=8.0,
                         bayesian_pairs=8, init_seed=0, model=model)
    norm = (float(pool_x.mean()), float(pool_x.std()))
    result = (train_encoded_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, 10, config,
                                  EncodingConfig(encode=16), norm) if encoded
              else train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, 10, config, norm))
    features, linear = result.model
    assert isinstance(features, fixed_map) and isinstance(linear, torch.nn.Linear)
    assert linear.in_features == size(ds.train_x.shape[1:])
    assert not list(features.parameters())
    assert 7.9 < result.metrics["epsilon"] <= 8.0
    assert result.metrics["accuracy"] == accuracy(result.model, eval_x, eval_y, batch_size=4096)
    assert result.metrics["accuracy"] > 0.5  # chance is 0.1


def test_unknown_network_is_refused() -> None:
    with pytest.raises(ValueError, match="model must be one of"):
        DPSGDConfig(target_epsilon=1.0, model="resnet")


def test_noise_generator_is_seeded_from_the_os() -> None:
    """Privacy rule 3: every generator the learner makes starts from fresh OS entropy."""
    draws = [torch.randn(4, generator=secure_generator()[0]) for _ in range(2)]
    assert not torch.equal(*draws)
    assert "os.urandom" in secure_generator()[1] or "csprng" in secure_generator()[1]


def test_cli_writes_metrics_and_private_distances(tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    run = tmp_path / "run"
    code = main(["dpsgd", "train", "--run", str(run), "--dataset", "digits",
                 "--noise-multiplier", "1.2", "--epochs", "1", "--batch-size", "256",
                 "--bayesian-pairs", "16", "--json"])
    assert code == 0
    printed = json.loads(capsys.readouterr().out)
    metrics = json.loads((run / "dpsgd" / "metrics.json").read_text())
    bayesian = json.loads((run / "dpsgd" / "bayesian.json").read_text())
    assert {**metrics, "private": bayesian} == printed  # private figures marked so
    for key in ("accuracy", "epsilon", "delta", "steps", "noise_multiplier", "sampling_rate",
                "max_grad_norm"):
        assert key in metrics
    # the Bayesian epsilon is computed from the private gradients: not in the public file
    assert set(bayesian) == {"epsilon_bayesian", "bayesian_moment"}
    assert not set(bayesian) & set(metrics)
    distances = run / "dpsgd" / "distances.npy"
    for private in (distances, run / "dpsgd" / "bayesian.json"):
        assert stat.S_IMODE(private.stat().st_mode) == 0o600
    for public in ("metrics.json", "model.pt"):  # the compare stage's are private
        assert stat.S_IMODE((run / "dpsgd" / public).stat().st_mode) == 0o644
    # the saved distances reproduce the run's Bayesian epsilon through the CLI
    code = main(["epsilon", "bayesian", "--distances", str(distances),
                 "--noise-std", str(1.2 * metrics["max_grad_norm"]),
                 "--sampling-rate", str(metrics["sampling_rate"]), "--delta", "1e-5", "--json"])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["epsilon"] == pytest.approx(
        bayesian["epsilon_bayesian"], rel=1e-12)
    # trained again, encoded (no Bayesian accountant): the first training's figure is not kept
    # beside the second's metrics
    assert main(["dpsgd", "train", "--run", str(run), "--dataset", "digits", "--noise", "laplace",
                 "--encode", "5", "--noise-multiplier", "1.2", "--epochs", "1",
                 "--batch-size", "256", "-q"]) == 0
    said = capsys.readouterr().out.splitlines()
    assert not (run / "dpsgd" / "bayesian.json").exists()
    encoded = json.loads((run / "dpsgd" / "metrics.json").read_text())
    assert encoded["noise"] == "laplace"
    assert len(said) == 2 and said[1] == (  # what the figure covers, in words
        f"the guarantee: ({encoded['epsilon']:.3f}, 1e-05)-DP for one record added or removed; "
        "Poisson-sampled batches of 256 expected, each example's gradient clipped to "
        f"{encoded['max_grad_norm']:g} and encoded against 5 public profiles, laplace noise of "
        "1.2 times that, 1 epoch, improved RDP conversion")
    from pate.cli.dpsgd import _guarantee  # a batch not below the rows: all of them each step

    whole = _guarantee({**encoded, "sampling_rate": 1.0})
    assert "; every step on all the private data (sampling rate 1), each" in whole
    assert "expected" not in whole
    # a training stopped before its metrics are written leaves none of an earlier training's
    (run / "dpsgd" / "model.pt").unlink()
    (run / "dpsgd" / "model.pt").mkdir()  # the model cannot be written: a stop part-way
    assert main(["dpsgd", "train", "--run", str(run), "--dataset", "digits",
                 "--noise-multiplier", "1.2", "--epochs", "1", "--batch-size", "256",
                 "-q"]) != 0
    assert not (run / "dpsgd" / "metrics.json").exists()


def test_cli_trains_on_the_runs_data_and_checks_its_input_first(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Without data flags the baseline learns the run's teachers' data (here digits, not the
    default dataset); a delta of 1/n or more, a momentum outside [0, 1) and a run directory
    that cannot be one are each one line, before any training."""
    run = tmp_path / "run"
    (run / "teachers").mkdir(parents=True)
    digits = load_task(Benchmark("digits"))
    (run / "teachers" / "manifest.json").write_text(json.dumps(
        {"data": {"kind": "benchmark", "name": "digits", "data_dir": None, "pool_size": None},
         "pool_fingerprint": digits.pool_fingerprint,
         "private_fingerprint": digits.private_fingerprint}))
    small = ["--noise-multiplier", "1.2", "--epochs", "1", "--batch-size", "256",
             "--bayesian-pairs", "16"]
    assert main(["dpsgd", "train", "--run", str(run), *small, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["dataset"] == "digits"
    (tmp_path / "a-file").write_text("")
    # data flags that name other data than the teachers learnt: the report would set a
    # baseline of other data beside their student
    other = "the run's teachers learnt other data than the data flags name"
    for argv, message in ((["--run", str(run), "--dataset", "digits", "--pool-size", "200"],
                           other),
                          (["--run", str(run), "--delta", "0.01"], "at least 1/n"),
                          (["--run", str(run), "--momentum", "5"], "momentum must be in [0, 1)"),
                          (["--run", str(tmp_path / "a-file")], "cannot create the run")):
        assert main(["dpsgd", "train", *argv, *small]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err


@pytest.mark.parametrize("args,message", [
    (["--noise-multiplier", "-1"], "noise_multiplier must be a finite number > 0, got -1.0"),
    (["--noise-multiplier", "inf"], "noise_multiplier must be a finite number > 0, got inf"),
    (["--epsilon", "2", "--lr", "inf"], "lr must be a finite number > 0, got inf"),
    # a float32 network would overflow in its first step (an internal error before)
    (["--epsilon", "2", "--lr", "1e308"], "lr must be below float32's largest number"),
    (["--noise-multiplier", "1e300"], "noise_multiplier must be below float32's largest"),
    (["--epsilon", "2", "--max-grad-norm", "inf"], "max_grad_norm must be a finite number > 0"),
    (["--epsilon", "2", "--init-seed", "-5"], "init_seed must be in [0, 2^63), got -5"),
    (["--epsilon", "2", "--init-seed", str(2**63)], "init_seed must be in [0, 2^63)"),
])
def test_cli_refuses_bad_settings_before_the_data(tmp_path: Path, args: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    """Said by name as given, before any data is read or any step taken (a negative noise
    multiplier was said as an internal noise_std after the first step)."""
    assert main(["dpsgd", "train", "--run", str(tmp_path / "r"), "--dataset", "digits",
                 *args]) == 2
    err = capsys.readouterr().err
    assert err == f"pate: error: {message}" + err.split(message, 1)[1] and err.count("\n") == 1
    assert not (tmp_path / "r").exists()


def test_a_run_too_long_to_account_is_refused_before_it_trains(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The Bayesian accountant keeps each step's distances: epochs beyond what they fit in
    are one line (numpy's "Maximum allowed dimension exceeded" before)."""
    assert main(["dpsgd", "train", "--run", str(tmp_path / "r"), "--dataset", "digits",
                 "--noise-multiplier", "1", "--batch-size", "64", "--epochs", str(10**20),
                 "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "their distances would not fit in 2 GiB; fewer epochs" in err
    assert err.count("\n") == 1


def test_a_delta_the_bayesian_accountant_cannot_cover_is_refused_before_training(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Its failure probability grows with the steps: a delta below it was refused after
    training (and, for a while, an internal error there)."""
    assert main(["dpsgd", "train", "--run", str(tmp_path / "r"), "--dataset", "digits",
                 "--model", "linear", "--epsilon", "3", "--delta", "1e-14", "--epochs", "2",
                 "--batch-size", "2", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert err == ("pate: error: delta 1e-14 is not above the Bayesian accountant's failure "
                   "probability over the run's steps: a larger delta or fewer steps\n")
    assert not (tmp_path / "r" / "dpsgd").exists()


def test_cli_needs_one_noise_setting(tmp_path: Path) -> None:
    with pytest.raises(SystemExit):
        main(["dpsgd", "train", "--run", str(tmp_path), "--dataset", "digits"])


@pytest.mark.slow
def test_fashion_mnist_reaches_the_published_accuracy() -> None:
    """Issue 7: at least 0.84 on the evaluation half at epsilon 3, delta 1e-5 (about 15-40
    minutes on 2 CPU cores)."""
    ds = load_dataset("fashion-mnist")
    (pool_x, _), (eval_x, eval_y) = public_split(ds)
    result = train_dpsgd(ds.train_x, ds.train_y, eval_x, eval_y, 10,
                         DPSGDConfig(target_epsilon=3.0),
                         (float(pool_x.mean()), float(pool_x.std())))
    assert result.metrics["epsilon"] <= 3.0
    assert result.metrics["accuracy"] >= 0.84


def test_whole_batches_are_the_rows_poisson_sampling_draws() -> None:
    """The loader fetches each Poisson batch by one index (``WholeBatches``): the same rows,
    in the same order, as torch's row-by-row fetch and default collate, empty batches
    included (a sample rate that draws many)."""
    from opacus.data_loader import DPDataLoader
    from torch.utils.data import TensorDataset

    from student.dpsgd import WholeBatches

    x, y = torch.randn(40, 3), torch.arange(40)
    batches = []
    for fast in (False, True):
        dataset = (WholeBatches if fast else TensorDataset)(x, y)
        loader = DPDataLoader(dataset, sample_rate=0.02, generator=torch.Generator().manual_seed(1),
                              **({"collate_fn": WholeBatches.collate} if fast else {}))
        batches.append([(xb.tolist(), yb.tolist()) for _ in range(5) for xb, yb in loader])
    assert batches[0] == batches[1]
    assert any(not yb for _, yb in batches[1]) and any(yb for _, yb in batches[1])
