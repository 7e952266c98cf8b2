"""The DP-SGD baseline's workflow on a run directory: train ``student.dpsgd`` on the private
training split, evaluate it on the evaluation half of the test split, and write ``dpsgd/``
(``pate.rundir.RunDir``): ``metrics.json`` and ``model.pt`` (public: the model is DP, at its own
epsilon), and the Bayesian accountant's pair distances and its epsilon, ``bayesian.json``
(private, 0600: data-dependent)."""

from __future__ import annotations

import json
import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pate.aggregation.delta_policy import check_delta
from pate.data.task import DataSource, load_task
from pate.errors import UserError
from pate.io import write_with_atomic
from pate.rundir import DPSGD_METRICS, DPSGD_MODEL, RunDir
from student.dpsgd import DPSGDConfig, DPSGDResult, dpsgd_network, train_dpsgd, whole_model
from student.encoded_dpsgd import EncodingConfig, train_encoded_dpsgd
from teachers.manifest import TeachersManifest

# The Bayesian accountant's figures: computed from the private gradients' distances, so kept
# apart from the public metrics.json (in the private bayesian.json).
BAYESIAN_KEYS = ("epsilon_bayesian", "bayesian_moment")


def public_norm(public_x: np.ndarray) -> tuple[float, float]:
    """The (mean, std) DP-SGD's ``tempered-cnn`` and ``linear`` standardise inputs with, from
    public rows (no privacy cost); a std of 1 for rows that are all one value."""
    return float(public_x.mean()), float(public_x.std()) or 1.0


def fit_dpsgd(private_x: np.ndarray, private_y: np.ndarray, eval_x: np.ndarray | None,
              eval_y: np.ndarray | None, num_classes: int, config: DPSGDConfig,
              norm: tuple[float, float], progress: Callable[[int, int], None] | None = None,
              encoding: EncodingConfig | None = None) -> DPSGDResult:
    """``student.dpsgd.train_dpsgd``, or ``student.encoded_dpsgd`` for a non-plain
    ``encoding`` (which needs evaluation rows); what the learner refuses before it trains (an
    epsilon no noise reaches, a network that does not suit the data) is one ``UserError``
    (``student.dpsgd.refusals``)."""
    if encoding is None or encoding.plain:
        return train_dpsgd(private_x, private_y, eval_x, eval_y, num_classes, config, norm,
                           progress)
    assert eval_x is not None and eval_y is not None
    return train_encoded_dpsgd(private_x, private_y, eval_x, eval_y, num_classes, config,
                               encoding, norm, progress)


def split_bayesian(metrics: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """``metrics`` as (public, private): the Bayesian accountant's figures (``BAYESIAN_KEYS``)
    apart."""
    return ({k: v for k, v in metrics.items() if k not in BAYESIAN_KEYS},
            {k: metrics[k] for k in BAYESIAN_KEYS if k in metrics})


def train_dpsgd_baseline(run: RunDir, config: DPSGDConfig, data: DataSource,
                         progress: Callable[[int, int], None] | None = None,
                         out: Path | None = None,
                         encoding: EncodingConfig | None = None,
                         allow_large_delta: bool | None = None) -> dict[str, Any]:
    """Train and evaluate the DP-SGD baseline; returns the metrics written to
    ``metrics.json`` of ``out`` (default the run's ``dpsgd/``; the comparison's runs go to
    ``RunDir.comparison_dpsgd``, private: ``RunDir.baseline_is_private``). The input
    standardisation comes from the public pool (no privacy cost). ``progress(step, total)``
    after every step. A non-plain ``encoding`` trains ``student.encoded_dpsgd`` instead (no
    Bayesian accountant: its distances file is empty). The metrics returned hold the
    Bayesian accountant's figures (``BAYESIAN_KEYS``) too; ``metrics.json`` does not.
    ``allow_large_delta``: None where the caller has checked delta against the number of
    private records (``pate run``); else a delta of 1/n or more is refused unless True
    (``check_delta``)."""
    run.create()  # a run directory that cannot be one is said before any training
    task = load_task(data)
    if task.eval_x is None or task.eval_y is None:
        raise UserError("the DP-SGD baseline is evaluated on test data: give data.test "
                        "(--test)")
    assert task.private_x is not None and task.private_y is not None
    manifest = TeachersManifest.read(run.root)
    if manifest is not None and (manifest.private_changed(task) or manifest.pool_changed(task)):
        raise UserError("the run's teachers learnt other data than the data flags name: DP-SGD "
                        "in a run directory learns its teachers' private data, beside their "
                        "student (give no data flag, or another --run directory)")
    if allow_large_delta is not None:
        check_delta(config.delta, len(task.private_y), allow_large_delta)
    norm = public_norm(task.pool_x)
    result = fit_dpsgd(task.private_x, task.private_y, task.eval_x, task.eval_y,
                       task.num_classes, config, norm, progress, encoding)
    metrics, bayesian = split_bayesian(
        {"dataset": task.name, "normalisation": {"mean": norm[0], "std": norm[1]},
         "in_shape": list(task.input_shape), "classes": list(task.classes), **result.metrics})
    folder = run.private_dir(out or run.dpsgd)
    private = run.baseline_is_private(folder)
    # the metrics are written last and an earlier training's removed first: a stop part-way
    # leaves no metrics beside another training's model
    (folder / run.dpsgd_metrics.name).unlink(missing_ok=True)
    write_with_atomic(folder / run.dpsgd_distances.name,
                      lambda fh: np.save(fh, result.distances), private=True)
    if bayesian:
        run.write_json(folder / run.dpsgd_bayesian.name, bayesian, private=True)
    else:  # an encoded training has none: an earlier training's is not this one's
        (folder / run.dpsgd_bayesian.name).unlink(missing_ok=True)
    write_with_atomic(folder / run.dpsgd_model.name,
                      lambda fh: torch.save(result.model.state_dict(), fh), private)
    run.write_json(folder / run.dpsgd_metrics.name, metrics, private)
    return {**metrics, **bayesian}


def load_dpsgd_model(folder: Path) -> tuple[nn.Module, dict[str, Any]]:
    """The model ``train_dpsgd_baseline`` wrote into ``folder`` (``model.pt``, its network
    rebuilt from ``metrics.json``: the network's name, input shape, classes and public
    standardisation), in evaluation mode, and those metrics; one ``UserError`` where the folder
    holds no such model."""
    metrics_file, model_file = folder / DPSGD_METRICS, folder / DPSGD_MODEL
    if not (metrics_file.is_file() and model_file.is_file()):
        raise UserError(f"{folder}: no DP-SGD model ({DPSGD_MODEL} and {DPSGD_METRICS}; "
                        "pate dpsgd train writes them)")
    try:
        metrics = json.loads(metrics_file.read_text(encoding="utf-8"))
        norm, classes = metrics["normalisation"], [str(c) for c in metrics["classes"]]
        in_shape = tuple(int(side) for side in metrics["in_shape"])
        fixed, trained = dpsgd_network(metrics["config"]["model"], in_shape, len(classes),
                                       float(norm["mean"]), float(norm["std"]))
    except (json.JSONDecodeError, UnicodeDecodeError, KeyError, TypeError, ValueError):
        raise UserError(f"{metrics_file}: not the metrics of a DP-SGD model this version can "
                        "load (an older version recorded no input shape and classes: train "
                        "it again)") from None
    model = whole_model(fixed, trained)
    try:
        model.load_state_dict(torch.load(model_file, map_location="cpu", weights_only=True))
    except (RuntimeError, OSError, EOFError, pickle.UnpicklingError):
        raise UserError(f"{model_file}: not the weights {metrics_file.name} describes (a "
                        "damaged or replaced file)") from None
    return model.eval(), metrics
