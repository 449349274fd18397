"""One self-contained HTML page (figures embedded as data URIs, no network requests), plus the
figures as PNG and SVG files and the tidy table as CSV, all written atomically.

The report is three steps, each a function of the one before:

* :func:`load_results` -> :class:`Loaded` (the tidy frame and what could not be read),
* :func:`analyse` -> :class:`Analysis` (fits, crossovers, comparisons, findings; no drawing),
* :func:`render` -> :class:`ReportOutcome` (figures, the page and its files).

The page opens with findings written from the data (each linked to the figure it is read from),
then the headline figure (the teaching progression from the Python loop to fused SDPA), the
families, the crossover matrix and the fitted exponents; everything else (full tables, provenance,
environment, problems) sits in collapsed ``<details>`` sections. A finding is stated only when the
data supports it: conclusive fits, ``ok`` rows. Columns that hold one value on every row are
lifted into the table's caption.
"""

from __future__ import annotations

import base64
import datetime as dt
import html
import io
import json
import math
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib.pyplot as plt
import pandas as pd

from attnbench.analysis import complexity, roofline
from attnbench.analysis.frame import load
from attnbench.contract import PROGRESSION
from attnbench.io import atomic_write, atomic_write_text
from attnbench.registry import get_variant, variant_names
from attnbench.report import plots
from attnbench.report.plots import fmt

CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:1rem auto;max-width:1200px;color:#222;line-height:1.4;padding:0 1rem}
h1{margin:.2rem 0 .1rem;font-size:1.6rem} h2{border-bottom:2px solid #ddd;padding-bottom:.15rem;margin:1.6rem 0 .5rem;font-size:1.25rem}
.sub{color:#555;font-size:.9rem;margin:.1rem 0 .5rem}
table{border-collapse:collapse;font-size:.82rem;margin:.4rem 0} th,td{border:1px solid #ddd;padding:.2rem .45rem;text-align:right;white-space:nowrap}
.tw{overflow-x:auto;max-width:100%} td.wrap{white-space:normal}
th{background:#f4f4f4} td:first-child,th:first-child{text-align:left} table.sortable th{cursor:pointer}
table.sortable th:hover{background:#e8e8e8} caption{caption-side:bottom;text-align:left;font-size:.78rem;color:#666;padding-top:.2rem}
.meta td{text-align:left;white-space:normal} figure{margin:.5rem 0} figure img{max-width:100%;height:auto;border:1px solid #eee}
figure.head img{max-height:400px} .row{display:flex;gap:1rem;align-items:flex-start} .row figure{flex:1;min-width:0}
figcaption{font-size:.8rem;color:#555} .bad{color:#b00020;font-weight:600} .good{color:#1b5e20}
.note{background:#fff8e1;border-left:4px solid #ffb300;padding:.3rem .8rem;margin:.4rem 0;font-size:.88rem}
.note.bad{border-left-color:#b00020;font-weight:400} .note ul{margin:.2rem 0}
.bad td{color:#b00020} code{background:#f4f4f4;padding:0 .2rem}
ol.findings{margin:.3rem 0 .6rem;padding-left:1.4rem;font-size:.95rem} ol.findings li{margin:.15rem 0}
details{margin:.3rem 0;border:1px solid #e4e4e4;border-radius:4px;padding:.2rem .6rem}
details>summary{cursor:pointer;font-weight:600;padding:.15rem 0} details[open]>summary{margin-bottom:.3rem}
"""

SORT_JS = """
document.querySelectorAll('table.sortable th').forEach(function(th){th.addEventListener('click',function(){
var t=th.closest('table'),b=t.tBodies[0],i=Array.prototype.indexOf.call(th.parentNode.children,th);
var d=th.dataset.dir=th.dataset.dir==='asc'?'desc':'asc';
function v(r){var c=r.children[i];var s=c.dataset.v!==undefined?c.dataset.v:c.textContent;var n=parseFloat(s);return isNaN(n)?s:n;}
Array.prototype.slice.call(b.rows).sort(function(x,y){var p=v(x),q=v(y);
var r=(typeof p==='number'&&typeof q==='number')?p-q:String(p).localeCompare(String(q));return d==='asc'?r:-r;})
.forEach(function(r){b.appendChild(r);});});});
"""

SHORT_HASH = 8  # characters of a commit hash shown on the page (asv's own convention)


# ---- small HTML helpers ----------------------------------------------------------------------
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


def lift_constants(df: pd.DataFrame, keep: Sequence[str] = (),
                   formats: dict[str, Callable[[object], str]] | None = None) -> tuple[pd.DataFrame, dict[str, str]]:
    """Drop the columns that hold one value on every row; return them as ``{column: value}``.

    Args:
        df: the table to show.
        keep: columns never lifted (e.g. the row label).
        formats: per-column formatters: a column is constant when its *shown* text is (dates to the minute).

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
        values = df[col].map(lambda v, show=show: "" if v is None or (not isinstance(v, str) and pd.isna(v)) else show(v))
        if values.nunique(dropna=False) == 1:
            constants[col] = values.iloc[0]
    return df.drop(columns=list(constants)), {k: v for k, v in constants.items() if v not in ("", "nan", "NaT")}


def _cell(value: object, formatter: Callable[[object], str] | None) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)) or value is pd.NA or value is pd.NaT:
        return "<td></td>"
    if formatter is not None:
        text = formatter(value)
    elif isinstance(value, float):
        text = plots._sig(value)
    elif isinstance(value, pd.Timestamp):
        text = f"{value:%Y-%m-%d %H:%M}"
    else:
        text = str(value)
    sort = f' data-v="{html.escape(repr(float(value)))}"' if isinstance(value, (int, float)) and not isinstance(value, bool) else ""
    return f"<td{sort}>{html.escape(text)}</td>"


def _table(df: pd.DataFrame | None, max_rows: int = 400, formats: dict[str, Callable[[object], str]] | None = None,
           keep: Sequence[str] = (), lift: bool = True, css: str = "") -> str:
    """A sortable table; constant columns are lifted into its caption (``lift``)."""
    if df is None or df.empty:
        return "<p><em>nothing to show</em></p>"
    if "commit" in df:  # short hashes on the page; the full ones are in tidy.csv
        df = df.assign(commit=df["commit"].map(lambda c: _short(c) if isinstance(c, str) else c))
    shown, constants = lift_constants(df, keep, formats) if lift else (df, {})
    formats = formats or {}
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in shown.columns)
    body = []
    for rec in shown.head(max_rows).itertuples(index=False):
        body.append("<tr>" + "".join(_cell(v, formats.get(c)) for c, v in zip(shown.columns, rec, strict=True)) + "</tr>")
    caption = ""
    parts = [f"{k}: {v}" for k, v in constants.items()]
    if len(df) > max_rows:
        parts.append(f"{len(df) - max_rows} more rows in the CSV")
    if parts:
        caption = f"<caption>Same on every row: {html.escape('; '.join(parts))}</caption>"
    return (f'<div class="tw"><table class="sortable {css}">{caption}<thead><tr>{head}</tr></thead>'
            f'<tbody>{"".join(body)}</tbody></table></div>')


def _details(summary: str, body: str, open_: bool = False, ident: str = "") -> str:
    attr = f' id="{ident}"' if ident else ""
    return f'<details{attr}{" open" if open_ else ""}><summary>{summary}</summary>{body}</details>'


def _short(commit: object) -> str:
    return str(commit)[:SHORT_HASH] if commit else ""


def _when(stamp: object) -> str:
    return f"{stamp:%Y-%m-%d %H:%M} UTC" if isinstance(stamp, pd.Timestamp) and not pd.isna(stamp) else ""


# ---- step 1: load ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Loaded:
    """What :func:`load_results` read."""

    frame: pd.DataFrame  # the tidy frame (see attnbench.analysis.frame)
    sources: tuple[str, ...]  # the sources as given
    problems: tuple[str, ...]  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...]  # facts worth knowing that are not faults (e.g. incomplete runs)


def load_results(sources: Iterable[str | Path]) -> Loaded:
    """Load asv results directories and run directories into one tidy frame (never raises on bad input)."""
    sources = tuple(str(s) for s in sources)
    frame = load(sources)
    return Loaded(frame=frame, sources=sources, problems=tuple(frame.attrs.get("problems", [])),
                  notes=tuple(frame.attrs.get("notes", [])))


# ---- step 2: analyse -------------------------------------------------------------------------
@dataclass(frozen=True)
class Finding:
    """One sentence the data supports, and the figure or section it is read from."""

    text: str  # the sentence (plain text; `name` marks a variant)
    target: str  # id of the figure or section on the page


@dataclass(frozen=True)
class Comparison:
    """Side B against side A (two runs, commits or machines): time and peak tensor memory ratios where both ran ok."""

    label_a: str  # what A is (run directory, short hash, machine)
    label_b: str  # what B is
    ratios: pd.DataFrame  # variant, seq_len, device, mode, dtype, mask, time_a, time_b, ratio (B / A)
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)  # same keys, bytes_a, bytes_b, ratio (B / A): measured peak tensor bytes only


@dataclass(frozen=True)
class Analysis:
    """Everything the page states, computed from a :class:`Loaded` (no drawing, no files)."""

    loaded: Loaded  # the input
    fits: pd.DataFrame  # complexity.fit_table
    summary: pd.DataFrame  # one row per variant: exponents and verdicts (exponent_summary)
    crossovers: dict[str, pd.DataFrame]  # metric -> complexity.crossovers (ok, measured rows)
    primary: dict[str, str]  # the slice findings are read from (machine, device, mode, dtype, mask, side)
    constants: dict[str, str]  # values shared by every case (lifted into the subtitle)
    sides: pd.DataFrame  # one row per run / commit / machine: label, short hash, run date, cases
    comparisons: tuple[Comparison, ...]  # B vs A for every side after the first (at most 3)
    findings: tuple[Finding, ...] = field(default=())  # 0 to 6 sentences, each linked


def _fmt_fit(row: pd.Series) -> str:
    """The long form (full fit table): exponent, interval, R², range, outliers, verdict."""
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


def _short_fit(row: pd.Series) -> str:
    """The short form (visible table): "2.01 [1.95, 2.07]", "inconclusive (3 points)", "model"."""
    if row.get("method") == complexity.MODEL:
        return "model (predicted, not fitted)"
    if math.isnan(row["exponent"]):
        return f"n/a ({row['note']})" if row.get("note") else "n/a"
    if row.get("verdict") == "inconclusive" or not row.get("conclusive", True):
        return f"{row['exponent']:.2f}, inconclusive"
    return f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def exponent_summary(fits: pd.DataFrame) -> pd.DataFrame:
    """Variant rows with fitted time and memory exponents, how each was obtained, declared ones, and a verdict."""
    if fits.empty:
        return fits
    rows = []
    keys = ["machine", "commit", "device", "mode", "dtype", "mask", "workload", "variant"]  # one row per commit in a history
    keys = [k for k in keys if k in fits]
    for key, group in fits.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key, strict=True))
        row["commit"] = _short(row["commit"])
        row["family"] = plots.family(row["variant"])
        flags = []
        for metric, label in (("time", "time"), ("peak_tensor_bytes", "memory")):
            sub = group[group["metric"] == metric]
            if sub.empty:
                row[f"{label} exponent [95% CI]"], row[f"{label} method"], row[f"declared {label}"] = "", "", ""
                continue
            r = sub.iloc[-1]
            row[f"{label} exponent [95% CI]"] = _short_fit(r)
            row[f"{label} method"] = r.get("method", "")
            row[f"declared {label}"] = "" if math.isnan(r["declared"]) else f"{r['declared']:g}"
            if r["verdict"] in ("steeper", "shallower"):
                flags.append(f"{label} {r['verdict']}")
            elif r["verdict"] == "inconclusive":
                flags.append(f"{label} inconclusive")
            elif r["verdict"] == "matches":
                flags.append(f"{label} matches")
        row["verdict vs declared"] = "; ".join(flags) or "nothing fitted"
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


def _side_key(frame: pd.DataFrame) -> pd.Series:
    """One label per run / commit / machine, naming only what differs between them."""
    origin = frame["origin"].fillna("").astype(str) if "origin" in frame else pd.Series("", index=frame.index)
    parts = {
        "origin": origin.map(lambda p: Path(p).name or p),
        "machine": frame["machine"].astype(str),
        "commit": frame["commit"].fillna("").astype(str).str[:SHORT_HASH],
    }
    varying = [k for k in ("origin", "machine", "commit") if parts[k].nunique() > 1]
    if not varying:
        return pd.Series("this run", index=frame.index)
    if "origin" in varying and len(varying) > 1 and origin.nunique() == frame.groupby(["machine", "commit"]).ngroups:
        varying.remove("origin")  # each source is one machine/commit: name those instead of the path
    return pd.Series([" / ".join(p) for p in zip(*(parts[k] for k in varying), strict=True)], index=frame.index)


def _sides(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per side: label, source kind, machine, short hash, run date, commit date, cases."""
    if frame.empty:
        return pd.DataFrame()
    frame = frame.assign(side=_side_key(frame))
    rows = []
    for label, group in frame.groupby("side", sort=False):
        time_rows = group[group["metric"] == "time"]
        run_date = group["run_date"].min() if "run_date" in group else pd.NaT
        rows.append({
            "side": label, "source": ", ".join(sorted(set(group["source"]))), "machine": ", ".join(sorted(set(group["machine"]))),
            "commit": ", ".join(sorted({_short(c) for c in group["commit"] if c})), "run date": run_date,
            "commit date": group["date"].min() if (group["source"] == "asv").any() else pd.NaT,
            "cases ok": int((time_rows["status"] == "ok").sum()), "cases": len(time_rows),
        })
    out = pd.DataFrame(rows)
    return out.sort_values(["commit date", "run date"], na_position="first", kind="stable").reset_index(drop=True)


_COMPARED = {"time": "time", "peak_tensor_bytes": "bytes"}  # metric -> column prefix of A's and B's values


def _compare(frame: pd.DataFrame, sides: pd.DataFrame) -> tuple[Comparison, ...]:
    """B / A ratios of time and of peak tensor bytes, per case both sides ran ok (memory: measured, not "model", and A > 0)."""
    if len(sides) < 2:
        return ()
    frame = frame.assign(side=_side_key(frame))
    ok = frame[(frame["status"] == "ok") & (frame["seq_len"] == frame["seq_len_k"]) & (frame["method"] != complexity.MODEL)]
    keys = ["variant", "seq_len", "device", "mode", "dtype", "mask"]
    med = {metric: ok[ok["metric"] == metric].groupby(["side", *keys], dropna=False)["value"].median().reset_index()
           for metric in _COMPARED}
    label_a = sides["side"].iloc[0]

    def ratios(metric: str, label_b: str) -> pd.DataFrame:
        m, prefix = med[metric], _COMPARED[metric]
        a = m[m["side"] == label_a].drop(columns="side").rename(columns={"value": f"{prefix}_a"})
        b = m[m["side"] == label_b].drop(columns="side").rename(columns={"value": f"{prefix}_b"})
        both = a.merge(b, on=keys)
        both = both[both[f"{prefix}_a"] > 0].reset_index(drop=True)
        both["seq_len"] = both["seq_len"].astype("int64")
        both["ratio"] = both[f"{prefix}_b"] / both[f"{prefix}_a"]
        return both

    return tuple(Comparison(label_a=str(label_a), label_b=str(label_b), ratios=ratios("time", label_b),
                            memory=ratios("peak_tensor_bytes", label_b)) for label_b in sides["side"].iloc[1:4])


def _primary(frame: pd.DataFrame) -> dict[str, str]:
    """The slice the findings are read from: the first side, its most common device, forward, ..."""
    time_rows = frame[frame["metric"] == "time"]
    if time_rows.empty:
        return {}
    side = _side_key(frame)
    first = side.loc[time_rows.index].iloc[0]
    rows = time_rows[side.loc[time_rows.index] == first]
    pick = {"side": str(first)}
    for col, prefer in (("machine", None), ("commit", None), ("device", None), ("mode", "forward"), ("dtype", None), ("mask", "none")):
        values = rows[col].astype(str)
        choice = prefer if prefer in set(values) else values.value_counts().index[0]
        pick[col] = choice
        rows = rows[values == choice]
    return pick


def _slice(frame: pd.DataFrame, primary: dict[str, str]) -> pd.DataFrame:
    if not primary or frame.empty:
        return frame.iloc[0:0]
    mask = pd.Series(True, index=frame.index)
    if "side" in primary:
        mask &= _side_key(frame) == primary["side"]
    for col in ("machine", "commit", "device", "mode", "dtype", "mask"):
        mask &= frame[col].astype(str) == primary[col]
    return frame[mask]


def _fit(fits: pd.DataFrame, variant: str, metric: str, workload: str = "prefill") -> dict | None:
    """A conclusive fit of ``variant``'s ``metric`` on ``workload`` (measured, not model), or None."""
    if fits.empty:
        return None
    sub = fits[(fits["variant"] == variant) & (fits["metric"] == metric) & (fits["method"] != complexity.MODEL)]
    if "workload" in sub:
        sub = sub[sub["workload"] == workload]
    sub = sub[sub["conclusive"].astype(bool) & sub["verdict"].isin(("matches", "steeper", "shallower"))]
    return None if sub.empty else sub.iloc[0].to_dict()


def _at_common_longest(ok: pd.DataFrame, a: str, b: str) -> tuple[int, float, float] | None:
    """(L, a's value, b's value) at the longest L where both ran ok, or None."""
    table = ok[ok["variant"].isin((a, b))].pivot_table(index="seq_len", columns="variant", values="value", aggfunc="median")
    if a not in table or b not in table:
        return None
    both = table[[a, b]].dropna()
    if both.empty:
        return None
    n = int(both.index[-1])
    return n, float(both[a].iloc[-1]), float(both[b].iloc[-1])


def findings(frame: pd.DataFrame, fits: pd.DataFrame, primary: dict[str, str],
             comparisons: Sequence[Comparison] = ()) -> tuple[Finding, ...]:
    """Up to seven sentences the data supports, each with the id of the figure it is read from.

    Only ``ok`` rows and measured values (not method "model") are compared or ranked, and only
    conclusive fits are quoted; a sentence whose numbers are missing is left out, never guessed.
    """
    out: list[Finding] = []
    rows = _slice(frame, primary)
    ok = rows[(rows["status"] == "ok") & (rows["seq_len"] == rows["seq_len_k"]) & (rows["method"] != complexity.MODEL)]
    ok_time, ok_mem = ok[ok["metric"] == "time"], ok[ok["metric"] == "peak_tensor_bytes"]
    pfits = fits
    if len(fits):
        pfits = _pair(fits, primary, _decode_commit(frame, primary))
        pfits = pfits[(pfits["device"].astype(str) == primary.get("device"))
                      & (pfits["mode"].astype(str) == primary.get("mode")) & (pfits["dtype"].astype(str) == primary.get("dtype"))
                      & (pfits["mask"].astype(str) == primary.get("mask"))]
    dfits = pfits[pfits["workload"] == "decode"] if "workload" in pfits else pfits.iloc[0:0]
    pfits = pfits[pfits["workload"] == "prefill"] if "workload" in pfits else pfits

    # 1. how dense and fused attention time grows (conclusive fits only)
    parts = []
    for variant, what in (("batched", "dense"), ("sdpa", "fused SDPA")):
        fit = _fit(pfits, variant, "time")
        if fit:
            parts.append(f"{what} attention (`{variant}`) as L^{fit['exponent']:.2f} [{fit['ci_low']:.2f}, {fit['ci_high']:.2f}]")
    if parts:
        out.append(Finding("Time per call grows for " + " and for ".join(parts) + " (95% intervals).", "fig-progression"))

    # 1b. decode: time per generated token against the cache length, and the roofs it meets
    decode = _decode_finding(frame, dfits, pfits, primary)
    if decode:
        out.append(decode)

    # 2. the scratch memory of dense attention against SDPA at the longest common length
    both = _at_common_longest(ok_mem, "batched", "sdpa")
    if both and both[2] > 0:
        n, dense, fused = both
        fit = _fit(pfits, "batched", "peak_tensor_bytes")
        grows = f" (growing as L^{fit['exponent']:.2f})" if fit else ""
        out.append(Finding(f"At L={n}, `batched` needs {fmt(dense, 'bytes')} of scratch memory{grows}, "
                           f"{fmt(dense / fused, 'x')} `sdpa` ({fmt(fused, 'bytes')}).", "fig-progression"))

    # 3. the teaching baseline's Python loop against batched
    both = _at_common_longest(ok_time, "loop", "batched")
    if both:
        n, loop, batched = both
        out.append(Finding(f"The teaching baseline, a Python loop, is {fmt(loop / batched, 'x')} slower than `batched` at L={n} "
                           f"({fmt(loop, 's')} vs {fmt(batched, 's')} per call).", "fig-progression"))

    # 4. fastest and slowest at the longest length where most variants ran
    if len(ok_time):
        counts = ok_time.groupby("seq_len")["variant"].nunique()
        good = counts[counts >= max(3, int(0.6 * counts.max()))]
        if len(good):
            n = int(good.index.max())
            at = ok_time[ok_time["seq_len"] == n].groupby("variant")["value"].median().sort_values()
            fastest, slowest = at.index[0], at.index[-1]
            out.append(Finding(f"At L={n}, the fastest of {len(at)} variants that ran correctly is `{fastest}` "
                               f"({fmt(at.iloc[0], 's')}); the slowest, `{slowest}`, takes {fmt(at.iloc[-1] / at.iloc[0], 'x')} as long.",
                               "fig-time"))

    # 5. the verdicts of the fits
    if len(pfits):
        judged = pfits[pfits["verdict"].isin(complexity.VERDICTS)]
        conclusive = judged[judged["verdict"] != "inconclusive"]
        if len(judged) and not len(conclusive):
            out.append(Finding(f"No complexity fit is conclusive ({len(judged)} inconclusive): too few lengths or too much "
                               "scatter to compare with the declared big-O.", "exponents"))
        elif len(judged):
            steeper = sorted(conclusive.loc[conclusive["verdict"] == "steeper", "variant"])
            text = (f"{int((conclusive['verdict'] == 'matches').sum())} of {len(conclusive)} conclusive complexity fits match the "
                    f"declared big-O; {len(judged) - len(conclusive)} are inconclusive")
            text += f"; steeper than declared: {', '.join(f'`{v}`' for v in steeper)}." if steeper else "; none is steeper than declared."
            out.append(Finding(text, "exponents"))

    # 6. comparisons, else the cases that are not facts
    for comp in comparisons[:1]:
        if len(comp.ratios):
            geo = math.exp(float(pd.Series(comp.ratios["ratio"]).apply(math.log).median()))
            worst = comp.ratios.sort_values("ratio").iloc[-1]
            out.append(Finding(f"{comp.label_b} against {comp.label_a}: median time ratio {fmt(geo, 'x')} over "
                               f"{len(comp.ratios)} cases both ran correctly; largest {fmt(worst['ratio'], 'x')} "
                               f"(`{worst['variant']}`, L={int(worst['seq_len'])}).", "comparison"))
    time_rows = frame[frame["metric"] == "time"]
    bad = time_rows[time_rows["status"] != "ok"]
    if len(bad) and len(out) < 6:
        counts = ", ".join(f"{v} {k}" for k, v in bad["status"].value_counts().items())
        out.append(Finding(f"{len(bad)} of {len(time_rows)} cases are not measurements to rely on ({counts}): "
                           "they are never fitted or ranked.", "problems"))
    return tuple(out[:7])


def _decode_commit(frame: pd.DataFrame, primary: dict[str, str]) -> str:
    """The commit whose decode cases pair with the primary prefill ones: the primary commit when it ran
    decode on the primary machine, else the machine's latest decode run (a decode sweep is often a later run)."""
    if "workload" not in frame or not primary:
        return primary.get("commit", "") if primary else ""
    rows = frame[(frame["workload"] == "decode") & (frame["machine"].astype(str) == primary["machine"])]
    if rows.empty or (rows["commit"].astype(str) == primary["commit"]).any():
        return primary["commit"]
    return str(rows.sort_values("run_date", na_position="first")["commit"].iloc[-1])


def _pair(table: pd.DataFrame, primary: dict[str, str], decode_commit: str) -> pd.DataFrame:
    """Rows (or fits) of the primary machine: prefill of the primary commit, decode of ``decode_commit``."""
    if not primary or table.empty:
        return table
    decode = table["workload"] == "decode" if "workload" in table else pd.Series(False, index=table.index)
    commit = table["commit"].astype(str)
    return table[(table["machine"].astype(str) == primary["machine"])
                 & ((~decode & (commit == primary["commit"])) | (decode & (commit == decode_commit)))]


def _machine(frame: pd.DataFrame, primary: dict[str, str]) -> pd.DataFrame:
    """The primary machine's prefill and decode cases (:func:`_pair`): the two are often separate runs."""
    return _pair(frame, primary, _decode_commit(frame, primary))


def _decode_finding(frame: pd.DataFrame, dfits: pd.DataFrame, pfits: pd.DataFrame, primary: dict[str, str]) -> Finding | None:
    """Decode's fitted time exponent beside prefill's, and its % of the bandwidth roof: only from a conclusive decode fit."""
    for variant in ("sdpa", "batched", *sorted(set(dfits["variant"]) if len(dfits) else ())):
        fit = _fit(dfits, variant, "time", "decode")
        if fit:
            break
    else:
        return None
    text = (f"Decode (one query over a KV cache) takes time per generated token growing as Lk^{fit['exponent']:.2f} "
            f"[{fit['ci_low']:.2f}, {fit['ci_high']:.2f}] for `{variant}`")
    pre = _fit(pfits, variant, "time", "prefill")
    text += f", against prefill's L^{pre['exponent']:.2f}" if pre else ""
    roof = roofline.roofline(_machine(frame, primary))
    dec = roof[(roof["workload"] == "decode") & (roof["variant"] == variant) & roof["pct_of_bandwidth"].notna()]
    if len(dec):
        last = dec.sort_values("seq_len_k").iloc[-1]
        text += (f"; at Lk={int(last['seq_len_k'])} it moves {fmt(float(last['gbps']), 'GB/s')}, "
                 f"{plots._sig(float(last['pct_of_bandwidth']))}% of the measured bandwidth")
    return Finding(text + ".", "fig-prefill_decode")


def analyse(loaded: Loaded) -> Analysis:
    """Fits, crossovers, comparisons and findings from loaded results (nothing drawn or written)."""
    frame = loaded.frame
    fits = complexity.fit_table(frame) if len(frame) else pd.DataFrame()
    cross = {m: complexity.crossovers(frame, baselines=("loop", "batched", "sdpa"), metric=m)
             for m in ("time", "peak_tensor_bytes")} if len(frame) else {}
    sides = _sides(frame)
    comparisons = _compare(frame, sides) if len(frame) else ()
    primary = _primary(frame)
    constants = {}
    if len(frame):
        for col in ("device", "mode", "dtype", "batch", "heads", "head_dim", "mask", "machine", "torch", "threads"):
            values = {str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")}
            if len(values) == 1:
                constants[col] = values.pop()
    return Analysis(
        loaded=loaded, fits=fits, summary=exponent_summary(fits), crossovers=cross, primary=primary, constants=constants,
        sides=sides, comparisons=comparisons, findings=findings(frame, fits, primary, comparisons) if len(frame) else (),
    )


# ---- step 3: render --------------------------------------------------------------------------
@dataclass(frozen=True)
class ReportOutcome:
    """What :func:`make_report` wrote and what it could not use."""

    page: Path  # report.html
    rows: int  # tidy rows loaded (0: nothing could be loaded; the page then explains why)
    problems: tuple[str, ...]  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...]  # facts worth knowing that are not faults (e.g. incomplete runs)


def _code(text: str) -> str:
    """Escape, then turn `name` into <code>name</code>."""
    return re.sub(r"`([^`]+)`", r"<code>\1</code>", html.escape(text))


def _subtitle(analysis: Analysis) -> str:
    frame, c = analysis.loaded.frame, analysis.constants
    if frame.empty:
        return ""
    bits = []
    if "machine" in c:
        cpu = ", ".join(sorted({str(v) for v in frame["cpu"].dropna() if str(v)}))[:60]
        bits.append(f"Measured on <b>{html.escape(c['machine'])}</b>" + (f" ({html.escape(cpu)})" if cpu else ""))
    if "torch" in c:
        bits.append(f"torch {html.escape(c['torch'])}")
    if "threads" in c:
        bits.append(f"{float(c['threads']):g} thread{'s' if float(c['threads']) != 1 else ''}")
    commits = sorted({_short(v) for v in frame["commit"].dropna() if v})
    if commits:
        shown = ", ".join(f"<code>{c}</code>" for c in commits[:4]) + (f" and {len(commits) - 4} more" if len(commits) > 4 else "")
        bits.append(f"commit{'s' if len(commits) > 1 else ''} {shown}")
    dates = frame["run_date"].dropna() if "run_date" in frame else pd.Series(dtype=object)
    if len(dates):
        lo, hi = dates.min(), dates.max()
        bits.append(f"run {lo:%Y-%m-%d %H:%M}" + (f" to {hi:%Y-%m-%d %H:%M}" if hi - lo > pd.Timedelta(minutes=1) else "") + " UTC")
    shape = [f"{c[k]}" for k in ("device", "dtype", "mode") if k in c]
    if all(k in c for k in ("batch", "heads", "head_dim")):
        shape.append(f"B={c['batch']} H={c['heads']} D={c['head_dim']}")
    if "mask" in c:
        shape.append(f"mask {c['mask']}")
    time_rows = frame[frame["metric"] == "time"]
    counts = ", ".join(f"{v} {k}" for k, v in time_rows["status"].value_counts().items())
    line = ", ".join(bits) + "."
    if shape:
        line += f" Every case: {html.escape(', '.join(shape))}."
    line += f" {len(time_rows)} cases ({html.escape(counts)})."
    return f'<p class="sub">{line}</p>'


def _findings_html(analysis: Analysis) -> str:
    if not analysis.findings:
        return ""
    where = analysis.primary
    scope = ", ".join(f"{where[k]}" for k in ("device", "mode", "dtype") if k in where)
    items = "".join(f'<li>{_code(f.text)} <a href="#{f.target}">[figure]</a></li>' if f.target.startswith("fig")
                    else f'<li>{_code(f.text)} <a href="#{f.target}">[details]</a></li>' for f in analysis.findings)
    return (f'<section id="findings"><h2 style="margin-top:.6rem">Findings</h2><ol class="findings">{items}</ol>'
            f'<p class="sub">Read from {html.escape(scope)} cases that ran correctly (status ok); noisy, wrong and failed '
            "cases are never ranked; exponents are quoted only from conclusive fits.</p></section>")


def _figure(fig_dir: Path, name: str, fig: plt.Figure | None, caption: str, css: str = "") -> str:
    if fig is None:
        return ""
    uri = _fig_to_files(fig, fig_dir / name)
    return (f'<figure id="fig-{name}" class="{css}"><img alt="{name}" src="{uri}"><figcaption>{caption} '
            f'(<code>figures/{name}.png</code>, <code>.svg</code>)</figcaption></figure>')


def _headline(frame: pd.DataFrame, fits: pd.DataFrame) -> str:
    if frame.empty:
        return '<p class="bad">Nothing could be loaded: there are no measurements to show (the reasons are listed above).</p>'
    tone, text = complexity.headline(fits)
    head, sep, rest = text.partition("; inconclusive: ")
    if not sep:
        return f'<p class="{tone}">{html.escape(text)}</p>'
    items = rest.rstrip(".").split("), ")
    listed = "".join(f"<li>{html.escape(i if i.endswith(')') else i + ')')}</li>" for i in items)
    return (f'<p class="{tone}">{html.escape(head)}; {len(items)} inconclusive.</p>'
            + _details(f"Inconclusive fits ({len(items)}) and why", f"<ul>{listed}</ul>"))


def _wrong_section(frame: pd.DataFrame) -> str:
    wrong = frame[(frame["status"] == "wrong") & (frame["metric"] == "time")]
    if wrong.empty:
        return ""
    cols = ["origin", "machine", "commit", "variant", "seq_len", "device", "mode", "dtype", "mask", "reason"]
    wrong = wrong[[c for c in cols if c in wrong]].drop_duplicates().assign(commit=lambda d: d["commit"].map(_short))
    return ('<h2 class="bad">Wrong results: cases that failed the correctness gate</h2>'
            '<p class="bad">These cases produced output outside their tolerance. They are left out of the fits, '
            'crossovers, rankings and speedup figures; their timings are not claims.</p>'
            f'<div class="bad">{_table(wrong, keep=("variant",))}</div>')


def _ratio_table(ratios: pd.DataFrame) -> str:
    """variant x L table of the median B / A ``ratio``."""
    table = ratios.pivot_table(index="variant", columns="seq_len", values="ratio", aggfunc="median")
    table.columns = [f"L={c}" for c in table.columns]
    table = table.reset_index()
    fmt_x = {c: (lambda v: fmt(float(v), "x")) for c in table.columns if c != "variant"}
    return _table(table, formats=fmt_x, lift=False)


def _comparison_html(analysis: Analysis, fig_dir: Path) -> str:
    frame = analysis.loaded.frame
    out = []
    sides = analysis.sides
    if len(sides) > 1:
        out.append("<p>What was compared (run dates are when the measurements ran; commit dates are asv's):</p>"
                   + _table(sides, keep=("side",), formats={"run date": _when, "commit date": _when}))
    for k, comp in enumerate(analysis.comparisons):
        ratios = comp.ratios
        out.append(_figure(fig_dir, f"comparison_{k + 1}", plots.comparison(ratios, comp.label_a, comp.label_b),
                           f"Time of {html.escape(comp.label_b)} / {html.escape(comp.label_a)} for every case both ran "
                           "correctly (log scale centred at 1x; timings on a shared machine are noisy)."))
        b_over_a = f"{html.escape(comp.label_b)} / {html.escape(comp.label_a)}"
        out.append(f"<p>Time ratio {b_over_a} (below 1x: {html.escape(comp.label_b)} is faster):</p>"
                   + _ratio_table(ratios))
        if len(comp.memory):
            out.append(f"<p>Peak tensor memory ratio {b_over_a} (measured bytes above the inputs; below 1x: "
                       f"{html.escape(comp.label_b)} needs less; predicted \"model\" values are not compared):</p>"
                       + _ratio_table(comp.memory))
    out.append(_figure(fig_dir, "history", plots.history(frame), "History over commits (asv results with several commits; short hashes)."))
    out.append(_figure(fig_dir, "machines", plots.machines(frame), "Side by side per machine."))
    body = "".join(o for o in out if o)
    return f'<section id="comparison"><h2>Comparison</h2>{body}</section>' if body else ""


def render(analysis: Analysis, out_dir: str | Path, title: str = "attnbench report", demos: bool = False) -> ReportOutcome:
    """Draw the figures and write ``report.html``, ``figures/``, ``tidy.csv``, ``fits.csv`` and ``problems.json``.

    Args:
        analysis: what :func:`analyse` computed.
        out_dir: the output directory.
        title: the page title.
        demos: also draw the teaching demos (Nadaraya-Watson regression, masked attention weights),
            which train and compute on every build, in a collapsed section.
    """
    out_dir = Path(out_dir)
    fig_dir = out_dir / "figures"
    loaded, fits = analysis.loaded, analysis.fits
    frame = loaded.frame
    problems, notes = list(loaded.problems), list(loaded.notes)
    top: list[str] = []
    if problems:
        items = "".join(f"<li>{html.escape(p)}</li>" for p in problems[:5])
        more = f"<li>... and {len(problems) - 5} more (Problems, below; <code>problems.json</code>)</li>" if len(problems) > 5 else ""
        top.append(f'<div class="note bad"><strong>Some inputs could not be read and were skipped:</strong><ul>{items}{more}</ul></div>')
    if notes:
        items = "".join(f"<li>{html.escape(n)}</li>" for n in notes)
        top.append(f'<div class="note"><strong>Notes:</strong><ul>{items}</ul></div>')
    body: list[str] = []
    details: list[str] = []
    main, main_fits, scope = frame, fits, ""
    if len(frame) and len(analysis.sides) > 1 and analysis.primary:  # the story is told from one side; the rest is compared
        main = frame[_side_key(frame) == analysis.primary["side"]]
        if len(fits):
            main_fits = fits[(fits["machine"].astype(str) == analysis.primary["machine"])
                             & (fits["commit"].astype(str) == analysis.primary["commit"])]
        scope = f" Shown for {html.escape(analysis.primary['side'])}; the other runs are compared below."
    if len(frame):
        body.append(_findings_html(analysis))
        body.append(_figure(fig_dir, "progression", plots.progression(main, main_fits),
                            "The teaching progression (" + " → ".join(PROGRESSION) + "): median time per call and peak tensor "
                            "memory above the inputs vs L, log-log, forward. Each line's end says its fitted slope (a conclusive "
                            "Theil-Sen fit) or that the fit is inconclusive; dotted memory is the analytic model, not a measurement." + scope,
                            css="head"))
        body.append('<h2 id="families">The families</h2>')
        body.append(_figure(fig_dir, "time", plots.scaling(main, "time"),
                            "Time per call vs L, one panel per family (dense, fused SDPA, blockwise, linear, scoring functions, "
                            "compiled), lines labelled at their end. Dashed grey: O(n) and O(n²) through the shortest length. "
                            "Red crosses: wrong results; hollow circles: noisy measurements (neither is a fact)." + scope))
        body.append(_figure(fig_dir, "memory", plots.scaling(main, "peak_tensor_bytes"),
                            "Peak tensor memory above the inputs vs L: dense variants climb at O(n²), chunked/SDPA/linear at O(n). "
                            "Dotted series labelled <em>(model)</em> are the analytic prediction, not a measurement."))
        pick = analysis.primary
        one_slice = {m: t[(t["machine"].astype(str) == pick["machine"]) & (t["commit"].astype(str) == pick["commit"])
                          & (t["device"].astype(str) == pick["device"]) & (t["mode"].astype(str) == pick["mode"])
                          & (t["dtype"].astype(str) == pick["dtype"]) & (t["mask"].astype(str) == pick["mask"])]
                     for m, t in analysis.crossovers.items()} if pick else {}
        cross = _figure(fig_dir, "crossovers", plots.crossover_matrix(one_slice),
                        "Crossovers, variant x baseline. Cell: from which L the variant stays faster (time) or smaller (peak "
                        "tensor memory) than the baseline at every longer measured L, and baseline / variant at the longest "
                        "common L; colour: that ratio on a log scale centred at 1x (blue: better than the baseline). Measured, "
                        "correct cases only (no wrong, noisy or model values). "
                        f"{html.escape(', '.join(str(pick.get(k, '')) for k in ('device', 'mode', 'dtype')))} cases{scope}")
        if cross:
            body.append('<h2 id="crossovers-h">Crossovers</h2>' + cross)
        same = _machine(frame, analysis.primary) if analysis.primary else frame  # prefill and decode may be two runs
        same_fits = _pair(fits, analysis.primary, _decode_commit(frame, analysis.primary)) if analysis.primary else fits
        body.append(_prefill_decode_html(same, same_fits, fig_dir))
        body.append(_roofline_html(same, fig_dir))
    summary = analysis.summary
    doc = complexity.__doc__.split(chr(10) + chr(10))[1]
    body.append('<section id="exponents"><h2>Fitted exponents: the O(n²) claim in numbers</h2>' + _headline(frame, fits)
                + _table(summary, keep=("variant",))
                + _details("How the exponents are fitted", f"<p>{_rst_to_html(doc)}</p>") + "</section>")
    wrong = _wrong_section(frame)
    if wrong:
        body.append(wrong)
    if len(frame):
        body.append(_comparison_html(analysis, fig_dir))
        details.append(_details("Achieved GFLOP/s and % of the matmul peak",
                                _figure(fig_dir, "gflops", plots.gflops(frame),
                                        "Achieved GFLOP/s on executed FLOPs; dotted line: this machine's fp32 matmul peak.")))
        accuracy = _figure(fig_dir, "accuracy", plots.error_vs_time(frame),
                           "Approximate variants: error against exact softmax attention vs time, each point labelled by its L.")
        if accuracy:
            details.append(_details("Accuracy of the approximate variants", accuracy))
        speedups = "".join(_figure(fig_dir, f"speedup_{b}", plots.speedup_heatmap(frame, b),
                                   f"Speedup over <code>{b}</code> per variant and L (correct cases only; colour clipped at 1000x).")
                           for b in ("loop", "batched"))
        if speedups:
            details.append(_details("Speedup per variant and length (heatmaps)", speedups))
        cross_tables = "".join(f"<h3>{m}</h3>" + _table(t, formats={"ratio_at_longest": lambda v: fmt(float(v), "x")}, keep=("variant",))
                               for m, t in analysis.crossovers.items())
        details.append(_details("Crossover tables", "<p>Smallest length from which a variant stays faster (or smaller) than the "
                                "baseline at every longer length measured; ratio = baseline / variant at the longest common length.</p>"
                                + cross_tables))
        details.append(_details("Largest length within budget", _table(complexity.largest_length(frame), keep=("variant",))))
        mm = complexity.memory_model(frame)
        mm_fmt = {c: (lambda v: fmt(float(v) * 2**20, "bytes")) for c in ("predicted_MiB", "measured_MiB")}
        mm_fmt["measured/predicted"] = lambda v: fmt(float(v), "x")
        if len(mm):
            mm = mm.rename(columns={"predicted_MiB": "predicted", "measured_MiB": "measured"})
            mm_fmt = {"predicted": mm_fmt["predicted_MiB"], "measured": mm_fmt["measured_MiB"], "measured/predicted": mm_fmt["measured/predicted"]}
        details.append(_details("Memory model: predicted vs measured", "<p>Measurements only (method profiler / cuda): cases whose "
                                "memory was itself the model's prediction are not compared with it.</p>" + _table(mm, formats=mm_fmt, keep=("variant",))))
        details.append(_details("SDPA kernel provenance", "<p>The backend each SDPA-backed case asked for, and the kernel the "
                                "profiler saw run. A fallback to <code>math</code> costs O(n²) memory.</p>" + _table(provenance(frame), keep=("variant",))))
        compile_rows = frame[(frame["metric"] == "compile_time") & (frame["status"] == "ok")]
        if len(compile_rows):
            cols = ["machine", "device", "variant", "seq_len", "dtype", "mode", "value"]
            details.append(_details("Compilation time (outside every timed region)",
                                    _table(compile_rows[cols].rename(columns={"value": "compile time"}),
                                           formats={"compile time": lambda v: fmt(float(v), "s")}, keep=("variant",))))
        commits = frame[frame["commit"] != ""].groupby("commit").agg(commit_date=("date", "min"), run_date=("run_date", "min"))
        if len(commits) > 1:
            commits = commits.sort_values("commit_date").reset_index()
            commits["commit"] = commits["commit"].map(_short)
            details.append(_details("Commits", _table(commits.rename(columns={"commit_date": "commit date", "run_date": "run date"}),
                                                      formats={"commit date": _when, "run date": _when}, keep=("commit",))))
        bad = frame[(frame["status"] != "ok") & (frame["metric"] == "time")]
        cols = ["origin", "machine", "variant", "seq_len", "device", "mode", "status", "reason"]
        details.append(_details(f"Skipped and failed cases ({len(bad)})", _table(bad[[c for c in cols if c in bad]].drop_duplicates(),
                                                                                  keep=("variant", "status")), ident="problems"))
        details.append(_details("Environment", _environment(frame, loaded.sources)))
    if problems:
        details.append(_details(f"Problems with the inputs ({len(problems)})",
                                "<ul>" + "".join(f"<li>{html.escape(p)}</li>" for p in problems) + "</ul>"))
    full = fits.copy()
    if len(full):
        full.insert(0, "fit", full.apply(_fmt_fit, axis=1))
        full["commit"] = full["commit"].map(_short)
    details.append(_details("Full fit table", _table(full, keep=("variant", "metric"))))
    if demos:
        nw_fig, nw = plots.nadaraya_watson()
        details.append(_details("Teaching demos: attention weights", _figure(
            fig_dir, "nadaraya_watson", nw_fig,
            f"Nadaraya-Watson kernel regression through the <code>dot</code> variant. Test MSE non-parametric "
            f"{nw['nonparametric_test_mse']:.3f}, parametric {nw['parametric_test_mse']:.3f} (learned w = {nw['learned_w']:.2f}).")
            + _figure(fig_dir, "masked_weights", plots.masked_weights(),
                      "Attention weights computed by the variants themselves (v = I) under a causal mask, a sliding window and a "
                      "block-sparse pattern.")))
    details.append(_details("Reproduce", "<p>Sweep and report: <code>attnbench run</code>; from asv results: <code>asv run</code> "
                            "then <code>attnbench report --from .asv/results</code>; two runs side by side: <code>attnbench report "
                            "--from RUN_A --from RUN_B</code>; teaching demos: <code>--demos</code>. Tidy data: <code>tidy.csv</code>; "
                            "fits: <code>fits.csv</code> (beside this page); inputs that could not be used: <code>problems.json</code>.</p>"))
    generated = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    page = (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
            f"<style>{CSS}</style></head><body><h1>{html.escape(title)}</h1>{_subtitle(analysis)}{''.join(top)}"
            f"{''.join(b for b in body if b)}<h2 id=\"details\">Details</h2>{''.join(details)}"
            f'<p class="sub">generated {generated}</p><script>{SORT_JS}</script></body></html>')
    atomic_write(out_dir / "tidy.csv", lambda tmp: frame.to_csv(tmp, index=False))
    atomic_write(out_dir / "fits.csv", lambda tmp: fits.to_csv(tmp, index=False))
    atomic_write_text(out_dir / "problems.json", json.dumps({"problems": problems, "notes": notes}, indent=1))
    path = atomic_write_text(out_dir / "report.html", page)
    return ReportOutcome(page=path, rows=len(frame), problems=tuple(problems), notes=tuple(notes))


ROOFLINE_CAPTION = (
    "Arithmetic intensity (executed FLOPs per byte an ideal kernel moves: q, k, v read and the output written once) "
    "against achieved GFLOP/s, log-log, under the roofs measured on the same machine: the matmul peak (compute) and "
    "STREAM triad bandwidth x intensity (memory). Circles: prefill (Lq = Lk); triangles: decode (one query over a "
    "KV cache). Colour: the variant's family. Correct, undisturbed measurements only.")


def _roofline_html(frame: pd.DataFrame, fig_dir: Path, scope: str = "") -> str:
    """The roofline figure and, collapsed under it, every case's % of its binding roof (empty when nothing can be placed)."""
    table = roofline.roofline(frame)
    fig = _figure(fig_dir, "roofline", plots.roofline(table), ROOFLINE_CAPTION + scope)
    if not fig:
        return ""
    placed = table[table["ai"].notna()].copy()
    placed["L"] = placed["seq_len"].where(placed["workload"] == "prefill", placed["seq_len_k"])
    shown = placed[["machine", "device", "dtype", "mode", "workload", "variant", "seq_len", "L", "ai", "gflops", "gbps",
                    "bound", "pct_of_roof", "pct_of_compute", "pct_of_bandwidth"]].rename(columns={
        "seq_len": "Lq", "ai": "FLOP/byte", "gflops": "achieved", "gbps": "moved", "bound": "binding roof",
        "pct_of_roof": "% of binding roof", "pct_of_compute": "% of compute", "pct_of_bandwidth": "% of bandwidth"})
    pct = lambda v: f"{plots._sig(float(v))}%"  # noqa: E731
    formats = {"achieved": lambda v: fmt(float(v), "GFLOP/s"), "moved": lambda v: fmt(float(v), "GB/s"),
               "% of binding roof": pct, "% of compute": pct, "% of bandwidth": pct}
    roofs = table.dropna(subset=["peak_gflops"]).drop_duplicates(["machine", "device", "dtype"])
    named = "; ".join(f"{r['machine']} {r['device']} {r['dtype']}: matmul {fmt(float(r['peak_gflops']), 'GFLOP/s')}, "
                      + (f"triad {fmt(float(r['peak_gbps']), 'GB/s')}" if r["peak_gbps"] == r["peak_gbps"] else "bandwidth not recorded")
                      for r in roofs.to_dict("records"))
    note = ("<p>Roofs: " + html.escape(named or "not recorded") + ". The binding roof is the lower of the two at the case's "
            "intensity; <code>attnbench peak</code> measures both (asv results record no bandwidth).</p>")
    return ('<section id="roofline-s"><h2>Roofline: prefill and decode against the measured roofs</h2>' + fig
            + _details(f"% of the binding roof per case ({len(shown)})", note + _table(shown, formats=formats, keep=("variant",)))
            + "</section>")


def _prefill_decode_html(frame: pd.DataFrame, fits: pd.DataFrame, fig_dir: Path, scope: str = "") -> str:
    """The prefill vs decode section: only when decode cases ran."""
    if "workload" not in frame or not ((frame["workload"] == "decode") & (frame["status"] == "ok")).any():
        return ""
    fig = _figure(fig_dir, "prefill_decode", plots.prefill_vs_decode(frame, fits),
                  "Left: decode, time per generated token (one query row) vs the context length Lk it attends to, declared "
                  "O(L) per token. Right: prefill, time per call vs L = Lq = Lk, declared O(L²). Log-log; each line's end "
                  "says its fitted slope when the Theil-Sen fit is conclusive." + scope)
    return f'<section id="prefill-decode"><h2>Prefill vs decode</h2>{fig}</section>' if fig else ""


def _environment(frame: pd.DataFrame, sources: Sequence[str]) -> str:
    def values(col: str, short: bool = False) -> str:
        vals = [str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")] if col in frame else []
        vals = [v[:SHORT_HASH] for v in vals] if short else vals
        return ", ".join(sorted(vals)[:8]) or "-"

    peaks = frame["peak_gflops"].dropna().unique()
    rows = [
        ("machine", values("machine")), ("CPU", values("cpu")), ("GPU", values("gpu")), ("torch", values("torch")),
        ("threads", ", ".join(f"{t:g}" for t in sorted(frame["threads"].dropna().unique())) or "-"),
        ("matmul peak", ", ".join(fmt(float(p), "GFLOP/s") for p in sorted(peaks)) or "-"),
        ("run dates", _when(frame["run_date"].min()) + (f" to {_when(frame['run_date'].max())}" if frame["run_date"].nunique() > 1 else "")),
        ("commits", values("commit", short=True)), ("sources", ", ".join(sources)),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return f'<table class="meta">{body}</table>'


def make_report(sources: Iterable[str | Path], out_dir: str | Path, title: str = "attnbench report",
                demos: bool = False) -> ReportOutcome:
    """Load, analyse and render: ``render(analyse(load_results(sources)), ...)``."""
    return render(analyse(load_results(sources)), out_dir, title, demos=demos)


def build_report(sources: Iterable[str | Path], out_dir: str | Path, title: str = "attnbench report",
                 demos: bool = False) -> Path:
    """Load ``sources`` (asv results dirs and/or run dirs), analyse, draw, and write the report.

    Returns:
        Path of ``report.html`` inside ``out_dir`` (which also receives ``figures/``,
        ``tidy.csv``, ``fits.csv`` and ``problems.json``). :func:`make_report` also says what loaded.
    """
    return make_report(sources, out_dir, title, demos=demos).page
