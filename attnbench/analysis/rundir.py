"""``attnbench run`` directories as tidy rows: the case log, cross-checked with the manifest.

A run's manifest and its rows are cross-checked (``cases`` = rows written); a run stopped on
purpose (``complete: false``) is listed in the notes as incomplete, not as corrupt. A row missing a
required value (its case's identity, its status, an ok case's time) is rejected, never kept as an
ok row holding 0 or NaN. :func:`attnbench.analysis.frame.load` reads run directories with
:func:`load_run`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path

from attnbench import contract
from attnbench.analysis.text import sig
from attnbench.analysis.tidy import Read, check_value, finish, spec_columns
from attnbench.contract import Method, Source, Status
from attnbench.io import error_line
from attnbench.measure.record import Measurement
from attnbench.rundir_format import LOG, LOG_SCHEMA, MANIFEST, MANIFEST_SCHEMA, case_key, read_log

__all__ = ["KEEPS_VALUES", "MAX_INPUT_BYTES", "ROOF_RATES", "flag_above_roof", "load_run"]

_MEMORY_METHODS = {"analytic": Method.MODEL}  # older files called the prediction "analytic"
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
            check_value(metric.name, _lenient(contract.metric_value(m, metric.field)))
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
        **spec_columns(spec),
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
        # "8/8": the (batch, head) slices the answer check compared, of all there were
        "checked_slices": str(m.extra.get("checked_slices", "")),
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
            # not measured (e.g. RSS switched off): no row, never an ok NaN; a count tried and
            # failed keeps a row with its status and reason (the report says why)
            out += _missing_row(base, metric, m.extra.get(f"{metric.name}_note"))
            continue
        method = metric.method
        if method.startswith("<"):
            method = getattr(m, method[1:]) or "unrecorded"
            method = _MEMORY_METHODS.get(method, method)
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


def _missing_row(base: dict, metric: contract.Metric, note: object) -> list[dict]:
    """The row of a metric that was tried but not taken, from its note ("error: why" or
    "skipped: why", :func:`attnbench.measure.record.attach`); none without a note."""
    status, _, reason = str(note or "").partition(": ")
    if status not in set(Status) or Status(status) == Status.OK:
        return []
    return [
        {
            **base,
            "metric": metric.name,
            "unit": metric.unit,
            "method": metric.method,
            "value": math.nan,
            "spread": math.nan,
            "status": Status(status),
            "reason": reason,
        }
    ]


def _read_run_log(run_dir: Path, problems: list[str]):
    """The run's case log, or None when nothing of it can be read (why: in ``problems``)."""
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


def load_run(run_dir: str | Path) -> Read:
    """An ``attnbench run`` directory as a tidy frame, read from its case log (``cases.jsonl``).

    ``manifest.json`` only adds its claims to check: the count of cases written, whether the sweep
    finished. ``measurements.csv`` is an export for people and is not read. Unusable log lines and
    cases are rejected with the reason.
    """
    run_dir = Path(run_dir)
    problems: list[str] = []
    notes: list[str] = []
    log = _read_run_log(run_dir, problems)
    if log is None:
        return finish([], problems, notes)
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
    return finish(rows, problems, notes)


def _distinct_cases(
    log_path: Path, measurements: Sequence[Measurement], problems: list[str]
) -> list[tuple[int, Measurement]]:
    """``(number in the log, case)`` once per case: a case logged twice keeps its last."""
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
