"""Profile one case under ``torch.profiler`` and explain where the time and memory went.

Writes, into one directory:
  * ``trace.json.gz``: Chrome trace, gzipped (open in https://ui.perfetto.dev or chrome://tracing);
  * ``top_ops.txt``: top operators by self time and by self memory;
  * ``memory.png`` / ``.svg``: live tensor bytes over time with the peak marked and, for variants
    that materialise scores, the size of one (L x L) score tensor for scale;
  * ``summary.json``: the numbers behind the one-line summary.

The summary splits wall time into time inside operators and time outside them (the Python
interpreter, argument parsing, dispatch), which is what makes the ``loop`` baseline slow: it issues
millions of microsecond-sized operator calls for the same FLOPs ``batched`` does in a few kernels.
"""

from __future__ import annotations

import gzip
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import NamedTuple

import torch
from torch.profiler import ProfilerActivity, profile

from attnbench.io import atomic_write, atomic_write_text
from attnbench.measure import guard, regime
from attnbench.measure.config import MeasureConfig
from attnbench.measure.memory import live_bytes, peak_from_timeline, quiet_stderr
from attnbench.measure.peak import matmul_peak
from attnbench.measure.runner import make_call
from attnbench.measure.timer import time_once
from attnbench.registry import get_variant
from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant

__all__ = ["profile_case"]


@dataclass(frozen=True)
class _ProfileSummary:
    """What one profiled call did."""

    variant: str  # registry name
    spec: str  # the case's label
    wall_s: float  # wall time of the profiled call (profiler overhead included)
    unprofiled_s: float  # wall time of the same call without the profiler
    op_s: float  # time inside top-level operators (self time of all ops)
    outside_ops_fraction: float  # share of wall time spent outside operators (Python, dispatch)
    op_calls: int  # operator calls recorded
    calls_per_s: float  # op_calls / wall time
    top_op: str  # operator with the most self time
    top_op_fraction: float  # its share of operator time
    profiled_spec: str  # the case the profiler saw (one head for interpreter-bound variants)
    peak_bytes: float  # peak live tensor bytes above the inputs (NaN if not measurable)
    score_bytes: float  # one (B, H, Lq, Lk) tensor at the case's dtype, for scale
    gflops: float  # executed FLOPs / unprofiled time
    # the measurement regime the call ran in (threads, allocator, THP): regime.describe()
    regime: str = ""

    def line(self) -> str:
        """The summary as one line of text (what ``attnbench profile`` prints first)."""
        peak = "n/a"
        if self.peak_bytes == self.peak_bytes:
            peak = (
                f"{self.peak_bytes / 2**20:.1f} MiB ({self.peak_bytes / self.score_bytes:.2f}x one "
                "score tensor)"
            )
        sliced = ""
        if self.profiled_spec != self.spec:
            sliced = f" [profiled {self.profiled_spec}: every head runs the same loop]"
        return (
            f"{self.variant} [{self.spec}]: {self.unprofiled_s * 1e3:.1f} ms per call, "
            f"{self.gflops:.1f} GFLOP/s; {self.outside_ops_fraction:.0%} of profiled wall time "
            "outside operators (Python/dispatch), "
            f"{self.op_calls:,} operator calls ({self.calls_per_s:,.0f}/s); top op {self.top_op} "
            f"{self.top_op_fraction:.0%} of op time; peak {peak}{sliced}; {self.regime}"
        )


def _memory_figure(
    timeline: list[tuple], score_bytes: float, dense: bool, title: str, stem: Path
) -> None:
    """Live tensor MiB over the profiled call with its peak marked, as ``stem``.png and .svg.

    For a ``dense`` variant, one score tensor's size is marked too.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    series = live_bytes(timeline)  # PREEXISTING entries (the inputs) carry no usable time
    start = series[0][0] if series else 0
    times = [0.0] + [(t - start) / 1e6 for t, _ in series]
    live = [0.0] + [b / 2**20 for _, b in series]
    fig, ax = plt.subplots(figsize=(8, 4))
    if times:
        ax.step(times, live, where="post", lw=1.2)
        i = max(range(len(live)), key=live.__getitem__)
        ax.scatter([times[i]], [live[i]], color="red", zorder=3)
        ax.annotate(
            f"peak {live[i]:.1f} MiB",
            (times[i], live[i]),
            xytext=(6, -12),
            textcoords="offset points",
            color="red",
        )
    if dense:
        ax.axhline(score_bytes / 2**20, ls="--", color="0.4")
        ax.annotate(
            "one (L x L) score tensor",
            (0, score_bytes / 2**20),
            xytext=(2, 3),
            textcoords="offset points",
            fontsize=8,
        )
    ax.set(
        xlabel="time since profiling started (ms)",
        ylabel="live tensor MiB (above inputs)",
        title=title,
    )
    fig.tight_layout()
    for ext in ("png", "svg"):
        atomic_write(
            stem.with_suffix(f".{ext}"), lambda tmp, ext=ext: fig.savefig(tmp, format=ext, dpi=110)
        )
    plt.close(fig)


def _export_gzipped(prof, path: str) -> None:
    """Chrome trace JSON, gzipped: interpreter-bound cases emit hundreds of MB of JSON otherwise."""
    with tempfile.TemporaryDirectory() as tmp:
        raw = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)


_PROFILE_CALLS = 3
"""Calls a profile makes: a warm-up, one unprofiled timing, one profiled call."""


def profile_case(
    variant_name: str,
    spec: AttnSpec,
    out_dir: str | Path,
    seed: int = 0,
    config: MeasureConfig | None = None,
    progress: Callable[[str], None] | None = None,
) -> _ProfileSummary:
    """Profile one call of ``variant_name`` on ``spec`` (after a warm-up) and write the artefacts.

    The case passes a benchmark case's guard first (inputs, mask, weights, the variant's predicted
    peak; ``config``'s memory and time budgets), so a profile cannot exhaust the machine, and runs
    in the measurement regime every entry point uses (:class:`~attnbench.measure.regime.Regime`
    with ``config.threads``, default :data:`~attnbench.measure.regime.DEFAULT_THREADS`), recorded
    in the summary. ``progress`` is called with a line as each step starts (the CLI prints it): an
    interpreter-bound variant takes minutes over its calls and the profiler's memory replay.

    Raises:
        ValueError: for an unknown variant, a case the variant does not support, or one the guard
            refuses (the reason names the predicted peak and the budget).
    """
    say = progress or (lambda line: None)
    variant = _guarded_variant(variant_name, spec, config or MeasureConfig())
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    call, _, _ = make_call(variant, spec, seed)
    say(f"{variant_name} {spec.label}: a warm-up call and an unprofiled timed call")
    call()  # warm-up
    unprofiled = time_once(call, spec.device)
    profiled = _profiled_spec(variant, spec)
    if profiled != spec:
        call, _, _ = make_call(variant, profiled, seed)
    say(
        f"one call under torch.profiler ({profiled.label}; the previous call took "
        f"{unprofiled:.3g} s)"
    )
    prof, averages, wall = _profiled_call(call, spec.device_type)
    say(
        f"the memory timeline of its {sum(a.count for a in averages):,} operator calls, then the "
        "trace (the longest step where a call makes many operator calls)"
    )
    with quiet_stderr():  # the profiler's own lines are noise on a user's terminal
        timeline = _memory_timeline(prof)
        atomic_write(out_dir / "trace.json.gz", lambda tmp: _export_gzipped(prof, tmp))
    _write_top_ops(averages, out_dir / "top_ops.txt")
    summary = _summarise(
        averages, timeline, variant, spec, profiled, wall=wall, unprofiled=unprofiled
    )
    _memory_figure(
        timeline,
        summary.score_bytes,
        variant.memory_exponent >= 2,
        f"{variant_name}: {profiled.label}",
        out_dir / "memory",
    )
    atomic_write_text(
        out_dir / "summary.json", json.dumps({**asdict(summary), "line": summary.line()}, indent=1)
    )
    return summary


def _guarded_variant(variant_name: str, spec: AttnSpec, config: MeasureConfig) -> Variant:
    """The variant, once it supports ``spec`` and the guard lets the profile's calls run.

    The measurement regime is applied first: the guard predicts time from the matmul peak at its
    threads.

    Raises:
        ValueError: the reasons the variant or the guard gives.
    """
    variant = get_variant(variant_name)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        raise ValueError(f"{variant_name} cannot run {spec.label}: " + "; ".join(reasons))
    regime.apply(regime.Regime(threads=config.threads or regime.DEFAULT_THREADS))
    reasons = guard.guard_reasons(
        variant,
        spec,
        memory_budget=config.memory_budget(spec.device),
        time_budget=config.time_budget_s,
        peak_flops=matmul_peak(spec.device, "float32"),
        calls=_PROFILE_CALLS,
    )
    if reasons:
        raise ValueError(f"{variant_name} {spec.label} refused by the guard: " + "; ".join(reasons))
    return variant


def _profiled_spec(variant: Variant, spec: AttnSpec) -> AttnSpec:
    """The profiler's case: ``spec``, or one (batch, head) of it for an interpreter-bound variant.

    Such a variant issues ~10 operator calls per (query, key) pair: a million events for one L=128
    call, which the profiler and its memory replay take many minutes over. Every (batch, head)
    runs the same loop, so one of them shows where the time goes (the unprofiled time is the full
    case's).
    """
    return spec.replace(batch=1, heads=1) if variant.SECONDS_PER_PAIR > 0 else spec


class _Profiled(NamedTuple):
    """One call as ``torch.profiler`` saw it."""

    prof: profile
    # the profiler's key_averages(): operator name -> calls, self time, self memory
    averages: object
    wall_s: float  # the call's wall time, profiler overhead included


def _profiled_call(call: Callable[[], object], device_type: str) -> _Profiled:
    """One call under ``torch.profiler``, recording shapes and memory."""
    sync = torch.cuda.synchronize if device_type == "cuda" else (lambda: None)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device_type == "cuda" else [])
    with (
        quiet_stderr(),
        profile(activities=activities, record_shapes=True, profile_memory=True) as prof,
    ):
        t0 = time.perf_counter()
        call()
        sync()
        wall = time.perf_counter() - t0
    with quiet_stderr():
        return _Profiled(prof, prof.key_averages(), wall)


def _memory_timeline(prof: profile) -> list[tuple]:
    """The profiler's memory timeline; empty where torch's private memory profiler fails."""
    try:
        from torch.profiler._memory_profiler import MemoryProfile

        return MemoryProfile(prof.profiler.kineto_results).timeline
    except (ImportError, AttributeError, RuntimeError, TypeError, ValueError):
        return []


def _write_top_ops(averages, path: Path) -> None:
    """The 15 operators with the most self CPU time, then the 15 with the most self CPU memory."""
    by_time = averages.table(sort_by="self_cpu_time_total", row_limit=15)
    by_mem = averages.table(sort_by="self_cpu_memory_usage", row_limit=15)
    atomic_write_text(
        path,
        f"Top operators by self CPU time\n{by_time}\n\n"
        f"Top operators by self CPU memory\n{by_mem}\n",
    )


def _summarise(
    averages,
    timeline: list[tuple],
    variant: Variant,
    spec: AttnSpec,
    profiled: AttnSpec,
    *,
    wall: float,
    unprofiled: float,
) -> _ProfileSummary:
    """The summary of one call of ``profiled``, standing for ``spec``.

    ``wall``: the call's seconds under the profiler; ``unprofiled``: ``spec``'s seconds without it.
    """
    op_us = sum(a.self_cpu_time_total for a in averages)
    calls = sum(a.count for a in averages)
    top = max(averages, key=lambda a: a.self_cpu_time_total) if len(averages) else None
    return _ProfileSummary(
        variant=variant.name,
        spec=spec.label,
        profiled_spec=profiled.label,
        wall_s=wall,
        unprofiled_s=unprofiled,
        op_s=op_us / 1e6,
        outside_ops_fraction=max(0.0, 1.0 - op_us / 1e6 / wall) if wall > 0 else 0.0,
        op_calls=calls,
        calls_per_s=calls / wall if wall > 0 else 0.0,
        top_op=top.key if top else "",
        top_op_fraction=(top.self_cpu_time_total / op_us) if top and op_us else 0.0,
        peak_bytes=float(peak_from_timeline(timeline)) if timeline else float("nan"),
        score_bytes=float(
            profiled.batch * profiled.heads * profiled.lq * profiled.lk * profiled.elem_bytes
        ),
        gflops=variant.flops(spec).executed / unprofiled / 1e9,
        regime=regime.describe(),
    )
