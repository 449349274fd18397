"""Figures across commits, machines and runs: a history's cases with their steps, the gate's
growth, the runs compared and each machine side by side.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402

from attnbench.analysis.changes import ChangeKind, Direction  # noqa: E402
from attnbench.analysis.growth import (  # noqa: E402
    EXPONENT_SUFFIX,
    EXPONENT_THRESHOLD,
    GROWTH_METRICS,
    exponent_text,
    fit_side,
)
from attnbench.analysis.text import fmt, ratio  # noqa: E402
from attnbench.contract import (  # noqa: E402
    LABELS,
    UNITS,
    Status,
)
from attnbench.report.style import (
    WRONG_COLOUR,
    colour,
    end_labels,
    family_palette,
    length_axis,
    measured_rows,
    unit_axis,
)

__all__ = [
    "IMPROVEMENT_COLOUR",
    "REGRESSION_COLOUR",
    "case_history",
    "comparison",
    "growth",
    "history",
    "machines",
]

REGRESSION_COLOUR, IMPROVEMENT_COLOUR = WRONG_COLOUR, "#1b5e20"


def history(frame: pd.DataFrame, metric: str = "time") -> plt.Figure | None:
    """Value per commit (ordered by commit date) for each variant at a few lengths."""
    df = measured_rows(frame, metric)
    df = df[(df["commit"] != "") & (df["seq_len"] == df["seq_len_k"])]
    if df["commit"].nunique() < 3:  # two commits: the comparison figure says more
        return None
    order = df.groupby("commit")["date"].min().sort_values().index.tolist()
    df["commit_short"] = df["commit"].str[:8]
    lengths = sorted(df["seq_len"].unique())
    pick = [n for n in lengths if n in (min(lengths), 1024, max(lengths))] or lengths[-1:]
    df = df[df["seq_len"].isin(pick)]
    palette = family_palette(df["variant"].unique().tolist())
    grid = sns.relplot(
        data=df,
        x="commit_short",
        y="value",
        hue="variant",
        col="seq_len",
        kind="line",
        marker="o",
        palette=palette,
        col_wrap=min(3, len(pick)),
        height=3.4,
        aspect=1.3,
        facet_kws={"sharey": False},
    )
    short = [c[:8] for c in order]
    for ax in grid.axes.flat:
        ax.set_xticks(range(len(short)))
        ax.set_xticklabels(short, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
        unit_axis(ax, "y", UNITS.get(metric, ""))
    grid.set_axis_labels("commit (oldest to newest)", LABELS.get(metric, metric))
    grid.figure.suptitle(f"{metric} history over commits", y=1.03)
    return grid.figure


def machines(frame: pd.DataFrame, metric: str = "time") -> plt.Figure | None:
    """Side by side per machine (e.g. a CPU box and a GPU box)."""
    df = measured_rows(frame, metric)
    if df["machine"].nunique() < 2:
        return None
    df = df[df["seq_len"] == df["seq_len_k"]]
    df = df.assign(where=df["machine"] + " / " + df["device"])
    grid = sns.relplot(
        data=df,
        x="seq_len",
        y="value",
        hue="variant",
        col="where",
        kind="line",
        marker="o",
        height=3.6,
        aspect=1.2,
        palette=family_palette(df["variant"].unique().tolist()),
    )
    grid.set(yscale="log", xlabel="sequence length L", ylabel=LABELS.get(metric, metric))
    for ax in grid.axes.flat:
        length_axis(ax, df["seq_len"].unique())
        unit_axis(ax, "y", UNITS.get(metric, ""))
    grid.figure.suptitle(f"{metric} by machine", y=1.03)
    return grid.figure


def comparison(ratios: pd.DataFrame, label_a: str, label_b: str) -> plt.Figure | None:
    """B / A time ratio vs L, one line per variant, log scale centred at 1x (below 1: B is faster).

    Args:
        ratios: rows with ``variant``, ``seq_len`` and ``ratio`` (B / A).
        label_a: what A is (a run, commit or machine), for the title.
        label_b: what B is.
    """
    if ratios is None or ratios.empty:
        return None
    fig, ax = plt.subplots(figsize=(10, 3.8))
    ends = {}
    for variant, s in ratios.groupby("variant"):
        s = s.sort_values("seq_len")
        ax.plot(s["seq_len"], s["ratio"], marker="o", ms=3, color=colour(variant))
        ends[variant] = (float(s["seq_len"].iloc[-1]), float(s["ratio"].iloc[-1]))
    ax.axhline(1.0, color="black", lw=1)
    ax.set_yscale("log")
    lo, hi = ratios["ratio"].min(), ratios["ratio"].max()
    half = max(abs(math.log10(lo)), abs(math.log10(hi)), math.log10(1.5)) * 1.15
    ax.set_ylim(10**-half, 10**half)
    ticks = [
        t * 10.0**e for e in range(-3, 4) for t in (1, 2, 5) if 10**-half <= t * 10.0**e <= 10**half
    ]
    ax.set_yticks(ticks, [fmt(t, "x") for t in ticks])
    ax.yaxis.set_minor_locator(matplotlib.ticker.NullLocator())
    length_axis(ax, ratios["seq_len"].unique())
    end_labels(ax, ends)
    ax.set_xlim(right=ratios["seq_len"].max() * 2.2)
    ax.set(xlabel="sequence length L", ylabel="time ratio B / A")
    ax.set_title(
        f"B = {label_b} vs A = {label_a}: time ratio per case (below 1x: B is faster)", fontsize=10
    )
    fig.tight_layout()
    return fig


def _history_values(ax, metric: str, rows: pd.DataFrame) -> None:
    """A metric's value at each commit (time: and the levels the rules saw); failures as crosses."""
    ok = rows[rows["status"] == Status.OK]
    ax.plot(ok["position"], ok["value"], "o", ms=3.5, color="#455a64", zorder=3)
    if metric == "time" and ok["level"].notna().any():
        ax.step(ok["position"], ok["level"], where="mid", color="#90a4ae", lw=1.2, zorder=2)
    else:
        ax.plot(ok["position"], ok["value"], "-", color="#90a4ae", lw=1, zorder=2)
    bad = rows[rows["status"].isin([Status.WRONG, Status.FAILED])]
    if len(bad) and len(ok):
        ax.plot(
            bad["position"],
            [ok["value"].median()] * len(bad),
            "x",
            color=WRONG_COLOUR,
            ms=7,
            mew=2,
            zorder=4,
        )


def _mark_changes(ax, metric: str, steps: pd.DataFrame) -> None:
    """Each change: a step a dashed line before its commit, a drift a band over its commits.

    Red for a regression, green for an improvement, labelled with its ratio or what went wrong."""
    for rec in steps.to_dict("records"):
        tone = REGRESSION_COLOUR if rec["direction"] == Direction.REGRESSION else IMPROVEMENT_COLOUR
        if rec["kind"] == ChangeKind.DRIFT:
            ax.axvspan(rec["first_pos"] - 0.5, rec["last_pos"] + 0.5, color=tone, alpha=0.15, lw=0)
        else:
            ax.axvline(rec["first_pos"] - 0.5, color=tone, lw=1.5, ls="--")
        label = (
            rec["kind"]
            if rec["kind"] in (ChangeKind.FAILED, ChangeKind.WRONG)
            else f"{rec['before']:.2f} -> {rec['after']:.2f}"
            if metric.endswith(EXPONENT_SUFFIX)
            else ratio(rec["ratio"], metric)
        )
        ax.annotate(
            label,
            (
                rec["last_pos"] + 0.5
                if rec["kind"] == ChangeKind.DRIFT
                else rec["first_pos"] - 0.5,
                1.0,
            ),
            xycoords=("data", "axes fraction"),
            ha="left",
            va="top",
            fontsize=8,
            color=tone,
        )


def _commit_axis(ax, commits: pd.DataFrame) -> None:
    """Short hashes along the x axis (at most about 30 of them), oldest first."""
    every = max(1, math.ceil(len(commits) / 30))
    ticks = commits["position"].tolist()[::every]
    ax.set_xticks(ticks)
    ax.set_xticklabels(
        [str(c)[:8] for c in commits["commit"].tolist()[::every]],
        rotation=60,
        ha="right",
        fontsize=7,
    )
    ax.set_xlim(-0.7, len(commits) - 0.3)
    ax.set_xlabel("commit (oldest to newest)")


def case_history(
    series: pd.DataFrame, steps: pd.DataFrame, commits: pd.DataFrame, title: str
) -> plt.Figure | None:
    """One case's metrics over a history's commits (a panel per metric), steps and drifts marked.

    Args:
        series: the case's rows of :attr:`attnbench.analysis.changes.History.series` (``position``,
            ``value``, ``level``: the level the step rules saw, drawn as a line for time).
        steps: the case's rows of ``History.steps``.
        commits: ``History.commits`` (position order; short hashes label the axis).
        title: the figure's title (the case).

    A step is a vertical line just before its commit, a drift a band over its commits: red for a
    regression, green for an improvement; a failure or a wrong result a red cross.
    """
    exact = GROWTH_METRICS
    metrics = [
        m
        for m in ("time", *exact, *(e + EXPONENT_SUFFIX for e in exact))  # a case without L
        if m in set(series["metric"])
    ]
    if not metrics or len(commits) < 2:
        return None
    fig, axes = plt.subplots(
        len(metrics), 1, figsize=(8, 1.7 * len(metrics) + 0.6), sharex=True, squeeze=False
    )
    for ax, metric in zip(axes[:, 0], metrics, strict=True):
        _history_values(ax, metric, series[series["metric"] == metric].sort_values("position"))
        _mark_changes(ax, metric, steps[steps["metric"] == metric])
        unit = UNITS.get(metric, "")
        name = metric.replace(EXPONENT_SUFFIX, "\nexponent of L")
        ax.set_ylabel(f"{name}\n({unit})" if unit else name, fontsize=8)
        if unit in ("s", "bytes"):
            ax.yaxis.set_major_formatter(plt.FuncFormatter(lambda v, _, u=unit: fmt(v, u)))
        if metric.endswith(EXPONENT_SUFFIX):  # noise far below the threshold draws flat
            low, high = ax.get_ylim()
            middle, half = (low + high) / 2, max((high - low) / 2, 2 * EXPONENT_THRESHOLD)
            ax.set_ylim(middle - half, middle + half)
            ax.ticklabel_format(axis="y", useOffset=False)
        ax.tick_params(axis="y", labelsize=7)
    _commit_axis(axes[-1, 0], commits)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    return fig


def growth(
    lengths: np.ndarray,
    base_values: np.ndarray,
    head_values: np.ndarray,
    at_length: int,
    metric: str,
    title: str,
) -> plt.Figure | None:
    """BASE and HEAD of one case's exact metric on log-log axes, each side's cost split extended
    to ``at_length`` and the ratio it predicts written there (None: a side cannot be fitted).

    The gate's measured lengths are short; what a change costs at the length users run is read off
    the two fitted lines (:mod:`attnbench.analysis.growth`), and the figure shows how far they were
    extended from the points they stand on.
    """
    base, head = fit_side(lengths, base_values), fit_side(lengths, head_values)
    if base is None or head is None:
        return None
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    line = np.geomspace(min(base.lengths[0], head.lengths[0]), at_length, 200)
    for side, fit, shade, marker in (
        ("BASE", base, "#1565c0", "o"),
        ("HEAD", head, REGRESSION_COLOUR, "s"),
    ):
        ax.plot(line, fit.at(line), "-", color=shade, lw=1.3, alpha=0.8)
        ax.plot(
            fit.lengths,
            fit.values,
            marker,
            color=shade,
            ms=6,
            label=f"{side} measured, fitted {exponent_text(fit.exponent)}",
        )
    ax.axvline(max(head.lengths), color="#90a4ae", lw=1, ls=":")
    ax.axvline(at_length, color="#455a64", lw=1, ls="--")
    predicted = head.at(at_length) / base.at(at_length)
    ax.annotate(
        f"predicted {ratio(predicted, metric)}\nat L={at_length}",
        (at_length, head.at(at_length)),
        xytext=(-8, 0),
        textcoords="offset points",
        ha="right",
        va="center",
        fontsize=9,
        color=REGRESSION_COLOUR,
    )
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    unit = UNITS.get(metric, "")
    ax.set_xlabel("sequence length L (dotted: the longest measured; dashed: the target)")
    ax.set_ylabel(f"{metric} ({unit})" if unit else metric)
    ax.legend(fontsize=8, loc="upper left")
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    return fig
