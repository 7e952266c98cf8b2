"""The student's workflow on a run directory: one query round against an aggregator, then
semi-supervised training on every answer so far (PATE 2018, §4.2-4.3).

``train_student`` is what ``pate student train`` and ``pate run`` call. The aggregator is any
``pate.aggregation.label_requests.LabelSource``: the HTTP client of a running ``pate serve``, or
the label service in this process over a votes file (then ``AggregatorSession.service`` is set,
and the round's candidates and its sanitised epsilon come from its votes). The round's kind
follows the mechanism: Confident-GNMax (or GNMax, LNMax) answers pool indices; Interactive-GNMax
also gets the current student's probabilities, so it needs the student a previous round left.

Writes, through ``pate.rundir.RunDir``: ``labels.npz`` (after every request, so nothing paid for
is lost), ``student/model.safetensors`` (+ ``model.json``; the GAN's generator too),
``student/schema.json`` (class names and preprocessing, ``student.predict``),
``student/rounds.json`` (one public record per round), ``student/probs.npz`` (what was sent to
Interactive-GNMax, which its analysis needs) and ``student/metrics.json``.
"""

from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from analysis.mechanisms import mechanism_from_dict, mechanism_to_dict
from pate.aggregation.label_requests import LabelSource
from pate.aggregation.label_service import BUDGET_SPENT_HINT, LabelService
from pate.aggregation.vote_pool import VotePool
from pate.data.augment import AUGMENTATIONS
from pate.data.task import DataSource, Task, load_task, source_identity
from pate.devices import device_problem
from pate.errors import PateError, RemoteServiceError, UserError
from pate.progress import Progress, progress_bar
from pate.rundir import RunDir
from student.choices import SELECTIONS
from student.models import (
    POOL_FEATURE_ARCHS,
    ModelSpec,
    PoolFeatures,
    build_classifier,
    check_network,
    same_tensors,
)
from student.predict import student_schema
from student.rounds import (
    Received,
    analyze_rounds,
    append_sent_probs,
    ask,
    load_sent_probs,
    read_rounds,
    select_queries,
)
from student.sanitised import answers_digest, ledger_releases, run_file_releases
from student.training import (
    FitConfig,
    MethodConfig,
    accuracy,
    build_learner,
    fit,
    load_classifier,
    load_spec,
    load_weights,
    method_for_data,
    predict_proba,
    save_model,
    seed_everything,
)
from teachers import checkpoints
from teachers.pool_encoder import EPOCHS, check_encoder, load_encoder_file, train_pool_encoder
from teachers.rng import SEED_LIMIT


@dataclass(frozen=True)
class StudentOptions:
    """How the student asks and trains; validated at construction (``UserError``).

    ``queries`` pool rows are chosen by ``select`` and asked in requests of ``request_size``;
    the network (``arch``, default per method) is trained ``epochs`` passes over the pool.
    ``pool_encoder`` (a file) or ``encoder_epochs`` (learn one) set the ``cnn-hog-simclr``
    student's encoder. ``seed`` seeds initialisation and training order only: the aggregator's
    noise is never seeded."""

    method: str
    arch: str | None = None
    width: int = 32
    queries: int = 1000
    select: str = "first"
    request_size: int = 512
    epochs: int = 30
    batch_size: int = 32
    unlabelled_batch_size: int = 128
    lr: float | None = None
    augment: str = "none"
    balance_classes: bool = False
    vat_eps: float = 2.0
    entmin: bool = False
    pool_encoder: Path | None = None
    encoder_epochs: int | None = None
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if self.queries < 0:
            raise UserError(f"--queries must be >= 0, got {self.queries}")
        for flag, count in (("--request-size", self.request_size), ("--epochs", self.epochs),
                            ("--encoder-epochs", self.encoder_epochs),
                            ("--width", self.width), ("--batch-size", self.batch_size),
                            ("--unlabelled-batch-size", self.unlabelled_batch_size)):
            if count is not None and count < 1:
                raise UserError(f"{flag} must be >= 1, got {count}")
        if not 0 <= self.seed < SEED_LIMIT:
            raise UserError(f"--seed must be in [0, 2^63), got {self.seed}")
        if self.pool_encoder is not None and self.encoder_epochs is not None:
            raise UserError("give --pool-encoder (an encoder) or --encoder-epochs (learn one), "
                            "not both")
        if self.select not in SELECTIONS:
            raise UserError(f"--select must be one of {', '.join(SELECTIONS)}")
        if self.augment not in AUGMENTATIONS:
            raise UserError(f"--augment must be one of {', '.join(AUGMENTATIONS)}")
        for flag, value in (("--lr", self.lr), ("--vat-eps", self.vat_eps)):
            if value is not None and not (math.isfinite(value) and value > 0):
                raise UserError(f"{flag} must be a finite number > 0, got {value!r}")
        problem = device_problem(self.device)
        if problem:
            raise UserError(problem)

    def method_config(self, kind: str = "image") -> MethodConfig:
        """The method and its network for ``kind`` of data: on tabular features the default
        network is the MLP, and the networks (and the GAN) made for images are refused."""
        return method_for_data(kind, self.method, self.arch, self.width, self.lr,
                               self.vat_eps, self.entmin)

    def fit_config(self, method: MethodConfig) -> FitConfig:
        try:
            return FitConfig(self.epochs, self.batch_size, self.unlabelled_batch_size,
                             method.learning_rate, augment=self.augment,
                             balance_classes=self.balance_classes, seed=self.seed,
                             device=self.device)
        except ValueError as exc:
            raise UserError(str(exc)) from None


@dataclass
class AggregatorSession:
    """An open label source; ``service`` is the label service in this process when there is
    one (``pate student train --votes``; ``pate run``'s own server, whose round releases the
    sanitised epsilon): its votes bound the candidates, and its votes and ledger give the
    sanitised epsilon. None for a remote one."""

    source: LabelSource
    mechanism: str
    service: LabelService | None = None

    def close(self) -> None:
        self.source.close()


def _described(session: AggregatorSession, what: str, optional: bool = False
               ) -> dict[str, Any]:
    """The aggregator's public description ``what`` (``mechanism`` or ``pool``, a
    ``LabelSource`` method and a GET route); ``UserError`` when it is refused, or missing
    unless ``optional`` (then ``{}``: a server of an older version)."""
    try:
        record = getattr(session.source, what)()
    except RemoteServiceError as exc:
        if exc.status == 404 and optional:
            return {}
        if exc.status == 404:
            raise UserError(f"the server has no GET /v1/{what}: not a pate serve of this "
                            "version (or not a pate serve)") from None
        raise UserError(f"the aggregator refused: {exc}") from None
    except PateError as exc:
        raise UserError(f"the aggregator refused: {exc}") from None
    if not isinstance(record, dict):
        raise UserError(f"the aggregator's GET /v1/{what} is not a record")
    return record


def _served_mechanism(session: AggregatorSession) -> dict[str, Any]:
    """The mechanism and parameters the aggregator answers with (``LabelSource.mechanism``),
    which must be the one the round was told; ``UserError`` otherwise, before any query."""
    record = _described(session, "mechanism")
    try:
        mechanism = mechanism_from_dict(record)
    except (ValueError, TypeError, AttributeError):
        raise UserError("the aggregator's GET /v1/mechanism is not a mechanism record") from None
    if mechanism.name != session.mechanism:
        raise UserError(f"the aggregator answers with {mechanism.name!r}, not the "
                        f"{session.mechanism!r} this round was told to ask (--mechanism)")
    return mechanism_to_dict(mechanism)


def _with_round(run: RunDir, rounds: list[dict[str, Any]], record: dict[str, Any],
                got: Received) -> list[dict[str, Any]]:
    """``rounds`` (``rounds.json`` as read before the round) and this round, ``record`` (public:
    the aggregator's mechanism record and parameters, the selection, the stage) with the
    counts of ``got``, written; a round that has asked nothing is left out."""
    rounds = [*rounds, {**record, **got.counts()}] if len(got) else list(rounds)
    run.write_json(run.rounds, rounds)
    return rounds


def _settled_rounds(run: RunDir, before: Received,
                    rounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``rounds.json`` made to account for every row of ``labels.npz`` after a round was
    stopped while it asked: the round is recorded before its first request (its mechanism),
    and its counts after each answer is saved, so rows saved beyond the counts are the last
    round's, and a round that never got an answer is dropped. Rewritten where it changed."""
    settled = [r for r in rounds if r["queries"]]
    recorded = sum(r["queries"] for r in settled)
    if settled and len(before) > recorded:
        start = recorded - settled[-1]["queries"]
        settled[-1] = {**settled[-1], **before.since(start).counts()}
    if settled != rounds:
        run.write_json(run.rounds, settled)
    return settled


def _sanitised_epsilon(run: RunDir, session: AggregatorSession, received: Received,
                       rounds: list[dict[str, Any]], delta: float, conversion: str
                       ) -> float | None:
    """The published smooth-sensitivity-sanitised epsilon of every round so far: the release
    (``student.sanitised``, noise from the OS's entropy) of ``student.rounds.analyze_rounds``'s
    bound (PATE 2018's Table 2 analysis of the asked rows, rounds composed; docs/design.md,
    privacy rule 6), made once per set of answers and kept in the ledger that charged them: the
    same answers, asked again from this run or another, get the same figure, and a release
    of others composes with every earlier one. None without the service in this process (or
    with rows its votes do not cover), with LNMax, or when a round's parameters or rows are
    unknown."""
    service = session.service
    if service is None or service.pool is None or not len(received):
        return None
    pool = service.pool
    if not np.isin(received.pool_index, pool.pool_indices).all():
        return None  # rows another aggregator answered (a remote one), of votes not here
    asked = [{k: v for k, v in r.items() if k != "round"} for r in rounds]  # not the stage
    digest = answers_digest(asked, pool.digest, received.pool_index,
                            load_sent_probs(run.probs)[1])
    with ledger_releases(service.ledger, run_file_releases(run.releases)) as releases:
        return releases.release(
            len(received), lambda earlier: analyze_rounds(
                rounds, received, lambda index: pool.votes[pool.rows(index)], run.probs, delta,
                conversion, earlier), conversion, digest)


def _given_encoder(run: RunDir, options: StudentOptions, channels: int) -> Any:
    """The pool encoder the ``cnn-hog-simclr`` student is told to use, read and checked before
    any query is asked (a bad one spends nothing): ``options.pool_encoder``'s, else the one the
    run's teachers learnt (digest checked); None when there is neither. Both are derived from the
    public pool alone (teachers.pool_encoder), so the student may read them."""
    if options.pool_encoder is not None:
        try:
            return load_encoder_file(options.pool_encoder, channels)
        except (OSError, ValueError) as exc:
            raise UserError(f"--pool-encoder {options.pool_encoder}: {exc}") from None
    try:
        recorded = (checkpoints.read_manifest(run.root) or {}).get("pool_encoder")
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


def _check_teachers_data(run: RunDir, task: Task, data: DataSource) -> None:
    """Refuse a student's data that is not what the run's teachers voted on: by the pool's
    fingerprint (``Task.pool_fingerprint``, the same wherever the files lie) where their
    manifest records one, else by the data's record (an older run)."""
    manifest = checkpoints.read_manifest(run.root)
    if not isinstance(manifest, dict):
        return
    if "pool_fingerprint" in manifest:
        other = checkpoints.pool_changed(manifest, task)
    else:
        teachers = checkpoints.teachers_source(run.root)
        other = teachers is not None and source_identity(data) != source_identity(teachers)
    if other:
        raise UserError("the run's teachers were trained and voted on other data than the "
                        "data flags name: the student's pool must be theirs (give no data "
                        "flag to use it)")


def _check_votes(run: RunDir, votes: dict[str, Any], task: Task) -> None:
    """Refuse, before anything is asked, votes (``VotePool.describe``, local or GET /v1/pool)
    that do not fit the pool: cast on another pool (its fingerprint, where known), another
    number of classes, rows beyond the pool, or another number of teachers than the run's
    (all public; no vote is read)."""
    fingerprint = votes.get("fingerprint")
    if fingerprint is not None and fingerprint != task.pool_fingerprint:
        raise UserError("the votes were cast on another public pool than the student's (its "
                        "content, rows or label set differ): they are not this pool's votes")
    classes = votes.get("classes")
    if classes is not None and classes != task.num_classes:
        raise UserError(f"the votes have {classes} classes, the data {task.num_classes}: "
                        "they are not this pool's votes")
    first, last = votes.get("first_index"), votes.get("last_index")
    if first is not None and last is not None and (first < 0 or last >= len(task.pool_x)):
        raise UserError(f"the votes cover pool rows up to {int(last)}, but the pool has "
                        f"{len(task.pool_x)} rows: they are not this pool's votes")
    manifest = checkpoints.read_manifest(run.root) or {}
    teachers = votes.get("teachers")
    if teachers is not None and manifest.get("num_teachers") not in (None, teachers):
        raise UserError(f"the votes are of {teachers} teachers, the run's teachers number "
                        f"{manifest['num_teachers']}: they are not this run's votes")


def _check_answers_pool(run: RunDir, received: Received, task: Task) -> bool:
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


def _saving(run: RunDir, before: Received, rounds: list[dict[str, Any]],
            record: dict[str, Any], probs: NDArray[np.float64] | None,
            bar: Progress) -> Callable[[Received], None]:
    """An ``on_request`` that saves everything received so far, so that nothing paid for is
    lost and every saved answer is accounted for: the probabilities sent with the new rows
    (Interactive-GNMax; its analysis needs them), then the answers (``labels.npz``), then the
    round's counts (``rounds.json``); and advances the round's progress."""
    done = [0]

    def on_request(got: Received) -> None:
        if probs is not None:
            append_sent_probs(run.probs, got.pool_index[done[0]:], probs[done[0]:len(got)])
        (before + got).save(run.labels)
        _with_round(run, rounds, record, got)
        bar.update(len(got) - done[0])
        done[0] = len(got)
    return on_request


def _stderr_line(text: str) -> None:
    print(f"pate student: {text}", file=sys.stderr, flush=True)


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


def _needs_previous_student(run: RunDir, mechanism: str | None, options: StudentOptions,
                            previous: tuple[Any, ModelSpec] | None) -> bool:
    """Whether the round asks with the probabilities of a previous round's student (an
    interactive round, or rows chosen by its uncertainty); ``UserError`` where there is
    none."""
    needs = bool(options.queries) and (mechanism == "interactive"
                                       or options.select == "uncertainty")
    if needs and previous is None:
        raise UserError("interactive rounds and --select uncertainty need the student of a "
                        f"previous round in {run.student}")
    return needs


def _ask_round(run: RunDir, session: AggregatorSession, task: Task, options: StudentOptions,
               before: Received, previous: tuple[Any, ModelSpec] | None,
               rounds_before: list[dict[str, Any]], conversion: str, spent_is_final: bool,
               say: Callable[[str], None], name: str | None = None
               ) -> tuple[Received, list[dict[str, Any]], dict[str, Any]]:
    """One query round against ``session`` (closed at the end; ``train_student``): every
    answer so far, saved as it arrives, every round so far, and the epsilons of the answers
    (the ledger's data-independent one, the sanitised release). ``labels.npz`` records the
    pool's fingerprint."""
    interactive = session.mechanism == "interactive"
    before = replace(before, pool_fingerprint=task.pool_fingerprint)
    try:
        mechanism = _served_mechanism(session)
        if session.service is None:  # a remote aggregator's votes, by their description
            _check_votes(run, _described(session, "pool", optional=True), task)
        run.student.mkdir(exist_ok=True)  # once the aggregator has accepted the round
        candidates = np.setdiff1d(np.arange(len(task.pool_x)), before.pool_index)
        if session.service is not None and session.service.pool is not None:
            candidates = np.intersect1d(candidates, session.service.pool.pool_indices)
        if options.queries and not candidates.size:
            raise UserError("every pool row the votes cover has been asked already: nothing "
                            "is left to ask (--queries 0 trains on the answers so far)")
        probs_all = None
        if _needs_previous_student(run, session.mechanism, options, previous):
            assert previous is not None
            probs_all = predict_proba(previous[0].to(options.device), task.pool_x[candidates],
                                      options.device)
        chosen = select_queries(candidates, options.queries, options.select,
                                np.random.default_rng(options.seed), probs_all)
        probs = None
        if interactive and chosen.size:
            assert probs_all is not None
            probs = probs_all[np.searchsorted(candidates, chosen)]
        record = {"mechanism": mechanism, "select": options.select,
                  **({} if name is None else {"round": name})}
        if chosen.size:  # recorded before its first request: whose rows a stop leaves
            run.write_json(run.rounds, [*rounds_before, {**record,
                                                          **Received.empty().counts()}])
        try:
            with progress_bar(f"queries ({session.mechanism})", int(chosen.size), "query",
                              every=10.0) as bar:
                got, exhausted = ask(session.source, chosen, probs, options.request_size,
                                     on_request=_saving(run, before, rounds_before, record,
                                                        probs, bar))
        except PateError as exc:
            raise UserError(f"the aggregator refused: {exc}") from None
        received = before + got
        received.save(run.labels)
        rounds = _with_round(run, rounds_before, record, got)  # as it ended (saved per request)
        if exhausted and not len(got) and (spent_is_final or not len(before)):
            hint = ("--queries 0 retrains on the answers so far" if len(before)
                    else BUDGET_SPENT_HINT)
            raise UserError("the privacy budget does not cover even one more query: nothing "
                            f"was asked or spent ({hint})")
        budget = session.source.budget()
        sanitised = _sanitised_epsilon(run, session, received, rounds, budget["delta"],
                                      conversion)
    finally:
        session.close()
    if exhausted:
        say(f"budget exhausted after {len(got)} of {chosen.size} queries")

    if not received.answered.any() and exhausted:
        queries = "query" if len(received) == 1 else "queries"
        raise UserError(f"the privacy budget (epsilon {budget['epsilon_budget']:g}) is spent and "
                        f"none of the {len(received)} {queries} asked was answered: nothing to "
                        "train on, and nothing more can be asked of this ledger (a new run with "
                        "a larger budget or a lower threshold)")
    return received, rounds, {
        "delta": budget["delta"],
        "data_independent": budget["epsilon_spent"],  # the ledger's, all its clients
        "basis": budget["basis"],
        "data_dependent_sanitised": sanitised,
    }


def _answers_in_hand(run: RunDir, before: Received, rounds_before: list[dict[str, Any]],
                     task: Task, pool_recorded: bool
                     ) -> tuple[Received, list[dict[str, Any]], dict[str, Any]]:
    """``--queries 0`` with no aggregator named: the answers so far, their rounds and the
    epsilons the round that asked them gave (``student/metrics.json``), once the answers are
    known to be of the student's pool (``pool_recorded``: ``_check_answers_pool`` found it
    recorded; else by the run's votes). Training again on them asks, spends and releases
    nothing."""
    last = run.read_json(run.student_metrics)
    if not (len(before) and isinstance(last, dict) and isinstance(last.get("epsilon"), dict)
            and last.get("queries") == len(before)):
        raise UserError("training on the answers in hand needs a round that asked them here "
                        f"({run.labels} and {run.student_metrics}); else name the aggregator "
                        "(--mechanism and its flags, or --server)")
    if not pool_recorded and run.votes.is_file():  # labels and metrics of an older version
        _check_votes(run, VotePool.from_file(run.votes).describe(), task)
    return before, rounds_before, last["epsilon"]


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
    _check_answers_pool(run, received, task)
    features = None
    if spec.arch in POOL_FEATURE_ARCHS:
        given = _given_encoder(run, options, task.pool_x.shape[1])
        features = _pool_features(options, given, load_classifier(run.student), task.pool_x,
                                  say)
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
    got (``_settled_rounds``). The rounds recorded under ``round_name`` (``pate run``'s
    stage) count towards its ``options.queries``: a stage resumed after its round only trains,
    and one stopped within its round asks the rest.
    ``open_session(check_votes)`` opens the aggregator; one over local votes calls
    ``check_votes`` on them before its ledger opens (a votes file of another pool or run is
    refused with nothing created). With no ``open_session`` nothing is asked: the student is
    trained again on the answers in hand, with the epsilons of the round that asked them.
    ``on_epoch``
    gets (epoch, mean losses) after each training epoch; ``say`` one line of news."""
    started = time.perf_counter()
    task = load_task(data, need_private=False)
    _check_teachers_data(run, task, data)
    method = options.method_config(task.kind)
    fit_config = options.fit_config(method)
    pool_x, pool_y = task.pool_x, task.pool_y
    spec = method.spec(task.input_shape, task.num_classes)
    pool_features = spec.arch in POOL_FEATURE_ARCHS
    if not pool_features and (options.pool_encoder or options.encoder_epochs):
        raise UserError("--pool-encoder and --encoder-epochs are for --arch "
                        f"{', '.join(sorted(POOL_FEATURE_ARCHS))} only")
    given = _given_encoder(run, options, pool_x.shape[1]) if pool_features else None
    check_network(spec)
    run.create()
    out = run.student
    before = Received.load(run.labels) if run.labels.is_file() else Received.empty()
    pool_recorded = _check_answers_pool(run, before, task)
    if np.any(before.pool_index >= len(pool_x)):
        raise UserError(f"{run.labels} has pool indices beyond the pool's {len(pool_x)} rows")
    previous = load_classifier(out)
    rounds_before = _settled_rounds(run, before, read_rounds(run))
    if open_session is not None:
        if round_name is not None:  # what the stage asked before it was stopped counts
            asked = sum(r["queries"] for r in rounds_before if r.get("round") == round_name)
            options = replace(options, queries=max(0, options.queries - asked))
        _needs_previous_student(run, mechanism, options, previous)

    if open_session is None:  # --queries 0 with no aggregator: train on the answers in hand
        received, rounds, epsilon = _answers_in_hand(run, before, rounds_before, task,
                                                    pool_recorded)
    else:
        session = open_session(lambda pool: _check_votes(run, pool.describe(), task))
        received, rounds, epsilon = _ask_round(run, session, task, options, before, previous,
                                               rounds_before, conversion, spent_is_final, say,
                                               round_name)
    answered = received.answered
    if not answered.any():
        raise UserError("no labels received yet: nothing to train on (more queries or a lower "
                        "threshold)")
    lab_index = received.pool_index[answered]
    lab_y = received.label[answered]
    continued = previous is not None and previous[1] == spec and (
        load_spec(out, "generator") is not None or options.method != "gan")
    features = None
    if pool_features:  # continue only on the same encoder
        features = _pool_features(options, given, previous, pool_x, say)
        continued = continued and same_tensors(previous[0].experts[1][0].encoder,
                                               features.encoder)
    model, learner, result, acc = _fit_on_answers(
        task, options, spec, features, lab_index, lab_y, on_epoch, out if continued else None)
    save_model(model, spec, out)
    run.write_json(run.student_schema, student_schema(task))
    if options.method == "gan":
        save_model(learner.generator_net, spec, out, "generator")

    metrics = {
        "method": options.method, "arch": spec.arch, "dataset": task.name,
        "accuracy": acc,  # None: no test data, so not measured (never on private data)
        "eval_size": 0 if task.eval_y is None else len(task.eval_y),
        "pool_size": len(pool_x), "pool_fingerprint": task.pool_fingerprint,
        "classes": list(task.classes),
        "classes_from": task.classes_from,
        **received.counts(),
        "asked_this_round": len(received) - len(before),
        "labels_used": int(answered.sum()),
        # a benchmark's pool labels only: a user's public labels are never read
        "label_accuracy": (None if pool_y is None
                           else float(np.mean(lab_y == pool_y[lab_index]))),
        "epsilon": epsilon,
        "rounds": rounds,
        "continued_from_previous": continued,
        "training": {"width": spec.width, **asdict(fit_config),
                     **({"vat_eps": method.vat_eps, "entmin": method.entmin}
                        if options.method == "vat" else {})},
        "epochs": options.epochs, "seconds_per_epoch": float(np.mean(result.seconds_per_epoch)),
        "seconds": time.perf_counter() - started,
    }
    run.write_json(run.student_metrics, metrics)
    return metrics
