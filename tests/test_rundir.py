"""``pate.rundir.RunDir``: where a run keeps each artifact, created with the right modes, and the
records it writes itself (stages, log)."""

import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pate.errors import UserError
from pate.rundir import RunDir


def test_create_is_private_and_idempotent(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "a" / "run").create()
    assert stat.S_IMODE(run.root.stat().st_mode) == 0o700
    assert RunDir(run.root).create() == run
    assert run.votes == run.root / "votes.npz" and run.ledger == run.root / "ledger.db"
    assert run.rounds.parent == run.student and run.manifest.parent == run.teachers


def test_a_run_directory_that_cannot_be_created_is_one_user_error(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.raises(UserError, match="cannot create the run directory") as info:
        RunDir(blocker / "run").create()
    assert "\n" not in str(info.value)


def test_a_folder_of_other_files_is_no_run_directory(tmp_path: Path) -> None:
    """A stage command given a folder of the user's own files is refused, before it writes
    beside them and takes others' permissions from it (``pate run`` refused it already); a
    folder that holds what pate writes, or hidden entries only, is taken."""
    papers = tmp_path / "papers"
    papers.mkdir(mode=0o755)
    for name in ("thesis.tex", "data.csv", "notes", "zeta.txt"):
        (papers / name).write_text("")
    with pytest.raises(UserError, match=r"papers holds other files \(data\.csv, notes, "
                                        r"thesis\.tex, \.\.\.\) and nothing of a run's: give a "
                                        r"new or empty --run directory$"):
        RunDir(papers).create()
    assert stat.S_IMODE(papers.stat().st_mode) == 0o755 and len(list(papers.iterdir())) == 4
    for entries in ((".DS_Store",), ("votes.npz", "README.txt")):
        folder = tmp_path / entries[-1]
        folder.mkdir()
        for name in entries:
            (folder / name).write_text("")
        RunDir(folder).create()


def test_stages_and_log_are_recorded(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    assert run.finished_stages() == {}
    run.finish_stage("teachers", 1.23456)
    run.finish_stage("votes", 2.0)
    assert RunDir(run.root).finished_stages() == {"teachers": 1.235, "votes": 2.0}
    run.append_log("teachers: started")
    run.append_log("teachers: finished in 1.2 s")
    lines = run.log.read_text().splitlines()
    assert [line.split(" ", 1)[1] for line in lines] == ["teachers: started",
                                                         "teachers: finished in 1.2 s"]


def test_secrets_are_private(tmp_path: Path) -> None:
    run = RunDir(tmp_path / "run").create()
    run.write_secret(run.token, "t0ken\n")
    run.write_json(run.stages, {})
    assert stat.S_IMODE(run.token.stat().st_mode) == 0o600
    assert stat.S_IMODE(run.stages.stat().st_mode) == 0o644


def test_a_private_record_is_written_private_whoever_forgets_to_say_so(tmp_path: Path) -> None:
    """``write_json`` makes a private artifact 0600 by what it is, even without ``private``."""
    run = RunDir(tmp_path / "run").create()
    private = [run.config, run.votes, run.ledger, run.releases, run.token, run.manifest,
               run.comparison_metrics, run.comparison_dpsgd("sanitised") / "metrics.json",
               run.report_json, run.audit / "summary.json", run.dpsgd_bayesian,
               run.dpsgd_distances]
    public = [run.stages, run.labels, run.rounds, run.student_metrics, run.student_schema,
              run.dpsgd_metrics, run.partition]
    for path in private + public:
        path.parent.mkdir(parents=True, exist_ok=True)
        run.write_json(path, {})
    assert all(run.is_private(p) for p in private) and not any(map(run.is_private, public))
    assert {stat.S_IMODE(p.stat().st_mode) for p in private} == {0o600}
    assert {stat.S_IMODE(p.stat().st_mode) for p in public} == {0o644}
    run.write_json(run.partition, {}, private=True)  # dealt by record or key: its writer says
    assert stat.S_IMODE(run.partition.stat().st_mode) == 0o600


def test_public_files_and_folders_have_their_modes_whatever_the_umask(tmp_path: Path) -> None:
    """Under ``umask 000`` the log and a public folder were 0666 and 0777."""
    import os

    old = os.umask(0)
    try:
        run = RunDir(tmp_path / "run").create()
        run.append_log("teachers: started")
        run.write_json(run.student_metrics, {})
    finally:
        os.umask(old)
    assert stat.S_IMODE(run.log.stat().st_mode) == 0o644
    assert stat.S_IMODE(run.student.stat().st_mode) == 0o755
    assert stat.S_IMODE(run.student_metrics.stat().st_mode) == 0o644


def test_a_run_directory_made_read_only_stays_so(tmp_path: Path) -> None:
    """Opening a run takes every permission of others from its folder, never gives its owner
    one back: a folder its owner made read-only stays read-only (a command then fails to
    write, in one line, rather than writing into it)."""
    run = RunDir(tmp_path / "run").create()
    run.root.chmod(0o755)
    RunDir(run.root).create()
    assert stat.S_IMODE(run.root.stat().st_mode) == 0o700
    run.root.chmod(0o555)
    try:
        RunDir(run.root).create()
        assert stat.S_IMODE(run.root.stat().st_mode) == 0o500
    finally:
        run.root.chmod(0o700)


def test_the_newest_models_audit_is_found_by_its_time_with_or_without_a_tag(
        tmp_path: Path) -> None:
    """``pate audit models`` names its summary by its UTC time and a random tag (older versions
    wrote no tag): the report reads the newest, and is made again when one is added."""
    from pate.report.freshness import report_inputs
    from pate.report.run_report import latest_models_audit

    run = RunDir(tmp_path)
    assert run.models_audits() == [] and latest_models_audit(run) is None
    run.audit.mkdir()
    (run.audit / "models-20261128T101010Z.json").write_text('{"passed": true}')
    (run.audit / "models-20261128T101010Z-records.npz").write_bytes(b"")
    (run.audit / "models-20261129T090000Z-3fa2c1.json").write_text('{"passed": false}')
    assert [p.name for p in run.models_audits()] == ["models-20261128T101010Z.json",
                                                     "models-20261129T090000Z-3fa2c1.json"]
    assert latest_models_audit(run) == {"passed": False,
                                        "file": "audit/models-20261129T090000Z-3fa2c1.json"}
    assert report_inputs(run)[-1].name == "models-20261129T090000Z-3fa2c1.json"


def test_a_command_waits_out_a_brief_hold_and_is_refused_a_long_one(tmp_path: Path) -> None:
    """``pate status`` holds a run directory for an instant (``in_use``): a command starting
    then waits it out; one held by another command is refused after ``LOCK_WAIT_S``."""
    import threading
    import time

    run = RunDir(tmp_path / "run").create()
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with run.exclusive():
            held.set()
            release.wait()

    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    assert run.in_use()  # at once, no wait
    threading.Timer(0.3, release.set).start()  # a brief hold, as pate status's
    started = time.monotonic()
    with run.exclusive():
        assert 0.2 < time.monotonic() - started < 1.0
    holder.join()
    release.clear()
    held.clear()
    holder = threading.Thread(target=hold)
    holder.start()
    held.wait()
    with pytest.raises(UserError, match="is in use by another pate command"), run.exclusive(
            wait_s=0.2):
        pass
    release.set()
    holder.join()
    assert not run.in_use()


_UNREADABLE = """
import os, sys
from pathlib import Path
import numpy as np
from pate.data.votes_file import load_private_fingerprint
from pate.errors import UserError
from student.models import ModelSpec, build_classifier
from student.training import load_classifier, save_model
folder = Path(sys.argv[1])
np.savez(folder / "votes.npz", votes=np.zeros((2, 2)))
spec = ModelSpec("mlp", (1, 4, 4), 2, 8)
save_model(build_classifier(spec), spec, folder)
for path in (folder / "votes.npz", folder / "model.safetensors"):
    path.chmod(0)
for read in (lambda: load_private_fingerprint(folder / "votes.npz"),
             lambda: load_classifier(folder)):
    try:
        read()
    except UserError as exc:
        print(exc)
"""


def test_a_file_you_may_not_read_is_said_so_not_called_damaged(tmp_path: Path) -> None:
    """Its permissions, not a damaged file (votes.npz), nor a damaged run directory (the
    student's weights, which safetensors calls a missing file). Run without the power to read
    what root may (CAP_DAC_OVERRIDE) where the tests run as root."""
    drop = ([] if os.geteuid() != 0 else
            ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"])
    if drop and shutil.which("setpriv") is None:
        pytest.skip("running as root without setpriv to drop the power to read any file")
    said = subprocess.run([*drop, sys.executable, "-c", _UNREADABLE, str(tmp_path)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])})
    assert said.stdout.splitlines() == [
        f"{tmp_path / 'votes.npz'}: not readable by you (its permissions)",
        f"{tmp_path / 'model.safetensors'}: not readable by you (its permissions)"], said.stderr
