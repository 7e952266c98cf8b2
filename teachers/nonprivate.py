"""The non-private reference: the teachers' architecture trained on all the private data at once,
with no privacy at all, and its accuracy on the evaluation data.

It answers the owner's question "what does privacy cost?" (PATE 2018 and Abadi et al. 2016 both
report such a baseline). The model is not DP: it is never saved, and its accuracy belongs to the
owner-only evaluation (``pate.rundir.RunDir.comparison``), not to anything published. It is
trained as a group of one teacher (``teachers.ensemble.train_group``), so a network on fixed maps
learns from their table, computed once per row.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pate.data.task import load_task
from pate.errors import UserError
from teachers import checkpoints
from teachers.ensemble import TrainConfig, train_group
from teachers.manifest import TeachersManifest
from teachers.user_models import named_by_class
from teachers.votes import Ensemble


def train_nonprivate(run_dir: str | Path, epochs: int, batch_size: int, device: str = "cpu"
                     ) -> dict[str, Any]:
    """Train one model of the run's teachers' architecture and training recipe (the manifest's)
    on every private row, for ``epochs`` passes in batches of ``batch_size``, and measure it on
    the evaluation data. Returns its figures (private to the owner)."""
    run_dir = Path(run_dir)
    manifest = TeachersManifest.trained(run_dir)  # the non-private model copies their recipe
    task = load_task(manifest.data_source())
    if task.eval_x is None or task.eval_y is None:
        raise UserError("the non-private model is measured on test data: give data.test")
    assert task.private_x is not None and task.private_y is not None
    cfg = replace(TrainConfig(**manifest.train_settings), epochs=epochs, batch_size=batch_size)
    sha256 = manifest.pool_encoder_sha256
    encoder = None if sha256 is None else checkpoints.load_encoder(run_dir, sha256, device)
    x = torch.as_tensor(task.private_x, device=device)
    y = torch.as_tensor(task.private_y, device=device)
    rows = np.arange(len(x))
    start = time.perf_counter()
    with named_by_class("the non-private model"):
        state = train_group(cfg, x, y, task.num_classes, np.zeros(1, np.int64), [rows],
                            len(rows), encoder)
        seconds = time.perf_counter() - start
        ensemble = Ensemble(cfg.model, task.input_shape, task.num_classes, [state], device,
                            encoder)
        accuracy = float(ensemble.accuracy(task.eval_x, task.eval_y)[0])
    return {"model": cfg.model, "accuracy": accuracy, "eval_examples": len(task.eval_y),
            "train_examples": len(rows), "epochs": epochs, "batch_size": batch_size,
            "lr": cfg.lr, "seconds": seconds}
