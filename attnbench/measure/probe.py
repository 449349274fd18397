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
import re
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass

import psutil
import torch

from attnbench.measure import schedstat

__all__ = [
    "SLOWDOWN_LIMIT",
    "probe_seconds",
    "cpu_probe_seconds",
    "gpu_probe_seconds",
    "gpu_neighbours",
    "this_run",
    "is_bimodal",
    "Disturbance",
]

_PROBE_SIZE = 192  # the probe multiplies two (N, N) float32 matrices
_PROBE_CALLS = 4  # matmuls per probe sample (about 1 ms on one core)
_PROBE_SAMPLES = 5  # samples per probe; their median is the probe's time
SLOWDOWN_LIMIT = 1.25
"""A probe this much slower (or faster) than the sweep's typical one marks the case disturbed."""
_CUDA_SPREAD_LIMIT = 1.0
"""CUDA cases: event samples whose IQR exceeds this share of their median are disturbed. An idle
H100 (2026-11-27, 137 cases) spread up to 0.58 on launch-bound cases, none bimodal."""
_GAP_LIMIT = 1.3
"""Block samples whose sorted values jump by this factor between two sizeable clusters: bimodal."""


@functools.lru_cache(maxsize=4)
def _operands(device: str, size: int = _PROBE_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """The probe's two fixed (size, size) float32 matrices on ``device`` (seeded: never zeros)."""
    gen = torch.Generator().manual_seed(1234)
    a = torch.randn(size, size, generator=gen).to(device)
    b = torch.randn(size, size, generator=gen).to(device)
    return a, b


def probe_seconds(device: str = "cpu") -> float:
    """Median seconds of one probe sample on ``device``: the GPU's own probe on CUDA.

    On CPU, ``_PROBE_CALLS`` fixed matmuls timed by the wall clock (:func:`cpu_probe_seconds`). On
    CUDA, a CPU-paced probe measures the host, not the card (on an idle H100 it marked 25 of 137
    cases noisy), so CUDA cases get :func:`gpu_probe_seconds`: GPU time from CUDA events.
    """
    if str(device).startswith("cuda"):
        return gpu_probe_seconds(device)
    return cpu_probe_seconds()


def cpu_probe_seconds() -> float:
    """Median wall seconds of ``_PROBE_CALLS`` fixed (N, N) float32 matmuls on the CPU."""
    a, b = _operands("cpu")
    samples = []
    for _ in range(_PROBE_SAMPLES + 1):  # the first sample warms caches and the thread pool
        t0 = time.perf_counter()
        for _ in range(_PROBE_CALLS):
            torch.mm(a, b)
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples[1:])


_GPU_PROBE_SIZE = 2048
"""The GPU probe multiplies two (N, N) float32 matrices: 17 GFLOP, long enough that the card's work,
not the launch, sets its time."""
_GPU_PROBE_SPIN_CYCLES = 2_000_000
"""GPU clock cycles a spin kernel holds the stream before each probe sample (about 1 ms), so every
matmul of the sample is queued before the first starts: the host's pace cannot enter its time."""


def gpu_probe_seconds(device: str = "cuda") -> float:
    """Median GPU seconds (CUDA events) of ``_PROBE_CALLS`` fixed matmuls on ``device``.

    A neighbour sharing the card's SMs or memory bandwidth slows it; a busy host does not (the
    sample's matmuls wait behind a spin kernel until all are queued).
    """
    a, b = _operands(str(device), _GPU_PROBE_SIZE)
    samples = []
    with torch.cuda.device(torch.device(device)):
        for _ in range(_PROBE_SAMPLES + 1):  # the first sample warms the kernels
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda._sleep(_GPU_PROBE_SPIN_CYCLES)
            start.record()
            for _ in range(_PROBE_CALLS):
                torch.mm(a, b)
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples[1:])


def gpu_neighbours(device: str = "cuda") -> tuple[int, ...] | None:
    """Process ids of the other processes using ``device``'s GPU; None when nothing can tell.

    NVML (``pynvml``, where importable) lists every compute process on the card; this process and
    those that started it are left out (:func:`this_run`). Without NVML,
    ``torch.cuda.list_gpu_processes`` is read (it needs NVML too, and says so, in which case the
    answer is None: unknown, not "none").
    """
    index = torch.device(device).index
    index = torch.cuda.current_device() if index is None else index
    pids = _nvml_pids(index)
    if pids is None:
        pids = _listed_pids(index)
    if pids is None:
        return None
    return tuple(sorted(set(pids) - this_run()))


def this_run() -> set[int]:
    """This process and the processes that started it: none of them is a neighbour.

    A sweep's parent measures the roof on the card, so it holds a CUDA context while a worker it
    forked measures; it waits for its workers and launches nothing beside them. (The lent H200 of
    2026-11-28 marked every case of an idle card noisy for that parent.) A process that started
    this one and goes on using the card beside it is not seen as a neighbour.
    """
    me = psutil.Process()
    return {me.pid, *(parent.pid for parent in me.parents())}


def _nvml_pids(index: int) -> list[int] | None:
    try:
        import pynvml
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
        handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        procs = pynvml.nvmlDeviceGetComputeRunningProcesses(handle)
        procs += pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
    except pynvml.NVMLError:
        return None
    return [p.pid for p in procs]


def _listed_pids(index: int) -> list[int] | None:
    """PIDs in ``torch.cuda.list_gpu_processes``' lines "process <pid> uses <n> MB GPU memory"."""
    try:
        text = torch.cuda.list_gpu_processes(index)
    except (RuntimeError, ModuleNotFoundError, ImportError):
        return None
    if "not found" in text:
        return None
    return [int(m) for m in re.findall(r"process\s+(\d+)\s+uses", text)]


def is_bimodal(samples: Sequence[float], gap: float = _GAP_LIMIT, min_share: float = 0.2) -> bool:
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
    # CUDA: judged on the GPU's evidence alone (event samples, GPU probe, processes on the card)
    gpu: bool = False
    spread: float = math.nan  # CUDA: IQR / median of the event-timed block samples
    neighbours: tuple[int, ...] = ()  # CUDA: other processes on the card (their process ids)

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
    def spread_too_wide(self) -> bool:
        return self.gpu and self.spread > _CUDA_SPREAD_LIMIT

    @property
    def disturbed(self) -> bool:
        """Any signal fired. On CUDA only the GPU's evidence counts: the host's run-queue wait is
        not a signal there, and the probe is the GPU's (:func:`gpu_probe_seconds`)."""
        gpu = self.gpu and (bool(self.neighbours) or self.spread_too_wide)
        host = self.short and not self.gpu
        return self.bimodal or gpu or host or self.deviation > SLOWDOWN_LIMIT

    def describe(self) -> str:
        """Which signals fired: run-queue wait, probe, clusters ("undisturbed" when none did).

        Example:
            >>> seen = Disturbance(1.0, (1.0,), False, waited=14, blocks=20, short=True)
            >>> seen.describe().split(" (")[0]
            'run-queue wait: a neighbour took the core, 14 of 20 blocks waited > 10% of their time'
        """
        parts = []
        if self.gpu and self.neighbours:
            pids = ", ".join(map(str, self.neighbours[:5]))
            parts.append(f"{len(self.neighbours)} other process(es) on the GPU (pid {pids})")
        if self.spread_too_wide:
            parts.append(
                f"CUDA event samples spread {self.spread:.2f}x their median (IQR; limit "
                f"{_CUDA_SPREAD_LIMIT:g})"
            )
        if self.short and not self.gpu:
            parts.append(
                f"run-queue wait: a neighbour took the core, {self.waited} of {self.blocks} "
                f"blocks waited > {schedstat.WAIT_LIMIT:.0%} of their time "
                "(too few undisturbed blocks within the retry budget)"
            )
        if self.deviation > SLOWDOWN_LIMIT:
            ratio = self.slowdown
            way = f"{ratio:.2f}x slower" if ratio > 1 else f"{1 / ratio:.2f}x faster"
            which = "GPU probe" if self.gpu else "calibration probe"
            parts.append(f"{which} {way} than the sweep's typical")
        if self.bimodal:
            parts.append("block samples bimodal (two clusters)")
        return "; ".join(parts) or "undisturbed"
