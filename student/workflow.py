"""The student's workflow on a run directory: one query round against an aggregator
(:mod:`student.asking`), then semi-supervised training on every answer so far (PATE 2018,
§4.2-4.3).

``train_student`` is what ``pate student train`` and ``pate run`` call; ``train_on_prefixes``
trains the owner-only comparison's students on parts of the answers.

Writes, through ``pate.rundir.RunDir``: ``labels.npz`` (after every request, so nothing paid for
is lost), ``student/model.safetensors`` (+ ``model.json``; the GAN's generator too),
``student/schema.json`` (class names and preprocessing, ``student.predict``),
``student/rounds.json`` (one public record per round), ``student/probs.npz`` (what was sent to
Interactive-GNMax, which its analysis needs) and ``student/metrics.json``.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from numpy.typing import NDArray

from pate.aggregation.vote_pool import VotePool
from pate.data.task import DataSource, Task, load_task
from pate.errors import UserError
from pate.progress import say
from pate.rundir import RunDir
from student.asking import (
    AggregatorSession,
    answers_in_hand,
    ask_round,
    asks_with_student,
    needs_previous_student,
    settled_rounds,
)
from student.checks import (
    check_answers_pool,
    check_teachers_data,
    check_votes,
    warn_unseen_classes,
)
from student.choices import POOL_FEATURE_ARCHS
from student.models import (
    ModelSpec,
    PoolFeatures,
    build_classifier,
    check_network,
    same_tensors,
)
from student.options import StudentOptions
from student.predict import student_schema
from student.rounds import Received, read_rounds
from student.training import (
    NetworkChanged,
    accuracy,
    build_learner,
    fit,
    load_classifier,
    load_spec,
    load_weights,
    save_model,
    seed_everything,
)
from teachers import checkpoints
from teachers.choices import SIMCLR, is_import_path
from teachers.manifest import TeachersManifest
from teachers.pool_encoder import EPOCHS, check_encoder, load_encoder_file, train_pool_encoder
from teachers.user_models import describe_error


def _given_encoder(run: RunDir, options: StudentOptions, channels: int) -> Any:
    """The pool encoder the ``cnn-hog-simclr`` student is told to use, read and checked before
    any query is asked (a bad one spends nothing): ``options.pool_encoder``'s, else the one the
    run's teachers learnt by SimCLR (digest checked); None when there is neither. Both are
    derived from the public pool alone (teachers.pool_encoder), so the student may read them."""
    if options.pool_encoder is not None:
        try:
            return load_encoder_file(options.pool_encoder, channels)
        except (OSError, ValueError) as exc:
            raise UserError(f"--pool-encoder {options.pool_encoder}: {exc}") from None
    try:
        manifest = TeachersManifest.read(run.root)
        recorded = None if manifest is None else manifest.pool_encoder
        if recorded and recorded.get("method", SIMCLR) != SIMCLR:
            recorded = None  # a whitening of fixed maps (teachers.whitening): no encoder
        tensors = None if not recorded else checkpoints.load_encoder(run.root,
                                                                     recorded["sha256"])
        if tensors is not None:
            check_encoder(tensors, channels)
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"{run.manifest}: no readable pool encoder ({exc.__class__.__name__})"
                        ) from None
    return tensors


def _pool_features(options: StudentOptions, given: Any, previous: Any,
                   pool_x: NDArray[np.float32], say: Callable[[str], None]) -> PoolFeatures:
    """The ``cnn-hog-simclr`` student's :class:`student.models.PoolFeatures`: on the encoder
    ``given`` (:func:`_given_encoder`), else that of the student saved by a previous round,
    else one learnt here by SimCLR from the public pool (``encoder_epochs``)."""
    encoder = given
    if encoder is None and previous is not None and previous[1].arch in POOL_FEATURE_ARCHS:
        encoder = previous[0].experts[1][0].encoder.state_dict()
    if encoder is None:
        epochs = EPOCHS if options.encoder_epochs is None else options.encoder_epochs
        say(f"learning a pool encoder ({epochs} SimCLR epochs on the {len(pool_x)} pool rows)")
        encoder = train_pool_encoder(pool_x, epochs, options.seed, options.device)
    return PoolFeatures.on_pool(encoder, pool_x)


def _stderr_line(text: str) -> None:
    say(f"pate student: {text}")  # news: silent when quiet


def _fit_on_answers(task: Task, options: StudentOptions, spec: ModelSpec,
                    features: PoolFeatures | None, lab_index: NDArray[np.int64],
                    lab_y: NDArray[np.int64],
                    on_epoch: Callable[[int, dict[str, float]], None] | None,
                    continue_from: Path | None = None) -> tuple[Any, Any, Any, float | None]:
    """Train the student network ``spec`` (from the weights saved in ``continue_from``, else
    fresh) on the answered pool rows and the whole pool; returns the model, its learner, the
    fit's result and the accuracy on the test data (None without test data)."""
    method = options.method_config(task.kind)
    seed_everything(options.seed)
    model = build_classifier(spec, features).to(options.device)
    if continue_from is not None:
        load_weights(model, continue_from)
    learner = build_learner(method, model, spec)
    if continue_from is not None and options.method == "gan":
        load_weights(learner.generator_net, continue_from, "generator")
    result = fit(learner, task.pool_x[lab_index], lab_y, task.pool_x,
                 options.fit_config(method), on_epoch=on_epoch)
    acc = (None if task.eval_x is None or task.eval_y is None
           else accuracy(model, task.eval_x, task.eval_y, options.device))
    return model, learner, result, acc


def _rehearse(task: Task, options: StudentOptions, spec: ModelSpec) -> None:
    """One training step and one evaluation of a user's student network (``spec.arch`` an
    import path) by ``_fit_on_answers`` itself, on the pool's first rows with made-up labels,
    before the round asks anything: a network that fails only in training mode, in its
    backward pass, on a full batch or on the evaluation batches fails here at no cost, not
    after the answers are bought. Nothing is saved; torch's CPU generator is left as it was."""
    rows = min(len(task.pool_x), options.unlabelled_batch_size)  # one step: one batch of it
    labelled = np.arange(min(len(task.pool_x), options.batch_size))
    try:
        with torch.random.fork_rng(devices=[]):
            _fit_on_answers(replace(task, pool_x=task.pool_x[:rows]), replace(options, epochs=1),
                            spec, None, labelled, labelled % task.num_classes, None)
    except UserError:
        raise
    except Exception as exc:  # the user's code
        raise UserError(f"the student's network {spec.arch!r} failed in a rehearsal of one "
                        f"training step and an evaluation on public rows "
                        f"({describe_error(exc)}); nothing was asked") from None


def train_on_prefixes(run: RunDir, options: StudentOptions, data: DataSource,
                      fractions: Sequence[float],
                      say: Callable[[str], None] = _stderr_line) -> list[dict[str, Any]]:
    """Students trained as the run's was (``options``), from scratch, on the answers to the
    first ``fraction`` of the rows the run asked, in asking order: the points of a
    privacy-utility curve that cost no new query (each prefix's epsilon is computed by whoever
    publishes it). Returns per fraction the rows asked and answered and the test accuracy."""
    task = load_task(data, need_private=False)
    spec = options.method_config(task.kind).spec(task.input_shape, task.num_classes)
    if not run.labels.is_file():
        raise UserError(f"{run}: no labels.npz; the student has asked nothing yet")
    received = Received.load(run.labels)
    check_answers_pool(run, received, task)
    features = None
    if spec.arch in POOL_FEATURE_ARCHS:
        given = _given_encoder(run, options, task.pool_x.shape[1])
        features = _pool_features(options, given, _previous_student(run, spec, False),
                                  task.pool_x, say)
    points = []
    for fraction in fractions:
        if not 0 < fraction <= 1:
            raise UserError(f"a prefix is a fraction in (0, 1], got {fraction!r}")
        part = received.first(round(fraction * len(received)))
        answered = part.answered
        if not answered.any():
            continue
        say(f"student on the first {len(part)} queries ({int(answered.sum())} answers)")
        acc = _fit_on_answers(task, options, spec, features, part.pool_index[answered],
                              part.label[answered], None)[3]
        points.append({"fraction": fraction, "queries": len(part),
                       "answered": int(answered.sum()), "accuracy": acc})
    return points


def _previous_student(run: RunDir, spec: ModelSpec, asks_with_it: bool
                      ) -> tuple[Any, ModelSpec] | None:
    """The student a previous round saved, read only where this call uses it: to continue
    from (the same network), for its pool encoder (both networks on pool features), or for the
    probabilities the round asks with (``asks_with_it``). One it does not use is left unread,
    so a user's network whose code changed since does not stop training another."""
    saved = load_spec(run.student)
    if saved is None:
        return None
    both_on_pool = saved.arch in POOL_FEATURE_ARCHS and spec.arch in POOL_FEATURE_ARCHS
    if not (asks_with_it or saved == spec or both_on_pool):
        return None
    try:
        return load_classifier(run.student)
    except NetworkChanged as exc:  # a damaged file is refused whatever the use
        if asks_with_it:  # the round needs its probabilities: nothing to do without them
            raise
        # only to continue from (or for its encoder): the student is trained afresh, as a
        # user's network mended since its failed training must be (its layers changed)
        warnings.warn(f"{exc}; the student is trained afresh", UserWarning, stacklevel=2)
        return None


@dataclass(frozen=True)
class _Checked:
    """What ``train_student`` read and checked before a round asks anything."""

    task: Task
    options: StudentOptions  # ``queries``: what the stage still has to ask
    spec: ModelSpec
    given_encoder: Any       # ``_given_encoder``'s, for a pool-feature network
    before: Received         # the answers in hand
    pool_recorded: Any       # ``check_answers_pool``'s
    previous: Any            # the saved student, where used (``_previous_student``)
    rounds_before: list[dict[str, Any]]


def _check_before_asking(run: RunDir, options: StudentOptions, data: DataSource, asks: bool,
                         mechanism: str | None, round_name: str | None) -> _Checked:
    """Check everything ``train_student`` can before its round opens a session (``asks``):
    the options, the data against the teachers', the labels so far, the pool encoder, a user's
    network (rehearsed), and a previous student where the round needs one; a mistake here
    spends and creates nothing but the run directory. The rounds recorded under ``round_name``
    count towards ``options.queries``."""
    task = load_task(data, need_private=False)
    check_teachers_data(run, task, data)
    spec = options.method_config(task.kind).spec(task.input_shape, task.num_classes)
    pool_features = spec.arch in POOL_FEATURE_ARCHS
    if not pool_features and (options.pool_encoder or options.encoder_epochs):
        raise UserError("--pool-encoder and --encoder-epochs are for --arch "
                        f"{', '.join(sorted(POOL_FEATURE_ARCHS))} only")
    given = _given_encoder(run, options, task.pool_x.shape[1]) if pool_features else None
    check_network(spec)
    if is_import_path(spec.arch) and asks:
        _rehearse(task, options, spec)
    run.create()
    before = Received.load(run.labels) if run.labels.is_file() else Received.empty()
    pool_recorded = check_answers_pool(run, before, task)
    if np.any(before.pool_index >= len(task.pool_x)):
        raise UserError(f"{run.labels} has pool indices beyond the pool's {len(task.pool_x)} "
                        "rows")
    rounds_before = settled_rounds(run, before, read_rounds(run))
    if asks and round_name is not None:  # what the stage asked before it was stopped counts
        asked = sum(r["queries"] for r in rounds_before if r.get("round") == round_name)
        options = replace(options, queries=max(0, options.queries - asked))
    previous = _previous_student(run, spec, asks and asks_with_student(mechanism, options))
    if asks:
        needs_previous_student(run, mechanism, options, previous)
    return _Checked(task, options, spec, given, before, pool_recorded, previous, rounds_before)


def _student_metrics(task: Task, options: StudentOptions, spec: ModelSpec, received: Received,
                     asked_before: int, acc: float | None) -> dict[str, Any]:
    """What ``student/metrics.json`` says of the data, the answers and the training recipe."""
    answered = received.answered
    lab_index, lab_y = received.pool_index[answered], received.label[answered]
    method = options.method_config(task.kind)
    eval_y = task.eval_y
    return {
        "method": options.method, "arch": spec.arch, "dataset": task.name,
        "accuracy": acc,  # None: no test data, so not measured (never on private data)
        "eval_size": 0 if eval_y is None else len(eval_y),
        # what always guessing the evaluation rows' most frequent class scores (a baseline)
        "majority_accuracy": (None if eval_y is None or not len(eval_y) else
                              float(np.bincount(eval_y).max() / len(eval_y))),
        "pool_size": len(task.pool_x), "pool_fingerprint": task.pool_fingerprint,
        "classes": list(task.classes),
        "classes_from": task.classes_from,
        **received.counts(),
        "asked_this_round": len(received) - asked_before,
        "labels_used": int(answered.sum()),
        # a benchmark's pool labels only: a user's public labels are never read
        "label_accuracy": (None if task.pool_y is None
                           else float(np.mean(lab_y == task.pool_y[lab_index]))),
        "training": {"width": spec.width, **asdict(options.fit_config(method)),
                     **({"vat_eps": method.vat_eps, "entmin": method.entmin}
                        if options.method == "vat" else {})},
    }


def train_student(run: RunDir,
                  open_session: Callable[[Callable[[VotePool], None]], AggregatorSession]
                  | None,
                  options: StudentOptions, data: DataSource, *,
                  conversion: str = "improved",
                  on_epoch: Callable[[int, dict[str, float]], None] | None = None,
                  say: Callable[[str], None] = _stderr_line,
                  spent_is_final: bool = True, mechanism: str | None = None,
                  round_name: str | None = None) -> dict[str, Any]:
    """One query round and the student's training; returns the metrics written to
    ``student/metrics.json``. A budget spent before the round asked anything is an error
    (``spent_is_final``), unless answers are in hand and the caller goes on without new ones
    (``pate run``'s later rounds: the student trains on what it has).

    Everything that can be checked is checked before ``open_session`` is called (the options,
    the data, the labels so far, the pool encoder, and, given the ``mechanism`` the session
    will ask with, a previous student where the round needs one), so a mistake spends and
    creates nothing.

    Nothing is asked twice. A round is recorded in ``rounds.json`` before its first request
    and its counts after each saved answer, so a round stopped while it asked keeps what it
    got (``settled_rounds``). The rounds recorded under ``round_name`` (``pate run``'s
    stage) count towards its ``options.queries``: a stage resumed after its round only trains,
    and one stopped within its round asks the rest.
    ``open_session(check_votes)`` opens the aggregator; one over local votes calls
    ``check_votes`` on them before its ledger opens (a votes file of another pool or run is
    refused with nothing created). With no ``open_session`` nothing is asked: the student is
    trained again on the answers in hand, with the epsilons of the round that asked them.
    ``on_epoch``
    gets (epoch, mean losses) after each training epoch; ``say`` one line of news."""
    started = time.perf_counter()
    ready = _check_before_asking(run, options, data, open_session is not None, mechanism,
                                 round_name)
    task, options, spec = ready.task, ready.options, ready.spec
    if open_session is None:  # --queries 0 with no aggregator: train on the answers in hand
        received, rounds, epsilon = answers_in_hand(run, ready.before, ready.rounds_before,
                                                    task, ready.pool_recorded)
    else:
        session = open_session(lambda pool: check_votes(run, pool.describe(), task))
        received, rounds, epsilon = ask_round(run, session, task, options, ready.before,
                                               ready.previous, ready.rounds_before, conversion,
                                               spent_is_final, round_name)
    answered = received.answered
    if not answered.any():
        raise UserError("no labels received yet: nothing to train on (more queries or a lower "
                        "threshold)")
    lab_index = received.pool_index[answered]
    lab_y = received.label[answered]
    warn_unseen_classes(lab_y, task.classes)
    out, previous = run.student, ready.previous
    continued = previous is not None and previous[1] == spec and (
        load_spec(out, "generator") is not None or options.method != "gan")
    features = None
    if spec.arch in POOL_FEATURE_ARCHS:  # continue only on the same encoder
        features = _pool_features(options, ready.given_encoder, previous, task.pool_x, say)
        continued = continued and same_tensors(previous[0].experts[1][0].encoder,
                                               features.encoder)
    try:
        model, learner, result, acc = _fit_on_answers(
            task, options, spec, features, lab_index, lab_y, on_epoch,
            out if continued else None)
    except Exception as exc:  # a user's network failing in its own code, after the round
        if not is_import_path(spec.arch) or isinstance(exc, UserError):
            raise
        raise UserError(f"the student's network {spec.arch!r} failed as it trained or was "
                        f"evaluated ({describe_error(exc)}); the {len(lab_y)} answers are kept "
                        f"in {run.labels}: fix the network and train on them again at no new "
                        "cost (rerun pate run, or pate student train with --queries 0)"
                        ) from None
    save_model(model, spec, out)
    run.write_json(run.student_schema, student_schema(task))
    if options.method == "gan":
        save_model(learner.generator_net, spec, out, "generator")
    metrics = {
        **_student_metrics(task, options, spec, received, len(ready.before), acc),
        "epsilon": epsilon,
        "rounds": rounds,
        "continued_from_previous": continued,
        "epochs": options.epochs, "seconds_per_epoch": float(np.mean(result.seconds_per_epoch)),
        "seconds": time.perf_counter() - started,
    }
    run.write_json(run.student_metrics, metrics)
    return metrics
