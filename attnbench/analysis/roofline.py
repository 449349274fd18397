"""Place every measured case on the roofline of the machine that measured it.

For each ``ok`` case with a measured time: its arithmetic intensity ``AI = flops_executed /
bytes_moved``, where ``bytes_moved`` is an ideal kernel's traffic (inputs read and output written
once; backward adds its reads and gradient writes): a property of the case, so AI is exact for an
ideal kernel and an upper bound for one that re-reads its inputs or spills its scores. Then its
achieved FLOP/s and GB/s, and the attainable roof ``min(peak FLOP/s, AI x bandwidth)`` from the
machine's measured matmul peak at the case's dtype and STREAM triad bandwidth: which roof binds
(``compute`` at or above the ridge ``peak / bandwidth``, else ``bandwidth``) and the case's share of
it. Prefill's AI grows with L (compute-bound at long L); decode's stays near 1 FLOP/byte
(bandwidth-bound). A rate that is missing or not a measurement (method "model") is never placed; a
machine without a recorded bandwidth gets AI and % of the compute roof, but no binding roof.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from attnbench import contract
from attnbench.analysis.complexity import MODEL
from attnbench.contract import Status

__all__ = ["COLUMNS", "roofline"]

_CASE = contract.case_columns(
    ("source", "origin", "machine", "commit", "device", "mode", "dtype", *contract.SHAPE, "mask")
)
"""The columns that name one case, whose run first (``kv_heads`` and ``workload`` only when the
frame has them)."""
COLUMNS = [
    *_CASE,
    "flops",
    "bytes",
    "ai",
    "gflops",
    "gbps",
    "peak_gflops",
    "peak_gbps",
    "ridge_ai",
    "roof_gflops",
    "bound",
    "pct_of_roof",
    "pct_of_compute",
    "pct_of_bandwidth",
]
_COMPUTE, _BANDWIDTH = "compute", "bandwidth"


def _metric(frame: pd.DataFrame, metric: str, keys: list[str], measured: bool) -> pd.Series:
    """Median value of ``metric`` per case among ``ok`` rows (measured: method is not "model")."""
    rows = frame[
        (frame["metric"] == metric) & (frame["status"] == Status.OK) & frame["value"].notna()
    ]
    if measured and "method" in rows:
        rows = rows[rows["method"] != MODEL]
    return rows.groupby(keys, dropna=False)["value"].median()


def roofline(frame: pd.DataFrame) -> pd.DataFrame:
    """One row per ``ok`` timed case: AI, achieved GFLOP/s and GB/s, roofs, % of the binding one.

    Args:
        frame: the tidy frame (:mod:`attnbench.analysis.frame`); the ``bytes`` metric (bytes moved
            by the ideal kernel) and the ``peak_gbps`` column come with runs that record them.

    Returns:
        :data:`COLUMNS`: ``flops`` executed, ``bytes`` moved, ``ai`` (FLOP/byte), achieved
        ``gflops`` and ``gbps``, the machine's ``peak_gflops`` and ``peak_gbps`` (NaN when not
        recorded), the ``ridge_ai`` where the roofs meet, the attainable ``roof_gflops``, ``bound``
        ("compute", "bandwidth", or "" without a bandwidth), ``pct_of_roof`` (of the binding roof)
        and the percentages of each roof alone. Empty (with those columns) when nothing can be
        placed.
    """
    if frame.empty:
        return pd.DataFrame(columns=COLUMNS)
    frame = frame.assign(
        workload=frame.get("workload", pd.Series("prefill", index=frame.index)).fillna("prefill")
    )
    keys = [c for c in _CASE if c in frame]
    # NaN keys group too
    frame = frame.assign(**{c: frame[c].astype(object).where(frame[c].notna(), "") for c in keys})
    table = _measured(frame, keys)
    if table.empty:
        return pd.DataFrame(columns=COLUMNS)
    table = _against_roofs(table.join(_roofs(frame, keys)).reset_index())
    for col in _CASE:
        if col not in table:
            table[col] = math.nan
    return (
        table[COLUMNS]
        .sort_values(["workload", "variant", "seq_len_k", "seq_len"], kind="stable")
        .reset_index(drop=True)
    )


def _measured(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per case: median time, achieved GFLOP/s, bytes moved and executed FLOPs (timed cases)."""
    time = _metric(frame, "time", keys, measured=True)
    gflops = _metric(frame, "gflops", keys, measured=True)
    moved = _metric(frame, "bytes", keys, measured=False)
    counted = _metric(frame, "flops", keys, measured=False)
    table = pd.DataFrame({"time": time, "gflops": gflops}).dropna(subset=["time", "gflops"])
    if table.empty:
        return table
    table = table.join(moved.rename("bytes")).join(counted.rename("flops_counted"))
    # (executed FLOPs)
    table["flops"] = table["flops_counted"].fillna(table["gflops"] * 1e9 * table["time"])
    return table


def _roofs(frame: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Per case: the machine's recorded ``peak_gflops`` and ``peak_gbps`` (NaN: not recorded)."""
    if "peak_gbps" not in frame:
        return (
            frame.groupby(keys, dropna=False)[["peak_gflops"]].median().assign(peak_gbps=math.nan)
        )
    timed = frame[frame["metric"].isin(("time", "gflops"))]
    return timed.groupby(keys, dropna=False)[["peak_gflops", "peak_gbps"]].median()


def _against_roofs(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with its intensity, GB/s, ridge, attainable and binding roof, and percentages."""
    table["ai"] = table["flops"] / table["bytes"]
    table["gbps"] = table["bytes"] / table["time"] / 1e9
    table["ridge_ai"] = table["peak_gflops"] / table["peak_gbps"]
    by_bandwidth = table["ai"] * table["peak_gbps"]  # GFLOP/s the bandwidth allows at this AI
    table["roof_gflops"] = np.fmin(table["peak_gflops"], by_bandwidth)
    known = by_bandwidth.notna() & table["peak_gflops"].notna()
    table["bound"] = np.where(
        ~known, "", np.where(table["peak_gflops"] <= by_bandwidth, _COMPUTE, _BANDWIDTH)
    )
    table["pct_of_roof"] = np.where(known, 100.0 * table["gflops"] / table["roof_gflops"], math.nan)
    table["pct_of_compute"] = 100.0 * table["gflops"] / table["peak_gflops"]
    table["pct_of_bandwidth"] = 100.0 * table["gbps"] / table["peak_gbps"]
    return table
