"""A user's own teacher network by import path (teachers.user_models): resolved from the working
directory with one-line errors, trained vectorised when vmap maps it (the same teachers as one by
one) and one teacher at a time after one warning line when it does not, voting either way, and
shipped to real Ray workers from a module that is not installed."""

from __future__ import annotations

import importlib
import re
import sys
import textwrap
import warnings

import numpy as np
import pytest
import ray
import torch

from pate.cli.main import main
from pate.config import TeachersConfig
from pate.errors import UserError
from teachers import checkpoints
from teachers.distributed import Cluster, TrainJob, train_teachers
from teachers.ensemble import TrainConfig, train_group, train_one
from teachers.models import build_model, initial_state
from teachers.nonprivate import train_nonprivate
from teachers.partition import make_partition
from teachers.user_models import (
    build_user_model,
    load_state,
    module_state,
    ray_runtime_env,
)
from teachers.votes import Ensemble, load_ensemble

NETS = textwrap.dedent('''
    import math

    import torch
    from torch import nn


    class Gain(nn.Module):
        """A parameter of a layer no built-in initialisation rule knows."""

        def __init__(self, n):
            super().__init__()
            self.gain = nn.Parameter(1 + 0.1 * torch.randn(n))

        def forward(self, x):
            return x * self.gain


    def functional(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 24, bias=False),
                             nn.BatchNorm1d(24), nn.ReLU(), Gain(24), nn.Linear(24, num_classes))


    class Branchy(nn.Module):
        """Dropout, and a branch on a tensor's value: vmap maps neither."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.body = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 24),
                                      nn.ReLU(), nn.Dropout(0.2), nn.Linear(24, num_classes))

        def forward(self, x):
            h = self.body(x)
            return h if bool(torch.isfinite(h).all()) else torch.zeros_like(h)


    def not_a_module(input_shape, num_classes):
        return 42


    def seven_logits(input_shape, num_classes):
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), 7))


    def broken(input_shape, num_classes):
        raise ValueError("no such\\nshape")


    class FailsInTraining(nn.Module):
        """Builds and predicts, then fails once it trains (a user's bug, out of memory)."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.out = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))

        steps = 0

        def forward(self, x):
            if self.training:
                type(self).steps += 1
                if type(self).steps > 20:  # past the checks' few calls, into training
                    raise RuntimeError("patient 17's row")  # a message not to be shown
            return self.out(x)


    class FailsOnBigBatches(nn.Module):
        """Trains on the teachers' batches, fails on larger ones, quoting a row."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.out = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))

        def forward(self, x):
            if self.training and len(x) > 16:
                raise ValueError(f"bad row {x[0].flatten()[:3].tolist()}")  # not to be shown
            return self.out(x)


    class AlwaysFailsInTraining(nn.Module):
        """Predicts, and fails in training mode on any batch (a user's bug)."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.out = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))

        def forward(self, x):
            if self.training:
                raise NotImplementedError("training mode")
            return self.out(x)


    class NoRoomToTrain(nn.Module):
        """Predicts on two rows; in training mode on more, asks for 4 TiB: out of memory."""

        def __init__(self, input_shape, num_classes):
            super().__init__()
            self.out = nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))

        def forward(self, x):
            if self.training and len(x) > 2:
                torch.empty(2 ** 40)
            return self.out(x)


    BUILT = [0]


    def no_room_for_teachers(input_shape, num_classes):
        """Built twice (the probes of one network); the teachers' own copies find no memory,
        as those of a network too large for this machine's memory twice over would."""
        BUILT[0] += 1
        if BUILT[0] > 2:
            torch.empty(2 ** 40)
        return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), num_classes))


    NOT_CALLABLE = 3
''')
NAME = "user_nets_teachers"
MODEL = f"{NAME}:functional"
SETTINGS = {"epochs": 1, "batch_size": 16, "lr": 3e-3, "seed": 4}


@pytest.fixture(scope="module", autouse=True)
def nets(tmp_path_factory):
    """The module ``user_nets_teachers`` in a folder on sys.path (not installed)."""
    folder = tmp_path_factory.mktemp("nets")
    (folder / f"{NAME}.py").write_text(NETS)
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(folder))
        yield folder


@pytest.fixture(scope="module")
def data(digits):
    part = make_partition(len(digits.train_y), 8, SETTINGS["seed"])
    return (torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y), part,
            int(part.sizes.min()))


def _one_line(exc: pytest.ExceptionInfo) -> str:
    message = str(exc.value)
    assert "\n" not in message
    return message


def test_import_path_is_resolved_from_the_working_directory(tmp_path, monkeypatch):
    (tmp_path / "user_nets_cwd.py").write_text(NETS)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(tmp_path))])
    monkeypatch.chdir(tmp_path)
    model = build_model("user_nets_cwd:functional", (1, 8, 8), 10)
    assert isinstance(model, torch.nn.Module) and model(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


@pytest.mark.parametrize(("name", "message"), [
    ("nosuch_pkg.nets:f", "model 'nosuch_pkg.nets:f': cannot import nosuch_pkg.nets "
                          "(ModuleNotFoundError"),
    (f"{NAME}:missing", f"{NAME} has no attribute missing"),
    (f"{NAME}:NOT_CALLABLE", "NOT_CALLABLE is not callable"),
    (f"{NAME}:not_a_module", "the factory returned int, not a torch.nn.Module"),
    (f"{NAME}:broken", "the factory failed for input shape (1, 8, 8) and 10 classes "
                       "(ValueError: no such shape)"),
    ("cnn-big", "'cnn-big' is neither one of cnn, cnn-pool, "),
    # a module named as one of the project's packages cannot replace it: said so, not "run
    # from the folder that holds it"
    ("teachers.mine:f", "cannot import teachers.mine (ModuleNotFoundError: No module named "
                        "'teachers.mine') (teachers is a package of this project, which a "
                        "module of yours of that name cannot replace: give yours another name)"),
    ("student:make", "student has no attribute make (student is a package of this project"),
])
def test_bad_models_are_one_line_errors(name, message):
    with pytest.raises(UserError) as exc:
        build_user_model(name, (1, 8, 8), 10) if ":" in name else build_model(name, (1, 8, 8),
                                                                              10)
    assert message in _one_line(exc)


def test_config_and_train_config_check_the_name():
    with pytest.raises(UserError) as exc:
        TrainConfig(model="nosuch_pkg:f")
    assert "cannot import nosuch_pkg (ModuleNotFoundError" in _one_line(exc)
    with pytest.raises(UserError, match="neither one of"):
        TrainConfig(model="a.b")
    assert TeachersConfig(model=MODEL).model == MODEL
    with pytest.raises(ValueError, match="neither one of cnn"):
        TeachersConfig(model="mymodels.py")


def test_cli_bad_import_path_is_one_error_line(tmp_path, capsys):
    argv = ["teachers", "train", "--run", str(tmp_path / "run"), "--dataset", "digits",
            "--model", "nosuch_pkg.nets:f"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["pate: error: model 'nosuch_pkg.nets:f': cannot import nosuch_pkg.nets "
                   "(ModuleNotFoundError: No module named 'nosuch_pkg'); run from the folder "
                   "that holds it, or add that folder to PYTHONPATH (only pate run looks "
                   "beside its config file)"]


@pytest.mark.parametrize("factory", ["broken", "not_a_module", "seven_logits"])
def test_a_network_that_cannot_be_built_writes_nothing(tmp_path, capsys, factory):
    """Probed before the partition is recorded: no run directory is left to refuse the
    mended command."""
    argv = ["teachers", "train", "--run", str(tmp_path / "run"), "--dataset", "digits",
            "--teachers", "4", "--model", f"{NAME}:{factory}"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pate: error: model '{NAME}:{factory}': ")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("factory", "said"), [
    ("NoRoomToTrain", "cannot train on batches of 16 row(s) (out of memory: RuntimeError: "),
    ("no_room_for_teachers", "the factory failed for input shape (1, 8, 8) and 10 classes (out "
                             "of memory: RuntimeError: "),
])
def test_a_network_too_large_for_memory_is_said_so_before_the_partition(tmp_path, capsys,
                                                                         factory, said):
    """Out of memory in the probes, or in the teachers' first two copies: one line that says
    so, and no partition recorded that would refuse the mended command's other settings."""
    argv = ["teachers", "train", "--run", str(tmp_path / "run"), "--dataset", "digits",
            "--teachers", "4", "--model", f"{NAME}:{factory}", "--batch-size", "16"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"pate: error: model '{NAME}:{factory}'"), err
    assert said in err[0] and "can't allocate memory" in err[0], err
    assert err[0].endswith(("a smaller batch size or network", "(Cannot allocate memory))"))
    assert not (tmp_path / "run" / "partition.json").exists()


def test_batch_norm_on_batches_of_one_row_is_refused_before_training(tmp_path, capsys, digits):
    """Batch normalisation cannot train on one row ("expected more than 1 value per channel"):
    said in one line before anything is written, from the CLI and from Python."""
    from pate.api import Teachers

    argv = ["teachers", "train", "--run", str(tmp_path / "run"), "--dataset", "digits",
            "--teachers", "4", "--model", MODEL, "--batch-size", "1"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(
        f"pate: error: model '{MODEL}' cannot train on batches of 1 row(s) (ValueError: "), err
    assert err[0].endswith("a larger batch size")
    assert not (tmp_path / "run").exists()
    with pytest.raises(UserError, match="cannot train on batches of 1 row"):
        Teachers(4, 10, model=MODEL, batch_size=1, epochs=1).fit(digits.train_x, digits.train_y)
    Teachers(4, 10, model=MODEL, batch_size=2, epochs=1).fit(digits.train_x[:80],
                                                             digits.train_y[:80])


def test_user_init_depends_only_on_seed_and_teacher():
    name = MODEL
    base = build_model(name, (1, 8, 8), 10)
    group = initial_state(name, base, (1, 8, 8), 10, np.array([0, 1, 2]), 4)
    alone = initial_state(name, base, (1, 8, 8), 10, np.array([2]), 4)
    other = initial_state(name, base, (1, 8, 8), 10, np.array([2]), 5)
    assert set(group) == set(module_state(base))  # parameters and buffers
    assert all(torch.equal(group[k][2], alone[k][0]) for k in group)
    assert not torch.equal(group["4.gain"][0], group["4.gain"][1])
    assert not torch.equal(alone["4.gain"][0], other["4.gain"][0])


def test_functional_user_model_trains_vectorised_like_one_by_one(data):
    x, y, part, min_size = data
    cfg = TrainConfig(model=MODEL, **SETTINGS)
    ids = [0, 1]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the vectorised path: no warning
        group = train_group(cfg, x, y, 10, np.array(ids), part.parts(ids), min_size)
    assert group["2.running_mean"].shape == (2, 24)  # each teacher's own BatchNorm statistics
    ens = Ensemble(MODEL, (1, 8, 8), 10, [group])
    assert not ens._one_at_a_time
    with torch.no_grad():
        logits = ens._forward(group, ens.inputs(x[:100]))
    for k, t in enumerate(ids):
        alone = train_one(cfg, x, y, 10, t, part.parts([t])[0], min_size)
        for name, value in module_state(alone).items():
            torch.testing.assert_close(group[name][k], value, rtol=1e-4, atol=1e-5)
        with torch.no_grad():
            torch.testing.assert_close(logits[k], alone.eval()(x[:100]), rtol=1e-3, atol=1e-3)


def test_a_user_model_of_unequal_partitions_trains_on_one_stack_like_one_by_one(data):
    """Teachers taking different numbers of steps (as dealt by record or key) share one
    stack; each teacher's parameters and BatchNorm statistics are its own as if alone."""
    x, y, part, _ = data
    cfg = TrainConfig(model=MODEL, **SETTINGS)
    parts = [part.parts([0])[0], np.concatenate(part.parts([1, 2])), part.parts([3])[0][:60]]
    rows = np.array([len(p) for p in parts])
    group = train_group(cfg, x, y, 10, np.array([0, 1, 2]), parts, rows)
    for k in range(3):
        alone = train_one(cfg, x, y, 10, k, parts[k], int(rows[k]))
        for name, value in module_state(alone).items():
            torch.testing.assert_close(group[name][k], value, rtol=1e-4, atol=1e-5)


def _per_teacher_votes(name: str, shards: list[dict[str, torch.Tensor]], x: torch.Tensor
                       ) -> np.ndarray:
    """The vote histogram from every teacher's own module, one at a time."""
    labels = []
    for shard in shards:
        for t in range(next(iter(shard.values())).shape[0]):
            model = build_user_model(name, (1, 8, 8), 10)
            load_state(model, shard, t)
            with torch.no_grad():
                labels.append(model.eval()(x).argmax(1))
    return torch.nn.functional.one_hot(torch.stack(labels), 10).sum(0).numpy()


def test_unmappable_user_model_falls_back_with_one_warning(data, digits):
    x, y, part, min_size = data
    cfg = TrainConfig(model=f"{NAME}:Branchy", **SETTINGS)
    ids = [0, 1]
    with pytest.warns(UserWarning) as caught:
        group = train_group(cfg, x, y, 10, np.array(ids), part.parts(ids), min_size)
    assert len(caught) == 1
    assert re.fullmatch(rf"model '{NAME}:Branchy' does not run under torch\.func\.vmap "
                        r"\(RuntimeError: vmap: [^\n]*random[^\n]*\); training its teachers "
                        r"one at a time \(slower\)", str(caught[0].message))
    alone = train_one(cfg, x, y, 10, 1, part.parts([1])[0], min_size)
    assert all(torch.equal(group[k][1], v) for k, v in module_state(alone).items())
    assert not torch.equal(group["body.1.weight"][0], group["body.1.weight"][1])

    with pytest.warns(UserWarning, match="voting with its teachers one at a time") as caught:
        ens = Ensemble(cfg.model, (1, 8, 8), 10, [group, group])
    assert len(caught) == 1 and ens._one_at_a_time and ens.num_teachers == 4
    test_x = digits.test_x[:120]
    np.testing.assert_array_equal(ens.vote(test_x, batch_size=50),
                                  _per_teacher_votes(cfg.model, [group, group],
                                                     torch.as_tensor(test_x)))


def test_a_wrong_number_of_outputs_is_named_as_such(data):
    """A network of 7 logits for 10 classes: the probe says so, rather than that its forward
    failed (the probe's reshape used to fail first)."""
    x, y, part, min_size = data
    cfg = TrainConfig(model=f"{NAME}:seven_logits", **SETTINGS)
    with pytest.raises(UserError) as exc:
        train_group(cfg, x, y, 10, np.array([0, 1]), part.parts([0, 1]), min_size)
    assert "its forward returns shape" in _one_line(exc) and "expected" in _one_line(exc)


def test_runtime_env_ships_only_what_the_workers_lack(nets):
    assert ray_runtime_env("cnn") is None
    assert ray_runtime_env("teachers.models:hog_linear") is None  # this project's own
    assert ray_runtime_env(MODEL) == {"py_modules": [str(nets / f"{NAME}.py")]}


def test_a_running_ray_cannot_take_a_module_that_is_not_installed(tmp_path, ray_running):
    job = TrainJob("digits", 2, 2, TrainConfig(model=MODEL, epochs=1))
    with pytest.raises(UserError, match=r"Ray is already running in this process and cannot "
                                        rf"ship the model's package .*{NAME}\.py"):
        train_teachers(tmp_path / "run", job, Cluster())


def test_one_worker_trains_a_user_network_in_this_process(tmp_path, digits, ray_stopped):
    """Without Ray (one local worker): an unmappable network trains one teacher at a time with
    its one warning, and a network that fails as it trains stops the run in one line that
    names its error's class only, the shards before it kept."""
    job = TrainJob("digits", num_teachers=4, shard_size=2,
                   train=TrainConfig(model=f"{NAME}:Branchy", **SETTINGS))
    with pytest.warns(UserWarning, match="training its teachers one at a time"):
        assert train_teachers(tmp_path / "a", job, Cluster(workers=1))["trained"] == [0, 1]
    assert not ray.is_initialized()
    job = TrainJob("digits", num_teachers=4, shard_size=2,
                   train=TrainConfig(model=f"{NAME}:FailsInTraining", **SETTINGS))
    with pytest.raises(UserError) as failed, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its branch on a value: one at a time, as Branchy
        train_teachers(tmp_path / "b", job, Cluster(workers=1), only=[0])
    assert _one_line(failed) == ("shard 0 failed (RuntimeError); the shards before it are "
                                 "saved - rerun the same command to train only the missing ones")
    assert not checkpoints.read_manifest(tmp_path / "b")["shards"]
    # the non-private model of the compare stage trains the same network on all the private
    # rows: its failure is named by its class alone too
    job = TrainJob("digits", num_teachers=4, shard_size=2,
                   train=TrainConfig(model=f"{NAME}:FailsOnBigBatches", **SETTINGS))
    train_teachers(tmp_path / "c", job, Cluster(workers=1), only=[0])
    with pytest.raises(UserError, match="has no fully trained teachers"):
        load_ensemble(tmp_path / "c")
    assert load_ensemble(tmp_path / "c", partial=True).num_teachers == 2  # a benchmark's
    train_teachers(tmp_path / "c", job, Cluster(workers=1))
    with pytest.raises(UserError) as failed:
        train_nonprivate(tmp_path / "c", 1, 64, "cpu")
    assert _one_line(failed) == "the non-private model failed (ValueError)"


def test_from_python_a_network_failing_on_private_rows_is_named_by_its_class(
        digits, monkeypatch) -> None:
    """pate.api.Teachers trains in the caller's process: a failure there is one line naming its
    class, not its message (which may quote a private row), unless PATE_TRACEBACK asks for it;
    a network that fails in training mode whatever the batch is not told to take larger
    batches."""
    from pate.api import Teachers

    monkeypatch.delenv("PATE_TRACEBACK", raising=False)
    x, y = digits.train_x, digits.train_y  # 20 steps a teacher an epoch: past the checks'
    failing = Teachers(4, 10, model=f"{NAME}:FailsInTraining", epochs=2, batch_size=16)
    importlib.import_module(NAME).FailsInTraining.steps = 0  # earlier tests counted too
    with pytest.raises(UserError) as failed, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # its branch on a value: one at a time
        failing.fit(x, y)
    assert _one_line(failed) == (
        "the teachers' training on the private rows failed (RuntimeError); its message is "
        "withheld, as it may quote private rows (PATE_TRACEBACK=1 shows it, for data you may "
        "see)")
    monkeypatch.setenv("PATE_TRACEBACK", "1")
    importlib.import_module(NAME).FailsInTraining.steps = 0
    with pytest.raises(RuntimeError, match="patient 17"), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        failing.fit(x, y)
    with pytest.raises(UserError) as refused:
        Teachers(4, 10, model=f"{NAME}:AlwaysFailsInTraining", batch_size=16).fit(x, y)
    assert _one_line(refused) == (
        f"model '{NAME}:AlwaysFailsInTraining' fails in training mode (train(), on zero inputs: "
        "NotImplementedError: training mode): fix its forward in training mode")


@pytest.mark.slow  # the default suite stays under 5 minutes (docs/benchmarks.md)
def test_ray_workers_train_a_module_that_is_not_installed(tmp_path, monkeypatch, digits,
                                                          capsys, ray_stopped):
    """A package only on the driver's sys.path (not the workers', not their working directory)
    reaches them through the runtime_env; the unmappable network trains one teacher at a time
    in the workers, the driver shows the one warning line, and the CLI prints one line when the
    teachers vote."""
    package = tmp_path / "src" / "user_pkg_ray"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "nets.py").write_text(NETS)
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    name = "user_pkg_ray.nets:Branchy"
    assert ray_runtime_env(name) == {"py_modules": [str(package)]}
    cfg = TrainConfig(model=name, epochs=1, batch_size=16, seed=2)
    job = TrainJob("digits", num_teachers=4, shard_size=2, train=cfg)
    run = tmp_path / "run"
    with pytest.warns(UserWarning, match="training its teachers one at a time") as caught:
        assert train_teachers(run, job, Cluster(workers=2))["trained"] == [0, 1]
    assert len(caught) == 1
    assert not ray.is_initialized()  # the Ray it started for the job is stopped
    manifest = checkpoints.read_manifest(run)
    assert manifest["done"] and manifest["model"] == name

    capsys.readouterr()
    assert main(["teachers", "votes", "--run", str(run)]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines()
              if line.startswith("pate: warning:")]
    assert len(warned) == 1
    assert re.fullmatch(rf"pate: warning: model '{re.escape(name)}' does not run under "
                        r"torch\.func\.vmap \(RuntimeError: vmap: [^\n]*control flow[^\n]*\); "
                        r"voting with its teachers one at a time \(slower\)", warned[0])
    with np.load(run / "votes.npz") as f:
        assert (f["votes"].sum(1) == 4).all()

    part = make_partition(len(digits.train_y), 4, cfg.seed)
    alone = train_one(cfg, torch.as_tensor(digits.train_x), torch.as_tensor(digits.train_y), 10,
                      3, part.parts([3])[0], int(part.sizes.min()))
    with pytest.warns(UserWarning, match="voting with"):
        shards = load_ensemble(run).shards
    for k, v in module_state(alone).items():
        torch.testing.assert_close(shards[1][k][1], v, rtol=1e-4, atol=1e-5)


def test_a_network_whose_code_changed_is_refused_on_resume_and_when_voting(
        tmp_path, monkeypatch, ray_stopped):
    """The layers a user's factory builds are recorded with its teachers: edited since (its
    name kept), it is refused before a shard of another network joins them, and before the
    trained weights are run through the new code to vote."""
    def write(width: int) -> None:
        (tmp_path / "edited_nets.py").write_text(textwrap.dedent(f"""
            import math
            from torch import nn

            def make(input_shape, num_classes):
                return nn.Sequential(nn.Flatten(), nn.Linear(math.prod(input_shape), {width}),
                                     nn.ReLU(), nn.Linear({width}, num_classes))
            """))
        sys.modules.pop("edited_nets", None)
        importlib.invalidate_caches()

    monkeypatch.syspath_prepend(str(tmp_path))
    write(16)
    job = TrainJob("digits", num_teachers=4, shard_size=2,
                   train=TrainConfig(model="edited_nets:make", **SETTINGS))
    train_teachers(tmp_path / "run", job, Cluster(workers=1), only=[0])
    write(24)
    changed = "edited_nets:make builds other layers than this run's teachers were trained with"
    with pytest.raises(UserError, match=changed):
        train_teachers(tmp_path / "run", job, Cluster(workers=1))
    write(16)
    train_teachers(tmp_path / "run", job, Cluster(workers=1))  # the same network: resumed
    assert load_ensemble(tmp_path / "run").num_teachers == 4
    write(24)
    with pytest.raises(UserError, match="edited_nets:make builds other layers than the run's "
                                        "teachers were trained with"):
        load_ensemble(tmp_path / "run")
