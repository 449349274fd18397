"""One self-contained HTML page (figures embedded as data URIs, no network requests), plus the
figures as PNG and SVG files and the tidy table as CSV, all written atomically.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
import re
from collections.abc import Iterable, Sequence
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from attnbench.analysis import complexity
from attnbench.analysis.frame import load
from attnbench.io import atomic_write, atomic_write_text
from attnbench.registry import get_variant, variant_names
from attnbench.report import plots

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:2rem auto;max-width:1200px;color:#222;line-height:1.45;padding:0 1rem}
h1{margin-bottom:.2rem} h2{border-bottom:2px solid #ddd;padding-bottom:.2rem;margin-top:2.2rem}
table{border-collapse:collapse;font-size:.85rem;margin:.6rem 0} th,td{border:1px solid #ddd;padding:.25rem .5rem;text-align:right}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left}
.meta td{text-align:left} figure{margin:1rem 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figcaption{font-size:.85rem;color:#555} .bad{color:#b00020;font-weight:600} .good{color:#1b5e20}
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.5rem .8rem} code{background:#f4f4f4;padding:0 .2rem}
"""


def _fig_to_files(fig: plt.Figure, stem: Path) -> str:
    """Save PNG and SVG beside each other (atomically); return the PNG as a data URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    png = buffer.getvalue()
    atomic_write(stem.with_suffix(".png"), lambda tmp: Path(tmp).write_bytes(png))
    atomic_write(stem.with_suffix(".svg"), lambda tmp: fig.savefig(tmp, format="svg", bbox_inches="tight"))
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _rst_to_html(text: str) -> str:
    """Escape a docstring paragraph and render its ``literals`` and *emphasis*."""
    out = html.escape(text.replace("\n", " "))
    out = re.sub(r"``(.+?)``", r"<code>\1</code>", out)
    return re.sub(r"\*(\w[^*]*?)\*", r"<em>\1</em>", out)


def _table(df: pd.DataFrame, max_rows: int = 400) -> str:
    if df is None or df.empty:
        return "<p><em>nothing to show</em></p>"
    shown = df.head(max_rows)
    out = shown.to_html(index=False, escape=True, na_rep="", float_format=lambda v: f"{v:.4g}", border=0)
    if len(df) > max_rows:
        out += f"<p><em>{len(df) - max_rows} more rows in the CSV</em></p>"
    return out


def _fmt_fit(row: pd.Series) -> str:
    if math.isnan(row["exponent"]):
        return "n/a"
    hi = "inf" if math.isinf(row["ci_high"]) else f"{row['ci_high']:.2f}"
    lo = "-inf" if math.isinf(row["ci_low"]) else f"{row['ci_low']:.2f}"
    return f"{row['exponent']:.2f} [{lo}, {hi}] R²={row['r2']:.3f} (L {row['L_min']}-{row['L_max']})"


def exponent_summary(fits: pd.DataFrame) -> pd.DataFrame:
    """Variant rows with fitted time and memory exponents, declared ones, and a verdict."""
    if fits.empty:
        return fits
    rows = []
    keys = ["machine", "commit", "device", "mode", "dtype", "mask", "variant"]  # one row per commit in a history
    for key, group in fits.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key, strict=True))
        flags = []
        for metric, label in (("time", "time"), ("peak_tensor_bytes", "memory")):
            sub = group[group["metric"] == metric]
            if sub.empty:
                row[f"{label} exponent [95% CI]"], row[f"declared {label}"] = "", ""
                continue
            r = sub.iloc[-1]
            row[f"{label} exponent [95% CI]"] = _fmt_fit(r)
            row[f"declared {label}"] = "" if math.isnan(r["declared"]) else f"{r['declared']:g}"
            if r["verdict"] in ("steeper", "shallower"):
                flags.append(f"{label} {r['verdict']} than declared")
        row["verdict"] = "; ".join(flags) or "matches"
        rows.append(row)
    return pd.DataFrame(rows)


def provenance(frame: pd.DataFrame) -> pd.DataFrame:
    """Requested SDPA backend vs the kernel that ran, one row per case; fallbacks flagged."""
    rows = frame[(frame["kernel"] != "") & (frame["metric"] == "time")]
    if rows.empty:
        return pd.DataFrame()
    table = rows[["machine", "device", "variant", "seq_len", "dtype", "mode", "mask", "kernel"]].drop_duplicates().copy()
    requested = {v: getattr(get_variant(v), "backend", "auto") for v in table["variant"].unique() if v in variant_names()}
    table.insert(3, "requested", table["variant"].map(requested).fillna("?"))
    fallback = table["kernel"].str.contains("math") & (table["requested"] != "math")
    table["note"] = fallback.map({True: "fell back to math (O(n²) memory)", False: ""})
    return table


def _header(frame: pd.DataFrame, sources: Sequence[str]) -> str:
    def values(col: str) -> str:
        vals = [str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")] if col in frame else []
        return ", ".join(sorted(vals)[:8]) or "-"

    dates = frame["date"].dropna()
    span = f"{dates.min():%Y-%m-%d %H:%M} to {dates.max():%Y-%m-%d %H:%M} UTC" if len(dates) else "-"
    rows = [
        ("machine", values("machine")), ("CPU", values("cpu")), ("GPU", values("gpu")), ("torch", values("torch")),
        ("threads", values("threads")), ("matmul peak GFLOP/s", values("peak_gflops")), ("date", span),
        ("commit", values("commit")), ("sources", ", ".join(sources)),
        ("cases", f"{frame['status'].where(frame['metric'] == 'time').value_counts().to_dict()}"),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


def build_report(sources: Iterable[str | Path], out_dir: str | Path, title: str = "attnbench report") -> Path:
    """Load ``sources`` (asv results dirs and/or run dirs), analyse, draw, and write the report.

    Returns:
        Path of ``report.html`` inside ``out_dir`` (which also receives ``figures/``,
        ``tidy.csv`` and ``fits.csv``).
    """
    sources = [str(s) for s in sources]
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    frame = load(sources)
    problems = frame.attrs.get("problems", [])
    fits = complexity.fit_table(frame) if len(frame) else pd.DataFrame()
    sections: list[str] = []

    figures: list[tuple[str, str, plt.Figure | None]] = []
    if len(frame):
        figures += [
            ("time", "Time per call vs L (log-log). Dashed: O(n) and O(n²) through the shortest length.", plots.scaling(frame, "time")),
            ("memory", "Peak tensor memory above the inputs vs L: dense variants climb at O(n²), chunked/SDPA/linear at O(n).", plots.scaling(frame, "peak_tensor_bytes")),
            ("gflops", "Achieved GFLOP/s on executed FLOPs; dotted line: this machine's fp32 matmul peak.", plots.gflops(frame)),
            ("speedup_loop", "Speedup over the Python-loop baseline (where both ran).", plots.speedup_heatmap(frame, "loop")),
            ("speedup_batched", "Speedup over the bmm baseline.", plots.speedup_heatmap(frame, "batched")),
            ("accuracy", "Approximate variants: error against exact softmax attention vs time.", plots.error_vs_time(frame)),
            ("history", "History over commits (asv results with several commits).", plots.history(frame)),
            ("machines", "Side by side per machine.", plots.machines(frame)),
        ]
    nw_fig, nw = plots.nadaraya_watson()
    figures += [
        ("nadaraya_watson", f"Seed 001's Nadaraya-Watson regression through the <code>dot</code> variant. Test MSE non-parametric {nw['nonparametric_test_mse']:.3f}, parametric {nw['parametric_test_mse']:.3f} (learned w = {nw['learned_w']:.2f}).", nw_fig),
        ("masked_weights", "Attention weights computed by the variants themselves (v = I) under a causal mask, a sliding window and a block-sparse pattern.", plots.masked_weights()),
    ]
    figure_html = []
    for name, caption, fig in figures:
        if fig is None:
            continue
        uri = _fig_to_files(fig, fig_dir / name)
        figure_html.append(f'<figure id="fig-{name}"><img alt="{name}" src="{uri}"><figcaption>{caption} '
                           f'(<code>figures/{name}.png</code>, <code>.svg</code>)</figcaption></figure>')

    summary = exponent_summary(fits)
    mismatches = summary[summary["verdict"].str.contains("steeper")] if len(summary) else summary
    sections.append("<h2>Fitted exponents: the O(n²) claim in numbers</h2>"
                    f"<p>{_rst_to_html(complexity.__doc__.split(chr(10) + chr(10))[1])}</p>"
                    + (f'<p class="bad">{len(mismatches)} group(s) grow faster than their declared complexity.</p>' if len(mismatches) else '<p class="good">No variant grows faster than its declared complexity.</p>')
                    + _table(summary))
    sections.append("<h2>Figures</h2>" + "".join(figure_html))
    if len(frame):
        sections.append("<h2>Crossovers</h2><p>Smallest length from which a variant stays faster (or smaller) than the baseline at every longer length measured; ratio = baseline / variant at the longest common length.</p>"
                        "<h3>time</h3>" + _table(complexity.crossovers(frame, metric="time"))
                        + "<h3>peak tensor memory</h3>" + _table(complexity.crossovers(frame, metric="peak_tensor_bytes")))
        sections.append("<h2>Largest length within budget</h2>" + _table(complexity.largest_length(frame)))
        sections.append("<h2>Memory model: predicted vs measured</h2>" + _table(complexity.memory_model(frame)))
        roof = complexity.roofline(frame)
        sections.append("<h2>Roofline: % of matmul peak</h2>" + _table(roof.sort_values("pct_of_peak", ascending=False) if len(roof) else roof))
        sections.append("<h2>SDPA kernel provenance</h2><p>The backend each SDPA-backed case asked for, and the "
                        "kernel the profiler saw run. A fallback to <code>math</code> costs O(n²) memory.</p>"
                        + _table(provenance(frame)))
        compile_rows = frame[(frame["metric"] == "compile_time") & (frame["status"] == "ok")]
        if len(compile_rows):
            cols = ["machine", "device", "variant", "seq_len", "dtype", "mode", "value"]
            sections.append("<h2>Compilation time (outside every timed region)</h2>"
                            + _table(compile_rows[cols].rename(columns={"value": "compile_s"})))
        commits = frame[frame["commit"] != ""].groupby("commit")["date"].min().sort_values().reset_index()
        if len(commits) > 1:
            sections.append("<h2>Commits</h2>" + _table(commits))
        bad = frame[(frame["status"] != "ok") & (frame["metric"].isin(["time"]))]
        cols = ["source", "machine", "variant", "seq_len", "device", "mode", "status", "reason"]
        sections.append("<h2>Skipped and failed cases</h2>" + _table(bad[cols].drop_duplicates()))
    sections.append("<h2>Full fit table</h2>" + _table(fits))
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
        sections.insert(0, f'<div class="note"><strong>Some inputs could not be read and were skipped:</strong><ul>{items}</ul></div>')
    sections.append("<h2>Reproduce</h2><p>Sweep and report: <code>attnbench run</code>; from asv results: "
                    "<code>asv run</code> then <code>attnbench report --from .asv/results</code>. "
                    "Tidy data: <code>tidy.csv</code>; fits: <code>fits.csv</code> (beside this page).</p>")

    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><p>generated {generated}</p>"
            f"{_header(frame, sources)}{''.join(sections)}</body></html>")
    atomic_write(out_dir / "tidy.csv", lambda tmp: frame.to_csv(tmp, index=False))
    atomic_write(out_dir / "fits.csv", lambda tmp: fits.to_csv(tmp, index=False))
    atomic_write_text(out_dir / "problems.json", json.dumps(problems, indent=1))
    return atomic_write_text(out_dir / "report.html", page)
