"""``pate audit models`` on scikit-learn's digits: the positive control finds epsilon > 1, the
per-record results are private files, nothing private is printed, and bad requests are one error
line. The student's path (votes, aggregators, the student retrained) runs on a real
``pate run digits-tiny`` in the slow test."""

import json
import stat
import subprocess
import sys
from dataclasses import asdict, replace
from pathlib import Path

import numpy as np
import pytest
import torch

from pate.audit.model_options import ModelsAuditOptions
from pate.audit.models import audit_models
from pate.audit.retraining import Recipe, stacked_log_probs, train_models
from pate.cli.main import main
from pate.data.datasets import public_split
from pate.data.task import Benchmark, DataFiles, source_record
from pate.io import write_json_atomic
from teachers.ensemble import TrainConfig, train_one

TEACHERS = 10


@pytest.fixture()
def digits_run(tmp_path: Path, digits) -> Path:
    """A run directory whose teachers' manifest says how the run trained them (10 teachers of
    the digits, the digits-tiny recipe): all the teacher, non-private and control targets read."""
    run = tmp_path / "run"
    write_json_atomic(run / "teachers" / "manifest.json", {
        "dataset": "digits", "data": source_record(Benchmark("digits")), "done": True,
        "num_teachers": TEACHERS, "in_shape": [1, 8, 8],
        "num_classes": 10, "model": "cnn", "shards": {},
        "train": asdict(TrainConfig(model="cnn", epochs=5, batch_size=8))}, private=True)
    return run


def test_models_on_fixed_maps_retrain_and_score_as_the_runs_teachers(digits) -> None:
    """The audit's retraining of `hog-scatter` models with shifts and mixup (Kymatio's
    scattering cannot run inside vmap: the maps run outside it, as in the run) gives each
    model's log-probabilities as the model trained alone on its rows."""
    recipe = Recipe(TrainConfig(model="hog-scatter", epochs=2, batch_size=8,
                                augment="shift-flip", mixup=0.4, seed=3), (1, 8, 8), 10, None)
    x, y = digits.train_x.astype(np.float32), digits.train_y
    data = [(x[:60], y[:60]), (x[60:120], y[60:120])]
    params = train_models(recipe, data, [4, 7], 60)
    got = stacked_log_probs(recipe, params, x[200:300])
    for j, (t, (xj, yj)) in enumerate(zip([4, 7], data, strict=True)):
        alone = train_one(recipe.train, torch.as_tensor(xj), torch.as_tensor(yj), 10, t,
                          np.arange(60), 60).eval()
        with torch.no_grad():
            ref = torch.log_softmax(alone(torch.as_tensor(x[200:300])).double(), -1).numpy()
        np.testing.assert_allclose(got[j], ref, atol=1e-3)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_positive_control_finds_a_leak(digits_run: Path, digits) -> None:
    audit = audit_models(digits_run, ModelsAuditOptions(
        targets=("control",), control_rows=200, control_canaries=200, control_epochs=20,
        references=0, seed=0))
    (control,) = audit.targets
    assert control.epsilon_lower > 1.0 and audit.passed
    assert control.canaries == 200 and 0 < control.members < 200
    assert control.training_rows == 200 + control.members    # its rows and kept canaries
    assert control.accuracy > 0.5                              # it learnt the digits too
    assert control.epsilon_analytic is None
    folder = digits_run / "audit"
    assert _mode(folder) == 0o700 and audit.records.parent == folder
    assert _mode(audit.records) == 0o600 and _mode(audit.summary) == 0o600
    with np.load(audit.records) as records:
        rows, members = records["control_rows"], records["control_members"]
        assert len(np.unique(rows)) == 200 and rows.max() < 1297
        assert members.dtype == bool and int(members.sum()) == control.members
        assert np.isfinite(records["control_loss_scores"]).all()
        labels = records["control_labels"]
    assert not np.any(labels == digits.train_y[rows])         # every canary mislabelled


def test_control_without_a_leak_fails_the_audit(digits_run: Path) -> None:
    # One epoch of a few canaries: nothing is memorised, the audit must say it saw no leak.
    audit = audit_models(digits_run, ModelsAuditOptions(
        targets=("control",), control_rows=0, control_canaries=40, control_epochs=1,
        references=0, seed=1))
    assert not audit.passed
    assert any(f.startswith("positive control failed") for f in audit.failures)


def _lists(obj) -> list[list]:
    if isinstance(obj, list):
        return [obj, *(x for item in obj for x in _lists(item))]
    if isinstance(obj, dict):
        return [x for v in obj.values() for x in _lists(v)]
    return []


def test_cli_prints_aggregates_only(digits_run: Path, capsys: pytest.CaptureFixture) -> None:
    args = ["audit", "models", "--run", str(digits_run), "--targets", "teacher", "nonprivate",
            "--teachers", "2", "--nonprivate-rows", "100", "--nonprivate-canaries", "100",
            "--references", "5", "--seed", "2"]  # the pool's 250 rows hold fewer reference sets
    assert main([*args, "--json"]) == 0
    out = capsys.readouterr().out
    summary = json.loads(out)
    assert summary["passed"] is True
    assert [t["target"] for t in summary["targets"]] == ["teacher", "nonprivate"]
    teacher, nonprivate = summary["targets"]
    assert 128 <= teacher["canaries"] <= 130    # half of two partitions of 129 or 130 rows
    assert nonprivate["canaries"] == 100 and nonprivate["training_rows"] == 100 + \
        nonprivate["members"]
    refs = teacher["reference_models"]
    assert teacher["epsilon_analytic"] is None and 1 <= refs < 5
    assert teacher["caveats"] == [f"{refs} reference models of the 5 asked: the public pool "
                                  "holds no more disjoint sets of their rows"]
    assert {a["attack"] for a in teacher["attacks"]} == {"loss", "lira"}
    for a in teacher["attacks"]:
        assert 0.0 <= a["auc"] <= 1.0 and set(a["tpr_at_fpr"]) == {"0.001", "0.01"}
    # Nothing per record: no list longer than the targets', no canary row printed.
    assert max(len(x) for x in _lists(summary)) <= 4
    (records_file,) = (digits_run / "audit").glob("models-*-records.npz")
    (summary_file,) = (digits_run / "audit").glob("models-*.json")
    with np.load(records_file) as records:
        assert records["teacher_rows"].size == teacher["canaries"]
        assert records["teacher_lira_scores"].size == teacher["canaries"]
    assert json.loads(summary_file.read_text())["targets"] == summary["targets"]
    assert main(args) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and lines[1].startswith("teacher")
    assert lines[1].endswith(f"(but {refs} reference models of the 5 asked: the public pool "
                             "holds no more disjoint sets of their rows)")
    # a second audit, in the same second or not, keeps its own files beside the first's
    assert len(list((digits_run / "audit").glob("models-*.json"))) == 2
    assert lines[2].startswith("nonprivate")


def test_on_a_users_files_the_audit_says_it_has_no_reference_models(tmp_path: Path,
                                                                       digits) -> None:
    """A user's public pool has no labels the audit may read: reference models (asked for by
    default) cannot be trained, and one warning says so rather than a silent 0."""
    (pub_x, _), (test_x, test_y) = public_split(digits)
    np.savez(tmp_path / "private.npz", x=digits.train_x, y=digits.train_y)
    np.savez(tmp_path / "public.npz", x=pub_x)
    np.savez(tmp_path / "test.npz", x=test_x, y=test_y)
    source = DataFiles(str(tmp_path / "private.npz"), str(tmp_path / "public.npz"),
                       str(tmp_path / "test.npz"))
    run = tmp_path / "run"
    write_json_atomic(run / "teachers" / "manifest.json", {
        "dataset": "private", "data": source_record(source), "done": True,
        "num_teachers": TEACHERS, "in_shape": [1, 8, 8],
        "num_classes": 10, "model": "cnn", "shards": {},
        "train": asdict(TrainConfig(model="cnn", epochs=2, batch_size=8))}, private=True)
    with pytest.warns(UserWarning, match="no reference models: they learn from the public "
                                         "pool's labels"):
        audit = audit_models(run, ModelsAuditOptions(targets=("teacher",), teachers=2,
                                                     references=2, seed=1))
    assert [a.attack for a in audit.targets[0].attacks] == ["loss"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--control-canaries", "5000"], "private rows"),
    (["--teachers", "11"], "the run has 10 teachers"),
    (["--canary-fraction", "1.5"], "--canary-fraction must be in (0, 1), got 1.5"),
    (["--seed", "-1"], "--seed must be >= 0, got -1"),
    (["--references", "-1"], "--references must be >= 0, got -1"),
])
def test_cli_refuses_in_one_line(digits_run: Path, capsys: pytest.CaptureFixture,
                                 extra: list[str], message: str) -> None:
    assert main(["audit", "models", "--run", str(digits_run), *extra]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("pate: error:") and message in err and "\n" not in err
    assert not (digits_run / "audit").exists()


def test_cli_needs_trained_teachers(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main(["audit", "models", "--run", str(tmp_path / "none")]) == 2
    assert "none: no such run directory" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["audit", "models", "--run", str(tmp_path / "empty")]) == 2
    assert "no fully trained teachers" in capsys.readouterr().err


@pytest.mark.slow
def test_student_audit_on_a_real_run(tmp_path: Path) -> None:
    """``pate run digits-tiny`` then every target: the student's bound stays below its analytic
    epsilon, the teachers' canaries are the student's."""
    run = tmp_path / "run"
    done = subprocess.run([sys.executable, "-m", "pate", "run", "digits-tiny", "--run",
                           str(run)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    audit = subprocess.run(
        [sys.executable, "-m", "pate", "audit", "models", "--run", str(run), "--teachers", "3",
         "--nonprivate-rows", "200", "--nonprivate-canaries", "300", "--control-rows", "100",
         "--control-canaries", "300", "--control-epochs", "20", "--references", "1", "--json"],
        capture_output=True, text=True, timeout=900)
    assert audit.returncode == 0, audit.stderr[-3000:]
    targets = {t["target"]: t for t in json.loads(audit.stdout)["targets"]}
    assert set(targets) == {"teacher", "nonprivate", "student", "control"}
    student = targets["student"]
    metrics = json.loads((run / "student" / "metrics.json").read_text())
    assert student["epsilon_analytic"] == metrics["epsilon"]["data_independent"]
    assert student["epsilon_lower"] <= student["epsilon_analytic"]
    assert student["canaries"] == targets["teacher"]["canaries"]
    assert student["accuracy"] > 0.5
    (records_file,) = (run / "audit").glob("models-*-records.npz")
    with np.load(records_file) as records:
        assert np.array_equal(records["student_rows"], records["teacher_rows"])


def test_a_model_near_chance_passes_with_a_caveat() -> None:
    """A student retrained too briefly sits at chance: its bound says little of the run's own
    model, which the audit says beside its verdict."""
    from pate.audit.models import TargetAudit

    def audit(accuracy: float) -> TargetAudit:
        return TargetAudit("student", "", 10, 5, 100, 0, accuracy, 2.0, "data-independent",
                           [], 1.0, chance=0.1)

    assert audit(0.108).caveats == ["its accuracy 0.108 is near chance (0.100): a bound on it "
                                    "says little of the run's own model (train it longer)"]
    assert audit(0.9).caveats == []
    assert replace(audit(0.9), references_asked=0).caveats == []  # as many as asked: none
    control = TargetAudit("control", "", 10, 5, 100, 0, 0.008, None, None, [], 1.0, chance=0.1)
    assert control.caveats == []  # it learns mislabelled canaries: never the run's model
