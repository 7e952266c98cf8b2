"""Run configuration: presets load, TOML round-trips, and bad configs give one clear line."""

import sys
import warnings
from pathlib import Path

import numpy as np
import pytest
from pydantic import BaseModel

from pate.cli.main import main
from pate.config import dump_config, load_config, parse_config, preset_names
from pate.errors import UserError


def test_presets_load_and_round_trip() -> None:
    assert {"digits-tiny", "fashion-mnist-small", "fashion-mnist"} <= set(preset_names())
    for name in preset_names():
        config = load_config(name)
        assert config.name == name
        assert parse_config(dump_config(config), "again") == config


def test_any_string_round_trips_through_config_toml() -> None:
    """A path with quotes, backslashes, control characters, DEL or any Unicode is written as a
    TOML string that reads back the same (config.toml is read again by every rerun)."""
    config = load_config("digits-tiny")
    for text in ('we"ird\\path', "line\nbreak\ttab\x01\x7f", "é 😀"):
        odd = config.model_copy(update={"data": config.data.model_copy(
            update={"dataset": "mnist", "data_dir": text})})
        assert parse_config(dump_config(odd), "again") == odd


def test_a_folder_for_a_dataset_that_reads_none_is_refused() -> None:
    text = dump_config(load_config("digits-tiny")).replace(
        "# data_dir = (not set)", 'data_dir = "somewhere"')
    with pytest.raises(UserError, match="digits ships with scikit-learn: it reads no folder"):
        parse_config(text, "c.toml")


def test_dumped_config_names_every_key() -> None:
    """Keys left unset are written too, as comments (TOML has no null)."""
    config = load_config("digits-tiny")
    text = dump_config(config)
    for section, model in config:
        if not isinstance(model, BaseModel):
            continue
        for key, value in model:
            line = f"# {key} = (not set)" if value is None else f"{key} = "
            assert any(row.startswith(line) for row in text.splitlines()), (section, key)
    assert "# pool_size = (not set)" in text and "gpus_per_shard = 1.0" in text


@pytest.mark.parametrize("text,message", [
    ("name = 'x'\n", "aggregator: a required section, missing"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 0\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n", "aggregator.sigma1: must be greater than 0"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 2\n", "aggregator.delta"),
    ("name = 'x'\n[teachers]\ngpus_per_shard = 0\n[aggregator]\nthreshold = 1\nsigma1 = 1\n"
     "sigma2 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n",
     "teachers.gpus_per_shard: must be a number > 0"),
    ("name = 'x'\n[teachers]\ngpus_per_shard = 1.5\n[aggregator]\nthreshold = 1\nsigma1 = 1\n"
     "sigma2 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n",
     "teachers.gpus_per_shard: must be a share of one GPU (at most 1) or a whole number of GPUs"),
    ("name = 'x'\n[teachers]\ncount = 5\nbogus = 1\n[aggregator]\nthreshold = 1\nsigma1 = 1\n"
     "sigma2 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n", "teachers.bogus: no such key"),
    # a required key misspelt: the unknown key is named, not only the missing one
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsgima1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n", "aggregator.sgima1: no such key (did you mean sigma1?)"),
    ("name = 'x'\n[teacher]\ncount = 5\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n", "teacher: no such section (did you mean "
     "teachers?)"),
    ("name = 'x'\n[teachers]\ncount = 5\n[aggregator]\nthreshold = 9\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n",
     "aggregator.threshold 9 exceeds the number of teachers"),
    ("name = 'x'\n[teachers]\ncount = 5\n[aggregator]\nthreshold = 4\nsigma1 = 1\nsigma2 = 1\n"
     "interactive_threshold = 6\nbudget_epsilon = 1\ndelta = 1e-5\n",
     "aggregator.interactive_threshold 6 exceeds the number of teachers"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n[dpsgd]\nmodel = 'resnet'\n", "dpsgd.model: model must be one of"),
    # refused when the config is read, not after the teachers and the rounds' budget
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n[dpsgd]\nencode = 10\nencode_seed = -5\n",
     "dpsgd.encode_seed: must be greater than or equal to 0"),
    ("name = \n", "invalid TOML"),
    # a seed is an int64, or training would stop with an overflow after the budget is spent
    ("name = 'x'\n[student]\nseed = 9223372036854775808\n[aggregator]\nthreshold = 1\n"
     "sigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n",
     "student.seed: must be less than 9223372036854775808"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = '2'\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n", "aggregator.sigma1: must be a valid number"),
    ("name = 'x'\n[teachers]\ncount = 10.0\n[aggregator]\nthreshold = 1\nsigma1 = 1\n"
     "sigma2 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n", "teachers.count: must be a valid "
     "integer"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n[compare]\nenabled = 'yes'\n", "compare.enabled: must be a valid "
     "boolean"),
    ("name = '../escape'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n", "name: name must be a folder name"),
    ("name = \"a\\nb\"\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n", "name: name must be a folder name"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = inf\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n", "aggregator.sigma1: must be a finite number"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = inf\n"
     "delta = 1e-5\n", "aggregator.budget_epsilon: must be a finite number"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1e-300\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\n", "aggregator: sigma1 must lie in [1e-06, 1e+12]"),
    # a file's own check, said as the config's other mistakes are (the file and the section)
    ("name = 'x'\n[data]\nprivate = 'p.csv'\npublic = 'q.csv'\nlabel = 'y'\n"
     "classes = ['low', 'low', 'mid']\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n", "data: the classes ['low', 'low', 'mid'] repeat a name"),
    # config.toml is public: a secret has no place in it
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "delta = 1e-5\nledger = 'postgresql://pate:s3cret@db/ledger'\n",
     "aggregator.ledger: a password in the ledger's URL would be written to the run's config.toml"),
    # the interactive round's own key is named where it is the one at fault
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\nbudget_epsilon = 1\n"
     "interactive_sigma2 = 1e-300\ndelta = 1e-5\n",
     "aggregator: interactive_sigma2 must lie in [1e-06, 1e+12]"),
    # the config's shape in its own words (pydantic's: "Input should be a valid dictionary or
    # instance of DataConfig", "Field required")
    ("name = 'x'\ndata = 3\n[aggregator]\nthreshold = 1\nsigma1 = 1\nsigma2 = 1\n"
     "budget_epsilon = 1\ndelta = 1e-5\n",
     "data: must be a section ([name] and its keys), not a value"),
    ("name = 'x'\n[aggregator]\nthreshold = 1\nsigma1 = 1\nbudget_epsilon = 1\ndelta = 1e-5\n",
     "aggregator.sigma2: a required key, missing"),
])
def test_bad_configs(text: str, message: str) -> None:
    with pytest.raises(UserError, match="bad.toml: .*" + message.split(":")[0]) as info:
        parse_config(text, "bad.toml")
    assert message in str(info.value) and "\n" not in str(info.value)
    assert not str(info.value).startswith("bad.toml: config:")  # the key, not a placeholder


def test_older_run_directories_still_read() -> None:
    """config.toml of runs made before the compare stage: an empty [report] section, or its
    retired non_private_baseline, is dropped; any other [report] key is still an error."""
    current = dump_config(load_config("digits-tiny"))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an empty section: nothing to say
        assert parse_config(current + "[report]\n", "old.toml") == load_config("digits-tiny")
    with pytest.warns(UserWarning, match=r"old.toml: report.non_private_baseline is no longer "
                                         r"read: the compare stage measures"):
        assert parse_config(current + "[report]\nnon_private_baseline = 0.9\n",
                            "old.toml") == load_config("digits-tiny")
    with pytest.raises(UserError, match="report: no such section"):
        parse_config(current + "[report]\nsomething = 1\n", "old.toml")


def test_unknown_preset_and_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["run", "no-such-preset", "--run", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown preset 'no-such-preset'" in err[0]
    assert main(["run", str(tmp_path / "missing.toml")]) == 2
    assert "no such config file" in capsys.readouterr().err
    (tmp_path / "binary.toml").write_bytes(b"\x93NUMPY\xff\xfe")
    assert main(["run", str(tmp_path / "binary.toml"), "--run", str(tmp_path / "r")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a TOML file (not UTF-8 text)" in err[0]



def test_a_presets_name_names_the_preset_whatever_lies_in_the_working_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``pate run digits-tiny --run digits-tiny`` run again: the run directory of that name
    does not hide the preset; a file of that name is read as ``./digits-tiny``."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "digits-tiny").mkdir()
    assert load_config("digits-tiny").name == "digits-tiny"
    (tmp_path / "glyphs").write_text(dump_config(load_config("digits-tiny")).replace(
        "name = \"digits-tiny\"", "name = \"mine\""))
    with pytest.warns(UserWarning, match=r"^glyphs is the preset of that name, not the file "
                                         r"here \(\./glyphs reads the file\)$"):
        assert load_config("glyphs").name == "glyphs"
    assert load_config("./glyphs").name == "mine"


def test_the_interactive_round_takes_its_own_parameters() -> None:
    from analysis.mechanisms import (
        ConfidentGNMax,
        InteractiveGNMax,
        Mechanism,
        mechanism_to_dict,
    )
    from student.rounds import Received, round_plan

    text = ("name = 'x'\n[aggregator]\nthreshold = 200\nsigma1 = 150\nsigma2 = 40\n"
            "interactive_threshold = 250\ninteractive_sigma1 = 40\nbudget_epsilon = 9\n"
            "delta = 1e-5\n")
    config = parse_config(text, "x.toml")
    assert parse_config(dump_config(config), "again") == config
    assert config.aggregator.round_mechanism("confident") == ConfidentGNMax(200, 150, 40)
    assert config.aggregator.round_mechanism("interactive") == InteractiveGNMax(
        250, 40, 40, 0.9)  # sigma2 inherited, gamma the default
    with pytest.raises(UserError, match="confident or interactive"):
        config.aggregator.round_mechanism("gnmax")
    by_name = config.aggregator.round_mechanism  # a round that recorded only its name

    def mechanism(record: dict) -> Mechanism:
        received = Received(np.arange(3), np.zeros(3, np.int64), np.ones(3, np.int8))
        return round_plan([{"mechanism": record, "queries": 3}], received, by_name)[0][0]

    p = mechanism({"mechanism": "interactive"})
    assert (p.threshold, p.sigma1, p.sigma2, p.gamma) == (250, 40, 40, 0.9)
    recorded = {"mechanism": "gnmax", "sigma": 30.0}  # a round that recorded its parameters
    assert mechanism_to_dict(mechanism(recorded)) == recorded
    with pytest.raises(UserError, match=r"rounds\.json: scale is not taken by mechanism gnmax"):
        mechanism({**recorded, "scale": 1.0})


def test_the_teacher_architectures_are_named_alike_everywhere() -> None:
    from pate.config import TeachersConfig
    from teachers.choices import MODELS
    from teachers.models import ARCHITECTURES

    assert set(MODELS) == set(ARCHITECTURES)
    assert [TeachersConfig(model=name).model for name in MODELS] == list(MODELS)
    assert TeachersConfig(model="mypkg.nets:factory").model == "mypkg.nets:factory"  # the form
    with pytest.raises(ValueError, match="neither one of cnn, cnn-pool"):
        TeachersConfig(model="cnn-big")


def test_the_student_architectures_are_named_alike_everywhere() -> None:
    from pate.config import StudentConfig
    from student.choices import ARCHITECTURES

    assert [StudentConfig(arch=name).arch for name in ARCHITECTURES] == list(ARCHITECTURES)
    assert StudentConfig().arch is None
    with pytest.raises(ValueError, match="neither one of cnn, cnn-hog"):
        StudentConfig(arch="resnet")


def test_the_dpsgd_networks_are_named_alike_everywhere() -> None:
    from pate.comparison import dpsgd_settings
    from pate.config import DPSGDConfig, RunConfig
    from student.choices import DPSGD_MODELS

    base = {"name": "x", "aggregator": {"threshold": 1, "sigma1": 1, "sigma2": 1,
                                        "budget_epsilon": 1, "delta": 1e-5}}
    for name in DPSGD_MODELS:
        config = RunConfig(**base, dpsgd=DPSGDConfig(model=name))
        assert dpsgd_settings(config, 2.0)[0].model == name


def test_the_student_section_reaches_the_student_workflow() -> None:
    from dataclasses import fields

    from pate.config import StudentConfig
    from pate.pipeline import _student_options
    from student.options import StudentOptions

    head = ("name = 'x'\n[aggregator]\nthreshold = 200\nsigma1 = 150\nsigma2 = 40\n"
            "budget_epsilon = 9\ndelta = 1e-5\n[student]\nepochs = 7\nvat_eps = 3.5\n")
    for extra, arch in (("", None), ("arch = 'cnn-hog'\n", "cnn-hog")):
        config = parse_config(head + extra, "x.toml")
        options = _student_options(config, 123)
        assert (options.arch, options.epochs, options.method, options.queries,
                options.vat_eps) == (arch, 7, "vat", 123, 3.5)
    # every key of [student] but the rounds' sizes is an option of the workflow, same value
    keys = set(StudentConfig.model_fields) - {"queries", "active_queries", "interactive_queries"}
    assert keys <= {f.name for f in fields(StudentOptions)}
    assert all(getattr(options, k) == getattr(config.student, k) for k in keys)
    with pytest.raises(UserError, match=r"student\.arch"):
        parse_config(head + "arch = 'resnet'\n", "x.toml")


def test_a_network_module_beside_the_config_file_is_found(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``[teachers] model = "module:factory"`` is looked for in the working directory, then in
    the config file's folder, where its data paths are resolved too."""
    from teachers.user_models import load_factory

    folder = tmp_path / "project"
    folder.mkdir()
    (folder / "nets_beside_config.py").write_text(
        "from torch import nn\n\n\ndef small(input_shape, num_classes):\n"
        "    return nn.Linear(input_shape[-1], num_classes)\n")
    config = folder / "my.toml"
    config.write_text(dump_config(load_config("digits-tiny")).replace(
        "[teachers]\n", '[teachers]\nmodel = "nets_beside_config:small"\n', 1))
    monkeypatch.chdir(tmp_path)  # run from the parent folder
    monkeypatch.setattr(sys, "path", list(sys.path))  # restored after the test
    assert load_config(str(config)).teachers.model == "nets_beside_config:small"
    assert callable(load_factory("nets_beside_config:small"))


def test_a_config_written_with_a_byte_order_mark_is_read(tmp_path: Path) -> None:
    """Some editors begin a UTF-8 file with one: TOML's "Invalid statement" at line 1 before."""
    config = tmp_path / "bom.toml"
    config.write_bytes(b"\xef\xbb\xbf" + dump_config(load_config("digits-tiny")).encode())
    assert load_config(str(config)) == load_config("digits-tiny")
