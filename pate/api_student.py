"""``Student`` of the Python API (:mod:`pate.api`): trained on the public pool and the answers
``PrivateLabels`` gave, saved and loaded (``load_student``, also from a ``pate run``
directory), and scoring raw files."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike, NDArray

from pate.api_checks import (
    Network,
    accuracy_of,
    checked_device,
    checked_integer,
    checked_kind,
    checked_network,
    checked_rate,
    checked_rows,
    checked_rows_of,
    warn_if_of_script,
)
from pate.api_tables import TableEncoder
from pate.data.augment import AUGMENTATIONS
from pate.errors import UserError
from pate.io import write_json_atomic
from pate.rundir import STUDENT_SCHEMA
from student.checks import warn_unseen_classes
from student.defaults import STUDENT
from student.models import ModelSpec, build_classifier, check_network
from student.predict import load_schema, saved_student, score_file
from student.rounds import Received
from student.training import (
    FitConfig,
    build_learner,
    fit,
    method_for_data,
    predict_proba,
    save_model,
    seed_everything,
)
from teachers.rng import SEED_LIMIT


class Student:
    """The student: ``method`` ``vat`` (Miyato et al. 2018), ``supervised`` or ``gan``
    (Salimans et al. 2016), on ``arch`` (default per method; ``mlp`` suits features; a
    network's import path or factory function, as ``Teachers``' ``model``), trained
    ``epochs`` passes over the public pool (a pass is the pool over the unlabelled batch of
    128 rows: a pool of a few hundred rows takes two or three steps a pass, and wants more
    epochs or a higher ``lr``). ``augment`` (random shifts, and mirroring with
    ``shift-flip``), ``vat_eps`` and ``entmin`` (VAT's perturbation size and entropy
    minimisation) are ``pate student train``'s; ``device`` trains there. ``seed`` seeds
    initialisation and order only."""

    def __init__(self, method: str = "vat", *, arch: Network = None,
                 epochs: int = STUDENT.epochs, batch_size: int = STUDENT.batch_size,
                 lr: float | None = None, augment: str = "none",
                 vat_eps: float = STUDENT.vat_eps, entmin: bool = False, seed: int = 0,
                 device: str = "cpu") -> None:
        arch = checked_network(arch, "arch")
        if augment not in AUGMENTATIONS:
            raise UserError(f"augment must be one of {', '.join(AUGMENTATIONS)}, "
                            f"got {augment!r}")
        epochs = checked_integer("epochs", epochs, 1)
        batch_size = checked_integer("batch_size", batch_size, 1)
        self.arch, self.lr = arch, None if lr is None else checked_rate("lr", lr)
        self.vat_eps, self.entmin = checked_rate("vat_eps", vat_eps), bool(entmin)
        self.method = method_for_data("image", method, arch, lr=self.lr, vat_eps=self.vat_eps,
                                      entmin=self.entmin)
        self.fit_config = FitConfig(epochs, batch_size, lr=self.method.learning_rate,
                                    augment=augment,
                                    seed=checked_integer("seed", seed, 0, SEED_LIMIT),
                                    device=checked_device(device))
        self.model_: torch.nn.Module | None = None
        self.spec_: ModelSpec | None = None
        self.schema_: dict[str, Any] | None = None  # set by load_student from a run's student

    def fit(self, x_public: ArrayLike, labels: Received, n_classes: int, *,
            table: TableEncoder | None = None, classes: Sequence[str] | None = None
            ) -> Student:
        """Train on the public pool ``x_public`` and the answers ``labels`` received for some of
        its rows (``PrivateLabels.ask``). ``x_public`` must be the rows the votes were cast on,
        in their order: only its length is checked, against the votes of the
        ``PrivateLabels`` that asked (``pate run`` checks the pool's fingerprint). Given the
        ``table`` encoder that made the rows, the student also scores raw ``.csv`` files
        (``predict_file``, and ``pate student predict --student`` on its ``save``), naming its
        outputs ``classes`` (default ``0``, ``1``, ...) and leaving a file's label column (the
        table's ``label``) out."""
        x = checked_rows(x_public)
        kind = checked_kind(x, self.fit_config.augment)
        n_classes = checked_integer("n_classes", n_classes, 2)
        if not isinstance(labels, Received):
            raise UserError("labels must be what PrivateLabels.ask returned (or .received)")
        answered = labels.answered
        if not answered.any():
            raise UserError("no answered labels to learn from")
        if labels.pool_size is not None and labels.pool_size != len(x):
            raise UserError(f"x_public has {len(x)} rows, the votes these labels answer were "
                            f"cast on {labels.pool_size}: give the pool they were cast on, in "
                            "their order")
        if labels.classes is not None and labels.classes != n_classes:
            raise UserError(f"n_classes is {n_classes}, the votes these labels answer hold "
                            f"{labels.classes} classes")
        if labels.pool_index.max() >= len(x) or labels.label.max() >= n_classes:
            raise UserError(f"the labels are of pool rows up to {labels.pool_index.max()} and "
                            f"classes up to {labels.label.max()}: x_public has {len(x)} rows "
                            f"and n_classes is {n_classes}")
        names = (classes if classes is not None and len(classes) == n_classes
                 else range(n_classes))  # (a wrong count is refused with the table's schema)
        warn_unseen_classes(labels.label[answered], [str(c) for c in names])
        method = self.method
        if kind == "tabular":  # the MLP unless an arch was named, and none made for images
            method = method_for_data("tabular", method.method, self.arch, lr=self.lr,
                                     vat_eps=self.vat_eps, entmin=self.entmin)
        self.spec_ = method.spec(x.shape[1:], n_classes)
        self.schema_ = None if table is None else _table_schema(table, x, n_classes, classes)
        # seeded here (torch.manual_seed seeds every CUDA device too), the caller's as it was
        with torch.random.fork_rng(devices=range(torch.cuda.device_count())):
            check_network(self.spec_)  # rows too small for it, or a user's network that fails
            seed_everything(self.fit_config.seed)
            self.model_ = build_classifier(self.spec_).to(self.fit_config.device)
            fit(build_learner(method, self.model_, self.spec_),
                x[labels.pool_index[answered]], labels.label[answered], x, self.fit_config)
        return self

    def predict_proba(self, x: ArrayLike) -> NDArray[np.float64]:
        """Class probabilities ``[rows, classes]``."""
        if self.model_ is None or self.spec_ is None:
            raise UserError("fit or load the student first")
        rows = checked_rows_of(x, self.spec_.in_shape, "this student")
        return predict_proba(self.model_, rows, self.fit_config.device)

    def predict(self, x: ArrayLike) -> NDArray[np.int64]:
        """The most probable class of each row (rows preprocessed as the training rows were;
        ``predict_file`` reads raw files for a student loaded from a run)."""
        return self.predict_proba(x).argmax(axis=1)

    def predict_file(self, data: str | Path) -> pd.DataFrame:
        """Score a file of new raw rows (a ``.csv``, a ``.npz`` or a folder of images) read as
        the run's training data were (``pate student predict``): a frame of ``row``,
        ``label``, ``confidence`` and ``p_<class>``. For a student loaded from a run, or
        fitted with ``table=``."""
        if self.model_ is None or self.spec_ is None:
            raise UserError("fit or load the student first")
        if self.schema_ is None:
            raise UserError("this student was fitted on arrays: predict on arrays (a student "
                            "loaded from a run, or fitted with table=, reads raw files)")
        return score_file(self.model_, self.spec_, self.schema_, data)

    def score(self, x: ArrayLike, y: ArrayLike) -> float:
        """Accuracy on labelled rows (measure it on data you may: a test set, never the
        private data)."""
        predicted = self.predict(x)
        assert self.spec_ is not None
        return accuracy_of(predicted, y, self.spec_.num_classes)

    def save(self, directory: str | Path) -> Path:
        """Write ``model.safetensors`` and ``model.json`` (the network) into ``directory``, and
        ``schema.json`` for a student loaded from a run."""
        if self.model_ is None or self.spec_ is None:
            raise UserError("fit the student first")
        warn_if_of_script(self.spec_.arch, "the student's")
        out = Path(directory)
        if out.exists() and not out.is_dir():
            raise UserError(f"{out}: not a folder; save writes the student into a folder")
        out.mkdir(parents=True, exist_ok=True)
        save_model(self.model_, self.spec_, out)
        if self.schema_ is not None:
            write_json_atomic(out / STUDENT_SCHEMA, self.schema_)
        else:  # fitted on arrays: a schema left by another student would misread files
            (out / STUDENT_SCHEMA).unlink(missing_ok=True)
        return out


def _table_schema(table: TableEncoder, x: NDArray[np.float32], n_classes: int,
                  classes: Sequence[str] | None) -> dict[str, Any]:
    """The schema (``student/schema.json``) of a student of ``table``'s rows ``x``: the class
    names and how raw rows become its inputs; one error line where they do not fit."""
    if not isinstance(table, TableEncoder):
        raise UserError(f"table must be the TableEncoder that made x_public, got "
                        f"{type(table).__name__}")
    if x.ndim != 2 or x.shape[1] != table.width_:
        raise UserError(f"x_public has rows of {list(x.shape[1:])}; the table encoder makes "
                        f"rows of {table.width_} features: not its rows")
    names = [str(c) for c in range(n_classes)] if classes is None else [str(c) for c in classes]
    if len(names) != n_classes or len(set(names)) != n_classes or not all(names):
        raise UserError(f"classes must be {n_classes} distinct names, got {classes!r}")
    return {"classes": names, "preprocessing": table.record()}


def load_student(path: str | Path) -> Student:
    """The student saved in a run directory (``pate run``, ``pate student train``) or a folder
    written by ``Student.save``; ready to ``predict``."""
    folder, model, spec = saved_student(path)
    student = Student("supervised", arch=spec.arch)
    student.model_, student.spec_ = model, spec
    if (folder / STUDENT_SCHEMA).is_file():
        student.schema_ = load_schema(folder, spec)
    return student
