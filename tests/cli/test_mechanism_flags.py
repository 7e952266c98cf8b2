"""The mechanism flags, generated from ``analysis.mechanisms`` (``pate.cli.mechanism_flags``)."""

from __future__ import annotations

import argparse

import pytest

from analysis.mechanisms import (
    MECHANISMS,
    ConfidentGNMax,
    InteractiveGNMax,
    mechanism_to_dict,
    parameters,
)
from pate.cli.main import build_parser
from pate.cli.mechanism_flags import (
    add_mechanism_flags,
    given_parameters,
    mechanism_from_flags,
)
from pate.errors import UserError

# The flags ``pate serve`` and ``pate student train`` took before they were generated.
OLD_FLAGS = {
    "--scale": "LNMax: Laplace scale b (each answer is pure 2/b-DP)",
    "--sigma": "GNMax: std of the Gaussian noise",
    "--threshold": "Confident/Interactive: threshold T",
    "--sigma1": "Confident/Interactive: threshold-step noise",
    "--sigma2": "Confident/Interactive: GNMax-step noise",
    "--gamma": "Interactive: answer with the student's own label when its top probability "
               "exceeds gamma",
}


def flags(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.option_strings[0]: a for a in parser._actions if a.option_strings}


def parser_of(*, costed_only: bool = False) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    add_mechanism_flags(parser, costed_only=costed_only)
    return parser


def test_the_generated_flags_are_the_old_ones() -> None:
    got = flags(parser_of())
    assert list(got) == ["-h", "--mechanism", *OLD_FLAGS]
    assert got["--mechanism"].required and got["--mechanism"].choices == (
        "lnmax", "gnmax", "confident", "interactive")
    for name, text in OLD_FLAGS.items():
        assert got[name].help == text and got[name].type is float and got[name].default is None
    # pate analyze: the same, less the parameters that do not enter the cost (gamma)
    assert list(flags(parser_of(costed_only=True))) == [
        "-h", "--mechanism", "--scale", "--sigma", "--threshold", "--sigma1", "--sigma2"]


def test_the_registry_drives_the_commands() -> None:
    """A mechanism added to ``MECHANISMS`` appears in every command's choices and flags."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    commands = {"serve": sub.choices["serve"], "analyze": sub.choices["analyze"],
                "student train": next(
                    a for a in sub.choices["student"]._actions
                    if isinstance(a, argparse._SubParsersAction)).choices["train"]}
    names = {f"--{f.name}" for cls in MECHANISMS.values() for f in parameters(cls)}
    for command, parser in commands.items():
        got = flags(parser)
        assert got["--mechanism"].choices == tuple(MECHANISMS), command
        costed = names - ({"--gamma"} if command == "analyze" else set())
        assert costed <= set(got), command


def test_flags_parse_through_the_record() -> None:
    parser = parser_of()
    args = parser.parse_args(["--mechanism", "confident", "--threshold", "200", "--sigma1",
                              "150", "--sigma2", "40"])
    assert mechanism_from_flags(args) == ConfidentGNMax(200.0, 150.0, 40.0)
    assert mechanism_to_dict(mechanism_from_flags(args)) == {
        "mechanism": "confident", "threshold": 200.0, "sigma1": 150.0, "sigma2": 40.0}
    assert given_parameters(args) == ["--threshold", "--sigma1", "--sigma2"]
    with pytest.raises(UserError, match="--sigma is not taken by mechanism lnmax"):
        mechanism_from_flags(parser.parse_args(["--mechanism", "lnmax", "--scale", "1",
                                                "--sigma", "2"]))
    with pytest.raises(UserError, match="--gamma must be given: mechanism interactive needs it"):
        mechanism_from_flags(parser.parse_args(["--mechanism", "interactive", "--threshold",
                                                "1", "--sigma1", "1", "--sigma2", "1"]))
    with pytest.raises(UserError, match="--sigma must be > 0"):
        mechanism_from_flags(parser.parse_args(["--mechanism", "gnmax", "--sigma", "0"]))


def test_the_analysis_takes_interactive_without_gamma() -> None:
    args = parser_of(costed_only=True).parse_args(
        ["--mechanism", "interactive", "--threshold", "1", "--sigma1", "2", "--sigma2", "3"])
    assert mechanism_from_flags(args, costed_only=True) == InteractiveGNMax(1.0, 2.0, 3.0, 1.0)
