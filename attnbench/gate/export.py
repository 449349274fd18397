"""attnbench's results in the formats Bencher and github-action-benchmark read.

* ``bmf``: the Bencher Metric Format (https://bencher.dev/docs/reference/bencher-metric-format): an
  object of benchmarks, each an object of measures ``{"value", "lower_value", "upper_value"}`` (only
  ``value`` required). Time goes to Bencher's built-in ``latency`` measure (nanoseconds); any other
  metric is a measure named after it (``instructions``, ``peak-tensor-bytes``), which Bencher
  creates on first use. The bounds are asv's 99% interval of the value, where asv has one.
* ``github-action-benchmark``: the ``customSmallerIsBetter`` tool's input
  (https://github.com/benchmark-action/github-action-benchmark): an array of ``{"name", "unit",
  "value"}`` with optional ``range`` and ``extra``, one entry per case and metric.

Names: ``attention/<variant>/L=<n>`` (plus device, mode and mask where not the default, and the
asv class of another shape, ``(Decode)``). Where that would give two different cases of the export
(:func:`attnbench.contract.case_key`) one name, every name also carries the identity columns that
tell them apart (``attention/sdpa/L=16/bfloat16``, ``.../D=16``, ``.../machine=box2``): both
dashboards key on the name, and a clash would silently keep one value.

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

from attnbench import contract
from attnbench.analysis import changes, growth
from attnbench.contract import Status
from attnbench.errors import UsageError

__all__ = [
    "EXPONENT_MEASURE",
    "EXPONENT_UNIT",
    "EXPORTED",
    "FORMATS",
    "ExportError",
    "Exported",
    "dumps",
    "exponent_entries",
    "export",
]

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


class ExportError(ValueError, UsageError):
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
    return "attention/" + changes.case_label(rec).replace(" ", "/")


_TAGS = {
    "seq_len": "Lq=",
    "seq_len_k": "Lk=",
    "batch": "B=",
    "heads": "H=",
    "kv_heads": "Hkv=",
    "head_dim": "D=",
    "machine": "machine=",
}
"""How an identity column reads in a name where it is needed (others, dtype or workload: bare)."""


def _names(records: list[dict]) -> list[str]:
    """Each record's name: :func:`_name`, plus every identity column that tells apart two records
    :func:`_name` alone would give one name (``.../L=16/bfloat16``, ``.../L=16/D=16``).

    A column is added to every name of the export or to none, so a case's name depends only on
    which columns vary between clashing cases, and an export without clashes keeps the short names.

    Raises:
        ExportError: two different cases still share a name (two benchmarks of one case).
    """
    base = [(_name(rec), rec["metric"]) for rec in records]
    keys = [contract.case_key(rec) for rec in records]
    groups: dict[tuple[str, str], list[int]] = {}
    for i, name in enumerate(base):
        groups.setdefault(name, []).append(i)
    # identity columns that differ within a group of one name (key index -> column)
    needed = [
        (k, col)
        for k, col in enumerate(contract.CASE_IDENTITY)
        if any(len({keys[i][k] for i in group}) > 1 for group in groups.values())
    ]
    names = []
    for i, (name, _) in enumerate(base):
        head, grid = (name.rsplit("/", 1) + [""])[:2] if name.endswith(")") else (name, "")
        extra = [f"{_TAGS.get(col, '')}{keys[i][k]}" for k, col in needed]
        names.append("/".join([head, *extra, *([grid] if grid else [])]))  # the grid stays last
    seen: dict[tuple[str, str], int] = {}
    for i, name in enumerate(names):
        j = seen.setdefault((name, records[i]["metric"]), i)
        if j != i:
            raise ExportError(
                f"two results would share the name {name!r} ({records[i]['metric']}): "
                f"{records[j].get('benchmark')} and {records[i].get('benchmark')}; export them "
                "separately"
            )
    return names


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
    rows = rows.assign(_case=[contract.case_key(r) for r in rows.to_dict("records")])
    rows = rows.drop_duplicates(["benchmark", "_case", "metric"], keep="last").drop(columns="_case")
    records = rows.to_dict("records")
    entries = []
    for name, rec in zip(_names(records), records, strict=True):
        measure, unit, factor = EXPORTED[rec["metric"]]
        value = float(rec["value"]) * factor
        lower, upper = (float(rec.get(k, math.nan)) * factor for k in ("ci_low", "ci_high"))
        if not (math.isfinite(lower) and math.isfinite(upper) and lower <= value <= upper):
            lower = upper = math.nan
        entries.append((name, rec, measure, unit, value, lower, upper))
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
    series = growth.exponent_series(rows).to_dict("records")
    cases = [{**rec, "seq_len": None, "seq_len_k": None} for rec in series]
    entries = []
    for case_name, rec, case in zip(_names(cases), series, cases, strict=True):
        name = f"{case_name}/{EXPORTED[rec['metric']][0]}"
        value = rec["exponent"]  # the least-squares slope: within its local slopes but rounding
        lower, upper = min(rec["low"], value), max(rec["high"], value)
        fitted = f"fitted over L={rec['shortest']}..{rec['longest']}"
        shown = {**case, "metric": EXPONENT_MEASURE, "method": fitted}
        entries.append((name, shown, EXPONENT_MEASURE, EXPONENT_UNIT, value, lower, upper))
    return entries


def dumps(exported: Exported) -> str:
    return json.dumps(exported.document, indent=1, allow_nan=False) + "\n"
