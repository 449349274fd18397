"""Measure each case in a process of its own, so a hung, crashing or memory-hungry case ends alone.

Workers come from multiprocessing's ``forkserver``: one server imports torch and attnbench once
(:data:`PRELOAD`) and forks a child per case, which starts in milliseconds from the same state as
every other and returns all its memory when it exits. For a case that sends nothing back the parent
records ``timeout`` (past the hard timeout: killed), ``oom`` (a SIGKILL the parent did not send
while the cgroup's OOM-kill count rose, :func:`cgroup_oom_kills`) or ``crashed`` (the signal named).

CPU cases are capped with ``RLIMIT_DATA`` (current use + the memory budget +
:data:`CAP_ALLOWANCE_BYTES`): it counts private writable mappings only, while ``RLIMIT_AS`` counts
the address space torch and glibc reserve without using and fails a torch process far below the
budget. CUDA cases are not capped (the driver maps large writable regions). A worker starts with the
server's environment (allocator variables are read only then): :class:`WorkerPool` starts the server
with its ``env``, and restarts it for a pool with another.
"""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import gc
import multiprocessing
import multiprocessing.forkserver
import os
import resource
import signal
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import torch

from attnbench.contract import Status
from attnbench.io import error_line
from attnbench.measure import memory, regime
from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import Environment, Measurement
from attnbench.measure.runner import measure
from attnbench.plugins import load_plugins
from attnbench.spec import AttnSpec

__all__ = ["PRELOAD", "CAP_ALLOWANCE_BYTES", "CaseJob", "cgroup_oom_kills", "WorkerPool"]

PRELOAD = [
    "torch",
    *memory.PROFILER_IMPORTS,
    "attnbench",
    "attnbench.measure.worker",
    "attnbench.measure.runner",
    "attnbench.measure._forkserver",
]
"""Modules the fork server imports once: the profiler's (:data:`.memory.PROFILER_IMPORTS`: seconds
in every fresh worker otherwise); ``_forkserver`` so that workers start with Ctrl-C ignored."""
CAP_ALLOWANCE_BYTES = 1 * 2**30
"""Added to the memory budget for the cap: float64 reference, profiler buffers, allocator slack."""
_server_env: dict[str, str] | None = None
_server_lock = threading.Lock()


@dataclass(frozen=True)
class CaseJob:
    """Everything a worker needs to measure one case (pickled to the child)."""

    variant: str  # registry name
    spec: AttnSpec  # the case
    config: MeasureConfig  # how to measure it
    peak_flops: float | None  # this machine's matmul FLOP/s for the time guard
    env: Environment | None  # environment to record with the measurement
    # the parent's import path (plugins live there)
    sys_path: list[str] = field(default_factory=list)
    # the child's os.environ (empty: keep the server's)
    environ: dict[str, str] = field(default_factory=dict)
    memory_cap_bytes: int | None = None  # RLIMIT_DATA above the child's current use; None: no cap
    # one call's seconds extrapolated by the sweep (time guard); None: model
    expected_call_s: float | None = None


def _vm_data_bytes() -> int:
    """This process's private writable memory (``VmData`` in /proc/self/status), 0 if unknown."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmData:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0


def _apply_memory_cap(extra_bytes: int) -> int | None:
    """Limit this process's data segment to its current size + ``extra_bytes``; the limit, or None.

    Returns None where the OS does not allow it (no ``RLIMIT_DATA``, or a hard limit below the
    request).
    """
    if not hasattr(resource, "RLIMIT_DATA"):
        return None
    limit = _vm_data_bytes() + int(extra_bytes)
    soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    if hard != resource.RLIM_INFINITY and hard < limit:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    except (ValueError, OSError):
        return None
    return limit


def _child(conn, job: CaseJob) -> None:
    """Worker body: measure one case and send the Measurement back (never raises)."""
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # the parent decides what these do
        signal.signal(sig, signal.SIG_IGN)
    _die_with_the_server()
    # Objects inherited from the server (torch, inductor: ~10^6) move to the permanent generation:
    # a full collection would otherwise walk them all and copy every page they sit on.
    gc.freeze()
    try:
        if job.environ:  # the parent's environment now (the server's is the one it started with)
            os.environ.clear()
            os.environ.update(job.environ)
        if job.sys_path:
            sys.path[:] = job.sys_path
        load_plugins()
        # Every worker measures in the same regime: threads and pinned allocator thresholds (the
        # fork server started with regime.child_env, so thresholds already held from its first
        # allocation).
        regime.apply(regime.Regime(threads=job.config.threads or torch.get_num_threads()))
        if job.memory_cap_bytes is not None:
            _apply_memory_cap(job.memory_cap_bytes)
        result = measure(
            job.variant,
            job.spec,
            job.config,
            peak_flops=job.peak_flops,
            env=job.env,
            expected_call_s=job.expected_call_s,
        )
    except BaseException as exc:  # noqa: BLE001
        # e.g. a plugin that fails to import: a row, not a lost case
        result = Measurement(
            variant=job.variant,
            spec=job.spec,
            status=Status.ERROR,
            env=job.env,
            workload=job.config.workload,
            reason=f"worker: {error_line(exc)}",
        )
    # the parent is gone: nobody to tell
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        conn.send(result)
    conn.close()


def _die_with_the_server() -> None:
    """Ask Linux to kill this worker when the fork server exits (it does when the parent does).

    That way an orphaned case does not run on after ``attnbench run`` was killed outright.
    """
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


_PR_SET_PDEATHSIG = 1


def cgroup_oom_kills() -> int | None:
    """Processes the kernel's OOM killer has killed in this process's memory cgroup (None: unknown).

    cgroup v2's ``memory.events`` or v1's ``memory.oom_control`` (``oom_kill``, Linux 4.13+), at the
    path ``/proc/self/cgroup`` names or at the mount's root (a container sees its own cgroup there).
    """
    paths = []
    with contextlib.suppress(OSError):
        for line in Path("/proc/self/cgroup").read_text(encoding="utf-8").splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                paths += [f"/sys/fs/cgroup{path}/memory.events"]
            elif "memory" in controllers.split(","):
                paths += [f"/sys/fs/cgroup/memory{path}/memory.oom_control"]
    for path in [
        *paths,
        "/sys/fs/cgroup/memory.events",
        "/sys/fs/cgroup/memory/memory.oom_control",
    ]:
        with contextlib.suppress(OSError, ValueError):
            for line in Path(path).read_text(encoding="utf-8").splitlines():
                key, _, value = line.partition(" ")
                if key == "oom_kill":
                    return int(value)
    return None


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


class WorkerPool:
    """Runs one case per forked worker with a hard timeout; see the module docstring.

    Args:
        env: variables the fork server (and so every worker) starts with, on top of ``os.environ``;
            allocator settings belong here. The server is restarted when ``env`` changes.
    """

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.env = dict(env or {})
        self.ctx = multiprocessing.get_context("forkserver")
        self._current = None
        self._killed_by_us = False
        self._start_server()

    def _start_server(self) -> None:
        global _server_env
        server = multiprocessing.forkserver._forkserver
        with _server_lock:
            running = (
                server._forkserver_pid is not None
                and os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0
            )
            if running and _server_env == self.env:
                return
            if running:
                server._stop()
            self.ctx.set_forkserver_preload(PRELOAD)
            # The swap is the whole process's: a thread starting a process meanwhile can hand it a
            # half-written environment, so the counting thread beside a sweep keeps its own copy
            # (instructions.Beside).
            saved = dict(os.environ)
            try:
                os.environ.update(self.env)  # the server's interpreter starts with these
                server.ensure_running()
            finally:
                os.environ.clear()
                os.environ.update(saved)
            _server_env = dict(self.env)

    def kill_current(self) -> None:
        """Kill the case in hand (for a second Ctrl-C); safe to call from a signal handler."""
        proc = self._current
        if proc is not None and proc.pid is not None:
            self._killed_by_us = True
            with contextlib.suppress(OSError):
                os.kill(proc.pid, signal.SIGKILL)

    def run(self, job: CaseJob, timeout_s: float) -> Measurement:
        """Measure ``job`` in a fresh worker, killed if it does not answer in ``timeout_s``."""
        self._start_server()
        if job.environ:
            job = dataclasses.replace(job, environ={**job.environ, **self.env})
        parent_conn, child_conn = self.ctx.Pipe(duplex=False)
        proc = self.ctx.Process(
            target=_child,
            args=(child_conn, job),
            daemon=True,
            name=f"attnbench-{job.variant}-L{job.spec.lq}",
        )
        self._killed_by_us = False
        oom_kills_before = cgroup_oom_kills()
        start = time.perf_counter()
        proc.start()
        self._current = proc
        child_conn.close()
        try:
            result, timed_out = self._answer(proc, parent_conn, timeout_s)
        finally:
            self._current = None
            parent_conn.close()
        if result is not None:
            return result
        base = dict(variant=job.variant, spec=job.spec, env=job.env, workload=job.config.workload)
        if timed_out:
            return Measurement(
                status=Status.TIMEOUT,
                reason=f"killed after {timeout_s:g} s (hard timeout for one case)",
                **base,
            )
        return self._unanswered(proc.exitcode, time.perf_counter() - start, oom_kills_before, base)

    def _answer(
        self, proc: multiprocessing.process.BaseProcess, conn, timeout_s: float
    ) -> tuple[Measurement | None, bool]:
        """The worker's Measurement (None: it died before sending one), and whether it timed out.

        It timed out when it ran past ``timeout_s`` (then it was killed). The worker is gone on
        return.
        """
        result, timed_out = None, False
        if conn.poll(timeout_s):
            try:
                result = conn.recv()
            except (EOFError, OSError):
                result = None  # the child died before sending
        else:
            timed_out = True
            self._killed_by_us = True
            proc.kill()
        proc.join(10)
        if proc.is_alive():
            proc.kill()
            proc.join()
        return result, timed_out

    def _unanswered(
        self, code: int | None, elapsed: float, oom_kills_before: int | None, base: dict
    ) -> Measurement:
        """The record of a worker that ended without a result: crashed, or oom.

        The worker ended (exit ``code``) after ``elapsed`` s; it is oom when the cgroup counted an
        OOM kill (see the module docstring).
        """
        if code is None or code >= 0:
            return Measurement(
                status=Status.CRASHED,
                reason=f"worker exited with code {code} without a result after {elapsed:.1f} s",
                **base,
            )
        sig = -code
        if sig != signal.SIGKILL:
            return Measurement(
                status=Status.CRASHED,
                reason=f"worker died from {_signal_name(sig)} after {elapsed:.1f} s",
                **base,
            )
        if self._killed_by_us:
            return Measurement(
                status=Status.CRASHED, reason="worker killed on request (interrupted)", **base
            )
        after = cgroup_oom_kills()
        if after is not None and oom_kills_before is not None and after > oom_kills_before:
            return Measurement(
                status=Status.OOM,
                reason=(
                    f"worker killed by SIGKILL after {elapsed:.1f} s by the kernel's OOM killer "
                    f"(this cgroup's oom_kill count went from {oom_kills_before} to {after})"
                ),
                **base,
            )
        known = (
            "no OOM kill recorded in this cgroup"
            if after is not None
            else "the cgroup's OOM count is unreadable here"
        )
        return Measurement(
            status=Status.CRASHED,
            reason=(
                f"worker killed by signal 9 (SIGKILL) after {elapsed:.1f} s, not by attnbench "
                f"({known}: another process, or an OOM killer outside this cgroup)"
            ),
            **base,
        )
