"""``pate audit models``: membership inference against a run's models, with randomised membership,
so that the attacks' success gives a sound lower bound on epsilon.

An empirical epsilon is a lower bound only when membership is random and unknown to the attack
(T. Steinke, M. Nasr, M. Jagielski, "Privacy Auditing with One (1) Training Run", NeurIPS 2023).
A run's own teachers were trained on every row of the private training split, so no record of the
run is an unseen one; the audit therefore retrains, inside itself, each audited model exactly as
the run trained it, with audit records ("canaries") each included by an independent fair coin:

* **teacher** (the teachers' leakage): ``teachers`` teachers of the run, chosen at random, each
  retrained with the run's architecture, training settings, teacher id (so the same initial
  weights) and number of steps on its own partition, of which a fraction ``canary_fraction`` is
  set aside as canaries and each canary kept by a coin flip. A canary can only ever be in its own
  teacher's data, so the retrained teachers together are as private as one (parallel
  composition): all their canaries count in one audit.
* **student** (the published model): the same retrained teachers replace the run's in the
  ensemble (the others' votes are the run's, ``votes.npz``), every round of the run is answered
  again on the rows the student asked (``labels.npz``, ``student/rounds.json``) by the round's
  real aggregator (``pate.aggregation``, noise from the operating system), and the student is
  trained again on the answers with the run's method, network and settings (from
  ``student/metrics.json``; ``student_epochs`` may shorten it). This is the whole path a private
  record can take to the student, so the retrained student is (epsilon, delta)-DP for every
  canary with the run's analytic epsilon: the run answers the same number of queries with the
  same mechanisms, and the student is post-processing of the answers.
* **nonprivate** (the model the data holder would publish without PATE): the teachers' network
  and training settings on ``nonprivate_rows`` private rows in one piece (no partition, no
  noise), plus ``nonprivate_canaries`` canaries by coin flips; its accuracy is measured too.
* **control** (positive control): the same network, without privacy, on ``control_rows``
  private rows and the included canaries of ``control_canaries`` (a few hundred records in all),
  trained ``control_epochs`` epochs; by default its canaries carry a random wrong label, which a
  model can fit only by memorising it. Its audit must find epsilon > 1, or the audit could not
  have found a leak and fails.

Canaries are rows of the private training split; the non-private model's and the control's come
from outside the audited teachers' partitions and from each other's. The attacks see the trained
model and public data only: the loss-threshold attack (Yeom et al. 2018) and the offline
likelihood-ratio attack (Carlini et al. 2022) whose reference models are trained the same way on
disjoint subsets of the public pool (its published labels; the student's reference is the
student's method on the true labels of the rows it asked), never on a private row. The coin flips
are used only to count correct guesses (``analysis.membership``).

Everything about private records (canary rows, coin flips, per-record scores) is written 0600 to
``DIR/audit/`` (``models-<UTC time>-<tag>-records.npz``), with the summary
(``models-<UTC time>-<tag>.json``; the tag random, so that no audit overwrites another's);
what is returned and printed are aggregate figures only (AUC, TPR at low FPR, the epsilon lower
bound). The models trained here are discarded.
"""

from __future__ import annotations

import math
import secrets
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from pate.aggregation.aggregators import Aggregator
from pate.audit.attacks import ModelsAudit, TargetAudit, attack_results
from pate.audit.model_options import TARGETS, ModelsAuditOptions
from pate.audit.retraining import (
    Recipe,
    StudentRecipe,
    classifier_log_probs,
    select_models,
    stacked_log_probs,
    train_models,
    train_student,
)
from pate.config import parse_config
from pate.data.partitions import counts_private
from pate.data.task import DataSource, load_task
from pate.data.votes_file import load_votes_with_index
from pate.errors import UserError
from pate.io import ensure_dir, write_json_atomic, write_with_atomic
from pate.rundir import RunDir
from student.choices import POOL_FEATURE_ARCHS
from student.rounds import Received, read_rounds, round_plan
from student.training import (
    FitConfig,
    MethodConfig,
    load_classifier,
    predict_proba,
)
from teachers import checkpoints
from teachers.ensemble import TrainConfig
from teachers.manifest import TeachersManifest, teachers_source
from teachers.partition import deal_rows

# Each audit's files, named by when it started (UTC), so that no audit overwrites another's.
RECORDS_FILE = "models-{stamp}-records.npz"
SUMMARY_FILE = "models-{stamp}.json"
_REFERENCE_ID = 1_000_000        # teacher ids of reference models: never a run's teacher


# -- the run -----------------------------------------------------------------------------------


@dataclass
class Run:
    """What the audit reads of a run directory. ``pool_y`` is None for a user's files (their
    public labels are never read: no reference model can be trained), ``eval_*`` without test
    data (no accuracy)."""

    dir: RunDir
    manifest: TeachersManifest
    recipe: Recipe
    train_x: NDArray[np.float32] = field(repr=False)  # the private rows
    train_y: NDArray[np.int64] = field(repr=False)
    pool_x: NDArray[np.float32]
    pool_y: NDArray[np.int64] | None
    eval_x: NDArray[np.float32] | None
    eval_y: NDArray[np.int64] | None
    parts: list[NDArray[np.int64]]
    step_rows: NDArray[np.int64]  # Partition.step_rows: what sets each teacher's steps
    config: Any | None


def _source(run: RunDir, config: Any | None) -> DataSource:
    """Where the run's data comes from: the config's section, else the teachers' manifest
    (``teachers.manifest.teachers_source``)."""
    source = config.data.source() if config is not None else teachers_source(run.root)
    if source is None:
        raise UserError(f"{run}: its teachers' manifest records no data it can read (teachers "
                        "of another version): train them again with this one")
    return source


def load_run(run_dir: str | Path, device: str = "cpu") -> Run:
    """The run's teachers' manifest and recipe, its data and its partition (recomputed and
    checked against ``partition.json``); UserError when the run is not trained."""
    run = RunDir(run_dir)
    run.require_dir()
    manifest = TeachersManifest.trained(run.root)
    config = (parse_config(run.config.read_text(), str(run.config)) if run.config.is_file()
              else None)
    task = load_task(_source(run, config))
    assert task.private_x is not None and task.private_y is not None
    if manifest.private_changed(task):
        raise UserError("the private data is not what this run's teachers were trained on (its "
                        "rows, their order or their labels changed since): cannot audit this run")
    train = TrainConfig(**manifest.train_settings)
    part = deal_rows(manifest.partition, task.private_x, task.private_y, manifest.num_teachers,
                     train.seed, task.private_keys)
    recorded = run.read_json(run.partition)
    if recorded is not None and recorded.get("sha256") != part.sha256:
        raise UserError(f"{run.partition} does not match the partition the run's settings give; "
                        "cannot audit this run")
    sha256 = manifest.pool_encoder_sha256
    encoder = None if sha256 is None else checkpoints.load_encoder(run.root, sha256, device)
    recipe = Recipe(train, manifest.in_shape, manifest.num_classes, encoder, device)
    return Run(run, manifest, recipe, task.private_x, task.private_y, task.pool_x, task.pool_y,
               task.eval_x, task.eval_y, part.parts(), part.step_rows(), config)


def _accuracy(run: Run, predict: Callable[[NDArray[np.float32]], NDArray[np.float64]]
              ) -> float | None:
    """Accuracy on the run's evaluation rows of ``predict`` (log-probabilities or
    probabilities ``[..., n, classes]``; the mean over leading axes), None without test data."""
    if run.eval_x is None or run.eval_y is None:
        return None
    return float((predict(run.eval_x).argmax(-1) == run.eval_y).mean())


def _reference_sets(rng: np.random.Generator, x: NDArray[np.float32],
                    y: NDArray[np.int64] | None, size: int, wanted: int
                    ) -> list[tuple[NDArray[np.float32], NDArray[np.int64]]]:
    """Up to ``wanted`` disjoint random subsets of ``size`` labelled public rows (as many as
    fit; none when the public labels are unknown)."""
    if y is None:
        return []
    count = min(wanted, len(y) // max(size, 1))
    order = rng.permutation(len(y))[:count * size].reshape(count, size)
    return [(x[o], y[o]) for o in order]


@dataclass(frozen=True)
class Canaries:
    """Audit records: ``rows`` of the private training split, ``members`` their coin flips,
    ``owner`` which audited model each could join."""

    rows: NDArray[np.int64]
    members: NDArray[np.bool_]
    owner: NDArray[np.int64]


def _flip(rng: np.random.Generator, rows: NDArray[np.int64], owner: NDArray[np.int64]
          ) -> Canaries:
    """Independent fair coins for ``rows``, the rows shuffled (the attack's ties fall by
    position, which must not depend on the coins)."""
    order = rng.permutation(len(rows))
    return Canaries(rows[order], rng.random(len(rows)) < 0.5, owner[order])


def _finish(target: str, description: str, canaries: Canaries, training_rows: int,
            references: int, accuracy: float | None, analytic: tuple[float | None, str | None],
            target_lp: NDArray[np.float64], reference_lp: NDArray[np.float64] | None,
            labels: NDArray[np.int64], delta: float, confidence: float, started: float,
            records: dict[str, NDArray[Any]]) -> TargetAudit:
    results, scores = attack_results(target_lp, reference_lp, labels, canaries.members, delta,
                                     confidence)
    records[f"{target}_rows"] = canaries.rows
    records[f"{target}_members"] = canaries.members
    records[f"{target}_owner"] = canaries.owner
    records.update({f"{target}_{k}_scores": v for k, v in scores.items()})
    return TargetAudit(target, description, len(canaries.rows), int(canaries.members.sum()),
                       training_rows, references, accuracy, *analytic, results,
                       time.perf_counter() - started)


# -- the targets -------------------------------------------------------------------------------


@dataclass
class RetrainedTeachers:
    """The audited teachers retrained with their canaries: ids, stacked parameters, canaries
    (``owner`` = position in ``ids``) and each one's number of training rows."""

    ids: NDArray[np.int64]
    params: dict[str, torch.Tensor]
    canaries: Canaries
    sizes: NDArray[np.int64]
    references: dict[str, torch.Tensor] | None


def retrain_teachers(run: Run, options: ModelsAuditOptions, rng: np.random.Generator,
                     with_references: bool) -> RetrainedTeachers:
    """``options.teachers`` random teachers, each on its partition less its canaries plus the
    canaries its coins keep, with the run's id, settings and number of steps; with
    ``with_references``, reference models of the same kind on disjoint public subsets of the
    teachers' mean size, trained in the same group."""
    k = run.manifest.num_teachers
    ids = np.sort(rng.choice(k, options.teachers, replace=False))
    rows, owner, data = [], [], []
    for j, t in enumerate(ids):
        part = rng.permutation(run.parts[t])
        c = int(options.canary_fraction * len(part))
        if c < 1 or c == len(part):
            raise UserError(f"--canary-fraction {options.canary_fraction} leaves teacher {t} "
                            "no canary or no base row")
        rows.append(part[:c])
        owner.append(np.full(c, j))
    canaries = _flip(rng, np.concatenate(rows), np.concatenate(owner))
    for j, t in enumerate(ids):
        mine = canaries.rows[(canaries.owner == j) & canaries.members]
        keep = np.concatenate([np.setdiff1d(run.parts[t], canaries.rows[canaries.owner == j]),
                               mine])
        data.append((run.train_x[keep], run.train_y[keep]))
    sizes = np.array([len(d[1]) for d in data])
    refs = (_reference_sets(rng, run.pool_x, run.pool_y, int(sizes.mean().round()),
                            options.references) if with_references else [])
    # the steps the run's deal gives each teacher's rows: by position the run's smallest share;
    # by record or key its own rows, canaries kept included; the references take the fewest
    by_position = run.manifest.partition == "position"
    steps = run.step_rows[ids] if by_position else sizes
    params = train_models(run.recipe, data + refs,
                          [*ids.tolist(), *(_REFERENCE_ID + np.arange(len(refs))).tolist()],
                          np.concatenate([steps, np.full(len(refs), steps.min())]))
    a = len(ids)
    return RetrainedTeachers(ids, select_models(params, slice(0, a)), canaries, sizes,
                             select_models(params, slice(a, None)) if refs else None)


def audit_teacher(run: Run, retrained: RetrainedTeachers, delta: float, confidence: float,
                  records: dict[str, NDArray[Any]], started: float) -> TargetAudit:
    """Target (a): each canary attacked on its own retrained teacher."""
    c = retrained.canaries
    x, y = run.train_x[c.rows], run.train_y[c.rows]
    lp = stacked_log_probs(run.recipe, retrained.params, x)
    target_lp = lp[c.owner, np.arange(len(c.rows))]
    ref_lp = (None if retrained.references is None
              else stacked_log_probs(run.recipe, retrained.references, x))
    acc = _accuracy(run, lambda x: stacked_log_probs(run.recipe, retrained.params, x))
    desc = (f"{len(retrained.ids)} of the run's {run.manifest.num_teachers} teachers, each "
            f"retrained on its own partition ({run.recipe.train.model}, "
            f"{run.recipe.train.epochs} epochs) with its canaries by coin flips")
    return _finish("teacher", desc, c, int(retrained.sizes.mean()),
                   0 if ref_lp is None else len(ref_lp), acc,
                   (None, "no privacy (one teacher)"), target_lp, ref_lp, y, delta, confidence,
                   started, records)


def _free_rows(run: Run, used: NDArray[np.int64]) -> NDArray[np.int64]:
    return np.setdiff1d(np.arange(len(run.train_y)), used)


def audit_supervised(run: Run, target: str, base_rows: int, canary_count: int, epochs: int,
                     references: int, rng: np.random.Generator, used: NDArray[np.int64],
                     delta: float, confidence: float, records: dict[str, NDArray[Any]],
                     started: float, mislabel: bool = False
                     ) -> tuple[TargetAudit, NDArray[np.int64]]:
    """Targets (b) and the positive control: the teachers' network and settings (``epochs``
    epochs) without privacy on ``base_rows`` private rows plus the kept canaries of
    ``canary_count``, all from rows not in ``used``; references of the same kind on disjoint
    public subsets of its size. With ``mislabel`` each canary carries a random wrong label (in
    training and in the attack): a model can fit such a record only by memorising it, so a
    non-private model surely reveals its membership. Returns the audit and the rows it used."""
    free = rng.permutation(_free_rows(run, used))
    if base_rows + canary_count > len(free):  # the rows left unsaid where their count is private
        left = ("more than the private rows left" if counts_private(run.manifest.partition)
                else f"{len(free)} private rows left")
        raise UserError(f"{target}: {base_rows + canary_count} rows asked for, {left}")
    canaries = _flip(rng, free[:canary_count], np.zeros(canary_count, np.int64))
    c = run.recipe.num_classes
    labels = run.train_y[canaries.rows]
    if mislabel:
        labels = (labels + rng.integers(1, c, len(labels))) % c
    base = free[canary_count:canary_count + base_rows]
    x_train = np.concatenate([run.train_x[base], run.train_x[canaries.rows[canaries.members]]])
    y_train = np.concatenate([run.train_y[base], labels[canaries.members]])
    refs = _reference_sets(rng, run.pool_x, run.pool_y, len(y_train), references)
    recipe = replace(run.recipe, train=replace(run.recipe.train, epochs=epochs))
    k = run.manifest.num_teachers
    params = train_models(recipe, [(x_train, y_train), *refs],
                          [k, *(_REFERENCE_ID + k + np.arange(len(refs))).tolist()],
                          len(y_train))
    lp = stacked_log_probs(recipe, params, run.train_x[canaries.rows])
    first = select_models(params, slice(0, 1))
    acc = _accuracy(run, lambda x: stacked_log_probs(recipe, first, x))
    what = ("positive control: " if target == "control" else "") + (
        f"{run.recipe.train.model} without privacy on {len(y_train)} private rows "
        f"({base_rows} fixed, the rest {'mislabelled ' if mislabel else ''}canaries by coin "
        f"flips), {epochs} epochs")
    records[f"{target}_labels"] = labels
    audit = _finish(target, what, canaries, len(y_train), len(refs), acc,
                    (None, "no privacy"), lp[0], lp[1:] if refs else None, labels, delta,
                    confidence, started, records)
    return audit, np.concatenate([canaries.rows, base])


# -- the student -------------------------------------------------------------------------------


def student_recipe(run: Run, epochs: int | None, device: str) -> StudentRecipe:
    """Read ``student/metrics.json``, ``model.json``, ``rounds.json`` and ``labels.npz``; a
    round whose parameters were not recorded (a remote service) takes the run config's."""
    d = run.dir
    metrics = d.read_json(d.student_metrics)
    published = load_classifier(d.student)
    rounds = read_rounds(d)
    if metrics is None or published is None or not rounds or not d.labels.is_file():
        raise UserError(f"{d} has no trained student (student/metrics.json, model, rounds.json, "
                        "labels.npz); audit without the student target or run the student")
    model, spec = published
    training = metrics.get("training", {})
    method = MethodConfig(metrics["method"], spec.arch, spec.width, training.get("lr"),
                          training.get("vat_eps", 2.0), training.get("entmin", False))
    names = {f.name for f in fields(FitConfig)}
    fit_config = FitConfig(**{k: v for k, v in training.items() if k in names})
    fit_config = replace(fit_config, device=device,
                         epochs=fit_config.epochs if epochs is None else epochs)
    features = model.experts[1][0] if spec.arch in POOL_FEATURE_ARCHS else None
    received = Received.load(d.labels)
    out = [(mechanism, received.pool_index[rows]) for mechanism, rows in round_plan(
        rounds, received, None if run.config is None else run.config.aggregator.round_mechanism)]
    eps = metrics.get("epsilon", {})
    if eps.get("data_independent") is None:
        raise UserError(f"{d.student_metrics} records no data-independent epsilon")
    return StudentRecipe(method, spec, fit_config, features, out,
                         float(eps["data_independent"]), "data-independent (the ledger's)",
                         float(eps.get("delta", 0.0)))


def audit_student(run: Run, recipe: StudentRecipe, retrained: RetrainedTeachers,
                  options: ModelsAuditOptions, delta: float, records: dict[str, NDArray[Any]],
                  started: float) -> TargetAudit:
    """Target (c): the rounds answered again over the ensemble with the retrained teachers, the
    student trained again; references: the student's method on the true public labels of the
    rows it asked, each with its own seed."""
    votes, vote_pool = load_votes_with_index(run.dir.votes)
    order = np.argsort(vote_pool)
    asked = np.concatenate([rows for _, rows in recipe.rounds])
    at = order[np.searchsorted(vote_pool, asked, sorter=order)]
    if not np.array_equal(vote_pool[at], asked):
        raise UserError(f"{run.dir.votes} lacks rows the student asked")
    x_asked = run.pool_x[asked]
    old = _run_teachers(run, retrained.ids)
    old_votes = stacked_log_probs(run.recipe, old, x_asked).argmax(-1)
    new_votes = stacked_log_probs(run.recipe, retrained.params, x_asked).argmax(-1)
    c = run.recipe.num_classes
    swap = (np.eye(c, dtype=np.int64)[new_votes] - np.eye(c, dtype=np.int64)[old_votes]).sum(0)
    ensemble = votes[at] + swap
    if (ensemble < 0).any() or (votes[at] - np.eye(c, dtype=np.int64)[old_votes].sum(0) < 0).any():
        raise UserError(f"{run.dir.votes} does not hold the votes of the run's teachers")
    bounds = np.cumsum([0, *(len(rows) for _, rows in recipe.rounds)])

    def answer(i: int, probs: NDArray[np.float64] | None) -> NDArray[np.int64]:
        v = ensemble[bounds[i]:bounds[i + 1]]
        return Aggregator(recipe.rounds[i][0]).answer(v, probs).labels

    student = train_student(recipe, run.pool_x, answer)
    pool_y = run.pool_y
    refs = [] if pool_y is None else [
        train_student(replace(recipe, fit=replace(recipe.fit, seed=recipe.fit.seed + 1 + j)),
                      run.pool_x, lambda i, _probs: pool_y[recipe.rounds[i][1]])
        for j in range(options.student_references)]
    cx, cy = run.train_x[retrained.canaries.rows], run.train_y[retrained.canaries.rows]
    device = recipe.fit.device
    ref_lp = (np.stack([classifier_log_probs(m, cx, device) for m in refs]) if refs else None)
    acc = _accuracy(run, lambda x: predict_proba(student, x, device))
    desc = (f"the student ({recipe.method.method}, {recipe.spec.arch}, {recipe.fit.epochs} "
            f"epochs), retrained on the run's {len(asked)} queries answered again by "
            f"{', '.join(m.name for m, _ in recipe.rounds)} over the ensemble with the "
            f"{len(retrained.ids)} retrained teachers")
    return _finish("student", desc, retrained.canaries, int(retrained.sizes.mean()), len(refs),
                   acc, (recipe.epsilon, recipe.epsilon_basis),
                   classifier_log_probs(student, cx, device), ref_lp, cy, delta,
                   options.confidence, started, records)


def _run_teachers(run: Run, ids: NDArray[np.int64]) -> dict[str, torch.Tensor]:
    """The run's own (published to nobody) parameters of teachers ``ids``, stacked in that
    order; each shard that holds some of them is read once."""
    ids = np.asarray(ids, np.int64)
    shards = sorted((s for s in run.manifest.shards if s.teachers is not None),
                    key=lambda s: s.teachers.start)  # type: ignore[union-attr]
    starts = np.array([s.teachers.start for s in shards], np.int64)  # type: ignore[union-attr]
    stops = np.array([s.teachers.stop for s in shards], np.int64)  # type: ignore[union-attr]
    where = np.searchsorted(starts, ids, side="right") - 1  # the shard each id falls in
    held = (where >= 0) & (ids < stops[np.maximum(where, 0)]) if len(shards) else ids < 0
    if not held.all():
        raise UserError(f"teacher {ids[~held][0]} is in no shard of {run.dir.manifest}")
    order, parts = [], []
    for w in np.unique(where):
        shard, mine = shards[w], np.flatnonzero(where == w)
        params = checkpoints.load_shard(run.dir.root, shard.index, shard.sha256)
        rows = torch.as_tensor(ids[mine] - starts[w])
        order.append(mine)
        parts.append({k: v[rows] for k, v in params.items()})
    back = torch.as_tensor(np.argsort(np.concatenate(order), kind="stable"))
    return {k: torch.cat([p[k] for p in parts])[back].to(run.recipe.device) for k in parts[0]}


# -- the audit ---------------------------------------------------------------------------------


def _check_rows(run: Run, options: ModelsAuditOptions) -> None:
    """Refuse, before any training, an audit that needs more teachers or private rows than the
    run has."""
    k = run.manifest.num_teachers
    if {"teacher", "student"} & set(options.targets) and options.teachers > k:
        raise UserError(f"--teachers {options.teachers}: the run has {k} teachers")
    sizes = np.sort([len(p) for p in run.parts])[::-1]
    need = (int(sizes[:options.teachers].sum())
            if {"teacher", "student"} & set(options.targets) else 0)
    need += ((options.nonprivate_rows + options.nonprivate_canaries)
             if "nonprivate" in options.targets else 0)
    need += ((options.control_rows + options.control_canaries)
             if "control" in options.targets else 0)
    if need > len(run.train_y):
        what = "audited teachers' partitions, non-private rows and canaries, control canaries"
        if counts_private(run.manifest.partition):
            raise UserError(f"the audit needs more private rows than the run has ({what}): "
                            "ask for fewer")
        raise UserError(f"the audit needs up to {need} private rows ({what}), the run has "
                        f"{len(run.train_y)}: ask for fewer")


def _references_asked(target: str, run: Run, options: ModelsAuditOptions) -> int | None:
    """How many reference models ``target``'s audit asked for (None where the public pool's
    labels are unknown: none could be trained, which a warning says)."""
    if run.pool_y is None:
        return None
    return options.student_references if target == "student" else options.references


def audit_models(run_dir: str | Path, options: ModelsAuditOptions | None = None
                 ) -> ModelsAudit:
    """Audit the models of ``options.targets`` (module docstring); write the per-record results
    and the summary 0600 to ``run_dir/audit/`` (``models-<UTC time>-<tag>-records.npz`` and
    ``models-<UTC time>-<tag>.json``) and return the summary."""
    started, stamped = time.perf_counter(), time.time()
    options = ModelsAuditOptions() if options is None else options
    run = load_run(run_dir, options.device)
    delta = options.delta
    if delta is None:
        delta = run.config.aggregator.delta if run.config is not None else 1e-5
    _check_rows(run, options)
    if run.pool_y is None and (options.references or ("student" in options.targets
                                                      and options.student_references)):
        warnings.warn("no reference models: they learn from the public pool's labels, and a "
                      "user's files give none (never read): the loss attack only", stacklevel=2)
    rng = np.random.default_rng(options.seed)
    records: dict[str, NDArray[Any]] = {}
    audits: list[TargetAudit] = []
    used = np.zeros(0, np.int64)
    student = None
    if "student" in options.targets:
        student = student_recipe(run, options.student_epochs, options.device)
        if not math.isclose(student.delta, delta, rel_tol=1e-12):
            raise UserError(f"the student's epsilon is at delta {student.delta:g}, the audit's "
                            f"at {delta:g}: give --delta {student.delta:g}")
    if "teacher" in options.targets or "student" in options.targets:
        t0 = time.perf_counter()
        retrained = retrain_teachers(run, options, rng, "teacher" in options.targets
                                     and options.references > 0)
        used = np.concatenate([run.parts[t] for t in retrained.ids])
        if "teacher" in options.targets:
            audits.append(audit_teacher(run, retrained, delta, options.confidence, records, t0))
        if student is not None:
            audits.append(audit_student(run, student, retrained, options, delta, records,
                                        time.perf_counter()))
    if "nonprivate" in options.targets:
        audit, rows = audit_supervised(
            run, "nonprivate", options.nonprivate_rows, options.nonprivate_canaries,
            run.recipe.train.epochs, options.references, rng, used, delta, options.confidence,
            records, time.perf_counter())
        audits.append(audit)
        used = np.concatenate([used, rows])
    if "control" in options.targets:
        audit, _ = audit_supervised(
            run, "control", options.control_rows, options.control_canaries,
            options.control_epochs,
            options.references, rng, used, delta, options.confidence, records,
            time.perf_counter(), mislabel=options.control_labels == "mislabelled")
        audits.append(audit)
    audits = sorted((replace(a, chance=1.0 / run.recipe.num_classes,
                             references_asked=_references_asked(a.target, run, options))
                     for a in audits), key=lambda a: TARGETS.index(a.target))
    folder = ensure_dir(run.dir.audit, private=True)
    # the time, and a random tag: two audits started in the same second keep both their files
    stamp = f"{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime(stamped))}-{secrets.token_hex(3)}"
    result = ModelsAudit(str(run.dir), delta, options.confidence, audits, options,
                         time.perf_counter() - started, folder / RECORDS_FILE.format(stamp=stamp),
                         folder / SUMMARY_FILE.format(stamp=stamp))
    assert result.records is not None and result.summary is not None
    write_with_atomic(result.records, lambda fh: np.savez(fh, **records), private=True)
    write_json_atomic(result.summary, result.to_dict(), private=True)
    return result

