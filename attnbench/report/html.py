"""The render step: one self-contained HTML page, plus its figures and tidy table as files.

The page embeds its figures as data URIs and makes no network requests; the figures are also
written as PNG and SVG files and the tidy table as CSV, all atomically. This is the render step of
load -> analyse -> render (:mod:`attnbench.analysis.summary` loads and analyses).

The page is a list of sections, each a small function of a :class:`Page` (the analysis, where
figures go, the scope sentence) that returns its HTML, or "" when it has nothing to show:
:data:`BODY` (the story, visible: findings, the headline figure, the families, crossovers, prefill
vs decode, the roofline, the exponents, wrong results, comparisons) then :data:`DETAILS` (collapsed
``<details>``: full tables, provenance, environment, problems). Columns that hold one value on every
row are lifted into the table's caption.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from attnbench import contract
from attnbench import demos as teaching
from attnbench.analysis import changes, complexity, growth
from attnbench.analysis.summary import Analysis, provenance, short_hash
from attnbench.analysis.text import fmt, sig
from attnbench.contract import FAMILIES, PROGRESSION, Basis, GateVerdict, Status
from attnbench.io import atomic_write, atomic_write_text
from attnbench.report import plots

CSS = (
    "\n"
    "body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem auto;"
    "max-width:1200px;color:#222;line-height:1.4;padding:0 1rem}\n"
    "h1{margin:.2rem 0 .1rem;font-size:1.6rem} "
    "h2{border-bottom:2px solid #ddd;padding-bottom:.15rem;margin:1.6rem 0 .5rem;"
    "font-size:1.25rem}\n"
    ".sub{color:#555;font-size:.9rem;margin:.1rem 0 .5rem}\n"
    "table{border-collapse:collapse;font-size:.82rem;margin:.4rem 0} "
    "th,td{border:1px solid #ddd;padding:.2rem .45rem;text-align:right;white-space:nowrap}\n"
    ".tw{overflow-x:auto;max-width:100%} "
    "td.wrap{white-space:normal;min-width:9rem;text-align:left}\n"
    "th{background:#f4f4f4;white-space:normal;vertical-align:bottom} "
    "td:first-child,th:first-child{text-align:left} table.sortable th{cursor:pointer}\n"
    "table.sortable th:hover{background:#e8e8e8} "
    "caption{caption-side:bottom;text-align:left;font-size:.78rem;color:#666;padding-top:.2rem}\n"
    ".meta td{text-align:left;white-space:normal} figure{margin:.5rem 0} "
    "figure img{max-width:100%;height:auto;border:1px solid #eee}\n"
    "figure.head img{max-height:400px} .row{display:flex;gap:1rem;align-items:flex-start} "
    ".row figure{flex:1;min-width:0}\n"
    "figcaption{font-size:.8rem;color:#555} .bad{color:#b00020;font-weight:600} "
    ".good{color:#1b5e20}\n"
    ".note{background:#fff8e1;border-left:4px solid #ffb300;padding:.3rem .8rem;margin:.4rem 0;"
    "font-size:.88rem}\n"
    ".note.bad{border-left-color:#b00020;font-weight:400} .note ul{margin:.2rem 0}\n"
    ".bad td{color:#b00020} code{background:#f4f4f4;padding:0 .2rem}\n"
    "ol.findings{margin:.3rem 0 .6rem;padding-left:1.4rem;font-size:.95rem} "
    "ol.findings li{margin:.15rem 0}\n"
    "details{margin:.3rem 0;border:1px solid #e4e4e4;border-radius:4px;padding:.2rem .6rem}\n"
    "details>summary{cursor:pointer;font-weight:600;padding:.15rem 0} "
    "details[open]>summary{margin-bottom:.3rem}\n"
)

SORT_JS = (
    "\n"
    "document.querySelectorAll('table.sortable th').forEach(function(th){"
    "th.addEventListener('click',function(){\n"
    "var t=th.closest('table'),b=t.tBodies[0],"
    "i=Array.prototype.indexOf.call(th.parentNode.children,th);\n"
    "var d=th.dataset.dir=th.dataset.dir==='asc'?'desc':'asc';\n"
    "function v(r){var c=r.children[i];var s=c.dataset.v!==undefined?c.dataset.v:c.textContent;"
    "var n=parseFloat(s);return isNaN(n)?s:n;}\n"
    "Array.prototype.slice.call(b.rows).sort(function(x,y){var p=v(x),q=v(y);\n"
    "var r=(typeof p==='number'&&typeof q==='number')?p-q:String(p).localeCompare(String(q));"
    "return d==='asc'?r:-r;})\n"
    ".forEach(function(r){b.appendChild(r);});});});\n"
)


# ---- small HTML helpers ----------------------------------------------------------------------
def _fig_to_files(fig: plt.Figure, stem: Path) -> str:
    """Save PNG and SVG beside each other (atomically); return the PNG as a data URI."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=110, bbox_inches="tight")
    png = buffer.getvalue()
    atomic_write(stem.with_suffix(".png"), lambda tmp: Path(tmp).write_bytes(png))
    atomic_write(
        stem.with_suffix(".svg"), lambda tmp: fig.savefig(tmp, format="svg", bbox_inches="tight")
    )
    plt.close(fig)
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _rst_to_html(text: str) -> str:
    """Escape a paragraph of reStructuredText and render its ``literals`` and *emphasis*.

    The paragraph is one such as :data:`complexity.FIT_RULE`; line breaks are spaces.
    """
    out = html.escape(text.replace("\n", " "))
    out = re.sub(r"``(.+?)``", r"<code>\1</code>", out)
    return re.sub(r"\*(\w[^*]*?)\*", r"<em>\1</em>", out)


def lift_constants(
    df: pd.DataFrame,
    keep: Sequence[str] = (),
    formats: dict[str, Callable[[object], str]] | None = None,
) -> tuple[pd.DataFrame, dict[str, str]]:
    """Drop the columns that hold one value on every row; return them as ``{column: value}``.

    Args:
        df: the table to show.
        keep: columns never lifted (e.g. the row label).
        formats: per-column formatters: a column is constant when its *shown* text is (dates to the
            minute).

    Returns:
        The table without its constant columns, and those columns' single values (as text).
    """
    if df is None or len(df) < 2:
        return df, {}
    constants = {}
    for col in df.columns:
        if col in keep:
            continue
        show = (formats or {}).get(col, str)
        values = df[col].map(
            lambda v, show=show: (
                "" if v is None or (not isinstance(v, str) and pd.isna(v)) else show(v)
            )
        )
        if values.nunique(dropna=False) == 1:
            constants[col] = values.iloc[0]
    return df.drop(columns=list(constants)), {
        k: v for k, v in constants.items() if v not in ("", "nan", "NaT")
    }


COUNT_COLUMN = re.compile(
    r"(^|[_ ])(L|Lq|Lk|seq_len|seq_len_k|batch|heads|head_dim|kv_heads|n|cases|runs|attempts)$"
    r"|(^|_)L(_|$)|^L=|^cases"
)
"""Columns of a length, a count or a batch: printed exactly (1024, never 1,020), any dtype."""


def exact_integer(value: object) -> str:
    """An integral number as its digits (a float length: ``1024.0`` -> ``1024``); else as text."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return str(value)
    return str(int(value)) if float(value).is_integer() else sig(float(value))


WRAP_AT = 32  # characters of a cell's text beyond which it wraps


def _cell(value: object, formatter: Callable[[object], str] | None) -> str:
    if (
        value is None
        or (isinstance(value, float) and math.isnan(value))
        or value is pd.NA
        or value is pd.NaT
    ):
        return "<td></td>"
    if formatter is not None:
        text = formatter(value)
    elif isinstance(value, float):
        text = sig(value)
    elif isinstance(value, pd.Timestamp):
        text = f"{value:%Y-%m-%d %H:%M}"
    else:
        text = str(value)
    sort = (
        f' data-v="{html.escape(repr(float(value)))}"'
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else ""
    )
    # a sentence (a reason, a verdict) wraps: the table stays on the page
    wrap = ' class="wrap"' if len(text) > WRAP_AT or "; " in text else ""
    return f"<td{sort}{wrap}>{html.escape(text)}</td>"


def _table(
    df: pd.DataFrame | None,
    max_rows: int = 400,
    formats: dict[str, Callable[[object], str]] | None = None,
    keep: Sequence[str] = (),
    lift: bool = True,
    css: str = "",
) -> str:
    """A sortable table; constant columns are lifted into its caption (``lift``)."""
    if df is None or df.empty:
        return "<p><em>nothing to show</em></p>"
    if "commit" in df:  # short hashes on the page; the full ones are in tidy.csv
        df = df.assign(
            commit=df["commit"].map(lambda c: short_hash(c) if isinstance(c, str) else c)
        )
    formats = {
        **{c: exact_integer for c in df.columns if COUNT_COLUMN.search(str(c))},
        **(formats or {}),
    }
    shown, constants = lift_constants(df, keep, formats) if lift else (df, {})
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    for rec in shown.head(max_rows).itertuples(index=False):
        body.append(
            "<tr>"
            + "".join(_cell(v, formats.get(c)) for c, v in zip(shown.columns, rec, strict=True))
            + "</tr>"
        )
    caption = ""
    parts = [f"{k}: {v}" for k, v in constants.items()]
    if len(df) > max_rows:
        parts.append(f"{len(df) - max_rows} more rows in the CSV")
    if parts:
        caption = f"<caption>Same on every row: {html.escape('; '.join(parts))}</caption>"
    return (
        f'<div class="tw"><table class="sortable {css}">{caption}<thead><tr>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></div>"
    )


def _details(summary: str, body: str, open_: bool = False, ident: str = "") -> str:
    attr = f' id="{ident}"' if ident else ""
    return f"<details{attr}{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


def _html_page(title: str, body: str, generated: str) -> str:
    """A whole page: ``title`` as its title and heading, then ``body``.

    After the body come the time it was ``generated`` and the script that sorts its tables.
    """
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}"
        f'<p class="sub">generated {generated}</p><script>{SORT_JS}</script></body></html>'
    )


def _when(stamp: object) -> str:
    return (
        f"{stamp:%Y-%m-%d %H:%M} UTC"
        if isinstance(stamp, pd.Timestamp) and not pd.isna(stamp)
        else ""
    )


# ---- the page ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportOutcome:
    """What :func:`attnbench.reporting.make_report` wrote and what it could not use."""

    page: Path  # report.html
    rows: int  # tidy rows loaded (0: nothing could be loaded; the page then explains why)
    problems: tuple[str, ...]  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...]  # facts worth knowing that are not faults (e.g. incomplete runs)


@dataclass(frozen=True)
class Page:
    """What every section reads: the analysis, where figures go, whether to draw the demos."""

    analysis: Analysis
    fig_dir: Path  # figures/<name>.png and .svg
    demos: bool = False  # draw the teaching demos (they train and compute on every build)

    @property
    def frame(self) -> pd.DataFrame:
        return self.analysis.loaded.frame

    @property
    def scope(self) -> str:
        """The sentence closing a figure's caption when the page compares several runs."""
        primary = self.analysis.primary
        if len(self.frame) and len(self.analysis.sides) > 1 and primary:
            return f" Shown for {html.escape(primary['side'])}; the other runs are compared below."
        return ""

    def figure(self, name: str, fig: plt.Figure | None, caption: str, css: str = "") -> str:
        """The figure ``fig-<name>`` (PNG, SVG beside the page) and its caption; "" for none."""
        return _figure(self.fig_dir, name, fig, caption, css)


def _figure(fig_dir: Path, name: str, fig: plt.Figure | None, caption: str, css: str = "") -> str:
    """:meth:`Page.figure` for any folder of figures (the history page has no :class:`Page`)."""
    if fig is None:
        return ""
    uri = _fig_to_files(fig, fig_dir / name)
    return (
        f'<figure id="fig-{name}" class="{css}"><img alt="{name}" src="{uri}">'
        f"<figcaption>{caption} (<code>figures/{name}.png</code>, <code>.svg</code>)"
        "</figcaption></figure>"
    )


def _code(text: str) -> str:
    """Escape, then turn `name` into <code>name</code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _cards(frame: pd.DataFrame) -> str:
    """The GPUs the CUDA rows ran on ("" when none ran on CUDA), with their driver and clocks."""
    if "gpu" not in frame or "device" not in frame:
        return ""
    names = sorted(
        {
            str(v)
            for v in frame.loc[frame["device"].astype(str).str.startswith("cuda"), "gpu"].dropna()
            if str(v)
        }
    )
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")


def _subtitle_bits(frame: pd.DataFrame, c: dict[str, str]) -> list[str]:
    """Where and when: machine, torch, threads, commits, run dates."""
    bits = []
    if "machine" in c:
        cpu = ", ".join(sorted({str(v) for v in frame["cpu"].dropna() if str(v)}))[:60]
        bits.append(
            f"Measured on <b>{html.escape(c['machine'])}</b>"
            + (f" ({html.escape(cpu)})" if cpu else "")
        )
    if "torch" in c:
        bits.append(f"torch {html.escape(c['torch'])}")
    cards = _cards(frame)
    if cards:  # a GPU run: the card decides its numbers, not the host's threads
        bits.append(f"on {html.escape(cards)}")
    elif "threads" in c:
        bits.append(f"{float(c['threads']):g} thread{'s' if float(c['threads']) != 1 else ''}")
    commits = sorted({short_hash(v) for v in frame["commit"].dropna() if v})
    if commits:
        shown = ", ".join(f"<code>{c}</code>" for c in commits[:4]) + (
            f" and {len(commits) - 4} more" if len(commits) > 4 else ""
        )
        bits.append(f"commit{'s' if len(commits) > 1 else ''} {shown}")
    dates = frame["run_date"].dropna() if "run_date" in frame else pd.Series(dtype=object)
    if len(dates):
        lo, hi = dates.min(), dates.max()
        bits.append(
            f"run {lo:%Y-%m-%d %H:%M}"
            + (f" to {hi:%Y-%m-%d %H:%M}" if hi - lo > pd.Timedelta(minutes=1) else "")
            + " UTC"
        )
    return bits


def _subtitle(analysis: Analysis) -> str:
    frame, c = analysis.loaded.frame, analysis.constants
    if frame.empty:
        return ""
    shape = [f"{c[k]}" for k in ("device", "dtype", "mode") if k in c]
    letters = {"batch": "B", "heads": "H", "kv_heads": "Hkv", "head_dim": "D"}
    shared = [
        f"{letter}={c[k]}"
        for k, letter in letters.items()
        if k in c and not (k == "kv_heads" and c[k] == c.get("heads"))
    ]
    shape += [" ".join(shared)] if shared else []
    if "mask" in c:
        shape.append(f"mask {c['mask']}")
    varying = [
        letter
        for k, letter in letters.items()
        if k not in c and k in frame and frame[k].notna().any()
    ]
    varying += [
        k for k in ("device", "dtype", "mode", "mask", "workload") if k not in c and k in frame
    ]
    time_rows = frame[frame["metric"] == "time"]
    counts = ", ".join(f"{v} {k}" for k, v in time_rows["status"].value_counts().items())
    line = ", ".join(_subtitle_bits(frame, c)) + "."
    if shape:
        line += f" Every case: {html.escape(', '.join(shape))}."
    if varying:
        line += f" Varying between cases: {html.escape(', '.join(varying))} (never pooled)."
    line += f" {len(time_rows)} cases ({html.escape(counts)})."
    return f'<p class="sub">{line}</p>'


def _inputs_notes(analysis: Analysis) -> str:
    """The problems with the inputs (the first five) and the notes, above everything else."""
    problems, notes, top = analysis.loaded.problems, analysis.loaded.notes, []
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems[:5])
        more = (
            (
                f"<li>... and {len(problems) - 5} more (Problems, below; "
                "<code>problems.json</code>)</li>"
            )
            if len(problems) > 5
            else ""
        )
        top.append(
            '<div class="note bad"><strong>Inputs that could not be read or used (left out of '
            f"the figures, fits and tables):</strong><ul>{items}{more}</ul></div>"
        )
    if notes:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        top.append(f'<div class="note"><strong>Notes:</strong><ul>{items}</ul></div>')
    return "".join(top)


# ---- the story (visible) ------------------------------------------------------------------------
def _findings(page: Page) -> str:
    analysis = page.analysis
    if not analysis.findings:
        return ""
    where = analysis.primary
    scope = ", ".join(f"{where[k]}" for k in ("device", "mode", "dtype") if k in where)
    items = "".join(
        f'<li>{_code(f.text)} <a href="#{f.target}">[figure]</a></li>'
        if f.target.startswith("fig")
        else f'<li>{_code(f.text)} <a href="#{f.target}">[details]</a></li>'
        for f in analysis.findings
    )
    return (
        '<section id="findings"><h2 style="margin-top:.6rem">Findings</h2>'
        f'<ol class="findings">{items}</ol>'
        f'<p class="sub">Read from {html.escape(scope)} cases that ran correctly (status ok); '
        "noisy, wrong and failed cases are never ranked; exponents are quoted only from "
        "conclusive fits.</p></section>"
    )


def headline_variants(frame: pd.DataFrame) -> tuple[str, ...]:
    """The headline's lines: the progression, then each forced fused backend that ran on CUDA.

    On a GPU the fused backends (FlashAttention, memory-efficient, cuDNN) are what decides, and a
    train run may hold no ``sdpa`` at all; on CPU ``sdpa`` already runs the flash kernel.
    """
    ran = frame[
        (frame["metric"] == "time")
        & (frame["status"] == Status.OK)
        & frame["device"].astype(str).str.startswith("cuda")
    ]
    fused = [v for v in FAMILIES["fused"] if v not in PROGRESSION and v in set(ran["variant"])]
    return (*PROGRESSION, *fused)


def _progression(page: Page) -> str:
    variants = headline_variants(page.analysis.main)
    extra = variants[len(PROGRESSION) :]
    caption = (
        "The teaching progression ("
        + " → ".join(PROGRESSION)
        + (f", and the fused backends that ran: {', '.join(extra)}" if extra else "")
        + "): median time per call and peak tensor memory above the inputs vs L, log-log, "
        "forward. Each line's end says its fitted slope (a conclusive Theil-Sen fit) or that the "
        "fit is inconclusive; dotted memory is the analytic model, not a measurement." + page.scope
    )
    return page.figure(
        "progression",
        plots.progression(page.analysis.main, page.analysis.main_fits, variants),
        caption,
        css="head",
    )


def _families(page: Page) -> str:
    main = page.analysis.main
    figures = page.figure(
        "time",
        plots.scaling(main, "time"),
        "Time per call vs L, one panel per family (dense, fused SDPA, blockwise, linear, scoring "
        "functions, compiled), lines labelled at their end. Dashed grey: O(n) and O(n²) through "
        "the shortest length. Red crosses: wrong results; hollow circles in a variant's colour: "
        "its noisy measurements (neither is a fact); bars: the interquartile range of the timing "
        "blocks." + page.scope,
    ) + page.figure(
        "memory",
        plots.scaling(main, "peak_tensor_bytes"),
        "Peak tensor memory above the inputs vs L: dense variants climb at O(n²), "
        "chunked/SDPA/linear at O(n). Dotted series labelled <em>(model)</em> are the analytic "
        "prediction, not a measurement.",
    )
    return '<h2 id="families">The families</h2>' + figures if figures else ""


def _crossovers(page: Page) -> str:
    pick = page.analysis.primary
    setting = html.escape(", ".join(str(pick.get(k, "")) for k in ("device", "mode", "dtype")))
    cross = page.figure(
        "crossovers",
        plots.crossover_matrix(page.analysis.primary_crossovers),
        "Crossovers, variant x baseline. Cell: from which L the variant stays faster (time) or "
        "smaller (peak tensor memory) than the baseline at every longer measured L, and "
        "baseline / variant at the longest common L; colour: that ratio on a log scale centred "
        "at 1x (blue: better than the baseline). Measured, correct cases only (no wrong, noisy "
        f"or model values). {setting} cases{page.scope}",
    )
    return '<h2 id="crossovers-h">Crossovers</h2>' + cross if cross else ""


def _prefill_decode(page: Page) -> str:
    """The prefill vs decode section: only when decode cases ran."""
    frame = page.analysis.machine
    if (
        "workload" not in frame
        or not ((frame["workload"] == "decode") & (frame["status"] == Status.OK)).any()
    ):
        return ""
    fig = page.figure(
        "prefill_decode",
        plots.prefill_vs_decode(frame, page.analysis.machine_fits),
        "Left: decode, time per generated token (one query row) vs the context length Lk it "
        "attends to, declared O(L) per token. Right: prefill, time per call vs L = Lq = Lk, "
        "declared O(L²). Log-log; each line's end says its fitted slope when the Theil-Sen fit "
        "is conclusive.",
    )
    return f'<section id="prefill-decode"><h2>Prefill vs decode</h2>{fig}</section>' if fig else ""


def roofline_caption(workloads: set[str]) -> str:
    """The roofline's caption, naming only the point shapes it draws."""
    shapes = {
        "prefill": "circles: prefill (Lq = Lk)",
        "decode": "triangles: decode (one query over a KV cache)",
    }
    drawn = "; ".join(text for w, text in shapes.items() if w in workloads)
    return (
        (
            "Arithmetic intensity (executed FLOPs per byte an ideal kernel moves: q, k, v read "
            "and the output written once) against achieved GFLOP/s, log-log, under the roofs "
            "measured on the same machine: the matmul peak (compute) and STREAM triad bandwidth "
            f"x intensity (memory). {drawn[0].upper() + drawn[1:]}. Colour: the variant's "
            "family. Correct, undisturbed measurements only."
        )
        if drawn
        else ""
    )


def _roof_note(table: pd.DataFrame) -> str:
    roofs = table.dropna(subset=["peak_gflops"]).drop_duplicates(["machine", "device", "dtype"])

    def roof(r: dict) -> str:
        matmul = fmt(float(r["peak_gflops"]), "GFLOP/s")
        triad = (
            f"triad {fmt(float(r['peak_gbps']), 'GB/s')}"
            if r["peak_gbps"] == r["peak_gbps"]
            else "bandwidth not recorded"
        )
        return f"{r['machine']} {r['device']} {r['dtype']}: matmul {matmul}, {triad}"

    named = "; ".join(roof(r) for r in roofs.to_dict("records"))
    return (
        "<p>Roofs: "
        + html.escape(named or "not recorded")
        + ". The binding roof is the lower of the "
        "two at the case's intensity; <code>attnbench peak</code> measures both (asv results "
        "record no bandwidth).</p>"
    )


def _roofline(page: Page) -> str:
    """The roofline figure and, collapsed under it, each case's % of its binding roof ("": none)."""
    table = page.analysis.roofline
    fig = page.figure(
        "roofline",
        plots.roofline(table),
        roofline_caption(set(table["workload"]) if len(table) else set()),
    )
    if not fig:
        return ""
    placed = table[table["ai"].notna()].copy()
    placed["L"] = placed["seq_len"].where(placed["workload"] == "prefill", placed["seq_len_k"])
    shown = placed[
        [
            "machine",
            "device",
            "dtype",
            "mode",
            "workload",
            "variant",
            "seq_len",
            "L",
            "ai",
            "gflops",
            "gbps",
            "bound",
            "pct_of_roof",
            "pct_of_compute",
            "pct_of_bandwidth",
        ]
    ].rename(
        columns={
            "seq_len": "Lq",
            "ai": "FLOP/byte",
            "gflops": "achieved",
            "gbps": "moved",
            "bound": "binding roof",
            "pct_of_roof": "% of binding roof",
            "pct_of_compute": "% of compute",
            "pct_of_bandwidth": "% of bandwidth",
        }
    )
    pct = lambda v: f"{sig(float(v))}%"  # noqa: E731
    formats = {
        "achieved": lambda v: fmt(float(v), "GFLOP/s"),
        "moved": lambda v: fmt(float(v), "GB/s"),
        "% of binding roof": pct,
        "% of compute": pct,
        "% of bandwidth": pct,
    }
    return (
        '<section id="roofline-s"><h2>Roofline: prefill and decode against the measured roofs</h2>'
        + fig
        + _details(
            f"% of the binding roof per case ({len(shown)})",
            _roof_note(table) + _table(shown, formats=formats, keep=("variant",)),
        )
        + "</section>"
    )


def _headline(frame: pd.DataFrame, headline: tuple[str, str]) -> str:
    if frame.empty:
        return (
            '<p class="bad">Nothing could be loaded: there are no measurements to show '
            "(the reasons are listed above).</p>"
        )
    tone, text = headline
    head, sep, rest = text.partition("; inconclusive: ")
    if not sep:
        return f'<p class="{tone}">{html.escape(text)}</p>'
    items = rest.rstrip(".").split("), ")
    listed = "".join(f"<li>{html.escape(i if i.endswith(')') else i + ')')}</li>" for i in items)
    return f'<p class="{tone}">{html.escape(head)}; {len(items)} inconclusive.</p>' + _details(
        f"Inconclusive fits ({len(items)}) and why", f"<ul>{listed}</ul>"
    )


def _exponents(page: Page) -> str:
    fits = page.analysis.fits
    caveat = (
        f'<p class="sub">{html.escape(COUNTS_CAVEAT)}</p>'
        if len(fits) and (fits["metric"] == "instructions").any()
        else ""
    )
    return (
        '<section id="exponents"><h2>Fitted exponents: the O(n²) claim in numbers</h2>'
        + _headline(page.frame, page.analysis.headline)
        + _table(page.analysis.summary, keep=("variant",))
        + caveat
        + _details("How the exponents are fitted", f"<p>{_rst_to_html(complexity.FIT_RULE)}</p>")
        + "</section>"
    )


def _wrong(page: Page) -> str:
    frame = page.frame
    wrong = frame[(frame["status"] == Status.WRONG) & (frame["metric"] == "time")]
    if wrong.empty:
        return ""
    cols = [
        "origin",
        "machine",
        "commit",
        "variant",
        "seq_len",
        "device",
        "mode",
        "dtype",
        "mask",
        "reason",
    ]
    wrong = (
        wrong[[c for c in cols if c in wrong]]
        .drop_duplicates()
        .assign(commit=lambda d: d["commit"].map(short_hash))
    )
    return (
        '<h2 class="bad">Wrong results: cases that failed the correctness gate</h2>'
        '<p class="bad">These cases produced output outside their tolerance. They are left out '
        "of the fits, crossovers, rankings and speedup figures; their timings are not claims.</p>"
        f'<div class="bad">{_table(wrong, keep=("variant",))}</div>'
    )


def _ratio_table(ratios: pd.DataFrame) -> str:
    """variant x L table of the median B / A ``ratio``."""
    table = ratios.pivot_table(index="variant", columns="seq_len", values="ratio", aggfunc="median")
    table.columns = [f"L={c}" for c in table.columns]
    table = table.reset_index()
    fmt_x = {c: (lambda v: fmt(float(v), "x")) for c in table.columns if c != "variant"}
    return _table(table, formats=fmt_x, lift=False)


def _comparison_ratios(page: Page) -> list[str]:
    out = []
    for k, comp in enumerate(page.analysis.comparisons):
        out.append(
            page.figure(
                f"comparison_{k + 1}",
                plots.comparison(comp.ratios, comp.label_a, comp.label_b),
                f"Time of {html.escape(comp.label_b)} / {html.escape(comp.label_a)} for every "
                "case both ran correctly (log scale centred at 1x; timings on a shared machine "
                "are noisy).",
            )
        )
        b_over_a = f"{html.escape(comp.label_b)} / {html.escape(comp.label_a)}"
        # an empty ratio table is no section: the cases both sides ran correctly are none
        if len(comp.ratios):
            out.append(
                f"<p>Time ratio {b_over_a} (below 1x: {html.escape(comp.label_b)} is faster):</p>"
                + _ratio_table(comp.ratios)
            )
        if len(comp.memory):
            out.append(
                f"<p>Peak tensor memory ratio {b_over_a} (measured bytes above the inputs; below "
                f'1x: {html.escape(comp.label_b)} needs less; predicted "model" values are not '
                "compared):</p>" + _ratio_table(comp.memory)
            )
    return out


def _comparison(page: Page) -> str:
    sides = page.analysis.sides
    out = []
    if len(sides) > 1:
        out.append(
            "<p>What was compared (run dates are when the measurements ran; commit dates are "
            "asv's):</p>"
            + _table(sides, keep=("side",), formats={"run date": _when, "commit date": _when})
        )
    out += _comparison_ratios(page)
    out.append(
        page.figure(
            "history",
            plots.history(page.frame),
            "History over commits (asv results with several commits; short hashes).",
        )
    )
    out.append(page.figure("machines", plots.machines(page.frame), "Side by side per machine."))
    body = "".join(o for o in out if o)
    return f'<section id="comparison"><h2>Comparison</h2>{body}</section>' if body else ""


def _gate_growth(page: Page) -> str:
    """The regression gate's flagged growth: per case whose predicted ratio or exponent regressed,
    BASE and HEAD on log-log axes with each side's fit extended to the target length.

    Read from the gate's verdict table beside the results (``attnbench-gate.csv``); each side is
    fitted again from its measured rows with the gate's own fitter, so the figure is the verdict's.
    """
    figures = []
    for source in page.analysis.loaded.sources:
        for rec, measured in _flagged_growth(Path(source) / contract.GATE_VERDICTS):
            label = changes.case_label({**rec, "seq_len": None})
            name = "growth_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{label} {rec['metric']}").strip("_")
            fig = plots.growth(
                measured["seq_len"].to_numpy(float),
                measured["base_value"].to_numpy(float),
                measured["head_value"].to_numpy(float),
                int(rec["at_length"]),
                str(rec["metric"]),
                f"{label}: {rec['metric']}",
            )
            caption = f"{html.escape(label)}, {html.escape(str(rec['metric']))}: {rec['reason']}."
            figures.append(page.figure(name, fig, html.escape(caption, quote=False)))
    body = "".join(f for f in figures if f)
    if not body:
        return ""
    return (
        '<section id="ci"><h2>The regression gate: how cost grows</h2><p>Cases whose cost at the '
        "target length (each side's c0 + c1·L + c2·L² fitted over the measured lengths) or whose "
        "exponent of L regressed, even where every measured ratio stayed within its factor.</p>"
        f"{body}</section>"
    )


def _flagged_growth(path: Path) -> list[tuple[dict, pd.DataFrame]]:
    """The gate table's regressed ``predicted`` rows with their series' measured rows ([]: none,
    or no readable table)."""
    if not path.is_file():
        return []
    try:
        table = pd.read_csv(path)
    except (OSError, ValueError):
        return []  # frame.load_asv names an unreadable gate table among the problems
    if not {"basis", "verdict", "at_length"} <= set(table.columns):
        return []
    table = table.fillna({"mask": "none", "device": "cpu", "mode": "forward"})
    keys = ["benchmark", "variant", "device", "mode", "mask", "metric"]
    flagged = table[
        (table["basis"] == Basis.PREDICTED) & (table["verdict"] == GateVerdict.REGRESSED)
    ]
    out = []
    for rec in flagged.to_dict("records"):
        same = (table[keys] == pd.Series({k: rec[k] for k in keys})).all(axis=1)
        measured = table[same & (table["basis"] == Basis.MEASURED)].sort_values("seq_len")
        out.append((rec, measured))
    return out


def history_section(history: changes.History, fig_dir: Path) -> str:
    """A results history's steps: the table (regressions first), a figure per case, steps marked.

    ``attnbench history`` writes it as a page of its own; ``attnbench report --from`` a history
    shows the same section.
    """
    factors = ", ".join(f"{m} x{history.factors[m]:g}" for m in changes.METRICS)
    caption = (
        f"Commits in {html.escape(history.order)}. A step moves beyond the factor "
        f"({html.escape(factors)}) from the previous commit; a drift moves beyond it over at "
        f"most {history.window} commits with no single step; time is read through asv's step "
        "detection first (noise is not a step). Each case's counts, bytes and FLOPs are also "
        "fitted along L at every commit: its exponent (<code>..._exponent</code>) steps when it "
        f"moves by more than {growth.EXPONENT_THRESHOLD:g}."
    )
    figures = _history_figures(history, fig_dir)
    return (
        f'<section id="history"><h2>Steps in the history</h2>{_history_table(history, caption)}'
        + _details(
            f"History figures ({sum(1 for f in figures if f)})",
            "".join(figures),
            open_=bool(len(history.steps)),
        )
        + "</section>"
    )


def _history_table(history: changes.History, caption: str) -> str:
    """The steps as a table (regressions first) under a line counting them, then ``caption``."""
    shown, commits = changes.table(history), len(history.commits)
    if not len(shown):
        return f'<p>No step and no drift in {commits} commits.</p><p class="sub">{caption}</p>'
    regressions = len(history.regressions)
    if regressions:
        lead = (
            f'<p class="note bad">{regressions} regression(s) and {len(shown) - regressions} '
            f"improvement(s) in {commits} commits:</p>"
        )
    else:
        lead = f"<p>No regression in {commits} commits; {len(shown)} improvement(s):</p>"
    # "commit" would be cut short
    return (
        lead
        + _table(shown.rename(columns={"commit": "commit(s)"}), lift=False)
        + f'<p class="sub">{caption}</p>'
    )


def _history_figures(history: changes.History, fig_dir: Path) -> list[str]:
    """One figure per case of the history (its ``FIGURE_CASE``), its steps marked."""
    figures = []
    series, steps = history.series, history.steps
    for key, rows in series.groupby(list(changes.FIGURE_CASE), sort=True):
        case = dict(zip(changes.FIGURE_CASE, key, strict=True))
        label = changes.case_label(case)
        mine = (
            steps.loc[(steps[list(changes.FIGURE_CASE)] == pd.Series(case)).all(axis=1)]
            if len(steps)
            else steps
        )
        name = "history_" + re.sub(r"[^A-Za-z0-9]+", "_", f"{case['machine']} {label}").strip("_")
        figures.append(
            _figure(
                fig_dir,
                name,
                plots.case_history(rows, mine, history.commits, f"{label} on {case['machine']}"),
                f"{html.escape(label)} on {html.escape(str(case['machine']))}: every commit's "
                "value; steps dashed, drifts shaded (red: regression, green: improvement).",
            )
        )
    return figures


def _history(page: Page) -> str:
    history = page.analysis.history
    return "" if history is None else history_section(history, page.fig_dir)


def render_history(
    history: changes.History, out_dir: str | Path, title: str = "attnbench history"
) -> Path:
    """Write ``history.html`` (:func:`history_section` alone) and ``steps.csv``; return the page."""
    out_dir = Path(out_dir)
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    with plots.drawing():
        section = history_section(history, out_dir / "figures")
    atomic_write(out_dir / "steps.csv", lambda tmp: history.steps.to_csv(tmp, index=False))
    return atomic_write_text(out_dir / "history.html", _html_page(title, section, generated))


# ---- the details (collapsed) ---------------------------------------------------------------------
def _gflops(page: Page) -> str:
    return _details(
        "Achieved GFLOP/s and % of the matmul peak",
        page.figure(
            "gflops",
            plots.gflops(page.frame),
            "Achieved GFLOP/s on executed FLOPs; dotted line: this machine's fp32 matmul peak.",
        ),
    )


def _page_faults(page: Page) -> str:
    fig = page.figure(
        "page_faults",
        plots.scaling(page.analysis.main, "page_faults"),
        "Minor page faults per call vs L: the fresh pages a call maps (the kernel zero-fills "
        "each on first touch). Dense variants allocate new O(L²) score buffers on every call, so "
        "on a CPU part of their time is this. Fitted exponents are in the full fit table."
        + page.scope,
    )
    return _details("Page faults per call", fig) if fig else ""


COUNTS_CAVEAT = (
    "Instruction counts (valgrind's callgrind, portable kernels) do not move with a busy "
    "neighbour, so their exponents are the steadiest O(n²) evidence here; but they do not see "
    "cache misses, page faults, memory bandwidth or time spent waiting for memory or for other "
    "threads (counts are summed over threads): a change that only moves data worse is flat in "
    "counts and slower in time."
)


def _instructions(page: Page) -> str:
    fig = page.figure(
        "instructions",
        plots.scaling(page.analysis.main, "instructions"),
        "Instructions per call vs L, counted under valgrind. "
        + html.escape(COUNTS_CAVEAT)
        + page.scope,
    )
    return _details("Instruction counts per call", fig) if fig else ""


def _accuracy(page: Page) -> str:
    accuracy = page.figure(
        "accuracy",
        plots.error_vs_time(page.frame),
        "Approximate variants: error against exact softmax attention vs time, each point "
        "labelled by its L. The largest error of any single output element is shown: for "
        "<code>performer</code> it is of order 1 on standard-normal inputs, because random "
        "features estimate exp(q·k) worst where |q·k| is largest. What the correctness gate "
        "bounds is its <em>mean</em> error (the variant's declared bound), and its output is "
        "checked exactly against its own kernel.",
    )
    return _details("Accuracy of the approximate variants", accuracy) if accuracy else ""


def _speedups(page: Page) -> str:
    speedups = "".join(
        page.figure(
            f"speedup_{b}",
            plots.speedup_heatmap(page.frame, b),
            f"Speedup over <code>{b}</code> per variant and L (correct cases only; colour "
            "clipped at 1000x).",
        )
        for b in ("loop", "batched")
    )
    return _details("Speedup per variant and length (heatmaps)", speedups) if speedups else ""


def _crossover_tables(page: Page) -> str:
    tables = "".join(
        f"<h3>{m}</h3>"
        + _table(t, formats={"ratio_at_longest": lambda v: fmt(float(v), "x")}, keep=("variant",))
        for m, t in page.analysis.crossovers.items()
    )
    intro = (
        "<p>Smallest length from which a variant stays faster (or smaller) than the baseline at "
        "every longer length measured; ratio = baseline / variant at the longest common length.</p>"
    )
    return _details("Crossover tables", intro + tables)


def _largest_length(page: Page) -> str:
    return _details(
        "Largest length within budget",
        _table(page.analysis.largest, keep=("variant",)),
    )


def _memory_model(page: Page) -> str:
    mm = page.analysis.memory_model
    mib = lambda v: fmt(float(v) * 2**20, "bytes")  # noqa: E731
    ratio = lambda v: fmt(float(v), "x")  # noqa: E731
    mm_fmt = {"predicted_MiB": mib, "measured_MiB": mib, "measured/predicted": ratio}
    if len(mm):
        mm = mm.rename(columns={"predicted_MiB": "predicted", "measured_MiB": "measured"})
        mm_fmt = {"predicted": mib, "measured": mib, "measured/predicted": ratio}
    return _details(
        "Memory model: predicted vs measured",
        "<p>Measurements only (method profiler / cuda): cases whose "
        "memory was itself the model's prediction are not compared with it.</p>"
        + _table(mm, formats=mm_fmt, keep=("variant",)),
    )


def _provenance(page: Page) -> str:
    return _details(
        "SDPA kernel provenance",
        "<p>The backend each SDPA-backed case asked for, and the kernel the "
        "profiler saw run. A fallback to <code>math</code> costs O(n²) memory.</p>"
        + _table(provenance(page.frame), keep=("variant",)),
    )


def _compile_times(page: Page) -> str:
    frame = page.frame
    rows = frame[(frame["metric"] == "compile_time") & (frame["status"] == Status.OK)]
    if not len(rows):
        return ""
    cols = ["machine", "device", "variant", "seq_len", "dtype", "mode", "value"]
    return _details(
        "Compilation time (outside every timed region)",
        _table(
            rows[cols].rename(columns={"value": "compile time"}),
            formats={"compile time": lambda v: fmt(float(v), "s")},
            keep=("variant",),
        ),
    )


RUNQUEUE_CASE = (
    "origin",
    "machine",
    "device",
    "variant",
    "workload",
    "seq_len",
    "seq_len_k",
    "batch",
    "heads",
    "kv_heads",
    "head_dim",
    "dtype",
    "mode",
    "mask",
)
"""The tidy columns that name one case of the run-queue table."""


def _runqueue(page: Page) -> str:
    """How much a neighbour had the timing thread's core per case (runs that read the wait)."""
    frame = page.frame
    waited = frame[frame["metric"] == "waited_blocks"]
    if not len(waited):
        return ""
    keys = [c for c in RUNQUEUE_CASE if c in frame]
    share = frame[frame["metric"] == "runqueue_share"][[*keys, "value"]].rename(
        columns={"value": "median block's wait"}
    )
    status = frame[frame["metric"] == "time"][[*keys, "status"]]
    table = (
        waited[[*keys, "value"]]
        .rename(columns={"value": "blocks that waited"})
        .merge(share, on=keys, how="left")
        .merge(status, on=keys, how="left")
    )
    percent = {
        "blocks that waited": lambda v: f"{float(v):.0%}",
        "median block's wait": lambda v: f"{float(v):.0%}",
    }
    intro = (
        "<p>The share of each case's timed blocks that waited for a core over 10% of their wall "
        "time (another process had it: each such block was dropped and timed again), and the "
        "median block's wait per wall second, from Linux's scheduler figures of the timing "
        "thread. A case is <code>noisy</code> when too few undisturbed blocks were left within "
        "its retry budget.</p>"
    )
    return _details(
        "Run-queue wait per case", intro + _table(table, formats=percent, keep=("variant",))
    )


def _commits(page: Page) -> str:
    frame = page.frame
    commits = (
        frame[frame["commit"] != ""]
        .groupby("commit")
        .agg(commit_date=("date", "min"), run_date=("run_date", "min"))
    )
    if len(commits) <= 1:
        return ""
    commits = commits.sort_values("commit_date").reset_index()
    commits["commit"] = commits["commit"].map(short_hash)
    return _details(
        "Commits",
        _table(
            commits.rename(columns={"commit_date": "commit date", "run_date": "run date"}),
            formats={"commit date": _when, "run date": _when},
            keep=("commit",),
        ),
    )


def _failed(page: Page) -> str:
    frame = page.frame
    bad = frame[(frame["status"] != Status.OK) & (frame["metric"] == "time")]
    cols = ["origin", "machine", "variant", "seq_len", "device", "mode", "status", "reason"]
    return _details(
        f"Skipped and failed cases ({len(bad)})",
        _table(bad[[c for c in cols if c in bad]].drop_duplicates(), keep=("variant", "status")),
        ident="problems",
    )


def _environment(page: Page) -> str:
    frame = page.frame

    def values(col: str, short: bool = False) -> str:
        vals = (
            [str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")]
            if col in frame
            else []
        )
        vals = [short_hash(v) for v in vals] if short else vals
        return ", ".join(sorted(vals)[:8]) or "-"

    peaks = frame["peak_gflops"].dropna().unique()
    rows = [
        ("machine", values("machine")),
        ("CPU", values("cpu")),
        ("GPU", values("gpu")),
        ("torch", values("torch")),
        ("threads", ", ".join(f"{t:g}" for t in sorted(frame["threads"].dropna().unique())) or "-"),
        ("matmul peak", ", ".join(fmt(float(p), "GFLOP/s") for p in sorted(peaks)) or "-"),
        (
            "run dates",
            _when(frame["run_date"].min())
            + (f" to {_when(frame['run_date'].max())}" if frame["run_date"].nunique() > 1 else ""),
        ),
        ("commits", values("commit", short=True)),
        ("sources", ", ".join(page.analysis.loaded.sources)),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return _details("Environment", f'<table class="meta">{body}</table>')


def _problems(page: Page) -> str:
    problems = page.analysis.loaded.problems
    if not problems:
        return ""
    return _details(
        f"Problems with the inputs ({len(problems)})",
        "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in problems) + "</ul>",
    )


def _fmt_fit(row: pd.Series) -> str:
    """The long form (full fit table): exponent, interval, R², range, outliers, verdict."""
    if row.get("method") == complexity.MODEL:
        return "model (predicted, not fitted)"
    if math.isnan(row["exponent"]):
        return f"n/a ({row['note']})" if row.get("note") else "n/a"
    hi = "inf" if math.isinf(row["ci_high"]) else f"{row['ci_high']:.2f}"
    lo = "-inf" if math.isinf(row["ci_low"]) else f"{row['ci_low']:.2f}"
    where = f"L {row['L_min']:.0f}-{row['L_max']:.0f}, {row['n']:.0f} points"
    # exact values: the slope's range along L and the largest residual
    if row.get("kind") == "deterministic":
        text = (
            f"{row['exponent']:.2f} (local slopes {lo} to {hi}, largest residual "
            f"{row['max_residual']:.1%}; {where})"
        )
    else:
        text = f"{row['exponent']:.2f} [{lo}, {hi}] R²={row['r2']:.3f} ({where})"
    if row.get("outliers"):
        text += f", outliers {row['outliers']}"
    return (
        f"{text}: inconclusive ({row['note']})"
        if row.get("verdict") == complexity.FitVerdict.INCONCLUSIVE
        else text
    )


def _full_fits(page: Page) -> str:
    full = page.analysis.fits.copy()
    if len(full):
        full.insert(0, "fit", full.apply(_fmt_fit, axis=1))
        full["commit"] = full["commit"].map(short_hash)
        if "crossover_L" in full:  # the cost split c0 + c1·L + c2·L², in words a reader can check
            full["L² term overtakes the L term at"] = [
                str(round(x)) if 0 < x < math.inf else "" for x in full["crossover_L"]
            ]
            full["L² share at the longest length"] = [
                f"{x:.0%}" if x == x else "" for x in full["l2_share"]
            ]
        full = full.drop(
            columns=[
                c
                for c in ("crossover_L", "l2_share", "split_residual", "max_residual", "kind")
                if c in full
            ]
        )
    return _details("Full fit table", _table(full, keep=("variant", "metric")))


def _demos(page: Page) -> str:
    if not page.demos:
        return ""
    nw_panels, nw = teaching.nadaraya_watson()
    nw_fig = page.figure(
        "nadaraya_watson",
        plots.heatmaps(nw_panels),
        "Nadaraya-Watson kernel regression through the <code>dot</code> variant. Test MSE "
        f"non-parametric {nw['nonparametric_test_mse']:.3f}, parametric "
        f"{nw['parametric_test_mse']:.3f} (learned w = {nw['learned_w']:.2f}).",
    )
    masked = page.figure(
        "masked_weights",
        plots.heatmaps(teaching.masked_weights()),
        "Attention weights computed by the variants themselves (v = I) under a causal mask, a "
        "sliding window and a block-sparse pattern.",
    )
    return _details("Teaching demos: attention weights", nw_fig + masked)


def _reproduce(page: Page) -> str:
    text = (
        "<p>Sweep and report: <code>attnbench run</code>; from asv results: <code>asv run</code> "
        "then <code>attnbench report --from .asv/results</code>; two runs side by side: "
        "<code>attnbench report --from RUN_A --from RUN_B</code>; teaching demos: "
        "<code>--demos</code>. Tidy data: <code>tidy.csv</code>; fits: <code>fits.csv</code> "
        "(beside this page); inputs that could not be used: <code>problems.json</code>.</p>"
    )
    return _details("Reproduce", text)


Section = Callable[[Page], str]
STORY: tuple[Section, ...] = (
    _findings,
    _progression,
    _families,
    _crossovers,
    _prefill_decode,
    _roofline,
)
"""The story sections, drawn when anything loaded."""
BODY: tuple[Section, ...] = (_exponents, _wrong)
"""Visible whatever loaded (the exponents section says when nothing did)."""
COMPARED: tuple[Section, ...] = (_gate_growth, _comparison, _history)
DETAILS: tuple[Section, ...] = (
    _gflops,
    _instructions,
    _page_faults,
    _accuracy,
    _speedups,
    _crossover_tables,
    _largest_length,
    _memory_model,
    _provenance,
    _compile_times,
    _runqueue,
    _commits,
    _failed,
    _environment,
)
"""The collapsed sections, drawn when anything loaded."""
CLOSING: tuple[Section, ...] = (_problems, _full_fits, _demos, _reproduce)
"""The last collapsed sections, whatever loaded."""


def render(
    analysis: Analysis, out_dir: str | Path, title: str = "attnbench report", demos: bool = False
) -> ReportOutcome:
    """Draw the figures; write ``report.html``, ``figures/``, the CSVs and ``problems.json``.

    Args:
        analysis: what :func:`~attnbench.analysis.summary.analyse` computed.
        out_dir: the output directory.
        title: the page title.
        demos: also draw the teaching demos (Nadaraya-Watson regression, masked attention weights),
            which train and compute on every build, in a collapsed section.
    """
    out_dir = Path(out_dir)
    page = Page(analysis, out_dir / "figures", demos)
    loaded = analysis.loaded
    anything = len(loaded.frame) > 0
    with plots.drawing(analysis.variant_order):
        body = [s(page) for s in ((*STORY, *BODY, *COMPARED) if anything else BODY)]
        details = [s(page) for s in ((*DETAILS, *CLOSING) if anything else CLOSING)]
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    html_page = _html_page(
        title,
        _subtitle(analysis)
        + _inputs_notes(analysis)
        + "".join(b for b in body if b)
        + '<h2 id="details">Details</h2>'
        + "".join(details),
        generated,
    )
    atomic_write(out_dir / "tidy.csv", lambda tmp: loaded.frame.to_csv(tmp, index=False))
    atomic_write(out_dir / "fits.csv", lambda tmp: analysis.fits.to_csv(tmp, index=False))
    atomic_write_text(
        out_dir / "problems.json",
        json.dumps({"problems": list(loaded.problems), "notes": list(loaded.notes)}, indent=1),
    )
    path = atomic_write_text(out_dir / "report.html", html_page)
    return ReportOutcome(
        page=path, rows=len(loaded.frame), problems=loaded.problems, notes=loaded.notes
    )
