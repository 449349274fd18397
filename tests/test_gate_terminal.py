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

from attnbench.contract import Basis, GateVerdict
from attnbench.gate import Outcome, compare
from attnbench.gate.markdown import gate_summary
from attnbench.gate_table import SPEED_CORRECTED, gate_lines, growth_lines

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


def test_the_footer_explains_only_what_the_table_holds():
    """A newcomer read the legend "(* predicted at the target length ...)" under a table with no
    starred row, a "not timed ... n/a" row with no reason, and "FLOPs x1.00" beside a variant doing
    its work twice (the count is the variant's declared model). The legend shows only under a
    predicted row, a not-timed row's reason is printed, and FLOPs say they are the model's."""
    from attnbench.gate.decision import mark_not_timed

    series = {
        ("A", "batched", "flops"): [2.0e6 * n**2 for n in LENGTHS],
        ("B", "batched", "flops"): [2.0e6 * n**2 for n in LENGTHS],
        ("A", "batched", "time"): [math.nan, math.nan, 4.9e-2],  # timed at the longest only
        ("B", "batched", "time"): [math.nan, math.nan, 4.9e-2],
    }
    frame = _frame(series)
    frame.loc[frame["value"].isna(), "status"] = "n/a"  # as asv records a case it skipped
    table = mark_not_timed(compare(frame, "A", "B"), LENGTHS[-1])
    assert (table["basis"] == Basis.PREDICTED).any()  # FLOPs grow along L: a predicted row
    text = "\n".join(gate_lines(_outcome(table), "time", FACTORS)[0])
    assert "(* predicted at the target length" in text, text
    table = table[table["basis"] != Basis.PREDICTED]  # as on 2 lengths: nothing predicted
    text = "\n".join(gate_lines(_outcome(table), "time", FACTORS)[0])
    assert "(* predicted" not in text, text
    assert re.search(
        r"^ *not timed: counts decide this length; time is taken at L=1024 only", text, re.M
    )
    assert re.search(r"^ok +model FLOPs +batched L=256", text, re.M), text
    # a time ratio that is not the times' own says why, once, under the table
    assert SPEED_CORRECTED not in text, text
    timed = (table["metric"] == "time") & (table["verdict"] != GateVerdict.NOT_TIMED)
    table.loc[timed, "reason"] = "speed-corrected x1.00 [0.97, 1.03]; as measured x0.73"
    text = "\n".join(gate_lines(_outcome(table), "time", FACTORS)[0])
    assert text.count(SPEED_CORRECTED.split(":")[0]) == 1, text


VENV = "virtualenv-py3.11-build-matplotlib3.11.2-numpy2.4.6-pandas3.1.1-psutil7.2.2-scipy1.17.1-seaborn0.13.2"
"""asv's environment name as the fresh-clone run saw it."""
TIME = "bench_attention.Attention.time_attention"
TIME_ROUNDS = [
    # (seconds into the step, what asv wrote then): the gate's time rounds of BASE and HEAD, two
    # rounds, one benchmark whose every case runs in one asv item for minutes
    (0.4, "· Discovering benchmarks\n"),
    (9.0, "· Running 2 total benchmarks (2 commits * 1 environments * 1 benchmarks)\n"),
    (9.1, "[ 0.00%] · For attnbench commit 1a2b3c4d <main> (round 1/2):\n"),
    (9.2, f"[ 0.00%] ·· Building for {VENV}\n"),
    (16.0, f"[ 0.00%] ·· Benchmarking {VENV}\n"),
    (17.0, f"[25.00%] ··· Running ({TIME}--)"),
    (404.0, ".\n[25.00%] · For attnbench commit 5e6f7a8b (round 1/2):\n"),
    (404.1, f"[25.00%] ·· Building for {VENV}\n"),
    (411.0, f"[25.00%] ·· Benchmarking {VENV}\n"),
    (412.0, f"[50.00%] ··· Running ({TIME}--)"),
    (790.0, ".\n[50.00%] · For attnbench commit 5e6f7a8b (round 2/2):\n"),
    (790.1, f"[50.00%] ·· Benchmarking {VENV}\n"),
    (791.0, f"[75.00%] ··· {TIME}"),
    (1170.0, "                ok\n[75.00%] ··· ======== ====\n  variant   L  \n"),
]
COUNTS = [
    # the instruction counts of one commit: a setup_cache of ten minutes (one valgrind process)
    (0.2, "· Running 8 total benchmarks (1 commits * 1 environments * 8 benchmarks)\n"),
    (0.3, "[ 0.00%] · For attnbench commit 5e6f7a8b <slow>:\n"),
    (1.0, f"[ 0.00%] ·· Benchmarking {VENV}\n"),
    (2.0, "[12.50%] ··· Setting up bench_attention:840"),
    (620.0, "                       ok\n"),
    (620.1, "[12.50%] ··· bench_attention.Instructions.track_instructions       ok\n"),
    (621.0, "[25.00%] ··· bench_attention.AttentionMetrics.track_flops"),
]


def _heard(
    chunks: list[tuple[float, str]],
    end: float,
    samples: list[tuple[float, dict]] = (),
    cases: dict | None = None,
) -> list[tuple[float, str]]:
    """What the gate says of ``chunks`` as its loop does: a tick a second, asv's output fed as it
    came, the time benchmark's ``samples`` (the probe log's lines) among ``cases``
    (``parameter_sets``) noted, the due line told (a fake clock: no process, no waiting)."""
    from attnbench.gate.progress import AsvProgress

    tracker, heard = AsvProgress(0.0, cases=cases or {}), []
    pending, logged = list(chunks), list(samples)
    now = 0.0
    while now <= end:
        while pending and pending[0][0] <= now:
            at, text = pending.pop(0)
            tracker.feed(text, at)
        while logged and logged[0][0] <= now:
            tracker.note_sample(logged.pop(0)[1])
        if line := tracker.due(now):
            heard.append((now, line))
        now += 1.0
    return heard


def _moves_every_30_s(heard: list[tuple[float, str]]) -> str:
    """What was heard, one line each; AssertionError where it stood still 30 s or more."""
    said = "\n".join(f"{t:6.0f} {line}" for t, line in heard)
    times = [0.0] + [t for t, _ in heard]
    assert max(b - a for a, b in zip(times, times[1:], strict=False)) <= 30, said
    lines = [line for _, line in heard]
    assert all(a != b for a, b in zip(lines, lines[1:], strict=False)), said
    assert "0%" not in said and "Benchmarking" not in said, said  # what the fresh-clone run saw
    return said


def test_progress_names_the_commit_the_benchmark_and_item_and_moves_every_30_s():
    heard = _heard(TIME_ROUNDS, 1180.0)
    said = _moves_every_30_s(heard)
    # minutes into BASE's first round: the commit, the round, the benchmark, item 1 of 4
    during = [line for t, line in heard if 60 < t < 400]
    assert during and all(
        line.startswith(f"asv item 1 of 4: commit 1a2b3c4d, round 1 of 2, {TIME}, ")
        for line in during
    ), said
    lines = [line for _, line in heard]
    assert any(f"item 2 of 4: commit 5e6f7a8b, round 1 of 2, {TIME}" in line for line in lines)
    assert any(f"item 3 of 4: commit 5e6f7a8b, round 2 of 2, {TIME}" in line for line in lines)


def test_a_long_setup_cache_is_named_and_its_seconds_count():
    heard = _heard(COUNTS, 630.0)
    said = _moves_every_30_s(heard)
    setup = [line for t, line in heard if 30 < t < 620]
    assert setup and all(
        line.startswith("asv item 1 of 8: commit 5e6f7a8b, setup_cache of bench_attention:840, ")
        for line in setup
    ), said
    # a new item is told at once (within the 5 s gap), not at the next heartbeat
    assert any(
        621 <= t <= 626 and "item 2 of 8" in line and "track_flops" in line for t, line in heard
    ), said


def test_rounds_asv_does_not_name_are_counted_from_its_percentages():
    """``asv run --attribute rounds=2`` without interleaving (a bisection's time probe): asv counts
    3 benchmarks twice and never says so; its 16.67% is item 1 of 6, not "item 0 or 1 of 3"."""
    from attnbench.gate.progress import AsvProgress

    tracker = AsvProgress(0.0)
    tracker.feed("· Running 3 total benchmarks (1 commits * 1 environments * 3 benchmarks)\n", 1.0)
    tracker.feed("[ 0.00%] ·· Benchmarking existing-py_work_main_.venv_bin_python\n", 1.0)
    tracker.feed("[16.67%] ··· Setting up bench_a:5", 1.0)
    assert tracker.line(9.0).startswith("asv item 1 of 6: setup_cache of bench_a:5, 8 s in")
    tracker.feed("  ok\n[66.67%] ··· bench_a.Attention.time_attention", 10.0)
    assert tracker.line(12.0).startswith("asv item 4 of 6: bench_a.Attention.time_attention, 2 s")


BENCHMARKS_JSON = {
    TIME: {
        "params": [
            ["'batched'", "'chunked'", "'sdpa'", "'mine'"],
            ["256", "512", "1024"],
            ["'cpu'"],
            ["'forward'"],
            ["'none'"],
        ],
        "param_names": ["variant", "seq_len", "device", "mode", "mask"],
    },
    "bench_attention.track_x": {"params": [], "param_names": []},
    "version": 2,
}
"""asv's ``benchmarks.json`` of a small main grid: four variants at three lengths."""


def _sample(commit: str, variant: str) -> dict:
    """A line of the gate's probe log (asv_bench.timed_teardown)."""
    return {
        "commit": commit + "0" * 32,
        "variant": variant,
        "seq_len": 1024,
        "device": "cpu",
        "mode": "forward",
        "mask": "none",
        "probe_s": 0.01,
        "sample_s": 0.2,
        "runqueue_share": 0.0,
    }


def test_progress_names_the_case_i_of_n_of_the_time_benchmark():
    """The time rounds at the longest length only (counts decide the rest): four cases; the probe
    log says which one runs, asv does not (one asv item for all of them)."""
    from attnbench import contract
    from attnbench.gate.progress import parameter_sets
    from attnbench.gate.session import time_selection

    pattern, _ = time_selection({contract.ENV_LENGTHS: "256,512,1024"})
    cases = parameter_sets(BENCHMARKS_JSON, pattern)
    assert cases[TIME][1] == [
        (f"'{v}'", "1024", "'cpu'", "'forward'", "'none'")
        for v in ("batched", "chunked", "sdpa", "mine")
    ]
    order = ["batched"] * 9 + ["chunked"] * 9 + ["sdpa"] * 9 + ["mine"] * 9
    samples = [(20.0 + 10 * k, _sample("1a2b3c4d", v)) for k, v in enumerate(order)]
    samples.insert(12, (130.5, _sample("ffffffff", "sdpa")))  # another commit's: not this item's
    heard = _heard(TIME_ROUNDS, 420.0, samples, cases)
    said = _moves_every_30_s(heard)
    start = f"asv item 1 of 4: commit 1a2b3c4d, round 1 of 2, {TIME}, case 2 of 4 (chunked L=1024 fwd), "
    assert any(t > 110 and line.startswith(start) for t, line in heard), said
    assert any("case 4 of 4 (mine L=1024 fwd)" in line for _, line in heard), said
    # the next item (HEAD's round) starts without BASE's last case
    assert all("case" not in line for t, line in heard if t > 404), said


def test_the_case_watch_reads_the_probe_log_as_it_grows(tmp_path):
    """The session's watch: asv's benchmarks.json and the probe log's newest whole line; a line
    still being written waits for its end, and the log's earlier calls are not this one's."""
    import json

    from attnbench.gate.progress import AsvProgress
    from attnbench.gate.session import _CaseWatch

    (tmp_path / "benchmarks.json").write_text(json.dumps(BENCHMARKS_JSON))
    log = tmp_path / "probes.jsonl"
    log.write_text(json.dumps(_sample("1a2b3c4d", "sdpa")) + "\n")  # an earlier call's
    tracker = AsvProgress(0.0)
    tracker.feed("· Running 2 total benchmarks (2 commits * 1 environments * 1 benchmarks)\n", 0.0)
    tracker.feed("[ 0.00%] · For attnbench commit 1a2b3c4d (round 1/2):\n", 0.0)
    tracker.feed(f"[25.00%] ··· Running ({TIME}--)", 1.0)
    watch = _CaseWatch(log, tmp_path / "benchmarks.json", None)
    watch(tracker)
    assert "case" not in tracker.line(5.0), tracker.line(5.0)
    with open(log, "a") as out:
        out.write(json.dumps(_sample("1a2b3c4d", "chunked")) + "\n")
        out.write(json.dumps(_sample("1a2b3c4d", "mine"))[:40])  # being written
    watch(tracker)
    assert "case 6 of 12 (chunked L=1024 fwd)" in tracker.line(6.0), tracker.line(6.0)
    with open(log, "a") as out:
        out.write(json.dumps(_sample("1a2b3c4d", "mine"))[40:] + "\n")
    watch(tracker)
    assert "case 12 of 12 (mine L=1024 fwd)" in tracker.line(7.0), tracker.line(7.0)
