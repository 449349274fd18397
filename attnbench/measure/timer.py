"""Wall-clock timing with warm-up, blocked repeats and CUDA synchronisation.

Like ``torch.utils.benchmark.Timer.blocked_autorange``: calls are grouped into blocks of at least
``block_time`` seconds so timer overhead is negligible for fast calls, and blocks repeat until both
``min_runs`` calls and ``min_time`` seconds of timed calls have been spent (or ``max_time`` seconds of
wall time, untimed cache flushes included, have passed). Each sample is the mean per-call time of one
block. On CUDA the block is bracketed by CUDA events and synchronised before the clock is read.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench._checks import check_bool, check_int, check_number


@dataclass(frozen=True)
class TimerConfig:
    """How long and how often to time one case."""

    warmup: int = 1  # untimed calls before timing, at least (the accuracy check adds one more)
    warmup_time: float = 0.05  # ...and keep warming up until this many seconds have passed
    min_runs: int = 5  # at least this many timed calls...
    min_time: float = 0.25  # ...and at least this many seconds of timed calls
    max_time: float = 5.0  # stop repeating after this many seconds of wall time, flushes included (bounds a case)
    block_time: float = 0.01  # target seconds per timed block
    flush_cache: bool = False  # evict caches before every sample (then one call per sample), untimed

    def __post_init__(self) -> None:
        check_int("warmup", self.warmup, 0)
        check_int("min_runs", self.min_runs, 1)
        for name in ("warmup_time", "min_time", "max_time", "block_time"):
            check_number(name, getattr(self, name), 0.0, low_open=name != "warmup_time")
        if self.max_time < self.min_time:
            raise ValueError(f"max_time {self.max_time:g} must be >= min_time {self.min_time:g}")
        check_bool("flush_cache", self.flush_cache)


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_once(fn: Callable[[], object], device: torch.device | str = "cpu") -> float:
    """Seconds for one call of ``fn`` (first calls, compile times), synchronised on CUDA."""
    return _block_seconds(fn, 1, torch.device(device))


def _block_seconds(fn: Callable[[], object], number: int, device: torch.device) -> float:
    """Total seconds for ``number`` back-to-back calls."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(number):
            fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3
    t0 = time.perf_counter()
    for _ in range(number):
        fn()
    return time.perf_counter() - t0


FLUSH_BYTES = 256 * 2**20  # larger than any CPU L3 or GPU L2 in sight


def cache_flusher(device: torch.device) -> Callable[[], None]:
    """A call that overwrites a buffer bigger than the last-level cache, so that the next call starts cold.

    The buffer is allocated once per timing: a fresh one per sample cost 65,536 page faults (4 KiB pages, 256 MiB),
    about 0.1 s a sample on CPU, for a decode call of 0.3 ms.
    """
    buffer = torch.empty(FLUSH_BYTES, dtype=torch.uint8, device=device)

    def flush() -> None:
        buffer.fill_(1)
        _synchronize(device)

    flush()  # its pages are faulted in here, before the timing starts
    return flush


def time_call(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    config: TimerConfig | None = None,
    *,
    between: Callable[[], object] | None = None,
    between_every_s: float = 0.5,
) -> tuple[list[float], int]:
    """Time ``fn`` and return ``(per-call seconds per block, total calls timed)``.

    Args:
        fn: the call to time; inputs must already exist (never time setup).
        device: where ``fn`` runs; CUDA work is synchronised before every clock read.
        config: repeat policy.
        between: called between two blocks (outside the timed region) once at least
            ``between_every_s`` seconds of blocks have passed since the last call: the runner's
            calibration probe, so a long case is checked while it runs, not only around it.
        between_every_s: seconds of timed blocks between two calls of ``between``.
    """
    config = config or TimerConfig()
    device = torch.device(device)
    start = time.perf_counter()
    calls = 0
    while calls < config.warmup or time.perf_counter() - start < config.warmup_time:
        fn()  # a cold process (thread pool, caches, clocks) needs more than one call
        calls += 1
        _synchronize(device)
    flush = cache_flusher(device) if config.flush_cache else None
    began = time.perf_counter()  # max_time bounds the wall time from here, flushes and probes included
    first = _block_seconds(fn, 1, device)  # sizes the blocks; kept only if nothing else fits
    number = 1 if flush else max(1, math.floor(config.block_time / max(first, 1e-9)))
    samples: list[float] = []
    runs, spent = 0, first
    since_hook = 0.0
    while time.perf_counter() - began < config.max_time and (runs < config.min_runs or spent - first < config.min_time):
        if between is not None and samples and since_hook >= between_every_s:
            between()
            since_hook = 0.0
        if flush:
            flush()
        seconds = _block_seconds(fn, number, device)
        samples.append(seconds / number)
        runs += number
        spent += seconds
        since_hook += seconds
    if not samples:
        return [first], 1
    return samples, runs


def cuda_graph_seconds(fn: Callable[[], object], device: torch.device | str, replays: int = 20) -> float:
    """Median seconds per call when ``fn`` is captured once in a CUDA graph and replayed.

    Replaying removes the host-side launch overhead, so comparing this with the eager time shows
    how much of a short-sequence call is launch cost rather than kernel time.

    Raises:
        RuntimeError: if ``fn`` cannot be captured (e.g. it synchronises or allocates on the host).
    """
    device = torch.device(device)
    stream = torch.cuda.Stream(device)
    stream.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(stream):
        for _ in range(3):  # warm up on the side stream, as capture requires
            fn()
    torch.cuda.current_stream(device).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    samples = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)
