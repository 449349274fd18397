"""Peak memory of one call: tensor bytes and process RSS.

Tensor bytes come from the profiler timeline on CPU and from allocator stats on CUDA; RSS from
psutil, sampled on a thread.

The CPU figure uses ``torch.profiler._memory_profiler.MemoryProfile``, a private API: it replays
every allocation and free the profiler saw, which is exact for tensors (``tracemalloc`` cannot see
them). Everything touching it lives in :func:`cpu_peak_tensor_bytes`, which returns None when the
API is missing or changed, so callers can fall back to the analytic prediction. The profiler's
native code writes noise lines straight to file descriptor 2; :func:`quiet_stderr` silences them.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import warnings
from collections.abc import Callable, Iterator

import psutil
import torch

PROFILER_IMPORTS = ("torch.profiler", "torch._inductor")
"""What the profiler behind :func:`cpu_peak_tensor_bytes` imports on its first use: it asks
``hasattr(torch, "_inductor")``, which imports Inductor (two to three seconds of a core). A process
that forks workers imports these first, so that no worker pays for them again."""

__all__ = [
    "PROFILER_IMPORTS",
    "quiet_stderr",
    "live_bytes",
    "peak_from_timeline",
    "cpu_peak_tensor_bytes",
    "cuda_peak_tensor_bytes",
    "peak_rss_bytes",
    "minor_faults",
    "page_faults",
]


@contextlib.contextmanager
def quiet_stderr() -> Iterator[None]:
    """Silence Python warnings and anything native code writes to fd 2 inside the block."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def live_bytes(timeline: list[tuple]) -> list[tuple[int, int]]:
    """``(time_ns, live bytes)`` after each allocation or free inside the profiled region.

    ``timeline`` entries are ``(time_ns, action, (key, version), size)``; tensors that existed
    before profiling started (``PREEXISTING``, i.e. the inputs) are not counted.
    """
    series, live = [], 0
    for t, action, _, size in timeline:
        name = getattr(action, "name", str(action))
        if name in ("CREATE", "DESTROY"):
            live += size if name == "CREATE" else -size
            series.append((t, live))
    return series


def peak_from_timeline(timeline: list[tuple]) -> int:
    """Peak live bytes of tensors created inside the profiled region (see :func:`live_bytes`)."""
    return max((live for _, live in live_bytes(timeline)), default=0)


def cpu_peak_tensor_bytes(fn: Callable[[], object]) -> int | None:
    """Peak tensor bytes allocated during one call of ``fn`` on CPU, or None if unmeasurable."""
    try:
        from torch.profiler import ProfilerActivity, profile
        from torch.profiler._memory_profiler import MemoryProfile
    except ImportError:
        return None
    try:
        with quiet_stderr():
            with profile(
                activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True
            ) as prof:
                fn()
            timeline = MemoryProfile(prof.profiler.kineto_results).timeline
    except (AttributeError, RuntimeError, TypeError, ValueError):
        return None
    return peak_from_timeline(timeline)


def cuda_peak_tensor_bytes(fn: Callable[[], object], device: torch.device | str) -> int:
    """Peak bytes the CUDA caching allocator handed out during one call, above those live before."""
    device = torch.device(device)
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    fn()
    torch.cuda.synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


def peak_rss_bytes(fn: Callable[[], object], interval: float = 0.001) -> int:
    """Highest resident set size of this process while ``fn`` runs (sampled each ``interval`` s)."""
    proc = psutil.Process()
    peak = proc.memory_info().rss
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, proc.memory_info().rss)
            done.wait(interval)

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    try:
        fn()
    finally:
        done.set()
        thread.join()
    return max(peak, proc.memory_info().rss)


def minor_faults() -> int:
    """Minor page faults of this process so far (fresh pages, zero-filled at their first touch)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def page_faults(fn: Callable[[], object]) -> int:
    """Minor page faults taken during one call of ``fn``."""
    before = minor_faults()
    fn()
    return minor_faults() - before
