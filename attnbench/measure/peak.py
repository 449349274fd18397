"""This machine's matmul FLOP/s: the roof that achieved attention FLOP/s is compared with.

Cached per (device, dtype, threads, torch) in ``matmul_peaks.json`` under
:func:`attnbench.io.cache_dir`, so reports can show "% of peak" and the time guard can predict
without re-measuring every time. A measurement taken while the machine is busy is low (one thread
beside other work gets a share of a core), and a single cached value would keep it forever. So the
cache keeps several measurements, each with when and under what load it was taken, and the peak is
the best of those younger than :data:`STALE_S`: a busy measurement can only be outvoted, never
poison the figure. Another measurement is added on use while fewer than :data:`_MIN_SAMPLES` fresh
ones exist (at most one per :data:`_SPACING_S`, so they come from different moments).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from attnbench.io import cache_dir, read_json_cache, write_json_cache
from attnbench.measure.timer import TimerConfig, time_call, time_once
from attnbench.spec import DTYPES

__all__ = ["cache_path", "measure_matmul_peak", "STALE_S", "KEEP", "matmul_peak"]


def cache_path() -> Path:
    """Where the matmul measurements are kept (``peak.json`` held single numbers: not read)."""
    return cache_dir() / "matmul_peaks.json"


def _key(device: str, dtype: str) -> str:
    return f"{device}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


_MAX_SIDE = 2048
_CALL_TARGET_S = 0.1
"""The matmul doubles from 256 (up to :data:`_MAX_SIDE`) while its next size's call fits in this."""


def measure_matmul_peak(device: str = "cpu", dtype: str = "float32", n: int | None = None) -> float:
    """Median FLOP/s of an ``n x n @ n x n`` matmul on random inputs (2 n^3 FLOPs per call).

    ``n`` defaults to the largest power of two up to :data:`_MAX_SIDE` whose call takes about
    :data:`_CALL_TARGET_S` at most: a dtype the hardware has no fast path for (bfloat16 on many
    CPUs) is measured in a second, not in minutes.
    """
    gen = torch.Generator().manual_seed(0)

    def matmul(side: int) -> Callable[[], torch.Tensor]:
        a, b = (
            torch.randn(side, side, generator=gen).to(device=device, dtype=DTYPES[dtype])
            for _ in range(2)
        )
        return lambda: a @ b

    if n is None:
        n = 256
        while n < _MAX_SIDE:
            call = matmul(n)
            time_once(call, device)  # warm-up
            if 8 * time_once(call, device) > _CALL_TARGET_S:  # twice the side: 8x the work
                break
            n *= 2
    samples, _ = time_call(
        matmul(n), device, TimerConfig(warmup=2, min_runs=5, min_time=0.5, max_time=5.0)
    )
    return 2 * n**3 / statistics.median(samples)


_MIN_SAMPLES = 3
"""Fresh measurements the cache collects per key before it stops measuring on use."""
_SPACING_S = 60.0
"""Seconds between two measurements added on use (a busy minute should not fill the cache)."""
STALE_S = 7 * 86400.0
"""Measurements older than this are dropped (the machine, its clocks or neighbours may differ)."""
KEEP = 8
"""Most recent measurements kept per key."""


def _samples(raw: object) -> list[dict[str, float]]:
    """A cache entry as a list of ``{"flops", "at", "load"}``; an old single number is stale."""
    if isinstance(raw, (int, float)):
        return [{"flops": float(raw), "at": 0.0, "load": math.nan}]
    if isinstance(raw, list):
        return [
            s
            for s in raw
            if isinstance(s, dict)
            and isinstance(s.get("flops"), (int, float))
            and isinstance(s.get("at"), (int, float))
            and s["flops"] > 0
        ]
    return []


def matmul_peak(device: str = "cpu", dtype: str = "float32", refresh: bool = False) -> float:
    """The best fresh :func:`measure_matmul_peak` of this key, measuring when the cache needs it.

    Args:
        device: torch device string.
        dtype: dtype name (:data:`attnbench.spec.DTYPES`).
        refresh: measure now (added to the cache; the result is still the best fresh measurement).

    A measurement is added when ``refresh`` is set, when no fresh one exists, or when fewer than
    :data:`_MIN_SAMPLES` exist and the newest is at least :data:`_SPACING_S` old.
    """
    path, key = cache_path(), _key(device, dtype)
    cache = read_json_cache(path)
    now = time.time()
    fresh = [s for s in _samples(cache.get(key)) if now - s["at"] < STALE_S]
    newest = max((s["at"] for s in fresh), default=-math.inf)
    if refresh or not fresh or (len(fresh) < _MIN_SAMPLES and now - newest >= _SPACING_S):
        fresh.append(
            {"flops": measure_matmul_peak(device, dtype), "at": now, "load": os.getloadavg()[0]}
        )
        fresh = sorted(fresh, key=lambda s: s["at"])[-KEEP:]
        cache[key] = fresh
        write_json_cache(path, cache)
    return float(max(s["flops"] for s in fresh))
