"""One tidy DataFrame from asv results and ``attnbench run`` directories.

Schema (one row per case x metric; every loader returns exactly these columns, in this order):

============== =====================================================================
source         "asv" or "run"
benchmark      asv benchmark name, or "attnbench.run"
variant        registered variant name
seq_len        Lq (int); seq_len_k is Lk
seq_len_k      Lk (int)
device         "cpu" / "cuda"
mode           "forward" / "backward" (forward + backward)
dtype          "float32", ...
batch, heads, head_dim, mask   the rest of the case's shape
kv_heads       Hkv, key/value heads (int; = heads for multi-head attention and for files older than GQA)
workload       "prefill" (Lq = Lk, swept along seq_len) or "decode" (few queries over a long cache, swept
               along seq_len_k): ``contract.SWEPT_LENGTH``; "prefill" for older files
metric         time | peak_tensor_bytes | peak_rss | gflops | flops | max_error | softmax_error | cuda_time
               | compile_time | error_ratio (max error / the correctness gate's tolerance)
               | bytes (``AttnSpec.bytes_moved``, an ideal kernel's traffic: method "model")
               | gbps (bytes over the measured time: its method is the time's)
unit           s | bytes | GFLOP/s | FLOP | abs | x tolerance | GB/s
method         how the value was obtained: "wall" (perf_counter) | "cuda_events" | "asv" (asv's own
               timer / peakmem / tracked rate) | "profiler" | "cuda" (allocator stats) | "rss" |
               "reference" (compared with the float64 reference) | "model" (an analytic prediction,
               not a measurement: never fitted, never compared with itself) | "unrecorded" (old files)
value          float; NaN unless status is "ok" (or "wrong" / "noisy": kept as recorded, never a fact)
spread         IQR of the timing samples (asv: q75 - q25), NaN when unknown
ci_low         lower end of asv's 99% interval of the value (NaN for runs)
ci_high        upper end of asv's 99% interval of the value (NaN for runs)
status         ok | wrong | skipped | failed (asv) ; ok | wrong | skipped | oom | timeout | error | crashed (run)
reason         why a case is not ok ("" for asv skips, which asv does not explain)
kernel         SDPA backend(s) that actually ran, read from the profiler ("" when not recorded)
machine        machine name (asv machine name, run hostname)
cpu            CPU model
gpu            GPU name ("" for none)
commit         git commit hash ("" when unknown)
date           pandas Timestamp (UTC) of the commit (asv) or of the run
torch          torch version
threads        torch threads (NaN for asv, which does not record it)
peak_gflops    this machine's matmul GFLOP/s at the row's dtype when recorded, else NaN
peak_gbps      this machine's measured memory bandwidth (STREAM triad, GB/s) when the run recorded it,
               else NaN (asv results and older runs do not record it: no bandwidth roof is drawn for them)
run_date       pandas Timestamp (UTC) of when the measurement ran (asv: the earliest ``started_at``
               of the result file; run: the manifest's ``created``); ``date`` of asv rows is the
               *commit* date
origin         the source path the row was loaded from (tells two runs of one machine apart)
============== =====================================================================

Loading never stops at a bad input and never turns one into numbers. Every file that cannot be
used, and every row that is rejected, is named with the reason in ``frame.attrs["problems"]``;
the rest still loads. A run's manifest and its rows are cross-checked (``cases`` = rows written);
a run stopped on purpose (``complete: false``) is listed in ``frame.attrs["notes"]`` as
incomplete, not as corrupt. A row with a missing or non-numeric required value (its case's
identity, its status, an ok case's time) is rejected, never kept as an ok row holding 0 or NaN.
asv results whose benchmark ``version`` differs from ``benchmarks.json`` (another suite version)
are left out and counted, by benchmark, in the problems. In asv results, every row of a case whose
``error_ratio`` is above 1 becomes ``wrong``. ``frame.attrs["sources"]`` has one entry per source:
its path, kind and rows loaded.
"""

from __future__ import annotations

import ast
import csv
import datetime as dt
import io
import itertools
import json
import math
import os
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.measure.record import STATUSES
from attnbench.spec import AttnSpec

COLUMNS = [
    "source", "benchmark", "variant", "seq_len", "seq_len_k", "device", "mode", "dtype", "batch", "heads",
    "head_dim", "mask", "kv_heads", "workload", "metric", "unit", "method", "value", "spread", "ci_low", "ci_high", "status", "reason", "machine",
    "cpu", "gpu", "commit", "date", "torch", "threads", "peak_gflops", "peak_gbps", "kernel", "run_date", "origin",
]
UNITS = contract.UNITS
RUN_STATUSES = STATUSES  # the shared list: a status added there is read here too
MEMORY_METHODS = {"analytic": "model"}  # older files called the prediction "analytic"
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


def _why(exc: BaseException) -> str:
    text = str(exc).splitlines()[0][:300] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---- asv -------------------------------------------------------------------------------------
def _decode(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return value


def _asv_status(value: object) -> str:
    if value is None:
        return "failed"
    if isinstance(value, float) and math.isnan(value):
        return "skipped"
    return "ok"


def _asv_memory_method(variant: str, device: str) -> str:
    """What ``attnbench.asv_bench.peak_tensor_bytes`` returns for a case: the runner's own rule."""
    from attnbench.registry import get_variant, variant_names

    if device.startswith("cuda"):
        return "cuda"
    if variant in variant_names() and get_variant(variant).SECONDS_PER_PAIR > 0:
        return "model"  # interpreter-bound: the runner returns the prediction
    return "profiler"


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
        return _finish([], [f"{bench_path}: cannot read the benchmark list ({_why(exc)}); "
                            f"no result under {results_dir} can be interpreted without it"])
    problems: list[str] = []
    rows: list[dict] = []
    try:
        machine_dirs = sorted(p for p in results_dir.iterdir() if p.is_dir())
    except OSError as exc:
        return _finish([], [f"{results_dir}: cannot list ({_why(exc)})"])
    files = 0
    for machine_dir in machine_dirs:
        machine_path = machine_dir / "machine.json"
        try:
            machine = json.loads(machine_path.read_text(encoding="utf-8"))
            if not isinstance(machine, dict):
                raise ValueError(f"expected a JSON object, got {type(machine).__name__}")
        except (OSError, ValueError) as exc:
            problems.append(f"{machine_path}: {_why(exc)}; machine name taken from the directory, CPU unknown")
            machine = {"machine": machine_dir.name}
        try:
            paths = sorted(p for p in machine_dir.glob("*.json") if p.name != "machine.json")
        except OSError as exc:
            problems.append(f"{machine_dir}: cannot list ({_why(exc)})")
            continue
        for path in paths:
            files += 1
            rows.extend(_asv_file(path, benchmarks, machine, problems))
    if files == 0:
        problems.append(f"{results_dir}: no result files (asv saves none without --set-commit-hash when run "
                        "with --python=same)")
    return _finish(rows, problems)


def _asv_file(path: Path, benchmarks: dict, machine: dict, problems: list[str]) -> list[dict]:
    """Rows of one asv result file; problems appended, never raised."""
    from asv.results import Results

    try:
        res = Results.load(str(path))
        date = dt.datetime.fromtimestamp(res.date / 1e3, tz=dt.timezone.utc) if res.date else None
        starts = [v for v in (res.started_at or {}).values() if isinstance(v, (int, float)) and v > 0]
        run_date = dt.datetime.fromtimestamp(min(starts) / 1e3, tz=dt.timezone.utc) if starts else None
        params = res.params if isinstance(res.params, dict) else {}
        all_keys = list(res.get_all_result_keys())
        keys = res.get_result_keys(benchmarks)  # drops stale versions
    except Exception as exc:  # noqa: BLE001 - any unreadable file is named and skipped, the rest loads
        problems.append(f"{path}: not a readable asv result file ({_why(exc)})")
        return []
    stale = sorted(k for k in all_keys if k not in keys)
    if stale:
        names = ", ".join(k.rsplit(".", 1)[-1] for k in stale)
        problems.append(f"{path}: {len(stale)} result(s) from another version of the suite left out "
                        f"(benchmark version differs from benchmarks.json, or no longer there): {names}")
    common = {
        "source": "asv", "machine": str(params.get("machine", machine.get("machine", ""))),
        "cpu": str(machine.get("cpu", "")), "gpu": "", "commit": res.commit_hash or "", "date": date, "run_date": run_date,
        "torch": params.get("torch", "") or params.get("req-torch", ""), "threads": math.nan,
        "reason": "", "kernel": "",
    }
    peak = math.nan
    peak_key = next((k for k in keys if k.endswith(PEAK_BENCHMARK)), None)
    if peak_key is not None:
        try:
            value = res.get_result_value(peak_key, [])
            if isinstance(value, list) and value and isinstance(value[0], (int, float)):
                peak = float(value[0])
        except Exception as exc:  # noqa: BLE001
            problems.append(f"{path}: {peak_key}: {_why(exc)}")
    rows: list[dict] = []
    for key in sorted(keys):
        method = key.rsplit(".", 1)[-1]
        if method not in ASV_METRICS:
            continue
        try:
            rows.extend(_asv_key_rows(res, key, benchmarks[key], common, peak, path, problems))
        except Exception as exc:  # noqa: BLE001 - one garbled benchmark never hides the others
            problems.append(f"{path}: {key}: garbled result ({_why(exc)}); left out")
    _mark_wrong(rows)
    return rows


def _asv_key_rows(res, key: str, bench: dict, common: dict, peak: float, path: Path, problems: list[str]) -> list[dict]:
    metric, factor, label = ASV_METRICS[key.rsplit(".", 1)[-1]]
    params = res.get_result_params(key)
    names = bench.get("param_names", []) if isinstance(bench, dict) else []
    if not isinstance(params, list) or not all(isinstance(p, list) for p in params) or len(params) != len(names):
        raise ValueError(f"params {str(params)[:80]} do not match param_names {names}")
    combos = list(itertools.product(*params))
    raw = getattr(res, "_results", {}).get(key)  # asv pads a short list with None ("failed"): check the stored one
    if raw is not None and (not isinstance(raw, list) or len(raw) != len(combos)):
        raise ValueError(f"{len(raw) if isinstance(raw, list) else repr(raw)[:40]} values for {len(combos)} parameter sets")
    values = res.get_result_value(key, params)
    stats = res.get_result_stats(key, params)
    stats = stats if isinstance(stats, list) and len(stats) == len(values) else [None] * len(values)
    rows, bad = [], []
    for combo, value, stat in zip(combos, values, stats, strict=True):
        case = dict(zip(names, (_decode(p) for p in combo), strict=True))
        try:
            variant = case.get("variant", "")
            length = case.get("seq_len_k", case.get("seq_len", 0))
            if not isinstance(variant, str) or not variant or isinstance(length, bool) or not isinstance(length, int):
                raise ValueError(f"variant {variant!r} / length {length!r}")
            if value is not None and not isinstance(value, (int, float)):
                raise ValueError(f"value {value!r} is not a number")
            spec, workload = contract.asv_case(key, case, BASE_SPEC)
        except (ValueError, TypeError) as exc:
            bad.append(f"{combo}: {_why(exc)}")
            continue
        status = _asv_status(value)
        stat = stat if isinstance(stat, dict) else {}

        def num(name: str, stat: dict = stat) -> float:
            v = stat.get(name)
            return float(v) * factor if isinstance(v, (int, float)) else math.nan

        rows.append({
            **common, "benchmark": key, "variant": variant, **_spec_columns(spec), "workload": workload, "metric": metric,
            "unit": UNITS[metric], "method": label or _asv_memory_method(variant, spec.device_type),
            "value": float(value) * factor if status == "ok" else math.nan, "spread": num("q_75") - num("q_25"),
            "ci_low": num("ci_99_a"), "ci_high": num("ci_99_b"), "status": status, "peak_gflops": peak, "peak_gbps": math.nan,
            "_mode_given": "mode" in case,
        })
    if bad:
        problems.append(f"{path}: {key}: {len(bad)} garbled parameter set(s) left out, e.g. {bad[0]}")
    return rows


def _mark_wrong(rows: list[dict]) -> None:
    """Every row of a case whose error ratio is above 1 becomes ``wrong`` (values kept as recorded)."""
    verdicts: dict[tuple, float] = {}

    def case(r: dict) -> tuple:
        return (r["variant"], r["seq_len"], r["seq_len_k"], r["kv_heads"], r["device"], r["mask"])

    for r in rows:
        if r["metric"] == "error_ratio" and r["status"] == "ok" and r["value"] > 1:
            verdicts[(*case(r), r["mode"] if r["_mode_given"] else None)] = r["value"]
    for r in rows:
        ratio = verdicts.get((*case(r), r["mode"]), verdicts.get((*case(r), None)))
        if ratio is not None:
            r["status"], r["reason"] = "wrong", f"max error {ratio:.3g}x the tolerance"
        del r["_mode_given"]


def _spec_columns(spec: AttnSpec) -> dict:
    return {
        "seq_len": spec.lq, "seq_len_k": spec.lk, "device": spec.device_type, "mode": spec.mode,
        "dtype": spec.dtype, "batch": spec.batch, "heads": spec.heads, "head_dim": spec.head_dim, "mask": spec.mask,
        "kv_heads": spec.hkv,
    }


# ---- attnbench run ---------------------------------------------------------------------------
# metric -> (value column, spread column, method: a fixed label or "<column" to read it from a column)
RUN_METRICS = {
    "time": ("median_s", "iqr_s", "<timing_method"),
    "peak_tensor_bytes": ("peak_tensor_bytes", None, "<memory_method"),
    "peak_rss": ("peak_rss_bytes", None, "rss"),
    "gflops": ("gflops_per_s", None, "<timing_method"),
    "max_error": ("max_error", None, "reference"),
    "softmax_error": ("softmax_error", None, "reference"),
    "compile_time": ("compile_s", None, "wall"),
    "bytes": ("bytes_moved", None, "model"),
    "gbps": ("gbytes_per_s", None, "<timing_method"),
}
RUN_REQUIRED = ("variant", "status", "spec_seq_len", "spec_device", "spec_mode", "spec_dtype", "spec_batch",
                "spec_heads", "spec_head_dim", "spec_mask")
RUN_INTEGERS = ("spec_seq_len", "spec_batch", "spec_heads", "spec_head_dim")


def _number(text: str | None) -> float:
    """A CSV cell as a float: "" / missing -> NaN; anything non-numeric raises ValueError."""
    if text is None or text.strip() == "":
        return math.nan
    return float(text)


def _read_manifest(path: Path, problems: list[str]) -> dict | None:
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{path}: missing; the run may not have finished, its rows are loaded unchecked")
        return None
    except OSError as exc:
        problems.append(f"{path}: cannot read ({_why(exc)}); the rows are loaded unchecked")
        return None
    except ValueError as exc:
        problems.append(f"{path}: not readable JSON ({_why(exc)}); the rows are loaded unchecked")
        return None
    if not isinstance(manifest, dict):
        problems.append(f"{path}: expected a JSON object, got {type(manifest).__name__}; the rows are loaded unchecked")
        return None
    for name, kind in (("cases", int), ("planned", int), ("complete", bool)):
        value = manifest.get(name)
        if value is not None and (not isinstance(value, kind) or (kind is int and (isinstance(value, bool) or value < 0))):
            problems.append(f"{path}: field {name!r} should be {'a count' if kind is int else 'true/false'}, got {value!r}; ignored")
            manifest.pop(name)
    if "cases" not in manifest:
        problems.append(f"{path}: no 'cases' count; the rows cannot be cross-checked")
    return manifest


def _read_rows(path: Path, problems: list[str]) -> tuple[list[str], list[tuple[int, dict]], int] | None:
    """``(header, [(row number, record)], data rows in the file)`` or None (problem recorded)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        problems.append(f"{path}: missing")
        return None
    except (OSError, UnicodeDecodeError) as exc:
        problems.append(f"{path}: cannot read ({_why(exc)})")
        return None
    try:
        table = list(csv.reader(io.StringIO(text)))
    except csv.Error as exc:
        problems.append(f"{path}: not CSV ({_why(exc)})")
        return None
    table = [row for row in table if row]  # blank lines
    if not table:
        problems.append(f"{path}: empty (no header, no rows)")
        return None
    header, data = table[0], table[1:]
    missing = [c for c in RUN_REQUIRED if c not in header]
    if missing:
        problems.append(f"{path}: missing required column(s) {', '.join(missing)}; no row can be used")
        return None
    records = []
    for number, row in enumerate(data, start=1):
        if len(row) != len(header):
            problems.append(f"{path} row {number}: {len(row)} fields, the header has {len(header)} (truncated or garbled); rejected")
            continue
        if number == len(data) and not text.endswith(("\n", "\r")):
            problems.append(f"{path} row {number}: no line end (the file was cut mid-row); rejected")
            continue
        records.append((number, dict(zip(header, row, strict=True))))
    return header, records, len(data)


def _run_row(rec: dict, manifest: dict, peaks: dict, bandwidth: float = math.nan) -> list[dict]:
    """Tidy rows of one measurements.csv record; raises ValueError with the reason to reject it."""
    for col in RUN_REQUIRED:
        if not rec[col].strip():
            raise ValueError(f"{col} is empty")
    status = rec["status"].strip()
    if status not in RUN_STATUSES:
        raise ValueError(f"status {status!r} is not one of {RUN_STATUSES}")
    ints = {}
    for col in RUN_INTEGERS:
        try:
            value = _number(rec[col])
        except ValueError:
            raise ValueError(f"{col} {rec[col]!r} is not a number") from None
        if not (math.isfinite(value) and value == int(value) and value >= 1):
            raise ValueError(f"{col} {rec[col]!r} is not a positive integer")
        ints[col] = int(value)
    try:
        seq_len_k = _number(rec.get("seq_len_k_eff"))
    except ValueError:
        raise ValueError(f"seq_len_k_eff {rec['seq_len_k_eff']!r} is not a number") from None
    seq_len_k = int(seq_len_k) if math.isfinite(seq_len_k) else ints["spec_seq_len"]
    kv_heads = _kv_heads(rec, ints["spec_heads"])
    workload = rec.get("workload", "").strip() or "prefill"  # older files: every case was prefill
    if workload not in contract.WORKLOADS:
        raise ValueError(f"workload {workload!r} is not one of {contract.WORKLOADS}")
    _derive_traffic(rec, ints, seq_len_k, kv_heads)
    values: dict[str, float] = {}
    for col, spread_col, _ in RUN_METRICS.values():
        for c in (col, spread_col):
            if c and c in rec:
                try:
                    values[c] = _number(rec[c])
                except ValueError:
                    raise ValueError(f"{c} {rec[c]!r} is not a number") from None
    if status == "ok" and not (values.get("median_s", math.nan) > 0):
        raise ValueError(f"status ok but median_s is {rec.get('median_s', 'absent')!r} (a time must be > 0)")
    dtype = rec["spec_dtype"]
    common = {
        "source": "run", "benchmark": "attnbench.run", "variant": rec["variant"], "seq_len": ints["spec_seq_len"],
        "seq_len_k": seq_len_k, "device": rec["spec_device"].split(":")[0], "mode": rec["spec_mode"], "dtype": dtype,
        "batch": ints["spec_batch"], "heads": ints["spec_heads"], "head_dim": ints["spec_head_dim"],
        "mask": rec["spec_mask"], "kv_heads": kv_heads, "workload": workload, "status": status, "reason": rec.get("reason", ""),
        "machine": rec.get("env_hostname", ""), "cpu": rec.get("env_cpu_model", ""), "gpu": rec.get("env_gpu_name", ""),
        "commit": rec.get("env_commit", ""), "date": manifest.get("created"), "run_date": manifest.get("created"), "torch": rec.get("env_torch", ""),
        "threads": _lenient(rec.get("env_threads")), "peak_gflops": _lenient(peaks.get(dtype)), "peak_gbps": bandwidth,
        "kernel": rec.get("extra_kernel", ""),
    }
    keeps_values = status in ("ok", "wrong", "noisy")  # noisy: drawn (hollow), never fitted or ranked
    out = []
    for metric, (col, spread_col, method) in RUN_METRICS.items():
        if col not in rec:
            continue
        value = values[col]
        if method.startswith("<"):
            method = rec.get(method[1:], "").strip() or "unrecorded"
            method = MEMORY_METHODS.get(method, method)
        if keeps_values and math.isnan(value) and metric != "time":
            continue  # not measured for this case (e.g. RSS switched off): no row, never an ok NaN
        if not keeps_values and metric not in ("time", "peak_tensor_bytes", "peak_rss", "gflops", "max_error"):
            continue
        out.append({
            **common, "metric": metric, "unit": UNITS[metric], "method": method,
            "value": value if keeps_values else math.nan,
            "spread": values.get(spread_col, math.nan) if spread_col and keeps_values else math.nan,
            "ci_low": math.nan, "ci_high": math.nan,
        })
    tolerance = _lenient(rec.get("tolerance"))
    error = values.get("max_error", math.nan)
    if keeps_values and math.isfinite(error) and math.isfinite(tolerance) and tolerance > 0:
        out.append({**common, "metric": "error_ratio", "unit": UNITS["error_ratio"], "method": "reference",
                    "value": error / tolerance, "spread": math.nan, "ci_low": math.nan, "ci_high": math.nan})
    return out


def _kv_heads(rec: dict, heads: int) -> int:
    """The record's Hkv: ``spec_kv_heads``, or H when absent or empty (older files, multi-head cases)."""
    text = rec.get("spec_kv_heads", "").strip()
    if text in ("", "None"):
        return heads
    try:
        value = _number(text)
    except ValueError:
        raise ValueError(f"spec_kv_heads {text!r} is not a number") from None
    if not (math.isfinite(value) and value == int(value) and value >= 1 and heads % int(value) == 0):
        raise ValueError(f"spec_kv_heads {text!r} is not a positive integer dividing spec_heads {heads}")
    return int(value)


def _derive_traffic(rec: dict, ints: dict, seq_len_k: int, kv_heads: int) -> None:
    """Fill ``bytes_moved`` / ``gbytes_per_s`` of a file older than them from the case's shape (in place).

    The traffic is a function of the shape alone (:attr:`AttnSpec.bytes_moved`); a record whose
    shape cannot be rebuilt (an unknown dtype, say) is left without them.
    """
    if rec.get("bytes_moved", "").strip():
        return
    try:
        dv = _number(rec.get("spec_head_dim_v"))
        spec = AttnSpec(
            batch=ints["spec_batch"], heads=ints["spec_heads"], kv_heads=kv_heads, seq_len=ints["spec_seq_len"],
            seq_len_k=seq_len_k, head_dim=ints["spec_head_dim"], head_dim_v=int(dv) if math.isfinite(dv) else None,
            dtype=rec["spec_dtype"], mode=rec["spec_mode"],
        )
    except (ValueError, TypeError):
        return
    median = _lenient(rec.get("median_s"))
    rec["bytes_moved"] = str(spec.bytes_moved)
    rec["gbytes_per_s"] = str(spec.bytes_moved / median / 1e9) if median > 0 else ""


def _lenient(value: object) -> float:
    try:
        return float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return math.nan


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """An ``attnbench run`` directory (``measurements.csv`` + ``manifest.json``) as a tidy frame.

    Bad rows are rejected with a reason, and the row count is cross-checked with the manifest.
    """
    from attnbench.runs import LOG, MANIFEST, MEASUREMENTS

    run_dir = Path(run_dir)
    problems: list[str] = []
    notes: list[str] = []
    manifest = _read_manifest(run_dir / MANIFEST, problems)
    read = _read_rows(run_dir / MEASUREMENTS, problems)
    manifest = manifest or {}
    peaks = manifest.get("peak_gflops") or {}
    if not isinstance(peaks, dict):  # a single number: the float32 roof
        peaks = {"float32": peaks}
    gbps = manifest.get("peak_gbps")
    gbps = _lenient(gbps.get("triad") if isinstance(gbps, dict) else gbps)  # triad: the roofline's bandwidth roof
    rows: list[dict] = []
    if read is not None:
        _, records, in_file = read
        for number, rec in records:
            try:
                rows.extend(_run_row(rec, manifest, peaks, gbps if gbps > 0 else math.nan))
            except ValueError as exc:
                problems.append(f"{run_dir / MEASUREMENTS} row {number} ({rec.get('variant', '?')}): {exc}; rejected")
    else:
        in_file = 0
    cases, planned, complete = manifest.get("cases"), manifest.get("planned"), manifest.get("complete")
    if cases == in_file - 1 and read is not None and _logged_cases(run_dir) == in_file:
        # One write behind the log (the truth) and the rows: killed between writing the rows and the manifest.
        notes.append(f"{run_dir / MANIFEST} says {cases} case(s) but {run_dir / MEASUREMENTS} and {run_dir / LOG} hold "
                     f"{in_file}: the sweep stopped between writing its files (--resume rewrites the manifest)")
    elif cases is not None and cases != in_file and (read is not None or cases > 0):
        problems.append(f"{run_dir / MEASUREMENTS}: holds {in_file} row(s) but {run_dir / MANIFEST} says {cases} "
                        "case(s) were written (truncated or replaced)")
    if complete is False:
        notes.append(f"{run_dir}: incomplete ({cases if cases is not None else in_file} of "
                     f"{planned if planned is not None else '?'} cases): the sweep was stopped before the end")
    elif planned is not None and cases is not None and cases < planned and complete is not True:
        notes.append(f"{run_dir}: incomplete ({cases} of {planned} cases)")
    return _finish(rows, problems, notes)


def _logged_cases(run_dir: Path) -> int | None:
    """Cases in the run's append-only log (None when it has none or cannot be read)."""
    from attnbench.runs import LOG, read_log

    try:
        return len(read_log(run_dir / LOG).measurements) if (run_dir / LOG).is_file() else None
    except (OSError, ValueError):
        return None


def _kind(path: Path) -> str:
    """"asv", "run", or a sentence saying why ``path`` is neither (raises OSError when unreadable)."""
    if not path.exists():
        return "does not exist"
    if not path.is_dir():
        return "is a file, not a directory (pass an asv results directory or a run directory)"
    if not os.access(path, os.R_OK | os.X_OK):
        return "cannot be read (permission denied)"
    if (path / "benchmarks.json").exists():
        return "asv"
    if (path / "manifest.json").exists() or (path / "measurements.csv").exists():
        return "run"
    children = list(path.iterdir())
    if not children:
        return "is an empty directory"
    if any((c / "machine.json").exists() for c in children if c.is_dir()):
        return f"looks like asv results but has no benchmarks.json ({path / 'benchmarks.json'} missing)"
    return "neither an asv results directory (benchmarks.json) nor a run (manifest.json, measurements.csv)"


def load(sources: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate asv results directories and run directories (detected by their files).

    ``attrs``: ``problems`` (every bad source, file and row, by name), ``notes`` (incomplete runs)
    and ``sources`` (one ``{"path", "kind", "rows"}`` per source).
    """
    frames = []
    problems: list[str] = []
    notes: list[str] = []
    summary: list[dict] = []
    for src in sources:
        path = Path(src)
        if path.is_dir() and not (path / "benchmarks.json").exists() and (path / "results" / "benchmarks.json").exists():
            path = path / "results"  # the asv directory itself, e.g. .asv
        try:
            kind = _kind(path)
            frame = load_asv(path) if kind == "asv" else load_run(path) if kind == "run" else None
        except OSError as exc:
            kind, frame = f"cannot be read ({_why(exc)})", None
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
    out.attrs["problems"] = problems
    out.attrs["notes"] = notes
    out.attrs["sources"] = summary
    return out
