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
from dataclasses import dataclass
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
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.5rem .8rem} .note.bad{border-left-color:#b00020;font-weight:400}
.bad td{color:#b00020} code{background:#f4f4f4;padding:0 .2rem}
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
    if row.get("method") == complexity.MODEL:
        return "model (predicted, not fitted)"
    if math.isnan(row["exponent"]):
        return f"n/a ({row['note']})" if row.get("note") else "n/a"
    hi = "inf" if math.isinf(row["ci_high"]) else f"{row['ci_high']:.2f}"
    lo = "-inf" if math.isinf(row["ci_low"]) else f"{row['ci_low']:.2f}"
    text = f"{row['exponent']:.2f} [{lo}, {hi}] R²={row['r2']:.3f} (L {row['L_min']:.0f}-{row['L_max']:.0f}, {row['n']:.0f} points)"
    if row.get("outliers"):
        text += f", outliers {row['outliers']}"
    return f"{text}: inconclusive ({row['note']})" if row.get("verdict") == "inconclusive" else text


def exponent_summary(fits: pd.DataFrame) -> pd.DataFrame:
    """Variant rows with fitted time and memory exponents, how each was obtained, declared ones, and a verdict."""
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
                row[f"{label} exponent [95% CI]"], row[f"{label} method"], row[f"declared {label}"] = "", "", ""
                continue
            r = sub.iloc[-1]
            row[f"{label} exponent [95% CI]"] = _fmt_fit(r)
            row[f"{label} method"] = r.get("method", "")
            row[f"declared {label}"] = "" if math.isnan(r["declared"]) else f"{r['declared']:g}"
            if r["verdict"] in ("steeper", "shallower"):
                flags.append(f"{label} {r['verdict']} than declared")
            elif r["verdict"] == "inconclusive":
                flags.append(f"{label} inconclusive")
            elif r["verdict"] == "matches":
                flags.append(f"{label} matches")
        row["verdict"] = "; ".join(flags) or "nothing fitted"
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
        ("cases", ", ".join(f"{k} {v}" for k, v in frame.loc[frame["metric"] == "time", "status"].value_counts().items()) or "none"),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


@dataclass(frozen=True)
class ReportOutcome:
    """What :func:`make_report` wrote and what it could not use."""

    page: Path  # report.html
    rows: int  # tidy rows loaded (0: nothing could be loaded; the page then explains why)
    problems: tuple[str, ...]  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...]  # facts worth knowing that are not faults (e.g. incomplete runs)


def build_report(sources: Iterable[str | Path], out_dir: str | Path, title: str = "attnbench report") -> Path:
    """Load ``sources`` (asv results dirs and/or run dirs), analyse, draw, and write the report.

    Returns:
        Path of ``report.html`` inside ``out_dir`` (which also receives ``figures/``,
        ``tidy.csv``, ``fits.csv`` and ``problems.json``). :func:`make_report` also says what loaded.
    """
    return make_report(sources, out_dir, title).page


def _headline(frame: pd.DataFrame, fits: pd.DataFrame) -> str:
    if frame.empty:
        return '<p class="bad">Nothing could be loaded: there are no measurements to show (the reasons are listed above).</p>'
    tone, text = complexity.headline(fits)
    return f'<p class="{tone}">{html.escape(text)}</p>'


def _wrong_section(frame: pd.DataFrame) -> str:
    wrong = frame[(frame["status"] == "wrong") & (frame["metric"] == "time")]
    if wrong.empty:
        return ""
    cols = ["source", "machine", "commit", "variant", "seq_len", "device", "mode", "dtype", "mask", "reason"]
    return ('<h2 class="bad">Wrong results: cases that failed the correctness gate</h2>'
            '<p class="bad">These cases produced output outside their tolerance. They are left out of the fits, '
            'crossovers, rankings and speedup figures; their timings are not claims.</p>'
            f'<div class="bad">{_table(wrong[cols].drop_duplicates())}</div>')


def make_report(sources: Iterable[str | Path], out_dir: str | Path, title: str = "attnbench report") -> ReportOutcome:
    """:func:`build_report`, returning what loaded and what could not be used."""
    sources = [str(s) for s in sources]
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    frame = load(sources)
    problems = list(frame.attrs.get("problems", []))
    notes = list(frame.attrs.get("notes", []))
    fits = complexity.fit_table(frame) if len(frame) else pd.DataFrame()
    sections: list[str] = []

    figures: list[tuple[str, str, plt.Figure | None]] = []
    if len(frame):
        figures += [
            ("time", "Time per call vs L (log-log). Dashed: O(n) and O(n²) through the shortest length. Red crosses: wrong results (failed the correctness gate).", plots.scaling(frame, "time")),
            ("memory", "Peak tensor memory above the inputs vs L: dense variants climb at O(n²), chunked/SDPA/linear at O(n). "
                       "A series labelled <em>(model)</em> is the analytic prediction, not a measurement.", plots.scaling(frame, "peak_tensor_bytes")),
            ("gflops", "Achieved GFLOP/s on executed FLOPs; dotted line: this machine's fp32 matmul peak.", plots.gflops(frame)),
            ("speedup_loop", "Speedup over the Python-loop baseline (where both ran and were correct).", plots.speedup_heatmap(frame, "loop")),
            ("speedup_batched", "Speedup over the bmm baseline (correct cases only).", plots.speedup_heatmap(frame, "batched")),
            ("accuracy", "Approximate variants: error against exact softmax attention vs time.", plots.error_vs_time(frame)),
            ("history", "History over commits (asv results with several commits).", plots.history(frame)),
            ("machines", "Side by side per machine.", plots.machines(frame)),
        ]
    nw_fig, nw = plots.nadaraya_watson()
    figures += [
        ("nadaraya_watson", f"Nadaraya-Watson kernel regression through the <code>dot</code> variant. Test MSE non-parametric {nw['nonparametric_test_mse']:.3f}, parametric {nw['parametric_test_mse']:.3f} (learned w = {nw['learned_w']:.2f}).", nw_fig),
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
    doc = complexity.__doc__.split(chr(10) + chr(10))[1]
    sections.append("<h2>Fitted exponents: the O(n²) claim in numbers</h2>"
                    + _headline(frame, fits) + f"<p>{_rst_to_html(doc)}</p>" + _table(summary))
    wrong = _wrong_section(frame)
    if wrong:
        sections.append(wrong)
    sections.append("<h2>Figures</h2>" + "".join(figure_html))
    if len(frame):
        sections.append("<h2>Crossovers</h2><p>Smallest length from which a variant stays faster (or smaller) than the baseline at every longer length measured; ratio = baseline / variant at the longest common length. Measured, correct cases only (no wrong cases, no model values).</p>"
                        "<h3>time</h3>" + _table(complexity.crossovers(frame, metric="time"))
                        + "<h3>peak tensor memory</h3>" + _table(complexity.crossovers(frame, metric="peak_tensor_bytes")))
        sections.append("<h2>Largest length within budget</h2>" + _table(complexity.largest_length(frame)))
        sections.append("<h2>Memory model: predicted vs measured</h2><p>Measurements only (method profiler / cuda): "
                        "cases whose memory was itself the model's prediction are not compared with it.</p>"
                        + _table(complexity.memory_model(frame)))
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
    if notes:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        sections.insert(0, f'<div class="note"><strong>Notes:</strong><ul>{items}</ul></div>')
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems)
        sections.insert(0, f'<div class="note bad"><strong>Some inputs could not be read and were skipped:</strong><ul>{items}</ul></div>')
    sections.append("<h2>Reproduce</h2><p>Sweep and report: <code>attnbench run</code>; from asv results: "
                    "<code>asv run</code> then <code>attnbench report --from .asv/results</code>. "
                    "Tidy data: <code>tidy.csv</code>; fits: <code>fits.csv</code> (beside this page); "
                    "inputs that could not be used: <code>problems.json</code>.</p>")

    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1><p>generated {generated}</p>"
            f"{_header(frame, sources)}{''.join(sections)}</body></html>")
    atomic_write(out_dir / "tidy.csv", lambda tmp: frame.to_csv(tmp, index=False))
    atomic_write(out_dir / "fits.csv", lambda tmp: fits.to_csv(tmp, index=False))
    atomic_write_text(out_dir / "problems.json", json.dumps({"problems": problems, "notes": notes}, indent=1))
    path = atomic_write_text(out_dir / "report.html", page)
    return ReportOutcome(page=path, rows=len(frame), problems=tuple(problems), notes=tuple(notes))
