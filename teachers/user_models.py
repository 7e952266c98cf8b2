"""A user's own network, named by its import path ``package.module:factory``.

``factory(input_shape, num_classes)`` returns a ``torch.nn.Module`` for inputs ``[n, C, H, W]``
(``input_shape`` is ``(C, H, W)``) whose forward returns logits ``[n, num_classes]``. The teachers
(``teachers.model``) and the student (``student.arch``) both resolve the name here. The module is
imported with the current working directory on ``sys.path`` (as ``python -m`` has it), so a file
``./mymodels.py`` is ``mymodels:factory``; :func:`ray_runtime_env` ships its package to the Ray
workers that train the teachers.

A teacher's initial state is the module's own initialisation: the factory is called once per
teacher under torch's global generator seeded from (seed, teacher) (:func:`teacher_states`), so
teacher ``t``'s weights depend only on (seed, t) as long as the factory draws its random numbers
from torch's global generator (``torch.nn``'s layers do). The state holds the parameters and the
buffers, stacked on a leading teacher axis, so each teacher keeps its own buffers (BatchNorm's
running statistics, say).

Whether the teachers train vectorised, like the built-in models, is tested rather than assumed
(:func:`vmap_problem`): two teachers run a tiny batch through ``torch.func.vmap(functional_call)``
and one at a time, and their outputs, gradients and buffers must agree. A forward that draws
random numbers (dropout), branches on tensor values, or otherwise has no vmap rule fails it, and
its teachers are trained one at a time instead.
"""

from __future__ import annotations

import copy
import hashlib
import importlib
import os
import sys
import sysconfig
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch.func import functional_call, vmap

from pate import SIBLING_PACKAGES
from pate.errors import UserError, tracebacks_shown
from teachers import rng
from teachers.choices import is_import_path

# The project's own packages: the Ray workers import them already, nothing to ship; a user's
# module cannot take one of their names.
PROJECT_PACKAGES = frozenset({"pate", *SIBLING_PACKAGES})
# Rows of the batch the vmap test runs, per teacher.
PROBE_ROWS = 3


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation that failed: Python's ``MemoryError``, CUDA's
    ``torch.OutOfMemoryError``, or the ``RuntimeError`` of torch's CPU allocator."""
    return isinstance(exc, MemoryError | torch.OutOfMemoryError) or (
        isinstance(exc, RuntimeError) and "can't allocate memory" in str(exc))


def describe_error(exc: BaseException, limit: int = 200) -> str:
    """``Class: message`` on one line, at most ``limit`` characters of message; prefixed with
    ``out of memory:`` where it is an allocation that failed (:func:`out_of_memory`), which
    the user's code did not write and a smaller network or batch mends."""
    text = " ".join(str(exc).split())
    text = text if len(text) <= limit else text[:limit - 3] + "..."
    said = f"{type(exc).__name__}: {text}" if text else type(exc).__name__
    return f"out of memory: {said}" if out_of_memory(exc) else said


def load_factory(name: str, what: str = "model") -> Callable[..., object]:
    """The callable ``name`` (``package.module:factory``) names, imported with the working
    directory on ``sys.path``; ``what`` names the setting in the errors (one line each)."""
    module_name, _, attr = name.partition(":")
    if not is_import_path(name):
        raise UserError(f"{what} {name!r} is not an import path package.module:factory")
    top = module_name.split(".")[0]
    ours = top in PROJECT_PACKAGES
    if ours:  # the project's own package, before the working directory can shadow it
        importlib.import_module(top)
    clash = (f" ({top} is a package of this project, which a module of yours of that name "
             "cannot replace: give yours another name)" if ours else "")
    cwd = os.getcwd()
    if cwd not in sys.path:
        sys.path.insert(0, cwd)
    importlib.invalidate_caches()
    try:
        found: object = importlib.import_module(module_name)
    except Exception as exc:  # whatever the user's module raises while it is imported
        hint = clash or ("; run from the folder that holds it, or add that folder to PYTHONPATH "
                         "(only pate run looks beside its config file)"
                         if isinstance(exc, ModuleNotFoundError)
                         and top == (exc.name or "").split(".")[0] else "")
        raise UserError(f"{what} {name!r}: cannot import {module_name} "
                        f"({describe_error(exc)}){hint}") from None
    for part in attr.split("."):
        if not hasattr(found, part):
            hint = clash or (" (a factory of a running script: define it in this script too, "
                             "or in a module of its own)" if module_name == "__main__" else "")
            raise UserError(f"{what} {name!r}: {module_name} has no attribute {attr}{hint}")
        found = getattr(found, part)
    if not callable(found):
        raise UserError(f"{what} {name!r}: {attr} is not callable")
    return found


@contextmanager
def named_by_class(what: str, then: str = "") -> Iterator[None]:
    """Work on private rows or weights (training, voting) whose failure is one ``UserError``,
    ``"{what} failed (ValueError){then}"``, naming the exception's class only: its message
    may quote private rows (a user's network raising on its inputs). ``UserError``, an
    interruption (Ctrl-C), and any error where ``pate.errors.tracebacks_shown``, go through as
    they are."""
    try:
        yield
    except UserError:
        raise
    except Exception as exc:  # whatever a user's network or the device raises
        if tracebacks_shown():
            raise
        raise UserError(f"{what} failed ({type(exc).__name__}){then}") from None


# the networks whose forward was said to return probabilities (``build_user_model``)
_SAID_PROBABILITIES: set[str] = set()


def build_user_model(name: str, in_shape: tuple[int, ...], num_classes: int,
                     what: str = "model") -> nn.Module:
    """``factory(in_shape, num_classes)`` of the import path ``name``, checked to be a module
    whose forward maps a batch of two zero inputs (evaluation mode, no gradient) to
    ``[2, num_classes]``: a student's network is used as it is, and a wrong width would
    predict classes that do not exist."""
    factory = load_factory(name, what)
    shape = tuple(int(s) for s in in_shape)
    try:
        model = factory(shape, num_classes)
    except Exception as exc:  # the user's code: any failure is reported in one line
        raise UserError(f"{what} {name!r}: the factory failed for input shape {shape} and "
                        f"{num_classes} classes ({describe_error(exc)})") from None
    if not isinstance(model, nn.Module):
        raise UserError(f"{what} {name!r}: the factory returned {type(model).__name__}, not a "
                        "torch.nn.Module")
    training = model.training
    try:
        model.eval()
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            out = model(torch.zeros((2, *shape)))
    except Exception as exc:  # the user's code
        raise UserError(f"{what} {name!r}: its forward failed on a batch of shape "
                        f"{[2, *shape]} ({describe_error(exc)})") from None
    finally:
        model.train(training)
    if not isinstance(out, torch.Tensor) or tuple(out.shape) != (2, num_classes):
        got = list(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
        raise UserError(f"{what} {name!r}: its forward returns shape {got} for a batch of 2; "
                        f"expected [2, {num_classes}]")
    if out.is_floating_point() and bool((out >= 0).all()) and torch.allclose(
            out.sum(dim=1), torch.ones(2, dtype=out.dtype), atol=1e-4) and (
            name not in _SAID_PROBABILITIES):
        _SAID_PROBABILITIES.add(name)  # once a process: it is built once per teacher and use
        warnings.warn(f"{what} {name!r}: its forward looks to return probabilities (rows of "
                      "non-negative values summing to 1); it must return logits, the losses "
                      "apply the softmax themselves: drop its final softmax", stacklevel=2)
    return model


def check_trains_on(model: nn.Module, rows: int, in_shape: tuple[int, ...], what: str,
                    device: torch.device | str = "cpu",
                    remedy: str = "a larger batch size") -> None:
    """Forward a copy of ``model`` in training mode on ``rows`` zero inputs: a network that
    cannot train on batches that small (batch normalisation on one row: "expected more than 1
    value per channel") fails here in one line, not in the middle of training, with
    ``remedy``; one that fails on a larger batch too (not for want of memory) fails in training
    mode whatever the batch, and is told so instead."""
    failure = _training_failure(model, rows, in_shape, device)
    if failure is None:
        return
    if out_of_memory(failure):
        raise UserError(f"{what} cannot train on batches of {rows} row(s) "
                        f"({describe_error(failure)}): a smaller batch size or network")
    larger = _training_failure(model, max(2 * rows, _LARGER_BATCH), in_shape, device)
    if larger is not None and not out_of_memory(larger):
        raise UserError(f"{what} fails in training mode (train(), on zero inputs: "
                        f"{describe_error(failure)}): fix its forward in training mode")
    raise UserError(f"{what} cannot train on batches of {rows} row(s) "
                    f"({describe_error(failure)}): {remedy}")


_LARGER_BATCH = 64  # a batch no batch normalisation fails on


def _training_failure(model: nn.Module, rows: int, in_shape: tuple[int, ...],
                      device: torch.device | str) -> Exception | None:
    """What a copy of ``model`` in training mode raises on ``rows`` zero inputs, or None."""
    probe = copy.deepcopy(model).train()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            probe(torch.zeros((rows, *in_shape), device=device))
    except Exception as exc:  # the user's code, or a built-in's batch norm
        return exc
    return None


def module_state(model: nn.Module) -> dict[str, torch.Tensor]:
    """The module's parameters and buffers by name, detached."""
    return {name: t.detach() for name, t in (*model.named_parameters(),
                                             *model.named_buffers())}


def load_state(model: nn.Module, state: dict[str, torch.Tensor], index: int) -> None:
    """Copy teacher ``index`` of the stacked ``state`` into ``model``'s parameters and
    buffers (those ``state`` names)."""
    with torch.no_grad():
        for name, t in (*model.named_parameters(), *model.named_buffers()):
            if name in state:
                t.copy_(state[name][index])


@contextmanager
def seeded(seed: int, teacher: int, stream: int, device: torch.device) -> Iterator[None]:
    """Torch's global generator (and ``device``'s) seeded from (seed, teacher, stream) inside,
    restored after."""
    devices = [] if device.type != "cuda" else [
        device.index if device.index is not None else torch.cuda.current_device()]
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(int(rng.bits(seed, np.array([teacher]), stream)[0]))
        yield


def network_signature(model: nn.Module) -> str:
    """sha256 (hex) of a network's layers as built: its modules' description (types, sizes,
    activations) and its parameters' and buffers' names, shapes and types, not their values.
    A user's factory that builds other layers since its teachers trained (its code edited, its
    name kept) gives another one. A change inside ``forward`` alone is not seen."""
    digest = hashlib.sha256(repr(model).encode())
    for name, tensor in model.state_dict().items():
        digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}".encode())
    return digest.hexdigest()


def check_same_network(name: str, recorded: str | None, model: nn.Module, whose: str) -> None:
    """Refuse a user's network ``name`` whose layers (``network_signature`` of ``model``, as
    its factory builds it now) differ from those ``recorded`` when ``whose`` weights were
    trained (None: recorded by an older version, not checked)."""
    if recorded is not None and network_signature(model) != recorded:
        raise UserError(f"{name} builds other layers than {whose} were trained with (its code "
                        "changed since): restore it, or train them again in a new --run "
                        "directory")


def teacher_states(name: str, in_shape: tuple[int, ...], num_classes: int,
                   teacher_ids: np.ndarray, seed: int) -> dict[str, torch.Tensor]:
    """Initial parameters and buffers of the teachers ``teacher_ids``, stacked: the factory's
    own initialisation, run once per teacher under a generator seeded from (seed, teacher)."""
    states = []
    for t in np.asarray(teacher_ids, dtype=np.int64):
        with seeded(seed, int(t), rng.MODULE_INIT, torch.device("cpu")):
            states.append(module_state(build_user_model(name, in_shape, num_classes)))
    return {k: torch.stack([s[k] for s in states]) for k in states[0]}


def vmap_problem(name: str, model: nn.Module, state: dict[str, torch.Tensor],
                 in_shape: tuple[int, ...], num_classes: int, train: bool) -> str | None:
    """Why ``model`` cannot be mapped over the stacked ``state`` with
    ``vmap(functional_call)``, or None when it can: a batch of :data:`PROBE_ROWS` rows runs
    through two teachers (one if ``state`` holds one) vectorised and one at a time, in training
    (with gradients) or evaluation mode; outputs, gradients and buffers must agree. A forward
    that fails even one teacher at a time, or returns no ``[n, num_classes]`` logits, is the
    model's fault: UserError. ``model`` is left in that mode; neither ``state`` nor the global
    generator is changed."""
    first = next(iter(state.values()))
    k = min(2, first.shape[0])
    x = torch.randn((k, PROBE_ROWS, *in_shape),
                    generator=torch.Generator().manual_seed(0)).to(first.device)
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    model.train(train)

    def copy() -> dict[str, torch.Tensor]:
        return {n: v[:k].detach().clone().requires_grad_(train and n in trainable)
                for n, v in state.items()}

    weight = torch.randn((k, PROBE_ROWS, num_classes),
                         generator=torch.Generator().manual_seed(1)).to(first.device)

    def run(forward: Callable[[dict[str, torch.Tensor]], torch.Tensor]
            ) -> tuple[torch.Tensor, dict[str, torch.Tensor], list[torch.Tensor]]:
        params = copy()
        with torch.random.fork_rng(devices=[]), torch.set_grad_enabled(train):
            out = forward(params)
            if out.dim() not in (3, 4) or out.shape[-1] != num_classes:
                raise UserError(f"model {name!r}: its forward returns shape "
                                f"{list(out.shape[1:])} for a batch of {PROBE_ROWS}; expected "
                                f"[{PROBE_ROWS}, {num_classes}]")
            grads = []
            if train:
                leaves = [params[n] for n in sorted(trainable & params.keys())]
                score = (out.reshape(k, PROBE_ROWS, -1, num_classes)
                         * weight[:, :, None]).sum()
                grads = list(torch.autograd.grad(score, leaves, allow_unused=True))
        return out.detach(), {n: v.detach() for n, v in params.items()}, grads

    try:
        ref = run(lambda p: torch.stack([functional_call(model, {n: v[i] for n, v in p.items()},
                                                         (x[i],)) for i in range(k)]))
    except UserError:  # its output's shape
        raise
    except Exception as exc:  # the user's network fails on its own
        raise UserError(f"model {name!r}: its forward fails on a batch of shape "
                        f"{[PROBE_ROWS, *x.shape[2:]]} ({describe_error(exc)})") from None
    try:
        vec = run(lambda p: vmap(lambda q, xb: functional_call(model, q, (xb,)))(p, x))
    except Exception as exc:  # no vmap rule, random numbers, data-dependent control flow, ...
        return describe_error(exc)
    same = (torch.allclose(ref[0], vec[0], rtol=1e-4, atol=1e-5)
            and all(torch.allclose(ref[1][n].double(), vec[1][n].double(), rtol=1e-4, atol=1e-5)
                    for n in ref[1])
            and all((a is None) == (b is None) and (a is None or torch.allclose(
                a, b, rtol=1e-4, atol=1e-5)) for a, b in zip(ref[2], vec[2], strict=True)))
    return None if same else "its outputs, gradients or buffers differ from one teacher's"


def warn_one_at_a_time(name: str, problem: str, doing: str) -> None:
    """The one warning line saying the teachers of ``name`` are ``doing`` (trained, voting) one
    at a time because of ``problem`` (:func:`vmap_problem`); Python shows it once per process."""
    warnings.warn(f"model {name!r} does not run under torch.func.vmap ({problem}); {doing} its "
                  "teachers one at a time (slower)", stacklevel=1)


def ray_runtime_env(name: str) -> dict | None:
    """Ray's ``runtime_env`` that ships the top-level package (or single-file module) of the
    user's model ``name`` to the workers as ``py_modules``
    (https://docs.ray.io/en/latest/ray-core/handling-dependencies.html); None for a built-in
    model, this project's own packages and installed ones (the workers import those as the
    driver does)."""
    if not is_import_path(name):
        return None
    load_factory(name)
    top = name.partition(":")[0].split(".")[0]
    if top in PROJECT_PACKAGES:
        return None
    module = sys.modules[top]
    locations = list(getattr(module, "__path__", []))
    path = Path(locations[0] if locations else getattr(module, "__file__", "") or "")
    if not (path.is_dir() or path.suffix == ".py"):
        return None
    installed = {Path(sysconfig.get_paths()[k]).resolve() for k in ("purelib", "platlib")}
    if installed & set(path.resolve().parents):
        return None
    return {"py_modules": [str(path)]}
