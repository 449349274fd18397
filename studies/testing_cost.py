"""What attnbench.testing costs a test run: an answer check plus bytes and FLOPs growth checks.

Run: ``python -m studies.testing_cost [--rounds N] [--variant chunked]`` (on a quiet machine: the
figure is CPU and wall seconds). The target (docs/testing.md): at most 10 s on 2 cores for the
worked example's blockwise kernel (docs/examples/kernel_repo) or a kernel of ``chunked``'s size.

Each round, in this one process, times the three checks a user's test file makes:

* ``check_answer(kernel)``: the 16 default cases against the float64 reference;
* ``assert_growth(kernel, "peak_tensor_bytes", max_exponent=1.05)`` over L = 512, 1024, 2048, 4096
  (B1 H8 D64 float32, causal);
* ``assert_growth(kernel, "flops", max_exponent=2.05)`` over the same lengths.

The first round also pays for what a process loads once (the profiler's modules); it is printed on
its own line, then the median of the later rounds. Each line gives wall and CPU seconds (this
process's user + system time: on 2 cores, CPU seconds above wall seconds mean both cores worked).
"""

from __future__ import annotations

import argparse
import resource
import statistics
import sys
import time
from pathlib import Path

import attnbench
from attnbench.testing import assert_growth, check_answer, wrap

EXAMPLE = Path(__file__).resolve().parents[1] / "docs" / "examples" / "kernel_repo"
CAUSAL = attnbench.AttnSpec(heads=8, head_dim=64, mask="causal")


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def _kernel(variant: str):
    """The worked example's kernel (``example``), or a built-in variant by name."""
    if variant != "example":
        return attnbench.get_variant(variant)
    sys.path.insert(0, str(EXAMPLE))
    from blockwise_attention import blockwise_attention

    return wrap(blockwise_attention, call="sdpa", masks=attnbench.masks.MASK_KINDS, gqa=True)


def one_round(kernel) -> dict[str, tuple[float, float]]:
    """Wall and CPU seconds of each check, and of the three together."""
    steps = {
        "answer": lambda: check_answer(kernel),
        "peak_tensor_bytes": lambda: assert_growth(
            kernel, "peak_tensor_bytes", spec=CAUSAL, max_exponent=1.05
        ),
        "flops": lambda: assert_growth(kernel, "flops", spec=CAUSAL, max_exponent=2.05),
    }
    out = {}
    for name, step in steps.items():
        wall, cpu = time.perf_counter(), _cpu()
        step()
        out[name] = (time.perf_counter() - wall, _cpu() - cpu)
    out["all three"] = (sum(w for w, _ in out.values()), sum(c for _, c in out.values()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--variant", default="example", help="'example' or a registered name")
    args = parser.parse_args()
    kernel = _kernel(args.variant)
    rounds = [one_round(kernel) for _ in range(max(1, args.rounds))]
    print(f"{kernel.name}: check_answer + peak bytes and FLOPs growth over L=512..4096")
    print(f"{'':24s} {'wall s':>8s} {'CPU s':>8s}")
    for name, (wall, cpu) in rounds[0].items():
        print(f"first  {name:17s} {wall:8.2f} {cpu:8.2f}")
    for name in rounds[0]:
        if len(rounds) > 1:
            wall = statistics.median(r[name][0] for r in rounds[1:])
            cpu = statistics.median(r[name][1] for r in rounds[1:])
            print(f"later  {name:17s} {wall:8.2f} {cpu:8.2f}")


if __name__ == "__main__":
    main()
