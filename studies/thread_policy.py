"""Which thread count should be the default? 1 vs 2 torch threads, interleaved, quiet and beside a neighbour.

For each case (``batched``, ``sdpa``, ``chunked`` at L=1024 and 4096, B=1, H=8, D=64, forward) the
two thread counts are timed alternately in the same process, ``--pairs`` times; each timing is the
median of a short blocked timing. It prints, per case, the median time with each thread count, the
median of the per-pair ratios (2 threads / 1 thread) and the spread of each (max/min over pairs),
then the same with a neighbour process spinning on one core. The calibration probe's time with
each thread count is printed too (what the runner compares against).

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.thread_policy               # quiet, then with one spinning neighbour
    python -m studies.thread_policy --pairs 7 --lengths 1024

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import statistics
import sys


def _table(pairs: int, lengths: list[int], variants: list[str]) -> list[dict]:
    import torch

    from attnbench.measure import probe, regime, runner
    from attnbench.measure.timer import TimerConfig, time_call
    from attnbench.registry import get_variant
    from attnbench.spec import AttnSpec

    timer = TimerConfig(min_runs=2, min_time=0.1, max_time=1.0)
    rows = []
    cases = [(v, n) for v in variants for n in lengths] + [("probe", 0)]
    for name, length in cases:
        times: dict[int, list[float]] = {1: [], 2: []}
        if name == "probe":
            call = None
        else:
            spec = AttnSpec(seq_len=length, heads=8)
            call, _, _ = runner.make_call(get_variant(name), spec, 0)
        for i in range(pairs):
            order = (1, 2) if i % 2 == 0 else (2, 1)  # alternate which goes first
            for threads in order:
                regime.apply(regime.Regime(threads=threads))
                if call is None:
                    times[threads].append(probe.probe_seconds())
                else:
                    call()
                    samples, _ = time_call(call, "cpu", timer)
                    times[threads].append(statistics.median(samples))
        ratios = [b / a for a, b in zip(times[1], times[2], strict=True)]
        rows.append(
            {
                "case": name if call is None else f"{name} L={length}",
                "1 thread ms": 1e3 * statistics.median(times[1]),
                "2 threads ms": 1e3 * statistics.median(times[2]),
                "2/1 (median of pairs)": statistics.median(ratios),
                "spread 1 (max/min)": max(times[1]) / min(times[1]),
                "spread 2 (max/min)": max(times[2]) / min(times[2]),
            }
        )
        print(
            rows[-1], file=sys.stderr, flush=True
        )  # progress: a slow case should not look like a hang
        del call
    torch.set_num_threads(1)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--pairs", type=int, default=5, help="interleaved 1-vs-2-thread pairs per case"
    )
    parser.add_argument("--lengths", default="1024,4096")
    parser.add_argument("--variants", default="batched,sdpa,chunked")
    parser.add_argument(
        "--only", choices=["quiet", "busy"], default=None, help="run one of the two conditions"
    )
    args = parser.parse_args(argv)

    import os

    import pandas as pd

    from studies.noise_harness import busy_neighbour

    lengths = [int(x) for x in args.lengths.split(",")]
    variants = args.variants.split(",")
    for condition in ("quiet", "busy"):
        if args.only and condition != args.only:
            continue
        before = os.getloadavg()[0]
        if condition == "quiet":
            rows = _table(args.pairs, lengths, variants)
        else:
            with busy_neighbour(1):
                rows = _table(args.pairs, lengths, variants)
        after = os.getloadavg()[0]
        print(f"\n{condition} (1-min load average {before:.2f} before, {after:.2f} after)")
        with pd.option_context("display.width", 200, "display.float_format", "{:.3g}".format):
            print(pd.DataFrame(rows).to_string(index=False), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
