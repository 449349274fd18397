"""attnbench's results in the formats Bencher and github-action-benchmark read.

* ``bmf``: the Bencher Metric Format (https://bencher.dev/docs/reference/bencher-metric-format): an
  object of benchmarks, each an object of measures ``{"value", "lower_value", "upper_value"}`` (only
  ``value`` required). Time goes to Bencher's built-in ``latency`` measure (nanoseconds); any other
  metric is a measure named after it (``instructions``, ``peak-tensor-bytes``), which Bencher
  creates on first use. The bounds are asv's 99% interval of the value, where asv has one.
* ``github-action-benchmark``: the ``customSmallerIsBetter`` tool's input
  (https://github.com/benchmark-action/github-action-benchmark): an array of ``{"name", "unit",
  "value"}`` with optional ``range`` and ``extra``, one entry per case and metric.

One run (``--commit``, default the newest of the results). Only metrics where smaller is better
are exported (time, instruction counts, peak tensor bytes, FLOPs, page faults, peak RSS): both
dashboards alert on a rise. How cost grows is exported too (:func:`exponent_entries`): each case's
exponent of L per exact metric, so a dashboard charts the growth, not only the size.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from attnbench.analysis import growth
from attnbench.analysis import history as steps_
from attnbench.contract import Status

FORMATS = ("bmf", "github-action-benchmark")
EXPORTED = {
    # metric: (BMF measure, github-action-benchmark's unit, factor from the tidy frame's unit)
    "time": ("latency", "ns", 1e9),
    "cuda_time": ("cuda-latency", "ns", 1e9),
    "instructions": ("instructions", "instructions", 1.0),
    "peak_tensor_bytes": ("peak-tensor-bytes", "bytes", 1.0),
    "flops": ("flops", "FLOP", 1.0),
    "page_faults": ("page-faults", "faults", 1.0),
    "peak_rss": ("peak-rss-bytes", "bytes", 1.0),
}
"""What is exported, and how it is named (BMF's ``latency``: Bencher's built-in measure, in ns)."""


class ExportError(ValueError):
    """Nothing to export, or a commit that is not in the results (a usage error: exit 2)."""


@dataclass(frozen=True)
class Exported:
    """What :func:`export` produced."""

    document: object  # the JSON document (a dict for bmf, a list for github-action-benchmark)
    commit: str  # the commit exported ("" for a run directory)
    entries: int  # case x metric pairs written


def _pick(frame: pd.DataFrame, commit: str | None) -> tuple[pd.DataFrame, str]:
    commits = frame.groupby(frame["commit"].fillna(""))["date"].min().sort_values()
    if commit:
        matches = [c for c in commits.index if c and c.startswith(commit)]
        if len(matches) != 1:
            known = ", ".join(c[:10] for c in commits.index if c) or "none"
            raise ExportError(
                f"--commit {commit!r} names {len(matches)} of the results' commits "
                f"(they hold: {known})"
            )
        chosen = matches[0]
    else:
        chosen = commits.index[-1]
    return frame[frame["commit"].fillna("") == chosen], chosen


def _name(rec: dict) -> str:
    """The case's name, ``attention/batched/L=256`` (plus device, mode, mask where not default)."""
    return "attention/" + steps_.case_label(rec).replace(" ", "/")


def export(frame: pd.DataFrame, fmt: str, commit: str | None = None) -> Exported:
    """One run of the tidy ``frame`` (:func:`attnbench.analysis.frame.load`) in format ``fmt``.

    Raises:
        ExportError: a format not in :data:`FORMATS`, nothing exportable, or a ``commit`` the
            results do not hold exactly once.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    rows = frame[frame["metric"].isin(list(EXPORTED)) & (frame["status"] == Status.OK)]
    if not len(rows):
        raise ExportError(
            "nothing to export: no measured time, count, bytes, FLOPs or faults in the results"
        )
    rows, chosen = _pick(rows, commit)
    rows = rows.drop_duplicates([*steps_.CASE, "metric"], keep="last")
    entries = []
    for rec in rows.to_dict("records"):
        measure, unit, factor = EXPORTED[rec["metric"]]
        value = float(rec["value"]) * factor
        lower, upper = (float(rec.get(k, math.nan)) * factor for k in ("ci_low", "ci_high"))
        if not (math.isfinite(lower) and math.isfinite(upper) and lower <= value <= upper):
            lower = upper = math.nan
        entries.append((_name(rec), rec, measure, unit, value, lower, upper))
    entries += exponent_entries(rows)
    if fmt == "bmf":
        document: dict = {}
        for name, _, measure, _, value, lower, upper in entries:
            metric = {"value": value}
            if math.isfinite(lower):
                metric |= {"lower_value": lower, "upper_value": upper}
            document.setdefault(name, {})[measure] = metric
    else:
        document = []
        for name, rec, _, unit, value, lower, upper in entries:
            entry = {"name": f"{name} {rec['metric']}", "unit": unit, "value": value}
            if math.isfinite(lower):
                entry["range"] = f"± {(upper - lower) / 2:.4g}"  # half asv's 99% interval
            entry["extra"] = (
                f"commit {str(rec.get('commit') or '')[:10]} on {rec.get('machine', '')}; "
                f"{rec.get('method', '')}"
            ).strip("; ")
            document.append(entry)
    return Exported(document=document, commit=chosen, entries=len(entries))


EXPONENT_MEASURE = "exponent"
"""The BMF measure (and github-action-benchmark's metric word) of a fitted exponent of L."""
EXPONENT_UNIT = "exponent of L"


def exponent_entries(rows: pd.DataFrame) -> list[tuple]:
    """The exponent of every case's exact metric along L, as entries of :func:`export`.

    Benchmark ``attention/chunked/peak-tensor-bytes`` (the case without its length, then the
    metric's measure), measure ``exponent``; the bounds are the fit's range, the least and largest
    local slope over the lengths fitted (:func:`attnbench.analysis.growth.exponent_series`).
    """
    entries = []
    for rec in growth.exponent_series(rows).to_dict("records"):
        case = {**rec, "seq_len": None, "seq_len_k": None}
        name = f"{_name(case)}/{EXPORTED[rec['metric']][0]}"
        value = rec["exponent"]  # the least-squares slope: within its local slopes but rounding
        lower, upper = min(rec["low"], value), max(rec["high"], value)
        fitted = f"fitted over L={rec['shortest']}..{rec['longest']}"
        shown = {**case, "metric": EXPONENT_MEASURE, "method": fitted}
        entries.append((name, shown, EXPONENT_MEASURE, EXPONENT_UNIT, value, lower, upper))
    return entries


def dumps(exported: Exported) -> str:
    return json.dumps(exported.document, indent=1, allow_nan=False) + "\n"
