"""The run directory (docs/design.md, "The run directory"): the one place that knows where a run
keeps each artifact, which artifacts are private, and how the small shared records are read and
written.

Private artifacts (the teachers, the votes, the ledger, the service token, the report, the audit
outputs, the DP-SGD pair distances) are created 0600 in 0700 folders; public ones 0644. Every
write goes through ``pate.io`` (temporary file, fsync, rename), so a killed command leaves the
old file or the new one, never half of one. A module that reads or writes a run's file asks a
``RunDir`` for its path; the file's own format stays with the code that owns it (``teachers.
checkpoints``, ``teachers.votes``, ``student.rounds``, ``pate.aggregation.ledger``).
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pate.errors import UserError
from pate.io import ensure_dir, write_bytes_atomic, write_json_atomic

STUDENT_SCHEMA = "schema.json"  # in any student folder: a run's student/ or Student.save's
# Beside a votes file, in a run directory or not: the votes' own ledger (the default), and the
# record of the ledger that charges them (``pate.aggregation.label_service``).
LEDGER_FILE = "ledger.db"
LEDGER_RECORD = "ledger-url.txt"
# in any DP-SGD folder (a run's dpsgd/, the comparison's): what pate.api.load_dpsgd reads back
DPSGD_METRICS = "metrics.json"
DPSGD_MODEL = "model.pt"


LOCK_WAIT_S = 1.0  # how long a command waits for a run directory another holds


def _lock(fd: int, wait_s: float) -> None:
    """``flock`` ``fd`` exclusively, trying every 50 ms for ``wait_s`` seconds;
    ``BlockingIOError`` where another still holds it."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            if time.monotonic() >= deadline:
                raise
            time.sleep(0.05)


@dataclass(frozen=True)
class RunDir:
    """A run directory: ``RunDir(path)``; ``create`` makes it (0700) and checks it is writable.

    Public: ``partition`` (dealt by position; by record or key it is private: its sizes count
    the private records), ``labels``, ``stages``, ``log``, the ``student`` folder and the
    ``dpsgd`` baseline's model and metrics. Private: ``config`` (it names the private data's
    file), ``teachers``, ``votes``, ``ledger`` (and the record of where it is), ``token``,
    ``releases`` (an earlier version's sanitised releases), ``comparison``, ``report``, ``audit``,
    ``dpsgd_distances`` and ``dpsgd_bayesian`` (docs/design.md, "The run directory")."""

    root: Path

    def __init__(self, root: str | Path) -> None:
        object.__setattr__(self, "root", Path(root))

    def __fspath__(self) -> str:
        return str(self.root)

    def __str__(self) -> str:
        return str(self.root)

    # --- public records -----------------------------------------------------------------------
    @property
    def config(self) -> Path:
        """``config.toml``: the resolved configuration of ``pate run``."""
        return self.root / "config.toml"

    @property
    def partition(self) -> Path:
        """``partition.json``: dataset, seed, sizes and the digest of the row assignment."""
        return self.root / "partition.json"

    @property
    def labels(self) -> Path:
        """``labels.npz``: what the student received (``student.rounds.Received``)."""
        return self.root / "labels.npz"

    @property
    def stages(self) -> Path:
        """``stages.json``: the finished stages of ``pate run`` and their seconds."""
        return self.root / "stages.json"

    @property
    def log(self) -> Path:
        """``log.txt``: one plain line per stage's start and end, appended."""
        return self.root / "log.txt"

    @property
    def student(self) -> Path:
        """``student/``: the model, ``schema.json``, ``rounds.json``, ``probs.npz``,
        ``metrics.json``."""
        return self.root / "student"

    @property
    def rounds(self) -> Path:
        return self.student / "rounds.json"

    @property
    def probs(self) -> Path:
        """The probabilities the student sent to Interactive-GNMax (its analysis needs them)."""
        return self.student / "probs.npz"

    @property
    def student_schema(self) -> Path:
        """``student/schema.json``: the student's class names and how raw rows become its
        inputs (``pate.data.preprocessing``; fitted on public data only)."""
        return self.student / STUDENT_SCHEMA

    @property
    def student_metrics(self) -> Path:
        return self.student / "metrics.json"

    @property
    def dpsgd(self) -> Path:
        """``dpsgd/``: the baseline's ``model.pt`` and ``metrics.json`` (public) and its pair
        distances (private)."""
        return self.root / "dpsgd"

    @property
    def dpsgd_metrics(self) -> Path:
        return self.dpsgd / DPSGD_METRICS

    @property
    def dpsgd_model(self) -> Path:
        return self.dpsgd / DPSGD_MODEL

    @property
    def comparison(self) -> Path:
        """``comparison/``: the owner-only evaluation (private): the non-private model, DP-SGD
        at the student's epsilons (one folder each, laid out as ``dpsgd/``) and the students
        trained on prefixes of the answers."""
        return self.root / "comparison"

    @property
    def comparison_metrics(self) -> Path:
        return self.comparison / "metrics.json"

    def comparison_dpsgd(self, name: str) -> Path:
        """The folder of DP-SGD trained to the student's epsilon ``name``."""
        return self.comparison / f"dpsgd-{name}"

    def baseline_is_private(self, folder: Path) -> bool:
        """Whether a DP-SGD baseline's model and metrics in ``folder`` are private: those of
        the compare stage are (owner-only: publishing one would spend its epsilon of the data's
        budget beside the student's), those of ``dpsgd/`` are not."""
        return self.comparison in Path(folder).parents

    # --- private artifacts --------------------------------------------------------------------
    @property
    def teachers(self) -> Path:
        """``teachers/``: checkpoints, ``manifest.json``, the pool encoder (private)."""
        return self.root / "teachers"

    @property
    def manifest(self) -> Path:
        return self.teachers / "manifest.json"

    @property
    def votes(self) -> Path:
        """``votes.npz``: the teachers' votes on the public pool (private)."""
        return self.root / "votes.npz"

    @property
    def ledger(self) -> Path:
        """``ledger.db``: the privacy ledger (private)."""
        return self.root / LEDGER_FILE

    @property
    def releases(self) -> Path:
        """``sanitised-releases.json``: each smooth-sensitivity release made from the run's
        votes, its beta and sigma (private: they depend on the votes), as earlier versions
        kept them; releases are now kept in the ledger (``student.sanitised``)."""
        return self.root / "sanitised-releases.json"

    @property
    def token(self) -> Path:
        """``service.token``: the bearer token ``pate run`` gives its student (a secret)."""
        return self.root / "service.token"

    @property
    def report(self) -> Path:
        """``report/``: for the data holder; it holds private statistics."""
        return self.root / "report"

    @property
    def report_json(self) -> Path:
        """``report/report.json``: every figure of the report."""
        return self.report / "report.json"

    @property
    def audit(self) -> Path:
        """``audit/``: the empirical audits' per-record results (private)."""
        return self.root / "audit"

    def models_audits(self) -> list[Path]:
        """The ``pate audit models`` summaries (``audit/models-<UTC time>-<tag>.json``; older
        versions wrote no tag), oldest first: their names begin with their time."""
        return sorted(self.audit.glob("models-*.json")) if self.audit.is_dir() else []

    @property
    def dpsgd_distances(self) -> Path:
        """The Bayesian accountant's sampled gradient-pair distances (private)."""
        return self.dpsgd / "distances.npy"

    @property
    def dpsgd_bayesian(self) -> Path:
        """``dpsgd/bayesian.json``: the Bayesian accountant's epsilon and moment (private: they
        are computed from those distances, a statistic of the private data)."""
        return self.dpsgd / "bayesian.json"

    def own_names(self) -> frozenset[str]:
        """The names pate gives the entries at the top of a run directory."""
        return frozenset(p.name for p in (
            self.config, self.partition, self.labels, self.stages, self.log, self.student,
            self.dpsgd, self.comparison, self.teachers, self.votes, self.ledger,
            self.root / LEDGER_RECORD, self.releases, self.token, self.report, self.audit))

    def holds_a_run(self) -> bool:
        """Whether pate has written a run here: its stages, teachers, student, baseline or
        report (not a votes file or answers alone, which a folder of yours may hold)."""
        return any(p.is_file() for p in (
            self.stages, self.manifest, self.student_schema, self.student_metrics,
            self.dpsgd_metrics, self.report_json))

    # --- creating and recording ---------------------------------------------------------------
    def create(self) -> RunDir:
        """Create the directory 0700 (parents as needed), or take one that is empty or holds
        what pate writes; ``UserError`` when it cannot be created or written, and for a folder
        of other files only (pate would write beside them, and make the folder private).
        Hidden entries (``.DS_Store``, a killed write's temporary file) and a mounted volume's
        ``lost+found`` do not count."""
        try:  # a folder that cannot be listed is said below, as one that cannot be written
            others = sorted(p.name for p in self.root.iterdir()
                            if not p.name.startswith(".") and p.name != "lost+found")
        except OSError:  # not there yet, a file, or no permission
            others = []
        if others and not set(others) & self.own_names():
            shown = ", ".join(others[:3]) + (", ..." if len(others) > 3 else "")
            raise UserError(f"{self.root} holds other files ({shown}) and nothing of a "
                            "run's: give a new or empty --run directory")
        try:
            ensure_dir(self.root, private=True)
        except OSError as exc:
            raise UserError(f"cannot create the run directory {self.root}: "
                            f"{exc.strerror or exc}") from None
        if not _writable(self.root):
            raise UserError(f"the run directory {self.root} is not writable")
        return self

    def require_dir(self) -> None:
        """``UserError`` unless the run directory is there: a file of its name, or nothing."""
        if not self.root.is_dir():
            raise UserError(f"{self}: " + ("a file, not a run directory" if self.root.exists()
                                           else "no such run directory"))

    @contextmanager
    def exclusive(self, wait_s: float = LOCK_WAIT_S) -> Iterator[None]:
        """Hold the directory for one command (an advisory ``flock`` on the directory itself,
        released when the process ends, however it ends); ``UserError`` while another holds
        it ``wait_s`` long (a ``pate status`` holds it for an instant): two commands would
        train the same stage, or release from the same answers, at once. ``pate run`` and the
        teachers' and student's commands hold it; ``pate serve`` does not (its ledger is
        shared by design)."""
        try:
            fd = os.open(self.root, os.O_RDONLY)
        except FileNotFoundError:
            raise UserError(f"{self}: no such run directory") from None
        try:
            try:
                _lock(fd, wait_s)
            except BlockingIOError:
                raise UserError(f"{self} is in use by another pate command (a pate run, or a "
                                "teachers' or student's stage); wait for it to end, or stop "
                                "it") from None
            except OSError as exc:  # a file system without locks: run, and say so
                warnings.warn(f"{self} cannot be locked ({exc.strerror or exc}): a second pate "
                              "run on it would not be stopped", stacklevel=3)
            yield
        finally:
            os.close(fd)

    def in_use(self) -> bool:
        """Whether a command holds the directory now (:meth:`exclusive`); a directory that
        does not exist is not."""
        if not self.root.is_dir():
            return False
        try:
            with self.exclusive(wait_s=0.0):
                return False
        except UserError:
            return True

    def private_dir(self, path: Path) -> Path:
        """Create ``path`` (a folder of this run) 0700 and return it."""
        return ensure_dir(path, private=True)

    def read_json(self, path: Path) -> Any | None:
        """A JSON record of this run, or None when it does not exist; ``UserError`` when it is
        not JSON (a damaged run directory)."""
        if not path.is_file():
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            raise UserError(f"{path}: not valid JSON: this run directory is damaged (restore "
                            "the file, or start a new --run directory)") from None

    def is_private(self, path: Path) -> bool:
        """Whether ``path`` of this run is private by what it is (the class's list): the
        config, the votes, the ledger and its record, the releases, the token, DP-SGD's
        gradient distances and Bayesian epsilon wherever they are, and everything under
        ``teachers``, ``comparison``, ``report`` and ``audit``. ``partition`` is private or not
        by how the rows were dealt: its writer says."""
        path = Path(path)
        files = {self.config, self.votes, self.ledger, self.root / LEDGER_RECORD,
                 self.releases, self.token}
        folders = (self.teachers, self.comparison, self.report, self.audit)
        return (path in files or any(folder in path.parents for folder in folders)
                or path.name in (self.dpsgd_distances.name, self.dpsgd_bayesian.name))

    def write_json(self, path: Path, obj: Any, private: bool = False) -> None:
        """Write a JSON record atomically, 0600 if ``private`` or if the path is private by
        what it is (:meth:`is_private`): a writer cannot make a private record public."""
        write_json_atomic(path, obj, private or self.is_private(path))

    def private_records(self) -> int | None:
        """The number of private training records the teachers were partitioned over
        (``partition.json``), or None before the teachers' stage."""
        partition = self.read_json(self.partition)
        if partition is None:
            return None
        try:
            return int(partition["num_rows"])
        except (TypeError, KeyError, ValueError):
            raise UserError(f"{self.partition}: no num_rows: this run directory is damaged "
                            "(restore the file, or start a new --run directory)") from None

    def write_config(self, text: str) -> None:
        """Write ``config.toml`` atomically, private: it names the private data's file (its path
        may say what the data is) and the ledger the run charges."""
        write_bytes_atomic(self.config, text.encode(), private=True)

    def finished_stages(self) -> dict[str, float]:
        """The stages of ``pate run`` finished so far, with their seconds."""
        return self.read_json(self.stages) or {}

    def finish_stage(self, stage: str, seconds: float) -> None:
        """Record ``stage`` as finished in ``stages.json``."""
        done = self.finished_stages()
        done[stage] = round(seconds, 3)
        self.write_json(self.stages, done)

    def append_log(self, line: str) -> None:
        """Append one time-stamped line to ``log.txt`` (public: say no private figure)."""
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S")
        fd = os.open(self.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        if os.fstat(fd).st_size == 0:  # made here: 0644 whatever the umask, as public files are
            os.fchmod(fd, 0o644)
        with os.fdopen(fd, "a", encoding="utf-8") as fh:
            fh.write(f"{stamp} {line}\n")

    def log_lines(self) -> list[str]:
        """The lines of ``log.txt`` (none where it is missing or empty); a byte that is no
        UTF-8 (a file edited or damaged by hand) is read as the replacement character."""
        if not self.log.is_file():
            return []
        return self.log.read_text(encoding="utf-8", errors="replace").splitlines()

    def write_secret(self, path: Path, text: str) -> None:
        """Write a secret (a token) 0600."""
        write_bytes_atomic(path, text.encode(), private=True)


def _writable(folder: Path) -> bool:
    """Whether a file can be created in ``folder`` (the mode bits do not say so for root)."""
    probe = folder / ".pate-write-check"
    try:
        probe.touch()
        probe.unlink()
    except OSError:
        return False
    return True

