"""The command line's ``--device`` flag, checked against this machine as it is parsed."""

from __future__ import annotations

import argparse

from pate.devices import device_problem


def torch_device(value: str) -> str:
    """argparse type: ``value`` when this machine has that device, else a usage error."""
    problem = device_problem(value)
    if problem:
        raise argparse.ArgumentTypeError(problem)
    return value


def add_device_flag(parser: argparse.ArgumentParser, what: str) -> None:
    """``--device`` (default cpu) for ``what`` runs on."""
    parser.add_argument("--device", type=torch_device, default="cpu",
                        help=f"torch device {what} runs on: cpu, cuda or cuda:N (default: cpu)")
