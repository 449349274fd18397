"""A busy neighbour for tests of interference detection: a process spinning on the one core this thread is pinned to."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator


@contextlib.contextmanager
def spinning_on_this_core(seconds: float = 60.0) -> Iterator[None]:
    """Pin this thread to one core and start a process spinning there (for at most ``seconds``); undone on exit.

    Two runnable processes on one core: the scheduler gives each about half of it, so a timed block waits for
    the core about half its wall time.
    """
    cores = os.sched_getaffinity(0)
    core = min(cores)
    os.sched_setaffinity(0, {core})
    neighbour = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import os, time; os.sched_setaffinity(0, {{{core}}}); "
            f"print(flush=True); end = time.time() + {seconds}\nwhile time.time() < end: pass",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        neighbour.stdout.readline()  # it spins from here
        yield
    finally:
        neighbour.kill()
        neighbour.wait()
        os.sched_setaffinity(0, cores)
