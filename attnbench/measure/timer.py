"""Wall-clock timing with warm-up, blocked repeats and CUDA synchronisation.

Like ``torch.utils.benchmark.Timer.blocked_autorange``: calls are grouped into blocks of at least
``block_time`` seconds so timer overhead is negligible for fast calls, and blocks repeat until both
``min_runs`` calls and ``min_time`` seconds of timed calls have been spent (or ``max_time`` seconds
of wall time, untimed cache flushes included, have passed). Each sample is the mean per-call time of
one block. On CUDA the block is bracketed by CUDA events and synchronised before the clock is read.

Beside every block the timing thread's run-queue wait is read (:mod:`.schedstat`, outside the
block's clock interval). :func:`time_blocks` can drop a block that waited for a core more than a
share of its wall time (a neighbour had the core for part of it, so its time is partly the
neighbour's) and time another in its place, within an allowance of extra seconds; the runner decides
from what is left whether the case was measured undisturbed.
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from attnbench._checks import check_bool, check_int, check_number
from attnbench.measure import schedstat

__all__ = [
    "TimerConfig",
    "time_once",
    "cache_flusher",
    "Blocks",
    "time_blocks",
    "measured_calls",
    "time_call",
    "cuda_graph_seconds",
]


@dataclass(frozen=True)
class TimerConfig:
    """How long and how often to time one case."""

    warmup: int = 1  # untimed calls before timing, at least (the accuracy check adds one more)
    warmup_time: float = 0.05  # ...and keep warming up until this many seconds have passed
    min_runs: int = 5  # at least this many timed calls...
    min_time: float = 0.25  # ...and at least this many seconds of timed calls
    # stop repeating after this many seconds of wall time, flushes included (bounds a case)
    max_time: float = 5.0
    block_time: float = 0.01  # target seconds per timed block
    # evict caches before every sample (then one call per sample), untimed
    flush_cache: bool = False

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


_FLUSH_BYTES = 256 * 2**20  # larger than any CPU L3 or GPU L2 in sight


def cache_flusher(device: torch.device) -> Callable[[], None]:
    """A call that overwrites a buffer bigger than the last-level cache: the next call starts cold.

    The buffer is allocated once per timing: a fresh one per sample cost 65,536 page faults (4 KiB
    pages, 256 MiB), far more than a short call takes.
    """
    buffer = torch.empty(_FLUSH_BYTES, dtype=torch.uint8, device=device)

    def flush() -> None:
        buffer.fill_(1)
        _synchronize(device)

    flush()  # its pages are faulted in here, before the timing starts
    return flush


def _block(
    fn: Callable[[], object], number: int, device: torch.device
) -> tuple[float, float | None]:
    """``(seconds, run-queue share)`` of ``number`` back-to-back calls.

    The share is that of the block's wall time the thread waited for a core (None: the kernel does
    not say). The wait is read outside the clock's interval (before the clock when it opens, after
    it when it closes), so the timed calls pay nothing for it.
    """
    wait0 = schedstat.runqueue_seconds()
    t0 = time.perf_counter()
    seconds = _block_seconds(fn, number, device)
    wall = time.perf_counter() - t0  # the host's wall time (on CUDA ``seconds`` is the events')
    wait1 = schedstat.runqueue_seconds()
    if wait0 is None or wait1 is None:
        return seconds, None
    return seconds, (wait1 - wait0) / wall if wall > 0 else 0.0


@dataclass(frozen=True)
class Blocks:
    """One timing's blocks: those kept, those dropped as descheduled, and every block's wait."""

    # per-call seconds of each kept block; when no block was left undisturbed, the dropped ones
    samples: list[float]
    runs: int  # calls in those blocks
    # per-call seconds of the blocks dropped as descheduled
    dropped: list[float] = field(default_factory=list)
    # run-queue wait / wall time of every timed block; empty: unknown
    shares: list[float] = field(default_factory=list)
    # the re-measure allowance ran out before the kept blocks reached min_runs and min_time
    short: bool = False

    def waited(self, limit: float = schedstat.WAIT_LIMIT) -> int:
        """Timed blocks (kept or dropped) that waited for a core over ``limit`` of their time."""
        return sum(share > limit for share in self.shares)


def time_blocks(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    config: TimerConfig | None = None,
    *,
    between: Callable[[], object] | None = None,
    between_every_s: float = 0.5,
    wait_limit: float | None = None,
    redo_s: float = 0.0,
    warm_s: float | None = None,
) -> Blocks:
    """Time ``fn`` in blocks (see the module docstring), reading the run-queue wait beside each.

    Args:
        fn: the call to time; inputs must already exist (never time setup).
        device: where ``fn`` runs; CUDA work is synchronised before every clock read.
        config: repeat policy.
        between: called between two blocks (outside the timed region) once at least
            ``between_every_s`` seconds of blocks have passed since the last call: the runner's
            calibration probe, so a long case is checked while it runs, not only around it.
        between_every_s: seconds of timed blocks between two calls of ``between``.
        wait_limit: a block that waited for a core more than this share of its wall time is dropped
            and another is timed in its place; None keeps every block (the wait is still read and
            returned).
        redo_s: seconds of dropped blocks allowed beyond ``config.max_time``; once more than that
            was dropped the timing stops with what it kept (``short`` when that is less than
            ``min_runs`` and ``min_time`` ask).
        warm_s: seconds of a call of ``fn`` the caller has just made. One at least
            ``config.warmup_time`` long warmed everything a warm-up would and sizes the blocks
            itself (one call each): no warm-up call and no sizing call are made, which spares a
            one-second case two seconds of its budget.
    """
    config = config or TimerConfig()
    device = torch.device(device)
    warm = warm_s is not None and warm_s >= config.warmup_time
    if not warm:
        _warm_up(fn, device, config)
    flush = cache_flusher(device) if config.flush_cache else None
    # max_time bounds the wall time from here, flushes and probes included
    began = time.perf_counter()
    # sizes the blocks; kept only if nothing else fits
    first = warm_s if warm else _sizing_call(fn, device, config.block_time)
    number = 1 if flush else max(1, math.floor(config.block_time / max(first, 1e-9)))
    tally = _Tally()
    since_hook = 0.0  # seconds of blocks since ``between`` was last called
    while not tally.done(config, began, redo_s):
        if between is not None and (tally.kept or tally.dropped) and since_hook >= between_every_s:
            between()
            since_hook = 0.0
        if flush:
            flush()
        seconds, share = _block(fn, number, device)
        since_hook += seconds
        tally.add(seconds, number, share, wait_limit)
    return tally.blocks(first, number)


def _sizing_call(fn: Callable[[], object], device: torch.device, block_time: float) -> float:
    """Seconds of one call of ``fn``, made again while it waited for a core and that is cheap.

    The blocks are sized by it. A 0.2 ms call that sat out a neighbour's 4 ms slice sized its
    blocks 20x too short; blocks shorter than a slice then caught the neighbour in one block of ten
    instead of in every block, and a case sharing its core passed for quiet. A call that waited over
    ``schedstat.WAIT_LIMIT`` of its time is made again while the calls so far cost less than one
    block (a longer call makes blocks of one call anyway).
    """
    seconds, share = _block(fn, 1, device)
    spent = seconds
    while share is not None and share > schedstat.WAIT_LIMIT and spent < block_time:
        seconds, share = _block(fn, 1, device)
        spent += seconds
    return seconds


def _warm_up(fn: Callable[[], object], device: torch.device, config: TimerConfig) -> None:
    """Call ``fn`` at least ``config.warmup`` times and for ``config.warmup_time`` seconds."""
    start = time.perf_counter()
    calls = 0
    while calls < config.warmup or time.perf_counter() - start < config.warmup_time:
        fn()  # a cold process (thread pool, caches, clocks) needs more than one call
        calls += 1
        _synchronize(device)


@dataclass
class _Tally:
    """The blocks one timing has timed so far."""

    kept: list[float] = field(default_factory=list)  # per-call seconds of the kept blocks
    # per-call seconds of the blocks dropped as descheduled
    dropped: list[float] = field(default_factory=list)
    # run-queue share of every block whose wait was read
    shares: list[float] = field(default_factory=list)
    known: bool = True  # every block's wait was read
    runs: int = 0  # calls in the kept blocks
    spent: float = 0.0  # seconds of the kept blocks
    lost: float = 0.0  # seconds of the dropped blocks
    # stopped by the re-measure allowance before min_runs and min_time were reached
    short: bool = False

    def done(self, config: TimerConfig, began: float, redo_s: float) -> bool:
        """Whether to stop: enough blocks kept, ``max_time`` passed, or the allowance ran out.

        Enough: the kept blocks reach ``min_runs`` and ``min_time``. ``max_time`` counts since
        ``began``, re-measured time within the allowance ``redo_s`` not counted. An allowance that
        ran out marks the tally ``short``.
        """
        if self.runs >= config.min_runs and self.spent >= config.min_time:
            return True
        if time.perf_counter() - began - min(self.lost, redo_s) >= config.max_time:
            return True
        if self.lost > redo_s:
            self.short = True
            return True
        return False

    def add(
        self, seconds: float, number: int, share: float | None, wait_limit: float | None
    ) -> None:
        """Count a block of ``number`` calls: dropped when its wait share is over ``wait_limit``."""
        if share is None:
            self.known = False
        else:
            self.shares.append(share)
        if wait_limit is not None and share is not None and share > wait_limit:
            self.dropped.append(seconds / number)
            self.lost += seconds
            return
        self.kept.append(seconds / number)
        self.runs += number
        self.spent += seconds

    def blocks(self, first: float, number: int) -> Blocks:
        """What the timing found; with no block timed, the sizing call ``first`` alone."""
        shares = self.shares if self.known else []
        if self.kept:
            return Blocks(self.kept, self.runs, self.dropped, shares, self.short)
        # a neighbour left no block alone: the dropped ones, for inspection (never an undisturbed
        # time)
        if self.dropped:
            return Blocks(
                list(self.dropped), len(self.dropped) * number, self.dropped, shares, True
            )
        return Blocks([first], 1, [], shares, self.short)


def measured_calls(config: TimerConfig, call_s: float | None) -> int:
    """Calls :func:`time_blocks` makes at least for a call of ``call_s`` seconds.

    ``call_s`` is given as ``warm_s`` (None: unknown). The count is ``min_runs``, plus the warm-up
    and sizing calls for calls shorter than the warm-up time.
    """
    long_call = call_s is not None and call_s >= config.warmup_time
    return config.min_runs + (0 if long_call else config.warmup + 1)


def time_call(
    fn: Callable[[], object],
    device: torch.device | str = "cpu",
    config: TimerConfig | None = None,
    *,
    between: Callable[[], object] | None = None,
    between_every_s: float = 0.5,
) -> tuple[list[float], int]:
    """Time ``fn`` and return ``(per-call seconds per block, total calls timed)``, every block kept.

    :func:`time_blocks` without dropping descheduled blocks; see it for the arguments.
    """
    blocks = time_blocks(fn, device, config, between=between, between_every_s=between_every_s)
    return blocks.samples, blocks.runs


def cuda_graph_seconds(
    fn: Callable[[], object], device: torch.device | str, replays: int = 20
) -> float:
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
