"""The analyse step of load -> analyse -> render: what the report states, from the tidy frame.

* :func:`load_results` -> :class:`Loaded` (the tidy frame and what could not be read),
* :func:`analyse` -> :class:`Analysis`: fits, crossovers, the sides compared and their ratios, the
  primary slice the story is told from, and the findings: sentences the data supports, each linked
  to the figure it is read from. Nothing is drawn or written here: :mod:`attnbench.report.html`
  does that.

A finding is stated only when the data supports it: ``ok`` rows, measured (not "model") values and
conclusive fits; a sentence whose numbers are missing is left out, never guessed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench.analysis import changes, complexity, roofline
from attnbench.analysis.changes import GitLog, History
from attnbench.analysis.complexity import FitVerdict
from attnbench.analysis.frame import load
from attnbench.analysis.text import fmt, sig
from attnbench.contract import Source, Status, family
from attnbench.gate.steps import find_steps, history_commits
from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

__all__ = [
    "HISTORY_MIN_COMMITS",
    "MAX_FINDINGS",
    "RULES",
    "SHAPE",
    "SHORT_HASH",
    "SLICE",
    "SUMMARY_METRICS",
    "Analysis",
    "Comparison",
    "Finding",
    "Loaded",
    "analyse",
    "analytic_crossover",
    "as_text",
    "compare",
    "computes_softmax_attention",
    "decode_commit",
    "exponent_summary",
    "findings",
    "history_commits_of",
    "history_rows",
    "load_results",
    "pair_decode",
    "primary_slice",
    "provenance",
    "restrict",
    "short_hash",
    "side_key",
    "sides",
]

SHORT_HASH = 8  # characters of a commit hash shown on the page (asv's own convention)
SHAPE = ("batch", "heads", "kv_heads", "head_dim")
"""A case's shape beside its length: rows that differ in any of them are never pooled."""
SLICE = ("machine", "commit", "device", "mode", "dtype", "mask", *SHAPE)
"""The columns that pick the primary slice (beside its side)."""


def short_hash(commit: object) -> str:
    return str(commit)[:SHORT_HASH] if commit else ""


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
class Finding:
    """One sentence the data supports, and the figure or section it is read from."""

    text: str  # the sentence (plain text; `name` marks a variant)
    target: str  # id of the figure or section on the page


@dataclass(frozen=True)
class Comparison:
    """Side B against side A (runs, commits, machines): time and memory ratios where both ran ok."""

    label_a: str  # what A is (run directory, short hash, machine)
    label_b: str  # what B is
    # variant, seq_len, device, mode, dtype, mask, time_a, time_b, ratio (B / A)
    ratios: pd.DataFrame
    # same keys, bytes_a, bytes_b, ratio (B / A): measured peak tensor bytes only
    memory: pd.DataFrame = field(default_factory=pd.DataFrame)


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
    history: History | None = None  # the steps of a history of HISTORY_MIN_COMMITS commits or more
    variant_order: tuple[str, ...] = ()  # the registry's order of variants (figures' legends)

    @property
    def primary_crossovers(self) -> dict[str, pd.DataFrame]:
        """The primary slice's crossover tables (a matrix shows one machine, commit and setting)."""
        return (
            {m: restrict(t, self.primary) for m, t in self.crossovers.items()}
            if self.primary
            else {}
        )


def _short_fit(row: pd.Series) -> str:
    """The short form (visible table): "2.01 [1.95, 2.07]", "inconclusive (3 points)", "model"."""
    if row.get("method") == complexity.MODEL:
        return "model (predicted, not fitted)"
    if math.isnan(row["exponent"]):
        return f"n/a ({row['note']})" if row.get("note") else "n/a"
    if row.get("verdict") == FitVerdict.INCONCLUSIVE or not row.get("conclusive", True):
        return f"{row['exponent']:.2f}, inconclusive"
    if row.get("kind") == "deterministic":  # no sampling noise: the range the slope takes along L
        return f"{row['exponent']:.2f} (local {row['ci_low']:.2f} to {row['ci_high']:.2f})"
    return f"{row['exponent']:.2f} [{row['ci_low']:.2f}, {row['ci_high']:.2f}]"


def _exponent_columns(
    group: pd.DataFrame, metric: str, label: str, row: dict, flags: list[str]
) -> None:
    """Fill ``row``'s "fitted / declared" cell of one metric's fit; its verdict goes to ``flags``.

    One cell a metric keeps the table within a 1400 px page; how each fit was obtained is in
    fits.csv, and a model's cell says it is one.
    """
    column = f"{label}: fitted [95% CI] / declared"
    sub = group[group["metric"] == metric]
    if sub.empty:
        row[column] = ""
        return
    r = sub.iloc[-1]
    row[column] = _short_fit(r) + ("" if math.isnan(r["declared"]) else f" / {r['declared']:g}")
    if r["verdict"] == FitVerdict.MATCHES and complexity.excludes_declared(r.to_dict()):
        side = FitVerdict.STEEPER if r["exponent"] > r["declared"] else FitVerdict.SHALLOWER
        flags.append(
            f"{label} {side} than declared by less than {complexity.TOLERANCE:g} (matches; its "
            f"interval excludes {r['declared']:g})"
        )
    elif r["verdict"] in complexity.VERDICTS:
        flags.append(f"{label} {r['verdict']}")


SUMMARY_METRICS = (
    ("time", "time"),
    ("peak_tensor_bytes", "memory"),
    ("instructions", "instructions"),
)
"""The fitted metrics the exponent table shows, and their column headings.

A metric nothing measured lifts away."""


def exponent_summary(fits: pd.DataFrame) -> pd.DataFrame:
    """Variant rows: fitted time, memory and count exponents beside the declared ones, a verdict."""
    if fits.empty:
        return fits
    rows = []
    shown = [(m, label) for m, label in SUMMARY_METRICS if (fits["metric"] == m).any()]
    # one row per commit in a history, and per shape when a sweep crosses shapes (GQA's Hkv, head
    # dims, batches)
    keys = [
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
    ]
    keys = [k for k in keys if k in fits]
    for key, group in fits.groupby(keys, sort=False, dropna=False):
        row = dict(zip(keys, key, strict=True))
        row["commit"] = short_hash(row["commit"])
        row["family"] = family(row["variant"])
        flags: list[str] = []
        for metric, label in shown:
            _exponent_columns(group, metric, label, row, flags)
        row["verdict vs declared"] = "; ".join(flags) or "nothing fitted"
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
    table["note"] = fallback.map({True: "fell back to math (O(n²) memory)", False: ""})
    return table


# ---- sides: the runs, commits or machines compared ----------------------------------------------
def side_key(frame: pd.DataFrame) -> pd.Series:
    """One label per run / commit / machine, naming only what differs between them."""
    origin = (
        frame["origin"].fillna("").astype(str)
        if "origin" in frame
        else pd.Series("", index=frame.index)
    )
    parts = {
        "origin": origin.map(lambda p: Path(p).name or p),
        "machine": frame["machine"].astype(str),
        "commit": frame["commit"].fillna("").astype(str).str[:SHORT_HASH],
    }
    varying = [k for k in ("origin", "machine", "commit") if parts[k].nunique() > 1]
    if not varying:
        return pd.Series("this run", index=frame.index)
    if (
        "origin" in varying
        and len(varying) > 1
        and origin.nunique() == frame.groupby(["machine", "commit"]).ngroups
    ):
        # each source is one machine/commit: name those instead of the path
        varying.remove("origin")
    return pd.Series(
        [" / ".join(p) for p in zip(*(parts[k] for k in varying), strict=True)], index=frame.index
    )


def sides(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per side: label, source kind, machine, short hash, run date, commit date, cases."""
    if frame.empty:
        return pd.DataFrame()
    frame = frame.assign(side=side_key(frame))
    rows = []
    for label, group in frame.groupby("side", sort=False):
        time_rows = group[group["metric"] == "time"]
        run_date = group["run_date"].min() if "run_date" in group else pd.NaT
        rows.append(
            {
                "side": label,
                "source": ", ".join(sorted(set(group["source"]))),
                "machine": ", ".join(sorted(set(group["machine"]))),
                "commit": ", ".join(sorted({short_hash(c) for c in group["commit"] if c})),
                "run date": run_date,
                "commit date": group["date"].min()
                if (group["source"] == Source.ASV).any()
                else pd.NaT,
                "cases ok": int((time_rows["status"] == Status.OK).sum()),
                "cases": len(time_rows),
            }
        )
    out = pd.DataFrame(rows)
    return out.sort_values(
        ["commit date", "run date"], na_position="first", kind="stable"
    ).reset_index(drop=True)


# metric -> column prefix of A's and B's values
_COMPARED = {"time": "time", "peak_tensor_bytes": "bytes"}
_CASE = ["variant", "seq_len", "device", "mode", "dtype", "mask"]


def _ratios(med: pd.DataFrame, prefix: str, label_a: str, label_b: str) -> pd.DataFrame:
    """B / A per case from the per-side medians of one metric (cases where A's value is > 0)."""
    a = med[med["side"] == label_a].drop(columns="side").rename(columns={"value": f"{prefix}_a"})
    b = med[med["side"] == label_b].drop(columns="side").rename(columns={"value": f"{prefix}_b"})
    both = a.merge(b, on=_CASE)
    both = both[both[f"{prefix}_a"] > 0].reset_index(drop=True)
    both["seq_len"] = both["seq_len"].astype("int64")
    both["ratio"] = both[f"{prefix}_b"] / both[f"{prefix}_a"]
    return both


def compare(frame: pd.DataFrame, sides: pd.DataFrame) -> tuple[Comparison, ...]:
    """B / A ratios of time and of peak tensor bytes, per case both sides ran ok.

    Memory: measured values only (not "model"), where A's is above 0."""
    if len(sides) < 2:
        return ()
    frame = frame.assign(side=side_key(frame))
    ok = frame[
        (frame["status"] == Status.OK)
        & (frame["seq_len"] == frame["seq_len_k"])
        & (frame["method"] != complexity.MODEL)
    ]
    med = {
        metric: ok[ok["metric"] == metric]
        .groupby(["side", *_CASE], dropna=False)["value"]
        .median()
        .reset_index()
        for metric in _COMPARED
    }
    label_a = str(sides["side"].iloc[0])
    return tuple(
        Comparison(
            label_a=label_a,
            label_b=str(label_b),
            ratios=_ratios(med["time"], _COMPARED["time"], label_a, label_b),
            memory=_ratios(
                med["peak_tensor_bytes"], _COMPARED["peak_tensor_bytes"], label_a, label_b
            ),
        )
        for label_b in sides["side"].iloc[1:4]
    )


# ---- the primary slice: the side, machine and setting the story is told from --------------------
def primary_slice(frame: pd.DataFrame) -> dict[str, str]:
    """The slice the findings are read from: the first side, its most common device, forward, ..."""
    time_rows = frame[frame["metric"] == "time"]
    if time_rows.empty:
        return {}
    side = side_key(frame)
    first = side.loc[time_rows.index].iloc[0]
    rows = time_rows[side.loc[time_rows.index] == first]
    pick = {"side": str(first)}
    prefer = {"mode": "forward", "mask": "none"}
    for col in SLICE:
        if col not in rows:
            continue
        values = as_text(rows[col])
        # plain attention before grouped queries
        wanted = pick.get("heads") if col == "kv_heads" else prefer.get(col)
        choice = wanted if wanted in set(values) else values.value_counts().index[0]
        pick[col] = choice
        rows = rows[values == choice]
    return pick


def as_text(values: pd.Series) -> pd.Series:
    """A column as the text it is compared by: whole numbers without a point (8 and 8.0 alike)."""
    numbers = pd.to_numeric(values, errors="coerce")
    whole = numbers.notna() & (numbers == numbers.round())
    return values.astype(str).where(~whole, numbers.round().astype("Int64").astype(str))


def restrict(
    table: pd.DataFrame, primary: dict[str, str], columns: Sequence[str] = SLICE
) -> pd.DataFrame:
    """The rows of ``table`` (frame rows, fits, crossovers) whose ``columns`` match ``primary``."""
    keep = pd.Series(True, index=table.index)
    for col in columns:
        if col in primary and col in table:
            keep &= as_text(table[col]) == primary[col]
    return table[keep]


def _slice(frame: pd.DataFrame, primary: dict[str, str]) -> pd.DataFrame:
    """The frame's rows of the primary slice, side included."""
    if not primary or frame.empty:
        return frame.iloc[0:0]
    rows = restrict(frame, primary)
    return rows[side_key(frame).loc[rows.index] == primary["side"]] if "side" in primary else rows


def decode_commit(frame: pd.DataFrame, primary: dict[str, str]) -> str:
    """The commit whose decode cases pair with the primary prefill ones.

    The primary commit when it ran decode on the primary machine, else the machine's latest decode
    run (a decode sweep is often a later run)."""
    if "workload" not in frame or not primary:
        return primary.get("commit", "") if primary else ""
    rows = frame[
        (frame["workload"] == "decode") & (frame["machine"].astype(str) == primary["machine"])
    ]
    if rows.empty or (rows["commit"].astype(str) == primary["commit"]).any():
        return primary["commit"]
    return str(rows.sort_values("run_date", na_position="first")["commit"].iloc[-1])


def pair_decode(table: pd.DataFrame, primary: dict[str, str], commit: str) -> pd.DataFrame:
    """The primary machine's rows or fits: prefill of the primary commit, decode of ``commit``."""
    if not primary or table.empty:
        return table
    decode = (
        table["workload"] == "decode"
        if "workload" in table
        else pd.Series(False, index=table.index)
    )
    commits = table["commit"].astype(str)
    return table[
        (table["machine"].astype(str) == primary["machine"])
        & ((~decode & (commits == primary["commit"])) | (decode & (commits == commit)))
    ]


# ---- findings ----------------------------------------------------------------------------------
def _fit(fits: pd.DataFrame, variant: str, metric: str, workload: str = "prefill") -> dict | None:
    """A conclusive, measured fit of ``variant``'s ``metric`` on ``workload``, or None."""
    if fits.empty:
        return None
    sub = fits[
        (fits["variant"] == variant)
        & (fits["metric"] == metric)
        & (fits["method"] != complexity.MODEL)
    ]
    if "workload" in sub:
        sub = sub[sub["workload"] == workload]
    judged = (FitVerdict.MATCHES, FitVerdict.STEEPER, FitVerdict.SHALLOWER)
    sub = sub[sub["conclusive"].astype(bool) & sub["verdict"].isin(judged)]
    return None if sub.empty else sub.iloc[0].to_dict()


def _at_common_longest(ok: pd.DataFrame, a: str, b: str) -> tuple[int, float, float] | None:
    """(L, a's value, b's value) at the longest L where both ran ok, or None."""
    table = ok[ok["variant"].isin((a, b))].pivot_table(
        index="seq_len", columns="variant", values="value", aggfunc="median"
    )
    if a not in table or b not in table:
        return None
    both = table[[a, b]].dropna()
    if both.empty:
        return None
    n = int(both.index[-1])
    return n, float(both[a].iloc[-1]), float(both[b].iloc[-1])


@dataclass(frozen=True)
class _Evidence:
    """What the finding rules read: the primary slice's correct rows and conclusive-or-not fits."""

    frame: pd.DataFrame  # every row
    machine: pd.DataFrame  # the primary machine's prefill and decode rows (the roofline reads them)
    ok_time: pd.DataFrame  # ok, measured time rows of the primary slice (prefill shapes: Lq = Lk)
    ok_mem: pd.DataFrame  # the same for peak tensor bytes
    prefill_fits: pd.DataFrame  # the primary slice's prefill fits
    decode_fits: pd.DataFrame  # the primary machine's decode fits of the same setting
    comparisons: Sequence[Comparison]
    fits: pd.DataFrame  # every fit on the page (the tally the exponents section shows)


def _evidence(
    frame: pd.DataFrame,
    fits: pd.DataFrame,
    primary: dict[str, str],
    comparisons: Sequence[Comparison],
) -> _Evidence:
    rows = _slice(frame, primary)
    ok = rows[
        (rows["status"] == Status.OK)
        & (rows["seq_len"] == rows["seq_len_k"])
        & (rows["method"] != complexity.MODEL)
    ]
    commit = decode_commit(frame, primary)
    pfits = fits
    if len(fits):
        pfits = restrict(
            pair_decode(fits, primary, commit), primary, ("device", "mode", "dtype", "mask", *SHAPE)
        )
    decode = (
        pfits["workload"] == "decode"
        if "workload" in pfits
        else pd.Series(False, index=pfits.index)
    )
    return _Evidence(
        frame=frame,
        machine=pair_decode(frame, primary, commit),
        ok_time=ok[ok["metric"] == "time"],
        ok_mem=ok[ok["metric"] == "peak_tensor_bytes"],
        prefill_fits=pfits[~decode],
        decode_fits=pfits[decode] if "workload" in pfits else pfits.iloc[0:0],
        comparisons=comparisons,
        fits=fits,
    )


def _time_growth(e: _Evidence) -> Finding | None:
    """How dense and fused attention grow: time (conclusive fits) and, where counted, counts.

    Counts do not move with the machine, so where time is inconclusive they still decide the O(L²)
    claim; the sentence says what they cannot see.
    """
    parts, counted = [], False
    for variant, what in (("batched", "dense"), ("sdpa", "fused SDPA")):
        time, count = (
            _fit(e.prefill_fits, variant, "time"),
            _fit(e.prefill_fits, variant, "instructions"),
        )
        if not (time or count):
            continue
        text = f"{what} attention (`{variant}`)"
        if time:
            text += f" as L^{time['exponent']:.2f} [{time['ci_low']:.2f}, {time['ci_high']:.2f}]"
        if count:
            counted = True
            text += f"{',' if time else ''} in instruction counts as L^{count['exponent']:.2f}"
            text += "" if time else " (its time fit is inconclusive)"
        parts.append(text)
    if not parts:
        return None
    text = "Time per call grows for " + " and for ".join(parts) + " (95% intervals)."
    if counted:
        text += (
            " Counts do not move with the machine; they cannot see cache misses, page faults, "
            "memory bandwidth or waiting."
        )
    return Finding(text, "fig-progression")


def analytic_crossover(fit: dict) -> float:
    """L* of the FLOP model at the fit's shape: where its L² FLOPs overtake L (NaN: unknown)."""
    if fit.get("variant") not in variant_names() or fit.get("workload", "prefill") != "prefill":
        return math.nan
    try:
        spec = AttnSpec(
            batch=int(fit["batch"]),
            heads=int(fit["heads"]),
            head_dim=int(fit["head_dim"]),
            kv_heads=None if pd.isna(fit.get("kv_heads")) else int(fit["kv_heads"]),
            dtype=str(fit["dtype"]),
            device=str(fit["device"]),
            mode=str(fit["mode"]),
            mask=str(fit["mask"]),
        )
        impl = get_variant(str(fit["variant"]))
        lengths = [int(fit["L_min"]) * 2**i for i in range(5)]
        flops = [impl.flops(spec.replace(seq_len=n)).executed for n in lengths]
    except (ValueError, TypeError, KeyError):
        return math.nan
    split = complexity.cost_split(lengths, flops)
    return math.nan if split is None else split.crossover


def _shallower_explained(e: _Evidence) -> Finding | None:
    """Why conclusive fits are shallower than declared: the cost split c0 + c1·L + c2·L² and its L*.

    Read from instruction counts where a variant was counted (they do not move), else from time.
    """
    fits = e.prefill_fits
    if not len(fits) or "crossover_L" not in fits:
        return None
    parts = []
    for variant in dict.fromkeys(fits["variant"]):
        fit = _fit(fits, variant, "instructions") or _fit(fits, variant, "time")
        if (
            not fit
            or fit["verdict"] != FitVerdict.SHALLOWER
            or not math.isfinite(fit.get("crossover_L", math.nan))
        ):
            continue
        star, share, what = (
            fit["crossover_L"],
            fit["l2_share"],
            "count" if fit["metric"] == "instructions" else "time",
        )
        model = analytic_crossover(fit)
        model_text = (
            f"; its FLOP model puts L* at {model:,.0f}"
            if math.isfinite(model) and model > 0
            else ""
        )
        where = (
            f"its O(L) terms outweigh the O(L²) ones below L* ≈ {star:,.0f}{model_text}"
            if star > 0
            else "it has no O(L) term"
        )
        parts.append(
            f"`{variant}` {'instructions' if what == 'count' else 'time'} grow as "
            f"L^{fit['exponent']:.2f}, shallower than its declared O(L^{fit['declared']:g}): "
            f"{where}, and at L={int(fit['L_max'])} the L² term is {share:.0%} of the {what}"
        )
        if len(parts) == 3:
            break
    if not parts:
        return None
    return Finding(
        "Fitting c0 + c1·L + c2·L² explains the shallower slopes: " + "; ".join(parts) + ".",
        "fig-progression",
    )


def _decode(e: _Evidence) -> Finding | None:
    """Decode's time exponent beside prefill's, and its % of the bandwidth roof (conclusive fit)."""
    dfits = e.decode_fits
    for variant in ("sdpa", "batched", *sorted(set(dfits["variant"]) if len(dfits) else ())):
        fit = _fit(dfits, variant, "time", "decode")
        if fit:
            break
    else:
        return None
    text = (
        "Decode (one query over a KV cache) takes time per generated token growing as "
        f"Lk^{fit['exponent']:.2f} [{fit['ci_low']:.2f}, {fit['ci_high']:.2f}] for `{variant}`"
    )
    pre = _fit(e.prefill_fits, variant, "time", "prefill")
    text += f", against prefill's L^{pre['exponent']:.2f}" if pre else ""
    roof = roofline.roofline(e.machine)
    dec = roof[
        (roof["workload"] == "decode")
        & (roof["variant"] == variant)
        & roof["pct_of_bandwidth"].notna()
    ]
    if len(dec):
        last = dec.sort_values("seq_len_k").iloc[-1]
        text += (
            f"; at Lk={int(last['seq_len_k'])} it moves {fmt(float(last['gbps']), 'GB/s')}, "
            f"{sig(float(last['pct_of_bandwidth']))}% of the measured bandwidth"
        )
    return Finding(text + ".", "fig-prefill_decode")


def _scratch_memory(e: _Evidence) -> Finding | None:
    """The scratch memory of dense attention against SDPA at the longest common length."""
    both = _at_common_longest(e.ok_mem, "batched", "sdpa")
    if not both or both[2] <= 0:
        return None
    n, dense, fused = both
    fit = _fit(e.prefill_fits, "batched", "peak_tensor_bytes")
    grows = f" (growing as L^{fit['exponent']:.2f})" if fit else ""
    return Finding(
        f"At L={n}, `batched` needs {fmt(dense, 'bytes')} of scratch memory{grows}, "
        f"{fmt(dense / fused, 'x')} `sdpa` ({fmt(fused, 'bytes')}).",
        "fig-progression",
    )


def _loop_baseline(e: _Evidence) -> Finding | None:
    """The teaching baseline's Python loop against batched."""
    both = _at_common_longest(e.ok_time, "loop", "batched")
    if not both:
        return None
    n, loop, batched = both
    return Finding(
        f"The teaching baseline, a Python loop, is {fmt(loop / batched, 'x')} slower than "
        f"`batched` at L={n} ({fmt(loop, 's')} vs {fmt(batched, 's')} per call).",
        "fig-progression",
    )


def computes_softmax_attention(variant: str) -> bool:
    """Whether ``variant`` computes softmax attention over every allowed pair (unknown: yes)."""
    return variant not in variant_names() or get_variant(variant).SOFTMAX_ATTENTION


def _fastest(e: _Evidence) -> Finding | None:
    """Fastest and slowest softmax attention at the longest length where most of them ran.

    Kernels that compute another function (linear, banded, sparse) are not ranked against it: faster
    at computing something else is no finding. They are named instead.
    """
    exact = e.ok_time[e.ok_time["variant"].map(computes_softmax_attention)]
    if not len(exact):
        return None
    counts = exact.groupby("seq_len")["variant"].nunique()
    good = counts[counts >= max(3, int(0.6 * counts.max()))]
    if not len(good):
        return None
    n = int(good.index.max())
    at = exact[exact["seq_len"] == n].groupby("variant")["value"].median().sort_values()
    fastest, slowest = at.index[0], at.index[-1]
    others = sorted(set(e.ok_time.loc[e.ok_time["seq_len"] == n, "variant"]) - set(at.index))
    aside = (
        (
            f" ({', '.join(f'`{v}`' for v in others)} compute{'s' if len(others) == 1 else ''} "
            f"something else and {'is' if len(others) == 1 else 'are'} not ranked)"
        )
        if others
        else ""
    )
    return Finding(
        f"At L={n}, the fastest of {len(at)} exact softmax attention variants that ran correctly "
        f"is `{fastest}` ({fmt(at.iloc[0], 's')}); the slowest, `{slowest}`, takes "
        f"{fmt(at.iloc[-1] / at.iloc[0], 'x')} as long{aside}.",
        "fig-time",
    )


def _fit_verdicts(e: _Evidence) -> Finding | None:
    """How many conclusive fits match the declared big-O, and which are steeper.

    The page's one tally: :func:`complexity.tally` of every fit, as the exponents section counts
    them.
    """
    t = complexity.tally(e.fits)
    if not t.judged:
        return None
    if not t.conclusive:
        return Finding(
            f"No complexity fit is conclusive ({t.judged} inconclusive): too few lengths or too "
            "much scatter to compare with the declared big-O.",
            "exponents",
        )
    near = (
        (
            f" ({len(t.near)} only within the {complexity.TOLERANCE:g} tolerance, their "
            "intervals excluding the declared exponent: named in the exponents section)"
        )
        if t.near
        else ""
    )
    text = (
        f"{t.matches} of {t.conclusive} conclusive complexity fits match the declared big-O{near}; "
        f"{len(t.inconclusive)} are inconclusive"
    )
    steeper = sorted({s.split(" ")[0] for s in t.steeper})
    text += (
        f"; steeper than declared: {', '.join(f'`{v}`' for v in steeper)}."
        if steeper
        else "; none is steeper than declared."
    )
    return Finding(text, "exponents")


def _comparison(e: _Evidence) -> Finding | None:
    """The first comparison's median time ratio and its largest."""
    comp = e.comparisons[0] if e.comparisons else None
    if comp is None or not len(comp.ratios):
        return None
    geo = math.exp(float(pd.Series(comp.ratios["ratio"]).apply(math.log).median()))
    worst = comp.ratios.sort_values("ratio").iloc[-1]
    return Finding(
        f"{comp.label_b} against {comp.label_a}: median time ratio {fmt(geo, 'x')} over "
        f"{len(comp.ratios)} cases both ran correctly; largest {fmt(worst['ratio'], 'x')} "
        f"(`{worst['variant']}`, L={int(worst['seq_len'])}).",
        "comparison",
    )


def _not_facts(e: _Evidence) -> Finding | None:
    """The cases that are not measurements to rely on."""
    time_rows = e.frame[e.frame["metric"] == "time"]
    bad = time_rows[time_rows["status"] != Status.OK]
    if not len(bad):
        return None
    counts = ", ".join(f"{v} {k}" for k, v in bad["status"].value_counts().items())
    return Finding(
        f"{len(bad)} of {len(time_rows)} cases are not measurements to rely on ({counts}): "
        "they are never fitted or ranked.",
        "problems",
    )


def _above_roof(e: _Evidence) -> Finding | None:
    """Rates above their run's measured roof: accounting errors, named, never quoted as facts."""
    bad = e.frame[e.frame["status"] == Status.ABOVE_ROOF]
    if not len(bad):
        return None
    bad = bad.sort_values("value", ascending=False)
    named = "; ".join(
        f"`{r['variant']}` {r['mode']} {r['mask']} L={int(r['seq_len'])} "
        f"{fmt(float(r['value']), str(r['unit']))}"
        for _, r in bad.head(3).iterrows()
    )
    more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
    return Finding(
        f"{len(bad)} rate(s) are above the roof their own run measured, so they are accounting "
        f"errors, not measurements ({named}{more}): the executed FLOPs or bytes they divide "
        "overstate the work (a fused kernel skipping masked tiles charged for the full square). "
        "They are left out of every figure and table of rates.",
        "problems",
    )


RULES: tuple[Callable[[_Evidence], Finding | None], ...] = (
    _above_roof,
    _time_growth,
    _shallower_explained,
    _decode,
    _scratch_memory,
    _loop_baseline,
    _fastest,
    _fit_verdicts,
    _comparison,
)
"""The finding rules, in the order their sentences appear (None: the data does not support it)."""
MAX_FINDINGS = 8


def findings(
    frame: pd.DataFrame,
    fits: pd.DataFrame,
    primary: dict[str, str],
    comparisons: Sequence[Comparison] = (),
) -> tuple[Finding, ...]:
    """Up to MAX_FINDINGS sentences the data supports, each with the id of its figure.

    Only ``ok`` rows and measured values (not method "model") are compared or ranked, and only
    conclusive fits are quoted; a sentence whose numbers are missing is left out, never guessed. The
    count of cases not to rely on closes the list when there is room for it.
    """
    evidence = _evidence(frame, fits, primary, comparisons)
    out = [f for f in (rule(evidence) for rule in RULES) if f is not None]
    if len(out) < MAX_FINDINGS - 1:
        closing = _not_facts(evidence)
        out += [closing] if closing else []
    return tuple(out[:MAX_FINDINGS])


def _constants(frame: pd.DataFrame) -> dict[str, str]:
    """Values shared by every case (lifted into the page's subtitle)."""
    constants = {}
    for col in (
        "device",
        "mode",
        "dtype",
        "batch",
        "heads",
        "kv_heads",
        "head_dim",
        "mask",
        "workload",
        "machine",
        "torch",
        "threads",
    ):
        values = {str(v) for v in frame[col].dropna().unique() if str(v) not in ("", "nan")}
        if len(values) == 1:
            constants[col] = values.pop()
    return constants


HISTORY_MIN_COMMITS = 3
"""Commits a machine's asv results need before the report shows their history's steps."""


def history_rows(frame: pd.DataFrame) -> pd.DataFrame | None:
    """The asv rows whose steps the report shows, or None (fewer than HISTORY_MIN_COMMITS)."""
    rows = frame[(frame["commit"].fillna("") != "") & frame["metric"].isin(changes.METRICS)]
    if not len(rows) or rows.groupby("machine")["commit"].nunique().max() < HISTORY_MIN_COMMITS:
        return None
    return rows


def history_commits_of(frame: pd.DataFrame) -> list[str]:
    """The commits git is asked to order for ``frame``'s history (none: no history shown)."""
    rows = history_rows(frame) if len(frame) else None
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
            main_fits=pd.DataFrame(),
            machine=frame,
            machine_fits=pd.DataFrame(),
            variant_order=tuple(variant_names()),
        )
    fits = complexity.fit_table(frame)
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
    rows = history_rows(frame)
    return Analysis(
        loaded=loaded,
        fits=fits,
        summary=exponent_summary(fits),
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
        headline=complexity.headline(fits),
        largest=complexity.largest_length(frame),
        memory_model=complexity.memory_model(frame),
        history=None if rows is None else find_steps(rows, git=git),
        variant_order=tuple(variant_names()),
    )
