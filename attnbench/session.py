"""``attnbench run``'s session: measure a grid into a run directory, with the counts beside it.

The command line (:mod:`attnbench.cli`) reads its arguments once into a :class:`RunOptions`; this
module builds the grid and the measurement policy from them, opens the run directory, sweeps, and
says on stderr what happens (it is the command line's, so it prints, and draws the progress bars).
"""

from __future__ import annotations

import dataclasses
import math
import signal
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from attnbench.contract import Status
from attnbench.errors import UsageError
from attnbench.runs import swept_length
from attnbench.spec import AttnSpec

__all__ = ["DEFAULT_MAX_TIME", "RunOptions", "measure_config", "run", "run_cases", "summary_table"]

if TYPE_CHECKING:
    from attnbench.measure import MeasureConfig
    from attnbench.measure.instructions import Beside
    from attnbench.measure.record import Measurement
    from attnbench.measure.worker import WorkerPool
    from attnbench.runs import RunDirectory

DEFAULT_MAX_TIME = 5.0
"""``--max-time``'s default: seconds of timed calls per case at most (``--min-time`` if longer)."""


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What ``attnbench run`` was asked: read once from its command line, never changed after."""

    variants: tuple[str, ...] | None  # None: every variant of the default sweep
    workload: str
    lengths: tuple[int, ...]  # the defaults already chosen for the workload and the device
    q_len: int
    device: str
    dtypes: tuple[str, ...]
    modes: tuple[str, ...]
    masks: tuple[str, ...]
    batches: tuple[int, ...]
    heads: int
    kv_heads: tuple[int, ...] | None
    head_dims: tuple[int, ...]
    threads: int
    retries: int
    probe: bool
    budget_mb: float | None
    budget_fraction: float
    time_budget: float
    case_timeout: float | None
    min_runs: int
    min_time: float
    max_time: float | None
    check_accuracy: bool
    instructions: bool | None  # None: the default selection; True: every CPU case; False: none
    flush_cache: bool | None
    cuda_graphs: bool
    limit_slow: bool
    root: str
    out: str | None
    resume: bool
    force: bool
    report: bool
    quiet: bool
    command: tuple[str, ...]  # the command line, as the run directory records it


def measure_config(options: RunOptions) -> MeasureConfig:
    """The measurement policy ``options`` ask for; a ValueError for times that contradict."""
    from attnbench.measure import MeasureConfig
    from attnbench.measure.timer import TimerConfig

    if options.max_time is not None and options.max_time < options.min_time:
        raise ValueError(
            f"--max-time {options.max_time:g} is shorter than --min-time {options.min_time:g} "
            "(seconds of timed calls per case: at least --min-time, at most --max-time)"
        )
    max_time = (
        max(DEFAULT_MAX_TIME, options.min_time) if options.max_time is None else options.max_time
    )
    return MeasureConfig(
        timer=TimerConfig(
            min_runs=options.min_runs,
            min_time=options.min_time,
            max_time=max_time,
            flush_cache=options.workload == "decode"
            if options.flush_cache is None
            else options.flush_cache,
        ),
        cuda_graphs=options.cuda_graphs,
        threads=options.threads,
        memory_budget_bytes=None if options.budget_mb is None else options.budget_mb * 2**20,
        memory_budget_fraction=options.budget_fraction,
        time_budget_s=options.time_budget,
        check_accuracy=options.check_accuracy,
        probe=options.probe,
        retries=options.retries,
        workload=options.workload,
        instructions={None: "default", True: "all", False: "off"}[options.instructions],
    )


class _Interrupted(BaseException):
    """Abandon the case in hand now: a second Ctrl-C, or SIGTERM / SIGHUP."""


class _StopPolicy:
    """What a signal does to a sweep.

    Ctrl-C (SIGINT): the first stops after the case in hand, the second abandons it at once. SIGTERM
    and SIGHUP (a CI runner cancelling a job, ``timeout``, systemd or docker stopping a service, a
    closed terminal) abandon the case in hand at once: their senders kill for good seconds later,
    too soon to wait for a case. Either way what is done is written and the run can be resumed; an
    abandoned case is not logged, so ``--resume`` measures it again.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

    def __init__(self, pool, note: Callable[[str], None]) -> None:
        self.pool, self.note = pool, note
        self.count = 0
        self.first: int | None = None  # the first signal received: it decides the exit code
        self.previous: dict[int, object] = {}

    @property
    def exit_code(self) -> int:
        return 128 + (self.first or signal.SIGINT)

    def __call__(self, signum, frame) -> None:
        self.count += 1
        self.first = self.first or signum
        if signum == signal.SIGINT and self.count == 1:
            self.note(
                "interrupt: finishing the case in hand, then writing what is done (Ctrl-C again "
                "to abandon it)"
            )
            return
        if self.count == 1:
            self.note(
                f"{signal.Signals(signum).name}: abandoning the case in hand, writing what is done"
            )
        self.pool.kill_current()
        raise _Interrupted

    def __enter__(self) -> _StopPolicy:
        self.previous = {sig: signal.signal(sig, self) for sig in self.SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def run(options: RunOptions) -> int:
    """Measure the grid ``options`` ask for into a run directory; the exit code.

    Raises:
        UsageError: options that contradict, an empty grid, a run directory that cannot be used.
        RunWriteError: the run directory could not be written before the sweep.
    """
    from attnbench.measure.instructions import missing_message, valgrind_version
    from attnbench.runs import RunDirectory, device_only_defaults, empty_grid_reason, new_run_dir

    try:  # every argument is validated here, before any measurement
        cases = run_cases(options)
        config = measure_config(options)
    except (ValueError, TypeError) as exc:
        raise UsageError(str(exc)) from None
    if not cases:
        reason = empty_grid_reason(options.variants, options.lengths, options.limit_slow)
        raise UsageError(f"nothing to run: {reason}")
    if not options.variants and (elsewhere := device_only_defaults([options.device])):
        print(
            f"note: not planned on {options.device}: {', '.join(elsewhere)} (they need another "
            "device)",
            file=sys.stderr,
        )
    if options.instructions and valgrind_version() is None:
        raise UsageError(f"--instructions: {missing_message()}")
    if options.instructions is None and config.instructions != "off" and valgrind_version() is None:
        print(
            f"note: no instruction counts ({missing_message()}); the report's claims rest on time "
            "and bytes",
            file=sys.stderr,
        )
        config = dataclasses.replace(config, instructions="off")
    run_dir = RunDirectory(
        options.out or new_run_dir(options.root), resume=options.resume, force=options.force
    )
    try:
        return _run_in(options, run_dir, cases, config)
    finally:
        run_dir.close()


def run_cases(options: RunOptions) -> list[tuple[str, AttnSpec]]:
    """The grid ``run`` measures; a ValueError for arguments that contradict each other."""
    from attnbench.runs import grid

    bad_kv = [h for h in options.kv_heads or [] if options.heads % h]
    if bad_kv:
        raise ValueError(
            f"--kv-heads {', '.join(map(str, bad_kv))} must divide --heads {options.heads} "
            "(each key/value head serves H / Hkv query heads)"
        )
    if options.workload == "prefill" and options.q_len != 1:
        raise ValueError("--q-len is the decode workload's query count: add --workload decode")
    base = AttnSpec(heads=options.heads, device=options.device)
    return grid(
        options.variants,
        options.lengths,
        base,
        modes=options.modes,
        masks=options.masks,
        dtypes=options.dtypes,
        limit_slow=options.limit_slow,
        workload=options.workload,
        q_len=options.q_len,
        head_dims=options.head_dims,
        batches=options.batches,
        kv_heads=options.kv_heads,
    )


def _run_in(
    options: RunOptions,
    run_dir: RunDirectory,
    cases: list[tuple[str, AttnSpec]],
    config: MeasureConfig,
) -> int:
    """Measure ``cases`` into the opened ``run_dir``; the exit code (notes and errors on stderr)."""
    from tqdm import tqdm

    from attnbench.measure import regime
    from attnbench.measure.worker import WorkerPool
    from attnbench.runs import RunWriteError

    peak, peak_gbps = _measure_roofs(options.device, options.dtypes, config.threads)
    todo = run_dir.start(
        config, cases, command=list(options.command), peak_gflops=peak, peak_gbps=peak_gbps
    )
    done_before = len(cases) - len(todo)
    _say_before_sweep(options, run_dir, config, done_before, len(cases))
    counter = _start_counting(run_dir, cases, config)
    bar = tqdm(
        total=len(cases),
        initial=done_before,
        unit="case",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=options.quiet,
    )
    # One regime for parent and workers: the fork server starts with the allocator variables
    # (read by glibc at start-up), every worker applies it again (threads, mallopt) and records
    # describe().
    pool = WorkerPool(env=regime.child_env(regime.Regime(threads=config.threads)))
    session = _Sweep(
        options, run_dir, todo, config, counter, bar, done_before, start=time.perf_counter()
    )
    policy = _StopPolicy(pool, note=lambda text: tqdm.write(text, file=sys.stderr))
    try:
        aborted = session.run(pool, policy)
    except RunWriteError as exc:
        # a full disk: what the log holds is kept, the rest is measured on --resume
        bar.close()
        if counter is not None:
            counter.stop()
        print(
            f"error: {exc.strerror} ({len(run_dir.measurements)} of {run_dir.planned} cases kept "
            f"in {run_dir.path}; make room, then rerun with --resume --out {run_dir.path})",
            file=sys.stderr,
        )
        return 1
    if policy.count:
        _say_interrupted(run_dir, aborted)
        return policy.exit_code
    return 0


def _measure_roofs(device: str, dtypes: Sequence[str], threads: int) -> tuple[dict, dict | None]:
    """This machine's matmul GFLOP/s per dtype and memory bandwidth in GB/s.

    Both are measured at the threads the workers will use; the bandwidth is None, with a note, where
    it cannot be measured.
    """
    from attnbench.measure import regime
    from attnbench.measure.bandwidth import bandwidth
    from attnbench.measure.peak import matmul_peak

    regime.apply(regime.Regime(threads=threads))  # the peak recorded is the workers' threads'
    peak = {dtype: matmul_peak(device, dtype) / 1e9 for dtype in dtypes}
    try:
        bw = bandwidth(device)
        # the bandwidth roof (triad) beside the FLOP/s roof
        peak_gbps = {"copy": bw.copy / 1e9, "triad": bw.triad / 1e9}
    except (RuntimeError, MemoryError) as exc:
        # three arrays of 4x the LLC may not fit: the sweep still runs
        peak_gbps = None
        print(
            f"note: memory bandwidth not measured ({type(exc).__name__}: {str(exc)[:120]}); "
            "the report draws no bandwidth roof",
            file=sys.stderr,
        )
    return peak, peak_gbps


def _rates_above_roof(
    measurements: Sequence[Measurement], peak_gflops: dict[str, float]
) -> dict[str, list[float]]:
    """dtype -> the ok cases' GFLOP/s above that dtype's roof (highest first)."""
    above: dict[str, list[float]] = {}
    for m in measurements:
        roof, rate = peak_gflops.get(m.spec.dtype), m.gflops_per_s
        if m.status == Status.OK and roof and rate == rate and rate > roof:
            above.setdefault(m.spec.dtype, []).append(rate)
    return {dtype: sorted(rates, reverse=True) for dtype, rates in above.items()}


def _measure_roof_again(run_dir: RunDirectory, device: str) -> None:
    """Measure the roof again where the run's own rates came out above it, and log the new one.

    A roof measured beside a busy neighbour is low; a rate above it says so. The matmul is timed
    again (at the workers' threads, set before the sweep) and the manifest records the new roof;
    a rate still above it is an accounting error, which the report names.
    """
    from attnbench.measure.peak import matmul_peak

    above = _rates_above_roof(run_dir.measurements, run_dir.peak_gflops)
    if not above:
        return
    old = run_dir.peak_gflops
    again = {dtype: matmul_peak(device, dtype, refresh=True) / 1e9 for dtype in above}
    reason = "; ".join(
        f"{len(rates)} {dtype} rate(s) up to {rates[0]:.1f} GFLOP/s were above the roof of "
        f"{old[dtype]:.1f} GFLOP/s measured before the sweep"
        for dtype, rates in above.items()
    )
    run_dir.remeasured_roof(again, reason)
    print(
        f"note: {reason}: the roof was measured again ("
        + ", ".join(f"{dtype} {rate:.1f} GFLOP/s" for dtype, rate in again.items())
        + "), and the manifest records it",
        file=sys.stderr,
    )


def _say_before_sweep(
    options: RunOptions,
    run_dir: RunDirectory,
    config: MeasureConfig,
    done_before: int,
    planned: int,
) -> None:
    """The notes of the run directory and of this kernel, and what a resumed run already holds."""
    from attnbench.measure import schedstat

    for note in run_dir.notes:
        print(f"note: {note}", file=sys.stderr)
    if config.probe and not schedstat.available():  # said once per run, not on every case
        print(
            f"note: this kernel does not report the run-queue wait ({schedstat.SCHEDSTAT}): a "
            "neighbour is judged by the calibration probe alone, and no case records waited_blocks",
            file=sys.stderr,
        )
    if options.resume and done_before:
        print(
            f"resuming {run_dir.path}: {done_before} of {planned} cases already measured",
            file=sys.stderr,
        )


def _say_interrupted(run_dir: RunDirectory, aborted: bool) -> None:
    """What a signal left: the cases kept, and how to measure the rest."""
    left = run_dir.planned - len(run_dir.measurements)
    how = "aborted" if aborted else "stopped"
    print(
        f"interrupted: {how}; {len(run_dir.measurements)} of {run_dir.planned} cases kept in "
        f"{run_dir.path} ({left} left: rerun with --resume --out {run_dir.path})",
        file=sys.stderr,
    )


@dataclasses.dataclass
class _Sweep:
    """A run's cases left to measure, logged into its directory with the counts beside them."""

    options: RunOptions
    run_dir: RunDirectory
    todo: list[tuple[str, AttnSpec]]
    config: MeasureConfig
    counter: Beside | None  # the instruction counts under way beside the sweep
    bar: Any  # the tqdm bar of the cases
    done_before: int  # cases an earlier session measured
    start: float  # time.perf_counter() when this session's sweep began

    def run(self, pool: WorkerPool, policy: _StopPolicy) -> bool:
        """Measure what is left, then write the derived files and the report.

        Each case is logged as it is measured, each instruction count as it arrives. True when a
        signal abandoned a case.
        """
        with policy:
            aborted = self._measure(pool, policy)
            if not aborted and policy.count == 0:
                _measure_roof_again(self.run_dir, self.options.device)
            self.run_dir.finish(time.perf_counter() - self.start)
            try:
                _print_results(
                    self.options, self.run_dir, len(self.todo), time.perf_counter() - self.start
                )
            except _Interrupted:
                # a further signal while writing the report: what is logged stays, no page is made
                print(
                    "interrupted again: no report written (attnbench report --from "
                    f"{self.run_dir.path} makes it)",
                    file=sys.stderr,
                )
        return aborted

    def _measure(self, pool: WorkerPool, policy: _StopPolicy) -> bool:
        """The timed sweep, then the counts still under way; True when a signal abandoned a case."""
        from attnbench.measure import sweep

        try:
            try:
                sweep(
                    self.todo,
                    self.config,
                    progress=self._progress,
                    isolate=True,
                    workers=pool,
                    case_timeout_s=self.options.case_timeout,
                    on_result=self._on_result,
                    should_stop=lambda: policy.count > 0,
                )
                self.bar.n = self.done_before + len(self.todo) if policy.count == 0 else self.bar.n
                self.bar.set_description("done" if policy.count == 0 else "interrupted")
                self.bar.close()
                if self.counter is not None and policy.count == 0:
                    self._finish_counting()
            finally:
                self.bar.close()
                if self.counter is not None:
                    self.counter.stop()
                    self._log_counts()
        except _Interrupted:  # in the sweep, or a further signal while the counts were being kept
            return True
        return False

    def _progress(self, i: int, total: int, name: str, spec: AttnSpec) -> None:
        self.bar.set_description(f"{name} {spec.label}")
        self.bar.n = self.done_before + i
        self.bar.refresh()

    def _on_result(self, i: int, m: Measurement) -> None:
        self.run_dir.add(m, seconds=time.perf_counter() - self.start)
        self._log_counts()

    def _log_counts(self, wait_s: float = 0.0) -> int:
        """Log the counts arrived; the number of those not taken (stopped before: not logged, so
        ``--resume`` counts them)."""
        from attnbench.measure.instructions import CANCELLED

        skipped = 0
        for count in self.counter.take(wait_s) if self.counter is not None else ():
            if count.reason == CANCELLED:
                skipped += 1
            else:
                self.run_dir.add_count(count, seconds=time.perf_counter() - self.start)
        return skipped

    def _finish_counting(self) -> None:
        """The counts still under way, within the run's time limit for them (none for
        ``--instructions``, which asks for every count)."""
        from attnbench.runs import COUNT_FLOOR_S, COUNT_SHARE, count_wait_s

        every = self.config.instructions == "all"
        wait_s = None if every else count_wait_s(time.perf_counter() - self.start)
        left = _finish_counting(self.counter, self._log_counts, self.options.quiet, wait_s)
        if left:
            print(
                f"note: {left} of {self.counter.total} instruction count(s) not taken: after the "
                f"sweep, counting stops at {COUNT_SHARE:.0%} of its time (at least "
                f"{COUNT_FLOOR_S:.0f} s); `attnbench run --resume --out {self.run_dir.path} "
                "--instructions` takes them (every CPU case, with no time limit)",
                file=sys.stderr,
            )


def _print_results(
    options: RunOptions, run_dir: RunDirectory, planned: int, elapsed: float
) -> None:
    """The summary table, the statuses, and the report of what the run directory holds."""
    results = run_dir.measurements
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(results).to_string())
    statuses = pd.Series([str(m.status) for m in results], dtype=object).value_counts().to_dict()
    print(
        f"\n{len(results)} of {run_dir.planned} cases ({planned} planned this session, "
        f"{elapsed:.0f} s): {statuses}"
    )
    print(f"measurements: {run_dir.path}")
    if options.report and results:
        from attnbench.reporting import build_report
        from attnbench.runs import RunWriteError

        print(
            "writing the report (figures for every metric: a few seconds to a minute) ...",
            file=sys.stderr,
            flush=True,
        )
        try:
            page = build_report([run_dir.path], Path(run_dir.path) / "report")
        except OSError as exc:
            raise RunWriteError(Path(run_dir.path) / "report", exc) from exc
        print(f"report: {page}")


def _start_counting(
    run_dir: RunDirectory, cases: list[tuple[str, AttnSpec]], config: MeasureConfig
) -> Beside | None:
    """Instruction counts the log lacks, in one valgrind process beside the timed sweep.

    The cases counted are those :func:`attnbench.runs.counted_cases` picks; None when none are
    wanted.
    """
    from attnbench.measure.instructions import Beside, CountConfig
    from attnbench.rundir_format import case_key
    from attnbench.runs import counted_cases

    if config.instructions == "off":
        return None
    every = config.instructions == "all"
    wanted = [c for c in counted_cases(cases, every=every) if case_key(*c) not in run_dir.counted]
    if not wanted:
        return None
    return Beside(
        wanted,
        CountConfig(
            threads=config.threads or 1, seed=config.seed, check_accuracy=config.check_accuracy
        ),
    )


def _finish_counting(
    counter: Beside,
    log_counts: Callable[[float], int],
    quiet: bool,
    wait_s: float | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> int:
    """Wait for the counts still under way (the timed sweep is done), with their own bar.

    After ``wait_s`` seconds (None: no limit) the counting is stopped: what it counted is kept.
    Returns the number of cases left uncounted by that stop.
    """
    from tqdm import tqdm

    bar = tqdm(
        total=counter.total,
        initial=counter.received,
        unit="case",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=quiet,
        desc="instruction counts (valgrind)",
    )
    deadline = math.inf if wait_s is None else clock() + wait_s
    left = 0
    try:
        while not counter.done:
            if clock() >= deadline:
                counter.stop()  # what it counted stays takeable; the rest come back not taken
                break
            left += log_counts(1.0)
            bar.n = counter.received
            bar.refresh()
        left += log_counts(0.0)
        bar.n = counter.received - left
    finally:
        bar.close()
    if counter.error is not None:
        print(f"note: no instruction counts: {counter.error}", file=sys.stderr)
    else:
        print(
            f"instruction counts: {counter.total - left} case(s) in {counter.seconds:.0f} s of "
            "valgrind beside the sweep",
            file=sys.stderr,
        )
    return left


def summary_table(measurements: Sequence[Measurement]) -> pd.DataFrame:
    """Compact variant x length table of median milliseconds (status where not ok).

    What ``attnbench run`` prints when its sweep is done.

    Rows are variants, split by dtype / pass / mask when the sweep varies them.
    """
    rows = []
    for m in measurements:
        cell = f"{m.median * 1e3:.3g}" if m.status == Status.OK else m.status
        rows.append(
            {
                "variant": m.variant,
                "workload": m.workload,
                "dtype": m.spec.dtype,
                "pass": m.spec.mode,
                "mask": m.spec.mask,
                "D": m.spec.head_dim,
                "B": m.spec.batch,
                "Hkv": m.spec.hkv,
                "Lq": m.spec.lq,
                "L": swept_length(m.spec, m.workload),
                "cell": cell,
            }
        )
    if not rows:
        return pd.DataFrame()
    frame = pd.DataFrame(rows)
    split = ("workload", "dtype", "pass", "mask", "D", "B", "Hkv") + (
        ("Lq",) if set(frame["workload"]) == {"decode"} else ()
    )
    index = ["variant"] + [c for c in split if frame[c].nunique() > 1]
    table = frame.pivot_table(index=index, columns="L", values="cell", aggfunc="first", sort=False)
    table.columns.name = (
        "median ms at L="
        if set(frame["workload"]) == {"prefill"}
        else "median ms at L (decode: Lk)="
    )
    return table.fillna("")
