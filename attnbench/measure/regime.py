"""One measurement regime for every entry point: allocator, threads, huge pages, recorded.

Two processes running the same code on the same machine can time a case 2x apart because of what
their allocator did before: glibc raises its mmap and trim thresholds after a large block is freed,
so a process that once freed a large tensor reuses heap pages for later buffers, while a fresh one
maps, faults in and unmaps them on every call. Pinning the thresholds switches that adjustment off:
every process allocates alike, whatever ran before.

:func:`apply` pins them in this process through ``mallopt`` (effective for every later allocation,
so it works after the interpreter has started) and sets the torch thread count; :func:`child_env`
gives the same settings to processes this one starts (asv, workers), as ``MALLOC_*_`` variables
that glibc reads at start-up. :func:`describe` is recorded with every measurement.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
from dataclasses import dataclass

import torch

__all__ = [
    "PINNED_BYTES",
    "DEFAULT_THREADS",
    "Regime",
    "allocator_pinned",
    "apply",
    "current",
    "child_env",
    "thp_setting",
    "describe",
]

_M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
_M_MMAP_THRESHOLD = -3
PINNED_BYTES = 128 * 1024
"""glibc's own initial threshold: allocations of 128 KiB or more are mmapped, and freed at once."""
DEFAULT_THREADS = 1
"""The default torch thread count of every entry point (``run``, asv, ``regress``, ``profile``).

With two threads, one intra-op thread descheduled by any other process stalls the whole operator
at its barrier. On this project's shared 2-core machine (2026-11-22, ``python -m
studies.thread_policy``, load average 4.6-7.6 from other work) 2 threads against 1 made chunked at
L=1024 5-10x slower and the probe 241x, while the best case for two threads was 1.3x faster (sdpa
at L=4096). One thread gives up that speed-up for timings that stay put; ``--threads`` measures
threading itself.
"""


@dataclass(frozen=True)
class Regime:
    """How every case is measured, whichever entry point runs it."""

    threads: int  # torch intra-op threads (and OMP/MKL threads in child processes)
    mmap_threshold: int = PINNED_BYTES  # glibc M_MMAP_THRESHOLD in bytes, pinned (no dynamic raise)
    trim_threshold: int = PINNED_BYTES  # glibc M_TRIM_THRESHOLD in bytes, pinned

    def __post_init__(self) -> None:
        if not isinstance(self.threads, int) or isinstance(self.threads, bool) or self.threads < 1:
            raise ValueError(f"threads must be a positive int, got {self.threads!r}")
        for name in ("mmap_threshold", "trim_threshold"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int (bytes), got {value!r}")


@functools.lru_cache(maxsize=1)
def _libc() -> ctypes.CDLL | None:
    """glibc, if this process runs on it (mallopt is glibc's), else None."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        libc = ctypes.CDLL(name)
        libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        libc.mallopt.restype = ctypes.c_int
        libc.gnu_get_libc_version.restype = ctypes.c_char_p
    except (OSError, AttributeError):
        return None
    return libc


def allocator_pinned(regime: Regime) -> bool:
    """Pin glibc's thresholds in this process; False where there is no glibc (nothing to pin)."""
    libc = _libc()
    if libc is None:
        return False
    ok_mmap = libc.mallopt(_M_MMAP_THRESHOLD, regime.mmap_threshold) == 1
    ok_trim = libc.mallopt(_M_TRIM_THRESHOLD, regime.trim_threshold) == 1
    return ok_mmap and ok_trim


_applied: Regime | None = None


def apply(regime: Regime) -> None:
    """Put this process in ``regime``: torch threads, pinned allocator, denormals kept."""
    global _applied
    torch.set_num_threads(regime.threads)
    # IEEE denormals, as a fresh process has them (a caller may have flushed)
    torch.set_flush_denormal(False)
    pinned = allocator_pinned(regime)
    _applied = (
        regime if pinned else Regime(threads=regime.threads, mmap_threshold=0, trim_threshold=0)
    )


def current() -> Regime | None:
    """The regime :func:`apply` last set here (thresholds 0: no glibc to pin), or None."""
    return _applied


def child_env(regime: Regime) -> dict[str, str]:
    """Environment variables that put a child process in this regime from its first allocation."""
    threads = str(regime.threads)
    return {
        "MALLOC_MMAP_THRESHOLD_": str(regime.mmap_threshold),
        "MALLOC_TRIM_THRESHOLD_": str(regime.trim_threshold),
        "OMP_NUM_THREADS": threads,
        "MKL_NUM_THREADS": threads,
        "ATTNBENCH_THREADS": threads,
    }


def thp_setting() -> str:
    """Kernel transparent-huge-page mode, and whether torch asks for huge pages for CPU tensors.

    Dense attention allocates fresh O(L^2) buffers every call; with 4 KiB pages each costs one page
    fault per page, with huge pages far fewer (the README gives figures). Timings are only
    comparable under the same setting.
    """
    try:
        with open("/sys/kernel/mm/transparent_hugepage/enabled", encoding="utf-8") as f:
            mode = f.read().strip()
        mode = mode[mode.index("[") + 1 : mode.index("]")]
    except (OSError, ValueError):
        mode = "unknown"
    return f"kernel={mode} torch={os.environ.get('THP_MEM_ALLOC_ENABLE', '0')}"


def _denormals_flushed() -> bool:
    """Whether this thread flushes float32 denormals to zero (``torch.set_flush_denormal``)."""
    tiny = torch.tensor([1e-39], dtype=torch.float32)  # a float32 denormal
    return bool((tiny * 1.0).item() == 0.0)


def _cpus() -> str:
    """How many CPUs this process may run on (its affinity mask); "?" where the OS does not say."""
    try:
        return str(len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return "?"


def describe() -> str:
    """One line for every measurement: the process state that decides how fast the same code runs.

    Threads, allocator thresholds and huge pages (what :func:`apply` and :func:`child_env` set),
    then what they do not set but a process may inherit or change: inter-op threads, denormal
    flushing and the CPUs the process may run on. Two entry points that print the same line measure
    alike; ``tests/test_regime.py`` compares the line of a worker, a fresh process and asv's
    process.

    Example:
        >>> apply(Regime(threads=1))
        >>> describe().split()[0]
        'threads=1'
    """
    regime = current()
    threads = torch.get_num_threads()
    if regime is None:
        allocator = "malloc=default"
    elif regime.mmap_threshold == 0:
        allocator = "malloc=not-glibc"
    else:
        allocator = f"malloc=mmap:{regime.mmap_threshold},trim:{regime.trim_threshold}"
    denormals = "flushed" if _denormals_flushed() else "kept"
    return (
        f"threads={threads} {allocator} thp={thp_setting()} "
        f"interop={torch.get_num_interop_threads()} denormals={denormals} cpus={_cpus()}"
    )
