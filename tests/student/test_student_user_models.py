"""A user's own student network by import path (``student.arch = "package.module:factory"``):
built by the teachers' resolver, trained by vat and supervised, refused with the GAN and with a
bad path in one line, and saved with its arch string so that it loads again."""

from __future__ import annotations

import json
import textwrap
import warnings

import numpy as np
import pytest
import torch
from student_support import one_thread, votes_for

from analysis.orders import default_orders
from pate.aggregation.ledger import Ledger
from pate.cli.main import main
from pate.config import StudentConfig
from pate.data.datasets import Dataset, public_split
from pate.errors import UserError
from student.models import ModelSpec, build_classifier
from student.training import (
    FitConfig,
    MethodConfig,
    accuracy,
    build_learner,
    fit,
    load_classifier,
    predict_proba,
    save_model,
    seed_everything,
)
from teachers import user_models

NAME = "user_nets_student"
ARCH = f"{NAME}:small"
NETS = textwrap.dedent('''
    import math

    from torch import nn


    class Small(nn.Module):
        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.net = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 64),
                                     nn.BatchNorm1d(64), nn.ReLU(), nn.Linear(64, num_classes))

        def forward(self, x):
            return self.net(x)


    def small(input_shape, num_classes):
        return Small(input_shape, num_classes)


    def too_wide(input_shape, num_classes):
        return Small(input_shape, num_classes + 3)


    class EvalFails(Small):
        def forward(self, x):
            if not self.training and len(x) > 50:
                raise RuntimeError("no batch of more than 50 rows in evaluation")
            return self.net(x)


    def eval_fails(input_shape, num_classes):
        return EvalFails(input_shape, num_classes)


    class FailsLate(Small):
        """Fails at its fourth training batch: past a rehearsal of one step."""
        steps = 0

        def forward(self, x):
            if self.training:
                self.steps += 1
                if self.steps > 3:
                    raise RuntimeError("no fourth training batch")
            return self.net(x)


    def fails_late(input_shape, num_classes):
        return FailsLate(input_shape, num_classes)


    def probabilities(input_shape, num_classes):
        return nn.Sequential(Small(input_shape, num_classes), nn.Softmax(dim=1))
''')
pytestmark = pytest.mark.usefixtures(one_thread.__name__)


@pytest.fixture(scope="module", autouse=True)
def nets(tmp_path_factory):
    folder = tmp_path_factory.mktemp("nets")
    (folder / f"{NAME}.py").write_text(NETS)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder


def test_user_arch_is_built_by_the_resolver() -> None:
    spec = MethodConfig("vat", ARCH).spec((1, 8, 8), 10)
    assert spec == ModelSpec(ARCH, (1, 8, 8), 10)
    model = build_classifier(spec)
    assert type(model).__name__ == "Small" and type(model).__module__ == NAME
    assert model(torch.zeros(3, 1, 8, 8)).shape == (3, 10)
    user_models._SAID_PROBABILITIES.discard(f"{NAME}:probabilities")  # said once a process
    with pytest.warns(UserWarning, match=f"arch '{NAME}:probabilities': its forward looks to "
                                         "return probabilities .*drop its final softmax"):
        build_classifier(ModelSpec(f"{NAME}:probabilities", (1, 8, 8), 10))
    with warnings.catch_warnings():  # said once: a network is built once per teacher and use
        warnings.simplefilter("error")
        build_classifier(ModelSpec(f"{NAME}:probabilities", (1, 8, 8), 10))


def test_gan_and_bad_paths_are_refused_in_one_line() -> None:
    with pytest.raises(ValueError, match="method gan: the student's network is its own "
                                         "discriminator, arch wn-mlp") as exc:
        MethodConfig("gan", ARCH)
    assert "\n" not in str(exc.value)
    with pytest.raises(UserError) as exc:
        MethodConfig("supervised", "nosuch_student_nets:f")
    assert str(exc.value) == ("arch 'nosuch_student_nets:f': cannot import nosuch_student_nets "
                              "(ModuleNotFoundError: No module named 'nosuch_student_nets'); "
                              "run from the folder that holds it, or add that folder to "
                              "PYTHONPATH (only pate run looks beside its config file)")
    with pytest.raises(UserError, match=f"arch '{NAME}:nothing': {NAME} has no attribute"):
        MethodConfig("vat", f"{NAME}:nothing")
    with pytest.raises(ValueError, match="neither one of cnn, cnn-hog"):
        MethodConfig("vat", "resnet")
    assert StudentConfig(method="vat", arch=ARCH).arch == ARCH
    with pytest.raises(ValueError, match="its own discriminator"):
        StudentConfig(method="gan", arch=ARCH)


def test_a_wrong_number_of_outputs_is_refused_before_training() -> None:
    """Built as it is, a student of 13 logits for 10 classes would predict classes that do
    not exist: its factory's network is probed once, in evaluation mode."""
    with pytest.raises(UserError) as exc:
        build_classifier(ModelSpec(f"{NAME}:too_wide", (1, 8, 8), 10))
    assert str(exc.value) == (f"arch '{NAME}:too_wide': its forward returns shape [2, 13] for "
                              "a batch of 2; expected [2, 10]")
    model = build_classifier(ModelSpec(ARCH, (1, 8, 8), 10))
    assert model.training  # the probe leaves the network in training mode


def test_cli_bad_arch_is_one_error_line(tmp_path, capsys) -> None:
    argv = ["student", "train", "--run", str(tmp_path / "run"), "--method", "vat",
            "--mechanism", "confident", "--dataset", "digits", "--arch", "nosuch_student_nets:f"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "pate: error: arch 'nosuch_student_nets:f': cannot import nosuch_student_nets "
        "(ModuleNotFoundError: No module named 'nosuch_student_nets'); run from the folder "
        "that holds it, or add that folder to PYTHONPATH (only pate run looks beside its "
        "config file)"]


@pytest.mark.parametrize(("factory", "said"), [
    # built and run on two rows before the aggregator is opened
    ("too_wide", f"arch '{NAME}:too_wide': its forward returns shape [2, 13] for a batch of 2; "
                 "expected [2, 10]"),
    # passes that, not the rehearsal of one training step and an evaluation
    ("eval_fails", f"the student's network '{NAME}:eval_fails' failed in a rehearsal of one "
                   "training step and an evaluation on public rows (RuntimeError: no batch of "
                   "more than 50 rows in evaluation); nothing was asked"),
])
def test_a_network_that_fails_before_a_query_spends_nothing(tmp_path, digits, capsys,
                                                            factory: str, said: str) -> None:
    """A student's network that cannot be built, or fails its rehearsal: one line, and
    nothing is asked, charged or written."""
    (_, pool_y), _ = public_split(digits)
    np.savez(tmp_path / "votes.npz", votes=votes_for(pool_y),
             pool_index=np.arange(len(pool_y), dtype=np.int64))
    argv = ["student", "train", "--run", str(tmp_path / "run"), "--votes",
            str(tmp_path / "votes.npz"), "--dataset", "digits", "--method", "supervised",
            "--mechanism", "confident", "--threshold", "150", "--sigma1", "40", "--sigma2", "20",
            "--budget-epsilon", "50", "--delta", "1e-5", "--queries", "50",
            "--arch", f"{NAME}:{factory}"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip().splitlines() == [f"pate: error: {said}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["votes.npz"]  # no ledger, no labels


def test_a_network_failing_after_the_round_is_one_line_and_its_answers_are_kept(
        tmp_path, digits, capsys) -> None:
    """A network that passes the checks before the round (a rehearsal of one training step)
    but fails in its own code later, here at its fourth training batch: one error line naming
    the exception, the answers kept, and training on them again asks and charges nothing."""
    (_, pool_y), _ = public_split(digits)
    np.savez(tmp_path / "votes.npz", votes=votes_for(pool_y),
             pool_index=np.arange(len(pool_y), dtype=np.int64))
    run = tmp_path / "run"
    argv = ["student", "train", "--run", str(run), "--votes", str(tmp_path / "votes.npz"),
            "--dataset", "digits", "--method", "supervised", "--mechanism", "confident",
            "--threshold", "150", "--sigma1", "40", "--sigma2", "20", "--budget-epsilon", "50",
            "--delta", "1e-5", "--epochs", "2", "--arch", f"{NAME}:fails_late"]
    assert main([*argv, "--queries", "60"]) == 2
    err = capsys.readouterr().err.strip().splitlines()  # progress lines, then the error
    assert not any("Traceback" in line for line in err)
    assert err[-1].startswith(
        f"pate: error: the student's network '{NAME}:fails_late' failed as it trained or was "
        "evaluated (RuntimeError: no fourth training batch); the "), err
    assert err[-1].endswith("fix the network and train on them again at no new cost (rerun "
                            "pate run, or pate student train with --queries 0)")

    def spent():  # the ledger beside the votes
        ledger = Ledger(f"sqlite:///{tmp_path / 'ledger.db'}", default_orders(), 1e-5, 50.0)
        try:
            return ledger.budget()
        finally:
            ledger.close()

    kept, charged = np.load(run / "labels.npz")["pool_index"], spent()
    assert len(kept) == charged.queries == 60 and charged.epsilon_spent > 0
    assert main([*argv, "--queries", "0", "--arch", ARCH]) == 0
    assert np.array_equal(np.load(run / "labels.npz")["pool_index"], kept)  # nothing asked
    assert spent() == charged  # nor charged

    # the saved network's code changes so that its weights no longer fit: training another
    # network on the same answers does not read it (only a call that uses it would fail)
    described = json.loads((run / "student" / "model.json").read_text())
    (run / "student" / "model.json").write_text(json.dumps({**described,
                                                            "arch": f"{NAME}:probabilities"}))
    assert main([*argv, "--queries", "0", "--arch", "cnn"]) == 0
    assert json.loads((run / "student" / "model.json").read_text())["arch"] == "cnn"
    assert spent() == charged
    # the same network, its layers changed since (as a mended one's may be): trained afresh,
    # with one warning, rather than refused for weights it needed only to continue from
    described = json.loads((run / "student" / "model.json").read_text())
    (run / "student" / "model.json").write_text(json.dumps({**described, "arch": ARCH}))
    capsys.readouterr()
    assert main([*argv, "--queries", "0", "--arch", ARCH]) == 0
    err = capsys.readouterr().err
    assert "builds other layers than these weights were saved from" in err, err
    assert "the student is trained afresh" in err
    assert spent() == charged


def test_pate_run_builds_the_network_before_the_run_directory(tmp_path, capsys) -> None:
    config = tmp_path / "bad.toml"
    config.write_text(f"""name = "bad"
[data]
dataset = "digits"
[teachers]
count = 5
[aggregator]
threshold = 3
sigma1 = 1
sigma2 = 1
budget_epsilon = 50
delta = 1e-5
[student]
method = "supervised"
arch = "{NAME}:too_wide"
""")
    assert main(["run", str(config), "--run", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"pate: error: student.arch '{NAME}:too_wide': its forward returns shape [2, 13] for a "
        "batch of 2; expected [2, 10]")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("method", ["supervised", "vat"])
def test_user_arch_trains_saves_and_loads(digits: Dataset, tmp_path, method: str) -> None:
    seed_everything(0)
    config = MethodConfig(method, ARCH)
    spec = config.spec(digits.train_x.shape[1:], digits.num_classes)
    model = build_classifier(spec)
    pick = np.random.default_rng(0).choice(len(digits.train_y), 200, replace=False)
    fit(build_learner(config, model, spec), digits.train_x[pick], digits.train_y[pick],
        digits.train_x, FitConfig(epochs=3))
    assert accuracy(model, digits.test_x, digits.test_y) > 0.7

    save_model(model, spec, tmp_path)
    assert json.loads((tmp_path / "model.json").read_text())["arch"] == ARCH
    loaded = load_classifier(tmp_path)
    assert loaded is not None and loaded[1] == spec
    np.testing.assert_array_equal(predict_proba(loaded[0], digits.test_x),
                                  predict_proba(model, digits.test_x))
    # a factory that builds other layers than the weights were saved from (its code edited
    # since, here another factory named in its place): said so, not only "damaged"
    described = json.loads((tmp_path / "model.json").read_text())
    (tmp_path / "model.json").write_text(json.dumps({**described, "arch": f"{NAME}:probabilities"}))
    with pytest.raises(UserError, match=rf"{NAME}:probabilities builds other layers than these "
                                        r"weights were saved from"), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # it returns probabilities: warned of, not at issue
        load_classifier(tmp_path)
