"""Figures from the tidy frame (figures only: no I/O, no HTML).

Every function returns a matplotlib Figure, or None when the frame holds nothing to draw.

Colours: one hue per family of variants (:data:`FAMILIES`), shades within it, so a variant has the
same colour in every figure, the headline's included. Lines are labelled at their right end instead
of in a legend. Only ``ok`` rows are drawn as lines; a case that failed the correctness gate
(``wrong``) is a red cross, a shape no variant's points take, and a disturbed measurement
(``noisy``) a hollow marker: neither is ever part of a line or a fit.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

from attnbench.analysis.complexity import FitVerdict, swept  # noqa: E402
from attnbench.analysis.text import fmt, sig  # noqa: E402
from attnbench.contract import (  # noqa: E402
    FAMILIES,
    LABELS,
    OTHER_FAMILY,
    PROGRESSION,
    UNITS,
    Method,
    Status,
    family,
)
from attnbench.report.style import (
    LABEL_POINTS,
    SHAPE_TAGS,
    WRONG_COLOUR,
    WRONG_MARKER,
    colour,
    draw_guides,
    end_labels,
    facet_axes,
    family_palette,
    length_axis,
    measured_rows,
    series,
    spread_bars,
    unit_axis,
    variant_markers,
    variant_names,
)

__all__ = [
    "PROGRESSION_TITLE",
    "WORKLOAD_MARKERS",
    "crossover_matrix",
    "draws_model",
    "error_vs_time",
    "gflops",
    "heatmaps",
    "prefill_vs_decode",
    "progression",
    "roofline",
    "scaling",
    "scaling_panels",
    "show_heatmaps",
    "speedup_heatmap",
]

if TYPE_CHECKING:
    from attnbench.demos import Heatmaps


def _scaling_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """``metric``'s median and spread per device, mode, family, series and L (ok, Lq = Lk, > 0)."""
    df = measured_rows(frame, metric)
    # a log axis shows no zero (0 GFLOP/s of a failed case)
    df = df[(df["seq_len"] == df["seq_len_k"]) & (df["value"] > 0)]
    if df.empty:
        return df
    df = df.assign(family=[family(v) for v in df["variant"]], variant=series(df))
    df = df.groupby(["device", "mode", "family", "variant", "seq_len"], as_index=False)[
        ["value", "spread"]
    ].median()
    df["where"] = df["device"] + " " + df["mode"]
    return df


def _scaling_panel(
    ax, df: pd.DataFrame, sub: pd.DataFrame, unit: str, guides: bool, title: str
) -> None:
    """One panel of :func:`scaling` (``df``: every panel's rows, for the shared axes)."""
    positive = df["value"][df["value"] > 0]
    if len(positive):  # the data set the range; guides beyond it are clipped
        ax.set_ylim(positive.min() / 2, positive.max() * 2)
    length_axis(ax, df["seq_len"].unique())
    # room for the line-end labels
    ax.set_xlim(df["seq_len"].min() / 1.3, df["seq_len"].max() * 4.5)
    ax.tick_params(labelbottom=True)
    unit_axis(ax, "y", unit)
    ax.set_xlabel("sequence length L")
    if sub.empty:
        return
    ends = {}
    if guides:
        lengths = sub["seq_len"].to_numpy(float)
        ends = draw_guides(ax, lengths, sub[sub["seq_len"] == lengths.min()]["value"].median())
        if len(positive):
            ax.set_ylim(positive.min() / 2, positive.max() * 2)
    for variant, s in sub.groupby("variant"):
        s = s.sort_values("seq_len")
        spread_bars(ax, s["seq_len"], s["value"], s["spread"], colour(variant))
        ends[variant] = (float(s["seq_len"].iloc[-1]), float(s["value"].iloc[-1]))
    end_labels(ax, ends)
    ax.set_title(title, fontsize=10)


_ODD_MARKERS = (
    (Status.WRONG, {"marker": WRONG_MARKER, "s": 60, "color": WRONG_COLOUR}),
    (Status.NOISY, {"marker": "o", "s": 40, "facecolors": "none", "linewidths": 1.2}),
)
"""How :func:`scaling` marks no-fact points: wrong ones red crosses, noisy ones hollow circles."""


def _mark_odd(
    frame: pd.DataFrame, metric: str, axes: dict, row: str | None, col: str | None
) -> None:
    """Mark ``metric``'s wrong and noisy points on their panels of ``axes``, never in a line."""
    for status, style in _ODD_MARKERS:
        odd = frame[
            (frame["metric"] == metric) & (frame["status"] == status) & (frame["value"] > 0)
        ]
        if not len(odd):
            continue
        odd = odd.assign(
            family=[family(v) for v in odd["variant"]], where=odd["device"] + " " + odd["mode"]
        )
        for rec in odd.to_dict("records"):
            ax = axes.get((rec["where"] if row else None, rec["family"] if col else None))
            if ax is None:
                continue
            # hollow, in its variant's colour: many in a crowded panel, so no text
            if status == Status.NOISY:
                ax.scatter(
                    [int(rec["seq_len"])],
                    [rec["value"]],
                    zorder=5,
                    label=status,
                    edgecolors=[colour(rec["variant"])],
                    **style,
                )
            else:
                ax.scatter([int(rec["seq_len"])], [rec["value"]], zorder=5, label=status, **style)
                ax.annotate(
                    f"{rec['variant']} {status}",
                    (int(rec["seq_len"]), rec["value"]),
                    fontsize=7,
                    color=WRONG_COLOUR,
                    xytext=(4, -8),
                    textcoords="offset points",
                )


def _facets(df: pd.DataFrame) -> tuple[list[str], list[str]]:
    """The families and the device-mode pairs of :func:`_scaling_rows`' ``df``, in drawing order."""
    families = [f for f in [*FAMILIES, OTHER_FAMILY] if f in set(df["family"])]
    return families, list(df["where"].unique())


def scaling_panels(frame: pd.DataFrame, metric: str) -> str:
    """The panels :func:`scaling` draws for ``metric``, in words for its caption ("" for none).

    Read from the rows that decide the panels, so the caption names the ones drawn: a fixed list
    of every family named panels a run never had."""
    df = _scaling_rows(frame, metric)
    if df.empty:
        return ""
    families, wheres = _facets(df)
    named = [
        f"{f} (variants no family lists, such as plugins)" if f == OTHER_FAMILY else f
        for f in families
    ]
    words = (
        f"one panel per family: {', '.join(named)}"
        if len(named) > 1
        else f"one panel: the {named[0]} family"
    )
    if len(wheres) > 1:
        words += f"; one row per device and mode: {', '.join(wheres)}"
    return words


def scaling(
    frame: pd.DataFrame, metric: str, guides: bool = True, title: str | None = None
) -> plt.Figure | None:
    """Metric vs sequence length on log-log axes: one panel per family, one line per variant.

    Lines are labelled at their right end. Predicted values (method "model") are their own dashed
    series, "<variant> (model)"; cases that failed the correctness gate (status "wrong") are red
    crosses (named) and disturbed ones (status "noisy") hollow circles in their variant's colour,
    never part of a line. Where a point's timing blocks spread, a bar shows their interquartile
    range.
    """
    df = _scaling_rows(frame, metric)
    if df.empty:
        return None
    families, wheres = _facets(df)
    row = "where" if len(wheres) > 1 else None
    col = "family" if len(families) > 1 else None
    palette = family_palette(df["variant"].unique().tolist())
    grid = sns.relplot(
        data=df,
        x="seq_len",
        y="value",
        hue="variant",
        style="variant",
        kind="line",
        markers=variant_markers(list(palette)),
        dashes={v: (1, 2) if v.endswith(" (model)") else "" for v in palette},
        style_order=list(palette),
        col=col,
        row=row,
        height=3.3,
        aspect=1.25,
        palette=palette,
        hue_order=list(palette),
        legend=False,
        col_order=families if col else None,
        row_order=wheres if row else None,
        col_wrap=3 if col and not row else None,
        facet_kws={"sharey": True, "sharex": True},
    )
    grid.set(yscale="log")
    axes = facet_axes(grid, row, col)
    for (rv, cv), ax in axes.items():
        keep = pd.Series(True, index=df.index)
        keep &= (df["where"] == rv) if row else True
        keep &= (df["family"] == cv) if col else True
        panel_title = f"{cv or ''}{' / ' if cv and rv else ''}{rv or ''}"
        _scaling_panel(ax, df, df[keep], UNITS.get(metric, ""), guides, panel_title)
    grid.set_ylabels(LABELS.get(metric, metric))
    _mark_odd(frame, metric, axes, row, col)
    # every panel has its tick labels: rows are spaced so titles never sit on them
    grid.tight_layout()
    grid.figure.suptitle(
        title or f"{LABELS.get(metric, metric)} vs sequence length, by family", y=1.02
    )
    return grid.figure


def _fit_record(
    fits: pd.DataFrame | None, variant: str, metric: str, workload: str = "prefill"
) -> dict | None:
    """The fit of ``variant``'s ``metric`` on ``workload`` (None: nothing fitted)."""
    if fits is None or fits.empty:
        return None
    sub = fits[(fits["variant"] == variant) & (fits["metric"] == metric)]
    if "workload" in sub:
        sub = sub[sub["workload"].fillna("prefill") == workload]
    return None if sub.empty else sub.iloc[0].to_dict()


def _fit_label(
    fits: pd.DataFrame | None, variant: str, metric: str, workload: str = "prefill"
) -> str:
    """A fit's label for ``workload``: "L^2.01", "slope inconclusive", "model" or ""."""
    rec = _fit_record(fits, variant, metric, workload)
    if rec is None:
        return ""
    if rec.get("method") == Method.MODEL:
        return "model"
    if not rec.get("conclusive", False) or not math.isfinite(rec["exponent"]):
        return "slope inconclusive"
    return f"{'Lk' if workload == 'decode' else 'L'}^{rec['exponent']:.2f}"


def _time_label(fits: pd.DataFrame | None, variant: str) -> str:
    """A time line's end label: its time slope and, where counted, its instruction-count slope."""
    parts = []
    for metric, source in (("time", "time"), ("instructions", "counts")):
        label = _fit_label(fits, variant, metric)
        if label:
            parts.append(f"{label} ({source})" if label.startswith("L") else f"{source}: {label}")
    return ", ".join(parts)


def _mark_crossover(
    ax, fits: pd.DataFrame | None, variant: str, s: pd.Series, shade: tuple
) -> None:
    """Mark L*, where the L² term overtakes the L term, on the variant's line when it falls inside.

    Read from the instruction counts' cost split when counted (they do not move with the machine),
    else from time's; only for a fit that is conclusive and shallower than declared (what L*
    explains).
    """
    for metric in ("instructions", "time"):
        rec = _fit_record(fits, variant, metric)
        if (
            rec is not None
            and rec.get("verdict") == FitVerdict.SHALLOWER
            and math.isfinite(rec.get("crossover_L", math.nan))
        ):
            break
    else:
        return
    star = float(rec["crossover_L"])
    if not s.index.min() <= star <= s.index.max():
        return
    y = float(
        np.exp(
            np.interp(
                np.log(star), np.log(s.index.to_numpy(float)), np.log(s["value"].to_numpy(float))
            )
        )
    )
    ax.plot([star], [y], marker="v", ms=7, color=shade, mec="black", mew=0.6, zorder=5)
    ax.annotate(
        f"L*≈{star:,.0f}",
        xy=(star, y),
        xytext=(0, 9),
        textcoords="offset points",
        ha="center",
        fontsize=LABEL_POINTS,
        color=shade,
    )


def _series_fits(
    fits: pd.DataFrame | None, df: pd.DataFrame, rows: pd.DataFrame
) -> pd.DataFrame | None:
    """The fits of one series of ``df``: its pass, and the shape values that name it (a mask)."""
    if fits is None or fits.empty:
        return fits
    keep = pd.Series(True, index=fits.index)
    for col in ("mode", *(c for c, _ in SHAPE_TAGS)):
        if col in fits and col in rows and (col == "mode" or df[col].nunique() > 1):
            keep &= fits[col].astype(str) == str(rows[col].iloc[0])
    return fits[keep]


def _progression_panel(
    ax,
    metric: str,
    df: pd.DataFrame,
    fits: pd.DataFrame | None,
    shades: dict[str, tuple],
    lengths: list[int],
) -> None:
    """One panel of :func:`progression`: a line per series of ``df``, labelled with its slope.

    The lines follow the order of ``shades`` (variant -> its colour, the page's); each has its
    variant's shape (a family's shades are near: the progression is four dense variants and sdpa)
    and is labelled at its end with its fitted slope.
    """
    shapes = variant_markers(list(shades))
    ends, text, colours, dotted = {}, {}, {}, False
    df = df.assign(series=series(df, model=False))
    order = [s for v in shades for s in sorted(set(df.loc[df["variant"] == v, "series"]))]
    for name in order:
        rows = df[df["series"] == name]
        variant, model = rows["variant"].iloc[0], (rows["method"] == Method.MODEL).all()
        s = rows.groupby("seq_len")[["value", "spread"]].median()
        shade = shades.get(variant) or colour(variant)
        ax.plot(
            s.index,
            s["value"],
            marker=shapes.get(variant, "o"),
            ms=4,
            lw=2,
            color=shade,
            ls=":" if model else "-",
        )
        spread_bars(ax, s.index.to_series(), s["value"], s["spread"], shade)
        colours[name], dotted = shade, dotted or model
        ends[name] = (float(s.index[-1]), float(s["value"].iloc[-1]))
        own = _series_fits(fits, df, rows)  # fits are per variant of one shape
        label = _time_label(own, variant) if metric == "time" else _fit_label(own, variant, metric)
        if metric == "time":
            _mark_crossover(ax, own, variant, s, shade)
        text[name] = f"{name}  {label}" if label else name
    ax.set_yscale("log")
    length_axis(ax, lengths)
    unit_axis(ax, "y", UNITS.get(metric, ""))
    end_labels(ax, ends, text, colours)
    ax.set_xlim(right=max(lengths) * 2.6 if lengths else None)
    ax.set(xlabel="sequence length L", ylabel=LABELS[metric])
    title = "time per call" if metric == "time" else "peak tensor memory"
    # "dotted" only where a dotted line is drawn: a legend of nothing misleads
    ax.set_title(title + (" (dotted: model, not measured)" if dotted else ""), fontsize=11)


def draws_model(frame: pd.DataFrame, variants: tuple[str, ...] | None = None) -> bool:
    """Whether a memory figure of ``frame`` (of ``variants``; all: None) draws a predicted
    ("model") series, dotted: only then may its caption say what the dotted lines are."""
    rows = measured_rows(frame, "peak_tensor_bytes")
    rows = rows[(rows["seq_len"] == rows["seq_len_k"]) & (rows["method"] == Method.MODEL)]
    return bool(len(rows) if variants is None else rows["variant"].isin(variants).any())


PROGRESSION_TITLE = (
    "From the Python loop to fused SDPA: time and memory vs L (log-log, fitted slopes at line "
    "ends; ▼ L*: the L² term overtakes the L term)"
)
"""The headline's title when it draws the teaching progression alone."""


def _empty_reason(frame: pd.DataFrame, metric: str, variants: tuple[str, ...]) -> str:
    """Why a headline panel has nothing to draw, in words: what became of its cases."""
    rows = frame[(frame["metric"] == metric) & frame["variant"].isin(variants)]
    what = "time" if metric == "time" else "memory"
    if not len(rows):
        return f"No {what} was measured for these variants."
    counts = rows["status"].value_counts()
    listed = " or ".join(f"{k} ({n})" for k, n in counts.items())
    why = (
        "\nA busy machine disturbed every timing: bytes and counts are still exact."
        if Status.NOISY in counts.index
        else ""
    )
    return (
        f"Nothing to draw: every {what} case was {listed}.{why}\n"
        "See Details: Skipped, failed and noisy cases, and the fit table."
    )


def _say_empty(ax, reason: str, title: str) -> None:
    """Write ``reason`` inside an empty panel, in place of axes that would show nothing."""
    ax.set_xticks([])
    ax.set_yticks([])
    ax.text(0.5, 0.5, reason, transform=ax.transAxes, ha="center", va="center", fontsize=10)
    ax.set_title(title, fontsize=11)


def progression(
    frame: pd.DataFrame,
    fits: pd.DataFrame | None = None,
    variants: tuple[str, ...] = PROGRESSION,
    title: str = PROGRESSION_TITLE,
) -> plt.Figure | None:
    """The headline: ``variants`` (the teaching progression, or a run's own) vs L.

    Two log-log panels; each line is labelled at its end with its variant's name and its fitted
    slope ("L^2.01") when the fit is conclusive, "slope inconclusive" when not, "model" for
    predicted memory (dotted). A time line carries its instruction-count slope too where counted
    (counts decide where time cannot), and a triangle at L* where a shallower-than-declared slope's
    L² term overtakes its L term. A panel with nothing to draw says why inside it.
    """
    panels = []
    for metric in ("time", "peak_tensor_bytes"):
        df = measured_rows(frame, metric)
        df = df[(df["seq_len"] == df["seq_len_k"]) & df["variant"].isin(variants)]
        if "mode" in df and (df["mode"] == "forward").any():
            df = df[df["mode"] == "forward"]
        panels.append((metric, df))
    if all(df.empty for _, df in panels):
        return None
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.3))
    lengths = sorted({int(n) for _, df in panels for n in df["seq_len"]})
    drawn = [v for v in variants if any((df["variant"] == v).any() for _, df in panels)]
    # the colour each variant has on every other figure of the page, in the order given
    shades = {v: colour(v) for v in drawn}
    for ax, (metric, df) in zip(axes, panels, strict=True):
        if df.empty:
            _say_empty(
                ax,
                _empty_reason(frame, metric, variants),
                "time per call" if metric == "time" else "peak tensor memory",
            )
            continue
        _progression_panel(ax, metric, df, fits, shades, lengths)
    fig.suptitle(title, fontsize=12)
    fig.tight_layout()
    return fig


def gflops(frame: pd.DataFrame) -> plt.Figure | None:
    """Achieved GFLOP/s vs L, with the machine's matmul peak as a horizontal line."""
    peak = frame["peak_gflops"].dropna()
    fig = scaling(
        frame,
        "gflops",
        guides=False,
        title="achieved GFLOP/s vs sequence length"
        + (" (dotted: matmul peak)" if len(peak) else ""),
    )
    if fig is None:
        return None
    if len(peak):
        for ax in fig.axes:
            if ax.get_label() == "<colorbar>":
                continue
            ax.axhline(float(peak.median()), ls=":", color="black", lw=1)
            lo, hi = ax.get_ylim()
            ax.set_ylim(lo, max(hi, float(peak.median()) * 2))  # the peak line stays in view
    return fig


WORKLOAD_MARKERS = {"prefill": "o", "decode": "^"}  # the roofline's point shapes


def _roofs(ax, peak: float, bw: float, lo: float, hi: float, dtype: str) -> None:
    """The compute roof and, with a recorded bandwidth, the slanted bandwidth roof and the ridge.

    Each is labelled with its measured value, over intensities ``lo`` to ``hi``."""
    x = np.geomspace(lo, hi, 200)
    if bw > 0:
        ridge = peak / bw
        ax.plot(x, np.minimum(peak, x * bw), color="black", lw=1.6, zorder=1)
        ax.annotate(
            f"bandwidth roof (slanted): triad {fmt(bw, 'GB/s')}",
            (lo * 1.15, peak * 1.25),
            fontsize=8,
            va="bottom",
        )  # above the roofs' height, where nothing is drawn
        ax.axvline(ridge, color="0.7", ls=":", lw=0.8, zorder=0)
        ax.annotate(
            f"ridge {sig(ridge)} FLOP/byte",
            (ridge, peak),
            fontsize=7.5,
            color="0.4",
            xytext=(3, -12),
            textcoords="offset points",
        )
    else:
        ax.axhline(peak, color="black", lw=1.6, zorder=1)
    ax.annotate(
        f"compute roof: {dtype} matmul {fmt(peak, 'GFLOP/s')}",
        (hi / 1.2, peak),
        fontsize=8,
        ha="right",
        xytext=(0, 4),
        textcoords="offset points",
    )


def _roofline_points(ax, sub: pd.DataFrame) -> None:
    """A point per case (family colour, workload shape), a label per workload with its lengths."""
    for (variant, workload), pts in sub.groupby(["variant", "workload"], sort=True):
        ax.scatter(
            pts["ai"],
            pts["gflops"],
            color=colour(variant),
            marker=WORKLOAD_MARKERS.get(workload, "s"),
            s=34,
            edgecolors="0.2",
            linewidths=0.4,
            zorder=3,
        )
    for workload, pts in sub.groupby("workload"):  # name each cluster with the lengths it spans
        length = pts["seq_len"] if workload == "prefill" else pts["seq_len_k"]
        what = "L" if workload == "prefill" else "Lk"
        ax.annotate(
            f"{workload}, {what} {int(length.min())}-{int(length.max())}",
            (float(pts["ai"].min()), float(pts["gflops"].min())),
            fontsize=7.5,
            color="0.3",
            xytext=(0, -14),
            textcoords="offset points",
        )


def _roofline_panel(ax, machine: str, device: str, dtype: str, sub: pd.DataFrame) -> None:
    """One machine's, device's and dtype's panel of :func:`roofline`."""
    peak, bw = float(sub["peak_gflops"].median()), float(sub["peak_gbps"].median())
    lo = min(float(sub["ai"].min()), peak / bw if bw > 0 else math.inf) / 3
    hi = max(float(sub["ai"].max()), peak / bw if bw > 0 else 0) * 3
    _roofs(ax, peak, bw, lo, hi, dtype)
    _roofline_points(ax, sub)
    ax.set(
        xscale="log",
        yscale="log",
        xlim=(lo, hi),
        xlabel="arithmetic intensity (FLOP per byte moved by an ideal kernel)",
        ylabel="achieved GFLOP/s",
    )
    top = max(peak, float(sub["gflops"].max()))
    ax.set_ylim(float(sub["gflops"].min()) / 3, top * 2.5)
    ax.set_title(
        f"{machine} / {device}" + ("" if bw > 0 else " (bandwidth not recorded)"), fontsize=10
    )


def _roofline_legend(ax, df: pd.DataFrame) -> None:
    """The legend of :func:`roofline`: the workloads' shapes and every drawn variant by name, in its
    colour (a family's shades are too close to tell its variants' dots apart without names)."""
    handles = [
        plt.Line2D([], [], ls="", marker=m, color="0.35", label=w)
        for w, m in WORKLOAD_MARKERS.items()
        if w in set(df["workload"])
    ]
    drawn = set(df["variant"])
    order = [v for v in variant_names() if v in drawn] + sorted(drawn - set(variant_names()))
    handles += [
        plt.Line2D([], [], ls="", marker="o", color=colour(v), mec="0.2", mew=0.4, label=v)
        for v in order
    ]
    ax.legend(
        handles=handles,
        fontsize=7.5,
        loc="upper left",
        bbox_to_anchor=(1.01, 1.0),
        ncol=1 if len(handles) <= 14 else 2,
        title="shape: workload\ncolour: variant",
        title_fontsize=7.5,
        borderaxespad=0.0,
    )


def roofline(table: pd.DataFrame) -> plt.Figure | None:
    """Arithmetic intensity vs achieved GFLOP/s (log-log) under the roofs measured on its machine.

    One panel per (machine, device, dtype) with a recorded matmul peak (at most 3). The compute roof
    is the matmul peak (horizontal), the bandwidth roof ``AI x triad bandwidth`` (slanted; absent
    when the run recorded no bandwidth), both labelled with their measured values; they meet at the
    ridge. Points: one per case, in the variant's colour (named in the legend), shaped by workload
    (prefill: circles, decode: triangles).

    Args:
        table: :func:`attnbench.analysis.roofline.roofline` (only rows with an intensity are drawn).
    """
    if table is None or table.empty:
        return None
    df = table[
        table["ai"].notna()
        & (table["ai"] > 0)
        & (table["gflops"] > 0)
        & table["peak_gflops"].notna()
    ]
    if df.empty:
        return None
    groups = list(df.groupby(["machine", "device", "dtype"], sort=True))[:3]
    fig, axes = plt.subplots(
        1, len(groups), figsize=(7.2 * len(groups) if len(groups) > 1 else 10, 4.6), squeeze=False
    )
    for ax, ((machine, device, dtype), sub) in zip(axes[0], groups, strict=True):
        _roofline_panel(ax, machine, device, dtype, sub)
    _roofline_legend(axes[0][-1], df)
    fig.suptitle(
        "Roofline: every case under the measured compute and bandwidth roofs of its machine",
        fontsize=11,
    )
    fig.tight_layout()
    return fig


def prefill_vs_decode(frame: pd.DataFrame, fits: pd.DataFrame | None = None) -> plt.Figure | None:
    """Time per generated token vs context length (decode, O(L)) beside prefill's time vs L (O(L²)).

    Two log-log panels over the variants that ran both workloads (else every variant of each);
    each line's end says its fitted slope ("L^1.01") when the fit is conclusive, as the headline
    figure does. Decode time is per call of one query row: the time to generate one token.
    """
    df = measured_rows(frame, "time")
    if "method" in df:
        df = df[df["method"] != Method.MODEL]
    if df.empty or "workload" not in df or not (df["workload"] == "decode").any():
        return None
    df = swept(df)
    df = df[(df["workload"] == "prefill") | (df["seq_len"] == 1)]
    if (df["mode"] == "forward").any():
        df = df[df["mode"] == "forward"]
    both = set(df.loc[df["workload"] == "decode", "variant"]) & set(
        df.loc[df["workload"] == "prefill", "variant"]
    )
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.3))
    for ax, workload in zip(axes, ("decode", "prefill"), strict=True):
        sub = df[df["workload"] == workload]
        if both:
            sub = sub[sub["variant"].isin(both)]
        ends, text = {}, {}
        for variant in [v for v in variant_names() if v in set(sub["variant"])] + sorted(
            set(sub["variant"]) - set(variant_names())
        ):
            s = sub[sub["variant"] == variant].groupby("length")["value"].median()
            ax.plot(
                s.index,
                s.values,
                marker="^" if workload == "decode" else "o",
                ms=4,
                lw=2,
                color=colour(variant),
            )
            ends[variant] = (float(s.index[-1]), float(s.values[-1]))
            label = _fit_label(fits, variant, "time", workload)
            text[variant] = f"{variant}  {label}" if label else variant
        ax.set_yscale("log")
        if len(sub):
            length_axis(ax, sub["length"].unique())
            ax.set_xlim(sub["length"].min() / 1.3, sub["length"].max() * 3.2)
        unit_axis(ax, "y", "s")
        end_labels(ax, ends, text)
        if workload == "decode":
            ax.set(
                xlabel="context length Lk (KV cache), one query", ylabel="time per generated token"
            )
            ax.set_title("decode: one token over a KV cache of Lk (declared O(L))", fontsize=11)
        else:
            ax.set(xlabel="sequence length L = Lq = Lk", ylabel="time per call")
            ax.set_title("prefill: the whole prompt at once (declared O(L²))", fontsize=11)
    fig.suptitle("Prefill vs decode: time vs length, fitted slopes at line ends", fontsize=12)
    fig.tight_layout()
    return fig


def _crossover_cells(
    cross: pd.DataFrame, rows: list[str], cols: list[str]
) -> tuple[np.ndarray, list[list[str]]]:
    """Each (variant, baseline) cell's ratio at the longest common L (NaN: none) and its text."""
    ratio = np.full((len(rows), len(cols)), np.nan)
    text = [["" for _ in cols] for _ in rows]
    for rec in cross.to_dict("records"):
        i, j = rows.index(rec["variant"]), cols.index(rec["baseline"])
        ratio[i, j] = rec["ratio_at_longest"]
        crossing = rec["crossover_L"]
        where = crossing if not str(crossing).isdigit() else f"L≥{crossing}"
        text[i][j] = f"{where}  {fmt(rec['ratio_at_longest'], 'x')}"
    return ratio, text


def _crossover_panel(
    ax, metric: str, cross: pd.DataFrame, rows: list[str], cols: list[str], half: float, first: bool
):
    """One metric's variant x baseline matrix of :func:`crossover_matrix`; returns its image.

    Variant names go on the ``first`` panel only; the image is returned for the colour bar.
    """
    ratio, text = _crossover_cells(cross, rows, cols)
    logr = np.log10(ratio)
    image = ax.imshow(logr, cmap="RdBu", norm=mcolors.Normalize(-half, half), aspect="auto")
    for i in range(len(rows)):
        for j in range(len(cols)):
            if text[i][j]:
                dark = abs(logr[i, j]) > 0.55 * half
                ax.text(
                    j,
                    i,
                    text[i][j],
                    ha="center",
                    va="center",
                    fontsize=7.5,
                    color="white" if dark else "black",
                )
    ax.set_xticks(range(len(cols)), [f"vs {c}" for c in cols], fontsize=9)
    ax.set_yticks(range(len(rows)), rows if first else [""] * len(rows), fontsize=9)
    ax.xaxis.tick_top()
    ax.grid(False)
    what = "faster" if metric == "time" else "smaller"
    ax.set_title(
        f"{'time' if metric == 'time' else 'peak tensor memory'}: first L where {what}",
        fontsize=10,
        pad=20,
    )
    return image


def crossover_matrix(
    crosses: dict[str, pd.DataFrame] | pd.DataFrame, metric: str = "time"
) -> plt.Figure | None:
    """Variant x baseline matrices, one panel per metric: from which L each variant wins.

    The cell says from which L the variant is faster (time) or smaller (memory) than the baseline
    at every longer L measured; its colour is baseline / variant at the longest common L, on a log
    scale centred at 1x (clipped at 1000x).

    Args:
        crosses: ``{metric: complexity.crossovers(...)}``, or one such table (of ``metric``).
        metric: the metric of a single table.
    """
    if isinstance(crosses, pd.DataFrame) or crosses is None:
        crosses = {metric: crosses}
    crosses = {
        m: t[t["metric"] == m]
        for m, t in crosses.items()
        if t is not None and len(t) and (t["metric"] == m).any()
    }
    if not crosses:
        return None
    names = set().union(*(set(t["variant"]) | set(t["baseline"]) for t in crosses.values()))
    order = [v for v in variant_names() if v in names] + sorted(names - set(variant_names()))
    rows = [v for v in order if any(v in set(t["variant"]) for t in crosses.values())]
    logs = np.concatenate(
        [np.log10(t["ratio_at_longest"].to_numpy(float)) for t in crosses.values()]
    )
    logs = logs[np.isfinite(logs)]
    # a 10^4 outlier must not wash out 2x
    half = min(max(float(np.abs(logs).max()) if len(logs) else 1.0, 0.5), 3.0)
    widths = [len(set(t["baseline"])) for t in crosses.values()]
    fig, axes = plt.subplots(
        1,
        len(crosses),
        figsize=(1.55 * sum(widths) + 2.2 * len(crosses) + 1.2, 0.34 * len(rows) + 1.3),
        gridspec_kw={"width_ratios": widths},
        squeeze=False,
    )
    image = None
    for k, (ax, (m, cross)) in enumerate(zip(axes[0], crosses.items(), strict=True)):
        cols = [b for b in order if b in set(cross["baseline"])]
        image = _crossover_panel(ax, m, cross, rows, cols, half, first=k == 0)
    bar = fig.colorbar(image, ax=list(axes[0]), shrink=0.8, pad=0.02)
    ticks = [t for t in (-3, -2, -1, 0, 1, 2, 3) if -half <= t <= half] or [0]
    bar.set_ticks(ticks, labels=[fmt(10.0**t, "x") for t in ticks])
    bar.set_label("baseline / variant at the longest common L (>1x: better)", fontsize=8)
    return fig


def speedup_heatmap(frame: pd.DataFrame, baseline: str) -> plt.Figure | None:
    """Heatmap of baseline time / variant time, variant x L (>1: faster than the baseline).

    The colour scale is log10 of the ratio centred at 1x and clipped at 1000x either way, so one
    extreme ratio does not make 0.5x and 2x look alike.
    """
    df = measured_rows(frame, "time")
    df = df[(df["mode"] == "forward") & (df["seq_len"] == df["seq_len_k"])]
    table = df.pivot_table(index="variant", columns="seq_len", values="value", aggfunc="median")
    if baseline not in table.index:
        return None
    ratio = (table.loc[baseline] / table).drop(index=baseline, errors="ignore")
    # the baseline has no correct time there
    missing = [int(n) for n in ratio.columns if not ratio[n].notna().any()]
    ratio = ratio.loc[:, ratio.notna().any()]
    if ratio.empty:
        return None
    height = max(2.6, 0.36 * ratio.shape[0] + 1.5)
    # a short colour bar holds three labels
    ticks = [-3, -2, -1, 0, 1, 2, 3] if height >= 3.5 else [-3, 0, 3]
    fig, ax = plt.subplots(figsize=(1.0 * ratio.shape[1] + 3.5, height))
    sns.heatmap(
        np.log10(ratio),
        annot=ratio.map(lambda v: "" if pd.isna(v) else fmt(v, "x")),
        fmt="",
        cmap="RdBu",
        center=0,
        vmin=-3,
        vmax=3,
        ax=ax,
        annot_kws={"fontsize": 7},
        cbar_kws={"label": f"{baseline} time / time", "ticks": ticks},
    )
    ax.collections[0].colorbar.set_ticklabels([fmt(10.0**t, "x") for t in ticks])
    ax.set(xlabel="sequence length L", ylabel="")
    ax.tick_params(axis="y", rotation=0)
    ax.grid(False)
    ax.set_title(f"speedup over {baseline} (forward)", fontsize=10)
    notes = (
        ["blank: no correct, undisturbed time (noisy, wrong or not run)"]
        if ratio.isna().to_numpy().any()
        else []
    )
    if missing:
        notes.append(
            f"no column at L={', '.join(map(str, missing))}: {baseline} has no correct, "
            "undisturbed time there"
        )
    if notes:
        fig.text(0.01, 0.01, "; ".join(notes), fontsize=7, color="0.35")
    fig.tight_layout(rect=(0, 0.06 if notes else 0, 1, 1))
    return fig


def error_vs_time(frame: pd.DataFrame) -> plt.Figure | None:
    """Approximate variants' error against exact softmax attention vs time, points labelled by L."""
    err = measured_rows(frame, "softmax_error")
    if err.empty:
        return None
    keys = ["source", "machine", "device", "mode", "variant", "seq_len"]
    time = measured_rows(frame, "time")[keys + ["value"]].rename(columns={"value": "time"})
    df = err.merge(time, on=keys)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for variant, s in df.groupby("variant"):
        s = s.sort_values("seq_len")
        ax.plot(s["time"], s["value"], marker="o", color=colour(variant), label=variant)
        for rec in s.to_dict("records"):
            ax.annotate(
                f"L={rec['seq_len']}",
                (rec["time"], rec["value"]),
                fontsize=7,
                xytext=(4, 2),
                textcoords="offset points",
            )
    ax.set(
        xscale="log",
        yscale="log",
        xlabel="median time per call",
        ylabel="max |out - exact softmax attention|",
    )
    unit_axis(ax, "x", "s")
    # labels in a narrow decade
    ax.yaxis.set_major_locator(matplotlib.ticker.LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    # plain, not "2.9x10^0"
    ax.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda v, _: f"{v:.2g}"))
    ax.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    ax.legend(fontsize=8, loc="best")
    ax.set_title("accuracy vs speed of approximate variants", fontsize=11)
    fig.tight_layout()
    return fig


# ---- attention weights, in the spirit of d2l's show_heatmaps ------------------------------
def show_heatmaps(
    matrices: list[list[np.ndarray]],
    xlabel: str,
    ylabel: str,
    titles: list[str] | None = None,
    cmap: str = "Reds",
) -> plt.Figure:
    """Grid of matrix heatmaps sharing axes and one colour bar (d2l's ``show_heatmaps``)."""
    rows, cols = len(matrices), len(matrices[0])
    fig, axes = plt.subplots(
        rows, cols, figsize=(3.0 * cols + 1, 3.0 * rows), sharex=True, sharey=True, squeeze=False
    )
    image = None
    for i, (row_axes, row_mats) in enumerate(zip(axes, matrices, strict=True)):
        for j, (ax, mat) in enumerate(zip(row_axes, row_mats, strict=True)):
            image = ax.imshow(mat, cmap=cmap, vmin=0.0)
            ax.grid(False)
            if i == rows - 1:
                ax.set_xlabel(xlabel)
            if j == 0:
                ax.set_ylabel(ylabel)
            if titles:
                ax.set_title(titles[j], fontsize=10)
    fig.colorbar(image, ax=axes, shrink=0.6)
    return fig


def heatmaps(panels: Heatmaps) -> plt.Figure:
    """A teaching demo's weight matrices (:mod:`attnbench.demos`) side by side, under its title."""
    fig = show_heatmaps(
        [list(panels.matrices)],
        panels.xlabel,
        panels.ylabel,
        titles=list(panels.titles),
        cmap=panels.cmap,
    )
    fig.suptitle(panels.title)
    return fig
