"""The command line's mechanism flags (``--mechanism``, ``--scale``, ``--sigma``, ...), generated
from the mechanisms of ``analysis.mechanisms``: one flag per parameter name, its help text from
the parameter's metadata, and parsing through ``mechanism_from_dict`` (docs/cli.md)."""

from __future__ import annotations

import argparse

from analysis.mechanisms import (
    MECHANISMS,
    Mechanism,
    ParameterError,
    mechanism_from_dict,
    parameters,
)
from pate.errors import UserError

GROUP_TITLE = "aggregator (PATE 2017 §2.2; PATE 2018 §4, Alg. 1-2)"


def mechanism_parameters(*, costed_only: bool = False) -> dict[str, str]:
    """Every parameter name of every mechanism, in the order the mechanisms declare them, with
    its help text. ``costed_only`` leaves out the parameters that do not enter the privacy cost
    (metadata ``costless_value``: Interactive-GNMax's gamma)."""
    out: dict[str, str] = {}
    for cls in MECHANISMS.values():
        for f in parameters(cls):
            if not (costed_only and f.metadata["costless_value"] is not None):
                out.setdefault(f.name, f.metadata["help"])
    return out


def add_mechanism_flags(parser: argparse.ArgumentParser, *, costed_only: bool = False,
                        required: bool = True) -> None:
    """``--mechanism`` (one of ``MECHANISMS``; optional unless ``required``) and one optional
    float flag per parameter: the flags of ``pate serve``, ``pate student train`` and
    (``costed_only``) ``pate analyze``."""
    group = parser.add_argument_group(GROUP_TITLE)
    group.add_argument("--mechanism", required=required, choices=tuple(MECHANISMS))
    for name, text in mechanism_parameters(costed_only=costed_only).items():
        group.add_argument(f"--{name}", type=float, help=text)


def given_parameters(args: argparse.Namespace) -> list[str]:
    """The parameter flags given on the command line, as ``--name``."""
    return [f"--{name}" for name in mechanism_parameters()
            if getattr(args, name, None) is not None]


def mechanism_from_flags(args: argparse.Namespace, *, costed_only: bool = False) -> Mechanism:
    """The mechanism the flags of ``add_mechanism_flags`` describe; a flag of a parameter the
    mechanism does not take is an error (``UserError``, one line). With ``costed_only`` a
    parameter that does not enter the cost takes its ``costless_value``."""
    record = {"mechanism": args.mechanism,
              **{name: getattr(args, name) for name in mechanism_parameters()
                 if getattr(args, name, None) is not None}}
    cls = MECHANISMS.get(args.mechanism)
    if costed_only and cls is not None:
        for f in parameters(cls):
            if f.metadata["costless_value"] is not None:
                record[f.name] = f.metadata["costless_value"]
    try:
        return mechanism_from_dict(record)
    except ParameterError as exc:
        raise UserError(exc.named("--")) from None
    except ValueError as exc:
        raise UserError(str(exc)) from None
