"""The warm-up of the caches the parallel workers share (tests/warm_caches.py): a worker that reaches a compiling module
waits until the warm-up process has let go of its lock, and never waits where there is no warm-up."""

from __future__ import annotations

import subprocess
import sys
import time

import tests.conftest as conftest


def _hold(path, seconds: float) -> subprocess.Popen:
    """A process that holds ``path`` locked for ``seconds`` (as the warm-up holds it while it compiles)."""
    code = (
        "import fcntl, sys, time; f = open(sys.argv[1], 'w'); fcntl.flock(f, fcntl.LOCK_EX); "
        "print('locked', flush=True); time.sleep(float(sys.argv[2]))"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(path), str(seconds)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout.readline().strip() == "locked"
    return proc


def test_a_worker_waits_for_the_warm_up_once(tmp_path, monkeypatch):
    lock = tmp_path / "warm.lock"
    monkeypatch.setenv(conftest.WARM_LOCK, str(lock))
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(conftest, "_warm_waited", False)
    holder = _hold(lock, 1.5)
    start = time.monotonic()
    conftest._wait_for_the_warm_up()
    assert time.monotonic() - start > 1.2  # it returned only once the holder let go (after 1.5 s)
    holder.wait()
    holder = _hold(lock, 30)  # a second compiling module of the same worker does not wait again
    try:
        start = time.monotonic()
        conftest._wait_for_the_warm_up()
        assert time.monotonic() - start < 1.0
    finally:
        holder.kill()
        holder.wait()


def test_without_a_warm_up_nothing_waits(tmp_path, monkeypatch):
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw1")
    monkeypatch.setattr(conftest, "_warm_waited", False)
    monkeypatch.setenv(
        conftest.WARM_LOCK, str(tmp_path / "gone.lock")
    )  # its session ended: the file is removed
    start = time.monotonic()
    conftest._wait_for_the_warm_up()
    assert time.monotonic() - start < 1.0
