"""How fast our own ``chunked`` kernel is against SDPA, and how fast it could be (CPU, one thread).

Run: ``python -m studies.chunked_speed [--rounds N] [--length L] [--baseline FILE]``.

In the suite's measurement regime (:mod:`attnbench.measure.regime`: one thread, glibc's mmap
threshold pinned), at B1 H8 D64 float32, forward, it prints:

* ``[1]`` the four figures of the speed goal: chunked causal executed FLOPs / unmasked (exact, from
  the cost model), chunked causal / chunked unmasked time, chunked / sdpa and compiled_chunked / sdpa
  (unmasked), each the median over rounds of the per-round ratio (every round calls every contender
  once, so drift on a shared machine hits all alike), with GFLOP/s (executed FLOPs / median time);
* ``[2]`` the floor: the tile matmuls of chunked's grid alone (``Q K^T`` into one reused buffer,
  ``P V`` accumulated with ``baddbmm``), then with the one unavoidable ``exp2`` pass added, for the
  eager and the compiled tile shapes, against sdpa in the same rounds. SDPA's CPU flash kernel fuses
  its softmax into the tile loop with a cheaper, less exact ``exp``; if the matmuls alone already take
  most of SDPA's time, no arrangement of separate torch ops reaches it;
* ``[3]`` the compiled floor: Inductor's own kernels for one score tile of the compiled shape (``exp2``
  + row sum, and with the row max first, as ``compiled_chunked`` runs them, but storing no
  probabilities), scaled to the whole grid and added to that shape's matmul floor from ``[2]``: a
  lower bound on ``compiled_chunked / sdpa`` for any tile loop that computes every score's
  exponential with Inductor's ``exp2``.

``--baseline FILE`` also times a ``chunked.py`` of another revision (eager and compiled) in the same
rounds, e.g. ``git show main:attnbench/variants/chunked.py > /tmp/chunked_main.py``.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

import attnbench
from attnbench import AttnSpec
from attnbench.measure import regime, runner
from attnbench.variants.base import Variant


def timed_rounds(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    """Seconds per call of every contender, ``rounds`` times round-robin."""
    samples: dict[str, list[float]] = {label: [] for label in calls}
    for _ in range(rounds):
        for label, call in calls.items():
            start = time.perf_counter()
            call()
            samples[label].append(time.perf_counter() - start)
    return samples


def _pair_ratio(samples: dict[str, list[float]], a: str, b: str) -> float:
    """Median over rounds of ``a``'s time / ``b``'s time in the same round."""
    return statistics.median(x / y for x, y in zip(samples[a], samples[b], strict=True))


def _prepared(variant: Variant, spec: AttnSpec) -> Callable[[], object]:
    """The runner's own timed closure, warmed up (compiled variants compile here)."""
    call, _, _ = runner.make_call(variant, spec, seed=0)
    variant.warm_up(call)
    return call


def _baseline(path: str) -> tuple[Variant, Variant]:
    """(eager, compiled) instances of the ``ChunkedAttention`` defined in another revision's file."""
    spec = importlib.util.spec_from_file_location("chunked_baseline", path)
    if spec is None or spec.loader is None:
        raise ValueError(f"--baseline must be a Python file, got {path!r}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    eager, compiled = module.ChunkedAttention(), attnbench.get_variant("compiled_chunked")
    eager.name = "chunked_baseline"
    compiled.base = module.ChunkedAttention()
    compiled._compiled = torch.compile(compiled.base.forward, dynamic=False)
    return eager, compiled


def _gemm_floor(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cq: int, ck: int, exp: bool
) -> Callable[[], None]:
    """Only chunked's tile matmuls over the unmasked grid (plus one in-place exp2 per tile if ``exp``)."""
    bh, length, d = q.shape
    scores, acc = (
        q.new_empty(bh, cq, ck),
        q.new_zeros(bh, cq, v.shape[-1]),
    )  # (B*H, Cq, Ck), (B*H, Cq, Dv)

    def run() -> None:
        for q0 in range(0, length, cq):
            for k0 in range(0, length, ck):
                torch.bmm(
                    q[:, q0 : q0 + cq], k[:, k0 : k0 + ck].transpose(1, 2), out=scores
                )  # (B*H, Cq, Ck)
                if exp:
                    scores.exp2_()
                torch.baddbmm(acc, scores, v[:, k0 : k0 + ck], out=acc)  # (B*H, Cq, Dv)

    return run


def goal_figures(
    length: int, rounds: int, baseline: str | None = None, section: str = "[1]"
) -> None:
    """Print the four figures of the speed goal (and the baseline's, if given), interleaved."""
    base = AttnSpec(batch=1, heads=8, seq_len=length, head_dim=64)
    causal = base.replace(mask="causal")
    chunked, compiled = attnbench.get_variant("chunked"), attnbench.get_variant("compiled_chunked")
    contenders: dict[str, tuple[Variant, AttnSpec]] = {
        "sdpa none": (attnbench.get_variant("sdpa"), base),
        "chunked none": (chunked, base),
        "chunked causal": (chunked, causal),
        "compiled_chunked none": (compiled, base),
    }
    if baseline:
        old_eager, old_compiled = _baseline(baseline)
        contenders.update(
            {
                "baseline chunked none": (old_eager, base),
                "baseline chunked causal": (old_eager, causal),
                "baseline compiled_chunked none": (old_compiled, base),
            }
        )
    calls = {label: _prepared(variant, spec) for label, (variant, spec) in contenders.items()}
    samples = timed_rounds(calls, rounds)
    load = os.getloadavg()
    fl = chunked.flops(causal).executed / chunked.flops(base).executed
    print(
        f"{section} CPU L={length} B1 H8 D64 float32 forward, {regime.describe()}; median of {rounds} "
        f"interleaved rounds; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    print(
        f"    chunked tiles {chunked.chunks(base.lq, base.lk, base.dtype)}, "
        f"compiled_chunked tiles {compiled.base.chunks(base.lq, base.lk, base.dtype)}"
    )
    print(f"    chunked causal executed FLOPs / unmasked:  {fl:.4f}")
    for p in [""] + (["baseline "] if baseline else []):
        print(
            f"    {p}chunked causal / chunked none time:  x{_pair_ratio(samples, p + 'chunked causal', p + 'chunked none'):.3f}"
        )
        print(
            f"    {p}chunked none / sdpa none:             x{_pair_ratio(samples, p + 'chunked none', 'sdpa none'):.3f}"
        )
        print(
            f"    {p}compiled_chunked none / sdpa none:    "
            f"x{_pair_ratio(samples, p + 'compiled_chunked none', 'sdpa none'):.3f}"
        )
    if baseline:
        for label in ("chunked none", "chunked causal", "compiled_chunked none"):
            print(
                f"    {label}: this / baseline x{_pair_ratio(samples, label, 'baseline ' + label):.3f}"
            )
    for label, (variant, spec) in contenders.items():
        seconds = statistics.median(samples[label])
        print(
            f"    {label:32s} {seconds * 1e3:8.1f} ms  {variant.flops(spec).executed / seconds / 1e9:6.1f} GFLOP/s"
        )


def floor_figures(length: int, rounds: int) -> float:
    """Print the matmul floor of both tile shapes (and with one exp2 pass) against sdpa, interleaved.

    Returns the compiled tile shape's matmuls-only time / sdpa.
    """
    base = AttnSpec(batch=1, heads=8, seq_len=length, head_dim=64)
    chunked, compiled = attnbench.get_variant("chunked"), attnbench.get_variant("compiled_chunked")
    q, k, v, _ = base.make_inputs(seed=0)
    q3, k3, v3 = (t.reshape(8, length, 64) for t in (q, k, v))  # (B*H, L, D)
    floors: dict[str, Callable[[], object]] = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v)
    }
    for who, variant in (("eager", chunked), ("compiled", compiled.base)):
        cq, ck = variant.chunks(base.lq, base.lk, base.dtype)
        floors[f"{who} {cq}x{ck} matmuls"] = _gemm_floor(q3, k3, v3, cq, ck, exp=False)
        floors[f"{who} {cq}x{ck} matmuls + exp2"] = _gemm_floor(q3, k3, v3, cq, ck, exp=True)
    for call in floors.values():
        call()
    samples = timed_rounds(floors, rounds)
    load = os.getloadavg()
    flops = chunked.flops(base).executed
    print(
        f"[2] the floor: chunked's tile matmuls alone vs sdpa, same rounds; load average {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )
    for label in floors:
        seconds = statistics.median(samples[label])
        print(
            f"    {label:32s} {seconds * 1e3:8.1f} ms  {flops / seconds / 1e9:6.1f} GFLOP/s  "
            f"/ sdpa x{_pair_ratio(samples, label, 'sdpa'):.3f}"
        )
    cq, ck = compiled.base.chunks(base.lq, base.lk, base.dtype)
    return _pair_ratio(samples, f"compiled {cq}x{ck} matmuls", "sdpa")


def compiled_floor(length: int, rounds: int, matmul_floor: float) -> None:
    """Print Inductor's softmax kernels on one compiled-shape tile, scaled to the grid, over sdpa.

    The kernels return only the row sums, so Inductor stores no probabilities (and allocates nothing
    large): a lower bound on the softmax work of any compiled tile loop, which must also store them
    for ``P V``. ``matmul_floor`` is that tile shape's matmuls-only time / sdpa from :func:`floor_figures`.
    """
    base = AttnSpec(batch=1, heads=8, seq_len=length, head_dim=64)
    cq, ck = attnbench.get_variant("compiled_chunked").base.chunks(base.lq, base.lk, base.dtype)
    tiles = -(-length // cq) * -(-length // ck)
    gen = torch.Generator().manual_seed(0)
    scores = (
        torch.randn(8, cq, ck, generator=gen) * 4
    )  # (B*H, Cq, Ck): one tile of log2-scaled scores
    q, k, v, _ = base.make_inputs(seed=0)

    def exp2_sum(s: torch.Tensor) -> torch.Tensor:
        return torch.exp2(s).sum(dim=-1)  # (B*H, Cq)

    def max_exp2_sum(s: torch.Tensor) -> torch.Tensor:
        return torch.exp2(s - s.amax(dim=-1, keepdim=True)).sum(dim=-1)  # (B*H, Cq)

    kernels = {
        "exp2 + sum": torch.compile(exp2_sum, dynamic=False),
        "max + exp2 + sum": torch.compile(max_exp2_sum, dynamic=False),
    }
    calls: dict[str, Callable[[], object]] = {
        "sdpa": lambda: F.scaled_dot_product_attention(q, k, v)
    }
    calls.update({label: functools.partial(kernel, scores) for label, kernel in kernels.items()})
    for call in calls.values():
        call()  # compiles
    samples = timed_rounds(calls, rounds)
    sdpa = statistics.median(samples["sdpa"])
    print(
        f"[3] the compiled floor: Inductor's kernels on one {cq}x{ck} tile (B*H=8), no stores, x {tiles} tiles, over sdpa"
    )
    for label in kernels:
        seconds = statistics.median(samples[label])
        share = seconds * tiles / sdpa
        print(
            f"    {label:18s} {seconds * 1e3:6.2f} ms a tile, {seconds / scores.numel() * 1e9:5.2f} ns a score: "
            f"x{share:.3f} of sdpa; with the matmul floor x{matmul_floor + share:.3f}"
        )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds (default 9)")
    parser.add_argument("--length", type=int, default=4096, help="sequence length L (default 4096)")
    parser.add_argument(
        "--baseline", help="a chunked.py of another revision, timed in the same rounds"
    )
    args = parser.parse_args()
    if args.rounds < 1 or args.length < 1:
        parser.error("--rounds and --length must be positive")
    regime.apply(regime.Regime(threads=regime.DEFAULT_THREADS))
    goal_figures(args.length, args.rounds, args.baseline)
    matmul_floor = floor_figures(args.length, args.rounds)
    compiled_floor(args.length, args.rounds, matmul_floor)


if __name__ == "__main__":
    main()
