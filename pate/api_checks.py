"""Validation at the edge of the Python API (:mod:`pate.api`): each check turns what a caller
passed into what the library takes, or raises one clear ``UserError``."""

from __future__ import annotations

import inspect
import math
import numbers
import os
import sys
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from pate.data.files import shape_said
from pate.data.preprocessing import as_features, channels_last, channels_last_advice
from pate.data.row_identity import row_keys
from pate.devices import device_problem
from pate.errors import UserError

_PACKAGE = str(Path(__file__).parent) + os.sep  # as the frames of its modules name them


def _user_stacklevel() -> int:
    """The ``stacklevel`` for a ``warnings.warn`` in the function that calls this one that
    names the first line outside ``pate/``: the caller's own, whichever API method (``fit``,
    ``predict``, ``score``) the rows came through."""
    level, frame = 1, sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        level, frame = level + 1, frame.f_back
    return level


def checked_rows(x: ArrayLike, name: str = "x") -> NDArray[np.float32]:
    """Rows as float32: images ``[n, C, H, W]`` (or ``[n, H, W]``, given a channel) or
    features ``[n, d]``. Integer images are scaled to [0, 1] (pixels in [0, 255]), as the
    built-in datasets, image files and ``.npz`` data are (``as_features``). ``name`` is the
    caller's name for the argument, in the messages."""
    try:
        raw = np.asarray(x)
        if raw.ndim not in (2, 3, 4) or not len(raw):
            raise UserError(f"{name} must be images [n, C, H, W] or feature rows [n, d], n >= 1, "
                            f"got {shape_said(raw.shape, private=True)}")  # x may be private
        if raw.ndim == 4 and channels_last(raw.shape[1:]):
            warnings.warn(channels_last_advice(name, raw.shape[1:]),
                          stacklevel=_user_stacklevel())
        return np.ascontiguousarray(as_features(raw, name))
    except (TypeError, ValueError):
        raise UserError(f"{name} must be numbers: images [n, C, H, W] or feature rows [n, d] "
                        "(encode text columns first)") from None


def checked_rows_of(x: ArrayLike, in_shape: tuple[int, ...], fitted: str) -> NDArray[np.float32]:
    """:func:`checked_rows` of the shape ``in_shape`` the ``fitted`` model (its name in the
    message) was trained on."""
    rows = checked_rows(x)
    if tuple(rows.shape[1:]) != tuple(in_shape):
        raise UserError(f"x has rows of shape {list(np.shape(x)[1:])}: {fitted} learnt "
                        f"from rows of shape {list(in_shape)}")
    return rows


def accuracy_of(predicted: NDArray[np.int64], y: ArrayLike, classes: int) -> float:
    """The share of ``predicted`` classes equal to the labels ``y``: class indices in
    ``[0, classes)``, one per row."""
    truth = np.asarray(y)
    if truth.shape != predicted.shape or not np.issubdtype(truth.dtype, np.integer) or \
            truth.min() < 0 or truth.max() >= classes:
        raise UserError(f"y must be class indices in [0, {classes}), one per row of x: got "
                        f"shape {list(truth.shape)} of {truth.dtype} for {len(predicted)} rows")
    return float(np.mean(predicted == truth))


def checked_integer(name: str, value: object, least: int, below: int | None = None) -> int:
    """``value``, an integer of at least ``least`` (and below ``below``); ``UserError``
    otherwise, a bool, float or string included."""
    if (isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < least
            or (below is not None and value >= below)):
        bound = f">= {least}" if below is None else f"in [{least}, {below})"
        raise UserError(f"{name} must be an integer {bound}, got {value!r}")
    return int(value)


def checked_rate(name: str, value: object, zero_is_off: bool = False) -> float:
    """``value``, a finite number > 0 (a learning rate), or 0 where ``zero_is_off`` (a
    setting 0 turns off); ``UserError`` otherwise."""
    number = not isinstance(value, bool) and isinstance(value, numbers.Real)
    if zero_is_off and number and value == 0:
        return 0.0
    if not (number and math.isfinite(value) and value > 0):
        raise UserError(f"{name} must be {'0 (off) or ' if zero_is_off else ''}a finite number "
                        f"> 0, got {value!r}")
    return float(value)


def checked_device(device: object) -> str:
    """``device``, a torch device this machine has (``pate.devices.device_problem``)."""
    if not isinstance(device, str):
        raise UserError(f"device must be a name such as cpu or cuda, got {device!r}")
    problem = device_problem(device)
    if problem:
        raise UserError(problem)
    return device


def checked_kind(x: NDArray[np.float32], augment: str = "none") -> str:
    """``tabular`` for feature rows, else ``image``; ``UserError`` for an augmentation of
    feature rows (it shifts and mirrors images)."""
    kind = "tabular" if x.ndim == 2 else "image"
    if kind == "tabular" and augment != "none":
        raise UserError(f"augment {augment!r} shifts images; feature rows take augment='none'")
    return kind


def checked_labels(y: ArrayLike, n_classes: int) -> NDArray[np.int64]:
    """Class indices in [0, n_classes), one per row (the label set is the caller's, public).
    The message says which rule failed, not a label's value (``y`` may be private)."""
    a = np.asarray(y)
    if a.ndim != 1 or a.size == 0:
        got = shape_said(a.shape, private=True)
    elif not np.issubdtype(a.dtype, np.integer):
        got = f"{a.dtype} values" + (" (names?)" if a.dtype.kind in "USO" else "")
    elif a.min() < 0:
        got = "a negative index"
    elif a.max() >= n_classes:
        got = f"an index of {n_classes} or more (labels counted from 1, or too few classes?)"
    else:
        return a.astype(np.int64)
    raise UserError(f"y must be integer class indices in [0, {n_classes}), one per row (map "
                    f"names to indices first): got {got}")


# what ``Teachers(model=)`` and ``Student(arch=)`` take: a built-in's name, an import path
# package.module:factory, or the factory itself, factory(input_shape, num_classes)
Network = str | Callable[[tuple[int, ...], int], Any] | None


def checked_network(value: object, name: str) -> str | None:
    """A network setting (``Teachers``' ``model``, ``Student``'s ``arch``) as its name: a
    built-in's name or an import path ``package.module:factory`` as given, or the import path
    of a factory function given itself (a saved model and a Ray worker import it again by that
    path; a factory of the running script, ``__main__``, only by running the same script:
    ``warn_if_of_script`` says so when it is saved). One ``UserError`` line for what cannot be
    one: a module instance (every teacher needs its own, which the factory makes), a lambda or
    a function defined inside another."""
    if value is None or isinstance(value, str):
        path = value
    elif inspect.isfunction(value) or inspect.isclass(value):
        path = f"{value.__module__}:{value.__qualname__}"
        if "<" in value.__qualname__:  # <locals>, <lambda>: no name to import it by
            raise UserError(f"{name}: the factory {value.__qualname__} has no name a module "
                            "holds it by (a lambda, or defined inside a function), so nothing "
                            "can import it again: define it with def at the top of a module")
    else:
        what = ("a torch.nn.Module instance" if hasattr(value, "parameters")
                and hasattr(value, "forward") else f"a {type(value).__name__}")
        raise UserError(f"{name} must be a name or package.module:factory, or such a factory "
                        f"function factory(input_shape, num_classes), not {what}: each "
                        "network is built anew by the factory")
    return path


def warn_if_of_script(path: str | None, whose: str) -> None:
    """Warn, when a model is saved, that ``whose`` network ``path`` (``"the student's"``) is a
    factory of the running script (``__main__``): only a process that runs the same script can
    load it again."""
    if path is not None and path.startswith("__main__:"):
        warnings.warn(f"{whose} network {path!r} is a factory of the running script: only the "
                      "same script can load it again (put it in a module file, mymodels.py, "
                      "to load it anywhere)", stacklevel=_user_stacklevel())


def warn_if_private_rows(x: NDArray[np.float32], private: NDArray | None) -> None:
    """Warn when rows of ``x`` (meant to be the public pool) are among the ``private`` rows
    (``pate.data.row_identity.row_keys`` of the teachers' data; None: not known here), without
    saying how many: the student trains on the pool, so a private row there reaches the
    published student unprotected."""
    if private is not None and np.isin(row_keys(x), private).any():
        warnings.warn("x: some of its rows are rows the teachers were trained on: votes are "
                      "for the public pool, and the student trains on the pool, so those rows "
                      "would reach the published student without the privacy guarantee "
                      "(unless they repeat by chance)", stacklevel=_user_stacklevel())
