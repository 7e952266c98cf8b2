"""Checks, before a student asks anything, that the data, votes and answers in hand are those of
the run: its teachers' pool, their votes, and answers about that pool (all public: no vote is
read)."""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from pate.data.task import DataSource, Task, source_identity
from pate.errors import UserError
from pate.rundir import RunDir
from student.rounds import Received
from teachers.manifest import TeachersManifest


def check_teachers_data(run: RunDir, task: Task, data: DataSource) -> None:
    """Refuse a student's data that is not what the run's teachers voted on: by the pool's
    fingerprint (``Task.pool_fingerprint``, the same wherever the files lie) where their
    manifest records one, else by the data's record (an older run)."""
    manifest = TeachersManifest.read(run.root)
    if manifest is None:
        return
    if manifest.records_pool:
        other = manifest.pool_changed(task)
    else:
        teachers = manifest.readable_source()
        other = teachers is not None and source_identity(data) != source_identity(teachers)
    if other:
        raise UserError("the run's teachers were trained and voted on other data than the "
                        "data flags name: the student's pool must be theirs (give no data "
                        "flag to use it)")


def check_votes(run: RunDir, votes: dict[str, Any], task: Task) -> None:
    """Refuse, before anything is asked, votes (``VotePool.describe``, local or GET /v1/pool)
    that do not fit the pool: cast on another pool (its fingerprint, where known), another
    number of classes, rows beyond the pool, or another number of teachers than the run's
    (all public; no vote is read)."""
    fingerprint = votes.get("fingerprint")
    if fingerprint is not None and fingerprint != task.pool_fingerprint:
        pool = f"the built-in dataset {task.name}" if task.pool_file is None else task.pool_file
        raise UserError("the votes were cast on another public pool than the student's "
                        f"(of {pool}; their content, rows or label set differ): they are not this "
                        "pool's votes; name the votes' pool with the data flags (--dataset, "
                        "--pool-size, or --private and --public)")
    classes = votes.get("classes")
    if classes is not None and classes != task.num_classes:
        raise UserError(f"the votes have {classes} classes, the data {task.num_classes}: "
                        "they are not this pool's votes")
    first, last = votes.get("first_index"), votes.get("last_index")
    if first is not None and last is not None and (first < 0 or last >= len(task.pool_x)):
        raise UserError(f"the votes cover pool rows up to {int(last)}, but the pool has "
                        f"{len(task.pool_x)} rows: they are not this pool's votes")
    manifest = TeachersManifest.read(run.root)
    recorded = None if manifest is None else manifest.record.get("num_teachers")
    teachers = votes.get("teachers")
    if teachers is not None and recorded not in (None, teachers):
        raise UserError(f"the votes are of {teachers} teachers, the run's teachers number "
                        f"{recorded}: they are not this run's votes")


def check_answers_pool(run: RunDir, received: Received, task: Task) -> bool:
    """Refuse answers in hand (``received``, from ``labels.npz``) recorded as being about
    another pool than ``task``'s: by their own ``pool_fingerprint``, and by that of
    ``student/metrics.json`` where its rounds asked them all (an older version recorded it
    there only). Returns whether either recorded one."""
    recorded = {received.pool_fingerprint}
    metrics = run.read_json(run.student_metrics)
    if isinstance(metrics, dict) and metrics.get("queries") == len(received):
        recorded.add(metrics.get("pool_fingerprint"))
    recorded.discard(None)
    if recorded - {task.pool_fingerprint}:
        raise UserError("the answers in hand are of another public pool than the data flags "
                        "name (its content, rows or label set differ)")
    return bool(recorded)


def warn_unseen_classes(labels: NDArray[np.int64], classes: Sequence[str]) -> None:
    """Warn of the classes no answered label is of (the answers are public): the student will
    not predict them, and its accuracy on test rows of them is nought. The warning names the
    line that called the caller (``pate student train``'s workflow, ``Student.fit``)."""
    counts = np.bincount(labels, minlength=len(classes))
    unseen = [str(c) for c, n in zip(classes, counts, strict=False) if not n]
    if unseen:
        shown = ", ".join(unseen[:5]) + (f" and {len(unseen) - 5} more" if len(unseen) > 5 else "")
        warnings.warn(f"no answered label is of the class(es) {shown}, of {len(classes)}: the "
                      "student will not predict them (more queries, or a larger budget)",
                      UserWarning, stacklevel=3)
