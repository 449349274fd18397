"""The gate's terminal table: ``attnbench regress``'s rows, its growth lines and its verdict.

Lines of at most :data:`_GATE_WIDTH` columns (a terminal's, or a CI log's, without wrapping); the
command line prints them. Every cell has a fixed width, so the ratio, the deciding figure, is always
on screen: values carry short units (``85.0M instr``, ``1.20 GiB``, ``3.41 ms``), a long case wraps
within its column, and why a row decided as it did goes on the line below it, for the rows a reader
acts on (regressed, wrong, undecided, improved). The rows come in that order too, then ``ok``,
``shown``, ``not timed`` and ``n/a``. The Markdown of the same outcome:
:func:`attnbench.gate.markdown.gate_summary`.
"""

from __future__ import annotations

import math
import textwrap

import pandas as pd

from attnbench.contract import Basis, GateVerdict

__all__ = ["SPEED_CORRECTED", "gate_lines", "growth_lines", "gate_cells", "short_value"]

_GATE_WIDTH = 100
"""Columns of a line of regress's table (a terminal's, or a CI log's, without wrapping)."""
_WIDTHS = {"verdict": 9, "metric": 12, "case": 32, "base": 11, "head": 11, "ratio": 9}
"""Each column's width; with a space between columns the row takes 89 of the 100."""
_WHY_INDENT = " " * (_WIDTHS["verdict"] + 1)
"""A row's reason starts under its metric."""
_IMPROVED = "improved"
"""How the table shows an ``ok`` row beyond the gate's rule the other way."""
_ACTED_ON = (GateVerdict.REGRESSED, GateVerdict.WRONG, GateVerdict.UNDECIDED, _IMPROVED)
"""The rows whose reason the table shows, on the lines below them."""
_ORDER = {
    GateVerdict.WRONG: 0,
    GateVerdict.REGRESSED: 0,
    GateVerdict.UNDECIDED: 1,
    _IMPROVED: 2,
    GateVerdict.OK: 3,
    GateVerdict.SHOWN: 4,
    GateVerdict.NOT_TIMED: 5,
    GateVerdict.NOT_APPLICABLE: 6,
}
"""The order of the rows by what they ask of the reader: act, rerun, enjoy, nothing."""
_METRIC = {
    "peak_tensor_bytes": "peak bytes",
    "instructions": "instructions",
    "error_ratio": "error ratio",
    "flops": "model FLOPs",  # the variant's declared count: doing its work twice leaves it
    "time": "time",
}
"""The metrics' names in the table (the CSV beside the results keeps the full ones)."""


def gate_lines(outcome, metric: str, factors: dict[str, float]) -> tuple[list[str], int]:
    """The gate's table and verdict as lines, and the exit code of its verdict.

    ``outcome`` is :class:`attnbench.gate.Outcome`; ``factors`` the allowed HEAD/BASE ratios by
    ``"time"``, ``"memory"`` and ``"instructions"`` (as
    :func:`attnbench.gate.markdown.gate_summary`).
    """
    lines = [_gate_row(_HEADER)]
    for rec in _ordered(outcome.table).to_dict("records"):
        lines += _row_lines(rec)
    table = outcome.table
    predicted = "basis" in table and bool((table["basis"] == Basis.PREDICTED).any())
    lines += [
        f"\nBASE {outcome.base[:10]}  HEAD {outcome.head[:10]}"
        + ("  (* predicted at the target length: see how cost grows)" if predicted else ""),
        f"results: {outcome.results_dir} (every row's whole reason: attnbench-gate.csv there)",
    ]
    untimed = table[table["verdict"] == GateVerdict.NOT_TIMED] if len(table) else table
    if len(untimed) and "reason" in untimed:
        lines += _wrapped(f"not timed: {untimed['reason'].iloc[0]}", "      ")
    if _speed_corrected(table):
        lines += _wrapped(SPEED_CORRECTED, "      ")
    lines += growth_lines(table)
    notes = sorted({n for n in table["note"] if isinstance(n, str) and n})
    lines += [line for n in notes for line in _wrapped(f"note: {n}", "      ")]
    verdict, code = _verdict_lines(outcome, metric, factors)
    return [*lines, "", *verdict], code


SPEED_CORRECTED = (
    "time ratios are speed-corrected: each sample over the calibration probe timed beside it, so a "
    "ratio can differ from BASE and HEAD's times as measured (a row's reason gives both)"
)
"""The footer line under a table whose time ratios are speed-corrected: a newcomer read "9.32 ms
6.78 ms x1.00" and found nothing saying why the ratio was not the times'."""


def _speed_corrected(table: pd.DataFrame) -> bool:
    """Whether a time row's ratio is speed-corrected (its reason says so, :mod:`.gate.decision`)."""
    if not len(table) or "reason" not in table:
        return False
    reasons = table.loc[table["metric"] == "time", "reason"].astype(str)
    return bool(reasons.str.startswith("speed-corrected").any())


_HEADER = {
    "verdict": "verdict",
    "metric": "metric",
    "case": "case",
    "base": "BASE",
    "head": "HEAD",
    "ratio": "ratio",
}
"""The table's first row."""


def _shown_verdict(rec: dict) -> str:
    """The row's verdict as the table shows it: an ``ok`` row beyond the rule the other way is
    ``improved``."""
    verdict = str(rec["verdict"])
    return _IMPROVED if verdict == GateVerdict.OK and rec.get("improved") in (True,) else verdict


def _ordered(table: pd.DataFrame) -> pd.DataFrame:
    """Regressed and wrong rows first, then undecided, improved, ok, shown, not timed, n/a.

    The rows a reader acts on, the largest ratio first (the largest gain among the improved; equal
    to 6 decimals, by case); the others by metric and case, each series' lengths in order, its
    prediction last.
    """
    if not len(table):
        return table
    shown = [_shown_verdict(rec) for rec in table.to_dict("records")]
    rank = [_ORDER.get(v, len(_ORDER)) for v in shown]
    ratio = table["ratio"].astype(float).round(6).where(table["ratio"].notna(), math.inf)
    key = [
        (r if v == _IMPROVED else -r) if v in _ACTED_ON else 0.0
        for r, v in zip(ratio, shown, strict=True)
    ]
    predicted = table["basis"] == Basis.PREDICTED if "basis" in table else False
    return (
        table.assign(_rank=rank, _key=key, _predicted=predicted)
        .sort_values(["_rank", "_key", "metric", "variant", "_predicted", "seq_len"], kind="stable")
        .drop(columns=["_rank", "_key", "_predicted"])
    )


def _row_lines(rec: dict) -> list[str]:
    """A row of the table: its cells (the case wrapped within its column), and for a row the reader
    acts on, why, on the lines below."""
    cells = gate_cells(rec)
    case = textwrap.wrap(cells["case"], _WIDTHS["case"], break_on_hyphens=False) or [""]
    lines = [_gate_row({**cells, "case": case[0]})]
    lines += [_gate_row({**dict.fromkeys(_HEADER, ""), "case": more}) for more in case[1:]]
    if cells["verdict"] in _ACTED_ON and cells["why"]:
        lines += _wrapped(cells["why"], _WHY_INDENT)
    return lines


def _wrapped(text: str, indent: str) -> list[str]:
    """``text`` in lines of at most the table's width, each after ``indent``."""
    return textwrap.wrap(
        text, _GATE_WIDTH, initial_indent=indent, subsequent_indent=indent + "  "
    ) or [indent.rstrip()]


def _verdict_lines(outcome, metric: str, factors: dict[str, float]) -> tuple[list[str], int]:
    """PASS (0), FAIL with the regressions (1), or UNDECIDED with the cases left (4)."""
    if outcome.passed:
        time_, counts = factors["time"], factors["instructions"]
        decided = {
            "time": f"{time_}x time",
            "instructions": f"{counts}x instruction counts",
            "both": f"{counts}x instruction counts and {time_}x time",
        }[metric]
        return [
            f"PASS: nothing regressed beyond {decided} / {factors['memory']}x peak tensor bytes"
        ], 0
    if not outcome.regressions.empty:
        lines = [f"FAIL: {len(outcome.regressions)} regression(s):"]
        for rec in _ordered(outcome.regressions).to_dict("records"):
            cells = gate_cells(rec)
            rule = _text(rec.get("rule")) or _text(rec.get("reason"))
            fired = f" ({rule})" if rec.get("basis") == Basis.PREDICTED and rule else ""
            lines += _wrapped(f"{cells['case']} {cells['metric']} {cells['ratio']}{fired}", "  ")
        return lines, 1
    lines = textwrap.wrap(
        f"UNDECIDED: no regression found, but {len(outcome.undecided)} time case(s) could not be "
        "decided after a confirmation round (disturbed rounds, or too scattered to exclude a 1.5x "
        "slowdown); rerun with more --rounds on a quieter machine:",
        _GATE_WIDTH,
    )
    for rec in _ordered(outcome.undecided).to_dict("records"):
        lines += _wrapped(f"{gate_cells(rec)['case']}: {rec['reason']}", "  ")
    return lines, 4


def growth_lines(table: pd.DataFrame) -> list[str]:
    """How each case's exact metrics grow, BASE -> HEAD (the gate's ``predicted`` rows).

    A line per series whose exponent or predicted ratio moved, or that regressed: exponents, the
    measured ratio at the longest length, the predicted one at the target length; a regressed one
    says on the line below which rule fired (the predicted ratio beyond the metric's factor, the
    exponent beyond its threshold, or both). Nothing when no series was fitted.
    """
    from attnbench.analysis.growth import exponent_text, moved_series

    predicted, moved = moved_series(table)
    if not len(predicted):
        return []
    measured_at = int(predicted["measured_length"].max())
    lines = [
        f"\nhow cost grows (rows marked *): {len(predicted)} series fitted along L; "
        + (f"{len(moved)} moved:" if len(moved) else "no exponent change")
    ]
    if len(moved):
        lines.append(
            f"  (exponent BASE -> HEAD; ratio measured at L={measured_at} -> "
            f"predicted at L={int(predicted['at_length'].max())})"
        )
    for rec in moved.sort_values("ratio", ascending=False).to_dict("records"):
        pass_ = "bwd" if rec["mode"] == "backward" else "fwd"
        metric = _METRIC.get(rec["metric"], rec["metric"])
        lines += _wrapped(
            f"{_shown_verdict(rec):<10} {rec['variant']} {pass_} {metric}  "
            f"{exponent_text(rec['base_exponent'])} -> {exponent_text(rec['head_exponent'])}  "
            f"{_ratio_text(rec['measured_ratio'], rec['metric'])} -> "
            f"{_ratio_text(rec['ratio'], rec['metric'])}",
            "  ",
        )
        if rec["verdict"] == GateVerdict.REGRESSED and _text(rec.get("rule")):
            lines.append(f"  {'':<10} fired: {rec['rule']}")
    return lines


def _ratio_text(value: float, metric: str) -> str:
    """A ratio within its column (9): ``x1.0023``, ``x11.67``, ``x1.23e+06``."""
    from attnbench.analysis.text import ratio

    if value is None or value != value:
        return "n/a"
    return ratio(value, metric) if abs(value) < 1000 else f"x{value:.3g}"


_COUNT_SCALES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))
_BYTE_SCALES = tuple(
    (1024.0**k, f" {p}iB") for k, p in ((5, "P"), (4, "T"), (3, "G"), (2, "M"), (1, "K"))
)


def short_value(value: float, metric: str) -> str:
    """``value`` of ``metric`` in at most 11 characters, with a short unit.

    Seconds as ``3.41 ms``, bytes in binary units (``1.20 GiB``), counts with a metric prefix
    (``85.0M instr``, ``1.23G FLOP``), anything else to 3 significant figures.
    """
    from attnbench.analysis.text import fmt

    try:
        value = float(value)
    except (TypeError, ValueError):
        return "n/a"
    if not math.isfinite(value):
        return "n/a"
    if metric == "time":
        return fmt(value, "s")
    scales, unit = {
        "peak_tensor_bytes": (_BYTE_SCALES, ""),
        "instructions": (_COUNT_SCALES, " instr"),
        "flops": (_COUNT_SCALES, " FLOP"),
    }.get(metric, ((), ""))
    for scale, prefix in scales:
        if abs(value) >= scale:
            m = value / scale
            return f"{_three(m)}{prefix}{unit}" if abs(m) < 10_000 else f"{value:.2e}"
    if metric == "peak_tensor_bytes":
        return f"{value:.0f} B"
    return f"{_three(value)}{unit}" if value == 0 or 1e-3 <= abs(value) < 1e6 else f"{value:.2e}"


def _three(m: float) -> str:
    """``m`` to 3 significant figures, trailing zeros kept: 85.0, 1.20, 114 (1000 from 999.7)."""
    m = float(f"{m:.3g}")
    digits = max(0, 2 - math.floor(math.log10(abs(m)))) if m else 0
    return f"{m:.{digits}f}"


def _text(value: object) -> str:
    """A cell's text ("" for a missing one: None or NaN)."""
    return value if isinstance(value, str) else ""


def _case(rec: dict) -> str:
    """``batched L=256 fwd`` (the device and mask where they are not cpu and none; ``*``: the row
    is predicted at the target length from each side's fit)."""
    parts = [
        str(rec["variant"]),
        f"L={rec['seq_len']}",
        "bwd" if rec["mode"] == "backward" else "fwd",
    ]
    parts += [
        str(rec[c])
        for c, usual in (("device", "cpu"), ("mask", "none"))
        if rec.get(c, usual) != usual
    ]
    return " ".join(parts) + ("*" if rec.get("basis") == Basis.PREDICTED else "")


def gate_cells(rec: dict) -> dict[str, str]:
    """One gate row as text: values with short units, the ratio with the digits a verdict needs."""
    return {
        "verdict": _shown_verdict(rec),
        "metric": _METRIC.get(rec["metric"], str(rec["metric"]).replace("_", " ")),
        "case": _case(rec),
        "base": short_value(rec["base_value"], rec["metric"]),
        "head": short_value(rec["head_value"], rec["metric"]),
        "ratio": _ratio_text(rec["ratio"], rec["metric"]),
        "why": str(rec.get("reason") or rec.get("note") or ""),
    }


def _gate_row(cells: dict[str, str]) -> str:
    """The cells in their columns; one wider than its column (the case is wrapped before) is cut."""
    w = _WIDTHS
    fit = {k: cells[k] if len(cells[k]) <= w[k] else cells[k][: w[k] - 1] + "~" for k in w}
    return (
        f"{fit['verdict']:<{w['verdict']}} {fit['metric']:<{w['metric']}} "
        f"{fit['case']:<{w['case']}} {fit['base']:>{w['base']}} {fit['head']:>{w['head']}} "
        f"{fit['ratio']:>{w['ratio']}}"
    ).rstrip()
