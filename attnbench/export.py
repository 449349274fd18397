"""attnbench's results in the formats other dashboards read: Bencher's and github-action-benchmark's.

* ``bmf``: the Bencher Metric Format (https://bencher.dev/docs/reference/bencher-metric-format): a JSON object of
  benchmarks, each an object of measures, each ``{"value": number, "lower_value": number, "upper_value": number}``
  (``value`` required). Time goes to Bencher's built-in ``latency`` measure, whose unit is nanoseconds; every other
  metric is a measure named after the metric with its unit (``instructions``, ``peak-tensor-bytes``), which Bencher
  creates on first use. The bounds are asv's 99% interval of the value, where asv has one (timed benchmarks).
* ``github-action-benchmark``: the ``customSmallerIsBetter`` tool's input
  (https://github.com/benchmark-action/github-action-benchmark): a JSON array of
  ``{"name": string, "unit": string, "value": number, "range": string, "extra": string}`` (``range`` and ``extra``
  optional), one entry per case and metric; the name carries the metric, the unit its unit.

One run (``--commit``, default the newest of the results). Only metrics where smaller is better are exported
(time, instruction counts, peak tensor bytes, FLOPs, page faults, peak RSS): both dashboards alert on a rise.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

import pandas as pd

from attnbench.analysis import history as steps_
from attnbench.contract import Status

FORMATS = ("bmf", "github-action-benchmark")
EXPORTED = {
    # metric: (BMF measure, unit named in the github-action-benchmark entry, factor from the tidy frame's unit)
    "time": ("latency", "ns", 1e9),
    "cuda_time": ("cuda-latency", "ns", 1e9),
    "instructions": ("instructions", "instructions", 1.0),
    "peak_tensor_bytes": ("peak-tensor-bytes", "bytes", 1.0),
    "flops": ("flops", "FLOP", 1.0),
    "page_faults": ("page-faults", "faults", 1.0),
    "peak_rss": ("peak-rss-bytes", "bytes", 1.0),
}
"""What is exported, and how it is named. BMF's ``latency`` is Bencher's built-in measure (nanoseconds)."""


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
            raise ExportError(f"--commit {commit!r} names {len(matches)} of the results' commits (they hold: {known})")
        chosen = matches[0]
    else:
        chosen = commits.index[-1]
    return frame[frame["commit"].fillna("") == chosen], chosen


def _name(rec: dict) -> str:
    """The case's name: ``attention/batched/L=256`` with the device, mode and mask where not cpu, forward, none."""
    return "attention/" + steps_.case_label(rec).replace(" ", "/")


def export(frame: pd.DataFrame, fmt: str, commit: str | None = None) -> Exported:
    """One run of ``frame`` (a tidy frame: :func:`attnbench.analysis.frame.load`) in format ``fmt`` (:data:`FORMATS`).

    Raises:
        ExportError: an unknown format, nothing exportable, or a ``commit`` the results do not hold exactly once.
    """
    if fmt not in FORMATS:
        raise ExportError(f"--format must be one of {', '.join(FORMATS)}, got {fmt!r}")
    rows = frame[frame["metric"].isin(list(EXPORTED)) & (frame["status"] == Status.OK)]
    if not len(rows):
        raise ExportError("nothing to export: no measured time, count, bytes, FLOPs or faults in the results")
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
            entry["extra"] = (f"commit {str(rec.get('commit') or '')[:10]} on {rec.get('machine', '')}; "
                              f"{rec.get('method', '')}").strip("; ")
            document.append(entry)
    return Exported(document=document, commit=chosen, entries=len(entries))


def dumps(exported: Exported) -> str:
    return json.dumps(exported.document, indent=1, allow_nan=False) + "\n"
