"""Inputs mode end to end (slow: trains a small ensemble with Ray): ``pate teachers train`` and
``pate teachers votes`` on scikit-learn's digits (and on a CSV), then ``pate serve --run DIR``
answers both pool indices and new images (rows) with the run's own teachers."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from service_harness import TOKENS, serving, write_tokens

from pate.service.client import LabelClient

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run = tmp_path_factory.mktemp("ensemble") / "run"
    for cmd in (["teachers", "train", "--run", str(run), "--dataset", "digits", "--teachers",
                 "5", "--epochs", "2", "--model", "mlp", "--shard-size", "5"],
                ["teachers", "votes", "--run", str(run)]):
        subprocess.run([sys.executable, "-m", "pate", *cmd], check=True, capture_output=True,
                       timeout=600)
    write_tokens(run.parent / "tokens.txt")
    return run


def test_serve_run_answers_indices_and_inputs(run_dir: Path) -> None:
    from teachers.votes import load_ensemble

    ensemble = load_ensemble(run_dir, "cpu")
    x = np.random.default_rng(0).uniform(0, 1, (40, *ensemble.in_shape)).astype(np.float32)
    votes = ensemble.vote(x)
    top2 = np.sort(votes, axis=1)[:, -2:]
    unique = top2[:, 1] > top2[:, 0]
    pool_votes = np.load(run_dir / "votes.npz")["votes"]
    args = ["--run", str(run_dir), "--mechanism", "gnmax", "--sigma", "1e-3",
            "--budget-epsilon", "1e15", "--delta", "1e-5",
            "--token-file", str(run_dir.parent / "tokens.txt")]
    with serving(args, run_dir) as server, LabelClient(server.url, TOKENS[0]) as client:
        assert "requests by indices and inputs" in server.banner
        got = client.labels(inputs=x).labels
        np.testing.assert_array_equal(got[unique], np.argmax(votes, axis=1)[unique])
        pool = client.labels(indices=np.arange(20)).labels
        pool_unique = np.sort(pool_votes[:20], axis=1)
        keep = pool_unique[:, -1] > pool_unique[:, -2]
        np.testing.assert_array_equal(pool[keep], np.argmax(pool_votes[:20], axis=1)[keep])
    assert (run_dir / "ledger.db").stat().st_mode & 0o777 == 0o600


def test_serve_run_answers_new_rows_of_a_table(tmp_path: Path) -> None:
    """A run on a CSV: new rows are sent as [n, d] (the run's feature width), not as images."""
    rng = np.random.default_rng(1)
    for role, n in (("private", 300), ("public", 60), ("test", 60)):
        x = rng.normal(size=(n, 3))
        y = np.where(x[:, 0] + x[:, 1] > 0, "yes", "no")
        rows = "".join(f"{a:.4f},{b:.4f},{c:.4f},{label}\n"
                       for (a, b, c), label in zip(x, y, strict=True))
        (tmp_path / f"{role}.csv").write_text("a,b,c,y\n" + rows)
    run = tmp_path / "run"
    data = [f"--{role}" for role in ("private", "public", "test")]
    data = [item for role in data for item in (role, str(tmp_path / f"{role[2:]}.csv"))]
    for cmd in (["teachers", "train", "--run", str(run), *data, "--label", "y", "--teachers",
                 "3", "--epochs", "2", "--shard-size", "3"],
                ["teachers", "votes", "--run", str(run)]):
        subprocess.run([sys.executable, "-m", "pate", *cmd], check=True, capture_output=True,
                       timeout=600)
    write_tokens(tmp_path / "tokens.txt")
    args = ["--run", str(run), "--mechanism", "gnmax", "--sigma", "1e-3", "--budget-epsilon",
            "1e15", "--delta", "1e-5", "--token-file", str(tmp_path / "tokens.txt")]
    with serving(args, run) as server, LabelClient(server.url, TOKENS[0]) as client:
        got = client.labels(inputs=rng.normal(size=(5, 3)).astype(np.float32)).labels
        assert len(got) == 5 and set(got) <= {-1, 0, 1}
