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
metric         time | peak_tensor_bytes | peak_rss | gflops | flops | max_error | softmax_error | cuda_time
               | compile_time
unit           s | bytes | GFLOP/s | FLOP | abs
value          float; NaN unless status == "ok"
spread         IQR of the timing samples (asv: q75 - q25), NaN when unknown
ci_low         lower end of asv's 99% interval of the value (NaN for runs)
ci_high        upper end of asv's 99% interval of the value (NaN for runs)
status         ok | skipped | failed (asv) ; ok | skipped | oom | timeout | error (run)
reason         why a case is not ok ("" for asv, which does not keep skip reasons)
kernel         SDPA backend(s) that actually ran, read from the profiler ("" when not recorded)
machine        machine name (asv machine name, run hostname)
cpu            CPU model
gpu            GPU name ("" for none)
commit         git commit hash ("" when unknown)
date           pandas Timestamp (UTC) of the commit (asv) or of the run
torch          torch version
threads        torch threads (NaN for asv, which does not record it)
peak_gflops    this machine's matmul GFLOP/s at the row's dtype when recorded, else NaN
============== =====================================================================

Stale asv rows (a result whose benchmark ``version`` differs from ``benchmarks.json``) are dropped;
skipped and failed cases are kept as statuses, never as zeros. A results file that cannot be read is
reported in ``frame.attrs["problems"]`` by name and skipped; the rest still loads.
"""

from __future__ import annotations

import ast
import datetime as dt
import itertools
import json
import math
from collections.abc import Iterable
from pathlib import Path

import pandas as pd

from attnbench.spec import AttnSpec

COLUMNS = [
    "source", "benchmark", "variant", "seq_len", "seq_len_k", "device", "mode", "dtype", "batch", "heads",
    "head_dim", "mask", "metric", "unit", "value", "spread", "ci_low", "ci_high", "status", "reason", "machine", "cpu", "gpu",
    "commit", "date", "torch", "threads", "peak_gflops", "kernel",
]
UNITS = {
    "time": "s", "cuda_time": "s", "compile_time": "s", "peak_tensor_bytes": "bytes", "peak_rss": "bytes", "gflops": "GFLOP/s",
    "max_error": "abs", "softmax_error": "abs", "flops": "FLOP",
}
# asv method name -> (metric, factor to the metric's unit)
ASV_METRICS = {
    "time_attention": ("time", 1.0),
    "peakmem_attention": ("peak_rss", 1.0),
    "track_peak_tensor_bytes": ("peak_tensor_bytes", 1.0),
    "track_gflops": ("gflops", 1.0),
    "track_flops": ("flops", 1.0),
    "track_cuda_ms": ("cuda_time", 1e-3),
    "track_max_error": ("max_error", 1.0),
}
PEAK_BENCHMARK = "track_matmul_gflops"
BASE_SPEC = AttnSpec(batch=1, heads=8, head_dim=64)  # the asv suite's fixed shape


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


def _finish(rows: list[dict], problems: list[str]) -> pd.DataFrame:
    frame = pd.DataFrame(rows, columns=COLUMNS) if rows else _empty()
    for col in ("value", "spread", "ci_low", "ci_high", "threads", "peak_gflops"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in ("seq_len", "seq_len_k", "batch", "heads", "head_dim"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    frame["date"] = pd.to_datetime(frame["date"], utc=True, errors="coerce")
    frame.attrs["problems"] = problems
    return frame


# ---- asv -------------------------------------------------------------------------------------
def _decode(value: str) -> object:
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value


def _asv_status(value: object) -> str:
    if value is None:
        return "failed"
    if isinstance(value, float) and math.isnan(value):
        return "skipped"
    return "ok"


def load_asv(results_dir: str | Path) -> pd.DataFrame:
    """Every machine, commit and environment under an asv ``results`` directory, as one tidy frame."""
    from asv import util
    from asv.results import Results

    results_dir = Path(results_dir)
    problems: list[str] = []
    try:
        benchmarks = util.load_json(str(results_dir / "benchmarks.json"), api_version=2)
    except (OSError, util.UserError, ValueError) as exc:
        return _finish([], [f"{results_dir / 'benchmarks.json'}: {exc}"])
    rows: list[dict] = []
    for machine_dir in sorted(p for p in results_dir.iterdir() if p.is_dir()):
        try:
            machine = json.loads((machine_dir / "machine.json").read_text())
        except (OSError, ValueError) as exc:
            problems.append(f"{machine_dir / 'machine.json'}: {exc}")
            continue
        for path in sorted(machine_dir.glob("*.json")):
            if path.name == "machine.json":
                continue
            try:
                res = Results.load(str(path))
            except (util.UserError, ValueError, KeyError, TypeError, OSError) as exc:
                problems.append(f"{path}: {exc}")
                continue
            rows.extend(_asv_rows(res, benchmarks, machine))
    return _finish(rows, problems)


def _asv_rows(res, benchmarks: dict, machine: dict) -> Iterable[dict]:
    date = dt.datetime.fromtimestamp(res.date / 1e3, tz=dt.timezone.utc) if res.date else None
    common = {
        "source": "asv", "machine": res.params.get("machine", machine.get("machine", "")),
        "cpu": machine.get("cpu", ""), "gpu": "", "commit": res.commit_hash or "", "date": date,
        "torch": res.params.get("torch", "") or res.params.get("req-torch", ""), "threads": math.nan,
        "reason": "", "kernel": "",
    }
    keys = res.get_result_keys(benchmarks)  # drops stale versions
    peak = math.nan
    peak_key = next((k for k in keys if k.endswith(PEAK_BENCHMARK)), None)
    if peak_key is not None:
        value = res.get_result_value(peak_key, [])
        peak = value[0] if isinstance(value, list) and value and value[0] is not None else math.nan
    for key in sorted(keys):
        method = key.rsplit(".", 1)[-1]
        if method not in ASV_METRICS:
            continue
        metric, factor = ASV_METRICS[method]
        params = res.get_result_params(key)
        names = benchmarks[key].get("param_names", [])
        values = res.get_result_value(key, params)
        stats = res.get_result_stats(key, params) or [None] * len(values)
        for combo, value, stat in zip(itertools.product(*params), values, stats, strict=False):
            case = dict(zip(names, (_decode(p) for p in combo), strict=False))
            status = _asv_status(value)
            stat = stat or {}
            spread = (stat["q_75"] - stat["q_25"]) * factor if "q_25" in stat and "q_75" in stat else math.nan
            ci_low = stat["ci_99_a"] * factor if "ci_99_a" in stat else math.nan
            ci_high = stat["ci_99_b"] * factor if "ci_99_b" in stat else math.nan
            spec = BASE_SPEC.replace(seq_len=case.get("seq_len", 0), device=case.get("device", "cpu"), mode=case.get("mode", "forward"))
            yield {
                **common, "benchmark": key, "variant": case.get("variant", ""),
                **_spec_columns(spec), "metric": metric, "unit": UNITS[metric],
                "value": value * factor if status == "ok" else math.nan, "spread": spread,
                "ci_low": ci_low, "ci_high": ci_high,
                "status": status, "peak_gflops": peak,
            }


def _spec_columns(spec: AttnSpec) -> dict:
    return {
        "seq_len": spec.lq, "seq_len_k": spec.lk, "device": spec.device_type, "mode": spec.mode,
        "dtype": spec.dtype, "batch": spec.batch, "heads": spec.heads, "head_dim": spec.head_dim, "mask": spec.mask,
    }


# ---- attnbench run ---------------------------------------------------------------------------
RUN_METRICS = {
    "time": ("median_s", "iqr_s"),
    "peak_tensor_bytes": ("peak_tensor_bytes", None),
    "peak_rss": ("peak_rss_bytes", None),
    "gflops": ("gflops_per_s", None),
    "max_error": ("max_error", None),
    "softmax_error": ("softmax_error", None),
    "compile_time": ("compile_s", None),
}


def load_run(run_dir: str | Path) -> pd.DataFrame:
    """An ``attnbench run`` directory (``measurements.csv`` + ``manifest.json``) as a tidy frame."""
    from attnbench.runs import MANIFEST, MEASUREMENTS

    run_dir = Path(run_dir)
    try:
        manifest = json.loads((run_dir / MANIFEST).read_text())
        wide = pd.read_csv(run_dir / MEASUREMENTS, keep_default_na=True)
    except (OSError, ValueError, pd.errors.ParserError) as exc:
        return _finish([], [f"{run_dir}: {exc}"])
    peaks = manifest.get("peak_gflops") or {}
    if not isinstance(peaks, dict):  # a single number: the float32 roof
        peaks = {"float32": peaks}
    rows = []
    for rec in wide.to_dict("records"):
        common = {
            "source": "run", "benchmark": "attnbench.run", "variant": rec["variant"],
            "seq_len": rec["spec_seq_len"], "seq_len_k": rec.get("seq_len_k_eff", rec["spec_seq_len"]),
            "device": str(rec["spec_device"]).split(":")[0], "mode": rec["spec_mode"], "dtype": rec["spec_dtype"],
            "batch": rec["spec_batch"], "heads": rec["spec_heads"], "head_dim": rec["spec_head_dim"],
            "mask": rec["spec_mask"], "status": rec["status"],
            "reason": "" if pd.isna(rec.get("reason")) else str(rec.get("reason")),
            "machine": rec.get("env_hostname", ""), "cpu": rec.get("env_cpu_model", ""),
            "gpu": "" if pd.isna(rec.get("env_gpu_name")) else rec.get("env_gpu_name", ""),
            "commit": "" if pd.isna(rec.get("env_commit")) else str(rec.get("env_commit", "")),
            "date": manifest.get("created"), "torch": rec.get("env_torch", ""),
            "threads": rec.get("env_threads", math.nan), "peak_gflops": peaks.get(rec["spec_dtype"], math.nan),
            "kernel": "" if pd.isna(rec.get("extra_kernel", math.nan)) else str(rec["extra_kernel"]),
        }
        for metric, (col, spread_col) in RUN_METRICS.items():
            if col not in rec:
                continue
            ok = rec["status"] == "ok" and not pd.isna(rec[col])
            if metric in ("softmax_error", "compile_time") and not ok:
                continue  # only approximate (compiled) variants carry it
            rows.append({
                **common, "metric": metric, "unit": UNITS[metric], "value": rec[col] if ok else math.nan,
                "spread": rec[spread_col] if spread_col and ok else math.nan,
                "ci_low": math.nan, "ci_high": math.nan,
            })
    return _finish(rows, [])


def load(sources: Iterable[str | Path]) -> pd.DataFrame:
    """Concatenate asv results directories and run directories (detected by their files)."""
    frames = []
    problems: list[str] = []
    for src in sources:
        path = Path(src)
        if (path / "benchmarks.json").exists():
            frame = load_asv(path)
        elif (path / "manifest.json").exists():
            frame = load_run(path)
        else:
            problems.append(f"{path}: neither an asv results directory (benchmarks.json) nor a run (manifest.json)")
            continue
        problems.extend(frame.attrs.get("problems", []))
        frames.append(frame)
    frames = [f for f in frames if len(f)]
    out = pd.concat(frames, ignore_index=True) if frames else _finish([], [])
    out.attrs["problems"] = problems
    return out
