"""What ``attnbench regress`` prints: its table in 100 columns, its growth lines, its progress.

No asv and no timing: the tables are :func:`attnbench.gate.compare` of scripted BASE/HEAD rows (as
asv's results give them), and the progress reader is fed a scripted asv output with a fake clock.
A fresh-clone run of the gate on a planted slowdown saw the table cut off its ratios
("85,000,000 instructions 114,000,000 instructi..."), its ``shown`` rows before the ``regressed``
ones, a growth row read "L^2.00 -> L^1.99 ... regressed" without saying the predicted cost fired,
and the progress say "asv at 0% Benchmarking virtualenv-..." for 13 minutes.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd

from attnbench.gate import Outcome, compare
from attnbench.gate.markdown import gate_summary
from attnbench.gate_table import gate_lines, growth_lines

LENGTHS = (256, 512, 1024)
"""The CI grid's lengths."""
FACTORS = {"time": 1.2, "memory": 1.1, "instructions": 1.002}
LONG = "my_key_blocked_attention_with_a_long_registered_name"
"""A plugin variant's name as long as users write them."""
VERDICTS = ("regressed", "wrong", "undecided", "improved", "ok", "shown", "not timed", "n/a")


def _frame(series: dict[tuple[str, str, str], list[float]]) -> pd.DataFrame:
    """Rows as asv's results give them: ``series[(commit, variant, metric)]`` at :data:`LENGTHS`."""
    return pd.DataFrame(
        {
            "benchmark": f"bench_attention.AttentionMetrics.track_{metric}",
            "variant": variant,
            "seq_len": length,
            "device": "cpu",
            "mode": "forward",
            "mask": "none",
            "commit": commit,
            "metric": metric,
            "value": value,
            "status": "ok",
            "spread": math.nan,
            "ci_low": math.nan,
            "ci_high": math.nan,
        }
        for (commit, variant, metric), values in series.items()
        for length, value in zip(LENGTHS, values, strict=True)
    )


def _outcome(table: pd.DataFrame) -> Outcome:
    return Outcome(
        table=table,
        regressions=table[table["verdict"].isin(["regressed", "wrong"])],
        undecided=table[table["verdict"] == "undecided"],
        base="a" * 40,
        head="b" * 40,
        results_dir=Path(".asv/regress/results"),
    )


def _counts(length: int) -> float:
    """Instruction counts of a dense variant: ~85 million at L=256."""
    return 1.2e3 * length**2 + 2.0e5 * length + 2.0e6


def planted_slowdown() -> Outcome:
    """The fresh-clone run's gate, scripted: batched does 1.34x the instructions (the planted
    slowdown) while the counts decide and time is shown; a plugin variant with a long name and
    counts in the hundreds of trillions stays within its factor; sdpa's time is shown."""
    series = {
        ("A", "batched", "instructions"): [_counts(n) for n in LENGTHS],
        ("B", "batched", "instructions"): [1.34 * _counts(n) for n in LENGTHS],
        ("A", LONG, "instructions"): [3.1e8 * n**2 for n in LENGTHS],
        ("B", LONG, "instructions"): [3.1e8 * n**2 for n in LENGTHS],
        ("A", "batched", "time"): [3.1e-3, 1.2e-2, 4.9e-2],
        ("B", "batched", "time"): [4.2e-3, 1.6e-2, 6.6e-2],
        ("A", "sdpa", "time"): [1.1e-3, 3.0e-3, 9.8e-3],
        ("B", "sdpa", "time"): [1.1e-3, 3.0e-3, 9.9e-3],
        ("A", "batched", "peak_tensor_bytes"): [2.0e6 * n for n in LENGTHS],
        ("B", "batched", "peak_tensor_bytes"): [2.0e6 * n for n in LENGTHS],
    }
    return _outcome(compare(_frame(series), "A", "B", metric="instructions"))


def _rows(lines: list[str]) -> list[str]:
    """The table's row lines (those that start with a verdict), before its first blank line."""
    table = lines[1 : lines.index("")]
    return [line for line in table if line[:9].strip() in VERDICTS]


def test_the_planted_slowdown_table_fits_100_columns_with_every_ratio_and_regressed_first():
    outcome = planted_slowdown()
    lines, code = gate_lines(outcome, "instructions", FACTORS)
    text = "\n".join(lines)
    assert code == 1, text
    assert max(len(line) for line in text.splitlines()) <= 100, text
    rows = _rows(lines)
    shown = outcome.table[outcome.table["verdict"] != "n/a"]
    assert len(rows) == len(shown), text  # every row has a line of its own
    # each row ends with its ratio, in full: the deciding figure is never cut off
    for line in rows:
        assert re.search(r" x\d+\.\d{2,4}$", line), line
    for rec in outcome.regressions.to_dict("records"):
        ratio = (
            f"x{rec['ratio']:.4f}" if rec["metric"] == "instructions" else f"x{rec['ratio']:.2f}"
        )
        assert any(line.endswith(ratio) and rec["variant"] in line for line in rows), (ratio, text)
    # regressed rows first, shown ones last
    verdicts = [line[:9].strip() for line in rows]
    assert verdicts == sorted(verdicts, key=lambda v: VERDICTS.index(v)), text
    assert verdicts[0] == "regressed" and verdicts[-1] == "shown", text
    # short units: counts in millions, bytes in binary units, seconds in ms
    assert "M instr" in text and "MiB" in text and " ms" in text, text
    # the long case wraps within its column; its ratio stays on its first line
    long_row = next(line for line in rows if "my_key_blocked" in line)
    assert long_row.endswith("x1.0000"), long_row
    # why a regressed row regressed, on the line below it
    first = lines.index(rows[0])
    assert "beyond" in lines[first + 1] and lines[first + 1].startswith("          "), text


def test_huge_values_and_ratios_keep_their_columns():
    """Counts in the exa range and a ratio in the millions: every row still ends with its ratio."""
    series = {
        ("A", "batched", "instructions"): [2.0e18 * n for n in LENGTHS],
        ("B", "batched", "instructions"): [3.0e24 * n for n in LENGTHS],
        ("A", "batched", "peak_tensor_bytes"): [1.5 * 1024**5 * n for n in LENGTHS],
        ("B", "batched", "peak_tensor_bytes"): [1.5 * 1024**5 * n for n in LENGTHS],
    }
    outcome = _outcome(compare(_frame(series), "A", "B", metric="instructions"))
    lines, _ = gate_lines(outcome, "instructions", FACTORS)
    assert max(len(line) for line in lines) <= 100, "\n".join(lines)
    rows = _rows(lines)
    assert all(re.search(r" x[\d.e+]+$", line) for line in rows), "\n".join(rows)
    assert any(line.endswith("x1.5e+06") for line in rows), "\n".join(rows)


def _growth_outcome(base: list[float], head: list[float], memory_factor: float) -> Outcome:
    series = {
        ("A", "chunked", "peak_tensor_bytes"): base,
        ("B", "chunked", "peak_tensor_bytes"): head,
    }
    table = compare(_frame(series), "A", "B", memory_factor=memory_factor)
    return _outcome(table)


def test_a_growth_row_names_the_rule_that_fired():
    """A small L² term beneath a linear cost (its exponent within +0.02) regresses on the predicted
    ratio; an exponent grown by 0.04 with a factor of 100 on the exponent: each row says which."""
    linear = [1000.0 * n for n in LENGTHS]
    predicted = _growth_outcome(linear, [1000.0 * n + 0.001 * n**2 for n in LENGTHS], 1.1)
    exponent = _growth_outcome(linear, [1000.0 * n**1.04 for n in LENGTHS], 100.0)
    for outcome, rule in (
        (predicted, "predicted x1.13 at L=131072"),
        (exponent, "exponent +0.04"),
    ):
        lines = growth_lines(outcome.table)
        fired = [line.strip() for line in lines if "fired:" in line]
        assert fired == [f"fired: {rule}"], lines
        verdict, _ = gate_lines(outcome, "time", FACTORS)
        assert "chunked L=131072 fwd* peak bytes" in "\n".join(verdict), verdict
        assert f"({rule})" in verdict[-1], verdict
        summary = gate_summary(outcome, "time", FACTORS)
        assert f"| regressed: {rule} |" in summary, summary
        reason = outcome.regressions["reason"].iloc[0]
        assert reason.startswith(rule), reason  # the cause first, the exponents after
