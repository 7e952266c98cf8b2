"""PATE from Python, on numpy arrays in memory, in the words of scikit-learn and Opacus.

``Teachers`` are fitted on the private data (disjoint partitions, trained vectorised in this
process), ``PrivateLabels`` answers the student's queries with a PATE mechanism against a
privacy budget, charging the same durable ledger as ``pate serve`` (no HTTP), ``Student`` learns
from the public pool and the answers, and ``PrivateLabels.epsilon`` gives the epsilons you may
publish; ``DPSGD`` (:mod:`pate.api_dpsgd`) is the baseline to compare the student with at
the same epsilon. ``load_student`` reads back the student of a ``pate run`` directory (or of
``Student.save``); such a student also scores raw files (``Student.predict_file``). The
README's example is run by the test suite (``tests/test_api.py``).

Feature rows are used as given, unscaled (``pate run`` on a CSV file scales them for you):
standardise them first, with statistics of public rows (the pool), never of the private ones,
whose mean and spread would be a statistic of the private data; ``TableEncoder``
(:mod:`pate.api_tables`) does it for data frames as ``pate run`` does for a CSV file. Integer
images are 8-bit pixels, divided by 255 (give another range as floats in [0, 1]).

Privacy: the votes, the ledger and the private arrays stay private; publish the student and
the data-independent or smooth-sensitivity-sanitised epsilon only (docs/design.md).

Errors: every error raised on purpose is a :class:`pate.errors.PateError` with a one-line
message: ``UserError`` for input you can fix, ``BudgetExhausted`` where the budget cannot cover
a request (nothing was asked or spent), ``LedgerError`` where the ledger cannot be opened or
trusted (nothing released). Catch ``PateError`` for all of them. The mechanisms you build
from :mod:`analysis.mechanisms` (the math layer, below ``pate``) refuse bad parameters as they
are built, with ``analysis.mechanisms.ParameterError``, a ``ValueError``.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
from numpy.typing import ArrayLike, NDArray

from analysis.costs import realised_rdp_independent, steps, worst_case_queries
from analysis.mechanisms import MECHANISMS, Mechanism, ParameterError, mechanism_to_dict
from analysis.rdp import Conversion
from analysis.threshold import student_baseline
from analysis.votes_analysis import (
    EarlierRelease,
    PrivacyAnalysis,
    QuerySegment,
    analyze_segments,
)
from pate.aggregation.delta_policy import check_delta
from pate.aggregation.label_service import (
    BUDGET_SPENT_HINT,
    InProcessLabels,
    LabelService,
    note_ledger,
)
from pate.aggregation.ledger import Ledger
from pate.aggregation.ledger_store import ledger_url
from pate.aggregation.vote_pool import VotePool
from pate.api_checks import (
    accuracy_of,
    checked_device,
    checked_integer,
    checked_kind,
    checked_labels,
    checked_network,
    checked_rate,
    checked_rows,
    checked_rows_of,
    warn_if_of_script,
)
from pate.api_dpsgd import DPSGD
from pate.api_tables import TableEncoder
from pate.data.augment import AUGMENTATIONS
from pate.data.files import rows_said
from pate.data.partitions import PARTITIONS
from pate.data.task import private_rows_key, rows_content_digest, rows_fingerprint
from pate.data.votes_file import check_votes
from pate.errors import BudgetExhausted, UserError
from pate.io import write_json_atomic
from pate.rundir import STUDENT_SCHEMA, RunDir
from student.checks import warn_unseen_classes
from student.defaults import STUDENT
from student.models import ModelSpec, build_classifier, check_network
from student.predict import load_schema, score_file
from student.rounds import Received, ask
from student.sanitised import answers_digest, former_answers_digest, ledger_releases
from student.training import (
    FitConfig,
    build_learner,
    fit,
    load_classifier,
    method_for_data,
    predict_proba,
    save_model,
    seed_everything,
)
from teachers import checkpoints
from teachers.choices import (
    DEFAULT_MODEL,
    MODEL_RECORDS,
    POOL_ENCODER_MODELS,
    model_data_problem,
)
from teachers.defaults import TEACHERS
from teachers.distributed import shard_ranges, train_shard
from teachers.ensemble import TrainConfig
from teachers.manifest import TeachersManifest
from teachers.models import check_user_model, fit_pool_encoder
from teachers.partition import deal_rows
from teachers.rng import SEED_LIMIT
from teachers.votes import Ensemble, load_ensemble

__all__ = ["DPSGD", "PrivateLabels", "PublishableEpsilon", "Student", "TableEncoder", "Teachers",
           "load_student"]


class Teachers:
    """An ensemble of ``n_teachers`` teachers, each fitted on its own disjoint part of the
    private rows (a seeded partition), ``shard_size`` at a time, vectorised.

    ``model`` is a built-in architecture (``cnn``, ``cnn-pool``, ``resnet``, ``mlp``, ...) or a
    ``"package.module:factory"`` (or that factory function itself, defined at the top of a
    module), by default ``cnn`` on images and ``mlp`` on feature rows;
    ``n_classes`` is the label set's size (public schema: it is never read from the private
    labels). Feature rows are used unscaled: standardise them with the pool's statistics
    first (see the module's docstring). ``augment`` (``none``, ``shift``, ``shift-flip``) and
    ``mixup`` (the alpha of its Beta distribution; 0: off) are as in ``pate run``'s
    ``[teachers]``; ``device`` trains and votes there (``cuda`` on a GPU). ``partition``
    (``position``, ``record`` or ``key``, ``teachers.partition``) is how the rows are dealt: by
    record, each goes to the teacher its content hashes to, and the privacy analysis holds for
    adding or removing a record (as DP-SGD's), not only for changing one; by key, each goes to
    the teacher its key (``fit``'s ``keys``: whose the row is) hashes to, and the analysis holds
    for adding or removing all of one person's rows."""

    def __init__(self, n_teachers: int, n_classes: int, *, model: str | None = None,
                 epochs: int = TEACHERS.epochs, batch_size: int = TEACHERS.batch_size,
                 lr: float = TEACHERS.lr, shard_size: int = TEACHERS.shard_size,
                 augment: str = "none", mixup: float = TEACHERS.mixup, seed: int = 0,
                 device: str = "cpu", partition: str = "position") -> None:
        model = checked_network(model, "model")
        if partition not in PARTITIONS:
            raise UserError(f"partition must be one of {', '.join(PARTITIONS)}, got "
                            f"{partition!r}")
        self.partition = partition
        self.n_teachers = checked_integer("n_teachers", n_teachers, 1)
        self.n_classes = checked_integer("n_classes", n_classes, 2)
        self.shard_size = checked_integer("shard_size", shard_size, 1)
        self.model = model
        self.config = TrainConfig(model=model or DEFAULT_MODEL["image"],
                                  epochs=checked_integer("epochs", epochs, 1),
                                  batch_size=checked_integer("batch_size", batch_size, 1),
                                  lr=checked_rate("lr", lr), augment=augment,
                                  mixup=0.0 if mixup == 0 else checked_rate("mixup", mixup),
                                  seed=checked_integer("seed", seed, 0, SEED_LIMIT))
        self.device = checked_device(device)
        self.ensemble_: Ensemble | None = None
        # set by fit (or load): how many private rows, their fingerprint, and that of the rows
        # in any order (the ledgers' second key, Task.private_rows_fingerprint; PRIVATE)
        self.private_records_: int | None = None
        self.private_fingerprint_: str | None = None
        self.private_rows_fingerprint_: str | None = None

    @property
    def encoder_(self) -> dict[str, np.ndarray] | None:
        """The frozen encoder fitted on the public pool, for the models that read one (the
        ensemble's, as CPU arrays); None before ``fit`` or ``load``, and for the others."""
        encoder = None if self.ensemble_ is None else self.ensemble_.encoder
        return None if encoder is None else {k: v.cpu().numpy() for k, v in encoder.items()}

    def fit(self, x: ArrayLike, y: ArrayLike, keys: ArrayLike | None = None,
            x_public: ArrayLike | None = None) -> Teachers:
        """Partition the private rows among the teachers and train them; ``keys`` (one per row:
        whose it is) where the rows are dealt by key; ``x_public``, the public pool's rows, for
        the models that fit a frozen encoder on it first (``cnn-pool-hog-simclr``: SimCLR;
        ``hog-scatter-whitened``: the whitening of its fixed maps), and only for them."""
        xs, ys = checked_rows(x), checked_labels(y, self.n_classes)
        if (x_public is None) == (self.config.model in POOL_ENCODER_MODELS):
            raise UserError(f"x_public= (the public pool) goes with the models that fit an "
                            f"encoder on it ({', '.join(sorted(POOL_ENCODER_MODELS))}), and "
                            "only with them")
        pool = None if x_public is None else checked_rows(x_public)
        if pool is not None and pool.shape[1:] != xs.shape[1:]:
            raise UserError(f"x_public has rows of {list(pool.shape[1:])}, x of "
                            f"{list(xs.shape[1:])}")
        if pool is not None and len(pool) < 2:
            raise UserError("x_public needs at least 2 rows to fit an encoder on")
        if len(ys) != len(xs):
            raise UserError("y must hold one label per row of x, got "
                            + rows_said(len(ys), len(xs), "labels", private=True))
        if (keys is None) == (self.partition == "key"):
            raise UserError("keys= (whose each row is) go with partition='key', and only with it")
        whose = None if keys is None else np.asarray(keys).astype(str).reshape(-1)
        if whose is not None and len(whose) != len(xs):
            raise UserError("keys must hold one key per row of x, got "
                            + rows_said(len(whose), len(xs), "keys", private=True))
        kind = checked_kind(xs, self.config.augment)
        if self.model is None:
            self.config = replace(self.config, model=DEFAULT_MODEL[kind])
        problem = model_data_problem(self.config.model, kind, xs.shape[1:])
        if problem:
            raise UserError(problem)
        check_user_model(self.config.model, xs.shape[1:], self.n_classes, self.config.batch_size)
        part = deal_rows(self.partition, xs, ys, self.n_teachers, self.config.seed, whose)
        fitted = (None if pool is None else
                  fit_pool_encoder(self.config.model, pool, self.config.seed, self.device))
        shards = [train_shard(self.config, xs, ys, self.n_classes, teachers,
                              part.parts(teachers), part.step_rows(teachers), self.device,
                              torch.get_num_threads(), fitted)
                  for teachers in shard_ranges(self.n_teachers, self.shard_size)]
        encoder = (None if fitted is None else
                   {k: torch.as_tensor(v, device=self.device) for k, v in fitted.items()})
        self.ensemble_ = Ensemble(self.config.model, xs.shape[1:], self.n_classes,
                                  [{k: torch.from_numpy(v).to(self.device) for k, v in s.items()}
                                   for s in shards], device=self.device, encoder=encoder)
        self.private_records_, self.private_fingerprint_ = len(ys), rows_fingerprint(xs, ys)
        self.private_rows_fingerprint_ = private_rows_key(rows_content_digest(xs))
        return self

    def vote(self, x: ArrayLike) -> NDArray[np.int32]:
        """The teachers' vote histograms ``[rows, n_classes]`` on public rows (PRIVATE)."""
        if self.ensemble_ is None:
            raise UserError("fit the teachers first")
        return self.ensemble_.vote(checked_rows(x))

    def save(self, directory: str | Path) -> Path:
        """Write the fitted teachers under ``directory/teachers/`` as ``pate teachers train``
        does (one safetensors file per shard and a manifest with their sha256), every file
        0600 in 0700 folders: the weights are PRIVATE. ``Teachers.load`` reads them back."""
        if self.ensemble_ is None:
            raise UserError("fit the teachers first")
        root = Path(directory)
        if root.exists() and not root.is_dir():
            raise UserError(f"{root}: not a folder; save writes the teachers into a folder")
        if RunDir(root).manifest.exists():
            raise UserError(f"{root} holds teachers already: save into another folder")
        warn_if_of_script(self.config.model, "the teachers'")
        ens = self.ensemble_
        shards = {str(i): {"sha256": checkpoints.save_shard(
                      root, i, {k: v.cpu().numpy() for k, v in shard.items()})}
                  for i, shard in enumerate(ens.shards)}
        fitted = self.encoder_
        encoder = ({} if fitted is None else {"pool_encoder": checkpoints.encoder_record(
            root, fitted, MODEL_RECORDS[self.config.model].pool_encoder)})
        checkpoints.write_manifest(root, {**encoder,
            "model": self.config.model, "in_shape": list(ens.in_shape),
            "num_classes": ens.num_classes, "num_teachers": ens.num_teachers,
            "train": asdict(self.config), "partition": self.partition, "shards": shards,
            "done": True, "private_records": self.private_records_,
            "private_fingerprint": self.private_fingerprint_,
            "private_data_fingerprint": self.private_fingerprint_,  # the arrays as given: both
            "private_rows_fingerprint": self.private_rows_fingerprint_,
            "saved_by": "pate.api.Teachers"})
        return root

    @classmethod
    def load(cls, directory: str | Path, device: str = "cpu") -> Teachers:
        """Teachers written by ``save`` (or by ``pate run``, from its run directory), checked
        against their recorded sha256, ready to ``vote`` on ``device``."""
        device = checked_device(device)
        manifest = TeachersManifest.read(directory)
        if manifest is None:
            raise UserError(f"{directory}: no saved teachers (teachers/manifest.json)")
        try:
            teachers = cls(manifest.num_teachers, manifest.num_classes, model=manifest.model,
                           device=device, partition=manifest.partition)
            teachers.config = TrainConfig(**manifest.train_settings)
        except (KeyError, TypeError, ValueError):
            raise UserError(f"{directory}: its teachers' manifest is not of this version "
                            "(num_teachers, num_classes, model, train)") from None
        teachers.ensemble_ = load_ensemble(directory, device)
        teachers.private_records_ = (manifest.private_records
                                     or RunDir(directory).private_records())
        # the key of the ledgers of their data, as their votes carry it
        teachers.private_fingerprint_ = manifest.data_fingerprint
        teachers.private_rows_fingerprint_ = manifest.rows_fingerprint
        return teachers


@dataclass(frozen=True)
class PublishableEpsilon:
    """What may be published about the answers given so far, at ``delta``: the
    data-independent epsilon of the queries asked and of the teachers' answers (their counts,
    which the answers show anyway; not PATE 2018's Table 2 expectation, a function of the
    votes), the smooth-sensitivity-sanitised data-dependent one (None for LNMax, or where none
    was drawn), and what the ledger charged (data-independent, realised, every client of the
    budget). On few answers the sanitised figure may exceed the data-independent one. The
    first two cover this object's answers only: a student that also learns from answers other
    objects or runs received on the ledger is covered by ``ledger_spent``. ``not_sanitised``
    says why ``smooth_sensitivity`` is None (None where it is not)."""

    data_independent: float
    smooth_sensitivity: float | None
    ledger_spent: float
    delta: float
    not_sanitised: str | None = None


# why PublishableEpsilon.smooth_sensitivity is None
NOT_ASKED = "not asked for (sanitise=False)"
NO_ANALYSIS = "this mechanism has no smooth-sensitivity analysis (LNMax): publish data_independent"
NOT_RELEASED = ("no figure could be released for these answers (the data-dependent analysis "
                "does not hold for them, or a figure without noise would follow an earlier "
                "release): publish data_independent")


def _pool_indices(indices: ArrayLike) -> NDArray[np.int64]:
    """Pool row numbers: a 1-d sequence of distinct integers (``UserError`` otherwise, before
    anything is asked)."""
    try:
        a = np.asarray(indices)
    except (TypeError, ValueError):  # ragged
        a = np.zeros((0, 0))
    if a.ndim != 1 or not (a.size == 0 or np.issubdtype(a.dtype, np.integer)):
        raise UserError("indices must be a 1-d sequence of integer pool row numbers")
    if np.unique(a).size != a.size:
        raise UserError("indices must not repeat")
    if a.size and a.min() < 0:
        raise UserError(f"indices are pool row numbers, >= 0: got {int(a.min())}")
    return a.astype(np.int64)


class PrivateLabels:
    """The aggregator over the teachers' ``votes`` on the public pool (rows are pool indices),
    with its durable privacy ledger: ``ledger`` is a file (SQLite) or a SQLAlchemy URL
    (``postgresql://...``), the same a ``pate serve`` of this data would use: one budget per
    body of private data. Noise comes from the operating system's
    entropy; every answer is charged before it is returned, and a request whose worst case does
    not fit the budget is refused (and asked again in halves by ``ask``). Given
    ``private_records``, the number of private rows the teachers learnt from, ``delta`` must be
    below 1/n (a ``UserError`` otherwise, unless ``allow_large_delta``; a warning above
    1/(10 n)), as ``pate serve`` and ``pate run`` require. Given the ``teachers`` whose votes
    these are, n is theirs, and the ledger is entered in the registry of the ledgers of their
    private data (``pate.aggregation.budget_registry``): a ledger new to it while others
    charge the same data is warned of, as their budgets add up.

    A pool row asked again of the same ledger, mechanism and votes, by a later object or
    another process, gets its first answer again, free (a release is a release); other votes
    (teachers trained again, on the same budget) answer it afresh, charged. This object refuses
    a row it has asked already (its answer is in ``received``).

    The sanitised epsilons released (``epsilon``) are kept in the ledger, under its write
    lock: each is drawn once per set of answers, whichever object or process of the ledger
    asks, since fresh draws for the same answers would average their noise away
    (docs/privacy-math.md §5)."""

    def __init__(self, votes: ArrayLike, mechanism: Mechanism, *, epsilon_budget: float,
                 delta: float, ledger: str | Path, conversion: Conversion = "improved",
                 private_records: int | None = None, allow_large_delta: bool = False,
                 teachers: Teachers | None = None) -> None:
        if not isinstance(mechanism, tuple(MECHANISMS.values())):
            raise UserError("mechanism must be one of analysis.mechanisms' "
                            f"{', '.join(c.__name__ for c in MECHANISMS.values())}, got "
                            f"{mechanism!r}")
        try:
            self.pool = VotePool(check_votes(np.asarray(votes)))
        except (TypeError, ValueError):  # ragged rows, not numbers
            raise UserError("votes must be a 2-d array of counts [queries, classes]") from None
        epsilon_budget = checked_rate("epsilon_budget", epsilon_budget)
        delta = checked_rate("delta", delta)
        if not isinstance(ledger, str | Path):
            raise UserError(f"ledger must be a file path or a URL, got {ledger!r}")
        if teachers is not None and not isinstance(teachers, Teachers):
            raise UserError(f"teachers must be the Teachers whose votes these are, got "
                            f"{type(teachers).__name__}")
        if teachers is not None and teachers.ensemble_ is None:
            raise UserError("fit the teachers first")
        if teachers is not None and (self.pool.votes.shape[1] != teachers.n_classes or np.any(
                self.pool.votes.sum(axis=1) != teachers.n_teachers)):  # said without a count
            raise UserError(f"votes are not those of these teachers: each row must hold "
                            f"{teachers.n_classes} classes' counts of their "
                            f"{teachers.n_teachers} votes")
        if teachers is not None and private_records is None:
            private_records = teachers.private_records_
        if private_records is not None:
            private_records = checked_integer("private_records", private_records, 1)
        elif not allow_large_delta:
            warnings.warn("PrivateLabels: delta is not checked against the size n of the "
                          "private data (it must be well below 1/n): give teachers= (which also "
                          "warns of other ledgers charging the same data) or private_records=",
                          stacklevel=2)
        check_delta(delta, private_records, allow_large_delta, "allow_large_delta=True")
        self.mechanism = mechanism
        url = ledger_url(ledger)
        try:
            self.service = LabelService.open(mechanism, self.pool, url,
                                             epsilon_budget=epsilon_budget, delta=delta,
                                             conversion=conversion)
        except ParameterError as exc:  # a threshold outside [0, the votes' teachers]
            raise UserError(str(exc)) from None
        try:
            if teachers is not None:
                note_ledger(teachers.private_fingerprint_, url,
                            rows_fingerprint=teachers.private_rows_fingerprint_)
        except BaseException:
            self.service.close()
            raise
        self._source = InProcessLabels(self.service)
        self.received = Received.empty()
        self._probs: list[NDArray[np.float64]] = []

    @property
    def ledger(self) -> Ledger:
        """The ledger that charges this object's answers (its service's)."""
        return self.service.ledger

    def ask(self, indices: ArrayLike, student_probs: ArrayLike | None = None,
            request_size: int = STUDENT.request_size) -> Received:
        """Labels for the pool rows ``indices`` (-1 where the aggregator declined), as many as
        the budget allows (a warning says when that is fewer than asked, the first ones);
        Interactive-GNMax also takes the student's probabilities. A budget that covers not one
        of them is ``BudgetExhausted``: nothing was asked or spent."""
        index = _pool_indices(indices)
        again = np.intersect1d(index, self.received.pool_index)
        if again.size:
            raise UserError(f"{again.size} of these pool rows were asked already (their "
                            "answers are in .received): nothing was asked or spent")
        try:
            probs = None if student_probs is None else np.asarray(student_probs, np.float64)
        except (TypeError, ValueError):
            raise UserError("student_probs must be numbers [queries, classes]") from None
        request_size = checked_integer("request_size", request_size, 1)
        got, exhausted = ask(self._source, index, probs, request_size)
        if exhausted and not len(got):
            raise BudgetExhausted("the privacy budget does not cover even one more query: "
                                  f"nothing was asked or spent ({BUDGET_SPENT_HINT})")
        got = replace(got, pool_size=len(self.pool.votes))  # Student.fit checks its pool
        self.received = self.received + got
        if probs is not None:
            self._probs.append(probs[:len(got)])
        if exhausted:
            warnings.warn(f"the privacy budget covered {len(got)} of the {index.size} queries: "
                          "the rest were not asked", stacklevel=2)
        return got

    def queries_left(self) -> int:
        """How many more queries the budget covers whatever the votes: each answered by the
        teachers, its worst case, beyond what the ledger has spent
        (``analysis.costs.worst_case_queries``); ``ask`` answers at least that many before it
        stops at the budget. Reads only public figures."""
        spent_independent, _ = self.ledger.private_totals()  # the data-dependent part unused
        return worst_case_queries(self.mechanism, self.ledger.epsilon_budget,
                                  self.ledger.delta, self.ledger.orders,
                                  conversion=self.ledger.conversion, spent=spent_independent)

    def epsilon(self, sanitise: bool = True) -> PublishableEpsilon:
        """The epsilons you may publish for every query this object asked so far.

        The data-independent one reads no vote: it is free. The sanitised one is a release of
        its own, with noise (docs/privacy-math.md §5), drawn once per set of answers (the same
        rows, votes and mechanism): asked again, by this object or another on the same ledger,
        it is the same figure, but a release for other answers (after more ``ask``) composes
        with every earlier one, so each call between asks makes the next sanitised figure
        larger. Ask for it once, at the end; with ``sanitise=False`` nothing is released and
        ``smooth_sensitivity`` is None. Publish the data-independent epsilon alone, or both
        (their guarantee is then the smaller of the sanitised one and the data-independent one
        with the release's cost added, §5); decide which before drawing the sanitised one."""
        budget = self.ledger.budget()
        why = (NOT_ASKED if not sanitise else None if
               steps(self.mechanism).answer.smooth_sensitivity else NO_ANALYSIS)
        if not len(self.received):
            return PublishableEpsilon(0.0, None if why else 0.0, budget.epsilon_spent,
                                      budget.delta, why)
        independent = self.ledger.epsilon(realised_rdp_independent(
            self.mechanism, len(self.received), int(self.received.by_teachers.sum()),
            self.ledger.orders))
        if why:
            return PublishableEpsilon(independent, None, budget.epsilon_spent, budget.delta, why)

        def analyse(earlier: list[EarlierRelease]) -> PrivacyAnalysis:  # only for a new release
            votes = self.pool.votes[self.pool.rows(self.received.pool_index)]
            baseline = (None if not self._probs
                        else student_baseline(votes, np.concatenate(self._probs)))
            return analyze_segments([QuerySegment(votes, self.mechanism, baseline)],
                                    budget.delta, conversion=self.ledger.conversion,
                                    earlier=earlier)

        order = np.argsort(self.received.pool_index)
        former = former_answers_digest(  # as versions before 2026-11-27 kept it
            mechanism_to_dict(self.mechanism), self.pool.digest, self.received.pool_index[order],
            np.concatenate(self._probs)[order] if self._probs else None)
        with ledger_releases(self.ledger) as releases:
            sanitised = releases.release(len(self.received), analyse, self.ledger.conversion,
                                         self._answers_digest(), formerly=[former])
        return PublishableEpsilon(independent, sanitised, budget.epsilon_spent, budget.delta,
                                  None if sanitised is not None else NOT_RELEASED)

    def _answers_digest(self) -> str:
        """Which answers a release covers (``student.sanitised.answers_digest``): the
        mechanism, the votes, the rows asked and the probabilities sent with them; the same
        as ``pate run``'s for the same rows of the same mechanism."""
        sent = bool(self._probs) and steps(self.mechanism).student_gamma is not None
        return answers_digest(self.pool.digest, [(
            self.mechanism, self.received.pool_index,
            np.concatenate(self._probs) if sent else None)])

    def close(self) -> None:
        self.service.close()

    def __enter__(self) -> PrivateLabels:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Student:
    """The student: ``method`` ``vat`` (Miyato et al. 2018), ``supervised`` or ``gan``
    (Salimans et al. 2016), on ``arch`` (default per method; ``mlp`` suits features; a
    network's import path or factory function, as ``Teachers``' ``model``), trained
    ``epochs`` passes over the public pool. ``augment`` (random shifts, and mirroring with
    ``shift-flip``), ``vat_eps`` and ``entmin`` (VAT's perturbation size and entropy
    minimisation) are ``pate student train``'s; ``device`` trains there. ``seed`` seeds
    initialisation and order only."""

    def __init__(self, method: str = "vat", *, arch: str | None = None,
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
    root = Path(path)
    folder = RunDir(root).student if (RunDir(root).student / "model.json").is_file() else root
    loaded = load_classifier(folder)
    if loaded is None:
        raise UserError(f"{root}: no saved student (model.safetensors and model.json)")
    student = Student("supervised", arch=loaded[1].arch)
    student.model_, student.spec_ = loaded
    if (folder / STUDENT_SCHEMA).is_file():
        student.schema_ = load_schema(folder, loaded[1])
    return student
