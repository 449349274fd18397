"""Interference detection: a fixed calibration kernel timed around every case.

A busy neighbour can make a case several times slower while its samples stay tight (each block is
slowed alike), so a small IQR proves nothing. The probe, a fixed matmul on the case's threads, is
timed before and after each attempt (and between blocks of long ones) and compared with the sweep's
*typical* probe time (the median of what it has seen). A probe over ``SLOWDOWN_LIMIT`` x slower or
faster than that, or block samples in two clusters (:func:`is_bimodal`), disturb the attempt
(:class:`Disturbance`): the runner measures again, and a case that stays disturbed is ``noisy``. A
steady neighbour taking whole scheduler slices leaves the 1 ms probe alone; the run-queue wait
(:mod:`.schedstat`) catches it (:attr:`Disturbance.short`).

Typical, not fastest, and both ways: a shared virtual machine changes speed by itself (the host's
clocks), and a case measured at a speed the others were not bends a fitted exponent either way.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnbench.measure import schedstat

PROBE_SIZE = 192  # the probe multiplies two (N, N) float32 matrices
PROBE_CALLS = 4  # matmuls per probe sample (about 1 ms on one core)
PROBE_SAMPLES = 5  # samples per probe; their median is the probe's time
SLOWDOWN_LIMIT = 1.25
"""A probe this much slower (or faster) than the sweep's typical one marks the case disturbed."""
GAP_LIMIT = 1.3
"""Block samples whose sorted values jump by this factor between two sizeable clusters: bimodal."""


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

    Example:
        >>> is_bimodal([1.0, 1.01, 0.99, 2.1, 2.0, 2.05])
        True
        >>> is_bimodal([1.0, 1.02, 0.98, 1.01, 1.03])
        False
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
    """What the probe and the scheduler saw around one attempt at a case."""

    baseline_s: float  # the sweep's typical probe time (median of the probes it has seen)
    probes_s: tuple[float, ...]  # probe times taken around and between the case's blocks
    bimodal: bool  # the case's block samples split into two clusters
    # timed blocks that waited for a core over schedstat.WAIT_LIMIT of their time (dropped,
    # re-timed)
    waited: int = 0
    # timed blocks whose wait was read, dropped ones included (0: the kernel does not say)
    blocks: int = 0
    # too few undisturbed blocks were left when the re-measure allowance ran out
    short: bool = False

    @property
    def slowdown(self) -> float:
        """The probe / baseline ratio furthest from 1 (> 1: slower, < 1: faster; NaN: not probed).

        Example:
            >>> Disturbance(1.0, (1.1, 1.6), False).slowdown
            1.6
            >>> Disturbance(1.0, (0.6, 1.1), False).slowdown
            0.6
        """
        if not self.probes_s or not self.baseline_s > 0:
            return math.nan
        slow, fast = max(self.probes_s) / self.baseline_s, min(self.probes_s) / self.baseline_s
        return slow if slow >= 1 / fast else fast

    @property
    def deviation(self) -> float:
        """How far the probe strayed from typical, as a factor >= 1 either way (NaN: not probed)."""
        ratio = self.slowdown
        return max(ratio, 1 / ratio) if ratio > 0 else math.nan

    @property
    def disturbed(self) -> bool:
        return self.bimodal or self.short or self.deviation > SLOWDOWN_LIMIT

    def describe(self) -> str:
        """Which signals fired: run-queue wait, probe, clusters ("undisturbed" when none did).

        Example:
            >>> seen = Disturbance(1.0, (1.0,), False, waited=14, blocks=20, short=True)
            >>> seen.describe().split(" (")[0]
            'run-queue wait: a neighbour took the core, 14 of 20 blocks waited > 10% of their time'
        """
        parts = []
        if self.short:
            parts.append(
                f"run-queue wait: a neighbour took the core, {self.waited} of {self.blocks} "
                f"blocks waited > {schedstat.WAIT_LIMIT:.0%} of their time "
                "(too few undisturbed blocks within the retry budget)"
            )
        if self.deviation > SLOWDOWN_LIMIT:
            ratio = self.slowdown
            way = f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"
            parts.append(f"calibration probe {way} than the sweep's typical")
        if self.bimodal:
            parts.append("block samples bimodal (two clusters)")
        return "; ".join(parts) or "undisturbed"
