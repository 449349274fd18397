"""The tidy frame's columns and how every reader finishes one (asv results, run directories).

Every loader returns :data:`COLUMNS`, in that order: one row per case and metric (the README's
"Reading the numbers" describes each column).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from attnbench import contract
from attnbench.spec import AttnSpec

__all__ = ["COLUMNS", "Read", "check_value", "empty_frame", "finish", "spec_columns"]

COLUMNS = [
    "source",
    "benchmark",
    # the case (its machine sits with the provenance below)
    *contract.case_columns(
        (
            "variant",
            *contract.LENGTHS,
            "device",
            "mode",
            "dtype",
            "batch",
            "heads",
            "head_dim",
            "mask",
            "kv_heads",
        ),
        without=("machine",),
    ),
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
    "checked_slices",
    "run_date",
    "origin",
]


def empty_frame() -> pd.DataFrame:
    """A frame of :data:`COLUMNS` and no row."""
    return pd.DataFrame({c: pd.Series(dtype=object) for c in COLUMNS})


@dataclass(frozen=True)
class Read:
    """What a loader read: the tidy frame, and what it could not use (never raised)."""

    frame: pd.DataFrame  # COLUMNS, one row per case and metric
    problems: tuple[str, ...] = ()  # every bad source, file and row, by name, with the reason
    notes: tuple[str, ...] = ()  # facts worth knowing that are not faults (e.g. incomplete runs)
    sources: tuple[dict, ...] = ()  # one {"path", "kind", "rows"} per source (load only)


def finish(rows: list[dict], problems: list[str], notes: list[str] | None = None) -> Read:
    frame = pd.DataFrame(rows, columns=COLUMNS) if rows else empty_frame()
    for col in ("value", "spread", "ci_low", "ci_high", "threads", "peak_gflops", "peak_gbps"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce")
    for col in ("seq_len", "seq_len_k", "batch", "heads", "head_dim", "kv_heads"):
        frame[col] = pd.to_numeric(frame[col], errors="coerce").astype("Int64")
    for col in ("date", "run_date"):
        frame[col] = pd.to_datetime(frame[col], utc=True, errors="coerce")
    return Read(frame, tuple(problems), tuple(notes or ()))


def check_value(metric: str, value: object) -> None:
    """Raise ValueError for a value no measurement of ``metric`` holds (NaN, None: not measured)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return
    if not math.isfinite(value) or value < 0 or (metric == "time" and value == 0):
        raise ValueError(
            f"{metric} {value!r} is not a {'time > 0' if metric == 'time' else 'finite value >= 0'}"
        )


def spec_columns(spec: AttnSpec) -> dict:
    """The tidy columns a case's spec fills."""
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
