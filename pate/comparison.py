"""The owner-only evaluation of a run: what the PATE student is worth against the alternatives,
on the same evaluation data (``pate run``'s ``compare`` stage; docs/design.md).

- DP-SGD (``student.baseline``) at the same delta, trained to the student's releasable epsilons:
  the smooth-sensitivity-sanitised one and the data-independent one (the worst-case figure, of
  DP-SGD's own kind). Its hyperparameters are the ``[dpsgd]`` section's, fixed in advance
  (Tramèr & Boneh 2021's Fashion-MNIST setting by default), never tuned on the private data,
  which would cost privacy of its own.
- The teachers' architecture trained on all the private data without privacy
  (``teachers.nonprivate``).
- The teacher ensemble's plurality on the evaluation data (measured by the votes stage).
- Students trained like the run's on prefixes of its answers (``student.workflow.
  train_on_prefixes``): the privacy-utility curve's PATE points, which cost no new query.

Everything here is written to ``comparison/`` (0700, files 0600): a model trained on the private
data without PATE is not for publication, and neither is its accuracy.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pate.config import RunConfig
from pate.errors import UserError
from pate.progress import by_epoch, progress_bar
from pate.rundir import RunDir
from student.baseline import train_dpsgd_baseline
from student.dpsgd import DPSGDConfig
from student.encoded_dpsgd import EncodingConfig
from student.options import StudentOptions
from student.workflow import train_on_prefixes
from teachers.nonprivate import train_nonprivate

_DPSGD_CHOICE = ("fixed in advance (the [dpsgd] section of the run's config), not tuned on the "
                 "private data")


def student_epsilons(run: RunDir) -> dict[str, float | None]:
    """The student's published epsilons by name (``student/metrics.json``): the
    smooth-sensitivity-sanitised release, and the data-independent one the ledger charged."""
    metrics = run.read_json(run.student_metrics)
    if metrics is None:
        raise UserError(f"{run}: no student/metrics.json; train the student first")
    return {"sanitised": metrics["epsilon"].get("data_dependent_sanitised"),
            "data-independent": metrics["epsilon"].get("data_independent")}


def dpsgd_settings(config: RunConfig, target_epsilon: float
                   ) -> tuple[DPSGDConfig, EncodingConfig]:
    """The ``[dpsgd]`` section's DP-SGD, at the run's delta, calibrated to ``target_epsilon``,
    and its gradient encoding and denoising (plain DP-SGD by default)."""
    p = config.dpsgd
    try:
        return (DPSGDConfig(epochs=p.epochs, expected_batch_size=p.batch_size, lr=p.lr,
                            momentum=p.momentum, max_grad_norm=p.max_grad_norm,
                            target_epsilon=target_epsilon, delta=config.aggregator.delta,
                            model=p.model),
                EncodingConfig(noise=p.noise, dof=p.dof, encode=p.encode,
                               encode_seed=p.encode_seed, denoise=p.denoise))
    except ValueError as exc:
        raise UserError(f"[dpsgd]: {exc}") from None


def run_comparison(config: RunConfig, run: RunDir, options: StudentOptions,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """Train and measure every model of the owner-only evaluation; returns the record written
    to ``comparison/metrics.json`` (private). ``options`` are the run's student's."""
    c = config.compare
    source = config.data.source()
    epsilons = student_epsilons(run)
    run.private_dir(run.comparison)
    dpsgd: list[dict[str, Any]] = []
    for name in c.dpsgd_at:
        target = epsilons[name]
        if target is None:
            dpsgd.append({"at": name, "skipped": f"the run has no {name} epsilon"})
            continue
        say(f"DP-SGD to the student's {name} epsilon {target:.3f}")
        settings, encoding = dpsgd_settings(config, target)
        with progress_bar(f"DP-SGD at epsilon {target:.3f}", settings.epochs, "epoch") as bar:
            metrics = train_dpsgd_baseline(run, settings, source,
                                           by_epoch(bar, settings.epochs),
                                           out=run.comparison_dpsgd(name), encoding=encoding)
        p = config.dpsgd
        dpsgd.append({"at": name, "target_epsilon": target,
                      "model": metrics["config"]["model"],
                      "epochs": p.epochs,
                      "batch_size": p.batch_size, "lr": p.lr, "momentum": p.momentum,
                      "noise": p.noise, "encode": p.encode, "denoise": p.denoise,
                      **{k: metrics[k] for k in (
                          "accuracy", "epsilon", "delta", "steps", "noise_multiplier",
                          "sampling_rate", "max_grad_norm", "train_seconds")}})
    say(f"the teachers' architecture on all the private data ({c.nonprivate_epochs} epochs)")
    nonprivate = train_nonprivate(run.root, c.nonprivate_epochs, c.nonprivate_batch_size,
                                  config.teachers.device)
    prefixes = train_on_prefixes(run, options, source, c.prefixes, say)
    record = {"student_epsilon": epsilons, "dpsgd": dpsgd, "dpsgd_hyperparameters": _DPSGD_CHOICE,
              "nonprivate": nonprivate, "prefixes": prefixes}
    run.write_json(run.comparison_metrics, record, private=True)
    return record
