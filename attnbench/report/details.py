"""The report's collapsed sections (``<details>``): full tables, provenance, environment, problems.

Each is a function of a :class:`~attnbench.report.markup.Page` returning its HTML ("" for
nothing); :mod:`attnbench.report.html` assembles them into the page.
"""

from __future__ import annotations

import html
import math

import pandas as pd

from attnbench import contract
from attnbench import demos as teaching
from attnbench.analysis import complexity
from attnbench.analysis.findings import PAGE_FAULTS_COUNT
from attnbench.analysis.summary import provenance
from attnbench.analysis.text import fmt, short_hash
from attnbench.contract import Status
from attnbench.report import plots
from attnbench.report.markup import (
    Page,
    collapsible,
    empty_note,
    html_table,
    utc_time,
)

__all__ = [
    "COUNTS_CAVEAT",
    "RUNQUEUE_CASE",
    "accuracy_section",
    "commits_section",
    "compile_times_section",
    "crossover_tables_section",
    "demos_section",
    "environment_section",
    "failed_section",
    "full_fits_section",
    "gflops_section",
    "instructions_section",
    "largest_length_section",
    "memory_model_section",
    "page_faults_section",
    "problems_section",
    "provenance_section",
    "reproduce_section",
    "runqueue_section",
    "speedups_section",
    "why_undrawn",
]


_WHAT = {"time": "time", "peak_tensor_bytes": "memory", "gflops": "GFLOP/s"}


def why_undrawn(frame: pd.DataFrame, metrics: tuple[str, ...]) -> str:
    """Why ``metrics`` have no point to draw, from their rows' statuses: "every time case was noisy
    (12); no memory was measured" (prefill shapes, Lq = Lk, only: the figures' rows)."""
    parts = []
    for metric in metrics:
        what = _WHAT.get(metric, metric)
        rows = frame[frame["metric"] == metric] if len(frame) else frame
        if len(rows) and "seq_len_k" in rows:
            square = rows[rows["seq_len"] == rows["seq_len_k"]]
            if not len(square):
                parts.append(f"no {what} case had Lq = Lk (prefill): only decode ran")
                continue
            rows = square
        if not len(rows):
            parts.append(f"no {what} was measured")
        elif not (rows["status"] == Status.OK).any():
            counts = " or ".join(f"{k} ({n})" for k, n in rows["status"].value_counts().items())
            parts.append(f"every {what} case was {counts}")
    return "; ".join(parts) or "no measured value is above zero"


# ---- the details (collapsed) ---------------------------------------------------------------------
def gflops_section(page: Page) -> str:
    peak = page.frame["peak_gflops"].notna().any()
    figure = page.figure(
        "gflops",
        plots.gflops(page.frame),
        "Achieved GFLOP/s on executed FLOPs"
        + ("; dotted line: this machine's matmul peak." if peak else "."),
    )
    return collapsible(
        "Achieved GFLOP/s and % of the matmul peak",
        figure or empty_note("the GFLOP/s figure", why_undrawn(page.frame, ("gflops",))),
    )


def page_faults_section(page: Page) -> str:
    fig = page.figure(
        "page_faults",
        plots.scaling(page.analysis.main, "page_faults"),
        "Minor page faults per call vs L: the fresh pages a call maps (the kernel zero-fills "
        f"each on first touch). {PAGE_FAULTS_COUNT[:1].upper()}{PAGE_FAULTS_COUNT[1:]}. Dense "
        "variants allocate new O(L²) score buffers on every call, so on a CPU part of their time "
        "is this. Fitted exponents are in the full fit table (metric page_faults)." + page.scope,
    )
    return collapsible("Page faults per call", fig) if fig else ""


COUNTS_CAVEAT = (
    "Instruction counts (valgrind's callgrind, portable kernels) do not move with a busy "
    "neighbour, so their exponents are the steadiest O(L²) evidence here; but they do not see "
    "cache misses, page faults, memory bandwidth or time spent waiting for memory or for other "
    "threads (counts are summed over threads): a change that only moves data worse is flat in "
    "counts and slower in time."
)


def instructions_section(page: Page) -> str:
    fig = page.figure(
        "instructions",
        plots.scaling(page.analysis.main, "instructions"),
        "Instructions per call vs L, counted under valgrind. "
        + html.escape(COUNTS_CAVEAT)
        + page.scope,
    )
    return collapsible("Instruction counts per call", fig) if fig else ""


def accuracy_section(page: Page) -> str:
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
    return collapsible("Accuracy of the approximate variants", accuracy) if accuracy else ""


def speedups_section(page: Page) -> str:
    speedups = "".join(
        page.figure(
            f"speedup_{b}",
            plots.speedup_heatmap(page.frame, b),
            f"Speedup over <code>{b}</code> per variant and L (correct cases only; colour "
            "clipped at 1000x).",
        )
        for b in ("loop", "batched")
    )
    return collapsible("Speedup per variant and length (heatmaps)", speedups) if speedups else ""


def crossover_tables_section(page: Page) -> str:
    tables = "".join(
        f"<h3>{m}</h3>"
        + html_table(
            t, formats={"ratio_at_longest": lambda v: fmt(float(v), "x")}, keep=("variant",)
        )
        for m, t in page.analysis.crossovers.items()
    )
    intro = (
        "<p>Smallest length from which a variant stays faster (or smaller) than the baseline at "
        f"every longer length measured ({complexity.CROSSOVER_WORDS}); lengths: how many both "
        "ran at; ratio = baseline / variant at the longest common length.</p>"
    )
    return collapsible("Crossover tables", intro + tables)


def largest_length_section(page: Page) -> str:
    return collapsible(
        "Largest length within budget",
        html_table(page.analysis.largest, keep=("variant",)),
    )


def memory_model_section(page: Page) -> str:
    mm = page.analysis.memory_model
    mib = lambda v: fmt(float(v) * 2**20, "bytes")  # noqa: E731
    ratio = lambda v: fmt(float(v), "x")  # noqa: E731
    mm_fmt = {"predicted_MiB": mib, "measured_MiB": mib, "measured/predicted": ratio}
    if len(mm):
        mm = mm.rename(columns={"predicted_MiB": "predicted", "measured_MiB": "measured"})
        mm_fmt = {"predicted": mib, "measured": mib, "measured/predicted": ratio}
    return collapsible(
        "Memory model: predicted vs measured",
        "<p>Measurements only (method profiler / cuda): cases whose "
        "memory was itself the model's prediction are not compared with it. A variant whose "
        "model grows faster than its declared memory exponent has no model here, and its "
        "note says so.</p>" + html_table(mm, formats=mm_fmt, keep=("variant",)),
    )


def provenance_section(page: Page) -> str:
    return collapsible(
        "SDPA kernel provenance",
        "<p>The backend each SDPA-backed case asked for, and the kernel the "
        "profiler saw run. A fallback to <code>math</code> costs O(L²) memory.</p>"
        + html_table(provenance(page.frame), keep=("variant",)),
    )


def compile_times_section(page: Page) -> str:
    frame = page.frame
    rows = frame[(frame["metric"] == "compile_time") & (frame["status"] == Status.OK)]
    if not len(rows):
        return ""
    cols = ["machine", "device", "variant", "seq_len", "dtype", "mode", "value"]
    return collapsible(
        "Compilation time (outside every timed region)",
        html_table(
            rows[cols].rename(columns={"value": "compile time"}),
            formats={"compile time": lambda v: fmt(float(v), "s")},
            keep=("variant",),
        ),
    )


RUNQUEUE_CASE = contract.case_columns(
    (
        "origin",
        "machine",
        "device",
        "variant",
        "workload",
        *contract.LENGTHS,
        *contract.SHAPE,
        "dtype",
        "mode",
    )
)
"""The tidy columns that name one case of the run-queue table, in the table's order."""


def runqueue_section(page: Page) -> str:
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
        "thread. This is one of three signs of a disturbed case, each measured again within its "
        "retry budget: too few undisturbed blocks, a calibration probe (a fixed matmul timed "
        "around the case) off the sweep's typical speed, or block times in two clusters. A case "
        "still disturbed is <code>noisy</code>; <em>Skipped, failed and noisy cases</em> gives "
        "each one's sign.</p>"
    )
    return collapsible(
        "Run-queue wait per case", intro + html_table(table, formats=percent, keep=("variant",))
    )


def commits_section(page: Page) -> str:
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
    return collapsible(
        "Commits",
        html_table(
            commits.rename(columns={"commit_date": "commit date", "run_date": "run date"}),
            formats={"commit date": utc_time, "run date": utc_time},
            keep=("commit",),
        ),
    )


def failed_section(page: Page) -> str:
    frame = page.frame
    bad = frame[(frame["status"] != Status.OK) & (frame["metric"] == "time")]
    cols = ["origin", "machine", "variant", "seq_len", "device", "mode", "status", "reason"]
    return collapsible(
        f"Skipped, failed and noisy cases ({len(bad)})",
        html_table(
            bad[[c for c in cols if c in bad]].drop_duplicates(), keep=("variant", "status")
        ),
        ident="problems",
    )


def environment_section(page: Page) -> str:
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
            utc_time(frame["run_date"].min())
            + (
                f" to {utc_time(frame['run_date'].max())}"
                if frame["run_date"].nunique() > 1
                else ""
            ),
        ),
        ("commits", values("commit", short=True)),
        ("sources", ", ".join(page.analysis.loaded.sources)),
    ]
    body = "".join(f"<tr><th>{html.escape(k)}</th><td>{html.escape(v)}</td></tr>" for k, v in rows)
    return collapsible("Environment", f'<table class="meta">{body}</table>')


def problems_section(page: Page) -> str:
    problems = page.analysis.loaded.problems
    if not problems:
        return ""
    return collapsible(
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
    # two points: one line through both, no interval (never a zero-width "[2.00, 2.00]")
    spread = not math.isnan(row["ci_low"])
    # exact values: the slope's range along L and the largest residual
    if row.get("kind") == "deterministic":
        slopes = f"local slopes {lo} to {hi}" if spread else "one local slope"
        text = (
            f"{row['exponent']:.2f} ({slopes}, largest residual {row['max_residual']:.1%}; {where})"
        )
    else:
        interval = f"[{lo}, {hi}]" if spread else "(no interval)"
        text = f"{row['exponent']:.2f} {interval} R²={row['r2']:.3f} ({where})"
    if row.get("outliers"):
        text += f", outliers {row['outliers']}"
    return (
        f"{text}: inconclusive ({row['note']})"
        if row.get("verdict") == complexity.FitVerdict.INCONCLUSIVE
        else text
    )


_FIT_SENTENCE = ("exponent", "ci_low", "ci_high", "r2", "n", "L_min", "L_max", "conclusive")
"""Raw fit columns the full table's ``fit`` sentence already states in words (an exact fit's
"ci" columns hold its local slopes, not an interval: a newcomer read them as one); fits.csv keeps
them all."""


def _split_words(crossover: float) -> str:
    """Where the L² term overtakes the L term, in words where there is no such length."""
    if crossover != crossover:
        return "not split (fewer than 3 lengths)"
    if crossover == math.inf:
        return "never (no L² term)"
    return "from the start (no L term)" if crossover <= 0 else str(round(crossover))


def full_fits_section(page: Page) -> str:
    full = page.analysis.fits.copy()
    if len(full):
        full.insert(0, "fit", full.apply(_fmt_fit, axis=1))
        full["commit"] = full["commit"].map(short_hash)
        undeclared = full["declared"].isna()
        full["declared"] = [
            "none (not a big-O claim)" if none else f"{d:g}"
            for d, none in zip(full["declared"], undeclared, strict=True)
        ]
        full.loc[undeclared, "verdict"] = "not judged: nothing declared"
        full["note"] = full["note"].where(full["note"].astype(bool), "none")
        if "crossover_L" in full:  # the cost split c0 + c1·L + c2·L², in words a reader can check
            full["L² term overtakes the L term at"] = full["crossover_L"].map(_split_words)
            full["L² share at the longest length"] = [
                f"{x:.0%}" if x == x else "not split" for x in full["l2_share"]
            ]
        full = full.rename(columns={"range": "points used"}).drop(
            columns=[
                c
                for c in (
                    *_FIT_SENTENCE,
                    "crossover_L",
                    "l2_share",
                    "split_residual",
                    "max_residual",
                    "kind",
                )
                if c in full
            ]
        )
    note = (
        f'<p class="sub">page_faults: {html.escape(PAGE_FAULTS_COUNT)}.</p>'
        if len(full) and (full["metric"] == "page_faults").any()
        else ""
    )
    return collapsible("Full fit table", note + html_table(full, keep=("variant", "metric")))


def demos_section(page: Page) -> str:
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
    return collapsible("Teaching demos: attention weights", nw_fig + masked)


def reproduce_section(page: Page) -> str:
    text = (
        "<p>Sweep and report: <code>attnbench run</code>; from asv results: <code>asv run</code> "
        "then <code>attnbench report --from .asv/results</code>; two runs side by side: "
        "<code>attnbench report --from RUN_A --from RUN_B</code>; teaching demos: "
        "<code>--demos</code>. Tidy data: <code>tidy.csv</code>; fits: <code>fits.csv</code> "
        "(beside this page); inputs that could not be used: <code>problems.json</code>.</p>"
    )
    return collapsible("Reproduce", text)
