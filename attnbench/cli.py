"""The ``attnbench`` command line: one ``cmd_*`` per subcommand, and its parser.

The library is quiet; this module is the only place that prints or draws progress bars.
Exit codes: 0 done, 1 a regression (``regress``) or a failed publish (``publish``), 2 usage error
(nothing measured, nothing written), 3 could not measure (``regress``), 4 could not decide
(``regress``: no regression found, but some time case stayed undecided after a confirmation round),
130 interrupted (``run``: finished cases kept).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import re
import signal
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from attnbench import masks
from attnbench.contract import INSTRUCTIONS_FACTOR, WORKLOADS
from attnbench.io import atomic_write_text, check_output_file, check_writable_dir
from attnbench.registry import get_variant, variant_names
from attnbench.spec import DTYPES, MODES, AttnSpec

if TYPE_CHECKING:
    from attnbench.measure import MeasureConfig
    from attnbench.measure.instructions import Beside
    from attnbench.measure.record import Measurement
    from attnbench.measure.worker import WorkerPool
    from attnbench.runs import RunDirectory

DESCRIPTION = (
    "``attnbench`` command line: list | run | report | peak | profile | regress | bisect | "
    "history | export | publish."
)
"""``attnbench --help``'s description."""
DEFAULT_TIME_BUDGET = 10.0
"""Seconds a case of ``attnbench run`` may take in total: the quadratic variants slower than that at
L=4096 become skipped rows, which keeps the default sweep under 5 minutes on 2 cores (at 15 s it
took 303 s: ``attnbench run --time-budget 15``, 2026-11-22); ``--time-budget 60`` runs them."""
DEFAULT_MAX_TIME = 5.0
"""``--max-time``'s default: seconds of timed calls per case at most (``--min-time`` if longer)."""

_DEVICE = re.compile(r"^(cpu|cuda(:\d+)?)$")


def _list(
    kind: Callable[[str], object],
    what: str,
    choices: Callable[[], Sequence[str]] | None = None,
    unknown: str = "invalid choice(s)",
    known: str = "choose from",
):
    """argparse type: a non-empty comma-separated list of ``kind``, checked against ``choices``.

    argparse prefixes the message with the option's name ("argument --lengths: ...").
    """

    def parse(text: str) -> list:
        parts = [part.strip() for part in text.split(",")]
        if not any(parts):
            raise argparse.ArgumentTypeError(f"empty list; give at least one {what}")
        if not all(parts):
            raise argparse.ArgumentTypeError(
                f"empty item in {text!r}; give a comma-separated list of {what}"
            )
        values = []
        for part in parts:
            try:
                values.append(kind(part))
            except (ValueError, argparse.ArgumentTypeError) as exc:
                raise argparse.ArgumentTypeError(f"invalid {what} {part!r}: {exc}") from None
        repeated = [
            part for part, value in zip(parts, values, strict=True) if values.count(value) > 1
        ]
        if repeated:
            raise argparse.ArgumentTypeError(
                f"{', '.join(dict.fromkeys(repeated))} given more than once; "
                f"each {what} is measured once"
            )
        if choices is not None:
            valid = list(choices())
            bad = [v for v in values if v not in valid]
            if bad:
                raise argparse.ArgumentTypeError(
                    f"{unknown} {', '.join(map(repr, bad))}; {known} {', '.join(valid)}"
                )
        return values

    return parse


def _int_at_least(low: int, name: str = "value"):
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"{name} must be an integer >= {low}, got {text!r}"
            ) from None
        if value < low:
            raise argparse.ArgumentTypeError(f"{name} must be >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _length(text: str) -> int:
    return _int_at_least(1, "length")(text)


def _positive(text: str) -> float:
    """argparse type: a finite number > 0 (nan and inf are rejected: they switch budgets off)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise argparse.ArgumentTypeError(f"must be a finite number > 0, got {text}")
    return value


def _fraction(text: str) -> float:
    value = _positive(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"must be in (0, 1], got {text}")
    return value


def _factor(text: str) -> float:
    """argparse type: the regression gate's own rule for a factor (a finite number > 1)."""
    from attnbench.analysis.significance import check_factor

    try:
        return check_factor("factor", float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a finite number > 1, got {text!r}") from None


class _DefaultList(list):
    """A list option's default, told apart from the same values given on the command line."""


def _device(text: str) -> str:
    if not _DEVICE.match(text):
        raise argparse.ArgumentTypeError(f"invalid device {text!r}; choose from cpu, cuda, cuda:N")
    return text


def _variant(text: str) -> str:
    if text not in variant_names():
        raise argparse.ArgumentTypeError(
            f"unknown variant {text!r}; known: {', '.join(variant_names())}"
        )
    return text


def _cuda_missing(device: str) -> str | None:
    """A usage-error message when ``device`` asks for CUDA that this machine lacks (else None)."""
    if not device.startswith("cuda"):
        return None
    import torch

    if not torch.cuda.is_available():
        return (
            f"--device {device}: CUDA is not available here (torch {torch.__version__}, no CUDA "
            "device); use --device cpu"
        )
    index = int(device.split(":")[1]) if ":" in device else 0
    if index >= torch.cuda.device_count():
        return (
            f"--device {device}: no such CUDA device (this machine has {torch.cuda.device_count()})"
        )
    return None


def _usage(message: str) -> int:
    print(f"attnbench: error: {message}", file=sys.stderr)
    return 2


def cmd_list(args: argparse.Namespace) -> int:
    rows = [get_variant(n).describe() for n in variant_names()]
    frame = pd.DataFrame(rows).set_index("name")
    if not args.wide:
        frame = frame.drop(columns=["source"])
    with pd.option_context("display.max_colwidth", 80, "display.width", 200):
        print(frame.to_string())
    return 0


def _run_config(args: argparse.Namespace):
    from attnbench.measure import MeasureConfig
    from attnbench.measure.timer import TimerConfig

    if args.max_time is not None and args.max_time < args.min_time:
        raise ValueError(
            f"--max-time {args.max_time:g} is shorter than --min-time {args.min_time:g} "
            "(seconds of timed calls per case: at least --min-time, at most --max-time)"
        )
    max_time = max(DEFAULT_MAX_TIME, args.min_time) if args.max_time is None else args.max_time
    return MeasureConfig(
        timer=TimerConfig(
            min_runs=args.min_runs,
            min_time=args.min_time,
            max_time=max_time,
            flush_cache=args.workload == "decode" if args.flush_cache is None else args.flush_cache,
        ),
        cuda_graphs=args.cuda_graphs,
        threads=args.threads,
        memory_budget_bytes=None if args.budget_mb is None else args.budget_mb * 2**20,
        memory_budget_fraction=args.budget_fraction,
        time_budget_s=args.time_budget,
        check_accuracy=not args.no_check,
        probe=not args.no_probe,
        retries=args.retries,
        workload=args.workload,
        instructions={None: "default", True: "all", False: "off"}[args.instructions],
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


def cmd_run(args: argparse.Namespace) -> int:
    from attnbench.measure.instructions import missing_message, valgrind_version
    from attnbench.runs import (
        RunDirectory,
        RunDirError,
        device_only_defaults,
        empty_grid_reason,
        new_run_dir,
    )

    if args.resume and not args.out:
        return _usage("--resume needs --out DIR (the run directory to continue)")
    missing = _cuda_missing(args.device)
    if missing:
        return _usage(missing)
    try:  # every argument is validated here, before any measurement
        cases = _run_cases(args)
        config = _run_config(args)
    except (ValueError, TypeError) as exc:
        return _usage(str(exc))
    if not cases:
        return _usage(
            f"nothing to run: {empty_grid_reason(args.variants, args.lengths, not args.no_limit)}"
        )
    if not args.variants and (elsewhere := device_only_defaults([args.device])):
        print(
            f"note: not planned on {args.device}: {', '.join(elsewhere)} (they need another "
            "device)",
            file=sys.stderr,
        )
    if args.instructions and valgrind_version() is None:
        return _usage(f"--instructions: {missing_message()}")
    if args.instructions is None and config.instructions != "off" and valgrind_version() is None:
        print(
            f"note: no instruction counts ({missing_message()}); the report's claims rest on time "
            "and bytes",
            file=sys.stderr,
        )
        config = dataclasses.replace(config, instructions="off")
    try:
        run_dir = RunDirectory(
            args.out or new_run_dir(args.root), resume=args.resume, force=args.force
        )
    except RunDirError as exc:
        return _usage(str(exc))
    try:
        return _run_in(args, run_dir, cases, config)
    finally:
        run_dir.close()


def _run_cases(args: argparse.Namespace) -> list[tuple[str, AttnSpec]]:
    """The grid ``run`` measures; a ValueError for arguments that contradict each other."""
    from attnbench.contract import CUDA_RUN_LENGTHS
    from attnbench.runs import DECODE_LENGTHS, grid

    bad_kv = [h for h in args.kv_heads or [] if args.heads % h]
    if bad_kv:
        raise ValueError(
            f"--kv-heads {', '.join(map(str, bad_kv))} must divide --heads {args.heads} "
            "(each key/value head serves H / Hkv query heads)"
        )
    if args.workload == "prefill" and args.q_len != 1:
        raise ValueError("--q-len is the decode workload's query count: add --workload decode")
    if args.workload == "decode" and isinstance(args.lengths, _DefaultList):
        args.lengths = list(DECODE_LENGTHS)
    elif str(args.device).startswith("cuda") and isinstance(args.lengths, _DefaultList):
        args.lengths = list(CUDA_RUN_LENGTHS)  # up to 64K: where the L² term dominates
    base = AttnSpec(heads=args.heads, device=args.device)
    return grid(
        args.variants,
        args.lengths,
        base,
        modes=args.modes,
        masks=args.masks,
        dtypes=args.dtypes,
        limit_slow=not args.no_limit,
        workload=args.workload,
        q_len=args.q_len,
        head_dims=args.head_dims,
        batches=args.batches,
        kv_heads=args.kv_heads,
    )


def _run_in(
    args: argparse.Namespace,
    run_dir: RunDirectory,
    cases: list[tuple[str, AttnSpec]],
    config: MeasureConfig,
) -> int:
    """Measure ``cases`` into the opened ``run_dir``; the exit code (notes and errors on stderr)."""
    from tqdm import tqdm

    from attnbench.measure import regime
    from attnbench.measure.worker import WorkerPool
    from attnbench.runs import RunDirError, RunWriteError

    peak, peak_gbps = _measure_roofs(args.device, args.dtypes, config.threads)
    try:
        todo = run_dir.start(config, cases, command=sys.argv, peak_gflops=peak, peak_gbps=peak_gbps)
    except RunDirError as exc:
        return _usage(str(exc))
    except RunWriteError as exc:
        print(f"error: {exc.strerror}", file=sys.stderr)
        return 1
    done_before = len(cases) - len(todo)
    _say_before_sweep(args, run_dir, config, done_before, len(cases))
    counter = _start_counting(run_dir, cases, config)
    bar = tqdm(
        total=len(cases),
        initial=done_before,
        unit="case",
        file=sys.stderr,
        dynamic_ncols=True,
        disable=args.quiet,
    )
    # One regime for parent and workers: the fork server starts with the allocator variables
    # (read by glibc at start-up), every worker applies it again (threads, mallopt) and records
    # describe().
    pool = WorkerPool(env=regime.child_env(regime.Regime(threads=config.threads)))
    session = _Sweep(
        args, run_dir, todo, config, counter, bar, done_before, start=time.perf_counter()
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


def _say_before_sweep(
    args: argparse.Namespace,
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
    if args.resume and done_before:
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

    args: argparse.Namespace
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
            self.run_dir.finish(time.perf_counter() - self.start)
            try:
                _print_results(
                    self.args, self.run_dir, len(self.todo), time.perf_counter() - self.start
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
                    case_timeout_s=self.args.case_timeout,
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
        left = _finish_counting(self.counter, self._log_counts, self.args.quiet, wait_s)
        if left:
            print(
                f"note: {left} of {self.counter.total} instruction count(s) not taken: after the "
                f"sweep, counting stops at {COUNT_SHARE:.0%} of its time (at least "
                f"{COUNT_FLOOR_S:.0f} s); `attnbench run --resume --out {self.run_dir.path} "
                "--instructions` takes them (every CPU case, with no time limit)",
                file=sys.stderr,
            )


def _print_results(
    args: argparse.Namespace, run_dir: RunDirectory, planned: int, elapsed: float
) -> None:
    """The summary table, the statuses, and the report of what the run directory holds."""
    from attnbench.runs import summary_table

    results = run_dir.measurements
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(results).to_string())
    statuses = pd.Series([str(m.status) for m in results], dtype=object).value_counts().to_dict()
    print(
        f"\n{len(results)} of {run_dir.planned} cases ({planned} planned this session, "
        f"{elapsed:.0f} s): {statuses}"
    )
    print(f"measurements: {run_dir.path}")
    if args.report and results:
        from attnbench.report.html import build_report
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
    from attnbench.runs import case_key, counted_cases

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


def cmd_report(args: argparse.Namespace) -> int:
    """Build the report; exit 0 when it holds data, 1 when nothing loads (reasons on stderr)."""
    from attnbench.report.html import make_report

    sources = args.sources or []
    if not sources:
        print(
            "error: --from is required (an asv results directory or a run directory)",
            file=sys.stderr,
        )
        return 2
    try:
        outcome = make_report(sources, args.out, title=args.title, demos=args.demos)
    except OSError as exc:
        print(f"error: cannot write the report to {args.out}: {exc}", file=sys.stderr)
        return 1
    for note in outcome.notes:
        print(f"note: {note}", file=sys.stderr)
    _print_problems(outcome.problems)
    if outcome.rows == 0:
        print(
            f"error: nothing could be loaded from {', '.join(sources)}; the page only lists the "
            f"reasons: {outcome.page}",
            file=sys.stderr,
        )
        return 1
    print(f"report: {outcome.page}")
    if outcome.problems:
        print(
            f"{len(outcome.problems)} problem(s) with the inputs (listed above and in the report)",
            file=sys.stderr,
        )
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from attnbench.profile import profile_case

    missing = _cuda_missing(args.device)
    if missing:
        return _usage(missing)
    out = Path(
        args.out or f"reports/profiles/{args.variant}-L{args.seq_len}-{args.device}-{args.mode}"
    )
    try:
        check_writable_dir(out, "--out")
        spec = AttnSpec(
            batch=args.batch,
            heads=args.heads,
            seq_len=args.seq_len,
            head_dim=args.head_dim,
            device=args.device,
            dtype=args.dtype,
            mode=args.mode,
        )
        from attnbench.measure.runner import MeasureConfig

        summary = profile_case(
            args.variant,
            spec,
            out,
            config=MeasureConfig(threads=args.threads),
            progress=lambda line: print(f"profile: {line}", file=sys.stderr, flush=True),
        )
    except (ValueError, TypeError) as exc:
        return _usage(str(exc))
    print(summary.line())
    print(
        f"trace: {out / 'trace.json.gz'} (open in https://ui.perfetto.dev)\n"
        f"top operators: {out / 'top_ops.txt'}\n"
        f"memory plot: {out / 'memory.png'}"
    )
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from attnbench.gate import RegressError, regress
    from attnbench.gate.markdown import check_summary
    from attnbench.measure.instructions import missing_message, valgrind_version

    bad = _environment_problems()
    if bad:
        return _usage(bad)
    try:  # every output target before any measuring (which takes minutes)
        check_summary(args.summary)
        check_writable_dir(args.work_dir, "--work-dir")
    except ValueError as exc:
        return _usage(str(exc))
    metric = args.metric or ("both" if valgrind_version() is not None else "time")
    if metric != "time" and valgrind_version() is None:
        if metric == "instructions":
            print(
                f"error: could not measure: --metric instructions: {missing_message()}",
                file=sys.stderr,
            )
            return 3
        print(f"note: --metric both falls back to time: {missing_message()}", file=sys.stderr)
        metric = "time"
    started = time.monotonic()
    try:
        outcome = regress(
            args.base,
            args.head,
            repo=args.repo,
            time_factor=args.time_factor,
            memory_factor=args.memory_factor,
            rounds=args.rounds,
            work_dir=args.work_dir,
            metric=metric,
            instructions_factor=args.instructions_factor,
            time_cases=args.time_cases,
            progress=_stamped("regress", started),
            at_length=args.at_length,
        )
    except ValueError as exc:
        return _usage(str(exc))
    except RegressError as exc:
        print(f"error: could not measure: {exc}", file=sys.stderr)
        return 3
    code = _regress_report(args, outcome, metric)
    from attnbench.gate.markdown import gate_summary, write_summary

    factors = {
        "time": args.time_factor,
        "memory": args.memory_factor,
        "instructions": args.instructions_factor,
    }
    for path in write_summary(
        gate_summary(outcome, metric, factors, time.monotonic() - started), args.summary
    ):
        print(f"summary: {path}", file=sys.stderr)
    print(f"({time.monotonic() - started:.0f} s)", file=sys.stderr)
    return code


def _stamped(command: str, started: float) -> Callable[[str], None]:
    """A progress printer: ``command [  93 s] line`` on stderr, flushed.

    asv's steps take minutes: the elapsed seconds show a run that is alive.
    """
    return lambda line: print(
        f"{command} [{time.monotonic() - started:4.0f} s] {line}", file=sys.stderr, flush=True
    )


def _regress_report(args: argparse.Namespace, outcome, metric: str) -> int:
    """Print the gate's table and verdict; the exit code."""
    from attnbench.analysis.text import ratio
    from attnbench.contract import Basis

    shown = outcome.table.sort_values(["verdict", "ratio"], ascending=[False, False])
    print(
        _gate_row(
            {
                "verdict": "verdict",
                "metric": "metric",
                "case": "case",
                "base": "BASE",
                "head": "HEAD",
                "ratio": "ratio",
                "why": "why (whole reasons: attnbench-gate.csv beside the results)",
            }
        )
    )
    for rec in shown.to_dict("records"):
        print(_gate_row(_gate_cells(rec)))
    print(f"\nbase {outcome.base[:10]}  head {outcome.head[:10]}  results: {outcome.results_dir}")
    for line in _growth_lines(outcome.table):
        print(line)
    for note in sorted({n for n in outcome.table["note"] if n}):
        print(f"note: {note}")
    if outcome.passed:
        decided = {
            "time": f"{args.time_factor}x time",
            "instructions": f"{args.instructions_factor}x instruction counts",
            "both": f"{args.instructions_factor}x instruction counts and {args.time_factor}x time",
        }[metric]
        print(f"PASS: nothing regressed beyond {decided} / {args.memory_factor}x peak tensor bytes")
        return 0
    if not outcome.regressions.empty:
        print(f"FAIL: {len(outcome.regressions)} regression(s):")
        for rec in outcome.regressions.to_dict("records"):
            grew = f" predicted: {rec['reason']}" if rec.get("basis") == Basis.PREDICTED else ""
            print(
                f"  {_gate_case(rec)}: {rec['metric']} {ratio(rec['ratio'], rec['metric'])}{grew}"
            )
        return 1
    print(
        f"UNDECIDED: no regression found, but {len(outcome.undecided)} time case(s) could not be "
        "decided after a confirmation round (disturbed rounds, or too scattered to exclude a 1.5x "
        "slowdown); rerun with more --rounds on a quieter machine:"
    )
    for rec in outcome.undecided.to_dict("records"):
        print(f"  {_gate_case(rec)}: {rec['reason']}")
    return 4


def _growth_lines(table: pd.DataFrame) -> list[str]:
    """How each case's exact metrics grow, BASE -> HEAD (the gate's ``predicted`` rows).

    A line per series whose exponent or predicted ratio moved, or that regressed: exponents, the
    measured ratio at the longest length, the predicted one at the target length. Nothing when no
    series was fitted.
    """
    from attnbench.analysis.growth import EXPONENT_THRESHOLD, exponent_text
    from attnbench.analysis.text import ratio
    from attnbench.contract import Basis, GateVerdict

    if "basis" not in table.columns:
        return []
    predicted = table[table["basis"] == Basis.PREDICTED]
    if not len(predicted):
        return []
    moved = predicted[
        (predicted["verdict"] == GateVerdict.REGRESSED)
        | (
            (predicted["head_exponent"] - predicted["base_exponent"]).abs()
            >= EXPONENT_THRESHOLD / 2
        )
        | predicted["improved"].fillna(False).astype(bool)
    ]
    measured_at = int(predicted["measured_length"].max())
    lines = [
        f"\nhow cost grows (rows marked *): {len(predicted)} series fitted along L; "
        + (f"{len(moved)} moved:" if len(moved) else "no exponent change")
    ]
    if len(moved):
        lines.append(
            f"  (exponent BASE -> HEAD; ratio measured at L={measured_at} -> "
            f"predicted at L={int(predicted['at_length'].max())})"
        )
    for rec in moved.sort_values("ratio", ascending=False).to_dict("records"):
        pass_ = "bwd" if rec["mode"] == "backward" else "fwd"
        lines.append(
            _clip(
                f"  {rec['verdict']:<10} {rec['variant']} {pass_} {rec['metric']}  "
                f"{exponent_text(rec['base_exponent'])} -> {exponent_text(rec['head_exponent'])}  "
                f"{ratio(rec['measured_ratio'], rec['metric'])} -> "
                f"{ratio(rec['ratio'], rec['metric'])}"
            )
        )
    return lines


def _clip(line: str) -> str:
    return line if len(line) <= GATE_WIDTH else line[: GATE_WIDTH - 3] + "..."


def _gate_case(rec: dict) -> str:
    """A gate row's case as the verdict lines name it: ``benchmark [variant, L=..., mode]``."""
    return f"{rec['benchmark']} [{rec['variant']}, L={rec['seq_len']}, {rec['mode']}]"


GATE_WIDTH = 100
"""Columns of a line of regress's table (a terminal's, or a CI log's, without wrapping)."""


def _gate_cells(rec: dict) -> dict[str, str]:
    """One gate row as text: values with units, the ratio with the digits a verdict needs.

    The units are the metric table's.
    """
    from attnbench.analysis.text import fmt, ratio
    from attnbench.contract import UNITS, Basis

    unit = UNITS.get(rec["metric"], "")
    pass_ = "bwd" if rec["mode"] == "backward" else "fwd"
    return {
        "verdict": str(rec["verdict"]),
        "metric": str(rec["metric"]),
        # *: predicted at the target length from each side's fit (see "how cost grows")
        "case": f"{rec['variant']} L={rec['seq_len']} {pass_}"
        + ("*" if rec.get("basis") == Basis.PREDICTED else ""),
        "base": fmt(rec["base_value"], unit),
        "head": fmt(rec["head_value"], unit),
        "ratio": ratio(rec["ratio"], rec["metric"]) if rec["ratio"] == rec["ratio"] else "n/a",
        "why": str(rec.get("reason") or rec.get("note") or ""),
    }


def _gate_row(cells: dict[str, str]) -> str:
    line = (
        f"{cells['verdict']:<10} {cells['metric']:<17} {cells['case']:<22} "
        f"{cells['base']:>11} {cells['head']:>11} {cells['ratio']:>8}  {cells['why']}"
    )
    return line if len(line) <= GATE_WIDTH else line[: GATE_WIDTH - 3] + "..."


def cmd_bisect(args: argparse.Namespace) -> int:
    """Bisect GOOD..BAD for the commit that regressed; the exit status says what was found.

    Exit 1: a first bad commit named; 0: nothing exceeds GOOD; 4: only a range; 2: usage;
    3: could not measure.
    """
    from attnbench.gate import RegressError
    from attnbench.gate.bisect import BisectError, answer, bisect, probe_line

    bad = _environment_problems()  # as regress and shard: before asv builds anything
    if bad:
        return _usage(bad)
    started = time.monotonic()
    say = _stamped("bisect", started)
    try:
        check_writable_dir(args.work_dir, "--work-dir")
        state = bisect(
            args.good,
            args.bad,
            repo=args.repo,
            metric=args.metric,
            cases=args.cases,
            work_dir=args.work_dir,
            instructions_factor=args.instructions_factor,
            memory_factor=args.memory_factor,
            time_factor=args.time_factor,
            rounds=args.rounds,
            progress=say,
            on_probe=lambda probe, n: print(probe_line(probe, n, args.metric), flush=True),
        )
    except (BisectError, ValueError) as exc:
        return _usage(str(exc))
    except RegressError as exc:
        print(f"error: could not measure: {exc}", file=sys.stderr)
        return 3
    code, lines = answer(state)
    print("\n".join(lines))
    return code


def cmd_history(args: argparse.Namespace) -> int:
    """Exit 0 when a history was read (steps or not), 1 when nothing could be, 2 usage."""
    from attnbench.analysis.changes import table
    from attnbench.analysis.frame import load
    from attnbench.gate.markdown import check_summary, history_summary, write_summary
    from attnbench.gate.steps import find_steps
    from attnbench.report.html import render_history

    try:
        check_writable_dir(args.out, "--out")
        check_summary(args.summary)
    except ValueError as exc:
        return _usage(str(exc))
    frame = load(args.sources)
    _print_problems(frame.attrs.get("problems", []))
    rows = frame[frame["commit"].fillna("") != ""]
    if rows["commit"].nunique() < 2:
        print(
            f"error: {', '.join(args.sources)} hold(s) {rows['commit'].nunique()} commit(s) of asv "
            "results: a history needs several",
            file=sys.stderr,
        )
        return 1
    factors = {
        "instructions": args.instructions_factor,
        "peak_tensor_bytes": args.memory_factor,
        "time": args.time_factor,
    }
    history = find_steps(rows, factors=factors, window=args.window, repo=args.repo)
    shown = table(history)
    print(
        f"{len(history.commits)} commits ({history.order}); "
        f"{len(history.regressions)} regression(s), {len(history.improvements)} improvement(s)"
    )
    if len(shown):
        with pd.option_context(
            "display.width", 200, "display.max_rows", 500, "display.max_colwidth", 60
        ):
            print(shown.to_string(index=False))
    page = render_history(history, args.out)
    print(f"history: {page}")
    for path in write_summary(history_summary(history), args.summary):
        print(f"summary: {path}", file=sys.stderr)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    from attnbench.analysis.frame import load
    from attnbench.gate.export import ExportError, dumps, export

    if args.out:
        try:
            check_output_file(args.out, "--out")
        except ValueError as exc:
            return _usage(str(exc))
    frame = load([args.source])
    _print_problems(frame.attrs.get("problems", []))
    try:
        exported = export(frame, args.fmt, args.commit)
    except ExportError as exc:
        return _usage(str(exc))
    text = dumps(exported)
    if args.out:
        out = atomic_write_text(args.out, text)
        print(
            f"{exported.entries} entries of commit {exported.commit[:10] or '(a run)'} as "
            f"{args.fmt}: {out}",
            file=sys.stderr,
        )
    else:
        sys.stdout.write(text)
    return 0


def cmd_publish(args: argparse.Namespace) -> int:
    from attnbench.publish import PublishError, publish

    try:
        if args.html_dir is not None:
            check_writable_dir(args.html_dir, "--html-dir")
        outcome = publish(args.config, args.html_dir)
    except ValueError as exc:
        return _usage(str(exc))
    except PublishError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(
        f"site: {outcome.html_dir / 'index.html'} (works offline, from the file or any local "
        f"server; {outcome.rewritten} CDN reference(s) now served from vendor/)"
    )
    return 0


def cmd_shard(args: argparse.Namespace) -> int:
    """Print ``KEY=VALUE`` lines for a CI job: its grid and its ``--bench`` pattern.

    Append them to ``$GITHUB_ENV``.
    """
    from attnbench.shards import ShardError, parse_shard, shard_environment

    bad = _environment_problems()
    if bad:
        return _usage(bad)
    try:
        index, count = parse_shard(args.shard)
        env = shard_environment(args.benchmarks, index, count, args.grid)
    except ShardError as exc:
        return _usage(str(exc))
    for key, value in env.items():
        print(f"{key}={value}")
    return 0


PROBLEMS_SHOWN = 20
"""Problems printed per file (the text before a problem's first ": "); a file with more (a log of
100,000 bad lines) gets a count instead of the rest, and every bad file is still named."""


def _print_problems(problems: Sequence[str]) -> None:
    """The inputs' problems on stderr: per file the first :data:`PROBLEMS_SHOWN`, then a count."""
    by_file: dict[str, list[str]] = {}
    for problem in problems:
        by_file.setdefault(problem.split(": ", 1)[0], []).append(problem)
    for where, found in by_file.items():
        for problem in found[:PROBLEMS_SHOWN]:
            print(f"problem: {problem}", file=sys.stderr)
        if len(found) > PROBLEMS_SHOWN:
            print(
                f"problem: {where}: ... and {len(found) - PROBLEMS_SHOWN:,} more like these "
                f"({len(found):,} in all)",
                file=sys.stderr,
            )


def _environment_problems() -> str:
    """The ``ATTNBENCH_*`` variables asv would start with that cannot be used ("" when none)."""
    from attnbench import environ

    return "; ".join(environ.problems())


def cmd_merge_results(args: argparse.Namespace) -> int:
    from attnbench.shards import ShardError, merge_results

    try:
        merged = merge_results(args.sources, args.out)
    except ShardError as exc:
        return _usage(str(exc))
    print(
        f"merged {merged.shards} result file(s) into {merged.files} ({merged.benchmarks} benchmark "
        f"rows): {args.out}"
    )
    return 0


def cmd_peak(args: argparse.Namespace) -> int:
    from attnbench.measure import regime
    from attnbench.measure.bandwidth import WORDS, bandwidth
    from attnbench.measure.peak import matmul_peak

    missing = _cuda_missing(args.device)
    if missing:
        return _usage(missing)
    # the roofs of the threads a sweep measures with
    regime.apply(regime.Regime(threads=args.threads))
    rate = matmul_peak(args.device, args.dtype, refresh=True)
    threads = f"{args.threads} thread{'s' if args.threads > 1 else ''}"
    print(f"{args.device} {args.dtype} matmul: {rate / 1e9:.1f} GFLOP/s ({threads})")
    if args.no_bandwidth:
        return 0
    bw = bandwidth(args.device, refresh=True)
    print(
        f"{args.device} memory bandwidth: copy {bw.copy / 1e9:.1f} GB/s, "
        f"triad {bw.triad / 1e9:.1f} GB/s "
        f"(STREAM's count: copy {WORDS['copy']}, triad {WORDS['triad']} float32 words per element; "
        f"arrays of {bw.array_bytes / 2**20:.0f} MiB; the roofline uses triad)"
    )
    return 0


class _Formatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default in --help (except flags and options without one)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        if (
            action.default is None
            or action.default is False
            or isinstance(action, argparse._HelpAction)
        ):
            return action.help or ""
        return super()._get_help_string(action)


def _dtype_choices() -> list[str]:
    return list(DTYPES)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="attnbench", description=DESCRIPTION, formatter_class=_Formatter
    )
    parser.add_argument(
        "--plugin",
        dest="plugins",
        action="append",
        metavar="MODULE",
        help="import MODULE first: it registers extra variants (repeatable; also "
        "ATTNBENCH_PLUGINS)",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (
        _add_list_parser,
        _add_run_parser,
        _add_report_parser,
        _add_profile_parser,
        _add_regress_parser,
        _add_bisect_parser,
        _add_history_parser,
        _add_export_parser,
        _add_peak_parser,
        _add_publish_parser,
        _add_shard_parser,
        _add_merge_results_parser,
    ):
        add(sub)
    return parser


def _add_list_parser(sub) -> None:
    p = sub.add_parser(
        "list",
        help="variants with their declared complexity and support",
        formatter_class=_Formatter,
    )
    p.add_argument("--wide", action="store_true", help="include the source (seed or paper) column")
    p.set_defaults(func=cmd_list)


def _add_run_parser(sub) -> None:
    p = sub.add_parser(
        "run",
        help="sweep variants x sequence lengths and write measurements (+ report)",
        formatter_class=_Formatter,
    )
    _add_grid_options(p)
    _add_shape_options(p)
    _add_worker_options(p)
    _add_budget_options(p)
    _add_measurement_options(p)
    _add_run_output_options(p)
    p.set_defaults(func=cmd_run)


def _add_grid_options(p: argparse.ArgumentParser) -> None:
    """``run``'s variants, workload, lengths, device, dtypes, passes and masks."""
    from attnbench.contract import CUDA_RUN_LENGTHS
    from attnbench.runs import DECODE_LENGTHS, DEFAULT_LENGTHS

    p.add_argument(
        "--variants",
        type=_list(str, "variant name", variant_names, "unknown variant(s)", "known:"),
        default=None,
        help="comma-separated variant names (default: every variant in the default sweep)",
    )
    p.add_argument(
        "--workload",
        choices=list(WORKLOADS),
        default="prefill",
        help="prefill: L queries over L keys, swept along L; decode: --q-len queries over a "
        "cache of Lk keys, swept along Lk (memory-bound; reports GB/s)",
    )
    p.add_argument(
        "--lengths",
        type=_list(_length, "length (an integer >= 1)"),
        default=_DefaultList(DEFAULT_LENGTHS),
        help="comma-separated lengths: L for prefill, the cache length Lk for decode "
        f"(decode's default: {DECODE_LENGTHS[0]} .. {DECODE_LENGTHS[-1]}, powers of 2; on CUDA, "
        f"prefill's: {CUDA_RUN_LENGTHS[0]} .. {CUDA_RUN_LENGTHS[-1]})",
    )
    p.add_argument(
        "--q-len",
        type=_int_at_least(1, "q_len"),
        default=1,
        help="decode: queries per step Lq (1 per generated token; more for speculative decoding)",
    )
    p.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    p.add_argument(
        "--dtypes",
        "--dtype",
        dest="dtypes",
        type=_list(str, "dtype", _dtype_choices),
        default=["float32"],
        help=f"comma-separated from {', '.join(DTYPES)}",
    )
    p.add_argument(
        "--modes",
        type=_list(str, "mode", lambda: MODES),
        default=["forward"],
        help=f"comma-separated from {', '.join(MODES)}",
    )
    p.add_argument(
        "--masks",
        type=_list(str, "mask kind", lambda: masks.MASK_KINDS),
        default=["none"],
        help=f"comma-separated from {', '.join(masks.MASK_KINDS)}",
    )


def _add_shape_options(p: argparse.ArgumentParser) -> None:
    """``run``'s batch sizes, heads, key/value heads and head dimensions."""
    p.add_argument(
        "--batches",
        "--batch",
        dest="batches",
        type=_list(_int_at_least(1, "batch"), "batch size"),
        default=[1],
        help="comma-separated batch sizes B (every combination is a case)",
    )
    p.add_argument("--heads", type=_int_at_least(1, "heads"), default=8, help="(query) heads H")
    p.add_argument(
        "--kv-heads",
        type=_list(_int_at_least(1, "kv_heads"), "key/value head count"),
        default=None,
        help="comma-separated key/value head counts Hkv, each dividing --heads (grouped-query "
        "attention; 1 is multi-query; default: Hkv = H)",
    )
    p.add_argument(
        "--head-dims",
        "--head-dim",
        dest="head_dims",
        type=_list(_int_at_least(1, "head_dim"), "head dimension"),
        default=[64],
        help="comma-separated head dimensions D",
    )


def _add_worker_options(p: argparse.ArgumentParser) -> None:
    """``run``'s threads per worker and what it does about a disturbed case."""
    from attnbench.measure.regime import DEFAULT_THREADS

    p.add_argument(
        "--threads",
        type=_int_at_least(1, "threads"),
        default=DEFAULT_THREADS,
        help="torch threads in every worker (1 by default: a second thread stalls whenever another "
        "process takes its core)",
    )
    p.add_argument(
        "--retries",
        type=_int_at_least(0, "retries"),
        default=2,
        help="re-measurements of a case found disturbed (run-queue wait, probe, clusters), "
        "before it is marked noisy",
    )
    p.add_argument(
        "--no-probe",
        action="store_true",
        help="no calibration probe and no re-timing of descheduled blocks (no interference "
        "detection, no noisy status)",
    )


def _add_budget_options(p: argparse.ArgumentParser) -> None:
    """``run``'s memory and time budgets per case."""
    p.add_argument(
        "--budget-mb",
        type=_positive,
        default=None,
        help="memory budget per case in MiB (default: --budget-fraction of free memory); "
        "also caps each worker's memory",
    )
    p.add_argument(
        "--budget-fraction",
        type=_fraction,
        default=0.5,
        help="memory budget as a share of free memory",
    )
    p.add_argument(
        "--time-budget",
        type=_positive,
        default=DEFAULT_TIME_BUDGET,
        help="seconds one case may take in total (predicted beforehand; the default keeps the "
        "default sweep under 5 minutes on 2 cores)",
    )
    p.add_argument(
        "--case-timeout",
        type=_positive,
        default=None,
        help="hard limit in seconds: a case still running is killed (default: 2 x "
        "--time-budget + 60)",
    )


def _add_measurement_options(p: argparse.ArgumentParser) -> None:
    """What ``run`` measures of a case: timed calls, the accuracy check, counts, caches, graphs."""
    p.add_argument(
        "--min-runs",
        type=_int_at_least(1, "min_runs"),
        default=5,
        help="timed calls per case, at least",
    )
    p.add_argument(
        "--min-time", type=_positive, default=0.25, help="seconds of timed calls per case, at least"
    )
    p.add_argument(
        "--max-time",
        type=_positive,
        default=None,
        help="seconds of timed calls per case, at most (default 5, or --min-time when that "
        "is longer)",
    )
    p.add_argument("--no-check", action="store_true", help="skip the float64 accuracy check")
    p.add_argument(
        "--instructions",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="count instructions per call under valgrind, in one process beside the timed "
        "sweep (default: when valgrind is installed, the headline figure's variants and "
        "one per family, at the lengths a budget allows; --instructions: every CPU case; "
        "--no-instructions: none)",
    )
    p.add_argument(
        "--flush-cache",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="evict caches before every timed call (default: on for --workload decode, whose "
        "KV cache is cold in real inference, where every layer reads its own; off for "
        "prefill)",
    )
    p.add_argument("--cuda-graphs", action="store_true", help="CUDA: also time CUDA-graph replay")
    p.add_argument(
        "--no-limit", action="store_true", help="sweep slow variants (loop) at every length"
    )


def _add_run_output_options(p: argparse.ArgumentParser) -> None:
    """Where ``run`` writes, whether it continues or replaces a run there, and what it shows."""
    p.add_argument("--root", default="reports/runs", help="where new run directories go")
    p.add_argument(
        "--out", default=None, help="exact run directory (default: <root>/<time>-<host>)"
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out: measure only the cases its log lacks (same "
        "configuration required)",
    )
    p.add_argument(
        "--force",
        action="store_true",
        help="replace the run in a non-empty --out (its files and report)",
    )
    p.add_argument(
        "--report",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="build the HTML report",
    )
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def _add_report_parser(sub) -> None:
    p = sub.add_parser(
        "report",
        help="HTML report from asv results and/or run directories",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        help="asv results dir or run dir (repeatable: two runs, commits or machines are "
        "compared side by side)",
    )
    p.add_argument("--out", default="reports/latest", help="output directory")
    p.add_argument("--title", default="attnbench report")
    p.add_argument(
        "--demos",
        action="store_true",
        help="add the teaching demos (Nadaraya-Watson regression, masked attention weights; "
        "they train on every build)",
    )
    p.set_defaults(func=cmd_report)


def _add_profile_parser(sub) -> None:
    from attnbench.measure.regime import DEFAULT_THREADS

    p = sub.add_parser(
        "profile",
        help="one case under torch.profiler: trace, top operators, memory plot",
        formatter_class=_Formatter,
    )
    p.add_argument("variant", type=_variant, help="registered variant name")
    p.add_argument("--seq-len", type=_length, required=True, help="sequence length")
    p.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument(
        "--mode",
        "--pass",
        dest="mode",
        default="forward",
        choices=list(MODES),
        help="forward or backward (forward + backward)",
    )
    p.add_argument("--batch", type=_int_at_least(1, "batch"), default=1)
    p.add_argument("--heads", type=_int_at_least(1, "heads"), default=8)
    p.add_argument("--head-dim", type=_int_at_least(1, "head_dim"), default=64)
    p.add_argument(
        "--threads", type=_int_at_least(1, "threads"), default=DEFAULT_THREADS, help="torch threads"
    )
    p.add_argument("--out", default=None, help="output directory (default reports/profiles/<case>)")
    p.set_defaults(func=cmd_profile)


def _add_regress_parser(sub) -> None:
    p = sub.add_parser(
        "regress",
        help="benchmark BASE and HEAD with asv; exit 1 if HEAD regressed",
        formatter_class=_Formatter,
    )
    p.add_argument("base", help="git revision to compare against (e.g. origin/main)")
    p.add_argument("head", nargs="?", default="HEAD", help="git revision under test")
    p.add_argument("--repo", default=".", help="attnbench checkout")
    p.add_argument("--time-factor", type=_factor, default=1.2, help="allowed HEAD/BASE time ratio")
    p.add_argument(
        "--memory-factor",
        type=_factor,
        default=1.1,
        help="allowed HEAD/BASE peak tensor bytes ratio",
    )
    p.add_argument(
        "--rounds",
        type=_int_at_least(1, "rounds"),
        default=2,
        help="asv rounds, interleaved across the commits",
    )
    p.add_argument(
        "--metric",
        choices=["time", "instructions", "both"],
        default=None,
        help="what decides: wall time, instruction counts under valgrind, or both (default: "
        "both when valgrind is installed, else time)",
    )
    p.add_argument(
        "--instructions-factor",
        type=_factor,
        default=INSTRUCTIONS_FACTOR,
        help="allowed HEAD/BASE instruction count ratio",
    )
    p.add_argument(
        "--work-dir",
        default=".asv/regress",
        help="results and asv.log go here (relative to the current directory)",
    )
    p.add_argument(
        "--time-cases",
        choices=["longest", "all"],
        default="longest",
        help="where counts decide (--metric both or instructions): time the longest length of "
        "each variant only (where the working set is largest: what counts cannot see "
        "weighs most) or every case (minutes longer); --metric time always times every case",
    )
    p.add_argument(
        "--summary",
        default=None,
        metavar="FILE",
        help="also write the verdict as Markdown to FILE (and append it to "
        "$GITHUB_STEP_SUMMARY when set)",
    )
    _add_at_length(p)
    p.set_defaults(func=cmd_regress)


def _add_at_length(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--at-length",
        type=_int_at_least(1, "--at-length"),
        default=None,
        metavar="L",
        help="the length the exact metrics' growth is predicted at, from each side's fitted "
        "c0 + c1*L + c2*L^2 (default: 131072 for prefill and for decode's cache)",
    )


def _add_bisect_parser(sub) -> None:
    p = sub.add_parser(
        "bisect",
        help="binary search GOOD..BAD for the first commit whose metric exceeds GOOD's by the "
        "gate's factor",
        formatter_class=_Formatter,
    )
    p.add_argument("good", help="a git revision where the metric was fine")
    p.add_argument("bad", help="a later revision where it is not (GOOD must be its ancestor)")
    p.add_argument(
        "--metric",
        choices=["instructions", "peak_tensor_bytes", "time"],
        default="instructions",
        help="what is searched: instruction counts and peak tensor bytes are exact (one "
        "measurement per commit); time probes are the gate's time verdicts (GOOD re-timed "
        "beside every probe)",
    )
    p.add_argument(
        "--case",
        dest="cases",
        action="append",
        default=[],
        metavar="VARIANT:L",
        help="measure this case only (repeatable; default: the CI grid, narrowed by "
        "ATTNBENCH_ASV_*)",
    )
    p.add_argument("--repo", default=".", help="attnbench checkout")
    p.add_argument("--work-dir", default=".asv/bisect", help="results and asv.log go here")
    p.add_argument(
        "--instructions-factor",
        type=_factor,
        default=INSTRUCTIONS_FACTOR,
        help="a probe is bad when a count exceeds GOOD's by this",
    )
    p.add_argument(
        "--memory-factor", type=_factor, default=1.1, help="the same for peak tensor bytes"
    )
    p.add_argument(
        "--time-factor", type=_factor, default=1.2, help="the gate's time allowance (--metric time)"
    )
    p.add_argument(
        "--rounds",
        type=_int_at_least(1, "rounds"),
        default=2,
        help="time rounds per probe (--metric time)",
    )
    p.set_defaults(func=cmd_bisect)


def _add_history_parser(sub) -> None:
    p = sub.add_parser(
        "history",
        help="steps and drifts in a results history (e.g. the benchmark-results branch)",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--from",
        dest="sources",
        action="append",
        required=True,
        help="asv results directory of several commits (repeatable)",
    )
    p.add_argument(
        "--out", default="reports/history", help="history.html, figures/ and steps.csv go here"
    )
    p.add_argument(
        "--window",
        type=_int_at_least(2, "window"),
        default=10,
        help="commits a drift may spread over (a cumulative change beyond the factor with no "
        "single step)",
    )
    p.add_argument(
        "--repo",
        default=".",
        help="git repository to order the commits by (when it knows them all; else asv's "
        "commit dates)",
    )
    p.add_argument(
        "--instructions-factor",
        type=_factor,
        default=INSTRUCTIONS_FACTOR,
        help="a count's step or drift",
    )
    p.add_argument(
        "--memory-factor", type=_factor, default=1.1, help="peak tensor bytes' step or drift"
    )
    p.add_argument("--time-factor", type=_factor, default=1.2, help="a time level's step or drift")
    p.add_argument(
        "--summary",
        default=None,
        metavar="FILE",
        help="also write the steps as Markdown to FILE (and append them to "
        "$GITHUB_STEP_SUMMARY when set)",
    )
    p.set_defaults(func=cmd_history)


def _add_export_parser(sub) -> None:
    p = sub.add_parser(
        "export",
        help="results as Bencher's BMF or github-action-benchmark's customSmallerIsBetter JSON",
        formatter_class=_Formatter,
    )
    p.add_argument("source", metavar="FROM", help="asv results directory or run directory")
    p.add_argument(
        "--format", dest="fmt", choices=["bmf", "github-action-benchmark"], required=True
    )
    p.add_argument(
        "--commit", default=None, help="the commit to export (a prefix; default: the newest)"
    )
    p.add_argument("--out", default=None, help="write the JSON here (default: standard output)")
    p.set_defaults(func=cmd_export)


def _add_peak_parser(sub) -> None:
    from attnbench.measure.regime import DEFAULT_THREADS

    p = sub.add_parser(
        "peak",
        help="measure this machine's matmul FLOP/s and memory bandwidth (cached for reports)",
        formatter_class=_Formatter,
    )
    p.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument(
        "--threads",
        type=_int_at_least(1, "threads"),
        default=DEFAULT_THREADS,
        help="torch threads (as attnbench run's --threads: the roofs of that sweep)",
    )
    p.add_argument("--no-bandwidth", action="store_true", help="measure the matmul peak only")
    p.set_defaults(func=cmd_peak)


def _add_publish_parser(sub) -> None:
    p = sub.add_parser(
        "publish",
        help="asv publish, made to work offline (no CDN): graphs from a file or a local server",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "--config",
        default="asv.conf.json",
        help="asv configuration (its paths are relative to its folder)",
    )
    p.add_argument(
        "--html-dir",
        "-o",
        default=None,
        help="output directory (default: html_dir of the asv configuration)",
    )
    p.set_defaults(func=cmd_publish)


def _add_shard_parser(sub) -> None:
    p = sub.add_parser(
        "shard",
        help="a CI job's share of the asv suite: KEY=VALUE lines (its grid, ATTNBENCH_ASV_BENCH)",
        formatter_class=_Formatter,
    )
    p.add_argument("shard", help="I/N: this job is shard I of N (1-based)")
    p.add_argument(
        "--grid",
        default=None,
        help="also print the ATTNBENCH_ASV_* variables of this named grid (e.g. ci)",
    )
    p.add_argument("--benchmarks", default="benchmarks", help="the asv benchmark folder")
    p.set_defaults(func=cmd_shard)


def _add_merge_results_parser(sub) -> None:
    p = sub.add_parser(
        "merge-results",
        help="merge the asv results directories of several shards into one",
        formatter_class=_Formatter,
    )
    p.add_argument("sources", nargs="+", help="asv results directories (each with benchmarks.json)")
    p.add_argument(
        "--out", required=True, help="the merged results directory (created, or merged into)"
    )
    p.set_defaults(func=cmd_merge_results)


def _show_notes(default: Callable[..., None]) -> Callable[..., None]:
    """A ``warnings.showwarning`` printing attnbench's own notes as one plain line.

    Other warnings are shown as before.
    """
    from attnbench.io import CacheNotWritten

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if issubclass(category, CacheNotWritten):
            print(f"note: {message}", file=sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    return show


class _StdoutToDevnullOnEPIPE:
    """``sys.stdout`` that, once its reader has gone (``attnbench run ... | head -c 5``), sends
    the rest of the output to /dev/null instead of raising BrokenPipeError mid-command.

    The command goes on (a run still writes its report), and Python's own flush at exit finds
    /dev/null, not the closed pipe, so it prints no "Exception ignored" either.
    """

    def __init__(self, stream: Any) -> None:
        self._stream = stream

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._drop()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._drop()

    def _drop(self) -> None:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, self._stream.fileno())
        finally:
            os.close(devnull)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _reader_may_leave() -> Iterator[None]:
    """Run a command with :class:`_StdoutToDevnullOnEPIPE` as ``sys.stdout``."""
    saved = sys.stdout
    sys.stdout = _StdoutToDevnullOnEPIPE(saved)
    try:
        yield
        sys.stdout.flush()
    finally:
        sys.stdout = saved


def main(argv: Sequence[str] | None = None) -> int:
    from attnbench.plugins import export_plugins, load_plugins

    warnings.showwarning = _show_notes(warnings.showwarning)

    argv = list(sys.argv[1:] if argv is None else argv)
    # plugins first: they add variant names the parser checks
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--plugin", dest="plugins", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    try:
        load_plugins(known.plugins)
        load_plugins()  # ATTNBENCH_PLUGINS
        # worker processes and asv import them too (only once they imported here)
        export_plugins(known.plugins)
    except ValueError as exc:
        print(f"attnbench: error: --plugin: {exc}", file=sys.stderr)
        return 2
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exc:  # usage errors and --help: return the code (argparse already printed)
        return exc.code if isinstance(exc.code, int) else 2
    try:
        with _reader_may_leave():
            return args.func(args)
    except KeyboardInterrupt:
        # outside a sweep's own handling (e.g. while importing or measuring the peak)
        print("attnbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
