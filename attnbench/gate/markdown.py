"""Markdown for the people who read a pull request: the gate's verdict and a history's steps.

``attnbench regress --summary FILE`` and ``attnbench history --summary FILE`` write these (and
append them to ``$GITHUB_STEP_SUMMARY`` when it is set, which GitHub shows on the run's summary page
and the pull request's checks). The gate's summary lists regressions first, then what it could not
decide, then improvements beyond the factor, each with its ratio and metric, and says in one line
what decided.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import changes, text
from attnbench.analysis.growth import EXPONENT_THRESHOLD, exponent_text, moved_series
from attnbench.analysis.text import fmt
from attnbench.contract import Basis, GateVerdict
from attnbench.io import atomic_write_text, check_output_file

__all__ = [
    "MAX_ROWS",
    "STEP_SUMMARY",
    "UNITS",
    "check_summary",
    "decided_line",
    "gate_summary",
    "growth_lines",
    "history_summary",
    "write_summary",
]

STEP_SUMMARY = "GITHUB_STEP_SUMMARY"
"""The file GitHub Actions gives every step for Markdown it shows on the run's summary page."""
MAX_ROWS = 30
"""Rows a table shows before it says how many more there are (a summary is read, not searched)."""
UNITS = {
    "time": "s",
    "peak_tensor_bytes": "bytes",
    "instructions": "",
    "flops": "",
    "error_ratio": "",
}


def _value(value: float, metric: str) -> str:
    if value is None or not math.isfinite(value):
        return "n/a"
    unit = UNITS.get(metric, "")
    if unit:
        return fmt(value, unit)
    return f"{value:,.0f}" if abs(value) >= 1000 else f"{value:.4g}"


def _ratio(rec: dict) -> str:
    ratio = rec.get("ratio")
    if ratio is None or not math.isfinite(ratio):
        return "n/a"
    return text.ratio(ratio, rec["metric"])


def _cell(text: object) -> str:
    """Text safe in a Markdown table cell."""
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rows(table: pd.DataFrame, why: bool = True) -> list[str]:
    head = "| case | metric | BASE | HEAD | ratio |" + (" why |" if why else "")
    lines = [head, "|---|---|---:|---:|---:|" + ("---|" if why else "")]
    for rec in table.head(MAX_ROWS).to_dict("records"):
        predicted = " (predicted)" if rec.get("basis") == Basis.PREDICTED else ""
        cells = [
            changes.case_label(rec) + predicted,
            rec["metric"],
            _value(rec.get("base_value"), rec["metric"]),
            _value(rec.get("head_value"), rec["metric"]),
            _ratio(rec),
        ]
        if why:
            cells.append(rec.get("reason") or rec.get("verdict", ""))
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    if len(table) > MAX_ROWS:
        lines.append(f"\n{len(table) - MAX_ROWS} more in the job's log.")
    return lines


def _ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """Worst first: the largest ratio (a failed case, with no ratio, before all)."""
    key = rows["ratio"].where(rows["ratio"].notna(), math.inf)
    return (
        rows.assign(_key=key)
        .sort_values(["_key", "variant", "seq_len"], ascending=[False, True, True])
        .drop(columns="_key")
    )


def _cases(n: int) -> str:
    return f"{n} case" + ("" if n == 1 else "s")


def decided_line(table: pd.DataFrame, metric: str, factors: dict[str, float]) -> str:
    """One line: which metrics decided, with their factors and how many cases each judged."""
    predicted = (
        table["basis"] == Basis.PREDICTED if "basis" in table else pd.Series(False, table.index)
    )
    series, table = int(predicted.sum()), table[~predicted]  # fitted series are not cases

    def cases(name: str, verdicts=contract.GATE_DECIDED) -> int:
        return int(((table["metric"] == name) & table["verdict"].isin(verdicts)).sum())

    parts = []
    if metric in ("instructions", "both"):
        parts.append(
            f"instruction counts (x{factors['instructions']:g}, {_cases(cases('instructions'))})"
        )
    parts.append(
        f"peak tensor bytes (x{factors['memory']:g}, {_cases(cases('peak_tensor_bytes'))})"
    )
    parts.append("FLOPs (any growth) and correctness")
    if series:
        parts.append(
            f"how cost grows ({series} series fitted along L: predicted ratios within their "
            f"factors, exponents within +{EXPONENT_THRESHOLD:g})"
        )
    timed = cases("time", contract.GATE_JUDGED)
    shown = int(((table["metric"] == "time") & (table["verdict"] == GateVerdict.SHOWN)).sum())
    if metric == "instructions":
        time = f"time shown beside them, not deciding ({_cases(shown)})"
    elif metric == "both":
        time = (
            f"time where it could decide (x{factors['time']:g} allowance, {_cases(timed)}"
            + (f"; {shown} undecided and shown, their counts decided" if shown else "")
            + ")"
        )
    else:
        time = f"time (x{factors['time']:g} allowance, {_cases(timed)})"
    untimed = int(((table["metric"] == "time") & (table["verdict"] == GateVerdict.NOT_TIMED)).sum())
    if untimed:
        time += f"; {_cases(untimed)} not timed (counts decided them)"
    return "**What decided:** " + ", ".join(parts) + "; " + time + "."


def gate_summary(
    outcome, metric: str, factors: dict[str, float], elapsed_s: float | None = None
) -> str:
    """The gate's verdict as Markdown: a title, regressions, undecided, improvements, what decided.

    Args:
        outcome: an :class:`attnbench.gate.Outcome`.
        metric: what decided (``time``, ``instructions``, ``both``).
        factors: ``time``, ``memory`` and ``instructions`` factors the gate used.
        elapsed_s: the gate's wall time, said in the last line when given.
    """
    table = outcome.table
    regressions, undecided, improved = (
        _ordered(outcome.regressions),
        _ordered(outcome.undecided),
        _improved(table),
    )
    lines = [
        f"### attnbench regress: {_title(regressions, undecided)}",
        "",
        f"BASE `{outcome.base[:10]}`, HEAD `{outcome.head[:10]}`",
        "",
    ]
    lines += _sections(regressions, undecided, improved)
    lines += growth_lines(table)
    judged = table[table["verdict"].isin(contract.GATE_JUDGED)]
    quiet = len(judged) - len(regressions) - len(undecided) - len(improved)
    lines.append(f"{quiet} other result(s) within their factors.")
    lines += ["", decided_line(table, metric, factors)]
    notes = sorted(
        {n for n in table.get("note", pd.Series(dtype=object)) if isinstance(n, str) and n}
    )
    lines += [f"> note: {n}" for n in notes]
    if elapsed_s is not None:
        lines += ["", f"Measured in {elapsed_s:.0f} s."]
    return "\n".join(lines) + "\n"


def growth_lines(table: pd.DataFrame) -> list[str]:
    """How cost grows: per series whose exponent or predicted ratio moved, the exponents and the
    measured and predicted ratios side by side (a line saying so where none moved)."""
    predicted, moved = moved_series(table)
    if not len(predicted):
        return []
    at = int(predicted["at_length"].max())
    head = (
        f"**How cost grows** ({len(predicted)} series of counts, bytes and FLOPs fitted along L, "
        f"c0 + c1·L + c2·L² extrapolated to L={at})"
    )
    if not len(moved):
        return [head + ": no exponent change, every predicted ratio within its factor.", ""]
    lines = [
        head,
        "",
        "| case | metric | exponent BASE -> HEAD | measured | predicted "
        "| verdict: the rule that fired |",
        "|---|---|---|---:|---:|---|",
    ]
    for rec in _ordered(moved).head(MAX_ROWS).to_dict("records"):
        metric = rec["metric"]
        cells = [
            changes.case_label({**rec, "seq_len": None}),
            metric,
            f"{exponent_text(rec['base_exponent'])} -> {exponent_text(rec['head_exponent'])}",
            f"{text.ratio(rec['measured_ratio'], metric)} at L={int(rec['measured_length'])}",
            f"{text.ratio(rec['ratio'], metric)} at L={int(rec['at_length'])}",
            _growth_verdict(rec),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return [*lines, ""]


def _growth_verdict(rec: dict) -> str:
    """``regressed: predicted x11.67 at L=131072`` (or ``exponent +0.04``, or both): the rule that
    fired, so an exponent that went down beside a regression is not read as its cause."""
    rule = rec.get("rule")
    if rec["verdict"] == GateVerdict.REGRESSED and isinstance(rule, str) and rule:
        return f"regressed: {rule}"
    return str(rec["verdict"])


def _improved(table: pd.DataFrame) -> pd.DataFrame:
    """The ``ok`` rows marked improved, the largest gain first."""
    marked = table.get("improved", pd.Series(False, index=table.index)).fillna(False).astype(bool)
    improved = table[marked & (table["verdict"] == GateVerdict.OK)]
    return improved.assign(_key=improved["ratio"]).sort_values("_key").drop(columns="_key")


def _title(regressions: pd.DataFrame, undecided: pd.DataFrame) -> str:
    if len(regressions):
        return f"FAIL: {len(regressions)} regression(s)"
    if len(undecided):
        return f"UNDECIDED: {len(undecided)} time case(s)"
    return "PASS"


def _sections(
    regressions: pd.DataFrame, undecided: pd.DataFrame, improved: pd.DataFrame
) -> list[str]:
    """A table each of the regressed, undecided and improved rows (a line where there are none)."""
    lines = []
    if len(regressions):
        lines += [f"**Regressed ({len(regressions)})**", "", *_rows(regressions), ""]
    if len(undecided):
        lines += [
            f"**Undecided ({len(undecided)})**: rerun with more `--rounds` on a quieter machine",
            "",
            *_rows(undecided),
            "",
        ]
    if len(improved):
        lines += [
            f"**Improved beyond the factor ({len(improved)})**",
            "",
            *_rows(improved, why=False),
            "",
        ]
    if not (len(regressions) or len(undecided) or len(improved)):
        lines += ["Every case within its factor.", ""]
    return lines


def history_summary(history: changes.History) -> str:
    """A history's steps as Markdown: regressions, then improvements, with commits and ratio."""
    shown = changes.table(history)
    n = len(history.commits)
    lines = ["### attnbench history", ""]
    if not len(shown):
        lines.append(f"No step and no drift in {n} commits.")
        return "\n".join(lines) + "\n"
    regressions = len(history.regressions)
    lines.append(
        f"{regressions} regression(s) and {len(shown) - regressions} improvement(s) in {n} commits "
        f"(a drift: beyond the factor over at most {history.window} commits, "
        "no single commit beyond it)."
    )
    lines += [
        "",
        "| commit(s) | case | metric | ratio | change | subject |",
        "|---|---|---|---:|---|---|",
    ]
    for rec in shown.head(MAX_ROWS).to_dict("records"):
        lines.append(
            "| "
            + " | ".join(
                _cell(rec[c]) for c in ("commit", "case", "metric", "ratio", "change", "subject")
            )
            + " |"
        )
    if len(shown) > MAX_ROWS:
        lines.append(f"\n{len(shown) - MAX_ROWS} more in `steps.csv`.")
    return "\n".join(lines) + "\n"


def check_summary(path: str | Path | None = None) -> None:
    """Refuse (ValueError naming ``--summary`` or the variable) a summary :func:`write_summary`
    could not write: called before the work, so a bad target costs nothing."""
    if path is not None:
        check_output_file(path, "--summary")
    step = os.environ.get(STEP_SUMMARY, "").strip()
    if step:
        check_output_file(step, STEP_SUMMARY, append=True)


def write_summary(text: str, path: str | Path | None = None) -> list[Path]:
    """Write ``text`` to ``path`` (replaced) and append it to ``$GITHUB_STEP_SUMMARY`` when set.

    Returns the files written.
    """
    written = []
    if path is not None:
        target = atomic_write_text(path, text)
        written.append(target)
    step = os.environ.get(STEP_SUMMARY, "").strip()
    if step:
        with open(step, "a", encoding="utf-8") as out:
            out.write(text + "\n")
        written.append(Path(step))
    return written
