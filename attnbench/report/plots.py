"""Seaborn figures from the tidy frame (figures only: no I/O, no HTML).

Every function returns a matplotlib Figure, or None when the frame holds nothing to draw.
"""

from __future__ import annotations

import math

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
import seaborn as sns  # noqa: E402
import torch  # noqa: E402

from attnbench import masks  # noqa: E402
from attnbench.registry import get_variant, variant_names  # noqa: E402
from attnbench.variants.base import Variant  # noqa: E402

sns.set_theme(style="whitegrid", context="notebook")
YLABELS = {"time": "median time per call (s)", "peak_tensor_bytes": "peak tensor memory above inputs (bytes)", "gflops": "achieved GFLOP/s", "peak_rss": "process peak RSS (bytes)"}


def _ok(frame: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Rows of one metric that measured something, with plain int lengths (seaborn's legends
    cannot handle pandas' nullable Int64)."""
    df = frame[(frame["metric"] == metric) & (frame["status"] == "ok") & frame["value"].notna()].copy()
    for col in ("seq_len", "seq_len_k"):
        df[col] = df[col].astype("int64")
    return df


DECLARED = {"time": "time_exponent", "peak_tensor_bytes": "memory_exponent"}


def _palette(variants: list[str]) -> dict[str, tuple]:
    """Stable colours in registry order (20 distinct ones before repeating)."""
    order = [v for v in variant_names() if v in variants] + sorted(set(variants) - set(variant_names()))
    colours = sns.color_palette("tab20", 20)
    return {v: colours[i % 20] for i, v in enumerate(order)}


def _declared_group(variant: str, metric: str) -> str:
    if metric not in DECLARED or variant not in variant_names():
        return "all variants"
    p = getattr(get_variant(variant), DECLARED[metric])
    return f"declared O(n{'²' if p == 2 else ''})"


def _guides(ax, lengths: np.ndarray, anchor: float, exponents: tuple[float, ...] = (1.0, 2.0)) -> None:
    """Dashed O(n^p) lines through ``anchor`` at the shortest length."""
    x = np.array([lengths.min(), lengths.max()], dtype=float)
    for p in exponents:
        ax.plot(x, anchor * (x / x[0]) ** p, ls="--", lw=1, color="0.4", zorder=0)
        ax.annotate(f"O(n{'²' if p == 2 else ''})", (x[1], anchor * (x[1] / x[0]) ** p), fontsize=8, color="0.3")


def _facet_axes(grid, row: str | None, col: str | None) -> dict:
    """``{(row value, col value): ax}`` for a relplot grid, ``None`` standing for an absent facet."""
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


def scaling(frame: pd.DataFrame, metric: str, guides: bool = True, title: str | None = None) -> plt.Figure | None:
    """Metric vs sequence length on log-log axes, one line per variant, O(n) / O(n^2) guides.

    Predicted values (method "model") are drawn as their own series, labelled "<variant> (model)";
    cases that failed the correctness gate (status "wrong") are red crosses, never part of a line;
    cases measured while the machine was disturbed (status "noisy") are hollow circles, never part of
    a line or a fit.
    """
    df = _ok(frame, metric)
    df = df[df["seq_len"] == df["seq_len_k"]]
    if df.empty:
        return None
    method = df["method"] if "method" in df else pd.Series("", index=df.index)
    df = df.assign(family=[_declared_group(v, metric) for v in df["variant"]],
                   variant=df["variant"].where(method != "model", df["variant"] + " (model)"))
    df = df.groupby(["device", "mode", "family", "variant", "seq_len"], as_index=False)["value"].median()
    df["where"] = df["device"] + " " + df["mode"]
    row = "where" if df["where"].nunique() > 1 else None
    col = "family" if df["family"].nunique() > 1 else None
    grid = sns.relplot(
        data=df, x="seq_len", y="value", hue="variant", style="variant", kind="line", markers=True, dashes=False,
        col=col, row=row, height=4.2, aspect=1.2, palette=_palette(df["variant"].unique().tolist()),
        hue_order=[v for v in _palette(df["variant"].unique().tolist())], facet_kws={"sharey": True},
    )
    grid.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=YLABELS.get(metric, metric))
    for (_, sub), ax in zip(grid.facet_data(), grid.axes.flat, strict=False):
        if guides and not sub.empty:
            lengths = sub["seq_len"].to_numpy(float)
            _guides(ax, lengths, sub[sub["seq_len"] == lengths.min()]["value"].median())
    wrong = frame[(frame["metric"] == metric) & (frame["status"] == "wrong") & (frame["value"] > 0)]
    if len(wrong):
        wrong = wrong.assign(family=[_declared_group(v, metric) for v in wrong["variant"]],
                             where=wrong["device"] + " " + wrong["mode"])
        axes = _facet_axes(grid, row, col)
        for rec in wrong.to_dict("records"):
            ax = axes.get((rec["where"] if row else None, rec["family"] if col else None))
            if ax is not None:
                ax.scatter([int(rec["seq_len"])], [rec["value"]], marker="x", s=60, color="#b00020", zorder=5,
                           label="wrong (failed the correctness gate)")
                ax.annotate(f"{rec['variant']} wrong", (int(rec["seq_len"]), rec["value"]), fontsize=7, color="#b00020",
                            xytext=(4, -8), textcoords="offset points")
    noisy = frame[(frame["metric"] == metric) & (frame["status"] == "noisy") & (frame["value"] > 0)]
    if len(noisy):
        noisy = noisy.assign(family=[_declared_group(v, metric) for v in noisy["variant"]],
                             where=noisy["device"] + " " + noisy["mode"])
        axes = _facet_axes(grid, row, col)
        colours = _palette(sorted(set(df["variant"]) | set(noisy["variant"])))
        for rec in noisy.to_dict("records"):
            ax = axes.get((rec["where"] if row else None, rec["family"] if col else None))
            if ax is not None:
                ax.scatter([int(rec["seq_len"])], [rec["value"]], marker="o", s=50, facecolors="none",
                           edgecolors=colours.get(rec["variant"], "grey"), linewidths=1.2, zorder=5,
                           label="noisy (machine disturbed: not fitted)")
    grid.figure.suptitle(title or f"{metric.replace('_', ' ')} vs sequence length", y=1.02)
    return grid.figure


def gflops(frame: pd.DataFrame) -> plt.Figure | None:
    """Achieved GFLOP/s vs L, with the machine's matmul peak as a horizontal line."""
    fig = scaling(frame, "gflops", guides=False, title="achieved GFLOP/s vs sequence length (dotted: matmul peak)")
    if fig is None:
        return None
    peak = frame["peak_gflops"].dropna()
    if len(peak):
        for ax in fig.axes:
            ax.axhline(float(peak.median()), ls=":", color="black", lw=1)
    return fig


def speedup_heatmap(frame: pd.DataFrame, baseline: str) -> plt.Figure | None:
    """Heatmap of baseline time / variant time, variant x L (>1: faster than the baseline)."""
    df = _ok(frame, "time")
    df = df[(df["mode"] == "forward") & (df["seq_len"] == df["seq_len_k"])]
    table = df.pivot_table(index="variant", columns="seq_len", values="value", aggfunc="median")
    if baseline not in table.index:
        return None
    ratio = (table.loc[baseline] / table).dropna(axis=1, how="all").drop(index=baseline, errors="ignore")
    ratio = ratio.loc[:, ratio.notna().any()]
    if ratio.empty:
        return None
    fig, ax = plt.subplots(figsize=(1.1 * ratio.shape[1] + 3, 0.42 * ratio.shape[0] + 1.5))
    sns.heatmap(np.log10(ratio), annot=ratio.map(lambda v: "" if pd.isna(v) else f"{v:.3g}x"), fmt="", cmap="RdYlGn",
                center=0, ax=ax, cbar_kws={"label": f"log10 speedup over {baseline}"})
    ax.set(xlabel="sequence length L", ylabel="", title=f"speedup over {baseline} (forward; {baseline} time / variant time)")
    fig.tight_layout()
    return fig


def error_vs_time(frame: pd.DataFrame) -> plt.Figure | None:
    """Approximate variants: error against exact softmax attention vs time, labelled by L."""
    err = _ok(frame, "softmax_error")
    if err.empty:
        return None
    keys = ["source", "machine", "device", "mode", "variant", "seq_len"]
    time = _ok(frame, "time")[keys + ["value"]].rename(columns={"value": "time"})
    df = err.merge(time, on=keys)
    if df.empty:
        return None
    fig, ax = plt.subplots(figsize=(7, 4.5))
    sns.scatterplot(data=df, x="time", y="value", hue="variant", size="seq_len", ax=ax, sizes=(30, 200),
                    palette=_palette(df["variant"].unique().tolist()))
    for rec in df.to_dict("records"):
        ax.annotate(f"L={rec['seq_len']}", (rec["time"], rec["value"]), fontsize=7, xytext=(4, 2), textcoords="offset points")
    ax.set(xscale="log", yscale="log", xlabel="median time per call (s)", ylabel="max |out - exact softmax attention|",
           title="accuracy vs speed of approximate variants")
    fig.tight_layout()
    return fig


def history(frame: pd.DataFrame, metric: str = "time") -> plt.Figure | None:
    """Value per commit (ordered by commit date) for each variant at a few lengths."""
    df = _ok(frame, metric)
    df = df[(df["commit"] != "") & (df["seq_len"] == df["seq_len_k"])]
    if df["commit"].nunique() < 2:
        return None
    order = df.groupby("commit")["date"].min().sort_values().index.tolist()
    df["commit_short"] = df["commit"].str[:8]
    lengths = sorted(df["seq_len"].unique())
    pick = [n for n in lengths if n in (min(lengths), 1024, max(lengths))] or lengths[-1:]
    df = df[df["seq_len"].isin(pick)]
    grid = sns.relplot(
        data=df, x="commit_short", y="value", hue="variant", col="seq_len", kind="line", marker="o",
        col_wrap=min(3, len(pick)), height=3.8, aspect=1.3, facet_kws={"sharey": False},
    )
    short = [c[:8] for c in order]
    for ax in grid.axes.flat:
        ax.set_xticks(range(len(short)))
        ax.set_xticklabels(short, rotation=45, ha="right", fontsize=8)
        ax.set_yscale("log")
    grid.set_axis_labels("commit (oldest to newest)", YLABELS.get(metric, metric))
    grid.figure.suptitle(f"{metric} history over commits", y=1.03)
    return grid.figure


def machines(frame: pd.DataFrame, metric: str = "time") -> plt.Figure | None:
    """Side by side per machine (e.g. a CPU box and a GPU box)."""
    df = _ok(frame, metric)
    if df["machine"].nunique() < 2:
        return None
    df = df[df["seq_len"] == df["seq_len_k"]]
    df = df.assign(where=df["machine"] + " / " + df["device"])
    grid = sns.relplot(data=df, x="seq_len", y="value", hue="variant", col="where", kind="line", marker="o", height=4, aspect=1.2)
    grid.set(xscale="log", yscale="log", xlabel="sequence length L", ylabel=YLABELS.get(metric, metric))
    grid.figure.suptitle(f"{metric} by machine", y=1.03)
    return grid.figure


# ---- attention weights, in the spirit of d2l's show_heatmaps ------------------------------
def show_heatmaps(matrices: list[list[np.ndarray]], xlabel: str, ylabel: str, titles: list[str] | None = None, cmap: str = "Reds") -> plt.Figure:
    """Grid of matrix heatmaps sharing axes and one colour bar (Dive into Deep Learning's ``show_heatmaps``)."""
    rows, cols = len(matrices), len(matrices[0])
    fig, axes = plt.subplots(rows, cols, figsize=(3.0 * cols + 1, 3.0 * rows), sharex=True, sharey=True, squeeze=False)
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


def attention_weights(variant: str | Variant, q: torch.Tensor, k: torch.Tensor, mask: torch.Tensor | None = None) -> np.ndarray:
    """The ``(Lq, Lk)`` attention matrix a variant computes: call it with ``v = I``, so output = weights.

    Args:
        variant: registered name or instance.
        q: ``(Lq, D)`` queries; k: ``(Lk, D)`` keys.
        mask: optional bool mask broadcastable to ``(1, 1, Lq, Lk)``.
    """
    variant = get_variant(variant) if isinstance(variant, str) else variant
    lk = k.shape[-2]
    eye = torch.eye(lk, dtype=q.dtype).expand(1, 1, lk, lk)  # (1, 1, Lk, Dv=Lk)
    with torch.no_grad():
        return variant(q.view(1, 1, *q.shape[-2:]), k.view(1, 1, *k.shape[-2:]), eye, mask)[0, 0].numpy()


def nadaraya_watson(seed: int = 0, n: int = 50, epochs: int = 5) -> tuple[plt.Figure, dict[str, float]]:
    """Nadaraya-Watson kernel regression (Nadaraya 1964; Watson 1964), as in Dive into Deep Learning: weights of the non-parametric and the trained parametric model.

    Data: ``y = 2 sin(x) + x^0.8 + eps``, eps ~ N(0, 0.5), 50 training and 50 test points. The
    non-parametric model is softmax attention with scores ``-(x - x_i)^2 / 2``; the parametric one
    learns ``w`` in ``-((x - x_i) w)^2 / 2`` by SGD (lr 0.5, 5 epochs), each training point attending
    to all the others. Scores go through the ``dot`` variant: ``q . k`` with ``q = [x, -x^2/2, -1/2]``
    scaled and ``k = [x_i, 1, x_i^2]`` reproduces ``-(x - x_i)^2 / 2`` up to a per-query constant.
    """
    gen = torch.Generator().manual_seed(seed)
    x_train = torch.sort(torch.rand(n, generator=gen, dtype=torch.float64) * 5).values
    f = lambda x: 2 * torch.sin(x) + x**0.8  # noqa: E731 - the regression target
    y_train = f(x_train) + 0.5 * torch.randn(n, generator=gen, dtype=torch.float64)
    x_test = torch.arange(0, 5, 5 / n, dtype=torch.float64)

    def weights(queries: torch.Tensor, keys: torch.Tensor, w: float, mask: torch.Tensor | None = None) -> torch.Tensor:
        w2 = w * w
        q = torch.stack([w2 * queries, -0.5 * w2 * queries**2, torch.full_like(queries, -0.5 * w2)], -1)  # (Lq, 3)
        k = torch.stack([keys, torch.ones_like(keys), keys**2], -1)  # (Lk, 3)
        return torch.from_numpy(attention_weights("dot", q, k, mask))

    plain = weights(x_test, x_train, 1.0)
    w = torch.rand(1, generator=gen, dtype=torch.float64).requires_grad_(True)
    not_self = ~torch.eye(n, dtype=torch.bool)
    for _ in range(epochs):
        scores = -(((x_train[:, None] - x_train[None, :]) * w) ** 2) / 2
        probs = torch.softmax(scores.masked_fill(~not_self, float("-inf")), -1)
        loss = ((probs @ y_train - y_train) ** 2).sum()
        (grad,) = torch.autograd.grad(loss, w)
        with torch.no_grad():
            w -= 0.5 * grad
    learned = w.item()
    trained = weights(x_test, x_train, learned)
    mse = {
        "nonparametric_test_mse": float(((plain @ y_train - f(x_test)) ** 2).mean()),
        "parametric_test_mse": float(((trained @ y_train - f(x_test)) ** 2).mean()),
        "learned_w": learned,
    }
    fig = show_heatmaps([[plain.numpy(), trained.numpy()]], "sorted training inputs", "sorted testing inputs",
                        titles=["non-parametric (w = 1)", f"parametric (learned w = {learned:.2f})"])
    fig.suptitle("Nadaraya-Watson kernel regression: attention weights")
    return fig, mse


def masked_weights(length: int = 40, window: int = 4) -> plt.Figure:
    """Attention weights of sinusoidal position encodings (a real, structured input) under masks.

    Computed by the actual variants: ``batched`` with no mask and a causal mask, ``local`` (its own
    band), and ``block_sparse`` (its own BigBird pattern).
    """
    pos = torch.arange(length, dtype=torch.float64)[:, None]
    freq = torch.exp(-math.log(100.0) * torch.arange(0, 16, 2, dtype=torch.float64) / 16)
    enc = torch.cat([torch.sin(pos * freq), torch.cos(pos * freq)], -1) * 2.0  # (L, 16)
    panels = [
        ("batched, no mask", attention_weights("batched", enc, enc)),
        ("batched, causal", attention_weights("batched", enc, enc, masks.causal(length, length))),
        (f"local, window {window}", attention_weights(get_variant("local", window=window), enc, enc)),
        ("block_sparse, block 5", attention_weights(get_variant("block_sparse", block=5, random_blocks=1), enc, enc)),
    ]
    fig = show_heatmaps([[p[1] for p in panels]], "keys", "queries", titles=[p[0] for p in panels], cmap="Blues")
    fig.suptitle("attention weights under masks and sparse patterns (sinusoidal position encodings)")
    return fig

