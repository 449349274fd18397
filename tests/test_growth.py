"""How cost grows: the gate's fitted exponents and predicted ratios on scripted BASE/HEAD rows.

No asv: the rows are what the gate reads from asv's results (``compare``'s frame), so the decision
itself is tested here; tests/test_regress.py plants the same buffer as a commit.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attnbench.analysis import growth
from attnbench.contract import Basis, GateVerdict
from attnbench.gate import Outcome, compare
from attnbench.gate.markdown import gate_summary

LENGTHS = (256, 512, 1024)
"""The CI grid's lengths (contract.GRIDS["ci"])."""


def chunked_bytes(length: int, planted: bool = False) -> float:
    """Peak tensor bytes of chunked's forward at B=1, H=8, D=64, float32, chunks of 128 queries:
    q, k, v and the output (4 x 8·L·64·4 bytes) and one chunk's scores (8·128·L·4), plus a fixed
    64 kB; ``planted``: a boolean L x L mask beside them (L² bytes)."""
    return 4 * 8 * length * 64 * 4 + 8 * 128 * length * 4 + 65536 + (length**2 if planted else 0)


def counts(length: int) -> float:
    """Instruction counts of a dense variant: an L² term with an L term beneath it."""
    return 3.0e3 * length**2 + 1.0e6 * length + 2.0e7


def _frame(series: dict[tuple[str, str, str], list[float]]) -> pd.DataFrame:
    """Rows as asv's results give them: ``series[(commit, variant, metric)]`` at :data:`LENGTHS`."""
    rows = []
    for (commit, variant, metric), values in series.items():
        for length, value in zip(LENGTHS, values, strict=True):
            rows.append(
                {
                    "benchmark": "bench_attention.AttentionMetrics.track",
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
            )
    return pd.DataFrame(rows)


def _predicted(table: pd.DataFrame, variant: str, metric: str) -> dict:
    rows = table[
        (table["basis"] == Basis.PREDICTED)
        & (table["variant"] == variant)
        & (table["metric"] == metric)
    ]
    assert len(rows) == 1, table.to_string()
    return rows.iloc[0].to_dict()


def test_a_planted_square_buffer_within_the_factor_at_1024_is_a_regression():
    """A boolean L x L mask in chunked's forward: x1.08 of peak bytes at L=1024 (within x1.1, every
    measured row ok), x11.7 at L=131072 (the cost splits say so): the predicted row regresses."""
    base = [chunked_bytes(n) for n in LENGTHS]
    head = [chunked_bytes(n, planted=True) for n in LENGTHS]
    table = compare(
        _frame(
            {
                ("A", "chunked", "peak_tensor_bytes"): base,
                ("B", "chunked", "peak_tensor_bytes"): head,
            }
        ),
        "A",
        "B",
    )
    measured = table[table["basis"] == Basis.MEASURED]
    assert (measured["verdict"] == GateVerdict.OK).all(), measured.to_string()
    assert measured["ratio"].max() == pytest.approx(1 + 1024**2 / chunked_bytes(1024))
    row = _predicted(table, "chunked", "peak_tensor_bytes")
    truth = chunked_bytes(131072, planted=True) / chunked_bytes(131072)
    assert row["verdict"] == GateVerdict.REGRESSED and row["seq_len"] == 131072
    assert row["ratio"] == pytest.approx(truth, rel=1e-6)  # exact values: the split is exact
    # the rules that fired lead, the exponents follow as the figures behind them
    assert row["reason"].startswith("predicted x11.67 at L=131072 beyond x1.1"), row["reason"]
    assert "(L^0.99 -> L^1.03;" in row["reason"]
    assert row["rule"] == "predicted x11.67 at L=131072 and exponent +0.04", row["rule"]
    assert "measured x1.08 at L=1024" in row["reason"]
    # the measured rows carry their series' exponents and prediction beside their own ratio
    assert (measured["predicted_ratio"] == row["ratio"]).all()
    assert (measured["head_exponent"] > measured["base_exponent"]).all()
    # --at-length: nearer the measured lengths the same buffer costs less than the factor
    near = compare(
        _frame(
            {
                ("A", "chunked", "peak_tensor_bytes"): base,
                ("B", "chunked", "peak_tensor_bytes"): head,
            }
        ),
        "A",
        "B",
        at_length=1024,
    )
    assert _predicted(near, "chunked", "peak_tensor_bytes")["ratio"] == pytest.approx(
        measured["ratio"].max()
    )


def test_an_unchanged_case_reports_no_exponent_change():
    values = {
        "peak_tensor_bytes": [chunked_bytes(n) for n in LENGTHS],
        "instructions": [counts(n) for n in LENGTHS],
        "flops": [4.0 * 8 * 64 * n**2 for n in LENGTHS],
    }
    series = {(c, "chunked", m): v for c in ("A", "B") for m, v in values.items()}
    table = compare(_frame(series), "A", "B")
    predicted = table[table["basis"] == Basis.PREDICTED]
    assert len(predicted) == 3 and (predicted["verdict"] == GateVerdict.OK).all()
    assert (predicted["head_exponent"] == predicted["base_exponent"]).all()
    assert (predicted["ratio"] == 1.0).all()
    outcome = _outcome(table)
    summary = gate_summary(
        outcome, "instructions", {"time": 1.2, "memory": 1.1, "instructions": 1.002}
    )
    assert "no exponent change" in summary and "FAIL" not in summary


def _outcome(table: pd.DataFrame) -> Outcome:
    from pathlib import Path

    return Outcome(
        table=table,
        regressions=table[table["verdict"].isin([GateVerdict.REGRESSED, GateVerdict.WRONG])],
        undecided=table[table["verdict"] == GateVerdict.UNDECIDED],
        base="a" * 40,
        head="b" * 40,
        results_dir=Path("."),
    )


def test_the_summary_and_the_table_show_measured_and_predicted_ratios_with_exponents(capsys):
    series = {
        ("A", "chunked", "peak_tensor_bytes"): [chunked_bytes(n) for n in LENGTHS],
        ("B", "chunked", "peak_tensor_bytes"): [chunked_bytes(n, True) for n in LENGTHS],
    }
    outcome = _outcome(compare(_frame(series), "A", "B"))
    summary = gate_summary(outcome, "time", {"time": 1.2, "memory": 1.1, "instructions": 1.002})
    assert "FAIL: 1 regression(s)" in summary
    assert "| chunked L=131072 (predicted) | peak_tensor_bytes |" in summary
    assert (
        "| chunked | peak_tensor_bytes | L^0.99 -> L^1.03 | x1.08 at L=1024 | x11.67 at L=131072 "
        "| regressed: predicted x11.67 at L=131072 and exponent +0.04 |"
    ) in summary
    assert "peak tensor bytes (x1.1, 3 cases)" in summary  # a fitted series is not a case
    assert "how cost grows (1 series fitted along L" in summary
    from attnbench.gate_table import gate_cells, growth_lines

    predicted = outcome.table[outcome.table["basis"] == Basis.PREDICTED].iloc[0].to_dict()
    assert gate_cells(predicted)["case"] == "chunked L=131072 fwd*"

    lines = growth_lines(outcome.table)
    assert "ratio measured at L=1024 -> predicted at L=131072" in lines[1], lines
    assert "regressed  chunked fwd peak bytes  L^0.99 -> L^1.03  x1.08 -> x11.67" in lines[2]
    assert lines[3].strip() == "fired: predicted x11.67 at L=131072 and exponent +0.04", lines
    assert all(len(line) <= 100 for line in lines)


def test_the_exponent_rule_alone_and_what_it_forgives():
    """Exponent growth beyond the threshold regresses even where the predicted ratio is within the
    factor (a factor of 100 here); an exponent that rises because a constant cost went away does
    not (HEAD costs less at the target)."""
    lengths = np.array(LENGTHS, float)
    base = growth.fit_side(lengths, [chunked_bytes(n) for n in LENGTHS])
    head = growth.fit_side(lengths, [chunked_bytes(n, True) for n in LENGTHS])
    judged = growth.judge(base, head, metric="peak_tensor_bytes", factor=100.0, at_length=131072)
    assert judged.predicted_ratio < 100 and judged.verdict == GateVerdict.REGRESSED
    assert "exponent +0.04 beyond +0.02" in judged.reason
    heavy = growth.fit_side(lengths, 3e6 + 12288 * lengths)  # a fixed 3 MB buffer
    light = growth.fit_side(lengths, 12288 * lengths)  # ... gone: the exponent rises to 1
    shed = growth.judge(heavy, light, metric="peak_tensor_bytes", factor=1.1, at_length=131072)
    assert light.exponent - heavy.exponent > growth.EXPONENT_THRESHOLD
    assert shed.verdict == GateVerdict.OK and shed.predicted_ratio < 1
    with pytest.raises(ValueError, match="at_length"):
        growth.judge(base, head, metric="flops", factor=1.1, at_length=0)
    with pytest.raises(ValueError, match="at_length"):
        compare(_frame({}).reindex(columns=["commit", "metric"]), "A", "B", at_length=-5)


def test_fewer_than_three_lengths_predict_nothing():
    series = {
        ("A", "chunked", "peak_tensor_bytes"): [chunked_bytes(n) for n in LENGTHS],
        ("B", "chunked", "peak_tensor_bytes"): [chunked_bytes(n, True) for n in LENGTHS],
    }
    frame = _frame(series)
    frame = frame[frame["seq_len"] != 512]
    table = compare(frame, "A", "B")
    assert not (table["basis"] == Basis.PREDICTED).any()


NOISE_BOUND = growth.NOISE["instructions"]
"""The README's largest A/A difference of one count: the same case counted twice, 0.03%."""


@settings(max_examples=25, deadline=None, derandomize=True)
@given(
    noise=st.lists(
        st.floats(-NOISE_BOUND, NOISE_BOUND), min_size=2 * len(LENGTHS), max_size=2 * len(LENGTHS)
    ),
    shape=st.sampled_from(["dense", "linear", "mixed"]),
)
def test_the_a_a_spread_of_exponents_is_far_below_the_threshold(noise, shape):
    """The same commit gated twice: counts off by up to the README's A/A spread on either side.

    The exponents move by at most ``NOISE / ln 2`` per side (9e-4 between them), a twentieth of the
    threshold, and the predicted ratio never regresses: the noise, extrapolated 128x, would."""
    law = {
        "dense": counts,
        "linear": lambda n: 5.0e5 * n + 3.0e7,  # linear_elu: no L² term to extrapolate
        "mixed": lambda n: 40.0 * n**2 + 2.0e6 * n + 1.0e7,
    }[shape]
    truth = [law(n) for n in LENGTHS]
    k = len(LENGTHS)
    base = [v * (1 + e) for v, e in zip(truth, noise[:k], strict=True)]
    head = [v * (1 + e) for v, e in zip(truth, noise[k:], strict=True)]
    table = compare(
        _frame(
            {("A", "linear_elu", "instructions"): base, ("B", "linear_elu", "instructions"): head}
        ),
        "A",
        "B",
        metric="instructions",
    )
    row = _predicted(table, "linear_elu", "instructions")
    spread = abs(row["head_exponent"] - row["base_exponent"])
    assert spread <= 2 * NOISE_BOUND / math.log(2) + 1e-12
    assert spread < growth.EXPONENT_THRESHOLD / 20
    assert row["verdict"] == GateVerdict.OK, row["reason"]


@pytest.mark.parametrize("bad", ["0", "-3", "1e5", "many"])
def test_cli_bad_at_length_is_a_usage_error(bad, capsys):
    from attnbench.cli import main

    try:
        code = main(["regress", "HEAD~1", "--at-length", bad])
    except SystemExit as exc:  # argparse's own usage error
        code = exc.code
    assert code == 2 and "--at-length" in capsys.readouterr().err


def _gate_results(tmp_path, planted: bool):
    """A results directory of two commits (chunked's peak bytes at the CI lengths, HEAD with the
    planted L x L buffer or not) and the gate's verdict table beside it, as ``regress`` leaves it."""
    from attnbench.analysis.frame import load_asv
    from attnbench.gate import write_verdicts
    from tests.asv_history import commit_hashes, write_history

    base, head = commit_hashes(2)
    series = {
        ("peak_tensor_bytes", "chunked", n): [chunked_bytes(n), chunked_bytes(n, planted)]
        for n in LENGTHS
    }
    results = write_history(tmp_path / "results", series, [base, head])
    outcome = _outcome(compare(load_asv(results).frame, base, head))
    write_verdicts(
        Outcome(**{**outcome.__dict__, "base": base, "head": head, "results_dir": results})
    )
    return results


def test_the_report_draws_a_flagged_case_on_log_log_axes(tmp_path):
    from attnbench.reporting import make_report

    results = _gate_results(tmp_path, planted=True)
    page = make_report([results], tmp_path / "report").page.read_text()
    section = page.split('<section id="ci">', 1)[1].split("</section>", 1)[0]
    assert "how cost grows" in page and 'id="fig-growth_chunked_peak_tensor_bytes"' in section
    assert "L^0.99 -&gt; L^1.03" in section and "predicted x11.67 at L=131072" in section
    assert (tmp_path / "report" / "figures" / "growth_chunked_peak_tensor_bytes.png").exists()
    from attnbench.contract import GATE_VERDICTS
    from attnbench.report.html import _flagged_growth

    unchanged = _gate_results(tmp_path / "same", planted=False) / GATE_VERDICTS
    assert unchanged.exists() and _flagged_growth(unchanged) == []  # nothing drawn


def test_bisect_judges_a_probe_by_the_same_growth_rule():
    """A probe of the planted buffer is bad on its predicted ratio (the gate's rule); a probe of an
    unchanged commit with noisy counts shows its worst measured ratio, never an extrapolation."""
    from attnbench.gate.bisect import ProbeVerdict, judge_table

    series = {
        ("A", "chunked", "peak_tensor_bytes"): [chunked_bytes(n) for n in LENGTHS],
        ("B", "chunked", "peak_tensor_bytes"): [chunked_bytes(n, True) for n in LENGTHS],
    }
    bad = judge_table(compare(_frame(series), "A", "B"), "peak_tensor_bytes", "B", "", 1.0)
    assert bad.verdict == ProbeVerdict.BAD and bad.case == "chunked L=131072", bad
    noisy = [counts(n) * (1 + e) for n, e in zip(LENGTHS, (3e-4, -3e-4, 3e-4), strict=True)]
    table = compare(
        _frame(
            {
                ("A", "linear_elu", "instructions"): [counts(n) for n in LENGTHS],
                ("B", "linear_elu", "instructions"): noisy,
            }
        ),
        "A",
        "B",
        metric="instructions",
    )
    good = judge_table(table, "instructions", "B", "", 1.0)
    assert good.verdict == ProbeVerdict.GOOD and good.case == "linear_elu L=256", good


def test_removing_the_square_buffer_is_an_improvement_at_the_target():
    series = {
        ("A", "chunked", "peak_tensor_bytes"): [chunked_bytes(n, True) for n in LENGTHS],
        ("B", "chunked", "peak_tensor_bytes"): [chunked_bytes(n) for n in LENGTHS],
    }
    outcome = _outcome(compare(_frame(series), "A", "B"))
    row = _predicted(outcome.table, "chunked", "peak_tensor_bytes")
    assert row["verdict"] == GateVerdict.OK and row["improved"], row
    from attnbench.gate_table import growth_lines

    assert (
        "improved   chunked fwd peak bytes  L^1.03 -> L^0.99  x0.92 -> x0.09"
        in (growth_lines(outcome.table)[2])
    )
    summary = gate_summary(outcome, "time", {"time": 1.2, "memory": 1.1, "instructions": 1.002})
    assert "| chunked L=131072 (predicted) | peak_tensor_bytes |" in summary.split("Improved")[1]


def test_a_halved_square_term_is_listed_as_grown_less_though_its_exponent_stays():
    series = {
        ("A", "batched", "peak_tensor_bytes"): [40.0 * n**2 for n in LENGTHS],
        ("B", "batched", "peak_tensor_bytes"): [20.0 * n**2 for n in LENGTHS],
    }
    table = compare(_frame(series), "A", "B")
    from attnbench.gate_table import growth_lines

    lines = growth_lines(table)
    assert "improved   batched fwd peak bytes  L^2.00 -> L^2.00  x0.50 -> x0.50" in lines[2]
