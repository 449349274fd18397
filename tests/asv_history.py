"""Synthetic asv results directories: a history of commits written in asv's own result format, without running asv.

``write_history(root, series, commits)`` writes ``root/benchmarks.json`` and one result file per commit for machine
``box``: ``series`` maps ``(metric, variant, seq_len)`` to one value per commit (None: not measured, "wrong": the
case failed the correctness gate). The files load through :func:`attnbench.analysis.frame.load_asv` like real ones.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from pathlib import Path

BENCHMARKS = {
    "time": "bench_attention.Attention.time_attention",
    "instructions": "bench_attention.Instructions.track_instructions",
    "peak_tensor_bytes": "bench_attention.AttentionMetrics.track_peak_tensor_bytes",
    "flops": "bench_attention.AttentionMetrics.track_flops",
    "error_ratio": "bench_attention.AttentionAccuracy.track_error_ratio",
}
COLUMNS = [
    "result",
    "params",
    "version",
    "started_at",
    "duration",
    "stats_ci_99_a",
    "stats_ci_99_b",
    "stats_q_25",
    "stats_q_75",
    "stats_number",
    "stats_repeat",
    "samples",
    "profile",
]
VERSION = "0" * 64
MACHINE = "box"
T0 = 1_790_000_000_000  # ms: the first commit's date


def commit_hashes(n: int) -> list[str]:
    """``n`` distinct fake 40-hex hashes (distinct in their first 8 characters, as asv names files), oldest first."""
    return [f"{i:08x}" + "a" * 32 for i in range(1, n + 1)]


def write_history(
    root: Path,
    series: dict[tuple[str, str, int], Sequence],
    commits: Sequence[str],
    spread: float = 0.02,
) -> Path:
    """An asv results directory at ``root`` holding ``series`` over ``commits`` (oldest first, an hour apart)."""
    root.mkdir(parents=True, exist_ok=True)
    metrics = sorted({m for m, _, _ in series})
    if any(s == "wrong" for values in series.values() for s in values):
        metrics = sorted({*metrics, "error_ratio"})
    variants = sorted({v for _, v, _ in series})
    lengths = sorted({n for _, _, n in series})
    params = [
        [repr(v) for v in variants],
        [str(n) for n in lengths],
        ["'cpu'"],
        ["'forward'"],
        ["'none'"],
    ]
    names = ["variant", "seq_len", "device", "mode", "mask"]
    benchmarks = {"version": 2}
    for metric in metrics:
        name = BENCHMARKS[metric]
        benchmarks[name] = {
            "name": name,
            "params": params,
            "param_names": names,
            "type": "time" if metric == "time" else "track",
            "unit": "seconds" if metric == "time" else "unit",
            "version": VERSION,
            "timeout": 180,
        }
    (root / "benchmarks.json").write_text(json.dumps(benchmarks))
    machine_dir = root / MACHINE
    machine_dir.mkdir(exist_ok=True)
    (machine_dir / "machine.json").write_text(json.dumps({"machine": MACHINE, "version": 1}))
    combos = list(itertools.product(variants, lengths))
    for i, commit in enumerate(commits):
        results = {}
        for metric in metrics:
            values, low, high, q25, q75 = [], [], [], [], []
            for variant, length in combos:
                if metric == "error_ratio":
                    wrong = any(
                        series.get((m, variant, length), [None] * len(commits))[i] == "wrong"
                        for m in metrics
                    )
                    value = 2.0 if wrong else 0.1
                else:
                    value = series.get((metric, variant, length), [None] * len(commits))[i]
                    value = None if value == "wrong" else value
                ok = value is not None and not (isinstance(value, float) and math.isnan(value))
                values.append(float(value) if ok else None)
                width = spread * value if ok and metric == "time" else None
                low.append(value - width if width else None)
                high.append(value + width if width else None)
                q25.append(value - width / 2 if width else None)
                q75.append(value + width / 2 if width else None)
            results[BENCHMARKS[metric]] = [
                values,
                params,
                VERSION,
                T0 + i * 3_600_000 + 60_000,
                1.0,
                low,
                high,
                q25,
                q75,
                None,
                None,
                None,
                None,
            ]
        data = {
            "commit_hash": commit,
            "env_name": "env",
            "date": T0 + i * 3_600_000,
            "params": {"machine": MACHINE, "python": "3.11"},
            "python": "3.11",
            "requirements": {},
            "env_vars": {},
            "result_columns": COLUMNS,
            "results": results,
            "durations": {},
            "version": 2,
        }
        (machine_dir / f"{commit[:8]}-env.json").write_text(json.dumps(data))
    return root
