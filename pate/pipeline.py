"""``pate run``: private data to a published student in one command (docs/design.md, "Data flow
of ``pate run``").

Stages, each a library call on one run directory (``pate.rundir.RunDir``): teachers (on Ray,
resumable by shard) -> votes -> student round 1 (Confident-GNMax) and, if asked for, round 2
(Interactive-GNMax), each against a real HTTP aggregation service on loopback (``pate.service.
server``, in a thread of this process) with a generated token and the run's one ledger -> dpsgd
(optional baseline at a fixed epsilon) -> compare (optional owner-only evaluation,
``pate.comparison``) -> report. A finished stage is recorded in ``stages.json`` and skipped on
rerun; an interrupted stage runs again, asking only what its round had not asked
(``student.workflow.train_student``: nothing paid for is asked again). Each
stage's start and end go to ``log.txt`` and, unless quiet, to stderr.
"""

from __future__ import annotations

import contextlib
import secrets
import time
import warnings
from collections.abc import Callable
from pathlib import Path

from analysis.costs import realised_rdp_independent, worst_case_queries
from analysis.encoding_profiles import profiles_problem
from analysis.orders import default_orders
from analysis.rdp import epsilon_from_rdp
from pate.aggregation.budget_registry import ledgers_said, other_ledgers
from pate.aggregation.delta_policy import check_delta
from pate.aggregation.ledger_store import canonical_url, ledger_url
from pate.aggregation.votes_ledger import recorded_ledger
from pate.comparison import dpsgd_settings, run_comparison
from pate.config import RunConfig, dump_config, recorded_config
from pate.config_changes import config_differences, fixed_differences
from pate.data.task import DataFiles, Task, data_kind, load_task, unused_setting_problem
from pate.devices import device_problem
from pate.errors import UserError
from pate.io import remove_temporaries
from pate.progress import say
from pate.report.freshness import current_report
from pate.report.run_report import write_run_report
from pate.rundir import LEDGER_FILE, RunDir
from pate.service.client import LabelClient
from pate.service.server import open_server
from student.asking import AggregatorSession
from student.baseline import train_dpsgd_baseline
from student.choices import dpsgd_model_for
from student.dpsgd import dpsgd_network, trained_parameters
from student.models import check_network
from student.options import StudentOptions
from student.workflow import train_student
from teachers.choices import model_data_problem
from teachers.distributed import Cluster, TrainJob, train_teachers
from teachers.ensemble import TrainConfig, train_config_for
from teachers.models import check_user_model
from teachers.partition import deal_rows
from teachers.votes import collect_votes

_ALLOW_LARGE_DELTA = "aggregator.allow_large_delta = true"


def prepare_run_dir(config: RunConfig, run: RunDir) -> None:
    """Create the run directory (0700) and its config.toml; a rerun must use the same config
    (where its stages run may change: ``pate.config_changes.PLACEMENT_KEYS``; so may the
    settings of stages that have not finished, ``pate.config_changes.RELAXED_SECTIONS``: a
    round, DP-SGD, the comparison; a default may be written out or left out), unless the
    first attempt stopped before it made anything (config.toml and log.txt are all there is):
    then the new config replaces the old. The log says what changed. A directory refused is
    left as it was."""
    made = (set() if not run.root.is_dir()
            else {p.name for p in run.root.iterdir()} - {run.config.name, run.log.name})
    recorded = recorded_config(run.config)
    fixed = ([] if recorded is None or not made
             else fixed_differences(recorded, config, run.finished_stages()))
    opened = recorded_ledger(run.root) is not None  # its own, or a shared one it has charged
    if recorded is not None and opened:  # the budget is the ledger's from then on
        fixed += [key for key in config_differences(recorded, config)
                  if key in ("aggregator.budget_epsilon", "aggregator.delta")
                  and key not in fixed]
    if fixed:
        retrain = ("; to train the student again on the answers in hand, at no privacy cost: "
                   f"pate student train --run {run} --queries 0 "
                   f"{config.student.retrain_flags()}"
                   if any(key.startswith("student.") for key in fixed) else "")
        budget = (" (with its own ledger, a new privacy budget for the same private data, "
                  "unless aggregator.ledger names one they share)"  # where this one has one
                  if opened and config.aggregator.ledger is None else "")
        raise UserError(f"{run} was started with a different configuration (other "
                        f"{', '.join(fixed)}, on which what it has made depends): "
                        f"repeat it, or use a new --run directory{budget}{retrain}")
    if recorded is None and run.stages.is_file():  # finished stages of an unknown config
        raise UserError(f"{run} holds stages of a pate run but no config.toml; use a new --run "
                        "directory")
    if recorded is None and made:  # the separate commands' outputs, settings pate run lacks
        shown = ", ".join(sorted(made)[:3]) + (", ..." if len(made) > 3 else "")
        if made & run.own_names():
            raise UserError(f"{run} holds what other commands made ({shown}) and no "
                            "config.toml: pate run needs a new --run directory")
        raise UserError(f"{run} is not empty ({shown}) and is no run directory: pate run needs "
                        "a new or empty --run directory")
    run.create()
    if recorded == config:
        run.config.chmod(0o600)  # written public by a version before config.toml was private
        return
    if recorded is not None and made:  # the same run, placed elsewhere or mended ahead
        changed = config_differences(recorded, config)
        moved = config_differences(recorded, config, placement=True) != changed
        run.write_config(dump_config(config))
        run.append_log(f"config.toml: {', '.join(changed)} changed, for the stages not finished"
                       if changed else "config.toml: where the stages run changed (workers, "
                       "device, GPU share or Ray cluster)" if moved else
                       "config.toml: the same settings, a default written out or left out")
        return
    if recorded is not None:
        run.append_log("config.toml replaced: the last attempt stopped before any stage made "
                       "anything")
    run.write_config(dump_config(config))


def _token(run: RunDir) -> Path:
    """A fresh random bearer token for this run's student, private to the run directory."""
    if not run.token.is_file():
        run.write_secret(run.token, secrets.token_urlsafe(32) + "\n")
    return run.token


def _train_config(config: RunConfig, kind: str) -> TrainConfig:
    """The teachers' training settings of ``config`` on data of ``kind`` (``image`` or
    ``tabular``; the library's defaults where unset)."""
    t = config.teachers
    return train_config_for(config.data.source(), kind, model=t.model, augment=t.augment,
                            seed=t.seed, epochs=t.epochs, batch_size=t.batch_size, lr=t.lr,
                            mixup=t.mixup)


def _teachers(config: RunConfig, run: RunDir) -> None:
    t, source = config.teachers, config.data.source()
    train = _train_config(config, data_kind(source))
    job = TrainJob(source, t.count, t.shard_size, train, t.partition)
    cluster = Cluster(t.workers, t.ray_address, t.device, t.gpus_per_shard)
    result = train_teachers(run.root, job, cluster)
    run.append_log(f"teachers: {len(result['trained'])} shard(s) trained, "
                   f"{len(result['skipped'])} already done")


def _votes(config: RunConfig, run: RunDir) -> None:
    queries = collect_votes(run.root, config.teachers.device)
    run.append_log(f"votes: {queries} pool rows")


def _student_options(config: RunConfig, queries: int, select: str | None = None
                     ) -> StudentOptions:
    """The student's options for a round of ``queries``, selected by ``select`` (default: the
    config's round-1 selection)."""
    s = config.student
    return StudentOptions(
        method=s.method, arch=s.arch, width=s.width, queries=queries,
        select=s.select if select is None else select,
        request_size=s.request_size, epochs=s.epochs, batch_size=s.batch_size,
        unlabelled_batch_size=s.unlabelled_batch_size, lr=s.lr, augment=s.augment,
        balance_classes=s.balance_classes, vat_eps=s.vat_eps, entmin=s.entmin,
        encoder_epochs=s.encoder_epochs, seed=s.seed, device=s.device)


def _student_round(config: RunConfig, run: RunDir, stage: str, mechanism: str, queries: int,
                   select: str | None = None) -> None:
    """One query round (the stage ``stage``) of the student against a real HTTP label service of
    ``mechanism`` on loopback, over the run's votes and ledger, on rows chosen by ``select``
    (default: the config's). The last round releases the sanitised epsilon of all of them (the
    server's votes and ledger at hand); the rounds before it release none, which would cost
    privacy too."""
    a = config.aggregator
    token = _token(run)
    server = open_server(a.round_mechanism(mechanism), token_file=token,
                         epsilon_budget=a.budget_epsilon, delta=a.delta, run_dir=run.root,
                         ledger=a.ledger, host="127.0.0.1", port=0,
                         device=config.teachers.device,
                         private_records=run.private_records(),
                         allow_large_delta=a.allow_large_delta, allow_name=_ALLOW_LARGE_DELTA)
    try:
        with server.running() as url:
            say(f"pate run: {mechanism} aggregation service on {url}")
            last = stage == [s for s in config.stages() if s.startswith("student-")][-1]
            session = AggregatorSession(LabelClient.from_token_file(url, token), mechanism,
                                        server.service if last else None,
                                        release_sanitised=a.release_sanitised)
            options = _student_options(config, queries, select)
            # the server's votes are the run's own, checked by the stage that made them
            metrics = train_student(run, lambda _check: session, options, config.data.source(),
                                    on_epoch=_epoch_line(run, stage),
                                    say=lambda text: say(f"pate run: {text}"),
                                    spent_is_final=False, mechanism=mechanism,
                                    round_name=stage)
    finally:
        server.close()
    shown = ("not measured (no test data)" if metrics["accuracy"] is None
             else f"{metrics['accuracy']:.4f}")
    run.append_log(f"{stage}: accuracy {shown}, "
                   f"{metrics['labels_used']} labels, epsilon "
                   f"{metrics['epsilon']['data_independent']:.3f} data-independent (the "
                   "ledger's)")


def _epoch_line(run: RunDir, stage: str) -> Callable[[int, dict[str, float]], None]:
    """An ``on_epoch`` that says each finished epoch (its mean losses, of public data and
    released labels) on stderr and in ``log.txt``."""
    def on_epoch(epoch: int, losses: dict[str, float]) -> None:
        shown = ", ".join(f"{name} {value:.4f}" for name, value in losses.items())
        line = f"{stage}: epoch {epoch + 1} done ({shown})"
        say(f"pate run: {line}")
        run.append_log(line)
    return on_epoch


def _dpsgd(config: RunConfig, run: RunDir) -> None:
    settings, encoding = dpsgd_settings(config, config.dpsgd.epsilon)
    metrics = train_dpsgd_baseline(run, settings, config.data.source(), encoding=encoding)
    run.append_log(f"dpsgd: accuracy {metrics['accuracy']:.4f} at epsilon "
                   f"{metrics['epsilon']:.3f}")


def _compare(config: RunConfig, run: RunDir) -> None:
    record = run_comparison(config, run, _student_options(config, config.student.queries),
                            lambda text: say(f"pate run: compare: {text}"))
    trained = sum("accuracy" in d for d in record["dpsgd"])
    run.append_log(f"compare: {trained} DP-SGD model(s), the non-private model "
                   f"({record['nonprivate']['epochs']} epochs) and {len(record['prefixes'])} "
                   "prefix student(s) trained (figures: owner-only, comparison/)")


def _report(run: RunDir) -> None:
    say(f"pate run: report: {write_run_report(run.root)}")


# the start of the votes' own warning of other ledgers (``votes_ledger.note_ledger``), which a
# run that gave ``_other_budgets``'s does not repeat
_VOTES_OTHER_LEDGERS = "the private data of these votes is also charged to"


def _other_budgets(config: RunConfig, run: RunDir, task: Task) -> str | None:
    """The warning, given before anything trains (once the run is not refused), where other
    ledgers (the registry's) charge the same private data and this run's ledger is not one of
    them: its budget would be another (docs/design.md, privacy rule 5); None where none does.
    Given, it stands for the votes' own warning when the ledger opens (not said again)."""
    private = task.private_data_fingerprint
    if private is None:
        return None
    ledger = config.aggregator.ledger
    url = canonical_url(ledger_url(ledger) if ledger is not None
                        else f"sqlite:///{run.root.resolve() / LEDGER_FILE}")
    # the rows' key in order (older versions entered the data's ledgers under it), in any order
    # and format (its copies' ledgers), and as encoded (the Python API's of the same arrays)
    others = other_ledgers((private, task.private_fingerprint, task.private_rows_fingerprint,
                            task.private_encoded_rows_fingerprint), url)
    if not others:
        return None
    return (f"this private data is already charged to {len(others)} other ledger(s) "
            f"({ledgers_said(others)}): this run's ledger would be another budget for it, and the "
            "budgets of one body of private data add up; to share one, give it as "
            "aggregator.ledger")


def _check_data(config: RunConfig, run: RunDir) -> tuple[int, str | None]:
    """Before a new run directory is made or a teacher trained, what would otherwise fail only
    after hours of training: the data loads (a wrong column, a missing file); delta suits its
    number of private records (``check_delta``; its warning is left to the student's stage,
    which gives it once); there are rows for every teacher; the teachers' model, the
    student's method and network, and DP-SGD's network where it trains, suit the kind of data
    (a user's network is built once; DP-SGD needs test data); and
    the budget covers two queries (with a warning when it covers, at worst, fewer answered
    queries than there are classes, and one when the rounds ask more rows than the pool has).
    Returns how many queries the budget covers, answered or declined, whatever the votes, and
    the warning of other ledgers charging the same data (``_other_budgets``), said once nothing
    refuses the run."""
    source = config.data.source()
    if isinstance(source, DataFiles) and (problem := unused_setting_problem(source)):
        raise UserError(f"[data]: {problem}")
    task = load_task(source, need_private=True)
    assert task.private_y is not None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            check_delta(config.aggregator.delta, len(task.private_y),
                        config.aggregator.allow_large_delta, _ALLOW_LARGE_DELTA)
        except UserError as exc:
            raise UserError(f"aggregator.{exc}") from None
    if config.teachers.count > len(task.private_y):
        raise UserError(f"teachers.count {config.teachers.count} is more than the number of "
                        "private records: each teacher needs one")
    if config.teachers.partition != "position":  # whether each teacher gets rows depends on them
        deal_rows(config.teachers.partition, task.private_x, task.private_y,
                  config.teachers.count, config.teachers.seed, task.private_keys)
    try:
        train = _train_config(config, task.kind)  # the data's kind as loaded, not read again
        problem = model_data_problem(train.model, task.kind, task.input_shape)
        if problem:
            raise UserError(problem)
        check_user_model(train.model, task.input_shape, task.num_classes, train.batch_size)
    except UserError as exc:
        raise UserError(f"teachers.{exc}") from None
    try:
        method = _student_options(config, config.student.queries).method_config(task.kind)
        check_network(method.spec(task.input_shape, task.num_classes))
    except UserError as exc:
        raise UserError(f"student.{exc}") from None
    if config.dpsgd.enabled or config.compare.enabled:  # DP-SGD trains in those stages
        try:
            network = dpsgd_model_for(config.dpsgd.model, task.kind)
        except ValueError as exc:
            raise UserError(f"dpsgd.{exc}") from None
        dpsgd_settings(config, config.dpsgd.epsilon)  # its bounds (lr, clipping), said now
        if config.dpsgd.encode is not None and (problem := profiles_problem(
                config.dpsgd.encode, trained_parameters(dpsgd_network(
                    network, task.input_shape, task.num_classes, 0.0, 1.0)[1]))):
            raise UserError(f"dpsgd.encode: {problem}")
        if task.eval_y is None:
            raise UserError("the DP-SGD baseline and the comparison are measured on test "
                            "data: give data.test, or leave dpsgd and compare off")
    a = config.aggregator
    confident, orders = a.round_mechanism("confident"), default_orders()
    covered = worst_case_queries(confident, a.budget_epsilon, a.delta, orders)
    if covered < 2:  # the fewest labels a student learns from (one teaches it one class)
        two = epsilon_from_rdp(realised_rdp_independent(confident, 2, 2, orders), orders,
                               a.delta)[0]
        raise UserError(f"aggregator.budget_epsilon {a.budget_epsilon:g} does not cover two "
                        f"queries, the fewest a student can learn from: their worst case is "
                        f"epsilon {two:.3g} at delta {a.delta:g} (a larger budget, or larger "
                        "sigma1 and sigma2)")
    st = config.student
    asked = 0
    for key in ("queries", "active_queries", "interactive_queries"):  # the rounds' order
        if getattr(st, key) and asked >= len(task.pool_x):
            raise UserError(f"student.{key} {getattr(st, key)}: the rounds before it ask for "
                            f"all {len(task.pool_x)} pool rows, and no row is asked twice, so "
                            f"it would find none left (fewer queries before it, or {key} = 0)")
        asked += getattr(st, key)
    if asked > len(task.pool_x):
        warnings.warn(f"student: {asked} queries in all (queries, active_queries, "
                      f"interactive_queries) for a pool of {len(task.pool_x)} rows: no row is "
                      "asked twice, so the rounds ask fewer", UserWarning, stacklevel=2)
    if covered < task.num_classes:
        warnings.warn(f"aggregator.budget_epsilon {a.budget_epsilon:g} buys at most {covered} "
                      f"teachers' answers, fewer than the "
                      f"{task.num_classes} classes: the student may get too few labels to "
                      "learn from, after the teachers have trained", UserWarning, stacklevel=2)
    return covered, _other_budgets(config, run, task)


def run_pipeline(config: RunConfig, run_dir: str | Path) -> Path:
    """Run every unfinished stage in order; returns the report's path."""
    for section in (config.teachers, config.student):
        problem = device_problem(section.device)
        if problem:  # before the run directory exists
            raise UserError(problem + (
                " (with teachers.ray_address the cluster trains the teachers, and this "
                "machine votes with them and serves their answers on teachers.device)"
                if section is config.teachers and config.teachers.ray_address else ""))
    run = RunDir(run_dir)
    recorded = recorded_config(run.config)
    covered = other_budgets = None
    if run.private_records() is None or (recorded is not None
                                         and config_differences(recorded, config)):
        # a new run, or one whose config was mended: first
        covered, other_budgets = _check_data(config, run)
    if not run.root.is_dir():
        run.create()
    with run.exclusive():  # held before config.toml is read or written
        prepare_run_dir(config, run)  # made 0700 there, once it is not refused
        if left := remove_temporaries(run.root):  # a killed attempt's (commands that do not
            # hold the directory may be writing theirs now: those are left alone)
            run.append_log(f"removed {left} unfinished write(s) of an attempt that was killed")
        if other_budgets is not None:
            warnings.warn(other_budgets, UserWarning, stacklevel=2)
        if covered is not None:
            a = config.aggregator
            say(f"pate run: the budget (epsilon {a.budget_epsilon:g} at delta {a.delta:g}) "
                f"covers at least {covered} queries, answered or declined, whatever the votes "
                "(a declined one costs less)")
        with warnings.catch_warnings():
            if other_budgets is not None:  # said above: not again when the ledger opens
                warnings.filterwarnings("ignore", message=_VOTES_OTHER_LEDGERS)
            _run_stages(config, run, _stage_actions(config, run))
    return run.report / "report.html"


def _stage_actions(config: RunConfig, run: RunDir) -> dict[str, Callable[[], None]]:
    """What each stage of ``pate run`` does."""
    return {
        "teachers": lambda: _teachers(config, run),
        "votes": lambda: _votes(config, run),
        "student-confident": lambda: _student_round(
            config, run, "student-confident", "confident", config.student.queries),
        "student-active": lambda: _student_round(
            config, run, "student-active", "confident", config.student.active_queries,
            "uncertainty"),
        "student-interactive": lambda: _student_round(
            config, run, "student-interactive", "interactive",
            config.student.interactive_queries),
        "dpsgd": lambda: _dpsgd(config, run),
        "compare": lambda: _compare(config, run),
        "report": lambda: _report(run),
    }


def _run_stages(config: RunConfig, run: RunDir, actions: dict[str, Callable[[], None]]) -> None:
    """Every stage of ``config`` not finished yet, in order, each logged and timed."""
    done = run.finished_stages()
    if "report" in done and current_report(run.root) is None:
        done.pop("report")
        run.append_log("report: missing, damaged, of an older version or older than a file it "
                       "is made from (config.toml, the student, ...): written again")
    for stage in config.stages():
        if stage in done:
            say(f"pate run: {stage}: done already, skipped")
            continue
        say(f"pate run: {stage}: started")
        run.append_log(f"{stage}: started")
        start = time.monotonic()
        try:
            actions[stage]()
        except BaseException as exc:  # said in the public log by its class only: a message
            # may name the private data's file; a log that cannot be written hides nothing
            with contextlib.suppress(OSError):
                run.append_log(f"{stage}: " + (
                    "interrupted" if isinstance(exc, KeyboardInterrupt)
                    else f"failed ({type(exc).__name__})"))
            raise
        seconds = time.monotonic() - start
        run.finish_stage(stage, seconds)
        run.append_log(f"{stage}: finished in {seconds:.1f} s")
        say(f"pate run: {stage}: finished in {seconds:.1f} s")
