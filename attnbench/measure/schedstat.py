"""The calling thread's run-queue wait: how long it was runnable but had no core, because another process had it.

Linux reports it per thread in ``/proc/thread-self/schedstat`` (nanoseconds on a CPU, nanoseconds runnable but
waiting on a run queue, timeslices). A neighbour that takes whole scheduler slices shows here while the calibration
probe (:mod:`.probe`, about 1 ms) slips between the slices and stays typical. Time a call spends sleeping or blocked
(I/O, a lock) is not waiting for a core and does not show: a slowdown of that kind stays a slowdown.

Both timers that judge it (the runner's blocks, :func:`.timer.time_blocks`, and the asv time benchmark's
``attnbench.asv_bench.WaitWatch``) read it just outside the interval they time: the wait before the clock when the
interval opens, the clock before the wait when it closes, so the reading costs the timed calls nothing. A preemption
at the interval's edge can therefore count a little more wait than the interval itself held.

Only the timing thread is seen: with several torch threads (``--threads N``) a neighbour that deschedules another
thread of the pool stalls the timed call without this thread waiting.
"""

from __future__ import annotations

SCHEDSTAT = "/proc/thread-self/schedstat"
"""Linux's scheduler figures of the calling thread: nanoseconds on a CPU, nanoseconds runnable but waiting for one."""
WAIT_LIMIT = 0.1
"""A timed interval that waited for a core more than this share of its wall time was descheduled by a neighbour."""


def runqueue_seconds() -> float | None:
    """Seconds this thread has spent runnable but waiting for a core (None where the kernel does not say)."""
    try:
        with open(SCHEDSTAT, encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def available() -> bool:
    """Whether this kernel reports the calling thread's run-queue wait (else the probe rule stands alone)."""
    return runqueue_seconds() is not None
