"""The report's HTML pieces: tables, collapsed details, figures as files and data URIs, the page.

Small helpers every section of :mod:`attnbench.report.html` and :mod:`attnbench.report.details`
uses; nothing here computes what the page states.
"""

from __future__ import annotations

import base64
import html
import io
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from attnbench.analysis.summary import Analysis
from attnbench.analysis.text import short_hash, sig
from attnbench.io import atomic_write

__all__ = [
    "COUNT_COLUMN",
    "CSS",
    "SORT_JS",
    "WRAP_AT",
    "collapsible",
    "empty_note",
    "exact_integer",
    "figure_in",
    "html_table",
    "inline_code",
    "lift_constants",
    "Page",
    "ReportOutcome",
    "rst_to_html",
    "utc_time",
    "whole_page",
]

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
    "td[title]{text-decoration:underline dotted #999;cursor:help}\n"
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


def rst_to_html(text: str) -> str:
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


def _cell(value: object, formatter: Callable[[object], str] | None, title: str = "") -> str:
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
    tip = f' title="{html.escape(title)}"' if title else ""
    return f"<td{sort}{wrap}{tip}>{html.escape(text)}</td>"


def html_table(
    df: pd.DataFrame | None,
    max_rows: int = 400,
    formats: dict[str, Callable[[object], str]] | None = None,
    keep: Sequence[str] = (),
    lift: bool = True,
    css: str = "",
    titles: dict[str, str] | None = None,
) -> str:
    """A sortable table; constant columns are lifted into its caption (``lift``).

    ``titles`` maps a shown column to the column holding its cells' tooltips (the details behind
    a short verdict); those columns are not shown.
    """
    if df is None or df.empty:
        return "<p><em>nothing to show</em></p>"
    titles = {c: t for c, t in (titles or {}).items() if c in df and t in df}
    tips = df[list(titles.values())].fillna("").astype(str)
    df = df.drop(columns=list(titles.values()))
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
    for i, rec in zip(
        shown.index[:max_rows], shown.head(max_rows).itertuples(index=False), strict=True
    ):
        body.append(
            "<tr>"
            + "".join(
                _cell(v, formats.get(c), tips.at[i, titles[c]] if c in titles else "")
                for c, v in zip(shown.columns, rec, strict=True)
            )
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


def collapsible(summary: str, body: str, open_: bool = False, ident: str = "") -> str:
    attr = f' id="{ident}"' if ident else ""
    return f"<details{attr}{' open' if open_ else ''}><summary>{summary}</summary>{body}</details>"


def empty_note(what: str, why: str) -> str:
    """One line in place of a figure with nothing to draw, saying why: a section never vanishes
    silently, and a reader never wonders whether it was forgotten."""
    return f'<p class="note empty">Nothing to draw in {html.escape(what)}: {html.escape(why)}.</p>'


def whole_page(title: str, body: str, generated: str) -> str:
    """A whole page: ``title`` as its title and heading, then ``body``.

    After the body come the time it was ``generated`` and the script that sorts its tables.
    """
    return (
        "<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{CSS}</style></head>"
        f"<body><h1>{html.escape(title)}</h1>{body}"
        f'<p class="sub">generated {generated}</p><script>{SORT_JS}</script></body></html>'
    )


def utc_time(stamp: object) -> str:
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
        return figure_in(self.fig_dir, name, fig, caption, css)


def figure_in(fig_dir: Path, name: str, fig: plt.Figure | None, caption: str, css: str = "") -> str:
    """:meth:`Page.figure` for any folder of figures (the history page has no :class:`Page`)."""
    if fig is None:
        return ""
    uri = _fig_to_files(fig, fig_dir / name)
    return (
        f'<figure id="fig-{name}" class="{css}"><img alt="{name}" src="{uri}">'
        f"<figcaption>{caption} (<code>figures/{name}.png</code>, <code>.svg</code>)"
        "</figcaption></figure>"
    )


def inline_code(text: str) -> str:
    """Escape, then turn `name` into <code>name</code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))
