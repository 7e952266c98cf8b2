"""Read a run directory into ``analysis.report.RunData`` and write its report (DESIGN.md layout:
config.toml, votes.npz, labels.npz, teachers/manifest.json, student/metrics.json,
dpsgd/metrics.json -> report/)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from analysis.report import (
    RunData,
    Segment,
    build_report,
    comparison,
    run_sections,
    table_html,
    write_report,
)
from analysis.votes_analysis import AggregatorParams
from pate.config import RunConfig, parse_config
from pate.errors import UserError
from pate.io import ensure_dir, write_bytes_atomic


def _json(path: Path) -> dict[str, Any] | None:
    return json.loads(path.read_text()) if path.is_file() else None


def read_config(run_dir: Path) -> RunConfig:
    path = run_dir / "config.toml"
    if not path.is_file():
        raise UserError(f"{run_dir}: no config.toml; is this a run directory?")
    return parse_config(path.read_text(), str(path))


def round_params(config: RunConfig, round_number: int) -> AggregatorParams:
    """Round 1 is Confident-GNMax, round 2 Interactive-GNMax (PATE 2018, Alg. 1 and 2)."""
    a = config.aggregator
    return AggregatorParams("confident" if round_number == 1 else "interactive",
                            threshold=a.threshold, sigma1=a.sigma1, sigma2=a.sigma2)


def _pool_labels(config: RunConfig, pool_index: np.ndarray) -> np.ndarray | None:
    try:
        from pate.datasets import load_dataset, public_split

        ds = load_dataset(config.data.dataset, config.data.data_dir, need_train=False)
        (_, pool_y), _ = public_split(ds, config.data.pool_size)
    except UserError:
        return None
    return pool_y[pool_index]


def _teacher_accuracies(run_dir: Path) -> np.ndarray | None:
    manifest = _json(run_dir / "teachers" / "manifest.json") or {}
    values = (manifest.get("accuracy") or {}).get("per_teacher")
    return np.asarray(values, np.float64) if values else None


def load_run_data(run_dir: Path) -> RunData:
    config = read_config(run_dir)
    votes_path, labels_path = run_dir / "votes.npz", run_dir / "labels.npz"
    if not votes_path.is_file():
        raise UserError(f"{run_dir}: no votes.npz; run `pate teachers votes --run {run_dir}`")
    with np.load(votes_path) as f:
        votes, pool_index = f["votes"].astype(np.int64), f["pool_index"].astype(np.int64)
    segments: list[Segment] = []
    if labels_path.is_file():
        with np.load(labels_path) as f:
            asked, labels = f["pool_index"].astype(np.int64), f["label"].astype(np.int64)
            rounds = f["round"].astype(np.int64) if "round" in f.files else np.ones_like(asked)
            baseline = f["baseline"].astype(np.float64) if "baseline" in f.files else None
        row_of = np.full(int(pool_index.max()) + 1, -1)
        row_of[pool_index] = np.arange(pool_index.size)
        if np.any(asked > pool_index.max()) or np.any(row_of[asked] < 0):
            raise UserError(f"{labels_path}: asks for pool rows the votes do not cover")
        for r in np.unique(rounds):
            sel = rounds == r
            segments.append(Segment(row_of[asked[sel]], round_params(config, int(r)),
                                    labels[sel], None if r == 1 or baseline is None
                                    else baseline[sel]))
    return RunData(
        name=run_dir.resolve().name, dataset=config.data.dataset,
        delta=config.aggregator.delta, votes=votes,
        pool_labels=_pool_labels(config, pool_index), segments=segments,
        lnmax_scale=config.aggregator.lnmax_scale,
        teacher_accuracies=_teacher_accuracies(run_dir),
        student=_json(run_dir / "student" / "metrics.json"),
        dpsgd=_json(run_dir / "dpsgd" / "metrics.json"),
        non_private_baseline=config.report.non_private_baseline,
        extra={"config": json.loads(config.model_dump_json())})


def _private_writer(path: Path, data: bytes) -> None:
    ensure_dir(path.parent, private=True)
    write_bytes_atomic(path, data, private=True)


def write_run_report(run_dir: Path) -> Path:
    data = load_run_data(run_dir)
    report, figures = build_report(data)
    return write_report(report, figures, run_dir / "report",
                        f"PATE privacy-utility report: {data.name}", run_sections(report),
                        _private_writer)


def write_comparison(run_dirs: list[Path], out_dir: Path) -> Path:
    reports = []
    for run_dir in run_dirs:
        path = run_dir / "report" / "report.json"
        if not path.is_file():
            write_run_report(run_dir)
        reports.append(json.loads(path.read_text()))
    summary, figures = comparison(reports)
    sections = [("Runs compared", table_html(summary["table"], first_column="Run"))]
    return write_report(summary, figures, out_dir, "PATE runs compared", sections,
                        _private_writer)
