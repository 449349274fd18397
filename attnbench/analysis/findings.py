"""The findings: the sentences the data supports, each linked to the figure it is read from.

:func:`findings` runs every rule of :data:`_RULES` over the primary slice's evidence (its ``ok``,
measured rows and conclusive fits) and keeps up to :data:`_MAX_FINDINGS`; a rule whose numbers are
missing states nothing, never a guess. :mod:`attnbench.analysis.summary` calls it from ``analyse``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import pandas as pd

from attnbench import contract
from attnbench.analysis import complexity, roofline
from attnbench.analysis.complexity import FitVerdict
from attnbench.analysis.slices import (
    SLICE,
    Comparison,
    decode_commit,
    pair_decode,
    restrict,
    side_key,
)
from attnbench.analysis.text import agree, count, fmt, sig
from attnbench.contract import Status
from attnbench.registry import get_variant, variant_class, variant_names
from attnbench.spec import AttnSpec

__all__ = [
    "ANSWER_COLUMNS",
    "OWN_AT_MOST",
    "PAGE_FAULTS_COUNT",
    "Finding",
    "answer_check",
    "built_in",
    "findings",
    "own_variants",
]


@dataclass(frozen=True)
class Finding:
    """One sentence the data supports, and the figure or section it is read from."""

    text: str  # the sentence (plain text; `name` marks a variant)
    target: str  # id of the figure or section on the page


def _slice(frame: pd.DataFrame, primary: dict[str, str]) -> pd.DataFrame:
    """The frame's rows of the primary slice, side included."""
    if not primary or frame.empty:
        return frame.iloc[0:0]
    rows = restrict(frame, primary)
    return rows[side_key(frame).loc[rows.index] == primary["side"]] if "side" in primary else rows


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
    time_rows: pd.DataFrame  # every time row of the primary slice, any status (prefill shapes)
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
            pair_decode(fits, primary, commit),
            primary,
            tuple(c for c in SLICE if c not in ("machine", "commit")),
        )
    decode = (
        pfits["workload"] == "decode"
        if "workload" in pfits
        else pd.Series(False, index=pfits.index)
    )
    square = rows[(rows["seq_len"] == rows["seq_len_k"]) & (rows["metric"] == "time")]
    return _Evidence(
        frame=frame,
        machine=pair_decode(frame, primary, commit),
        ok_time=ok[ok["metric"] == "time"],
        time_rows=square,
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


def _analytic_crossover(fit: dict) -> float:
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
        model = _analytic_crossover(fit)
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


OWN_AT_MOST = 6
"""A run of at most this many variants is a selection its user named with ``--variants``: every
one of them that is no baseline is the user's own (the headline shows them all)."""
_BASELINES = ("loop", "batched", "sdpa")
"""The variants every other is measured against (the crossovers' baselines)."""


def built_in(variant: str) -> bool:
    """Whether ``variant`` is one of attnbench's own (not a plugin's, nor unknown here)."""
    return variant in variant_names() and variant_class(variant).__module__.startswith("attnbench.")


def own_variants(frame: pd.DataFrame) -> tuple[str, ...]:
    """The variants the run's user came to measure: every plugin variant, and in a run of at most
    :data:`OWN_AT_MOST` variants, every one that is no baseline (in the run's order)."""
    measured = list(dict.fromkeys(frame.loc[frame["metric"] == "time", "variant"]))
    few = len(measured) <= OWN_AT_MOST
    return tuple(v for v in measured if v not in _BASELINES and (few or not built_in(v)))


def _statuses(rows: pd.DataFrame) -> str:
    """ "noisy (4)", "noisy (3) or skipped (1)": what became of ``rows``' cases."""
    return " or ".join(f"{k} ({n})" for k, n in rows["status"].value_counts().items())


def _against_sdpa(e: _Evidence, variant: str) -> str:
    """``variant``'s time against sdpa's at the longest length both ran ok, or why there is none."""
    both = _at_common_longest(e.ok_time, variant, "sdpa")
    if both:
        n, mine, fused = both
        ratio = mine / fused
        how = f"{fmt(ratio, 'x')} slower" if ratio >= 1 else f"{fmt(1 / ratio, 'x')} faster"
        return (
            f"`{variant}` against `sdpa`: {how} at L={n} ({fmt(mine, 's')} vs {fmt(fused, 's')} "
            "per call), the longest length both ran undisturbed"
        )
    for name in (variant, "sdpa"):
        rows = e.time_rows[e.time_rows["variant"] == name]
        if not (rows["status"] == Status.OK).any():
            return (
                f"`{variant}` against `sdpa`: no time ratio, because every time case of `{name}` "
                f"was {_statuses(rows)} (a disturbed time is no measurement)"
            )
    return f"`{variant}` against `sdpa`: no time ratio, because they ran undisturbed at no common L"


def _own_variant(e: _Evidence) -> Finding | None:
    """The kernels the user brought (:func:`own_variants` that are a plugin's) against ``sdpa``, or
    why there is no ratio: the question they ask first (no sentence without an sdpa case). A
    built-in variant is ranked with the others (:func:`_fastest`)."""
    own = [v for v in own_variants(e.time_rows) if not built_in(v)]
    if not own or not (e.time_rows["variant"] == "sdpa").any():
        return None
    return Finding("; ".join(_against_sdpa(e, v) for v in own[:3]) + ".", "fig-progression")


def _computes_softmax_attention(variant: str) -> bool:
    """Whether ``variant`` computes softmax attention over every allowed pair (unknown: yes)."""
    return variant not in variant_names() or get_variant(variant).SOFTMAX_ATTENTION


def _fastest(e: _Evidence) -> Finding | None:
    """Fastest and slowest softmax attention at the longest length where most of them ran.

    Kernels that compute another function (linear, banded, sparse) are not ranked against it: faster
    at computing something else is no finding. They are named instead.
    """
    exact = e.ok_time[e.ok_time["variant"].map(_computes_softmax_attention)]
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


ANSWER_COLUMNS = (
    "variant",
    "cases run",
    "checked",
    "wrong",
    "worst error",
    "its tolerance",
    "worst / tolerance",
    "slices checked",
    "worst at L",
    "answer",
)
"""The columns of :func:`answer_check`, in the order the page shows them."""


def _slices(checks: pd.DataFrame) -> str:
    """The (batch, head) slices the answer check compared, of all there were: "8/8", or "2/8 to 8/8"
    where the variant's cases differ ("" where no case recorded them)."""
    seen = {str(s) for s in checks.get("checked_slices", pd.Series(dtype=object)).dropna()}
    parts = {s: s.split("/") for s in seen if s.count("/") == 1}
    shares = sorted(
        (int(a) / int(b), s)
        for s, (a, b) in parts.items()
        if a.isdigit() and b.isdigit() and int(b)
    )
    if not shares:
        return ""
    low, high = shares[0][1], shares[-1][1]
    return low if low == high else f"{low} to {high}"


def _answer_row(variant: str, time_rows: pd.DataFrame, checks: pd.DataFrame) -> dict:
    """One variant's answer check: how many of its cases were checked, and its worst error."""
    ran = time_rows[time_rows["status"].isin((Status.OK, Status.NOISY, Status.WRONG))]
    wrong = int((ran["status"] == Status.WRONG).sum())
    mine = checks[checks["variant"] == variant]
    row = dict.fromkeys(ANSWER_COLUMNS, math.nan) | {
        "variant": variant,
        "cases run": len(ran),
        "checked": len(mine),
        "wrong": wrong,
    }
    if not len(ran):
        counts = ", ".join(f"{n} {k}" for k, n in time_rows["status"].value_counts().items())
        row["answer"] = f"did not run ({counts})"
        return row
    if not len(mine):
        row["answer"] = "not checked: no error against the float64 reference was recorded"
        return row
    worst = mine.loc[mine["value"].idxmax()]
    row |= {
        "worst error": float(worst["max_error"]),
        "its tolerance": float(worst["max_error"] / worst["value"])
        if worst["value"] > 0
        else math.nan,
        "worst / tolerance": float(worst["value"]),
        "slices checked": _slices(mine),
        "worst at L": int(worst["seq_len"]),
    }
    row["answer"] = (
        f"WRONG in {wrong} of {len(ran)} cases" if wrong else f"correct in {len(mine)} checked"
    )
    return row


def answer_check(frame: pd.DataFrame) -> pd.DataFrame:
    """Each variant's check against the float64 reference: cases checked, worst error, verdict.

    Read from the ``error_ratio`` rows (max error / tolerance; above 1 is ``wrong``) and the
    ``max_error`` rows of the same cases; a variant with no such row was not checked, and says so.
    """
    if not len(frame):
        return pd.DataFrame(columns=ANSWER_COLUMNS)
    keys = [c for c in contract.case_columns(("source", "commit")) if c in frame]
    checks = frame[(frame["metric"] == "error_ratio") & frame["value"].notna()]
    errors = (
        frame.loc[frame["metric"] == "max_error", [*keys, "value"]]
        .drop_duplicates(keys)
        .rename(columns={"value": "max_error"})
    )
    checks = checks.merge(errors, on=keys, how="left").reset_index(drop=True)
    time_rows = frame[frame["metric"] == "time"]
    rows = [
        _answer_row(v, time_rows[time_rows["variant"] == v], checks)
        for v in dict.fromkeys(time_rows["variant"])
    ]
    return pd.DataFrame(rows, columns=ANSWER_COLUMNS)


_ANSWERS_NAMED = 6
"""Variants the answer-check finding names one by one; beyond them it names the worst three."""


def _answers(e: _Evidence) -> Finding | None:
    """The answer check of every variant: wrong ones first, by name; else each one's worst error."""
    table = answer_check(e.frame)
    if not len(table) or not table["cases run"].sum():
        return None
    wrong = table[table["wrong"] > 0]
    if len(wrong):
        named = "; ".join(
            f"`{r['variant']}` in {r['wrong']} of {count(int(r['cases run']), 'case')}"
            for r in wrong.to_dict("records")
        )
        return Finding(
            f"Wrong answers against the float64 reference: {named}. Those cases are left out of "
            "every figure, fit and ranking.",
            "wrong",
        )
    checked = table[table["checked"] > 0]
    cases = count(int(checked["checked"].sum()), "case")  # every variant's, before the worst few
    if len(checked) > _ANSWERS_NAMED:  # the worst few; the table under the headline has them all
        checked = checked.sort_values("worst / tolerance", ascending=False).head(3)
    parts = [
        f"`{r['variant']}` {fmt(r['worst / tolerance'], 'x')}"
        + (
            ""
            if r["checked"] == r["cases run"]
            else f" ({r['checked']} of {r['cases run']} checked)"
        )
        for r in checked.to_dict("records")
    ]
    unchecked = [
        f"`{v}`" for v in table.loc[(table["checked"] == 0) & (table["cases run"] > 0), "variant"]
    ]
    text = (
        f"Every answer checked against the float64 reference was correct "
        f"({cases}); the worst error of each variant as a "
        "share of its tolerance: "
        + ", ".join(parts)
        + ("" if len(parts) == len(table[table["checked"] > 0]) else " (the worst three)")
        if parts
        else "No answer was checked against the float64 reference"
    )
    if unchecked:
        text += f"; not checked: {', '.join(unchecked)}"
    return Finding(text + ".", "answers")


def _fit_verdicts(e: _Evidence) -> Finding | None:
    """How many fits match the declared big-O, grow slower, faster, or say nothing, then per metric.

    The page's one tally: :func:`complexity.breakdown`, the same sentence the exponents section
    opens with (a match within the tolerance is a match; the table's tooltips say which rule
    decided), then the variants that grow faster.
    """
    t = complexity.tally(e.fits)
    if not t.judged:
        return None
    text = complexity.breakdown(e.fits, complexity.time_not_fitted(e.frame, e.fits))
    text = text[:1].upper() + text[1:]
    faster = sorted({s.split(" ")[0] for s in t.steeper})
    if faster:
        text += f"; growing faster than declared: {', '.join(f'`{v}`' for v in faster)}"
    return Finding(text + ".", "exponents")


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


PAGE_FAULTS_COUNT = (
    "page faults count the pages a call touches first, so they follow how the allocator reuses "
    "freed memory: a metric of their own, not the peak memory the memory verdict is about"
)
"""What page faults count, said wherever they appear beside the memory verdict: a newcomer read
page faults growing as L^1.94 beside "memory matches O(L)" as memory growing like L²."""

_EXACT_NAMES = {
    "peak_tensor_bytes": "peak memory",
    "instructions": "instruction counts",
    "page_faults": "page faults",
}
"""The fitted metrics a busy machine cannot move, as a sentence names them."""


def _noisy_exact(frame: pd.DataFrame) -> tuple[str, ...]:
    """The exact metrics fitted from ``noisy`` cases: their rows are ``ok`` (never timed)."""
    noisy = frame[(frame["metric"] == "time") & (frame["status"] == Status.NOISY)]
    if not len(noisy):
        return ()
    keys = [c for c in contract.case_columns(("source", "commit")) if c in frame]
    cases = noisy[keys].drop_duplicates()
    rows = frame[frame["metric"].isin(_EXACT_NAMES) & (frame["status"] == Status.OK)]
    rows = rows.merge(cases, on=keys)
    return tuple(_EXACT_NAMES[m] for m in _EXACT_NAMES if (rows["metric"] == m).any())


def _not_facts(e: _Evidence) -> Finding | None:
    """The cases whose time is not a measurement to rely on, and what of them is still fitted.

    A ``noisy`` case's time is never fitted or ranked, but its exact metrics (bytes, counts) are:
    the sentence says both, so it never contradicts a fit of a noisy case's memory.
    """
    time_rows = e.frame[e.frame["metric"] == "time"]
    bad = time_rows[time_rows["status"] != Status.OK]
    if not len(bad):
        return None
    counts = ", ".join(f"{v} {k}" for k, v in bad["status"].value_counts().items())
    text = (
        f"{len(bad)} of {count(len(time_rows), 'case')} {agree(len(bad), 'has', 'have')} no "
        f"time to rely on ({counts}): {agree(len(bad), 'its time is', 'their times are')} never "
        "fitted or ranked."
    )
    exact = _noisy_exact(e.frame)
    if exact:
        noisy = int((bad["status"] == Status.NOISY).sum())
        whose = "the noisy case's" if noisy == 1 else f"the {noisy} noisy cases'"
        text += (
            f" But {whose} {' and '.join(exact)} are exact (a busy machine moves time, not "
            "bytes or counts), so those are fitted like any other"
            + (f" ({PAGE_FAULTS_COUNT})." if "page faults" in exact else ".")
        )
    return Finding(text, "problems")


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


_RULES: tuple[Callable[[_Evidence], Finding | None], ...] = (
    _above_roof,
    _answers,
    _own_variant,
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
_MAX_FINDINGS = 8


def findings(
    frame: pd.DataFrame,
    fits: pd.DataFrame,
    primary: dict[str, str],
    comparisons: Sequence[Comparison] = (),
) -> tuple[Finding, ...]:
    """Up to _MAX_FINDINGS sentences the data supports, each with the id of its figure.

    Only ``ok`` rows and measured values (not method "model") are compared or ranked, and only
    conclusive fits are quoted; a sentence whose numbers are missing is left out, never guessed. The
    count of cases not to rely on closes the list when there is room for it.
    """
    evidence = _evidence(frame, fits, primary, comparisons)
    out = [f for f in (rule(evidence) for rule in _RULES) if f is not None]
    if len(out) < _MAX_FINDINGS - 1:
        closing = _not_facts(evidence)
        out += [closing] if closing else []
    return tuple(out[:_MAX_FINDINGS])
