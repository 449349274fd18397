"""The gate's Markdown summary (``regress --summary FILE`` and ``$GITHUB_STEP_SUMMARY``): regressions first, then
undecided, then improvements beyond the factor, each with its ratio and metric, and one line on what decided."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from attnbench.gate import Outcome, compare
from attnbench.gate.markdown import gate_summary, write_summary

FACTORS = {"time": 1.2, "memory": 1.1, "instructions": 1.002}
BENCHMARKS = {
    "instructions": "bench_attention.Instructions.track_instructions",
    "time": "bench_attention.Attention.time_attention",
    "peak_tensor_bytes": "bench_attention.AttentionMetrics.track_peak_tensor_bytes",
}


def _row(metric, variant, length, base, head, verdict, reason="", improved=False):
    return {
        "benchmark": BENCHMARKS[metric],
        "metric": metric,
        "variant": variant,
        "seq_len": length,
        "seq_len_k": length,
        "device": "cpu",
        "mode": "forward",
        "mask": "none",
        "base_value": base,
        "head_value": head,
        "ratio": head / base if base and head else math.nan,
        "verdict": verdict,
        "reason": reason,
        "note": "",
        "improved": improved,
    }


def _outcome(rows) -> Outcome:
    table = pd.DataFrame(rows)
    return Outcome(
        table=table,
        regressions=table[table["verdict"].isin(["regressed", "wrong"])],
        undecided=table[table["verdict"] == "undecided"],
        base="a" * 40,
        head="b" * 40,
        results_dir=Path("."),
    )


PLANTED_2X = [
    _row(
        "instructions",
        "batched",
        256,
        1.18e8,
        2.36e8,
        "regressed",
        "counts x2.0000 (beyond x1.002)",
    ),
    _row(
        "instructions", "batched", 512, 4.4e8, 8.8e8, "regressed", "counts x2.0000 (beyond x1.002)"
    ),
    _row(
        "time",
        "batched",
        1024,
        0.060,
        0.118,
        "regressed",
        "speed-corrected x1.97 [1.85, 2.1] beyond x1.26, p=2e-05",
    ),
    _row(
        "time",
        "chunked",
        1024,
        0.12,
        0.16,
        "undecided",
        "noisy: HEAD: 4 of 10 samples waited for a core",
    ),
    _row("peak_tensor_bytes", "chunked", 256, 3.7e6, 1.8e6, "ok", improved=True),
    _row("instructions", "chunked", 256, 8.45e7, 8.45e7, "ok", "counts x1.0000 (within x1.002)"),
    _row("time", "chunked", 256, math.nan, math.nan, "not timed", "counts decide this length"),
]


def test_sections_come_in_order_with_ratios_and_metrics():
    text = gate_summary(_outcome(PLANTED_2X), "both", FACTORS, elapsed_s=241)
    lines = text.splitlines()
    assert lines[0] == "### attnbench regress: FAIL: 3 regression(s)"
    order = [lines.index(h) for h in ("**Regressed (3)**", "**Improved beyond the factor (1)**")]
    undecided = next(i for i, line in enumerate(lines) if line.startswith("**Undecided (1)**"))
    assert order[0] < undecided < order[1]
    regressed = lines[
        order[0] + 4 : order[0] + 7
    ]  # after the heading, a blank line, the table's head and rule
    assert [r.split(" | ")[0] for r in regressed] == [
        "| batched L=256",
        "| batched L=512",
        "| batched L=1024",
    ], regressed
    assert "| batched L=256 | instructions | 118,000,000 | 236,000,000 | x2.0000 |" in text
    assert "| batched L=1024 | time | 60 ms | 118 ms | x1.97 |" in text
    assert "| chunked L=256 | peak_tensor_bytes | 3.7 MB | 1.8 MB | x0.49 |" in text
    assert "1 other result(s) within their factors." in text  # the not-timed row is not a result
    decided = next(line for line in lines if line.startswith("**What decided:**"))
    assert (
        "instruction counts (x1.002, 3 cases)" in decided
        and "peak tensor bytes (x1.1, 1 case)" in decided
    )
    assert (
        "time where it could decide (x1.2 allowance, 2 cases)" in decided
        and "1 case not timed" in decided
    )
    assert lines[-1] == "Measured in 241 s."


def test_a_pass_says_so():
    text = gate_summary(_outcome([PLANTED_2X[5]]), "instructions", FACTORS)
    assert (
        text.startswith("### attnbench regress: PASS") and "Every case within its factor." in text
    )
    assert "time shown beside them, not deciding" in text


def test_an_improvement_is_the_gate_rule_reversed():
    """compare marks ``improved``: counts below 1 / factor, and time the gate would call regressed with the sides
    swapped (planted: HEAD 1.5x faster, and HEAD unchanged)."""
    rng = np.random.default_rng(0)
    key = ("batched", 256, "cpu", "forward", "none")
    base = list(np.exp(rng.normal(0, 0.05, 20)))
    rows = [
        {
            "benchmark": "b",
            "variant": "batched",
            "seq_len": 256,
            "device": "cpu",
            "mode": "forward",
            "mask": "none",
            "spread": math.nan,
            "ci_low": math.nan,
            "ci_high": math.nan,
            "commit": c,
            "metric": m,
            "value": v,
            "status": "ok",
        }
        for c, m, v in (
            ("A", "time", 1.0),
            ("B", "time", 0.66),
            ("A", "instructions", 1e8),
            ("B", "instructions", 0.99e8),
        )
    ]
    frame = pd.DataFrame(rows)
    faster = compare(
        frame,
        "A",
        "B",
        samples={("A", *key): base, ("B", *key): [x / 1.5 for x in base]},
        metric="both",
    )
    assert faster.set_index("metric")["improved"].to_dict() == {"time": True, "instructions": True}
    same = compare(
        frame,
        "A",
        "B",
        samples={("A", *key): base, ("B", *key): list(np.exp(rng.normal(0, 0.05, 20)))},
    )
    assert not same.set_index("metric").loc["time", "improved"]


def test_the_summary_goes_to_the_file_and_the_step_summary(tmp_path, monkeypatch):
    step = tmp_path / "step.md"
    step.write_text("earlier step\n")
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(step))
    written = write_summary("### hello\n", tmp_path / "out" / "summary.md")
    assert written == [tmp_path / "out" / "summary.md", step]
    assert (tmp_path / "out" / "summary.md").read_text() == "### hello\n"
    assert (
        step.read_text() == "earlier step\n### hello\n\n"
    )  # appended: every step of a job writes there


@pytest.mark.parametrize(
    ("verdicts", "first"), [(["regressed"], "FAIL"), (["undecided"], "UNDECIDED"), (["ok"], "PASS")]
)
def test_the_cli_writes_the_summary(monkeypatch, tmp_path, verdicts, first):
    import attnbench.gate
    from attnbench.cli import main

    rows = [
        _row("time", "batched", 256, 1.0, 2.0 if v == "regressed" else 1.0, v) for v in verdicts
    ]
    monkeypatch.setattr(attnbench.gate, "regress", lambda *a, **k: _outcome(rows))
    summary = tmp_path / "s.md"
    main(["regress", "HEAD~1", "--summary", str(summary)])
    assert summary.read_text().startswith(f"### attnbench regress: {first}")
