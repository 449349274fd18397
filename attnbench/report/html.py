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

import datetime as dt
import html
import json
import re
from collections.abc import Callable
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import changes, complexity, growth
from attnbench.analysis.findings import OWN_AT_MOST, PAGE_FAULTS_COUNT, own_variants
from attnbench.analysis.summary import VERDICT, VERDICT_DETAILS, Analysis
from attnbench.analysis.text import fmt, short_hash, sig
from attnbench.contract import FAMILIES, PROGRESSION, Basis, GateVerdict, Status
from attnbench.io import atomic_write, atomic_write_text
from attnbench.report import history_plots, plots, style
from attnbench.report.details import (
    COUNTS_CAVEAT,
    accuracy_section,
    commits_section,
    compile_times_section,
    crossover_tables_section,
    demos_section,
    environment_section,
    failed_section,
    full_fits_section,
    gflops_section,
    instructions_section,
    largest_length_section,
    memory_model_section,
    page_faults_section,
    problems_section,
    provenance_section,
    reproduce_section,
    runqueue_section,
    speedups_section,
    why_undrawn,
)
from attnbench.report.markup import (
    Page,
    ReportOutcome,
    collapsible,
    empty_note,
    figure_in,
    html_table,
    inline_code,
    rst_to_html,
    utc_time,
    whole_page,
)

__all__ = [
    "HEADLINE_OWN",
    "BODY",
    "CLOSING",
    "COMPARED",
    "DETAILS",
    "STORY",
    "Section",
    "headline_variants",
    "history_section",
    "render",
    "render_history",
    "roofline_caption",
]


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
        f'<li>{inline_code(f.text)} <a href="#{f.target}">[figure]</a></li>'
        if f.target.startswith("fig")
        else f'<li>{inline_code(f.text)} <a href="#{f.target}">[details]</a></li>'
        for f in analysis.findings
    )
    return (
        '<section id="findings"><h2 style="margin-top:.6rem">Findings</h2>'
        f'<ol class="findings">{items}</ol>'
        f'<p class="sub">{html.escape(_read_from(analysis, scope))}</p></section>'
    )


def _read_from(analysis: Analysis, scope: str) -> str:
    """Which cases the findings are read from: time from undisturbed ones (when there are any),
    memory and page faults from noisy ones too (a busy machine moves time, not bytes or counts)."""
    rows = analysis.main
    rows = rows[rows["metric"] == "time"] if "metric" in rows else rows
    for k in ("device", "mode", "dtype"):
        if k in analysis.primary and k in rows:
            rows = rows[rows[k].astype(str) == analysis.primary[k]]
    timed = (
        "time from the cases that ran undisturbed (status ok)"
        if "status" in rows and (rows["status"] == Status.OK).any()
        else "no time (no case ran undisturbed)"
    )
    return (
        f"Read from {scope} cases: {timed}; memory and page-fault fits also use noisy cases, whose "
        f"bytes and counts are exact ({PAGE_FAULTS_COUNT}). Noisy, wrong and failed cases are "
        "never ranked, a noisy case's time is never fitted, and an inconclusive fit's exponent is "
        "shown, marked inconclusive, and called neither a match nor a mismatch."
    )


def _answer_table(analysis: Analysis) -> str:
    """Each variant's answer check, collapsed under the findings (open when any is wrong)."""
    table = analysis.answers
    if not len(table) or not table["cases run"].sum():
        return ""
    wrong = bool((table["wrong"] > 0).any())
    formats = {
        "worst error": lambda v: f"{float(v):.3g}",
        "its tolerance": lambda v: f"{float(v):.3g}",
        "worst / tolerance": lambda v: fmt(float(v), "x"),
    }
    body = (
        "<p>Every measured call's output is compared with a float64 reference: a case whose "
        "largest error exceeds its tolerance is <code>wrong</code>: it is never fitted or "
        "ranked, and the figures draw it as a red cross, never in a line. "
        "<em>slices checked</em>: the (batch, head) slices compared, "
        "of all the case has.</p>"
        + html_table(
            table,
            formats=formats,
            keep=("variant", "worst error", "its tolerance", "slices checked"),
            css="bad" if wrong else "",
        )
    )
    return collapsible(
        "Answer check per variant" + (" (wrong answers)" if wrong else ""),
        body,
        open_=wrong,
        ident="answers",
    )


HEADLINE_OWN = OWN_AT_MOST
"""A run of at most this many variants (a selection named with ``--variants``) leads with all of
them; a broader sweep leads with the teaching progression."""


def headline_variants(frame: pd.DataFrame) -> tuple[str, ...]:
    """The headline's lines: the progression, the fused backends that ran on CUDA, the run's own.

    On a GPU the fused backends (FlashAttention, memory-efficient, cuDNN) are what decides, and a
    train run may hold no ``sdpa`` at all; on CPU ``sdpa`` already runs the flash kernel. A run of
    few variants (at most :data:`HEADLINE_OWN`: the ones its user named) shows every one of them,
    and any run shows every plugin variant: the kernel its author came to measure.
    """
    timed = frame[frame["metric"] == "time"]
    ran = timed[(timed["status"] == Status.OK) & timed["device"].astype(str).str.startswith("cuda")]
    fused = [v for v in FAMILIES["fused"] if v not in PROGRESSION and v in set(ran["variant"])]
    own = [v for v in own_variants(frame) if v not in PROGRESSION and v not in fused]
    return (*PROGRESSION, *fused, *own)


def _progression(page: Page) -> str:
    variants = headline_variants(page.analysis.main)
    extra = [v for v in variants[len(PROGRESSION) :] if v not in FAMILIES["fused"]]
    fused = [v for v in variants[len(PROGRESSION) :] if v in FAMILIES["fused"]]
    ran = set(page.analysis.main["variant"])
    drawn = [v for v in variants if v in ran]
    title = (
        plots.PROGRESSION_TITLE
        if not extra
        else f"This run's variants ({', '.join(drawn)}): time and memory vs L (log-log, fitted "
        "slopes at line ends)"
    )
    caption = (
        (
            "The teaching progression ("
            + " → ".join(PROGRESSION)
            + (f", and the fused backends that ran: {', '.join(fused)}" if fused else "")
            + ")"
        )
        if not extra
        else "The variants this run measured (" + ", ".join(drawn) + ")"
    ) + (
        ": median time per call and peak tensor memory above the inputs vs L, log-log, "
        "forward. Each line's end names its variant and says its fitted slope (a conclusive "
        "fit) or that the fit is inconclusive"
        + (
            "; dotted memory is the analytic model, not a measurement"
            if plots.draws_model(page.analysis.main, variants)
            else ""
        )
        + "; a panel with nothing to draw says why."
        + page.scope
    )
    figure = page.figure(
        "progression",
        plots.progression(page.analysis.main, page.analysis.main_fits, variants, title),
        caption,
        css="head",
    ) or empty_note(
        "the headline figure", why_undrawn(page.analysis.main, ("time", "peak_tensor_bytes"))
    )
    return figure + _answer_table(page.analysis)


def _marks(main: pd.DataFrame) -> str:
    """The time figure's marks for what is not a fact, named only where the figure draws them (a
    newcomer read of red crosses and hollow circles under a figure that had neither)."""
    drawn = set(main.loc[main["metric"] == "time", "status"]) if len(main) else set()
    marks = [
        words
        for status, words in (
            (Status.WRONG, "red crosses: wrong results (no variant's own points are crosses)"),
            (Status.NOISY, "hollow circles in a variant's colour: its noisy measurements"),
        )
        if status in drawn
    ]
    if not marks:
        return ""
    said = "; ".join(marks)
    return (
        said[0].upper() + said[1:] + (", neither a fact. " if len(marks) > 1 else ", not a fact. ")
    )


def _families(page: Page) -> str:
    main = page.analysis.main
    figures = page.figure(
        "time",
        plots.scaling(main, "time"),
        f"Time per call vs L, {html.escape(plots.scaling_panels(main, 'time'))}, lines labelled "
        "at their end. Dashed grey: O(L) and O(L²) through the shortest length. "
        + _marks(main)
        + "Bars: the interquartile range of the timing blocks."
        + page.scope,
    ) + page.figure(
        "memory",
        plots.scaling(main, "peak_tensor_bytes"),
        "Peak tensor memory above the inputs vs L: dense variants climb at O(L²), "
        "chunked/SDPA/linear at O(L)."
        + (
            " Dotted series labelled <em>(model)</em> are the analytic prediction, not a "
            "measurement."
            if plots.draws_model(main)
            else ""
        ),
    )
    if not figures:
        figures = empty_note("the families", why_undrawn(main, ("time", "peak_tensor_bytes")))
    elif not (main["metric"].eq("time") & main["status"].eq(Status.OK)).any():
        figures = empty_note("the time figure", why_undrawn(main, ("time",))) + figures
    return '<h2 id="families">The families</h2>' + figures


def _crossovers(page: Page) -> str:
    pick = page.analysis.primary
    setting = html.escape(", ".join(str(pick.get(k, "")) for k in ("device", "mode", "dtype")))
    cross = page.figure(
        "crossovers",
        plots.crossover_matrix(page.analysis.primary_crossovers),
        "Crossovers, variant x baseline. Cell: from which L the variant stays faster (time) or "
        "smaller (peak tensor memory) than the baseline at every longer measured L, and "
        "baseline / variant at the longest common L; colour: that ratio on a log scale centred "
        f"at 1x (blue: better than the baseline). {complexity.CROSSOVER_WORDS}. "
        "Measured, correct cases only: time from undisturbed cases, peak memory "
        "from noisy ones too (their bytes are exact); no model values. "
        f"{setting} cases{page.scope}",
    )
    if not cross:
        cross = empty_note(
            "the crossovers",
            "no variant and baseline (loop, batched, sdpa) were both measured correctly and "
            "undisturbed at a common length; "
            + why_undrawn(page.analysis.main, ("time", "peak_tensor_bytes")),
        )
    return '<h2 id="crossovers-h">Crossovers</h2>' + cross


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
            f"x intensity (memory). {drawn[0].upper() + drawn[1:]}. Colour: the variant, named "
            "in the legend. Correct, undisturbed measurements only."
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
    heading = "<h2>Roofline: prefill and decode against the measured roofs</h2>"
    if not fig:
        return f'<section id="roofline-s">{heading}{_no_roofline(page)}</section>'
    return f'<section id="roofline-s">{heading}{fig}{_roof_table(table)}</section>'


def _no_roofline(page: Page) -> str:
    """Why the roofline has nothing to place, in one line."""
    peak = page.frame["peak_gflops"].notna().any() if "peak_gflops" in page.frame else False
    why = (
        why_undrawn(page.analysis.machine, ("gflops",))
        if peak
        else "the run recorded no matmul peak to draw the roofs from"
    )
    return empty_note("the roofline", "it places correct, undisturbed rates; " + why)


def _roof_table(table: pd.DataFrame) -> str:
    """Each placed case's % of its binding roof, collapsed."""
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
    return collapsible(
        f"% of the binding roof per case ({len(shown)})",
        _roof_note(table) + html_table(shown, formats=formats, keep=("variant",)),
    )


def _headline(frame: pd.DataFrame, headline: tuple[str, str], fits: pd.DataFrame) -> str:
    """The fits' headline, its inconclusive fits listed with why (the notes the table reads)."""
    if frame.empty:
        return (
            '<p class="bad">Nothing could be loaded: there are no measurements to show '
            "(the reasons are listed above).</p>"
        )
    tone, text = headline
    items = complexity.tally(fits).inconclusive if len(fits) else ()
    said = f'<p class="{tone}">{html.escape(text)}</p>'
    if not items:
        return said
    listed = "".join(f"<li>{html.escape(i)}</li>" for i in items)
    return said + collapsible(f"Inconclusive fits ({len(items)}) and why", f"<ul>{listed}</ul>")


def _exponents(page: Page) -> str:
    fits = page.analysis.fits
    caveat = (
        f'<p class="sub">{html.escape(COUNTS_CAVEAT)}</p>'
        if len(fits) and (fits["metric"] == "instructions").any()
        else ""
    )
    return (
        '<section id="exponents"><h2>Fitted exponents: the big-O claims in numbers</h2>'
        + _headline(page.frame, page.analysis.headline, page.analysis.fits)
        + html_table(page.analysis.summary, keep=("variant",), titles={VERDICT: VERDICT_DETAILS})
        + '<p class="sub">Hover a verdict for the rule that decided it; a cell without a '
        "fit says why there is none; every fit is in the full fit table (Details).</p>"
        + caveat
        + collapsible("How the exponents are fitted", f"<p>{rst_to_html(complexity.FIT_RULE)}</p>")
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
        '<a id="wrong"></a>'
        '<h2 class="bad">Wrong results: cases that failed the correctness gate</h2>'
        '<p class="bad">These cases produced output outside their tolerance. They are left out '
        "of the fits, crossovers, rankings and speedup figures; their timings are not claims.</p>"
        f'<div class="bad">{html_table(wrong, keep=("variant",))}</div>'
    )


def _ratio_table(ratios: pd.DataFrame) -> str:
    """variant x L table of the median B / A ``ratio``."""
    table = ratios.pivot_table(index="variant", columns="seq_len", values="ratio", aggfunc="median")
    table.columns = [f"L={c}" for c in table.columns]
    table = table.reset_index()
    fmt_x = {c: (lambda v: fmt(float(v), "x")) for c in table.columns if c != "variant"}
    return html_table(table, formats=fmt_x, lift=False)


def _comparison_ratios(page: Page) -> list[str]:
    out = []
    for k, comp in enumerate(page.analysis.comparisons):
        out.append(
            page.figure(
                f"comparison_{k + 1}",
                history_plots.comparison(comp.ratios, comp.label_a, comp.label_b),
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
            + html_table(
                sides, keep=("side",), formats={"run date": utc_time, "commit date": utc_time}
            )
        )
    out += _comparison_ratios(page)
    out.append(
        page.figure(
            "history",
            history_plots.history(page.frame),
            "History over commits (asv results with several commits; short hashes).",
        )
    )
    out.append(
        page.figure("machines", history_plots.machines(page.frame), "Side by side per machine.")
    )
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
            fig = history_plots.growth(
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
    keys = ["benchmark", *(c for c in contract.ASV_CASE if c not in contract.LENGTHS), "metric"]
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
        + collapsible(
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
        + html_table(shown.rename(columns={"commit": "commit(s)"}), lift=False)
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
            figure_in(
                fig_dir,
                name,
                history_plots.case_history(
                    rows, mine, history.commits, f"{label} on {case['machine']}"
                ),
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
    with style.drawing():
        section = history_section(history, out_dir / "figures")
    atomic_write(out_dir / "steps.csv", lambda tmp: history.steps.to_csv(tmp, index=False))
    return atomic_write_text(out_dir / "history.html", whole_page(title, section, generated))


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
    gflops_section,
    instructions_section,
    page_faults_section,
    accuracy_section,
    speedups_section,
    crossover_tables_section,
    largest_length_section,
    memory_model_section,
    provenance_section,
    compile_times_section,
    runqueue_section,
    commits_section,
    failed_section,
    environment_section,
)
"""The collapsed sections, drawn when anything loaded."""
CLOSING: tuple[Section, ...] = (
    problems_section,
    full_fits_section,
    demos_section,
    reproduce_section,
)
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
    with style.drawing(analysis.variant_order):
        body = [s(page) for s in ((*STORY, *BODY, *COMPARED) if anything else BODY)]
        details = [s(page) for s in ((*DETAILS, *CLOSING) if anything else CLOSING)]
    generated = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
    html_page = whole_page(
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
