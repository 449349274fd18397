"""Instruction counts under valgrind: a deterministic measure of work, beside wall time.

:func:`count_instructions` counts many cases in ONE ``valgrind --tool=callgrind`` process (torch
takes minutes to start under valgrind). The process starts uninstrumented; for each case it builds
the closure the runner times (:func:`attnbench.measure.runner.make_call`), makes the warm-up call,
gates its result and warms up again, all uninstrumented (valgrind's plain translation, several
times faster than callgrind's), then switches instrumentation on, collects over ``calls`` calls,
dumps and switches it off again: instructions per call = the dump's total / ``calls``. On x86-64
Linux the switches are valgrind's client requests (:func:`_client_requests`); elsewhere
instrumentation is switched on once with ``callgrind_control``, after the imports, and stays on.

Counts are taken with portable kernels (:data:`_COUNT_ENV`), so that a count is the same on every
x86 runner. They do not see cache misses, page faults, memory bandwidth or time spent waiting, and
are summed over threads: they stand beside the timings, never instead of them.
"""

from __future__ import annotations

import ctypes
import dataclasses
import json
import math
import mmap
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from attnbench.contract import Method, Status
from attnbench.errors import CouldNotMeasure
from attnbench.measure.record import Count
from attnbench.spec import AttnSpec

__all__ = [
    "valgrind_version",
    "missing_message",
    "CountConfig",
    "CountError",
    "predicted_seconds",
    "countable",
    "within_budget",
    "CANCELLED",
    "count_instructions",
    "count_in_processes",
    "in_parallel",
    "Beside",
    "peak_for",
    "TMP_PREFIX",
    "remove_orphans",
]

if TYPE_CHECKING:
    from attnbench.measure.gate import GateResult

_PACKAGE = "valgrind"
"""The Debian package (and the command) a count needs."""
_METHOD = Method.CALLGRIND
_SLOWDOWN = 80.0
"""Seconds under callgrind per native second of a counted call, portable kernels, one thread: about
60 measured at L=512 on 2026-11-24 (valgrind 3.19, torch 2.13 CPU; a case's ``seconds`` in the
counting process's results against its native time), rounded up so that predictions err long."""
_COUNT_ENV = {
    "MKL_ENABLE_INSTRUCTIONS": "SSE4_2",
    "ATEN_CPU_CAPABILITY": "default",
    "ONEDNN_MAX_CPU_ISA": "SSE41",
    "OMP_NUM_THREADS": "1",
    "OPENBLAS_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}
"""The counting process's kernels: one portable instruction set (MKL's SSE4.2 code, ATen's default
kernels), and no helper threads (counts are summed over threads). valgrind runs FMA instructions
through slow helpers: a batched call at B1 H8 L512 took 15.9 s under callgrind with the host's
AVX2/FMA kernels and 1.27 s with these, 0.02 s natively (2026-11-24, valgrind 3.19: the same call
under ``valgrind --tool=callgrind python ...`` with and without these variables)."""
_KERNELS = "portable kernels: MKL SSE4.2, ATen default"
"""How the counts' kernels are recorded beside valgrind's version."""
_STARTUP_S = 240.0
"""Allowed for torch to start under valgrind before the cases' own time: 80-180 s fully
instrumented on 2026-11-24 (``valgrind --tool=callgrind python -c 'import torch'``)."""
_GATE_SLICES = 3
"""(batch, head) slices the gate checks under valgrind (the first, the last and a seeded one): the
float64 reference is the slowest part of a case there, and the timing run checks every slice of
the same closure."""
_TOTALS = re.compile(rb"^totals:\s+(\d+)", re.MULTILINE)
"""A dump's count: the sum of its cost lines. Not its ``summary:`` line, which callgrind computes as
its running total less the one at the previous dump: switching instrumentation restarts that running
total, and the summary then gave a case's count less the previous case's (seen: 1.95 million for a
case of 23.7 million)."""


_ENV_CONTROL = "ATTNBENCH_CALLGRIND_CONTROL"
"""valgrind's ``callgrind_control``: the counting process switches instrumentation on with it."""
_ENV_SWITCH = "ATTNBENCH_CALLGRIND_SWITCH"
"""How the counting process gets instrumented: ``case`` (client requests around each case's counted
calls), ``control`` (``callgrind_control`` once, after the imports) or empty (from the start)."""
_RUNNING_ON_VALGRIND = 0x1001
_START_INSTRUMENTATION = (ord("C") << 24 | ord("T") << 16) + 4  # callgrind.h's requests
_STOP_INSTRUMENTATION = _START_INSTRUMENTATION + 1
_REQUEST_X86_64 = bytes.fromhex(
    "4889f8"  # mov rax, rdi: the request block (code, five arguments)
    "31d2"  # xor edx, edx: the answer outside valgrind, 0
    "48c1c70348c1c70d48c1c73d48c1c733"  # rol rdi by 3, 13, 61, 51 (valgrind's marker; rdi kept)
    "4887db"  # xchg rbx, rbx: the request; valgrind puts its answer in rdx
    "4889d0c3"  # mov rax, rdx; ret
)
"""valgrind.h's ``VALGRIND_DO_CLIENT_REQUEST_EXPR`` for amd64, as a function ``f(block) -> answer``
(x86-64 machine code)."""


def valgrind_version(environ: Mapping[str, str] | None = None) -> str | None:
    """``"valgrind-3.19.0"``, or None when valgrind is not on PATH (or does not answer).

    Args:
        environ: the environment whose PATH is searched and which ``valgrind --version`` runs in
            (default: this process's, now).
    """
    environ = os.environ if environ is None else environ
    exe = _on_path("valgrind", environ)
    if exe is None:
        return None
    try:
        out = subprocess.run(
            [exe, "--version"], capture_output=True, text=True, timeout=30, env=environ
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None


def _on_path(command: str, environ: Mapping[str, str]) -> str | None:
    """Where ``command`` is on ``environ``'s PATH (None: not there)."""
    return shutil.which(command, path=environ.get("PATH", os.defpath))


def missing_message() -> str:
    """What to tell a user without valgrind."""
    return (
        f"instruction counts need valgrind on PATH: install the {_PACKAGE} package "
        f"(apt-get install {_PACKAGE})"
    )


@dataclass(frozen=True)
class CountConfig:
    """How cases are counted."""

    # counted calls per case (their total / calls is the count per call). One: counts are
    # deterministic, and an instrumented call is most of a case's time under valgrind (with 2 calls,
    # four cases up to L=1024 took 200 s with torch's start, with 1 call 148 s, the same counts to 4
    # figures; 2026-11-28, valgrind 3.19)
    calls: int = 1
    # calls after the gate and before counting (a cold first case of a process counts more)
    warmup_calls: int = 1
    budget_s: float = 300.0  # predicted seconds under valgrind per case above which it is skipped
    # the whole valgrind process (None: STARTUP_S + the cases' predicted seconds x 3)
    timeout_s: float | None = None
    threads: int = 1  # torch intra-op threads (the runner's default regime)
    seed: int = 0  # input seed (the runner's)
    check_accuracy: bool = True  # put each case's warm-up result through the correctness gate
    # run valgrind only on a core nothing else wants (SCHED_IDLE): counting beside a timed sweep
    idle: bool = False

    def __post_init__(self) -> None:
        for name in ("calls", "threads"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if (
            isinstance(self.warmup_calls, bool)
            or not isinstance(self.warmup_calls, int)
            or self.warmup_calls < 0
        ):
            raise ValueError(f"warmup_calls must be an int >= 0, got {self.warmup_calls!r}")
        if not (self.budget_s > 0 and math.isfinite(self.budget_s)):
            raise ValueError(
                f"budget_s must be a finite number of seconds > 0, got {self.budget_s!r}"
            )
        if self.timeout_s is not None and not (
            self.timeout_s > 0 and math.isfinite(self.timeout_s)
        ):
            raise ValueError(
                f"timeout_s must be a finite number of seconds > 0 or None, got {self.timeout_s!r}"
            )


class CountError(RuntimeError, CouldNotMeasure):
    """The valgrind process could not start or gave nothing (the message ends with its output)."""


def predicted_seconds(
    variant: str, spec: AttnSpec, config: CountConfig, peak_flops: float
) -> float:
    """Seconds a case is predicted to take under valgrind: its calls and gate, x :data:`_SLOWDOWN`.

    The calls are the warm-up and the counted ones; the correctness gate runs on
    :data:`_GATE_SLICES` slices.
    """
    from attnbench.measure import guard
    from attnbench.registry import get_variant

    impl = get_variant(variant)
    per_call = guard.predicted_seconds(impl, spec, peak_flops)
    gate = (
        guard.reference_seconds(impl, spec, min(_GATE_SLICES, spec.batch * spec.heads), peak_flops)
        if config.check_accuracy
        else 0.0
    )
    return (per_call * (1 + config.warmup_calls + config.calls) + gate) * _SLOWDOWN


def _plan(
    cases: Sequence[tuple[str, AttnSpec]], config: CountConfig, version: str
) -> tuple[list[int], list[Count | None]]:
    """Which cases go to valgrind (their indices), and the others' counts (skipped, with why)."""
    from attnbench.registry import get_variant
    from attnbench.variants.base import Variant

    peak = peak_for(config)
    todo, decided = [], []
    for i, (name, spec) in enumerate(cases):
        reasons = []
        if spec.device_type != "cpu":
            reasons.append(
                f"instruction counts are taken on the CPU only (this case is on {spec.device})"
            )
        elif type(get_variant(name)).warm_up is not Variant.warm_up:
            # compiled variants: torch.compile on first use
            reasons.append(
                f"{name} compiles per shape on its first call: too slow to count under valgrind"
            )
        else:
            reasons += get_variant(name).not_supported_reasons(spec)
            if not reasons:
                seconds = predicted_seconds(name, spec, config, peak)
                if seconds > config.budget_s:
                    reasons.append(
                        f"predicted {seconds:,.0f} s under valgrind > budget {config.budget_s:g} s"
                    )
        if reasons:
            decided.append(
                Count(name, spec, Status.SKIPPED, reason="; ".join(reasons), valgrind=version)
            )
        else:
            decided.append(None)
            todo.append(i)
    return todo, decided


def countable(
    cases: Sequence[tuple[str, AttnSpec]], config: CountConfig | None = None
) -> list[int]:
    """The indices of the cases valgrind would run: CPU, supported, not compiled, within budget."""
    return _plan(cases, config or CountConfig(), "")[0]


def within_budget(
    cases: Sequence[tuple[str, AttnSpec]],
    budget_s: float | None,
    config: CountConfig | None = None,
    first_per_variant: int = 0,
) -> dict[int, str]:
    """The cases a total budget leaves out: index -> the reason.

    The cases valgrind would run (on the CPU, supported, within the per-case ``config.budget_s``)
    are taken cheapest first by :func:`predicted_seconds` while their sum stays within ``budget_s``
    seconds (the process's start not included); None leaves none out. With ``first_per_variant``,
    each variant's cheapest that many cases come first (each within a quarter of the budget), so
    every variant gets the lengths a fit needs before any gets long ones.
    """
    config = config or CountConfig()
    if budget_s is None:
        return {}
    todo, _ = _plan(cases, config, "")
    peak = peak_for(config)
    cost = {i: predicted_seconds(*cases[i], config, peak) for i in todo}
    order = sorted(todo, key=lambda i: (cost[i], i))
    chosen, spent, taken = set(), 0.0, dict.fromkeys((cases[i][0] for i in todo), 0)
    for i in order:
        if taken[cases[i][0]] < first_per_variant and cost[i] <= budget_s / 4:
            chosen.add(i)
            spent += cost[i]
            taken[cases[i][0]] += 1
    for i in order:
        if i not in chosen and spent + cost[i] <= budget_s:
            chosen.add(i)
            spent += cost[i]
    return {
        i: (
            f"predicted {cost[i]:,.0f} s under valgrind: "
            f"beyond the counting budget of {budget_s:g} s (cases are counted cheapest first)"
        )
        for i in order
        if i not in chosen
    }


CANCELLED = "not counted: cancelled"
"""The reason of a case the counting was stopped before (by request): not a result."""


def count_instructions(
    cases: Sequence[tuple[str, AttnSpec]],
    config: CountConfig | None = None,
    *,
    progress: Callable[[int, int, Count], None] | None = None,
    cancel: threading.Event | None = None,
    environ: Mapping[str, str] | None = None,
) -> list[Count]:
    """Instructions per call of every case, counted in one valgrind process (see the module).

    Args:
        cases: ``(variant name, spec)`` pairs (names are checked before anything runs).
        config: calls, warm-up, budget, timeout, regime.
        progress: called as ``progress(done, total, count)`` as each case finishes (from this
            process).
        cancel: when set (from another thread), the valgrind process is killed and the cases it did
            not reach are errors "not counted: cancelled".
        environ: the environment valgrind is found in and its processes start from (default: this
            process's, copied now). A thread passes a copy taken before it starts: another thread
            changing the process environment while this one starts a process can hand the child a
            half-written one (``execve`` then fails with EFAULT).

    Returns:
        One :class:`Count` per case, in order. A case the process did not reach (a crash, the
        timeout) has status "error" with the reason; the counts it dumped before are kept.

    Raises:
        CountError: valgrind is missing, or the process gave no count at all (its output's end
            named).
        ValueError: an unknown variant name.
    """
    from attnbench.registry import get_variant

    config = config or CountConfig()
    cases = list(cases)
    for name, _ in cases:
        get_variant(name)
    environ = dict(os.environ if environ is None else environ)
    version = valgrind_version(environ)
    if version is None:
        raise CountError(missing_message())
    version = f"{version} ({_KERNELS})"
    todo, counts = _plan(cases, config, version)
    reporter = (
        None
        if progress is None
        else (lambda count: progress(sum(c is not None for c in counts), len(cases), count))
    )
    _count_todo(cases, todo, counts, config, version, environ, reporter, cancel)
    why = (
        CANCELLED
        if cancel is not None and cancel.is_set()
        else "not counted: the valgrind process timed out before this case"
    )
    return [
        c if c is not None else Count(*cases[i], Status.ERROR, valgrind=version, reason=why)
        for i, c in enumerate(counts)
    ]


def count_in_processes(
    cases: Sequence[tuple[str, AttnSpec]],
    config: CountConfig | None = None,
    processes: int = 1,
    *,
    progress: Callable[[int, int, Count], None] | None = None,
) -> list[Count]:
    """:func:`count_instructions` in up to ``processes`` valgrind processes at once, one per core.

    torch's start under valgrind is a fixed cost per process (half a minute of a core) and the cases
    are the rest: on two idle cores, two processes count a grid in about half the time. The cases
    are split by variant (every case of a variant in one process, in the order given), the variants
    dealt out dearest first to the process with the least predicted work (:func:`_split`), so the
    split is the same on every commit and machine. A case's count does not depend on its process:
    each is warmed up before it is counted.

    ``progress(done, total, count)`` is called as each case finishes, from this process's threads
    (one at a time). The environment is copied once, here, before any thread starts (see
    ``environ`` of :func:`count_instructions`).

    Raises:
        ValueError: ``processes`` is not an int >= 1, or an unknown variant name.
        CountError: as :func:`count_instructions` (the first process's to fail).
    """
    if isinstance(processes, bool) or not isinstance(processes, int) or processes < 1:
        raise ValueError(f"processes must be an int >= 1, got {processes!r}")
    config = config or CountConfig()
    cases = list(cases)
    groups = _split(cases, config, processes)
    if len(groups) < 2:
        return count_instructions(cases, config, progress=progress)
    environ = dict(os.environ)  # before the threads: see count_instructions' environ
    lock, done = threading.Lock(), [0] * len(groups)

    def job(g: int) -> Callable[[], list[Count]]:
        def arrived(k: int, _total: int, count: Count) -> None:
            with lock:
                done[g] = k
                if progress is not None:
                    progress(sum(done), len(cases), count)

        return lambda: count_instructions(
            [cases[i] for i in groups[g]], config, progress=arrived, environ=environ
        )

    counts = {
        i: count
        for g, found in enumerate(in_parallel([job(g) for g in range(len(groups))]))
        for i, count in zip(groups[g], found, strict=True)
    }
    return [counts[i] for i in range(len(cases))]


def in_parallel(jobs: list[Callable[[], object]]) -> list[object]:
    """Run ``jobs`` at once, each in a thread (each waits on a process of its own): their results in
    order, or the first error, raised in the caller's thread once every job has ended."""
    results: list[object] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


_SPLIT_PEAK = 1e11
"""The FLOP/s :func:`_split` predicts with: a fixed figure, so that the split is the same
everywhere (only the ratios between cases matter to it)."""


def _split(
    cases: Sequence[tuple[str, AttnSpec]], config: CountConfig, processes: int
) -> list[list[int]]:
    """The case indices of each counting process: whole variants, dearest first to the lightest.

    Only cases valgrind would run weigh anything; variants with none of them (every case skipped,
    decided without valgrind) go with the first process. Processes left empty are dropped, so a grid
    of one counted variant gets one process.
    """
    from attnbench.registry import get_variant

    runs = set(countable(cases, config))
    weight: dict[str, float] = {}
    for i, (name, spec) in enumerate(cases):
        get_variant(name)  # an unknown name fails here, before anything starts
        cost = predicted_seconds(name, spec, config, _SPLIT_PEAK) if i in runs else 0.0
        weight[name] = weight.get(name, 0.0) + cost
    loads, members = [0.0] * processes, [set() for _ in range(processes)]
    for name in sorted(weight, key=lambda n: -weight[n]):  # stable: ties keep the grid's order
        g = loads.index(min(loads)) if weight[name] > 0 else 0
        loads[g] += weight[name]
        members[g].add(name)
    groups = [[i for i, (n, _) in enumerate(cases) if n in names] for names in members]
    return [g for g in groups if g]


def _count_todo(
    cases: list[tuple[str, AttnSpec]],
    todo: list[int],
    counts: list[Count | None],
    config: CountConfig,
    version: str,
    environ: dict[str, str],
    reporter: Callable[[Count], None] | None,
    cancel: threading.Event | None,
) -> None:
    """Fill ``counts`` at the indices ``todo`` names, in as few valgrind processes as it takes.

    One process counts them, and a new one counts the rest each time a case kills it (that case is
    an error row). Stops at a timeout or a cancel (those cases stay None).

    Raises:
        CountError: a process failed without counting anything or dying in a case.
    """
    while todo:
        batch = [cases[i] for i in todo]

        def arrived(k: int, count: Count, todo: list[int] = todo) -> None:
            counts[todo[k]] = count
            if reporter is not None:
                reporter(count)

        ran = _one_process(batch, config, version, environ, arrived, cancel)
        if ran.cancelled:
            break
        if ran.dead is None and not ran.counts and ran.failed:
            raise CountError(
                f"the valgrind process {ran.ended} before counting anything:\n  "
                + "\n  ".join(ran.tail)
            )
        if ran.dead is not None:
            counts[todo[ran.dead]] = Count(
                *batch[ran.dead],
                Status.ERROR,
                valgrind=version,
                reason=f"the valgrind process {ran.ended} during this case",
            )
        if ran.timed_out or ran.dead is None:
            break
        todo = [i for k, i in enumerate(todo) if k not in ran.counts and k != ran.dead]


class Beside:
    """:func:`count_instructions` in a thread beside the caller's own work.

    ``attnbench run`` times its sweep meanwhile. One valgrind process counts the cases, and each
    count is handed over as it finishes.

    The counting process runs under SCHED_IDLE: it takes a core only when nothing else wants it, so
    the timed sweep's workers (one thread each by default) never wait for it, with or without a
    neighbour; beside a busy machine the counts simply arrive later.

    The thread counts in the environment this process had when the object was made: the sweep
    beside it changes the process environment while it starts its fork server.

    Args:
        cases: ``(variant name, spec)`` pairs to count.
        config: how to count.
    """

    def __init__(self, cases: Sequence[tuple[str, AttnSpec]], config: CountConfig) -> None:
        self.total = len(cases)
        self.cancel = threading.Event()
        self.error: CountError | None = None
        self.seconds = math.nan  # the counting's wall time, once done
        self._arrived: list[Count] = []
        self._handed = 0
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._start = time.perf_counter()
        self.config = dataclasses.replace(config, idle=True)  # the timed sweep's workers come first
        self._thread = threading.Thread(
            target=self._count,
            args=(list(cases), self.config, dict(os.environ)),
            name="attnbench-valgrind",
            daemon=True,
        )
        self._thread.start()

    def _count(
        self, cases: list[tuple[str, AttnSpec]], config: CountConfig, environ: dict[str, str]
    ) -> None:
        seen: set[int] = set()

        def keep(count: Count) -> None:
            with self._lock:
                seen.add(id(count))
                self._arrived.append(count)

        try:
            counts = count_instructions(
                cases,
                config,
                progress=lambda done, total, count: keep(count),
                cancel=self.cancel,
                environ=environ,
            )
            # the cases decided without valgrind (skipped), and those it never reached
            for count in counts:
                if id(count) not in seen:
                    keep(count)
        except (CountError, OSError) as exc:
            self.error = exc if isinstance(exc, CountError) else CountError(str(exc))
        finally:
            self.seconds = time.perf_counter() - self._start
            self._done.set()

    @property
    def done(self) -> bool:
        return self._done.is_set()

    @property
    def received(self) -> int:
        """Counts handed over so far."""
        return self._handed

    def take(self, wait_s: float = 0.0) -> list[Count]:
        """The counts that arrived since the last take (waiting up to ``wait_s`` for the end)."""
        if wait_s > 0:
            self._done.wait(wait_s)
        with self._lock:
            new, self._arrived = self._arrived, []
        self._handed += len(new)
        return new

    def stop(self) -> None:
        """Kill the valgrind process (what it counted so far stays takeable)."""
        self.cancel.set()
        self._thread.join(timeout=30)


def _timeout(cases: Sequence[tuple[str, AttnSpec]], config: CountConfig) -> float:
    if config.timeout_s is not None:
        return config.timeout_s
    peak = peak_for(config)
    return (
        _STARTUP_S
        + 10 * sum(predicted_seconds(n, s, config, peak) for n, s in cases)
        + 120 * len(cases)
    )


def peak_for(config: CountConfig) -> float:
    """The matmul peak at the counting process's thread count (the roof of its predictions)."""
    import torch

    from attnbench.measure.peak import matmul_peak

    saved = torch.get_num_threads()
    torch.set_num_threads(config.threads)
    try:
        return matmul_peak("cpu", "float32")
    finally:
        torch.set_num_threads(saved)


@dataclass(frozen=True)
class _Ran:
    """What one valgrind process did with a list of cases."""

    counts: dict[int, Count]  # index in the list -> its count (ok, wrong, skipped, error)
    dead: int | None  # the case the process died in (started, never reported), if any
    ended: str  # "exited 0", "died from SIGSEGV", "timed out", ...
    failed: bool  # the process did not exit 0
    timed_out: bool
    tail: list[str]  # the end of valgrind's output
    cancelled: bool = False  # killed on request


def _one_process(
    cases,
    config: CountConfig,
    version: str,
    environ: dict[str, str],
    arrived: Callable[[int, Count], None],
    cancel: threading.Event | None = None,
) -> _Ran:
    """Run one valgrind process over ``cases``: what it reported, and where it died if it did.

    The process starts from ``environ`` (found on its PATH); ``arrived(index, count)`` is called
    as each case finishes.
    """
    remove_orphans()
    with tempfile.TemporaryDirectory(prefix=f"{TMP_PREFIX}{os.getpid()}-") as tmp:
        tmp = Path(tmp)
        jobs, results, out = tmp / "jobs.json", tmp / "results.jsonl", tmp / "callgrind.out"
        jobs.write_text(
            json.dumps(
                {
                    "config": dataclasses.asdict(config),
                    "sys_path": sys.path,
                    "cases": [[n, dataclasses.asdict(s)] for n, s in cases],
                }
            )
        )
        command, env = _command(jobs, results, out, environ)
        counts: dict[int, Count] = {}

        def collect() -> None:
            for r in _read_results(results):
                if "status" in r and r["index"] not in counts:
                    counts[r["index"]] = _count_of(r, cases, out, version, config)
                    arrived(r["index"], counts[r["index"]])

        with open(tmp / "valgrind.log", "wb") as log:
            proc = subprocess.Popen(
                command,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=env,
                preexec_fn=_child_setup(os.getpid(), config.idle),
            )
            timed_out = _watch(proc, collect, time.monotonic() + _timeout(cases, config), cancel)
        return _outcome(proc.returncode, counts, results, tmp / "valgrind.log", timed_out, cancel)


def _command(
    jobs: Path, results: Path, out: Path, environ: dict[str, str]
) -> tuple[list[str], dict[str, str]]:
    """The counting process's command line and environment.

    Switched per case or once (:data:`_ENV_SWITCH`), torch is imported uninstrumented (see
    :func:`_child`); otherwise everything runs instrumented (the same counts).
    """
    control = _on_path("callgrind_control", environ)
    switch = "case" if _requests_possible() else "control" if control else ""
    command = [
        _on_path("valgrind", environ) or _PACKAGE,
        "--tool=callgrind",
        "--collect-atstart=no",
        *(["--instr-atstart=no"] if switch else []),
        f"--callgrind-out-file={out}",
        sys.executable,
        "-m",
        "attnbench.measure.instructions",
        str(jobs),
        str(results),
    ]
    env = {**environ, "PYTHONHASHSEED": "0", **_COUNT_ENV, _ENV_CONTROL: control or ""}
    return command, {**env, _ENV_SWITCH: switch}


def _watch(
    proc: subprocess.Popen,
    collect: Callable[[], None],
    deadline: float,
    cancel: threading.Event | None,
) -> bool:
    """``collect`` the process's results every half second until it ends; True if it timed out.

    The process is killed past ``deadline`` (then True) or once ``cancel`` is set; it has ended on
    return.
    """
    timed_out = False
    try:
        while True:
            finished = proc.poll() is not None
            collect()
            if finished:
                break
            if time.monotonic() > deadline:
                timed_out = True
                proc.kill()
            if cancel is not None and cancel.wait(0.5):
                proc.kill()
                proc.wait()
                break
            if cancel is None:
                time.sleep(0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.wait()
    return timed_out


def _outcome(
    code: int,
    counts: dict[int, Count],
    results: Path,
    log: Path,
    timed_out: bool,
    cancel: threading.Event | None,
) -> _Ran:
    """What an ended valgrind process did: its counts, where it died, how it ended, its output.

    Where it died is the case it started but never reported; the output is the end of its log.
    """
    started = [r["index"] for r in _read_results(results) if r.get("started")]
    dead = next((i for i in started if i not in counts), None)
    ended = (
        "timed out"
        if timed_out
        else f"died from {_signal_name(-code)}"
        if code < 0
        else f"exited {code}"
    )
    tail = log.read_bytes().decode("utf-8", "replace").strip().splitlines()[-15:]
    cancelled = cancel is not None and cancel.is_set()
    return _Ran(
        counts,
        None if cancelled else dead,
        "cancelled" if cancelled else ended,
        code != 0,
        timed_out,
        tail,
        cancelled=cancelled,
    )


def _requests_possible() -> bool:
    """Whether :func:`_client_requests` can work here: x86-64 Linux (the stub's machine)."""
    return sys.platform.startswith("linux") and platform.machine() in ("x86_64", "AMD64")


def _client_requests() -> Callable[[int], int] | None:
    """valgrind's client requests from Python: ``request(code) -> valgrind's answer``.

    torch's bindings make only two of callgrind's (collect, dump); switching instrumentation needs
    two more. The stub (:data:`_REQUEST_X86_64`) is copied to a page of executable memory and called
    through ctypes; valgrind recognises its marker and serves the request. None where that cannot
    be done: not x86-64 Linux, executable memory refused, or not under valgrind (the stub answers 0
    to "running on valgrind?").
    """
    if not _requests_possible():
        return None
    try:
        page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
    except (OSError, ValueError, AttributeError):
        return None
    page.write(_REQUEST_X86_64)
    stub = ctypes.CFUNCTYPE(ctypes.c_ulong, ctypes.c_void_p)(
        ctypes.addressof(ctypes.c_char.from_buffer(page))
    )

    def request(code: int, _page: mmap.mmap = page) -> int:  # the page lives as long as this
        block = (ctypes.c_ulong * 6)(code, 0, 0, 0, 0, 0)
        return stub(ctypes.addressof(block))

    return request if request(_RUNNING_ON_VALGRIND) > 0 else None


TMP_PREFIX = "attnbench-callgrind-"
"""A counting process's folder: ``attnbench-callgrind-<pid of the process that made it>-...``."""
_PR_SET_PDEATHSIG = 1


def _child_setup(parent: int, idle: bool) -> Callable[[], None]:
    """The counting process's set-up between fork and exec: die with ``parent``; maybe idle.

    libc is looked up here, in the parent: a dlopen after a threaded process forked could hang.
    """
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: nothing to ask
        prctl = None

    def setup() -> None:
        if prctl is not None:
            _die_with(parent, prctl)
        if idle:
            _idle_priority()

    return setup


def _die_with(parent: int, prctl: Callable[[int, int], int]) -> None:
    """Ask Linux to SIGKILL this process when the thread that started it ends (its parent killed
    with ``kill -9`` included); exit now if ``parent`` is gone already (it died before the ask).

    valgrind keeps the request across its exec (it is not set-uid): an orphaned counter would
    otherwise go on counting for minutes at a core's full use.
    """
    prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:
        os._exit(1)


def remove_orphans(root: str | Path | None = None) -> list[Path]:
    """Remove the counting folders (in ``root``, default the temp folder) of processes now gone.

    A process killed outright (``kill -9``) cannot remove its own folder: the next count does.
    Folders of a live process, or without a process id in their name, are left. Returns those
    removed.
    """
    removed = []
    for path in Path(root or tempfile.gettempdir()).glob(f"{TMP_PREFIX}*-*"):
        pid = path.name[len(TMP_PREFIX) :].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


def _idle_priority() -> None:
    """In the counting process before it starts: run only when no other process wants the core.

    Linux's SCHED_IDLE, else the lowest nice. Counts do not depend on when they run; a timed case
    beside them must never wait for them.
    """
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))
    except (AttributeError, OSError):
        os.nice(19)


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def _read_results(path: Path) -> list[dict]:
    """The child's finished cases so far (a torn last line is left for the next read)."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError:
        return []
    return [json.loads(line) for line in text.splitlines(keepends=True) if line.endswith("\n")]


def _count_of(rec: dict, cases, out: Path, version: str, config: CountConfig) -> Count:
    name, spec = cases[rec["index"]]
    if rec["status"] != Status.OK:
        return Count(
            name, spec, Status(rec["status"]), reason=rec.get("reason", ""), valgrind=version
        )
    dump = Path(f"{out}.{rec['dump']}")
    try:
        match = _TOTALS.search(dump.read_bytes())
    except OSError as exc:
        return Count(
            name,
            spec,
            Status.ERROR,
            reason=f"callgrind dump {dump.name} unreadable ({exc})",
            valgrind=version,
        )
    if match is None:
        return Count(
            name,
            spec,
            Status.ERROR,
            reason=f"callgrind dump {dump.name} has no totals line",
            valgrind=version,
        )
    return Count(
        name,
        spec,
        Status.OK,
        instructions=int(match[1]) / config.calls,
        calls=config.calls,
        valgrind=version,
    )


# ---- the child: runs under valgrind --------------------------------------------------------------
def _child(jobs_path: str, results_path: str) -> None:
    """Count every case of the job file; report each to the results file (a flushed JSON line)."""
    jobs = json.loads(Path(jobs_path).read_text())
    sys.path[:] = jobs["sys_path"]
    # torch, the gate and the variants, imported before instrumentation starts
    import attnbench.measure.runner  # noqa: F401
    from attnbench.io import append_line
    from attnbench.measure import regime
    from attnbench.plugins import load_plugins

    load_plugins()
    config = CountConfig(**jobs["config"])
    regime.apply(regime.Regime(threads=config.threads))
    switch = _instrumentation_switch(os.environ.get(_ENV_SWITCH, ""))
    dumps = 0
    for index, (name, spec_fields) in enumerate(jobs["cases"]):
        # a case that kills us is named
        append_line(results_path, json.dumps({"index": index, "started": True}))
        record, dumps = _count_case(name, spec_fields, config, dumps, switch)
        append_line(results_path, json.dumps({"index": index, **record}))


def _instrumentation_switch(how: str) -> Callable[[bool], None] | None:
    """In the counting process, after its imports: how each case switches instrumentation.

    ``how`` is :data:`_ENV_SWITCH`'s value. Client requests: a function ``switch(on)`` for each
    case's counted calls. Otherwise instrumentation is switched on here, once, with
    ``callgrind_control`` (it answers when done), and None is returned; or it was on from the start.

    Raises:
        SystemExit: started uninstrumented with no way to switch it on (nothing would be counted).
    """
    requests = _client_requests() if how == "case" else None
    if requests is not None:
        return lambda on: requests(_START_INSTRUMENTATION if on else _STOP_INSTRUMENTATION) and None
    if how and not os.environ.get(_ENV_CONTROL):
        raise SystemExit("callgrind: no client requests here and no callgrind_control on PATH")
    if how:
        subprocess.run(
            [os.environ[_ENV_CONTROL], "--instr=on", str(os.getpid())],
            check=True,
            capture_output=True,
            timeout=_STARTUP_S,
        )
    return None


def _count_case(
    name: str,
    spec_fields: dict,
    config: CountConfig,
    dumps: int,
    switch: Callable[[bool], None] | None = None,
) -> tuple[dict, int]:
    """Gate and count one case in the counting process: its result line and the dumps so far.

    The line is the case's line for the results file (without its index); the number is that of the
    callgrind dumps made so far (each counted case closes one). With ``switch``, instrumentation is
    on only for the counted calls: the build, the gate and the warm-up calls run valgrind's plain
    translation (at L=128 a third of the time the case took instrumented throughout; the counts
    agree within 4e-5).
    """
    import gc

    import torch

    from attnbench.io import error_line

    record: dict = {}
    counting = False
    try:
        t0 = time.perf_counter()
        call, checked = _checked_call(name, AttnSpec(**spec_fields), config)
        record["gate_s"] = round(time.perf_counter() - t0, 1)
        if checked is not None and not checked.passed:
            record.update(status=Status.WRONG, reason=checked.reason())
            return record, dumps
        for _ in range(config.warmup_calls):
            call()
        gc.collect()
        # a collection (a million objects with torch loaded) inside a counted call is not its work
        gc.disable()
        if switch is not None:
            switch(True)
        torch._C._valgrind_toggle()
        counting = True
        for _ in range(config.calls):
            call()
        torch._C._valgrind_toggle_and_dump_stats()
        counting = False
        if switch is not None:
            switch(False)
        gc.enable()
        record.update(status=Status.OK, dump=dumps + 1, seconds=round(time.perf_counter() - t0, 1))
        return record, dumps + 1
    except Exception as exc:  # noqa: BLE001
        # one case's failure is its row, the others are still counted
        if counting:  # close this case's dump, so the next case's is its own
            torch._C._valgrind_toggle_and_dump_stats()
            dumps += 1
            if switch is not None:
                switch(False)
        gc.enable()
        record.update(status=Status.ERROR, reason=error_line(exc))
        return record, dumps


def _checked_call(
    name: str, spec: AttnSpec, config: CountConfig
) -> tuple[Callable[[], object], GateResult | None]:
    """The runner's timed closure of a case after its warm-up call, and the gate's result on it.

    The gate checks that call on :data:`_GATE_SLICES` slices; its result is None when not checked.
    """
    from attnbench.measure import gate, runner
    from attnbench.measure.config import MeasureConfig
    from attnbench.registry import get_variant

    variant = get_variant(name)
    # the gate on GATE_SLICES slices: a reference budget of that many slices (checked_slices samples
    # them)
    measure_config = MeasureConfig(
        seed=config.seed,
        check_accuracy=config.check_accuracy,
        reference_budget_bytes=_GATE_SLICES * gate.slice_reference_bytes(variant, spec),
    )
    call, inputs, mask = runner.make_call(variant, spec, config.seed)
    result, _ = variant.warm_up(call)
    checked = runner.run_gate(
        variant,
        spec,
        result,
        inputs,
        mask,
        runner.check_plan(variant, spec, measure_config),
        config.seed,
    )
    return call, checked


if __name__ == "__main__":
    _child(sys.argv[1], sys.argv[2])
