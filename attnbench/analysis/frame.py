"""One tidy DataFrame from asv results and ``attnbench run`` directories.

Every loader returns :data:`COLUMNS`, in that order: one row per case and metric (the README's
"Reading the numbers" describes each column). Loading never stops at a bad input and never turns one
into numbers: every file that cannot be used and every row that is rejected is named with the reason
in the ``problems`` of the :class:`~attnbench.analysis.tidy.Read` it returns, and the rest still
loads. A run's manifest and its rows are cross-checked (``cases`` = rows written); a run stopped on
purpose (``complete: false``) is listed in its ``notes`` as incomplete, not as corrupt. A row
missing a required value (its case's identity, its status, an ok case's time) is rejected, never
kept as an ok row holding 0 or NaN. asv results of another suite version (their benchmark
``version`` differs from ``benchmarks.json``) are left out and counted by benchmark; every row of
an asv case whose ``error_ratio`` is above 1 becomes ``wrong``. :func:`load`'s ``sources`` has one
entry per source: its path, kind and rows loaded.
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench import contract
from attnbench.analysis.rundir import load_run
from attnbench.analysis.tidy import Read, check_value, finish, spec_columns
from attnbench.contract import Method, Source, Status
from attnbench.io import error_line
from attnbench.spec import AttnSpec

__all__ = [
    "ASV_METRICS",
    "BASE_SPEC",
    "PEAK_BENCHMARK",
    "SPIKE_FACTOR",
    "decode_param",
    "flag_spikes",
    "load",
    "load_asv",
    "UNITS",
]

UNITS = contract.UNITS
ASV_METRICS = contract.ASV_METRICS
PEAK_BENCHMARK = contract.PEAK_BENCHMARK
BASE_SPEC = contract.BASE_SPEC  # the asv suite's fixed shape


# ---- asv -------------------------------------------------------------------------------------
def decode_param(value: object) -> object:
    """An asv parameter as the value it names; other text as is.

    asv stores ``repr`` strings: ``"'sdpa'"``, ``"512"``.
    """
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


_ASV_UNCHECKED = (
    "asv results carry no disturbance check (no calibration probe around asv's rounds), so none "
    "of their times is marked noisy: a busy machine's timings read as ok here; compare them from "
    "quiet machines only"
)
_TIMED = {m.name for m in contract.METRICS.values() if m.timed}


def _asv_status(value: object) -> str:
    if value is None:
        return Status.FAILED
    if isinstance(value, float) and math.isnan(value):
        return Status.SKIPPED
    return Status.OK


def _asv_memory_method(variant: str, device: str) -> str:
    """What ``attnbench.asv_bench.peak_tensor_bytes`` returns for a case: the runner's own rule."""
    from attnbench.registry import get_variant, variant_names

    if device.startswith("cuda"):
        return Method.CUDA
    if variant in variant_names() and get_variant(variant).SECONDS_PER_PAIR > 0:
        return Method.MODEL  # interpreter-bound: the runner returns the prediction
    return Method.PROFILER


def load_asv(results_dir: str | Path) -> Read:
    """Every machine, commit and environment under an asv ``results`` directory, as one tidy frame.

    Unreadable files, garbled parameters and stale results are named in the returned
    :class:`~attnbench.analysis.tidy.Read`'s ``problems``.
    """
    from asv import util

    results_dir = Path(results_dir)
    bench_path = results_dir / "benchmarks.json"
    try:
        benchmarks = util.load_json(str(bench_path), api_version=2)
        if not isinstance(benchmarks, dict):
            raise ValueError(f"expected a JSON object, got {type(benchmarks).__name__}")
    except (OSError, util.UserError, ValueError, TypeError) as exc:
        return finish(
            [],
            [
                f"{bench_path}: cannot read the benchmark list ({error_line(exc)}); "
                f"no result under {results_dir} can be interpreted without it"
            ],
        )
    problems: list[str] = []
    rows: list[dict] = []
    try:
        machine_dirs = sorted(p for p in results_dir.iterdir() if p.is_dir())
    except OSError as exc:
        return finish([], [f"{results_dir}: cannot list ({error_line(exc)})"])
    files = 0
    for machine_dir in machine_dirs:
        machine_path = machine_dir / "machine.json"
        try:
            machine = json.loads(machine_path.read_text(encoding="utf-8"))
            if not isinstance(machine, dict):
                raise ValueError(f"expected a JSON object, got {type(machine).__name__}")
        except (OSError, ValueError) as exc:
            problems.append(
                f"{machine_path}: {error_line(exc)}; machine name taken from the directory, CPU "
                "unknown"
            )
            machine = {"machine": machine_dir.name}
        try:
            paths = sorted(p for p in machine_dir.glob("*.json") if p.name != "machine.json")
        except OSError as exc:
            problems.append(f"{machine_dir}: cannot list ({error_line(exc)})")
            continue
        for path in paths:
            files += 1
            rows.extend(_asv_file(path, benchmarks, machine, problems))
    if files == 0:
        problems.append(
            f"{results_dir}: no result files (asv saves none without --set-commit-hash when run "
            "with --python=same)"
        )
    notes = [f"{results_dir}: {_ASV_UNCHECKED}"] if any(r["metric"] in _TIMED for r in rows) else []
    gate = results_dir / contract.GATE_VERDICTS
    if gate.exists():
        notes += _apply_gate(rows, gate, problems)
    return finish(rows, problems, notes)


def _apply_gate(rows: list[dict], path: Path, problems: list[str]) -> list[str]:
    """Mark the time rows the regression gate could not decide as ``noisy``, with its reason.

    The rows it could not decide have the verdict ``undecided`` or ``shown``. The notes returned
    say which metrics the gate decided: its results are then read as the gate read them.
    """
    try:
        table = pd.read_csv(path, dtype={"base": str, "head": str})
        needed = {"metric", "variant", "seq_len", "mode", "mask", "verdict", "base", "head"}
        if missing := needed - set(table.columns):
            raise ValueError(f"no {', '.join(sorted(missing))} column")
    except (OSError, ValueError) as exc:
        problems.append(
            f"{path}: the regression gate's verdicts cannot be read ({error_line(exc)}); its "
            "time rows are read as asv recorded them"
        )
        return []
    table = table.fillna({"reason": "", "mask": "none", "mode": "forward"})
    commits = set(table["base"]) | set(table["head"])
    undecided = {
        (r.variant, int(r.seq_len), r.mode, r.mask): r.reason or r.verdict
        for r in table.itertuples()
        if r.metric == "time" and r.verdict not in contract.GATE_DECIDED
    }
    marked = 0
    for row in rows:
        key = (row["variant"], row["seq_len"], row["mode"], row["mask"])
        if (
            row["metric"] in _TIMED
            and row["commit"] in commits
            and key in undecided
            and row["status"] == Status.OK
        ):
            row.update(
                status=Status.NOISY,
                reason=f"the regression gate did not decide it: {undecided[key]}",
            )
            marked += 1
    decided = sorted({r.metric for r in table.itertuples() if r.verdict in contract.GATE_DECIDED})
    return [
        f"{path.parent}: results of the regression gate, which decided on "
        f"{', '.join(decided) or 'nothing'}; {marked} time row(s) it could not decide are marked "
        "noisy here (drawn hollow, never compared)"
    ]


def _asv_file(path: Path, benchmarks: dict, machine: dict, problems: list[str]) -> list[dict]:
    """Rows of one asv result file; problems appended, never raised."""
    from asv.results import Results

    try:
        res = Results.load(str(path))
        date = dt.datetime.fromtimestamp(res.date / 1e3, tz=dt.UTC) if res.date else None
        starts = [
            v for v in (res.started_at or {}).values() if isinstance(v, (int, float)) and v > 0
        ]
        run_date = dt.datetime.fromtimestamp(min(starts) / 1e3, tz=dt.UTC) if starts else None
        params = res.params if isinstance(res.params, dict) else {}
        all_keys = list(res.get_all_result_keys())
        keys = res.get_result_keys(benchmarks)  # drops stale versions
    except Exception as exc:  # noqa: BLE001
        # any unreadable file is named and skipped, the rest loads
        problems.append(f"{path}: not a readable asv result file ({error_line(exc)})")
        return []
    stale = sorted(k for k in all_keys if k not in keys)
    if stale:
        names = ", ".join(k.rsplit(".", 1)[-1] for k in stale)
        problems.append(
            f"{path}: {len(stale)} result(s) from another version of the suite left out "
            f"(benchmark version differs from benchmarks.json, or no longer there): {names}"
        )
    common = {
        "source": Source.ASV,
        "machine": str(params.get("machine", machine.get("machine", ""))),
        "cpu": str(machine.get("cpu", "")),
        "gpu": "",
        "commit": res.commit_hash or "",
        "date": date,
        "run_date": run_date,
        "torch": params.get("torch", "") or params.get("req-torch", ""),
        "threads": math.nan,
        "reason": "",
        "kernel": "",
        "checked_slices": "",
    }
    peak = math.nan
    peak_key = next((k for k in keys if k.endswith(PEAK_BENCHMARK)), None)
    if peak_key is not None:
        try:
            value = res.get_result_value(peak_key, [])
            if isinstance(value, list) and value and isinstance(value[0], (int, float)):
                peak = float(value[0])
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{path}: {peak_key}: {error_line(exc)}")
    rows: list[dict] = []
    for key in sorted(keys):
        method = key.rsplit(".", 1)[-1]
        if method not in ASV_METRICS:
            continue
        try:
            rows.extend(_asv_key_rows(res, key, benchmarks[key], common, peak, path, problems))
        except Exception as exc:  # noqa: BLE001 - one garbled benchmark never hides the others
            problems.append(f"{path}: {key}: garbled result ({error_line(exc)}); left out")
    _mark_wrong(rows)
    return rows


def _asv_combos(res, key: str, bench: dict) -> tuple[list, list[str], list[tuple]]:
    """A benchmark's parameter lists, their names and their combinations (ValueError: garbled)."""
    params = res.get_result_params(key)
    names = bench.get("param_names", []) if isinstance(bench, dict) else []
    if (
        not isinstance(params, list)
        or not all(isinstance(p, list) for p in params)
        or len(params) != len(names)
    ):
        raise ValueError(f"params {str(params)[:80]} do not match param_names {names}")
    combos = list(itertools.product(*params))
    # asv pads a short list with None ("failed"): check the stored one
    raw = getattr(res, "_results", {}).get(key)
    if raw is not None and (not isinstance(raw, list) or len(raw) != len(combos)):
        got = len(raw) if isinstance(raw, list) else repr(raw)[:40]
        raise ValueError(f"{got} values for {len(combos)} parameter sets")
    return params, names, combos


def _asv_case(key: str, case: dict, metric: str, value: object) -> tuple[str, AttnSpec, str]:
    """The variant, shape and workload of one asv parameter set (ValueError, TypeError: garbled)."""
    variant = case.get("variant", "")
    length = case.get("seq_len_k", case.get("seq_len", 0))
    if (
        not isinstance(variant, str)
        or not variant
        or isinstance(length, bool)
        or not isinstance(length, int)
    ):
        raise ValueError(f"variant {variant!r} / length {length!r}")
    if value is not None and not isinstance(value, (int, float)):
        raise ValueError(f"value {value!r} is not a number")
    check_value(metric, value)
    spec, workload = contract.asv_case(key, case, BASE_SPEC)
    return variant, spec, workload


def _asv_measured(key: str, value: object, stat: object, variant: str, spec: AttnSpec) -> dict:
    """The columns of one asv value: metric, unit, method, value, spread, interval and status."""
    metric, factor, label = ASV_METRICS[key.rsplit(".", 1)[-1]]
    status = _asv_status(value)
    stat = stat if isinstance(stat, dict) else {}

    def num(name: str) -> float:
        v = stat.get(name)
        return float(v) * factor if isinstance(v, (int, float)) else math.nan

    return {
        "metric": metric,
        "unit": UNITS[metric],
        "method": label or _asv_memory_method(variant, spec.device_type),
        "value": float(value) * factor if status == Status.OK else math.nan,
        "spread": num("q_75") - num("q_25"),
        "ci_low": num("ci_99_a"),
        "ci_high": num("ci_99_b"),
        "status": status,
    }


def _asv_key_rows(
    res, key: str, bench: dict, common: dict, peak: float, path: Path, problems: list[str]
) -> list[dict]:
    """The rows of one benchmark of an asv result file (garbled parameter sets: in ``problems``)."""
    metric = ASV_METRICS[key.rsplit(".", 1)[-1]][0]
    params, names, combos = _asv_combos(res, key, bench)
    values = res.get_result_value(key, params)
    stats = res.get_result_stats(key, params)
    stats = stats if isinstance(stats, list) and len(stats) == len(values) else [None] * len(values)
    rows, bad = [], []
    for combo, value, stat in zip(combos, values, stats, strict=True):
        case = dict(zip(names, (decode_param(p) for p in combo), strict=True))
        try:
            variant, spec, workload = _asv_case(key, case, metric, value)
        except (ValueError, TypeError) as exc:
            bad.append(f"{combo}: {error_line(exc)}")
            continue
        rows.append(
            {
                **common,
                "benchmark": key,
                "variant": variant,
                **spec_columns(spec),
                "workload": workload,
                **_asv_measured(key, value, stat, variant, spec),
                "peak_gflops": peak,
                "peak_gbps": math.nan,
                "_mode_given": "mode" in case,
            }
        )
    if bad:
        problems.append(
            f"{path}: {key}: {len(bad)} garbled parameter set(s) left out, e.g. {bad[0]}"
        )
    return rows


def _mark_wrong(rows: list[dict]) -> None:
    """Every row of a case whose error ratio is above 1 becomes ``wrong`` (values kept)."""
    verdicts: dict[tuple, float] = {}

    def case(r: dict) -> tuple:
        return (r["variant"], r["seq_len"], r["seq_len_k"], r["kv_heads"], r["device"], r["mask"])

    for r in rows:
        if r["metric"] == "error_ratio" and r["status"] == Status.OK and r["value"] > 1:
            verdicts[(*case(r), r["mode"] if r["_mode_given"] else None)] = r["value"]
    for r in rows:
        ratio = verdicts.get((*case(r), r["mode"]), verdicts.get((*case(r), None)))
        if ratio is not None:
            r["status"], r["reason"] = Status.WRONG, f"max error {ratio:.3g}x the tolerance"
        del r["_mode_given"]


def _kind(path: Path) -> str:
    """:class:`Source` ``asv`` or ``run``, or why ``path`` is neither (OSError: unreadable)."""
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a directory (pass an asv results directory or a run directory)"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    if (path / "benchmarks.json").exists():
        return Source.ASV
    if any((path / name).exists() for name in ("cases.jsonl", "manifest.json", "measurements.csv")):
        return Source.RUN
    children = list(path.iterdir())
    if not children:
        return "is an empty directory"
    if any((c / "machine.json").exists() for c in children if c.is_dir()):
        return (
            f"looks like asv results but has no benchmarks.json ({path / 'benchmarks.json'} "
            "missing)"
        )
    return "neither an asv results directory (benchmarks.json) nor a run (cases.jsonl)"


def _source_dir(src: str | Path) -> Path:
    """The directory to read for ``src``: ``src/results`` where ``src`` is an asv project."""
    path = Path(src)
    if (
        path.is_dir()
        and not (path / "benchmarks.json").exists()
        and (path / "results" / "benchmarks.json").exists()
    ):
        return path / "results"
    return path


def _load_one(path: Path) -> tuple[str, Read | None]:
    """What ``path`` is (:func:`_kind`) and its frame (None: neither kind, or unreadable)."""
    try:
        kind = _kind(path)
        return kind, load_asv(path) if kind == Source.ASV else load_run(
            path
        ) if kind == Source.RUN else None
    except OSError as exc:
        return f"cannot be read ({error_line(exc)})", None


def load(sources: Iterable[str | Path]) -> Read:
    """Concatenate asv results directories and run directories (detected by their files).

    The :class:`~attnbench.analysis.tidy.Read` holds ``problems`` (every bad source, file and row,
    by name), ``notes`` (incomplete runs) and ``sources`` (one ``{"path", "kind", "rows"}`` per
    source).
    """
    frames = []
    problems: list[str] = []
    notes: list[str] = []
    summary: list[dict] = []
    seen: dict[Path, str] = {}
    for src in sources:
        path = _source_dir(src)
        try:
            same = path.resolve()  # R, R/, ./R and a link to R are one source
        except (RuntimeError, OSError) as exc:  # a symlink loop (3.11: RuntimeError)
            problems.append(f"{path}: cannot be read: {error_line(exc)}")
            summary.append({"path": str(path), "kind": "unreadable", "rows": 0})
            continue
        if same in seen:
            notes.append(f"{src}: the same directory as {seen[same]}, given twice: read once")
            continue
        seen[same] = str(src)
        kind, read = _load_one(path)
        if read is None:
            problems.append(f"{path}: {kind}")
            summary.append({"path": str(path), "kind": "unreadable", "rows": 0})
            continue
        frame = read.frame
        frame["origin"] = str(path)
        problems.extend(read.problems)
        notes.extend(read.notes)
        summary.append({"path": str(path), "kind": kind, "rows": len(frame)})
        if len(frame) == 0 and not read.problems:
            problems.append(f"{path}: no measurements in it")
        frames.append(frame)
    frames = [f for f in frames if len(f)]
    out = pd.concat(frames, ignore_index=True) if frames else finish([], []).frame
    spikes = flag_spikes(out)
    notes += (
        [
            f"{spikes} time point(s) above the line through their neighbours by more than "
            f"{SPIKE_FACTOR:g}x are marked noisy (a cost in L is convex on log-log axes: such a "
            "point was disturbed)"
        ]
        if spikes
        else []
    )
    return Read(out, tuple(problems), tuple(notes), tuple(summary))


SPIKE_FACTOR = 1.5
"""How far above the log-log line through its neighbours a time point breaks its series' trend."""


def flag_spikes(frame: pd.DataFrame) -> int:
    """Mark ``ok`` time points above the line through their neighbours ``noisy`` (in place).

    Any cost c0 + c1·L + c2·L² + ... with non-negative terms is convex on log-log axes, so a
    measured point lies on or below the straight line joining the points at the lengths on either
    side of it. One more than :data:`SPIKE_FACTOR` above it was disturbed: a crossover or a ranking
    must not rest on it (one such point once made a false crossover). Returns how many points were
    marked.
    """
    from attnbench.analysis.complexity import GROUP, swept

    if frame.empty:
        return 0
    ok = frame.assign(origin=frame.get("origin", ""))
    ok = ok[(ok["status"] == Status.OK) & (ok["value"] > 0)]
    # a time is convex in L; a rate (GFLOP/s) is not
    times = swept(ok[ok["metric"].isin(("time", "cuda_time"))])
    case = [c for c in GROUP if c not in ("metric", "method")] + ["origin", "seq_len", "seq_len_k"]
    spiked: dict[tuple, float] = {}
    for _, series in times.groupby([*GROUP, "origin"], dropna=False, sort=False):
        by_len = series.groupby("length")["value"].median().sort_index()
        if len(by_len) < 3:
            continue
        x, y = np.log(by_len.index.to_numpy(float)), np.log(by_len.to_numpy(float))
        # the neighbours' line at each inner point
        chord = y[:-2] + (y[2:] - y[:-2]) * (x[1:-1] - x[:-2]) / (x[2:] - x[:-2])
        for length, factor in zip(by_len.index[1:-1], np.exp(y[1:-1] - chord), strict=True):
            if factor > SPIKE_FACTOR:
                for key in series.loc[series["length"] == length, case].itertuples(
                    index=False, name=None
                ):
                    spiked[key] = factor
    if not spiked:
        return 0
    keys = pd.Series(list(ok[case].itertuples(index=False, name=None)), index=ok.index)
    # the case's rates go with its time
    rows = ok.index[keys.isin(list(spiked)) & ok["metric"].isin(_TIMED)]
    factors = keys.loc[rows].map(spiked)
    frame.loc[rows, "status"] = Status.NOISY
    frame.loc[rows, "reason"] = [
        f"{f:.1f}x above the line through its neighbours' lengths: it breaks its series' "
        "trend (disturbed)"
        for f in factors
    ]
    return int((frame.loc[rows, "metric"] == "time").sum())
