"""One tidy DataFrame from asv results and ``attnbench run`` directories.

Every loader returns :data:`COLUMNS`, in that order: one row per case and metric (the README's
"Reading the numbers" describes each column). Loading never stops at a bad input and never turns one
into numbers: every file that cannot be used and every row that is rejected is named with the reason
in ``frame.attrs["problems"]``, and the rest still loads. A run's manifest and its rows are
cross-checked (``cases`` = rows written); a run stopped on purpose (``complete: false``) is listed
in ``frame.attrs["notes"]`` as incomplete, not as corrupt. A row missing a required value (its
case's identity, its status, an ok case's time) is rejected, never kept as an ok row holding 0 or
NaN. asv results of another suite version (their benchmark ``version`` differs from
``benchmarks.json``) are left out and counted by benchmark; every row of an asv case whose
``error_ratio`` is above 1 becomes ``wrong``. ``frame.attrs["sources"]`` has one entry per source:
its path, kind and rows loaded.
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import json
import math
import os
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from attnbench import contract
from attnbench.analysis.text import sig
from attnbench.contract import Method, Source, Status
from attnbench.io import error_line
from attnbench.measure.record import Measurement
from attnbench.spec import AttnSpec

COLUMNS = [
    "source",
    "benchmark",
    "variant",
    "seq_len",
    "seq_len_k",
    "device",
    "mode",
    "dtype",
    "batch",
    "heads",
    "head_dim",
    "mask",
    "kv_heads",
    "workload",
    "metric",
    "unit",
    "method",
    "value",
    "spread",
    "ci_low",
    "ci_high",
    "status",
    "reason",
    "machine",
    "cpu",
    "gpu",
    "commit",
    "date",
    "torch",
    "threads",
    "peak_gflops",
    "peak_gbps",
    "kernel",
    "run_date",
    "origin",
]
UNITS = contract.UNITS
MEMORY_METHODS = {"analytic": Method.MODEL}  # older files called the prediction "analytic"
ASV_METRICS = contract.ASV_METRICS
PEAK_BENCHMARK = contract.PEAK_BENCHMARK
BASE_SPEC = contract.BASE_SPEC  # the asv suite's fixed shape


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


def _finish(rows: list[dict], problems: list[str], notes: list[str] | None = None) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS) if rows else _empty()
    for col in ("value", "spread", "ci_low", "ci_high", "threads", "peak_gflops", "peak_gbps"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in ("seq_len", "seq_len_k", "batch", "heads", "head_dim", "kv_heads"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    for col in ("date", "run_date"):
        frame[col] = pd.to_datetime(frame[col], utc=True, errors="coerce")
    frame.attrs["problems"] = list(problems)
    frame.attrs["notes"] = list(notes or [])
    return frame


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


ASV_UNCHECKED = (
    "asv results carry no disturbance check (no calibration probe around asv's rounds), so none "
    "of their times is marked noisy: a busy machine's timings read as ok here; compare them from "
    "quiet machines only"
)
TIMED = {m.name for m in contract.METRICS.values() if m.timed}


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


def load_asv(results_dir: str | Path) -> pd.DataFrame:
    """Every machine, commit and environment under an asv ``results`` directory, as one tidy frame.

    Unreadable files, garbled parameters and stale results are named in ``attrs["problems"]``.
    """
    from asv import util

    results_dir = Path(results_dir)
    bench_path = results_dir / "benchmarks.json"
    try:
        benchmarks = util.load_json(str(bench_path), api_version=2)
        if not isinstance(benchmarks, dict):
            raise ValueError(f"expected a JSON object, got {type(benchmarks).__name__}")
    except (OSError, util.UserError, ValueError, TypeError) as exc:
        return _finish(
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
        return _finish([], [f"{results_dir}: cannot list ({error_line(exc)})"])
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
    notes = [f"{results_dir}: {ASV_UNCHECKED}"] if any(r["metric"] in TIMED for r in rows) else []
    gate = results_dir / contract.GATE_VERDICTS
    if gate.exists():
        notes += _apply_gate(rows, gate, problems)
    return _finish(rows, problems, notes)


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
            row["metric"] in TIMED
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
    _check_value(metric, value)
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
                **_spec_columns(spec),
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


def _check_value(metric: str, value: object) -> None:
    """Raise ValueError for a value no measurement of ``metric`` holds (NaN, None: not measured)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return
    if not math.isfinite(value) or value < 0 or (metric == "time" and value == 0):
        raise ValueError(
            f"{metric} {value!r} is not a {'time > 0' if metric == 'time' else 'finite value >= 0'}"
        )


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


def _spec_columns(spec: AttnSpec) -> dict:
    return {
        "seq_len": spec.lq,
        "seq_len_k": spec.lk,
        "device": spec.device_type,
        "mode": spec.mode,
        "dtype": spec.dtype,
        "batch": spec.batch,
        "heads": spec.heads,
        "head_dim": spec.head_dim,
        "mask": spec.mask,
        "kv_heads": spec.hkv,
    }


# ---- attnbench run ---------------------------------------------------------------------------
KEEPS_VALUES = (Status.OK, Status.WRONG, Status.NOISY)
"""Statuses whose values are kept as recorded (wrong and noisy ones: drawn, never fitted)."""


def _read_manifest(path: Path, problems: list[str], notes: list[str]) -> dict:
    """The manifest's claims to check the log against (``{}``: unreadable, named in problems)."""
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        notes.append(
            f"{path}: missing (the sweep stopped before writing it); the case log is read "
            "without it"
        )
        return {}
    except OSError as exc:
        problems.append(f"{path}: cannot read ({error_line(exc)}); the case log is read without it")
        return {}
    except ValueError as exc:
        problems.append(
            f"{path}: not readable JSON ({error_line(exc)}); the case log is read without it"
        )
        return {}
    if not isinstance(manifest, dict):
        problems.append(
            f"{path}: expected a JSON object, got {type(manifest).__name__}; the case log is "
            "read without it"
        )
        return {}
    from attnbench.runs import MANIFEST_SCHEMA

    if manifest.get("schema", MANIFEST_SCHEMA) != MANIFEST_SCHEMA:
        problems.append(
            f"{path}: format {manifest.get('schema')!r}, and this attnbench reads "
            f"{MANIFEST_SCHEMA!r}; the case log is read without it"
        )
        return {}
    for name, kind in (("cases", int), ("planned", int), ("complete", bool)):
        value = manifest.get(name)
        if value is not None and (
            not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0))
        ):
            problems.append(
                f"{path}: field {name!r} should be {'a count' if kind is int else 'true/false'}, "
                f"got {value!r}; ignored"
            )
            manifest.pop(name)
    if "cases" not in manifest:
        problems.append(f"{path}: no 'cases' count; the case log cannot be cross-checked")
    return manifest


def _lenient(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


MAX_INPUT_BYTES = 2.0**50
"""Inputs larger than this (1 PiB) ran on no machine: a case that says it did is corrupt."""


def _check_case(m: Measurement) -> None:
    """Raise ValueError naming what makes a logged case unusable (beyond its classes' checks)."""
    if not m.variant:
        raise ValueError("variant is empty")
    if m.status == Status.OK and not (m.median > 0):
        raise ValueError(f"status ok but its time is {m.median!r} (a time must be > 0)")
    if m.status not in KEEPS_VALUES:
        return
    for metric in contract.METRICS.values():
        if metric.field is not None:
            _check_value(metric.name, _lenient(contract.metric_value(m, metric.field)))
    if m.status == Status.OK and m.checked_error_ratio > 1:
        raise ValueError(
            f"status ok but its error is {sig(m.checked_error_ratio)}x the tolerance (the gate's "
            "limit is 1x)"
        )
    if m.spec.input_bytes > MAX_INPUT_BYTES:
        raise ValueError(
            f"status {m.status} but its inputs would take {m.spec.input_bytes:.3g} bytes (length "
            f"{m.spec.lk}): no machine ran it"
        )


def _case_rows(m: Measurement, common: dict) -> list[dict]:
    """The tidy rows of one logged case, one per run metric of :data:`contract.METRICS` it holds.

    A case that did not run (skipped, failed) keeps one row, its time (NaN), which carries its
    status and reason; a case that ran has a row per metric it measured (its time row always, even
    when not timed). A ``noisy`` case's rows of metrics a neighbour cannot disturb (not
    :attr:`Metric.timed`: memory, FLOPs, counts) are ``ok``: fitted and ranked like any other; only
    its time-derived values stay ``noisy``.
    """
    spec = m.spec
    base = {
        **common,
        "variant": m.variant,
        **_spec_columns(spec),
        "workload": m.workload,
        "status": m.status,
        "reason": m.reason,
        "machine": m.env.hostname if m.env else "",
        "cpu": m.env.cpu_model if m.env else "",
        "gpu": m.env.gpu_name if m.env else "",
        "commit": m.env.commit if m.env else "",
        "torch": m.env.torch if m.env else "",
        "threads": float(m.env.threads) if m.env else math.nan,
        "peak_gflops": _lenient(common["peak_gflops"].get(spec.dtype)),
        "kernel": str(m.extra.get("kernel", "")),
        "ci_low": math.nan,
        "ci_high": math.nan,
    }
    kept = m.status in KEEPS_VALUES
    out = []
    for metric in contract.METRICS.values():
        if metric.field is None or (not kept and metric.name != "time"):
            continue
        value = _lenient(contract.metric_value(m, metric.field)) if kept else math.nan
        if math.isnan(value) and metric.name != "time":
            continue  # not measured for this case (e.g. RSS switched off): no row, never an ok NaN
        method = metric.method
        if method.startswith("<"):
            method = getattr(m, method[1:]) or "unrecorded"
            method = MEMORY_METHODS.get(method, method)
        spread = _lenient(getattr(m, metric.spread)) if metric.spread and kept else math.nan
        # A neighbour disturbs time, never bytes or counts: a noisy case's untimed values are facts.
        status = Status.OK if m.status == Status.NOISY and not metric.timed else m.status
        out.append(
            {
                **base,
                "metric": metric.name,
                "unit": metric.unit,
                "method": method,
                "value": value,
                "spread": spread,
                "status": status,
            }
        )
    return out


def _read_run_log(run_dir: Path, problems: list[str]):
    """The run's case log, or None when nothing of it can be read (why: in ``problems``)."""
    from attnbench.runs import LOG, LOG_SCHEMA, read_log

    try:
        log = read_log(run_dir / LOG)
    except FileNotFoundError:
        problems.append(
            f"{run_dir / LOG}: missing; nothing of this run can be read (measurements.csv is an "
            "export, not the record)"
        )
        return None
    except OSError as exc:
        problems.append(f"{run_dir / LOG}: cannot read ({error_line(exc)})")
        return None
    header = log.header or {}
    if header.get("schema", LOG_SCHEMA) != LOG_SCHEMA:
        problems.append(
            f"{run_dir / LOG}: format {header.get('schema')!r}, and this attnbench reads "
            f"{LOG_SCHEMA!r}: not read (use the attnbench that wrote it)"
        )
        return None
    return log


def _run_common(header: dict, manifest: dict) -> dict:
    """The columns every row of a run shares: its source, dates and the machine's recorded roofs."""
    peaks = header.get("peak_gflops", manifest.get("peak_gflops")) or {}
    if not isinstance(peaks, dict):  # a single number: the float32 roof
        peaks = {"float32": peaks}
    gbps = header.get("peak_gbps", manifest.get("peak_gbps"))
    # the highest bandwidth the run measured: no rate may exceed it
    roof_gbps = max(
        (_lenient(v) for v in (gbps.values() if isinstance(gbps, dict) else [gbps])),
        default=math.nan,
    )
    # triad: the roofline's bandwidth roof
    gbps = _lenient(gbps.get("triad") if isinstance(gbps, dict) else gbps)
    created = manifest.get("created") or header.get("created")
    return {
        "source": Source.RUN,
        "benchmark": "attnbench.run",
        "date": created,
        "run_date": created,
        "peak_gflops": peaks,
        "peak_gbps": gbps if gbps > 0 else math.nan,
        "roof_gbps": roof_gbps if roof_gbps > 0 else math.nan,
    }


ROOF_RATES = {"gflops": ("matmul", "GFLOP/s"), "gbps": ("bandwidth", "GB/s")}
"""The rates a run's measured roofs bound: metric -> (which roof, unit)."""


def flag_above_roof(rows: list[dict], common: dict, where: str) -> list[str]:
    """Mark every rate above its run's measured roof ``above_roof``; one problem line for each.

    A rate above the roof the same machine measured (GFLOP/s over its matmul peak at the case's
    dtype, GB/s over the highest bandwidth it measured) is an accounting error: the FLOPs or bytes
    it divides overstate what the kernel did (a kernel skipping masked tiles charged for the full
    square). It is never shown as a measurement; its time stays a fact.
    """
    out = []
    for row in rows:
        if row["metric"] not in ROOF_RATES or row["status"] not in KEEPS_VALUES:
            continue
        roof = (
            _lenient(common["peak_gflops"].get(row["dtype"]))
            if row["metric"] == "gflops"
            else common["roof_gbps"]
        )
        if not (roof > 0 and row["value"] > roof):
            continue
        what, unit = ROOF_RATES[row["metric"]]
        reason = (
            f"accounting error: {sig(row['value'])} {unit} is above the {what} roof "
            f"{sig(roof)} {unit} measured in the same run (the executed FLOPs or bytes overstate "
            "what the kernel did)"
        )
        row.update(status=Status.ABOVE_ROOF, reason=reason)
        out.append(
            f"{where}: {row['variant']} {row['mode']} mask={row['mask']} L={row['seq_len']} "
            f"{row['dtype']}: {reason}; not shown as a measurement"
        )
    return out


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """An ``attnbench run`` directory as a tidy frame, read from its case log (``cases.jsonl``).

    ``manifest.json`` only adds its claims to check: the count of cases written, whether the sweep
    finished. ``measurements.csv`` is an export for people and is not read. Unusable log lines and
    cases are rejected with the reason.
    """
    from attnbench.runs import LOG, MANIFEST

    run_dir = Path(run_dir)
    problems: list[str] = []
    notes: list[str] = []
    log = _read_run_log(run_dir, problems)
    if log is None:
        return _finish([], problems, notes)
    header = log.header or {}
    problems.extend(log.rejected)
    rejected = set(log.rejected)  # a set: a log of 100,000 bad lines took minutes as a list
    notes.extend(n for n in log.notes if n not in rejected)
    manifest = _read_manifest(run_dir / MANIFEST, problems, notes)
    if log.header is None and log.measurements:
        problems.append(f"{run_dir / LOG}: no header line; the planned grid is unknown")
    common = _run_common(header, manifest)
    rows: list[dict] = []
    cases = _distinct_cases(run_dir / LOG, log.measurements, problems)
    for number, m in cases:
        try:
            _check_case(m)
            rows.extend(_case_rows(m, common))
        except ValueError as exc:
            problems.append(f"{run_dir / LOG} case {number} ({m.variant or '?'}): {exc}; rejected")
    problems.extend(flag_above_roof(rows, common, str(run_dir / LOG)))
    _cross_check(
        run_dir, [m for _, m in cases], len(log.measurements), header, manifest, problems, notes
    )
    return _finish(rows, problems, notes)


def _distinct_cases(
    log_path: Path, measurements: Sequence[Measurement], problems: list[str]
) -> list[tuple[int, Measurement]]:
    """``(number in the log, case)`` once per case: a case logged twice keeps its last."""
    from attnbench.runs import case_key

    last: dict[str, tuple[int, Measurement]] = {}
    for number, m in enumerate(measurements, start=1):
        key = case_key(m.variant, m.spec)
        if key in last:
            problems.append(
                f"{log_path} case {number} ({m.variant} {m.spec.label}): the same case as case "
                f"{last[key][0]}; the last one is kept"
            )
            del last[key]
        last[key] = (number, m)
    return sorted(last.values(), key=lambda item: item[0])


def _cross_check(
    run_dir: Path,
    cases: Sequence[Measurement],
    logged: int,
    header: dict,
    manifest: dict,
    problems: list[str],
    notes: list[str],
) -> None:
    """The manifest's claims and the header's plan against the cases the log holds (the truth).

    ``logged``: lines of cases in the log; ``cases``: the distinct ones.
    """
    from attnbench.runs import LOG, MANIFEST

    claimed, complete = manifest.get("cases"), manifest.get("complete")
    keys = header.get("cases") if isinstance(header.get("cases"), list) else None
    planned = len(keys) if keys is not None else header.get("planned", manifest.get("planned"))
    if (
        manifest.get("planned") is not None
        and planned is not None
        and manifest["planned"] != planned
    ):
        problems.append(
            f"{run_dir / MANIFEST} says {manifest['planned']} case(s) were planned, the header of "
            f"{run_dir / LOG} {planned}"
        )
    # one write behind the log: killed between logging a case and rewriting the manifest
    if claimed == logged - 1:
        notes.append(
            f"{run_dir / MANIFEST} says {claimed} case(s) but {run_dir / LOG} holds {logged}: "
            "the sweep stopped between writing its files (--resume rewrites the manifest)"
        )
    elif claimed is not None and claimed != logged:
        problems.append(
            f"{run_dir / LOG}: holds {logged} case(s) but {run_dir / MANIFEST} says {claimed} "
            "case(s) were written (truncated or replaced)"
        )
    done = _planned_done(run_dir / LOG, cases, keys, problems)
    if complete is True and planned is not None and done < planned:
        problems.append(
            f"{run_dir / MANIFEST} says complete, but {run_dir / LOG} holds {done} of the "
            f"{planned} planned cases"
        )
    if complete is False:
        notes.append(
            f"{run_dir}: incomplete ({claimed if claimed is not None else done} of "
            f"{planned if planned is not None else '?'} cases): the sweep was stopped before the "
            "end"
        )
    elif planned is not None and done < planned:
        notes.append(f"{run_dir}: incomplete ({done} of {planned} cases)")


def _planned_done(
    log_path: Path, cases: Sequence[Measurement], keys: list | None, problems: list[str]
) -> int:
    """How many planned cases the log holds; cases it did not plan are named in ``problems``.

    ``keys``: the header's plan; None: no list, every case counts.
    """
    from attnbench.runs import case_key

    if keys is None:
        return len(cases)
    logged_keys = {case_key(m.variant, m.spec) for m in cases}
    unplanned = logged_keys - set(keys)
    if unplanned:
        problems.append(
            f"{log_path}: {len(unplanned)} case(s) the header did not plan ({len(keys)} "
            "planned): another sweep's cases, or a garbled header"
        )
    return len(logged_keys & set(keys))


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


def _load_one(path: Path) -> tuple[str, pd.DataFrame | None]:
    """What ``path`` is (:func:`_kind`) and its frame (None: neither kind, or unreadable)."""
    try:
        kind = _kind(path)
        return kind, load_asv(path) if kind == Source.ASV else load_run(
            path
        ) if kind == Source.RUN else None
    except OSError as exc:
        return f"cannot be read ({error_line(exc)})", None


def load(sources: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate asv results directories and run directories (detected by their files).

    ``attrs``: ``problems`` (every bad source, file and row, by name), ``notes`` (incomplete runs)
    and ``sources`` (one ``{"path", "kind", "rows"}`` per source).
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
        kind, frame = _load_one(path)
        if frame is None:
            problems.append(f"{path}: {kind}")
            summary.append({"path": str(path), "kind": "unreadable", "rows": 0})
            continue
        frame["origin"] = str(path)
        problems.extend(frame.attrs.get("problems", []))
        notes.extend(frame.attrs.get("notes", []))
        summary.append({"path": str(path), "kind": kind, "rows": len(frame)})
        if len(frame) == 0 and not frame.attrs.get("problems"):
            problems.append(f"{path}: no measurements in it")
        frames.append(frame)
    frames = [f for f in frames if len(f)]
    out = pd.concat(frames, ignore_index=True) if frames else _finish([], [])
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
    out.attrs["problems"] = problems
    out.attrs["notes"] = notes
    out.attrs["sources"] = summary
    return out


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
    rows = ok.index[keys.isin(list(spiked)) & ok["metric"].isin(TIMED)]
    factors = keys.loc[rows].map(spiked)
    frame.loc[rows, "status"] = Status.NOISY
    frame.loc[rows, "reason"] = [
        f"{f:.1f}x above the line through its neighbours' lengths: it breaks its series' "
        "trend (disturbed)"
        for f in factors
    ]
    return int((frame.loc[rows, "metric"] == "time").sum())
