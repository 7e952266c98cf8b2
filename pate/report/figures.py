"""The report's figures (PATE 2018, Figures 4 and 5; the privacy-utility curve; several runs'
trade-off), as matplotlib figures, and a figure as PNG bytes. Every figure but the students'
accuracy says in its title that it is private."""

from __future__ import annotations

import io
from typing import Any

import numpy as np
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from numpy.typing import NDArray

from analysis.cumulative import cumulative_cost
from analysis.mechanisms import ConfidentGNMax, GNMax, InteractiveGNMax, LNMax, Mechanism
from pate.report.run_data import RunData


def figure_epsilon_vs_answered(data: RunData) -> Figure:
    """Privacy cost against queries answered over the whole pool, for LNMax, GNMax and the run's
    Confident-GNMax (PATE 2018, Figure 4 / Figure 1 middle)."""
    first = next((s.mechanism for s in data.segments
                  if isinstance(s.mechanism, ConfidentGNMax | InteractiveGNMax)), None)
    gnmax = next((s.mechanism for s in data.segments if isinstance(s.mechanism, GNMax)), None)
    sigma = first.sigma2 if first is not None else gnmax.sigma if gnmax is not None else 40.0
    curves: list[tuple[str, Mechanism, str, str]] = [
        (f"LNMax, scale {data.lnmax_scale:g}", LNMax(data.lnmax_scale), "tab:red", "--"),
        (f"GNMax, σ = {sigma:g}", GNMax(sigma), "tab:orange", "-.")]
    if first is not None:
        curves.append((f"Confident-GNMax, T = {first.threshold:g}, σ1 = {first.sigma1:g}, "
                       f"σ2 = {first.sigma2:g}",
                       ConfidentGNMax(first.threshold, first.sigma1, first.sigma2),
                       "tab:green", "-"))
    run_mechanisms = [s.mechanism for s in data.segments]
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for label, mechanism, colour, style in curves:
        cost = cumulative_cost(data.votes, mechanism, data.delta)
        ours = mechanism in run_mechanisms
        label = f"{label}{'' if ours else ' (not run)'}"
        ax.plot(cost.answered, cost.epsilon_dependent, color=colour, ls=style, lw=2,
                label=f"{label}: data-dependent")
        if isinstance(mechanism, ConfidentGNMax):
            ax.plot(cost.answered, cost.epsilon_independent, color=colour, ls=":", lw=1.5,
                    label=f"{label}: data-independent, expected")
    ax.set_xlabel("Queries answered (expected, over the whole pool's votes)")
    ax.set_ylabel(f"Privacy cost ε at δ = {data.delta:g}")
    ax.set_title("Privacy cost against queries answered (private)")
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_plurality_histogram(data: RunData, rows: NDArray[np.int64],
                               answered: NDArray[np.bool_]) -> Figure:
    """Share of teachers agreeing with the plurality, for queries asked and answered
    (PATE 2018, Figure 5 left)."""
    teachers = data.votes[0].sum()
    agreement = 100.0 * data.votes[rows].max(axis=1) / teachers
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    # one bin per possible share where the teachers are few, else 25 of 4 %
    bins = ((np.arange(teachers + 2) - 0.5) * 100.0 / teachers if teachers <= 25
            else np.linspace(0, 100, 26))
    ax.hist(agreement, bins=bins, color="tab:blue", alpha=0.5, label=f"asked ({rows.size})")
    ax.hist(agreement[answered], bins=bins, color="tab:green", alpha=0.7,
            label=f"answered ({int(answered.sum())})")
    ax.set_xlabel("Teachers voting for the plurality class (%)")
    ax.set_ylabel("Number of queries")
    ax.set_title("Teacher consensus of asked and answered queries (private)")
    ax.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax.legend()
    fig.tight_layout()
    return fig


def figure_epsilon_split(data: RunData) -> Figure:
    """How epsilon splits between selecting queries (threshold step), answering them (GNMax)
    and the conversion's delta term, for each thresholded round (PATE 2018, Figure 5 right)."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    names, parts = [], []
    for i, s in enumerate(data.segments):
        cost = cumulative_cost(data.votes[s.rows], s.mechanism, data.delta, s.baseline)
        eps = float(cost.epsilon_dependent[-1])
        names.append(f"round {i + 1}\n{s.mechanism.title}")
        parts.append([eps * cost.split_selection, eps * cost.split_answering,
                      eps * cost.split_delta])
    values = np.array(parts).reshape(-1, 3)
    left = np.zeros(len(names))
    for k, (label, colour) in enumerate([("selection (threshold step)", "tab:blue"),
                                         ("answering (GNMax step)", "tab:green"),
                                         ("δ term of the conversion", "tab:gray")]):
        ax.barh(names, values[:, k], left=left, color=colour, label=label)
        left += values[:, k]
    ax.set_xlabel(f"Data-dependent ε at δ = {data.delta:g}, each round alone")
    ax.set_title("Data-dependent ε of each round, split (private)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_accuracy(report: dict[str, Any], teacher_acc: NDArray[np.float64] | None) -> Figure:
    """Teacher accuracy spread, and label / ensemble / student accuracy (DP-SGD's is the
    owner-only page's: it is a model of the private data without PATE)."""
    fig = Figure(figsize=(10, 4.2))
    left, right = fig.subplots(1, 2)
    if teacher_acc is not None:
        left.hist(teacher_acc, bins=20, color="tab:purple", alpha=0.8)
        left.axvline(float(teacher_acc.mean()), color="k", ls="--",
                     label=f"mean {teacher_acc.mean():.3f}")
        left.legend()
    left.set_xlabel("Teacher accuracy on the evaluation set")
    left.set_ylabel("Number of teachers")
    left.yaxis.set_major_locator(MaxNLocator(integer=True))
    left.set_title("Teacher accuracy spread (private)")
    bars = {"answered labels\n(pool)": report["queries"]["label_accuracy"],
            "ensemble plurality\n(pool, no noise)": report["ensemble"]["plurality_accuracy"],
            "student\n(evaluation)": (report["student"] or {}).get("accuracy")}
    bars = {k: v for k, v in bars.items() if v is not None}
    right.bar(list(bars), list(bars.values()), color="tab:cyan")
    for i, v in enumerate(bars.values()):
        right.text(i, v + 0.01, f"{v:.3f}", ha="center")
    right.set_ylim(0, 1.08)
    right.set_ylabel("Accuracy")
    right.set_title("Accuracies (private, except the student's)")
    fig.tight_layout()
    return fig


def figure_privacy_utility(points: dict[str, Any]) -> Figure:
    """Test accuracy against epsilon (delta of the run) for PATE students on prefixes of the
    answers (data-independent epsilon), the run's student at its sanitised epsilon too, and for
    DP-SGD."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    pate = sorted(points["pate"], key=lambda p: p["epsilon_data_independent"])
    if pate:
        ax.plot([p["epsilon_data_independent"] for p in pate], [p["accuracy"] for p in pate],
                "o-", color="tab:blue", label="PATE student (data-independent ε)")
        for p in pate:
            ax.annotate(f"{p['answered']} labels", (p["epsilon_data_independent"],
                                                    p["accuracy"]),
                        fontsize=7, xytext=(4, -10), textcoords="offset points")
    for p in points["pate_sanitised"]:
        ax.plot([p["epsilon"]], [p["accuracy"]], "*", ms=14, color="tab:blue",
                label="the PATE student (sanitised ε)")
    dpsgd = sorted(points["dpsgd"], key=lambda p: p["epsilon"])
    if dpsgd:
        ax.plot([p["epsilon"] for p in dpsgd], [p["accuracy"] for p in dpsgd], "s--",
                color="tab:red", label="DP-SGD (its accountant's ε)")
    ax.set_xlabel(f"ε at δ = {points['delta']:g}")
    ax.set_ylabel("Accuracy on the evaluation data")
    ax.set_title("Privacy-utility: PATE against DP-SGD (owner only)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def figure_tradeoff(rows: list[dict[str, Any]]) -> Figure:
    """Each row's accuracy against its epsilon (sanitised, else data-independent),
    named by its run and method: several runs compared."""
    fig = Figure(figsize=(6.4, 4.4))
    ax = fig.subplots()
    for row in rows:
        eps = row.get("epsilon_smooth_sensitivity") or row.get("epsilon_data_independent")
        if eps is not None and row.get("accuracy") is not None:
            ax.scatter(eps, row["accuracy"], s=50)
            ax.annotate(f"{row['run']}: {row['method']}", (eps, row["accuracy"]), fontsize=7,
                        xytext=(4, 4), textcoords="offset points")
    ax.set_xlabel("ε (smooth-sensitivity-sanitised, else data-independent)")
    ax.set_ylabel("Accuracy")
    ax.set_title("Privacy-utility trade-off across runs")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def figure_png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    return buf.getvalue()
