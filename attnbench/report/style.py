"""How every figure of the report looks: the theme, the variants' colours and order, shared axes.

The theme (seaborn's, matplotlib's rcParams) holds inside :func:`drawing` only, which the render
step opens; the variants' order comes from the analysis, never from the registry.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from contextvars import ContextVar

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
from matplotlib import colors as mcolors  # noqa: E402

from attnbench.analysis.text import fmt  # noqa: E402
from attnbench.contract import (  # noqa: E402
    FAMILIES,
    OTHER_FAMILY,
    Method,
    Status,
    family,
)

__all__ = [
    "COLOUR_CODES",
    "FAMILY_COLOURS",
    "GUIDE_COLOUR",
    "LABEL_POINTS",
    "PLUGIN_COLOURS",
    "SHAPE_TAGS",
    "THEME",
    "VARIANT_MARKERS",
    "WRONG_COLOUR",
    "WRONG_MARKER",
    "colour",
    "draw_guides",
    "drawing",
    "end_labels",
    "facet_axes",
    "family_palette",
    "length_axis",
    "measured_rows",
    "series",
    "spread_bars",
    "unit_axis",
    "variant_markers",
    "variant_names",
]

_ORDER: ContextVar[tuple[str, ...]] = ContextVar("variant_order", default=())
"""The variants' order while :func:`drawing` (the analysis' ``variant_order``)."""
THEME = {"style": "whitegrid", "context": "notebook"}
"""seaborn's theme of every figure (applied by :func:`drawing`, never at import)."""
COLOUR_CODES = "bgrmyck"
"""The one-letter colours seaborn's theme redefines (its palette's shades), restored after."""


@contextlib.contextmanager
def drawing(variant_order: Sequence[str] = ()) -> Iterator[None]:
    """Draw in the report's style, with ``variant_order`` (the analysis') for legends and shades.

    The theme (rcParams, seaborn's colour codes) holds inside the block only: importing this
    module, or drawing elsewhere in the same process, keeps matplotlib's own settings.
    """
    codes = mcolors.colorConverter.colors
    saved = {c: codes[c] for c in COLOUR_CODES}
    token = _ORDER.set(tuple(variant_order))
    try:
        with plt.rc_context():
            sns.set_theme(**THEME)
            yield
    finally:
        _ORDER.reset(token)
        for c, value in saved.items():
            codes[c] = value


def variant_names() -> tuple[str, ...]:
    """The variants in the order the analysis gave :func:`drawing` (none outside it)."""
    return _ORDER.get()


WRONG_COLOUR = "#b00020"
WRONG_MARKER = "x"
"""A case that failed the correctness gate: a cross, the one shape no variant's own points take."""
VARIANT_MARKERS = ("o", "s", "D", "^", "p", "h", "<", ">", "d", "8", "H")
"""The variants' point shapes: filled, closed outlines only. seaborn's own list holds "X", "P" and a
four-pointed star, and a variant drawn in crosses read as wrong results (:data:`WRONG_MARKER`).
No "v" either: the headline's ▼ marks L*."""

PLUGIN_COLOURS = mcolors.LinearSegmentedColormap.from_list(
    "attnbench_plugins", ["#f0e442", "#b8a000", "#5c5000"]
)
"""Yellow to olive: the hue no family has. A plugin variant is the kernel its author came to
measure; in YlOrBr it was sdpa's orange on every figure but the headline."""

FAMILY_COLOURS: dict[str, str | mcolors.Colormap] = {
    "dense": "Blues",
    "fused": "Oranges",
    "blockwise": "Greens",
    "linear": "Purples",
    "scoring": "Greys",
    "compiled": "RdPu",
    OTHER_FAMILY: PLUGIN_COLOURS,
}
"""The colormap each family's shades come from (``contract.FAMILIES``; plugin variants:
:data:`PLUGIN_COLOURS`)."""


SHAPE_TAGS = (
    ("kv_heads", "Hkv"),
    ("head_dim", "D"),
    ("batch", "B"),
    ("heads", "H"),
    ("dtype", ""),
    ("mask", "mask "),
)
"""Shape columns that name a series where a figure's rows vary in them (``sdpa Hkv=2``).

Never a median across shapes."""


def series(df: pd.DataFrame, model: bool = True) -> pd.Series:
    """Each row's series label: its variant and the shape settings that vary.

    Predicted values also get "(model)", unless ``model`` is False (a figure that marks them by
    line style).
    """
    label = df["variant"].astype(str)
    for col, tag in SHAPE_TAGS:
        if col in df and df[col].nunique() > 1:
            label = (
                label
                + " "
                + tag
                + (
                    df[col].astype(str)
                    if tag.endswith(" ") or not tag
                    else "=" + df[col].astype(str)
                )
            )
    if model and "method" in df:
        label = label.where(df["method"] != Method.MODEL, label + " (model)")
    return label


def colour(variant: str) -> tuple[float, float, float, float]:
    """The variant's colour: its family's hue, a shade by its place in the family (every figure).

    ``variant`` may be a series label (:func:`series`): its first word is the variant."""
    base = variant.split(" ")[0]
    fam = family(base)
    if fam == OTHER_FAMILY:
        others = sorted(v for v in variant_names() if family(v) == OTHER_FAMILY) or [base]
        members = tuple(others if base in others else [*others, base])
    else:
        members = FAMILIES[fam]
    cmap = FAMILY_COLOURS[fam]
    i = members.index(base)
    shade = 0.45 + 0.5 * (i / max(len(members) - 1, 1))  # 0.45 .. 0.95 of the colormap
    return tuple(plt.get_cmap(cmap)(shade))


def measured_rows(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of one metric that measured something, with plain int lengths.

    seaborn's legends cannot handle pandas' nullable Int64.
    """
    df = frame[
        (frame["metric"] == metric) & (frame["status"] == Status.OK) & frame["value"].notna()
    ].copy()
    for col in ("seq_len", "seq_len_k"):
        df[col] = df[col].astype("int64")
    return df


def family_palette(variants: list[str]) -> dict[str, tuple]:
    """Family colours (see :func:`colour`) in registry order."""
    order = [v for v in variant_names() if v in variants]
    order += sorted(v for v in set(variants) - set(order))
    return {v: colour(v) for v in order}


def variant_markers(names: Sequence[str]) -> dict[str, str]:
    """A point shape per name, in the order given, from :data:`VARIANT_MARKERS` (repeating past its
    end): never a cross."""
    return {name: VARIANT_MARKERS[i % len(VARIANT_MARKERS)] for i, name in enumerate(names)}


def unit_axis(ax, axis: str, unit: str) -> None:
    """Tick labels in readable units (log axes): 1 ms, 10 MB, ..."""
    if unit not in ("s", "bytes"):
        return
    scale = getattr(ax, f"{axis}axis")

    # a view within one decade has no major tick: label 2, 3 and 5 there
    def minor(v: float, _: int) -> str:
        lo, hi = sorted(scale.get_view_interval())
        return fmt(v, unit) if lo > 0 and hi < 10 * lo and f"{v:.0e}"[0] in "235" else ""

    scale.set_major_formatter(
        matplotlib.ticker.FuncFormatter(lambda v, _: fmt(v, unit) if v > 0 else "")
    )
    scale.set_minor_formatter(matplotlib.ticker.FuncFormatter(minor))


def length_axis(ax, lengths) -> None:
    """Log x axis with the measured lengths as plain tick labels (no 3x10^2 collisions)."""
    ticks = sorted({int(n) for n in lengths})
    ax.set_xscale("log", base=2)
    ax.set_xticks(ticks)
    ax.set_xticklabels([str(n) for n in ticks], fontsize=8, rotation=0)
    ax.xaxis.set_minor_locator(matplotlib.ticker.NullLocator())


LABEL_POINTS = 7.5  # font size of line-end labels


GUIDE_COLOUR = "0.45"


def end_labels(
    ax,
    ends: dict[str, tuple[float, float]],
    text: dict[str, str] | None = None,
    colours: dict[str, tuple] | None = None,
) -> None:
    """Label each line at its right end, spread apart vertically inside the axes, never overlapping.

    Names of the O(L) guides (``"O(L..."``) are drawn grey."""
    if not ends:
        return
    items = sorted(ends.items(), key=lambda kv: kv[1][1])
    lo, hi = (math.log10(v) for v in ax.get_ylim())
    height_pt = ax.get_window_extent().height * 72 / ax.figure.dpi
    # label centres a line of text apart, in decades
    gap = (hi - lo) * max(0.06, 1.35 * LABEL_POINTS / height_pt)
    want = [math.log10(y) if y > 0 else lo for _, (_, y) in items]
    pos: list[float] = []
    for w in want:  # upward pass: no label closer than gap to the one below
        pos.append(max(w, pos[-1] + gap) if pos else w)
    excess = pos[-1] - (hi - gap / 2) if pos else 0.0
    if excess > 0:  # the top one left the axes: push down, then keep the gaps downward
        pos[-1] -= excess
        for i in range(len(pos) - 2, -1, -1):
            pos[i] = min(pos[i], pos[i + 1] - gap)
    for (name, (x, y)), ly in zip(items, pos, strict=True):
        shade = (
            GUIDE_COLOUR if name.startswith("O(L") else (colours or {}).get(name) or colour(name)
        )
        ax.annotate(
            (text or {}).get(name, name),
            xy=(x, y),
            xytext=(x * 1.08, 10**ly),
            fontsize=LABEL_POINTS,
            color=shade,
            va="center",
            ha="left",
            annotation_clip=False,
            arrowprops={"arrowstyle": "-", "color": "0.75", "lw": 0.5}
            if y > 0 and abs(ly - math.log10(y)) > 0.02
            else None,
        )


def spread_bars(ax, x: pd.Series, y: pd.Series, spread: pd.Series, colour: tuple) -> None:
    """Each point's IQR (``spread``, centred on the median) as a bar; none where it is unknown."""
    known = spread.notna() & (spread > 0)
    if known.any():
        half = spread[known].to_numpy(float) / 2
        # log axes: the bar stays above zero
        low = np.minimum(half, y[known].to_numpy(float) * 0.999)
        ax.errorbar(
            x[known].to_numpy(float),
            y[known].to_numpy(float),
            yerr=[low, half],
            fmt="none",
            ecolor=colour,
            elinewidth=0.9,
            capsize=2,
            alpha=0.8,
            zorder=4,
        )


def draw_guides(
    ax, lengths: np.ndarray, anchor: float, exponents: tuple[float, ...] = (1.0, 2.0)
) -> dict[str, tuple[float, float]]:
    """Dashed O(L^p) lines through ``anchor`` at the shortest length; returns their names' places.

    The places, of the ones that end inside the axes, are for :func:`end_labels`: the guides'
    names are spread with the lines' own, never on them.
    """
    x = np.array([lengths.min(), lengths.max()], dtype=float)
    top = ax.get_ylim()[1]
    ends = {}
    for p in exponents:
        y = anchor * (x / x[0]) ** p
        ax.plot(x, y, ls="--", lw=0.8, color="0.6", zorder=0)
        if y[1] <= top:
            ends[f"O(L{'²' if p == 2 else ''})"] = (float(x[1]), float(y[1]))
    return ends


def facet_axes(grid, row: str | None, col: str | None) -> dict:
    """``{(row value, col value): ax}`` of a relplot grid (``None``: an absent facet)."""
    if row is None and col is None:
        return {(None, None): grid.ax}
    out = {}
    for key, ax in grid.axes_dict.items():
        if row is not None and col is not None:
            out[key] = ax
        elif row is not None:
            out[(key, None)] = ax
        else:
            out[(None, key)] = ax
    return out
