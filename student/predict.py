"""The published student on new raw rows: its schema (class names and preprocessing record,
``student/schema.json``) and ``predict_file``, which reads a file of new rows the way the
student's training data were read (``pate.data.preprocessing``) and scores them.

Everything here is public: the schema's statistics were fitted on the public pool, and the
student is the model a run publishes. Scoring asks the aggregator nothing and spends no privacy.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from torch import nn

from pate.data.preprocessing import are_names, encode_new_rows, record_problem, record_shape
from pate.data.task import Task
from pate.errors import UserError
from pate.io import write_bytes_atomic
from pate.rundir import STUDENT_SCHEMA, RunDir
from student.models import ModelSpec
from student.training import load_classifier, predict_proba


def student_schema(task: Task) -> dict[str, Any]:
    """What a student of ``task`` needs to score raw rows: its class names, in output order,
    and the task's preprocessing record."""
    return {"classes": list(task.classes), "preprocessing": task.preprocessing}


def load_schema(folder: Path, spec: ModelSpec) -> dict[str, Any]:
    """``folder/schema.json`` of the student ``spec``; a student saved without one (fitted on
    arrays, or by a version before schemas) cannot read raw files."""
    path = folder / STUDENT_SCHEMA
    if not path.is_file():
        raise UserError(f"{folder}: no {STUDENT_SCHEMA}, so how raw rows become this "
                        "student's inputs is unknown (a student fitted on arrays predicts on "
                        "arrays, unless fitted with table=; `pate student train --queries 0` "
                        "on its run writes one, but retrains the student)")
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except ValueError:  # UnicodeDecodeError too
        schema = None
    if not isinstance(schema, dict):
        raise UserError(f"{path}: not a student's schema: this folder is damaged")
    classes = schema.get("classes")
    problem = record_problem(schema.get("preprocessing"))
    if problem is None and not (are_names(classes) and all(classes)):
        problem = "the classes must be distinct names"
    if problem is None and len(classes) != spec.num_classes:
        problem = f"{len(classes)} classes for a student of {spec.num_classes}"
    shape = None if problem else record_shape(schema["preprocessing"])
    if shape is not None and shape != tuple(spec.in_shape):
        problem = (f"its preprocessing makes rows of shape {list(shape)}, the student takes "
                   f"{list(spec.in_shape)}")
    if problem is not None:
        raise UserError(f"{path}: {problem}: this folder is damaged")
    return schema


def score_file(model: nn.Module, spec: ModelSpec, schema: dict[str, Any], data: str | Path,
               device: str = "cpu") -> pd.DataFrame:
    """``model`` on the rows of ``data``, read as ``schema`` says: one row per input with its
    name (row number, or image path inside the folder), the predicted class, its probability
    (``confidence``) and every class's probability (``p_<class>``)."""
    x, names = encode_new_rows(schema["preprocessing"], data)
    if tuple(x.shape[1:]) != tuple(spec.in_shape):
        raise UserError(f"{data}: rows of shape {list(x.shape[1:])}; this student takes "
                        f"{list(spec.in_shape)}")
    probs = predict_proba(model.to(device), x, device)
    classes = schema["classes"]  # distinct names (load_schema, or the task's own)
    top = probs.argmax(axis=1)
    frame = pd.DataFrame({"row": names, "label": np.asarray(classes, dtype=object)[top],
                          "confidence": probs[np.arange(len(top)), top]})
    return pd.concat([frame, pd.DataFrame(probs, columns=[f"p_{c}" for c in classes])], axis=1)


def _predictions_file(path: Path, data: str | Path) -> bool:
    """Whether ``path`` is empty or holds predictions this command wrote (its header begins
    ``row,label,confidence``), and is not the data being scored: the files ``--out`` may
    overwrite (never private data, a ledger or votes by a slip)."""
    try:
        if Path(data).exists() and path.samefile(data):
            return False
        with path.open("rb") as fh:
            head = fh.readline(64)
        return not head or head.startswith(b"row,label,confidence")
    except OSError:
        return False


def saved_student(path: str | Path) -> tuple[Path, nn.Module, ModelSpec]:
    """The student saved in ``path`` (a run's ``student/``, ``Student.save``'s folder, or a
    run directory that holds one): its folder, network and spec; ``UserError`` without one."""
    root = Path(path)
    folder = RunDir(root).student if (RunDir(root).student / "model.json").is_file() else root
    loaded = load_classifier(folder)
    if loaded is None:
        raise UserError(f"{root}: no saved student (model.safetensors and model.json), nor a "
                        "run directory that holds one")
    return folder, *loaded


def predict_file(path: str | Path, data: str | Path, out: str | Path | None = None,
                 device: str = "cpu") -> pd.DataFrame:
    """The student saved in ``path`` (``saved_student``: a student folder or a run directory)
    on the rows of ``data`` (``score_file``), written to ``out`` as CSV (atomically) if
    given."""
    try:
        target = None if out is None else Path(out).resolve()  # a link: its target is written
        if target is not None:
            if target.exists() and not target.is_file():
                raise UserError(f"{out}: not a regular file; --out names the CSV file to write")
            if target.exists() and not _predictions_file(target, data):
                raise UserError(f"{out}: would be overwritten, and it is not a file of "
                                "predictions (or it is the data scored): --out names a new "
                                "file, or an earlier one of predictions")
            if not target.parent.is_dir():
                raise UserError(f"{out}: no such folder {target.parent}")
    except (OSError, RuntimeError) as exc:  # a name too long, a loop of links
        raise UserError(f"{out}: not a path to write ({exc.__class__.__name__})") from None
    folder, model, spec = saved_student(path)
    scored = score_file(model, spec, load_schema(folder, spec), data, device)
    if target is not None:
        try:
            write_bytes_atomic(target, scored.to_csv(index=False).encode())
        except OSError as exc:
            raise UserError(f"{out}: cannot write it ({exc.strerror or exc.__class__.__name__})"
                            ) from None
    return scored
