"""Interference detection: a fixed calibration kernel timed around every case.

A busy neighbour on a shared machine can make a case 5-10x slower while its samples stay tight
(each block is slowed alike), so a small IQR proves nothing. The probe is a fixed matmul that runs
with the same threads as the case: timed before and after the case (and between blocks of long
cases), it is compared with the fastest probe seen in the sweep. A probe slower than
``SLOWDOWN_LIMIT`` times that, or block samples that split into two clusters, mean the case was
disturbed: the runner measures it again (a bounded number of times) and, if it stays disturbed,
records it as ``noisy`` with the probe's slowdown, so the report neither fits nor ranks it.

Example:
    >>> is_bimodal([1.0, 1.01, 0.99, 2.1, 2.0, 2.05])
    True
    >>> is_bimodal([1.0, 1.02, 0.98, 1.01, 1.03])
    False
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

PROBE_SIZE = 192  # the probe multiplies two (N, N) float32 matrices
PROBE_CALLS = 4  # matmuls per probe sample (about 1 ms on one core of this project's CPUs)
PROBE_SAMPLES = 5  # samples per probe; their median is the probe's time
SLOWDOWN_LIMIT = 1.25
"""A probe this much slower than the fastest probe of the sweep marks the case as disturbed."""
GAP_LIMIT = 1.3
"""Block samples whose sorted values jump by this factor between two sizeable clusters are bimodal."""


@functools.lru_cache(maxsize=4)
def _operands(device: str) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=gen).to(device)
    b = torch.randn(PROBE_SIZE, PROBE_SIZE, generator=gen).to(device)
    return a, b


def probe_seconds(device: str = "cpu") -> float:
    """Median seconds of one probe sample (``PROBE_CALLS`` fixed matmuls) on ``device``."""
    a, b = _operands(device)
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    samples = []
    for _ in range(PROBE_SAMPLES + 1):  # the first sample warms caches and the thread pool
        sync()
        t0 = time.perf_counter()
        for _ in range(PROBE_CALLS):
            torch.mm(a, b)
        sync()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:])


def is_bimodal(samples: Sequence[float], gap: float = GAP_LIMIT, min_share: float = 0.2) -> bool:
    """True when the samples form two clusters separated by a jump of at least ``gap`` x.

    The sorted samples are cut at their largest ratio between neighbours; both sides must hold at
    least ``min_share`` of the samples (and two each), so one outlier is not a second mode.
    """
    values = sorted(s for s in samples if s > 0 and math.isfinite(s))
    n = len(values)
    if n < 4:
        return False
    ratios = [values[i + 1] / values[i] for i in range(n - 1)]
    cut = max(range(n - 1), key=ratios.__getitem__)
    low, high = cut + 1, n - cut - 1
    need = max(2, math.ceil(min_share * n))
    return ratios[cut] >= gap and low >= need and high >= need


@dataclass(frozen=True)
class Disturbance:
    """What the probe saw around one attempt at a case."""

    baseline_s: float  # fastest probe seen in the sweep so far (the quiet machine's speed)
    probes_s: tuple[float, ...]  # probe times taken around and between the case's blocks
    bimodal: bool  # the case's block samples split into two clusters

    @property
    def slowdown(self) -> float:
        """Slowest probe / baseline (1.0 = as fast as the quietest moment of the sweep)."""
        if not self.probes_s or not self.baseline_s > 0:
            return math.nan
        return max(self.probes_s) / self.baseline_s

    @property
    def disturbed(self) -> bool:
        return self.bimodal or self.slowdown > SLOWDOWN_LIMIT

    def describe(self) -> str:
        parts = []
        if self.slowdown > SLOWDOWN_LIMIT:
            parts.append(f"calibration probe {self.slowdown:.2f}x slower than the sweep's quietest")
        if self.bimodal:
            parts.append("block samples bimodal")
        return "; ".join(parts) or "undisturbed"
