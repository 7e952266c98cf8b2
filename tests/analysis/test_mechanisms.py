"""Mechanisms as data (``analysis.mechanisms``): validated once, one record format."""

from __future__ import annotations

import json
import math
import pickle
from dataclasses import FrozenInstanceError

import pytest

from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    GNMax,
    InteractiveGNMax,
    LNMax,
    ParameterError,
    mechanism_from_dict,
    mechanism_to_dict,
    parameters,
)

EXAMPLES = [LNMax(20.0), GNMax(40.0), ConfidentGNMax(200.0, 150.0, 40.0),
            InteractiveGNMax(250.0, 40.0, 40.0, 0.9)]


def test_the_registry_names_every_mechanism_once() -> None:
    assert list(MECHANISMS) == ["lnmax", "gnmax", "confident", "interactive"]
    assert {type(m) for m in EXAMPLES} == set(MECHANISMS.values())
    assert all(cls.name == name for name, cls in MECHANISMS.items())
    assert [cls.title for cls in MECHANISMS.values()] == [
        "LNMax", "GNMax", "Confident-GNMax", "Interactive-GNMax"]
    assert [[f.name for f in parameters(cls)] for cls in MECHANISMS.values()] == [
        ["scale"], ["sigma"], ["threshold", "sigma1", "sigma2"],
        ["threshold", "sigma1", "sigma2", "gamma"]]


@pytest.mark.parametrize("mechanism", EXAMPLES, ids=lambda m: m.name)
def test_records_round_trip(mechanism) -> None:
    record = mechanism_to_dict(mechanism)
    assert record["mechanism"] == mechanism.name
    assert mechanism_from_dict(record) == mechanism
    assert mechanism_from_dict(json.loads(json.dumps(record))) == mechanism  # JSON
    with pytest.raises(FrozenInstanceError):
        mechanism.threshold = 1.0  # type: ignore[misc, union-attr]


def test_the_record_is_the_public_one() -> None:
    """The form ``rounds.json`` and the ledger have always held (``sort_keys`` JSON is the
    ledger's replay identity), parameters as floats whatever the input."""
    assert mechanism_to_dict(ConfidentGNMax(200, 150, 40)) == {
        "mechanism": "confident", "threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0}
    assert json.dumps(mechanism_to_dict(InteractiveGNMax(1, 2, 3, 1)), sort_keys=True) == (
        '{"gamma": 1.0, "mechanism": "interactive", "sigma1": 2.0, "sigma2": 3.0, '
        '"threshold": 1.0}')
    assert type(GNMax(10).sigma) is float
    assert ConfidentGNMax(0, 1.0, 1.0).threshold == 0.0  # T may be any number >= 0


@pytest.mark.parametrize(("record", "match"), [
    ({"mechanism": "gnmax"}, "^sigma must be given: mechanism gnmax needs it$"),
    ({"mechanism": "gnmax", "sigma": None}, "^sigma must be given"),
    ({"mechanism": "gnmax", "sigma": 0.0}, "^sigma must be > 0, got 0.0$"),
    ({"mechanism": "confident", "threshold": 1, "sigma1": -1, "sigma2": 1}, "^sigma1 must be > 0"),
    ({"mechanism": "lnmax", "scale": float("nan")}, "^scale must be finite"),
    ({"mechanism": "gnmax", "sigma": 1e-300}, r"^sigma must lie in \[1e-06, 1e\+12\]"),
    ({"mechanism": "confident", "threshold": 1, "sigma1": 1, "sigma2": 1e300},
     "^sigma2 must lie in"),
    ({"mechanism": "confident", "threshold": math.inf, "sigma1": 1, "sigma2": 1},
     "^threshold must be finite"),
    ({"mechanism": "confident", "threshold": -5, "sigma1": 1, "sigma2": 1},
     "^threshold must be >= 0, got -5$"),
    ({"mechanism": "interactive", "threshold": 1, "sigma1": 1, "sigma2": 1, "gamma": 2},
     r"^gamma must be a probability in \[0, 1\], got 2"),
    ({"mechanism": "interactive", "threshold": 1, "sigma1": 1, "sigma2": 1},
     "^gamma must be given"),
    ({"mechanism": "confident", "threshold": 1}, "^sigma1, sigma2 must be given: .* needs them$"),
    ({"mechanism": "median"}, "mechanism must be one of lnmax, gnmax, confident, interactive"),
    ({"scale": 1.0}, "mechanism must be one of"),
    ({"mechanism": "lnmax", "scale": 1.0, "sigma": 2.0},
     "^sigma is not taken by mechanism lnmax$"),
    ({"mechanism": "gnmax", "sigma": "40"}, "^sigma must be a number"),
    ({"mechanism": "gnmax", "sigma": True}, "^sigma must be a number"),
])
def test_bad_records_are_refused(record: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        mechanism_from_dict(record)


def test_a_parameter_error_names_its_parameters_as_the_caller_does() -> None:
    """Bare, as a Python caller's keywords (``ConfidentGNMax(sigma1=0, ...)``); the command
    line names them as its flags."""
    with pytest.raises(ParameterError) as caught:
        mechanism_from_dict({"mechanism": "gnmax", "sigma": 1.0, "scale": 2, "gamma": 0.5})
    assert caught.value.names == ("scale", "gamma")
    assert str(caught.value) == "scale, gamma are not taken by mechanism gnmax"
    assert caught.value.named("--") == "--scale, --gamma are not taken by mechanism gnmax"
    again = pickle.loads(pickle.dumps(caught.value))
    assert (again.names, str(again)) == (caught.value.names, str(caught.value))


def test_construction_validates_too() -> None:
    with pytest.raises(ValueError, match="> 0"):
        GNMax(0.0)
    with pytest.raises(ValueError, match="gamma"):
        InteractiveGNMax(1.0, 1.0, 1.0, -0.1)
    assert InteractiveGNMax(1.0, 1.0, 1.0, 0.0).gamma == 0.0  # gamma = 0 and 1 are allowed
