"""The ``attnbench`` command line's parser: its subcommands, their options and argument types.

:func:`build_parser` is what ``attnbench`` parses with (``args.command`` names the subcommand,
which :mod:`attnbench.cli` runs); the options that several subcommands share are declared once.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Sequence

from attnbench import masks
from attnbench.contract import INSTRUCTIONS_FACTOR, MEMORY_FACTOR, TIME_FACTOR, WORKLOADS
from attnbench.registry import variant_names
from attnbench.spec import DTYPES, MODES

__all__ = ["DEFAULT_TIME_BUDGET", "DESCRIPTION", "DefaultList", "build_parser"]

DESCRIPTION = (
    "``attnbench`` command line: list | run | report | peak | profile | regress | bisect | "
    "history | export | publish."
)
"""``attnbench --help``'s description."""
DEFAULT_TIME_BUDGET = 10.0
"""Seconds a case of ``attnbench run`` may take in total: the quadratic variants slower than that at
L=4096 become skipped rows, which keeps the default sweep under 5 minutes on 2 cores (at 15 s it
took 303 s: ``attnbench run --time-budget 15``, 2026-11-22); ``--time-budget 60`` runs them."""

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


class DefaultList(list):
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
        _add_init_parser,
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
        default=DefaultList(DEFAULT_LENGTHS),
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
    _add_device_option(p)
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


def _add_profile_parser(sub) -> None:
    from attnbench.measure.regime import DEFAULT_THREADS

    p = sub.add_parser(
        "profile",
        help="one case under torch.profiler: trace, top operators, memory plot",
        formatter_class=_Formatter,
    )
    p.add_argument("variant", type=_variant, help="registered variant name")
    p.add_argument("--seq-len", type=_length, required=True, help="sequence length")
    _add_device_option(p)
    _add_dtype_option(p)
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


def _add_regress_parser(sub) -> None:
    p = sub.add_parser(
        "regress",
        help="benchmark BASE and HEAD with asv; exit 1 if HEAD regressed",
        formatter_class=_Formatter,
    )
    p.add_argument("base", help="git revision to compare against (e.g. origin/main)")
    p.add_argument("head", nargs="?", default="HEAD", help="git revision under test")
    _add_repo_option(p)
    _add_factor_options(
        p,
        time="allowed HEAD/BASE time ratio",
        memory="allowed HEAD/BASE peak tensor bytes ratio",
    )
    _add_rounds_option(
        p,
        "asv rounds, interleaved across the commits; 0: no time rounds, the exact measures "
        "decide alone (peak tensor bytes, FLOPs, correctness, how they grow, and counts where "
        "--metric has them)",
        minimum=0,
    )
    p.add_argument(
        "--metric",
        choices=["time", "instructions", "both"],
        default=None,
        help="what decides: wall time, instruction counts under valgrind, or both (default: "
        "both when valgrind is installed, else time)",
    )
    _add_factor_options(p, instructions="allowed HEAD/BASE instruction count ratio")
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
    _add_summary_option(p, "the verdict", "it")
    _add_at_length(p)


_FACTORS = {
    "time": ("--time-factor", TIME_FACTOR),
    "memory": ("--memory-factor", MEMORY_FACTOR),
    "instructions": ("--instructions-factor", INSTRUCTIONS_FACTOR),
}
"""The gate's factors: each one's option and default (:mod:`attnbench.contract`'s)."""


def _add_factor_options(p: argparse.ArgumentParser, **helps: str) -> None:
    """The gate's factor options named (``time``, ``memory``, ``instructions``), as ordered."""
    for name, help_ in helps.items():
        option, default = _FACTORS[name]
        p.add_argument(option, type=_factor, default=default, help=help_)


def _add_repo_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--repo",
        default=".",
        help="the git repository whose commits are measured: attnbench's checkout, or one "
        "`attnbench init` set up",
    )


def _add_rounds_option(p: argparse.ArgumentParser, help_: str, minimum: int = 1) -> None:
    p.add_argument("--rounds", type=_int_at_least(minimum, "rounds"), default=2, help=help_)


def _add_init_parser(sub) -> None:
    p = sub.add_parser(
        "init",
        help="set up a repository of your own so that `attnbench regress` gates its variants "
        "(writes asv.conf.json and benchmarks/)",
        formatter_class=_Formatter,
    )
    p.add_argument(
        "plugins",
        nargs="+",
        metavar="MODULE",
        help="your plugin module(s), importable from the repository: each registers variants "
        "with attnbench.register (e.g. docs/examples/my_variants.py)",
    )
    p.add_argument(
        "--variants",
        default=None,
        help="comma-separated variants the gate measures (default: every one the modules register)",
    )
    p.add_argument(
        "--repo", default=".", help="the top level of your git repository (written into)"
    )
    p.add_argument(
        "--force", action="store_true", help="overwrite an asv.conf.json or suite already there"
    )


def _add_summary_option(p: argparse.ArgumentParser, what: str, it: str) -> None:
    """``--summary FILE``: ``what`` also as Markdown, appended to the job's step summary."""
    p.add_argument(
        "--summary",
        default=None,
        metavar="FILE",
        help=f"also write {what} as Markdown to FILE (and append {it} to "
        "$GITHUB_STEP_SUMMARY when set)",
    )


def _add_device_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--device", type=_device, default="cpu", help="cpu or cuda[:N]")


def _add_dtype_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))


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
    _add_repo_option(p)
    p.add_argument("--work-dir", default=".asv/bisect", help="results and asv.log go here")
    _add_factor_options(
        p,
        instructions="a probe is bad when a count exceeds GOOD's by this",
        memory="the same for peak tensor bytes",
        time="the gate's time allowance (--metric time)",
    )
    _add_rounds_option(p, "time rounds per probe (--metric time)")


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
    _add_factor_options(
        p,
        instructions="a count's step or drift",
        memory="peak tensor bytes' step or drift",
        time="a time level's step or drift",
    )
    _add_summary_option(p, "the steps", "them")


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


def _add_peak_parser(sub) -> None:
    from attnbench.measure.regime import DEFAULT_THREADS

    p = sub.add_parser(
        "peak",
        help="measure this machine's matmul FLOP/s and memory bandwidth (cached for reports)",
        formatter_class=_Formatter,
    )
    _add_device_option(p)
    _add_dtype_option(p)
    p.add_argument(
        "--threads",
        type=_int_at_least(1, "threads"),
        default=DEFAULT_THREADS,
        help="torch threads (as attnbench run's --threads: the roofs of that sweep)",
    )
    p.add_argument("--no-bandwidth", action="store_true", help="measure the matmul peak only")


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
