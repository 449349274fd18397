"""The calling thread's run-queue wait: how long it was runnable while another process had the core.

Linux reports it per thread in ``/proc/thread-self/schedstat`` (nanoseconds on a CPU, nanoseconds
runnable but waiting on a run queue, timeslices). A neighbour that takes whole scheduler slices
shows here while the calibration probe (:mod:`.probe`, about 1 ms) slips between the slices. Time
spent sleeping or blocked (I/O, a lock) is not waiting for a core: that slowdown stays a slowdown.

Both timers that judge it (:func:`.timer.time_blocks` and ``attnbench.asv_bench.WaitWatch``) read
it just outside the interval they time (the wait before the clock when it opens, the clock before
the wait when it closes), so the reading costs the timed calls nothing; a preemption at the edge
can count a little more wait than the interval held. Only the timing thread is seen: with several
torch threads, a neighbour that deschedules another thread of the pool stalls the call unseen.
"""

from __future__ import annotations

__all__ = ["SCHEDSTAT", "WAIT_LIMIT", "runqueue_seconds", "available"]

SCHEDSTAT = "/proc/thread-self/schedstat"
"""Linux's scheduler figures of the calling thread: ns on a CPU, ns runnable but waiting for one."""
WAIT_LIMIT = 0.1
"""An interval that waited for a core over this share of its wall time was descheduled."""


def runqueue_seconds() -> float | None:
    """Seconds this thread has spent runnable, waiting for a core (None: the kernel won't say)."""
    try:
        with open(SCHEDSTAT, encoding="ascii") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return None


def available() -> bool:
    """Whether the kernel reports the thread's run-queue wait (else the probe rule stands alone)."""
    return runqueue_seconds() is not None
