"""A setting left out gets the same value wherever it is left out: the library's dataclasses,
the command line, the config file and the Python API read one record per stage
(``teachers.defaults``, ``student.defaults``)."""

from __future__ import annotations

import argparse
import inspect
from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import Any

import pytest
from pydantic import BaseModel

from pate.api import Student, Teachers
from pate.api_dpsgd import DPSGD as DPSGDModel
from pate.cli.main import build_parser
from pate.config import DPSGDConfig as DPSGDSection
from pate.config import StudentConfig, TeachersConfig
from student.defaults import DPSGD, STUDENT
from student.dpsgd import DPSGDConfig
from student.options import StudentOptions
from student.training import FitConfig, MethodConfig
from teachers.defaults import TEACHERS
from teachers.ensemble import TrainConfig


def _dataclass_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in fields(cls)}


def _section_defaults(section: type[BaseModel]) -> dict[str, Any]:
    return {name: f.default for name, f in section.model_fields.items()}


def _signature_defaults(function: Callable[..., Any]) -> dict[str, Any]:
    return {name: p.default for name, p in inspect.signature(function).parameters.items()}


def _command(*command: str) -> argparse.ArgumentParser:
    parser = build_parser(list(command))
    for name in command:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[name]
    return parser


def _flag_defaults(*command: str) -> dict[str, Any]:
    return {a.dest: a.default for a in _command(*command)._actions}


def _agree(record: object, places: Mapping[str, Mapping[str, Any]],
           renamed: Mapping[str, str] = {}) -> None:
    """Every setting of ``record`` that a place has (by its name there) defaults to the
    record's value, or to None where the library fills it in (``train_config_for``), and each
    place has at least one of them."""
    for place, defaults in places.items():
        shared = [f.name for f in fields(record) if renamed.get(f.name, f.name) in defaults]
        assert shared, place
        for name in shared:
            assert defaults[renamed.get(name, name)] in (getattr(record, name), None), (
                place, name)


def test_the_teachers_settings_default_alike_everywhere() -> None:
    _agree(TEACHERS, {"TrainConfig": _dataclass_defaults(TrainConfig),
                      "[teachers]": _section_defaults(TeachersConfig),
                      "Teachers": _signature_defaults(Teachers)})
    _agree(TEACHERS, {"pate teachers train": _flag_defaults("teachers", "train")},
           renamed={"count": "teachers"})
    # the flags the library resolves (None) say its default in their help
    help_text = _command("teachers", "train").format_help()
    assert all(f"default: {v}" in help_text for v in ("20", "8", "0.006"))


def test_the_students_settings_default_alike_everywhere() -> None:
    _agree(STUDENT, {"FitConfig": _dataclass_defaults(FitConfig),
                     "MethodConfig": _dataclass_defaults(MethodConfig),
                     "StudentOptions": _dataclass_defaults(StudentOptions),
                     "[student]": _section_defaults(StudentConfig),
                     "Student": _signature_defaults(Student),
                     "PrivateLabels.ask": {"request_size": inspect.signature(
                         _ask()).parameters["request_size"].default},
                     "pate student train": _flag_defaults("student", "train")})


def test_dpsgds_settings_default_alike_everywhere() -> None:
    _agree(DPSGD, {"DPSGDConfig": _dataclass_defaults(DPSGDConfig),
                   "[dpsgd]": _section_defaults(DPSGDSection),
                   "DPSGD": _signature_defaults(DPSGDModel),
                   "pate dpsgd train": _flag_defaults("dpsgd", "train")})
    assert DPSGDConfig.expected_batch_size == DPSGD.batch_size  # the library's own name


def _ask() -> Callable[..., Any]:
    from pate.api import PrivateLabels

    return PrivateLabels.ask


@pytest.mark.parametrize("record", [TEACHERS, STUDENT, DPSGD])
def test_a_default_record_is_frozen(record: object) -> None:
    with pytest.raises(AttributeError):
        record.epochs = 1  # type: ignore[attr-defined]


def test_the_retrain_hint_gives_the_flags_of_the_run_s_student() -> None:
    """A finished run refuses new [student] settings and names the command that trains its
    student again: its flags, parsed by the real parser, give back every training setting,
    left-out ones included (the command's defaults are not the run's)."""
    student = StudentConfig(method="supervised", arch="cnn-hog-scatter", epochs=20, lr=2e-3,
                            entmin=True, seed=3, augment="shift")
    flags = student.retrain_flags().split()
    assert flags[:2] == ["--method", "supervised"] and "--entmin" in flags
    args = build_parser(["student", "train"]).parse_args(
        ["student", "train", "--run", "r", "--queries", "0", *flags])
    for name in ("method", "arch", "width", "epochs", "batch_size", "unlabelled_batch_size",
                 "lr", "augment", "balance_classes", "vat_eps", "entmin", "encoder_epochs",
                 "seed", "device"):
        assert getattr(args, name) == getattr(student, name), name
    assert StudentConfig(method="vat").retrain_flags() == "--method vat"
