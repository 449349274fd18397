"""``attnbench`` command line: list | run | report | peak | profile | regress.

The library is quiet; this module is the only place that prints or draws progress bars.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from attnbench import masks
from attnbench.registry import get_variant, variant_names
from attnbench.spec import DEVICES, DTYPES, MODES, AttnSpec


def _csv(kind: type, name: str):
    def parse(text: str) -> list:
        try:
            return [kind(part) for part in text.split(",") if part.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{name} must be a comma-separated list of {kind.__name__}, got {text!r}") from None

    return parse


def _positive(text: str) -> float:
    value = float(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


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

    return MeasureConfig(
        timer=TimerConfig(min_runs=args.min_runs, min_time=args.min_time, max_time=max(args.max_time, args.min_time),
                          flush_cache=args.flush_cache),
        cuda_graphs=args.cuda_graphs,
        threads=args.threads,
        memory_budget_bytes=None if args.budget_mb is None else args.budget_mb * 2**20,
        memory_budget_fraction=args.budget_fraction,
        time_budget_s=args.time_budget,
        check_accuracy=not args.no_check,
    )


def _cuda() -> bool:
    import torch

    return torch.cuda.is_available()


def cmd_run(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from attnbench.measure import sweep
    from attnbench.measure.peak import matmul_peak
    from attnbench.runs import grid, new_run_dir, summary_table, write_run

    unknown = [v for v in args.variants or [] if v not in variant_names()]
    if unknown:
        print(f"error: unknown variant(s) {', '.join(unknown)}; known: {', '.join(variant_names())}", file=sys.stderr)
        return 2
    try:  # every argument is validated here, before any measurement
        base = AttnSpec(batch=args.batch, heads=args.heads, head_dim=args.head_dim, device=args.device)
        cases = grid(args.variants, args.lengths, base, modes=args.modes, masks=args.masks,
                     dtypes=args.dtypes, limit_slow=not args.no_limit)
        config = _run_config(args)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    bar = tqdm(total=len(cases), unit="case", file=sys.stderr, dynamic_ncols=True, disable=args.quiet)

    def progress(i: int, total: int, name: str, spec: AttnSpec) -> None:
        bar.set_description(f"{name} L={spec.lq} {spec.mode}")
        bar.n = i
        bar.refresh()

    start = time.perf_counter()
    results = sweep(cases, config, progress=progress)
    elapsed = time.perf_counter() - start
    bar.n = len(cases)
    bar.set_description("done")
    bar.close()
    runnable = not args.device.startswith("cuda") or _cuda()
    peak = {dtype: matmul_peak(args.device, dtype) / 1e9 for dtype in args.dtypes} if runnable else None
    run_dir = write_run(args.out or new_run_dir(args.root), results, config, seconds=elapsed, peak_gflops=peak)
    with pd.option_context("display.width", 200, "display.max_columns", 30):
        print(summary_table(results).to_string())
    statuses = pd.Series([m.status for m in results]).value_counts().to_dict()
    print(f"\n{len(results)} cases in {elapsed:.0f} s: {statuses}")
    print(f"measurements: {run_dir}")
    if args.report:
        from attnbench.report.html import build_report

        page = build_report([run_dir], Path(run_dir) / "report")
        print(f"report: {page}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    """Build the report; exit 0 when it holds data, 1 when nothing could be loaded (reasons on stderr)."""
    from attnbench.report.html import make_report

    sources = args.sources or []
    if not sources:
        print("error: --from is required (an asv results directory or a run directory)", file=sys.stderr)
        return 2
    try:
        outcome = make_report(sources, args.out, title=args.title)
    except OSError as exc:
        print(f"error: cannot write the report to {args.out}: {exc}", file=sys.stderr)
        return 1
    for note in outcome.notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in outcome.problems:
        print(f"problem: {problem}", file=sys.stderr)
    if outcome.rows == 0:
        print(f"error: nothing could be loaded from {', '.join(sources)}; the page only lists the reasons: {outcome.page}",
              file=sys.stderr)
        return 1
    print(f"report: {outcome.page}")
    if outcome.problems:
        print(f"{len(outcome.problems)} problem(s) with the inputs (listed above and in the report)", file=sys.stderr)
    return 0


def cmd_profile(args: argparse.Namespace) -> int:
    from attnbench.profile import profile_case

    out = Path(args.out or f"reports/profiles/{args.variant}-L{args.seq_len}-{args.device}-{args.mode}")
    try:
        spec = AttnSpec(batch=args.batch, heads=args.heads, seq_len=args.seq_len, head_dim=args.head_dim,
                        device=args.device, dtype=args.dtype, mode=args.mode)
        summary = profile_case(args.variant, spec, out)
    except (ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(summary.line())
    print(f"trace: {out / 'trace.json.gz'} (open in https://ui.perfetto.dev)\ntop operators: {out / 'top_ops.txt'}\nmemory plot: {out / 'memory.png'}")
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from attnbench.regress import RegressError, regress

    try:
        outcome = regress(args.base, args.head, repo=args.repo, time_factor=args.time_factor,
                          memory_factor=args.memory_factor, rounds=args.rounds, work_dir=args.work_dir)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except RegressError as exc:
        print(f"error: could not measure: {exc}", file=sys.stderr)
        return 3
    cols = ["verdict", "metric", "variant", "seq_len", "mode", "base_value", "head_value", "ratio", "benchmark"]
    shown = outcome.table.sort_values(["verdict", "ratio"], ascending=[False, False])[cols]
    with pd.option_context("display.width", 200, "display.max_rows", 200, "display.float_format", "{:.4g}".format):
        print(shown.to_string(index=False))
    print(f"\nbase {outcome.base[:10]}  head {outcome.head[:10]}  results: {outcome.results_dir}")
    if outcome.passed:
        print(f"PASS: nothing regressed beyond {args.time_factor}x time / {args.memory_factor}x peak tensor bytes")
        return 0
    print(f"FAIL: {len(outcome.regressions)} regression(s):")
    for rec in outcome.regressions.to_dict("records"):
        print(f"  {rec['benchmark']} [{rec['variant']}, L={rec['seq_len']}, {rec['mode']}]: {rec['metric']} x{rec['ratio']:.2f}")
    return 1


def cmd_peak(args: argparse.Namespace) -> int:
    from attnbench.measure.peak import matmul_peak

    rate = matmul_peak(args.device, args.dtype, refresh=True)
    print(f"{args.device} {args.dtype} matmul: {rate / 1e9:.1f} GFLOP/s")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="attnbench", description=__doc__.splitlines()[0])
    parser.add_argument("--plugin", dest="plugins", action="append", metavar="MODULE",
                        help="import MODULE first: it registers extra variants (repeatable; also ATTNBENCH_PLUGINS)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("list", help="variants with their declared complexity and support")
    p.add_argument("--wide", action="store_true", help="include the source (seed or paper) column")
    p.set_defaults(func=cmd_list)

    p = sub.add_parser("run", help="sweep variants x sequence lengths and write measurements (+ report)")
    p.add_argument("--variants", type=_csv(str, "--variants"), help="comma-separated names (default: all)")
    p.add_argument("--lengths", type=_csv(int, "--lengths"), default=None, help="comma-separated sequence lengths")
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N] (default cpu)")
    p.add_argument("--dtypes", "--dtype", dest="dtypes", type=_csv(str, "--dtypes"), default=["float32"],
                   help=f"comma-separated from {tuple(DTYPES)} (default float32)")
    p.add_argument("--modes", type=_csv(str, "--modes"), default=["forward"], help=f"comma-separated from {MODES}")
    p.add_argument("--masks", type=_csv(str, "--masks"), default=["none"], help=f"comma-separated from {masks.MASK_KINDS}")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--budget-mb", type=_positive, default=None, help="memory budget per case in MiB")
    p.add_argument("--budget-fraction", type=float, default=0.5, help="memory budget as a share of free memory")
    p.add_argument("--time-budget", type=_positive, default=60.0, help="seconds one case may take in total")
    p.add_argument("--min-runs", type=int, default=5)
    p.add_argument("--min-time", type=_positive, default=0.25, help="seconds of timed calls per case, at least")
    p.add_argument("--max-time", type=_positive, default=5.0, help="seconds of timed calls per case, at most")
    p.add_argument("--no-check", action="store_true", help="skip the float64 accuracy check")
    p.add_argument("--flush-cache", action="store_true", help="evict caches before every timed call")
    p.add_argument("--cuda-graphs", action="store_true", help="CUDA: also time CUDA-graph replay")
    p.add_argument("--no-limit", action="store_true", help="sweep slow variants (loop) at every length")
    p.add_argument("--root", default="reports/runs", help="where run directories go")
    p.add_argument("--out", default=None, help="exact run directory (default: <root>/<time>-<host>)")
    p.add_argument("--report", action=argparse.BooleanOptionalAction, default=True, help="build the HTML report")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser("report", help="HTML report from asv results and/or run directories")
    p.add_argument("--from", dest="sources", action="append", help="asv results dir or run dir (repeatable)")
    p.add_argument("--out", default="reports/latest", help="output directory")
    p.add_argument("--title", default="attnbench report")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("profile", help="one case under torch.profiler: trace, top operators, memory plot")
    p.add_argument("variant", help="registered variant name")
    p.add_argument("--seq-len", type=int, required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.add_argument("--mode", "--pass", dest="mode", default="forward", choices=list(MODES), help="forward or backward (forward + backward)")
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--out", default=None, help="output directory (default reports/profiles/<case>)")
    p.set_defaults(func=cmd_profile)

    p = sub.add_parser("regress", help="benchmark BASE and HEAD with asv; exit 1 if HEAD regressed")
    p.add_argument("base", help="git revision to compare against (e.g. origin/main)")
    p.add_argument("head", nargs="?", default="HEAD", help="git revision under test (default HEAD)")
    p.add_argument("--repo", default=".", help="attnbench checkout (default .)")
    p.add_argument("--time-factor", type=float, default=1.2, help="allowed HEAD/BASE time ratio")
    p.add_argument("--memory-factor", type=float, default=1.1, help="allowed HEAD/BASE peak tensor bytes ratio")
    p.add_argument("--rounds", type=int, default=2, help="asv rounds, interleaved across the commits")
    p.add_argument("--work-dir", default=".asv/regress", help="results and asv.log go here")
    p.set_defaults(func=cmd_regress)

    p = sub.add_parser("peak", help="measure this machine's matmul FLOP/s (cached for reports)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32", choices=list(DTYPES))
    p.set_defaults(func=cmd_peak)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    from attnbench.plugins import export_plugins, load_plugins

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        export_plugins(args.plugins or [])  # worker processes and asv import them too
        load_plugins()
    except ValueError as exc:
        print(f"error: --plugin: {exc}", file=sys.stderr)
        return 2
    if args.command == "run":
        from attnbench.runs import DEFAULT_LENGTHS

        args.lengths = args.lengths or list(DEFAULT_LENGTHS)
        bad = [m for m in args.modes if m not in MODES] + [m for m in args.masks if m not in masks.MASK_KINDS]
        bad += [d for d in args.dtypes if d not in DTYPES]
        if bad or args.device.split(":")[0] not in DEVICES or min(args.lengths) < 1:
            parser.error(f"invalid --modes/--masks/--device/--lengths value(s): {bad or args.device or args.lengths}")
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
