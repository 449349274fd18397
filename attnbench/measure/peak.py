"""This machine's matmul FLOP/s: the roof that achieved attention FLOP/s is compared with.

Measured once per (device, dtype, threads, torch) and cached in ``~/.cache/attnbench/peak.json``
(override with ``ATTNBENCH_CACHE``), so reports can show "% of peak" without re-measuring.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path

import torch

from attnbench.io import atomic_write_text
from attnbench.measure.timer import TimerConfig, time_call
from attnbench.spec import DTYPES


def cache_path() -> Path:
    return Path(os.environ.get("ATTNBENCH_CACHE", Path.home() / ".cache" / "attnbench")) / "peak.json"


def _key(device: str, dtype: str) -> str:
    return f"{device}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


def measure_matmul_peak(device: str = "cpu", dtype: str = "float32", n: int = 2048) -> float:
    """Median FLOP/s of an ``n x n @ n x n`` matmul on random inputs (2 n^3 FLOPs per call)."""
    gen = torch.Generator().manual_seed(0)
    a, b = (torch.randn(n, n, generator=gen).to(device=device, dtype=DTYPES[dtype]) for _ in range(2))
    samples, _ = time_call(lambda: a @ b, device, TimerConfig(warmup=2, min_runs=5, min_time=0.5, max_time=5.0))
    return 2 * n**3 / statistics.median(samples)


def matmul_peak(device: str = "cpu", dtype: str = "float32", refresh: bool = False) -> float:
    """Cached :func:`measure_matmul_peak` (measured on first use)."""
    path, key = cache_path(), _key(device, dtype)
    cache: dict[str, float] = {}
    if path.exists():
        try:
            cache = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError):
            cache = {}
    if refresh or key not in cache:
        cache[key] = measure_matmul_peak(device, dtype)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(path, json.dumps(cache, indent=1, sort_keys=True))
    return float(cache[key])
