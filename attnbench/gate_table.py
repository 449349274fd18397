"""The gate's terminal table: ``attnbench regress``'s rows, its growth lines and its verdict.

Lines of at most :data:`_GATE_WIDTH` columns (a terminal's, or a CI log's, without wrapping); the
command line prints them. The Markdown of the same outcome: :func:`attnbench.markdown.gate_summary`.
"""

from __future__ import annotations

import pandas as pd

__all__ = ["gate_lines", "growth_lines", "gate_cells"]

_GATE_WIDTH = 100
"""Columns of a line of regress's table (a terminal's, or a CI log's, without wrapping)."""


def gate_lines(outcome, metric: str, factors: dict[str, float]) -> tuple[list[str], int]:
    """The gate's table and verdict as lines, and the exit code of its verdict.

    ``outcome`` is :class:`attnbench.regress.Outcome`; ``factors`` the allowed HEAD/BASE ratios by
    ``"time"``, ``"memory"`` and ``"instructions"`` (as :func:`attnbench.markdown.gate_summary`).
    """
    shown = outcome.table.sort_values(["verdict", "ratio"], ascending=[False, False])
    lines = [_gate_row(_HEADER)]
    lines += [_gate_row(gate_cells(rec)) for rec in shown.to_dict("records")]
    lines.append(
        f"\nbase {outcome.base[:10]}  head {outcome.head[:10]}  results: {outcome.results_dir}"
    )
    lines += growth_lines(outcome.table)
    lines += [f"note: {note}" for note in sorted({n for n in outcome.table["note"] if n})]
    verdict, code = _verdict_lines(outcome, metric, factors)
    return lines + verdict, code


_HEADER = {
    "verdict": "verdict",
    "metric": "metric",
    "case": "case",
    "base": "BASE",
    "head": "HEAD",
    "ratio": "ratio",
    "why": "why (whole reasons: attnbench-gate.csv beside the results)",
}
"""The table's first row."""


def _verdict_lines(outcome, metric: str, factors: dict[str, float]) -> tuple[list[str], int]:
    """PASS (0), FAIL with the regressions (1), or UNDECIDED with the cases left (4)."""
    from attnbench.analysis.text import ratio
    from attnbench.contract import Basis

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
        for rec in outcome.regressions.to_dict("records"):
            grew = f" predicted: {rec['reason']}" if rec.get("basis") == Basis.PREDICTED else ""
            lines.append(
                f"  {_gate_case(rec)}: {rec['metric']} {ratio(rec['ratio'], rec['metric'])}{grew}"
            )
        return lines, 1
    lines = [
        f"UNDECIDED: no regression found, but {len(outcome.undecided)} time case(s) could not be "
        "decided after a confirmation round (disturbed rounds, or too scattered to exclude a 1.5x "
        "slowdown); rerun with more --rounds on a quieter machine:"
    ]
    lines += [
        f"  {_gate_case(rec)}: {rec['reason']}" for rec in outcome.undecided.to_dict("records")
    ]
    return lines, 4


def growth_lines(table: pd.DataFrame) -> list[str]:
    """How each case's exact metrics grow, BASE -> HEAD (the gate's ``predicted`` rows).

    A line per series whose exponent or predicted ratio moved, or that regressed: exponents, the
    measured ratio at the longest length, the predicted one at the target length. Nothing when no
    series was fitted.
    """
    from attnbench.analysis.growth import exponent_text, moved_series
    from attnbench.analysis.text import ratio

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
        lines.append(
            _clip(
                f"  {rec['verdict']:<10} {rec['variant']} {pass_} {rec['metric']}  "
                f"{exponent_text(rec['base_exponent'])} -> {exponent_text(rec['head_exponent'])}  "
                f"{ratio(rec['measured_ratio'], rec['metric'])} -> "
                f"{ratio(rec['ratio'], rec['metric'])}"
            )
        )
    return lines


def _clip(line: str) -> str:
    return line if len(line) <= _GATE_WIDTH else line[: _GATE_WIDTH - 3] + "..."


def _gate_case(rec: dict) -> str:
    """A gate row's case as the verdict lines name it: ``benchmark [variant, L=..., mode]``."""
    return f"{rec['benchmark']} [{rec['variant']}, L={rec['seq_len']}, {rec['mode']}]"


def gate_cells(rec: dict) -> dict[str, str]:
    """One gate row as text: values with units, the ratio with the digits a verdict needs.

    The units are the metric table's.
    """
    from attnbench.analysis.text import fmt, ratio
    from attnbench.contract import UNITS, Basis

    unit = UNITS.get(rec["metric"], "")
    pass_ = "bwd" if rec["mode"] == "backward" else "fwd"
    return {
        "verdict": str(rec["verdict"]),
        "metric": str(rec["metric"]),
        # *: predicted at the target length from each side's fit (see "how cost grows")
        "case": f"{rec['variant']} L={rec['seq_len']} {pass_}"
        + ("*" if rec.get("basis") == Basis.PREDICTED else ""),
        "base": fmt(rec["base_value"], unit),
        "head": fmt(rec["head_value"], unit),
        "ratio": ratio(rec["ratio"], rec["metric"]) if rec["ratio"] == rec["ratio"] else "n/a",
        "why": str(rec.get("reason") or rec.get("note") or ""),
    }


def _gate_row(cells: dict[str, str]) -> str:
    line = (
        f"{cells['verdict']:<10} {cells['metric']:<17} {cells['case']:<22} "
        f"{cells['base']:>11} {cells['head']:>11} {cells['ratio']:>8}  {cells['why']}"
    )
    return _clip(line)
