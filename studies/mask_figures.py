"""The masks/causal figures: interleaved timings (one process, one thread) and exact counts.

Run: ``python -m studies.mask_figures``, in the suite's measurement regime (one
thread, glibc's mmap threshold pinned). Timings are medians of interleaved repeats (each round calls
every contender once), so drift on a shared machine hits all contenders alike; FLOP and byte counts
are exact. Section [3] is :func:`studies.chunked_speed.goal_figures`.
"""

from __future__ import annotations

import argparse
import math
import statistics

import attnbench
from attnbench import AttnSpec, masks
from attnbench.measure import memory, regime, runner
from attnbench.measure.config import MeasureConfig
from studies import chunked_speed


def _prepared(name: str, spec: AttnSpec):
    variant = attnbench.get_variant(name)
    call, _, _ = runner.make_call(variant, spec, seed=0)
    variant.warm_up(call)
    return variant, call


def interleaved(contenders: dict[str, tuple[str, AttnSpec]], rounds: int) -> dict[str, float]:
    """Median seconds per contender, timed round-robin."""
    calls = {label: _prepared(name, spec)[1] for label, (name, spec) in contenders.items()}
    return {
        label: statistics.median(s)
        for label, s in chunked_speed.timed_rounds(calls, rounds).items()
    }


def peak(name: str, spec: AttnSpec) -> float:
    _, call = _prepared(name, spec)
    value = memory.cpu_peak_tensor_bytes(call)
    return math.nan if value is None else float(value)


def correctness(length: int = 300) -> None:
    """Error / tolerance of the gate for document and prefix_lm masks, every variant that declares them."""
    config = MeasureConfig()
    print(
        f"[4] document and prefix_lm vs the float64 reference: B2 H2 L{length} D32, document lengths "
        f"{masks.default_document_lengths(length)}, error / gate tolerance (<= 1 passes)"
    )
    for kind in ("document", "prefix_lm"):
        spec = AttnSpec(batch=2, heads=2, seq_len=length, head_dim=32, mask=kind)
        cells = []
        for name in attnbench.variant_names():
            variant = attnbench.get_variant(name)
            if variant.not_supported_reasons(spec):
                cells.append(f"{name}=n/a")
                continue
            call, inputs, mask = runner.make_call(variant, spec, seed=0)
            result, _ = variant.warm_up(call)
            checked = runner.run_gate(
                variant, spec, result, inputs, mask, runner.check_plan(variant, spec, config), 0
            )
            cells.append(f"{name}={checked.error_ratio:.3f}" + ("" if checked.passed else " WRONG"))
        print(f"    {kind}: " + ", ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--only-correctness", action="store_true", help="print [4] only (no timings)"
    )
    args = parser.parse_args()
    regime.apply(
        regime.Regime(threads=regime.DEFAULT_THREADS)
    )  # the suite's: 1 thread, malloc pinned
    if args.only_correctness:
        correctness()
        return

    base = AttnSpec(batch=1, heads=4, seq_len=2048, head_dim=64)
    causal = base.replace(mask="causal")
    t = interleaved(
        {
            "sdpa none": ("sdpa", base),
            "sdpa causal": ("sdpa", causal),
            "sdpa_dense_mask causal": ("sdpa_dense_mask", causal),
        },
        args.rounds,
    )
    p = {
        k: peak(n, s)
        for k, (n, s) in {
            "sdpa none": ("sdpa", base),
            "sdpa causal": ("sdpa", causal),
            "sdpa_dense_mask causal": ("sdpa_dense_mask", causal),
        }.items()
    }
    print(f"[1] CPU L=2048 B1 H4 D64, 1 thread, median of {args.rounds} interleaved rounds")
    for k in t:
        print(
            f"    {k:24s} {t[k] * 1e3:8.1f} ms  x{t[k] / t['sdpa none']:.2f}   peak {p[k] / 2**20:8.1f} MiB"
            f"  x{p[k] / p['sdpa none']:.2f}"
        )

    print("[2] peak tensor bytes with a causal mask, B1 H4 D64 (exponent from 4K to 16K)")
    for name in ("local", "block_sparse"):
        peaks = [
            peak(name, AttnSpec(batch=1, heads=4, seq_len=n, head_dim=64, mask="causal"))
            for n in (4096, 16384)
        ]
        print(
            f"    {name:14s} {peaks[0] / 2**20:8.1f} -> {peaks[1] / 2**20:8.1f} MiB   exponent "
            f"{math.log(peaks[1] / peaks[0]) / math.log(4):.3f}"
        )

    chunked_speed.goal_figures(4096, args.rounds, section="[3]")
    correctness()


if __name__ == "__main__":
    main()
