"""The ``attnbench`` command line: one ``cmd_*`` per subcommand, run by :func:`main`.

Its parser is :mod:`attnbench.arguments`; ``attnbench run``'s sweep, :mod:`attnbench.session`. The
library is quiet; these are the only places that print or draw progress bars.
Exit codes: 0 done, 1 a regression (``regress``) or a failed publish (``publish``), 2 usage error
(nothing measured, nothing written), 3 could not measure (``regress``), 4 could not decide
(``regress``: no regression found, but some time case stayed undecided after a confirmation round),
130 interrupted (``run``: finished cases kept).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pandas as pd

from attnbench.arguments import DefaultList, build_parser
from attnbench.errors import AttnbenchError
from attnbench.io import atomic_write_text, check_output_file, check_writable_dir
from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

if TYPE_CHECKING:
    from attnbench.session import RunOptions

__all__ = ["PROBLEMS_SHOWN", "build_parser", "main", "run_options"]


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


def _cmd_list(args: argparse.Namespace) -> int:
    rows = [get_variant(n).describe() for n in variant_names()]
    frame = pd.DataFrame(rows).set_index("name")
    if not args.wide:
        frame = frame.drop(columns=["source"])
    with pd.option_context("display.max_colwidth", 80, "display.width", 200):
        print(frame.to_string())
    return 0


def _cmd_run(args: argparse.Namespace) -> int:
    from attnbench.session import run

    if args.resume and not args.out:
        return _usage("--resume needs --out DIR (the run directory to continue)")
    missing = _cuda_missing(args.device)
    if missing:
        return _usage(missing)
    return run(run_options(args))


def run_options(args: argparse.Namespace) -> RunOptions:
    """``run``'s parsed arguments as the session takes them, the default lengths chosen."""
    from attnbench.session import RunOptions

    def listed(values: Sequence | None) -> tuple | None:
        return None if values is None else tuple(values)

    return RunOptions(
        variants=listed(args.variants),
        workload=args.workload,
        lengths=_run_lengths(args),
        q_len=args.q_len,
        device=args.device,
        dtypes=tuple(args.dtypes),
        modes=tuple(args.modes),
        masks=tuple(args.masks),
        batches=tuple(args.batches),
        heads=args.heads,
        kv_heads=listed(args.kv_heads),
        head_dims=tuple(args.head_dims),
        threads=args.threads,
        retries=args.retries,
        probe=not args.no_probe,
        budget_mb=args.budget_mb,
        budget_fraction=args.budget_fraction,
        time_budget=args.time_budget,
        case_timeout=args.case_timeout,
        min_runs=args.min_runs,
        min_time=args.min_time,
        max_time=args.max_time,
        check_accuracy=not args.no_check,
        instructions=args.instructions,
        flush_cache=args.flush_cache,
        cuda_graphs=args.cuda_graphs,
        limit_slow=not args.no_limit,
        root=args.root,
        out=args.out,
        resume=args.resume,
        force=args.force,
        report=args.report,
        quiet=args.quiet,
        command=tuple(sys.argv),
    )


def _run_lengths(args: argparse.Namespace) -> tuple[int, ...]:
    """The lengths given, or the defaults of the workload (decode) and the device (CUDA)."""
    from attnbench.contract import CUDA_RUN_LENGTHS
    from attnbench.runs import DECODE_LENGTHS

    if not isinstance(args.lengths, DefaultList):
        return tuple(args.lengths)
    if args.workload == "decode":
        return tuple(DECODE_LENGTHS)
    if str(args.device).startswith("cuda"):
        return tuple(CUDA_RUN_LENGTHS)  # up to 64K: where the L² term dominates
    return tuple(args.lengths)


def _cmd_report(args: argparse.Namespace) -> int:
    """Build the report; exit 0 when it holds data, 1 when nothing loads (reasons on stderr)."""
    from attnbench.reporting import make_report

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


def _cmd_profile(args: argparse.Namespace) -> int:
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
        from attnbench.measure.config import MeasureConfig

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


def _cmd_init(args: argparse.Namespace) -> int:
    from attnbench.gate.init import init_repo

    try:
        done = init_repo(args.repo, args.plugins, args.variants, force=args.force)
    except ValueError as exc:
        return _usage(str(exc))
    for path in done.written:
        print(f"wrote {path}")
    pins = ", ".join(f"{k}=={v}" if v else k for k, v in done.pins.items())
    print(
        f"asv builds {done.project} at each commit and measures {', '.join(done.variants)} "
        f"(from {', '.join(done.plugins)}) with attnbench's suite; its environment pins {pins}.\n"
        "Commit these files, then gate a change: attnbench regress HEAD~1 HEAD"
    )
    return 0


def _cmd_regress(args: argparse.Namespace) -> int:
    from attnbench.gate import regress
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
    from attnbench.gate.markdown import gate_summary, write_summary
    from attnbench.gate_table import gate_lines

    factors = {
        "time": args.time_factor,
        "memory": args.memory_factor,
        "instructions": args.instructions_factor,
    }
    lines, code = gate_lines(outcome, metric, factors)
    print("\n".join(lines))
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


def _cmd_bisect(args: argparse.Namespace) -> int:
    """Bisect GOOD..BAD for the commit that regressed; the exit status says what was found.

    Exit 1: a first bad commit named; 0: nothing exceeds GOOD; 4: only a range; 2: usage;
    3: could not measure.
    """
    from attnbench.gate.bisect import answer, bisect, probe_line

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
    except ValueError as exc:  # BisectError among them
        return _usage(str(exc))
    code, lines = answer(state)
    print("\n".join(lines))
    return code


def _cmd_history(args: argparse.Namespace) -> int:
    """Exit 0 when a history was read (steps or not), 1 when nothing could be, 2 usage."""
    from attnbench.analysis.changes import table
    from attnbench.analysis.frame import load
    from attnbench.gate.gitlog import read_git_log
    from attnbench.gate.markdown import check_summary, history_summary, write_summary
    from attnbench.gate.steps import find_steps, history_commits
    from attnbench.report.html import render_history

    try:
        check_writable_dir(args.out, "--out")
        check_summary(args.summary)
    except ValueError as exc:
        return _usage(str(exc))
    read = load(args.sources)
    frame = read.frame
    _print_problems(read.problems)
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
    git = read_git_log(args.repo, history_commits(rows))
    history = find_steps(rows, factors=factors, window=args.window, git=git)
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


def _cmd_export(args: argparse.Namespace) -> int:
    from attnbench.analysis.frame import load
    from attnbench.gate.export import dumps, export

    if args.out:
        try:
            check_output_file(args.out, "--out")
        except ValueError as exc:
            return _usage(str(exc))
    read = load([args.source])
    frame = read.frame
    _print_problems(read.problems)
    exported = export(frame, args.fmt, args.commit)
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


def _cmd_publish(args: argparse.Namespace) -> int:
    from attnbench.publish import publish

    try:
        if args.html_dir is not None:
            check_writable_dir(args.html_dir, "--html-dir")
        outcome = publish(args.config, args.html_dir)
    except ValueError as exc:
        return _usage(str(exc))
    print(
        f"site: {outcome.html_dir / 'index.html'} (works offline, from the file or any local "
        f"server; {outcome.rewritten} CDN reference(s) now served from vendor/)"
    )
    return 0


def _cmd_shard(args: argparse.Namespace) -> int:
    """Print ``KEY=VALUE`` lines for a CI job: its grid and its ``--bench`` pattern.

    Append them to ``$GITHUB_ENV``.
    """
    from attnbench.shards import parse_shard, shard_environment

    bad = _environment_problems()
    if bad:
        return _usage(bad)
    index, count = parse_shard(args.shard)
    env = shard_environment(args.benchmarks, index, count, args.grid)
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


def _cmd_merge_results(args: argparse.Namespace) -> int:
    from attnbench.shards import merge_results

    merged = merge_results(args.sources, args.out)
    print(
        f"merged {merged.shards} result file(s) into {merged.files} ({merged.benchmarks} benchmark "
        f"rows): {args.out}"
    )
    return 0


def _cmd_peak(args: argparse.Namespace) -> int:
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


_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "list": _cmd_list,
    "run": _cmd_run,
    "report": _cmd_report,
    "profile": _cmd_profile,
    "init": _cmd_init,
    "regress": _cmd_regress,
    "bisect": _cmd_bisect,
    "history": _cmd_history,
    "export": _cmd_export,
    "peak": _cmd_peak,
    "publish": _cmd_publish,
    "shard": _cmd_shard,
    "merge-results": _cmd_merge_results,
}
"""Each subcommand's function (``args.command`` is the name :func:`build_parser` gave)."""


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
            return _COMMANDS[args.command](args)
    except AttnbenchError as exc:  # the package's own errors, each with its line and exit code
        print(exc.line(), file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        # outside a sweep's own handling (e.g. while importing or measuring the peak)
        print("attnbench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
