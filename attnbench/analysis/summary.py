"""The analyse step of load -> analyse -> render: what the report states, from the tidy frame.

* :func:`load_results` -> :class:`Loaded` (the tidy frame and what could not be read),
* :func:`analyse` -> :class:`Analysis`: fits, crossovers, the sides compared and their ratios, the
  primary slice the story is told from (both from :mod:`attnbench.analysis.slices`), and the
  findings: sentences the data supports, each linked to the figure it is read from (their rules are
  :mod:`attnbench.analysis.findings`). Nothing is drawn or written here:
  :mod:`attnbench.report.html` does that.

A finding is stated only when the data supports it: ``ok`` rows, measured (not "model") values and
conclusive fits; a sentence whose numbers are missing is left out, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import changes, complexity, roofline
from attnbench.analysis.changes import GitLog, History
from attnbench.analysis.complexity import FitVerdict
from attnbench.analysis.findings import Finding, answer_check, findings
from attnbench.analysis.frame import load
from attnbench.analysis.slices import (
    Comparison,
    compare,
    decode_commit,
    pair_decode,
    primary_slice,
    restrict,
    side_key,
    sides,
)
from attnbench.analysis.text import count, short_hash
from attnbench.contract import Status, family
from attnbench.gate.steps import find_steps, history_commits
from attnbench.registry import get_variant, variant_names

__all__ = [
    "VERDICT",
    "VERDICT_DETAILS",
    "Analysis",
    "Loaded",
    "analyse",
    "exponent_summary",
    "fit_column",
    "history_commits_of",
    "load_results",
    "provenance",
]


# ---- step 1: load ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Loaded:
    """What :func:`load_results` read."""

    frame: pd.DataFrame  # the tidy frame (see attnbench.analysis.frame)
    sources: tuple[str, ...]  # the sources as given
    problems: tuple[str, ...]  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...]  # facts worth knowing that are not faults (e.g. incomplete runs)


def load_results(sources: Iterable[str | Path]) -> Loaded:
    """asv results and run directories as one tidy frame (never raises on bad input)."""
    sources = tuple(str(s) for s in sources)
    read = load(sources)
    return Loaded(frame=read.frame, sources=sources, problems=read.problems, notes=read.notes)


# ---- step 2: analyse -------------------------------------------------------------------------
@dataclass(frozen=True)
class Analysis:
    """Everything the page states, computed from a :class:`Loaded` (no drawing, no files)."""

    loaded: Loaded  # the input
    fits: pd.DataFrame  # complexity.fit_table
    summary: pd.DataFrame  # one row per variant: exponents and verdicts (exponent_summary)
    crossovers: dict[str, pd.DataFrame]  # metric -> complexity.crossovers (ok, measured rows)
    # the slice findings are read from (machine, device, mode, dtype, mask, side)
    primary: dict[str, str]
    constants: dict[str, str]  # values shared by every case (lifted into the subtitle)
    sides: pd.DataFrame  # one row per run / commit / machine: label, short hash, run date, cases
    comparisons: tuple[Comparison, ...]  # B vs A for every side after the first (at most 3)
    findings: tuple[Finding, ...] = field(default=())  # 0 to MAX_FINDINGS sentences, each linked
    # the rows of the primary side (all of them with one side)
    main: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the fits of the primary machine and commit
    main_fits: pd.DataFrame = field(default_factory=pd.DataFrame)
    # the primary machine's prefill and decode rows (pair_decode)
    machine: pd.DataFrame = field(default_factory=pd.DataFrame)
    machine_fits: pd.DataFrame = field(default_factory=pd.DataFrame)  # their fits
    # roofline.roofline of ``machine``: each case against the measured roofs
    roofline: pd.DataFrame = field(default_factory=pd.DataFrame)
    headline: tuple[str, str] = ("", "")  # complexity.headline of ``fits``: (tone, sentence)
    largest: pd.DataFrame = field(default_factory=pd.DataFrame)  # complexity.largest_length
    memory_model: pd.DataFrame = field(default_factory=pd.DataFrame)  # complexity.memory_model
    history: History | None = None  # the steps of a history of _HISTORY_MIN_COMMITS commits or more
    variant_order: tuple[str, ...] = ()  # the registry's order of variants (figures' legends)
    # findings.answer_check: each variant's check against the float64 reference
    answers: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def primary_crossovers(self) -> dict[str, pd.DataFrame]:
        """The primary slice's crossover tables (a matrix shows one machine, commit and setting)."""
        return (
            {m: restrict(t, self.primary) for m, t in self.crossovers.items()}
            if self.primary
            else {}
        )


def _short_fit(row: pd.Series) -> str:
    """The short form (visible table), fitted / declared: "2.01 [1.95, 2.07] / 2",
    "1.90 [1.59, 2.21] / 2, inconclusive", "1.99 (3 points) / 2, inconclusive",
    "n/a (declared 2): only L=1024 undisturbed; ...", "model (predicted, not fitted)".

    An inconclusive fit's exponent is shown (readers looked for the fit its verdict names) and
    marked after the declared exponent: "1.90 [...], inconclusive / 2" read as the inconclusive
    thing being over 2, and "n/a: ... / 2" as a fraction. A sampled fit on fewer points than a
    verdict needs shows its count where its interval would be: every newcomer looked twice at a
    tight "1.99 [1.93, 2.06] / 2" called inconclusive (the interval is in the full fit table)."""
    declared = row.get("declared", math.nan)
    if row.get("method") == complexity.MODEL:
        return "model (predicted, not fitted)"
    if math.isnan(row["exponent"]):
        # the declared exponent first: after the reason it stacked a second bracket on its own
        shown = "n/a" if math.isnan(declared) else f"n/a (declared {declared:g})"
        return f"{shown}: {row['note']}" if row.get("note") else shown
    if complexity.too_few_points(row):
        shown = f"{row['exponent']:.2f} ({count(int(row['n']), 'point')})"
    elif math.isnan(row["ci_low"]):
        shown = f"{row['exponent']:.2f}"
    elif row.get("kind") == "deterministic":  # no sampling noise: the range the slope takes along L
        shown = f"{row['exponent']:.2f} (local {row['ci_low']:.2f} to {row['ci_high']:.2f})"
    else:
        shown = f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"
    shown += "" if math.isnan(declared) else f" / {declared:g}"
    if row.get("verdict") == FitVerdict.INCONCLUSIVE or not row.get("conclusive", True):
        return f"{shown}, inconclusive"
    return shown


_NEVER_MEASURED = {
    "instructions": "not counted: a run counts the headline's variants and one per family by "
    "default, within a time limit (attnbench run --resume --instructions counts the rest)",
}
"""Why a metric has no row at all for a variant, where the cause is known."""


def _reasons(rows: pd.DataFrame) -> str:
    """The reasons recorded on the rows that were not ok, most common first (at most two)."""
    if "reason" not in rows:
        return ""
    bad = rows.loc[rows["status"] != Status.OK, "reason"].fillna("").astype(str)
    said = [r[:100] for r in bad[bad != ""].value_counts().index[:2]]
    return f": {'; '.join(said)}" if said else ""


def _unfitted(rows: pd.DataFrame, metric: str = "") -> str:
    """Why a metric has no fit: its rows' statuses and the reasons they recorded ("valgrind ran
    out of time"), or why it has no rows at all."""
    if not len(rows):
        return _NEVER_MEASURED.get(metric, "not measured in this run (no case recorded it)")
    counts = rows["status"].value_counts()
    if (counts.index == Status.OK).all():
        return "not fitted: no series along L"
    why = _reasons(rows)
    if len(counts) == 1:
        return f"not fitted: every case {counts.index[0]} ({counts.iloc[0]}){why}"
    listed = ", ".join(f"{n} {k}" for k, n in counts.items() if k != Status.OK)
    if Status.OK not in counts.index:
        return f"not fitted: no undisturbed case ({listed}){why}"
    return f"not fitted: too few correct, undisturbed cases ({listed}){why}"


def _lengths(lengths: Iterable[float]) -> str:
    """ "L=256, 512": the lengths a fit left out, named (a reader looked for which one it was)."""
    return "L=" + ", ".join(str(n) for n in sorted({int(n) for n in lengths}))


def _too_few_undisturbed(rows: pd.DataFrame, fitted: int) -> str:
    """ "2 points fitted (1 noisy at L=512 and 1 at the overhead floor at L=64 left out)" where
    cases left out of a time fit leave it fewer than :data:`complexity.MIN_POINTS` lengths: the
    real reason it is inconclusive, counted in the points the fit kept, as every other place on the
    page counts them, and the lengths named ("" if none was left out)."""
    if not len(rows):
        return ""
    counts = rows["status"].value_counts()
    dropped = [
        f"{n} {k} at {_lengths(rows.loc[rows['status'] == k, 'seq_len_k'])}"
        for k, n in counts.items()
        if k != Status.OK
    ]
    undisturbed = sorted(rows.loc[rows["status"] == Status.OK, "seq_len_k"].unique())
    kept = len(undisturbed)
    if kept >= complexity.MIN_POINTS:
        return ""
    if kept <= 1:  # no slope through one length, whatever the floor
        only = f"only {_lengths(undisturbed)}" if kept else "no length"
        return f"{only} undisturbed ({'; '.join(dropped)})"
    if kept > fitted:  # the shortest undisturbed lengths were the per-call overhead, not fitted
        floor = _lengths(undisturbed[: kept - fitted])
        dropped.append(f"{kept - fitted} at the overhead floor at {floor}")
    if not dropped:
        return ""
    return f"{count(fitted, 'point')} fitted ({' and '.join(dropped)} left out)"


_SERIES = (
    "machine",
    "commit",
    "device",
    "mode",
    "dtype",
    "mask",
    "workload",
    "batch",
    "heads",
    "kv_heads",
    "head_dim",
    "variant",
)
"""The columns of one series of fits: a row of the exponent table (one per commit in a history,
and per shape when a sweep crosses shapes: GQA's Hkv, head dims, batches)."""


def _explain_notes(fits: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """``fits`` whose inconclusive time fits say why they kept so few points: "2 points fitted (1
    noisy at L=512 and 1 at the overhead floor at L=64 left out), too few for a verdict (4 needed)"
    (:func:`_too_few_undisturbed`), in their ``note``, the one text the exponent table, its tooltip
    and the list of inconclusive fits all read."""
    if not len(fits):
        return fits
    notes = []
    for rec in fits.to_dict("records"):
        note = str(rec.get("note") or "")
        if rec["metric"] == "time" and rec.get("verdict") == FitVerdict.INCONCLUSIVE:
            key = {k: rec[k] for k in _SERIES if k in rec}
            n = int(rec.get("n", 0))
            why = _too_few_undisturbed(_series_rows(frame, key, "time"), n)
            points = count(n, "point")
            if why:  # keep what follows the count (", too few for ..."); else why replaces it
                note = why + note[len(points) :] if note.startswith(points) else why
        notes.append(note)
    return fits.assign(note=notes)


def fit_column(metric: str, label: str) -> str:
    """The exponent table's heading of ``metric``'s cells, naming what they hold: a sampled metric's
    bootstrap interval, or its count of points where it has too few for a verdict ("time: fitted
    [95% CI, or the count under 4 points] / declared": readers read "[95% CI]", "[95% CI from 4
    points]" and "[95% CI, none under 4 points]" above "1.99 (3 points)" as a promise broken),
    an exact one's range of local slopes ("peak memory: fitted (local slopes) / declared"; no
    interval: nothing was sampled)."""
    exact = metric in contract.METRICS and not contract.METRICS[metric].timed
    spread = (
        "(local slopes)"
        if exact
        else f"[95% CI, or the count under {complexity.MIN_POINTS} points]"
    )
    return f"{label}: fitted {spread} / declared"


def _exponent_columns(
    group: pd.DataFrame, metric: str, label: str, row: dict, rows: pd.DataFrame
) -> tuple[str, str, bool]:
    """Fill ``row``'s "fitted / declared" cell of one metric; return its verdict, its details and
    whether it is inconclusive.

    One cell a metric keeps the table within a 1400 px page; how each fit was obtained is in
    fits.csv, and a model's cell says it is one. A metric without a fit says why in its cell
    (``rows``: the frame's rows of this metric and series, whose statuses explain it).
    """
    column = fit_column(metric, label)
    sub = group[group["metric"] == metric]
    if sub.empty:
        row[column] = _unfitted(rows, metric)
        return "", "", False
    r = sub.iloc[-1]
    row[column] = _short_fit(r)
    phrase, detail = complexity.plain_verdict(r.to_dict())
    if not phrase:
        return "", "", False
    return f"{label} {phrase}", f"{label}: {detail}", r.get("verdict") == FitVerdict.INCONCLUSIVE


_SUMMARY_METRICS = (
    ("time", "time"),
    ("peak_tensor_bytes", complexity.METRIC_LABELS["peak_tensor_bytes"]),
    ("instructions", "instructions"),
)
"""The fitted metrics the exponent table shows, and their column headings.

A metric nothing measured lifts away."""


VERDICT = "verdict vs declared"
"""The exponent table's verdict column: one plain phrase per fitted metric
(:func:`complexity.plain_verdict`)."""
VERDICT_DETAILS = "verdict details"
"""Its details (intervals, tolerance): the page's tooltip of the verdict cell, not a column."""


def _series_rows(frame: pd.DataFrame | None, key: dict, metric: str) -> pd.DataFrame:
    """The frame's rows of one series of the exponent table (its key) and ``metric``."""
    if frame is None or not len(frame):
        return pd.DataFrame(columns=["status"])
    rows = complexity.swept(frame[frame["metric"] == metric])
    for col, value in key.items():
        if col in rows and col != "commit" and not pd.isna(value):
            rows = rows[rows[col].astype(str) == str(value)]
    return rows


def _shown_metrics(fits: pd.DataFrame, frame: pd.DataFrame | None) -> list[tuple[str, str]]:
    """The table's metric columns: those fitted, and time wherever time was measured at all."""
    timed = frame is not None and len(frame) > 0 and bool((frame["metric"] == "time").any())
    return [
        (m, label)
        for m, label in _SUMMARY_METRICS
        if (fits["metric"] == m).any() or (m == "time" and timed)
    ]


def exponent_summary(fits: pd.DataFrame, frame: pd.DataFrame | None = None) -> pd.DataFrame:
    """Variant rows: fitted time, memory and count exponents beside the declared ones, a verdict.

    ``frame`` (the tidy rows fitted) lets a cell without a fit say why it is blank (every case
    noisy, skipped, not measured); the verdict is one plain phrase per metric
    (:data:`VERDICT`) and its details sit in :data:`VERDICT_DETAILS`.
    """
    if fits.empty:
        return fits
    rows = []
    shown = _shown_metrics(fits, frame)
    # one row per commit in a history, and per shape when a sweep crosses shapes (GQA's Hkv, head
    # dims, batches)
    keys = [k for k in _SERIES if k in fits]
    for key, group in fits.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key, strict=True))
        where = dict(row)
        row["commit"] = short_hash(row["commit"])
        row["family"] = family(row["variant"])
        said = [
            _exponent_columns(group, m, label, row, _series_rows(frame, where, m))
            for m, label in shown
        ]
        # settled verdicts first: readers took in "peak memory matches O(L²)" only after a long
        # reason why time could not be judged (the details keep the metrics' order)
        settled = sorted(said, key=lambda verdict: verdict[2])
        row[VERDICT] = "; ".join(p for p, _, _ in settled if p) or "nothing fitted"
        row[VERDICT_DETAILS] = "; ".join(d for _, d, _ in said if d)
        rows.append(row)
    return pd.DataFrame(rows)


def provenance(frame: pd.DataFrame) -> pd.DataFrame:
    """Requested SDPA backend vs the kernel that ran, one row per case; fallbacks flagged."""
    rows = frame[(frame["kernel"] != "") & (frame["metric"] == "time")]
    if rows.empty:
        return pd.DataFrame()
    table = (
        rows[["machine", "device", "variant", "seq_len", "dtype", "mode", "mask", "kernel"]]
        .drop_duplicates()
        .copy()
    )
    requested = {
        v: getattr(get_variant(v), "backend", "auto")
        for v in table["variant"].unique()
        if v in variant_names()
    }
    table.insert(3, "requested", table["variant"].map(requested).fillna("?"))
    fallback = table["kernel"].str.contains("math") & (table["requested"] != "math")
    table["note"] = fallback.map({True: "fell back to math (O(L²) memory)", False: ""})
    return table


def _constants(frame: pd.DataFrame) -> dict[str, str]:
    """Values shared by every case (lifted into the page's subtitle)."""
    constants = {}
    lifted = contract.case_columns(
        ("device", "mode", "dtype", *contract.SHAPE, "mask", "workload", "machine"),
        without=("variant", *contract.LENGTHS),
    )
    for col in (*lifted, "torch", "threads"):
        values = {str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")}
        if len(values) == 1:
            constants[col] = values.pop()
    return constants


_HISTORY_MIN_COMMITS = 3
"""Commits a machine's asv results need before the report shows their history's steps."""


def _history_rows(frame: pd.DataFrame) -> pd.DataFrame | None:
    """The asv rows whose steps the report shows, or None (fewer than _HISTORY_MIN_COMMITS)."""
    rows = frame[(frame["commit"].fillna("") != "") & frame["metric"].isin(changes.METRICS)]
    if not len(rows) or rows.groupby("machine")["commit"].nunique().max() < _HISTORY_MIN_COMMITS:
        return None
    return rows


def history_commits_of(frame: pd.DataFrame) -> list[str]:
    """The commits git is asked to order for ``frame``'s history (none: no history shown)."""
    rows = _history_rows(frame) if len(frame) else None
    return [] if rows is None else history_commits(rows)


def analyse(loaded: Loaded, git: GitLog | None = None) -> Analysis:
    """Fits, crossovers, comparisons, primary slice and findings of ``loaded`` (nothing drawn).

    ``git`` orders a history's commits (:func:`attnbench.gate.gitlog.read_git_log` of
    :func:`history_commits_of`); without it they are in asv's recorded date order.
    """
    frame = loaded.frame
    if not len(frame):
        return Analysis(
            loaded=loaded,
            fits=pd.DataFrame(),
            summary=pd.DataFrame(),
            crossovers={},
            primary={},
            constants={},
            sides=sides(frame),
            comparisons=(),
            main=frame,
            machine=frame,
            variant_order=tuple(variant_names()),
        )
    fits = _explain_notes(complexity.fit_table(frame), frame)
    cross = {
        m: complexity.crossovers(frame, baselines=("loop", "batched", "sdpa"), metric=m)
        for m in ("time", "peak_tensor_bytes")
    }
    compared = sides(frame)
    comparisons = compare(frame, compared)
    primary = primary_slice(frame)
    main, main_fits = frame, fits
    if len(compared) > 1 and primary:  # the story is told from one side; the rest is compared
        main = frame[side_key(frame) == primary["side"]]
        if len(fits):
            main_fits = restrict(fits, primary, ("machine", "commit"))
    commit = decode_commit(frame, primary)
    machine = pair_decode(frame, primary, commit) if primary else frame
    rows = _history_rows(frame)
    return Analysis(
        loaded=loaded,
        fits=fits,
        summary=exponent_summary(fits, frame),
        answers=answer_check(frame),
        crossovers=cross,
        primary=primary,
        constants=_constants(frame),
        sides=compared,
        comparisons=comparisons,
        findings=findings(frame, fits, primary, comparisons),
        main=main,
        main_fits=main_fits,
        machine=machine,
        machine_fits=pair_decode(fits, primary, commit) if primary else fits,
        roofline=roofline.roofline(machine),
        headline=complexity.headline(fits, complexity.time_not_fitted(frame, fits)),
        largest=complexity.largest_length(frame),
        memory_model=complexity.memory_model(frame),
        history=None if rows is None else find_steps(rows, git=git),
        variant_order=tuple(variant_names()),
    )
