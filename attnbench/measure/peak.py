"""This machine's matmul FLOP/s: the roof that achieved attention FLOP/s is compared with.

Cached per (device, dtype, threads, torch) in ``matmul_peaks.json`` under
:func:`attnbench.io.cache_dir`, so reports can show "% of peak" and the time guard can predict
without re-measuring every time. The rule, so that a cache makes a run faster but never different:

- **A sample cannot be taken under load unseen.** It is timed with the sweep's run-queue-aware
  timer (:func:`.timer.time_blocks`): a block that waited for a core is dropped and timed again,
  and the sample records the share of its blocks that waited (``waited``). One whose blocks mostly
  waited is kept but not trusted.
- **The roof is the best sample** younger than :data:`STALE_S`: a neighbour can only make a
  sample low, so a low one is outvoted. Only trusted samples count towards stopping the sampling
  (an older attnbench's, timed without reading the wait, are not trusted).
- **Another sample is taken** on use while fewer than :data:`_MIN_SAMPLES` trusted ones exist, and
  whenever the load is lower than the load the best one was taken under (by
  :data:`_QUIETER_BY`): a quieter moment can give a higher figure. At most once per
  :data:`_SPACING_S`, so samples come from different moments.
- **A ceiling** (:func:`cpu_ceiling`): where the CPU's clock and vector width can be read, no roof
  passes its theoretical peak; a sample above it is not trusted.

A run whose own rates come out above its roof measures again (``refresh``) before it writes its
manifest (:mod:`attnbench.session`).
"""

from __future__ import annotations

import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from attnbench.io import cache_dir, read_json_cache, write_json_cache
from attnbench.measure import schedstat
from attnbench.measure.timer import TimerConfig, time_blocks, time_once
from attnbench.spec import DTYPES

__all__ = [
    "cache_path",
    "RoofSample",
    "sample_matmul_peak",
    "measure_matmul_peak",
    "cpu_ceiling",
    "STALE_S",
    "KEEP",
    "matmul_peak",
]


def cache_path() -> Path:
    """Where the matmul measurements are kept (``peak.json`` held single numbers: not read)."""
    return cache_dir() / "matmul_peaks.json"


def _key(device: str, dtype: str) -> str:
    return f"{device}|{dtype}|threads={torch.get_num_threads()}|torch={torch.__version__}"


_MAX_SIDE = 2048
_CALL_TARGET_S = 0.1
"""The matmul doubles from 256 (up to :data:`_MAX_SIDE`) while its next size's call fits in this."""
_MOSTLY_WAITED = 0.5
"""A sample whose timed blocks waited for a core more than this share of the time is not trusted."""
_REDO_S = 2.0
"""Seconds of blocks that waited for a core a sample may time again in their place."""


@dataclass(frozen=True)
class RoofSample:
    """One matmul measurement: its rate, and how much of it waited for a core."""

    flops: float  # FLOP/s: 2 n^3 over the median of the blocks kept
    # share of the timed blocks that waited for a core over schedstat.WAIT_LIMIT of their time
    # (None: this kernel does not report the wait)
    waited: float | None


def sample_matmul_peak(
    device: str = "cpu", dtype: str = "float32", n: int | None = None
) -> RoofSample:
    """Time an ``n x n @ n x n`` matmul on random inputs (2 n^3 FLOPs per call).

    ``n`` defaults to the largest power of two up to :data:`_MAX_SIDE` whose call takes about
    :data:`_CALL_TARGET_S` at most: a dtype the hardware has no fast path for (bfloat16 on many
    CPUs) is measured in a second, not in minutes. Blocks that waited for a core are dropped and
    timed again (within :data:`_REDO_S`); the sample says what share of its blocks waited.
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
    blocks = time_blocks(
        matmul(n),
        device,
        TimerConfig(warmup=2, min_runs=5, min_time=0.5, max_time=5.0),
        wait_limit=schedstat.WAIT_LIMIT,
        redo_s=_REDO_S,
    )
    waited = blocks.waited() / len(blocks.shares) if blocks.shares else None
    if blocks.short and waited is not None:
        waited = max(waited, _MOSTLY_WAITED + 1e-9)  # no block was left alone long enough
    return RoofSample(2 * n**3 / statistics.median(blocks.samples), waited)


def measure_matmul_peak(device: str = "cpu", dtype: str = "float32", n: int | None = None) -> float:
    """The FLOP/s of one :func:`sample_matmul_peak` (for a benchmark that records the roof)."""
    return sample_matmul_peak(device, dtype, n).flops


_FLOPS_PER_CYCLE = (("avx512f", 64), ("avx2", 32), ("sse2", 8))
"""float32 FLOPs a core can issue per cycle at most, by the widest vector extension: two FMA units
of 16 (AVX-512), 8 (AVX2) or 4 (SSE, a multiply and an add) lanes. Two units is the most any x86
core has, so the ceiling is an upper bound."""
_MAX_FREQ = "/sys/devices/system/cpu/cpu0/cpufreq/cpuinfo_max_freq"
_CPUINFO = "/proc/cpuinfo"


def cpu_ceiling(dtype: str, threads: int) -> float | None:
    """The CPU's theoretical FLOP/s at ``threads`` cores: max clock x FLOPs per cycle x cores.

    None where the maximum clock cannot be read (virtual machines often hide it: ``cpu MHz`` is
    the current or nominal clock, below a boost, so it is not used), or for a dtype other than
    float32 and float64 (half types have matrix units whose width this does not read).
    """
    if dtype not in ("float32", "float64"):
        return None
    try:
        max_khz = int(Path(_MAX_FREQ).read_text().split()[0])
        flags = next(
            set(line.split(":", 1)[1].split())
            for line in Path(_CPUINFO).read_text().splitlines()
            if line.startswith("flags")
        )
    except (OSError, ValueError, IndexError, StopIteration):
        return None
    per_cycle = next((width for flag, width in _FLOPS_PER_CYCLE if flag in flags), 2)
    if dtype == "float64":
        per_cycle //= 2
    cores = max(1, min(threads, os.cpu_count() or 1))
    return max_khz * 1e3 * per_cycle * cores


_MIN_SAMPLES = 3
"""Trusted fresh measurements the cache collects per key before it stops measuring on use."""
_SPACING_S = 60.0
"""Seconds between two measurements added on use (a busy minute should not fill the cache)."""
_QUIETER_BY = 0.5
"""A load this much lower than the best sample's is a quieter moment: it is sampled again."""
STALE_S = 7 * 86400.0
"""Measurements older than this are dropped (the machine, its clocks or neighbours may differ)."""
KEEP = 8
"""Most recent measurements kept per key."""


def _samples(raw: object) -> list[dict]:
    """A cache entry as a list of ``{"flops", "at", "load"[, "waited"]}`` (one number: stale)."""
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


def _trusted(sample: dict, ceiling: float | None) -> bool:
    """Timed with the wait read (or on a kernel that cannot say), mostly undisturbed, below the
    ceiling. A sample without ``waited`` comes from an attnbench that did not read the wait."""
    if "waited" not in sample or (ceiling is not None and sample["flops"] > ceiling):
        return False
    waited = sample["waited"]
    return waited is None or (isinstance(waited, (int, float)) and waited <= _MOSTLY_WAITED)


def _load(sample: dict) -> float:
    load = sample.get("load")
    return float(load) if isinstance(load, (int, float)) else math.nan


def _wants_sample(fresh: list[dict], trusted: list[dict], now: float, load: float) -> bool:
    """Whether to measure on use: too few trusted samples, or a quieter moment than the best's.

    Never within :data:`_SPACING_S` of this attnbench's last sample (an older attnbench's samples,
    without ``waited``, do not hold it back): a busy hour adds a sample a minute at most, however
    its load moves.
    """
    if any(now - s["at"] < _SPACING_S for s in fresh if "waited" in s):
        return False
    if len(trusted) < _MIN_SAMPLES:
        return True
    return load + _QUIETER_BY < _load(max(trusted, key=lambda s: s["flops"]))


def matmul_peak(device: str = "cpu", dtype: str = "float32", refresh: bool = False) -> float:
    """This key's roof: the best fresh sample, measuring when the rule asks (module doc).

    Args:
        device: torch device string.
        dtype: dtype name (:data:`attnbench.spec.DTYPES`).
        refresh: measure now (added to the cache; the result is still the best sample).

    Every sample counts for the roof (a neighbour can only make one low, so the best is the
    truest), but only trusted ones stop the sampling. None passes :func:`cpu_ceiling` where it is
    known.
    """
    path, key = cache_path(), _key(device, dtype)
    cache = read_json_cache(path)
    now, load = time.time(), os.getloadavg()[0]
    ceiling = cpu_ceiling(dtype, torch.get_num_threads()) if device == "cpu" else None
    fresh = [s for s in _samples(cache.get(key)) if now - s["at"] < STALE_S]
    trusted = [s for s in fresh if _trusted(s, ceiling)]
    if refresh or _wants_sample(fresh, trusted, now, load):
        sample = sample_matmul_peak(device, dtype)
        entry = {"flops": sample.flops, "at": now, "load": load, "waited": sample.waited}
        fresh = sorted([*fresh, entry], key=lambda s: s["at"])[-KEEP:]
        cache[key] = fresh
        write_json_cache(path, cache)
    below = [s["flops"] for s in fresh if ceiling is None or s["flops"] <= ceiling]
    return float(max(below)) if below else float(ceiling)
