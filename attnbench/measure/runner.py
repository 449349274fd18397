"""The runner: one (variant, spec) in, one :class:`Measurement` out, whatever happens.

For every case: declared support -> budget guard -> inputs (untimed) -> one checked call against
the float64 reference (doubles as warm-up) -> timing -> peak tensor memory -> peak RSS. Unsupported
and over-budget cases become ``skipped`` rows, an allocation failure becomes ``oom``, a call slower
than the time budget becomes ``timeout``, and any other exception becomes ``error`` with its
message. Only bad arguments to the runner itself raise.
"""

from __future__ import annotations

import gc
import math
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from attnbench.measure import guard, memory
from attnbench.measure.env import environment
from attnbench.measure.peak import matmul_peak
from attnbench.measure.provenance import sdpa_backends
from attnbench.measure.record import Environment, Measurement
from attnbench.measure.timer import TimerConfig, cuda_graph_seconds, time_call, time_once
from attnbench.measure.worker import CAP_ALLOWANCE_BYTES, CaseJob, WorkerPool
from attnbench.reference import reference_attention
from attnbench.registry import get_variant
from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant

ProgressCallback = Callable[[int, int, str, AttnSpec], None]
ResultCallback = Callable[[int, Measurement], None]


@dataclass(frozen=True)
class MeasureConfig:
    """Everything that decides how a case is measured (recorded nowhere else)."""

    timer: TimerConfig = field(default_factory=TimerConfig)  # repeat policy
    threads: int | None = None  # torch intra-op threads for the sweep; None keeps torch's default
    memory_budget_fraction: float = 0.5  # skip cases predicted to need more than this share of free memory
    memory_budget_bytes: float | None = None  # explicit budget; overrides the fraction when set
    time_budget_s: float = 60.0  # skip (predicted) or stop (measured) cases slower than this in total
    check_accuracy: bool = True  # compare one call against the float64 reference
    reference_budget_bytes: float = 512 * 2**20  # largest float64 reference (one head) worth computing
    measure_memory: bool = True  # peak tensor bytes (profiler on CPU, allocator stats on CUDA)
    measure_rss: bool = True  # peak process RSS during one call
    seed: int = 0  # input seed
    cuda_graphs: bool = False  # CUDA: also time CUDA-graph replay (launch overhead removed), in extra

    def __post_init__(self) -> None:
        if not 0 < self.memory_budget_fraction <= 1:
            raise ValueError(f"memory_budget_fraction must be in (0, 1], got {self.memory_budget_fraction}")
        if self.time_budget_s <= 0:
            raise ValueError(f"time_budget_s must be > 0, got {self.time_budget_s}")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    def memory_budget(self, device: str) -> float:
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        return guard.free_bytes(device) * self.memory_budget_fraction


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_call(
    variant: Variant, spec: AttnSpec, seed: int
) -> tuple[Callable[[], object], tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Build and validate inputs (untimed) and the closure to time: one forward, or forward + backward.

    The closure calls :meth:`Variant.forward` directly: validation happened here, once.

    Returns:
        ``(call, (q, k, v), mask)``.
    """
    backward = spec.mode == "backward"
    q, k, v, mask = spec.make_inputs(seed=seed, requires_grad=backward)
    mask4 = variant.validate(q, k, v, mask)
    if not backward:

        def call() -> object:
            with torch.no_grad():
                return variant.forward(q, k, v, mask4)

        return call, (q, k, v), mask
    gen = torch.Generator().manual_seed(seed + 1)
    grad_out = torch.randn(spec.batch, spec.heads, spec.lq, spec.dv, generator=gen).to(q)  # never zeros

    def call_backward() -> object:
        out = variant.forward(q, k, v, mask4)
        return torch.autograd.grad(out, (q, k, v), grad_out)

    return call_backward, (q, k, v), mask


def max_error(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    reference: Callable[..., torch.Tensor] | None = None,
) -> float:
    """Max |variant - float64 reference| on batch 0, head 0 (heads are independent).

    ``reference`` defaults to the variant's own (what it claims to compute); pass
    :func:`reference_attention` to measure an approximate variant against exact softmax attention.
    """
    sl = (slice(0, 1), slice(0, 1))
    m = None if mask is None else mask[tuple(slice(0, 1) if s > 1 else slice(None) for s in mask.shape[:2])]
    reference = reference or variant.reference
    with torch.no_grad():
        out = variant(q[sl], k[sl], v[sl], m)
        ref = reference(q[sl].detach(), k[sl].detach(), v[sl].detach(), m)
    return float((out.double() - ref).abs().max())


def peak_tensor_bytes(variant: Variant, spec: AttnSpec, call: Callable[[], object]) -> tuple[float, str]:
    """Peak tensor bytes above the inputs during one ``call``, and how they were obtained.

    CUDA: allocator statistics. CPU: the profiler's memory timeline, except for interpreter-bound
    variants (``loop``), whose millions of scalar operations would make profiling slower than the
    benchmark itself; those, and any case the private profiler API cannot measure, fall back to the
    variant's analytic prediction (method "model": a prediction, never to be fitted as a measurement).
    """
    if spec.device_type == "cuda":
        return float(memory.cuda_peak_tensor_bytes(call, spec.device)), "cuda"
    if variant.SECONDS_PER_PAIR == 0.0:
        measured = memory.cpu_peak_tensor_bytes(call)
        if measured is not None:
            return float(measured), "profiler"
    return float(variant.predicted_peak_bytes(spec)), "model"


def reference_bytes(variant: Variant, spec: AttnSpec) -> float:
    """Float64 bytes the one-head reference needs (its own scratch model at float64)."""
    one_head = spec.replace(batch=1, heads=1, dtype="float64", mode="forward")
    return 3 * spec.lq * spec.lk * 8 + variant.scratch_elements(one_head) * 8


def measure(
    variant_name: str,
    spec: AttnSpec,
    config: MeasureConfig | None = None,
    *,
    peak_flops: float | None = None,
    env: Environment | None = None,
) -> Measurement:
    """Measure one case; never raises for a failing case (see the module docstring).

    Args:
        variant_name: a registered variant.
        spec: the case.
        config: measurement policy.
        peak_flops: this machine's matmul FLOP/s for the time guard (measured if None).
        env: environment to record (collected if None).

    Example:
        >>> m = measure("batched", AttnSpec(seq_len=256, heads=2))
        >>> m.status, m.median > 0
        ('ok', True)
    """
    config = config or MeasureConfig()
    variant = get_variant(variant_name)
    env = env or environment(spec.device)
    flops = variant.flops(spec)
    base = dict(
        variant=variant_name,
        spec=spec,
        env=env,
        flops_useful=flops.useful,
        flops_executed=flops.executed,
        predicted_peak_bytes=float(variant.predicted_peak_bytes(spec)),
    )
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        return Measurement(status="skipped", reason="; ".join(reasons), **base)
    if peak_flops is None:
        peak_flops = matmul_peak(spec.device, "float32")
    calls = 2 + config.timer.warmup + config.timer.min_runs + int(config.measure_memory) + int(config.measure_rss)
    reasons = guard.guard_reasons(
        variant, spec,
        memory_budget=config.memory_budget(spec.device),
        time_budget=config.time_budget_s,
        peak_flops=peak_flops,
        calls=calls,
    )
    if reasons:
        return Measurement(status="skipped", reason="; ".join(reasons), **base)

    try:
        call, (q, k, v), mask = make_call(variant, spec, config.seed)
        compile_seconds = variant.warm_up(q, k, v, mask) or math.nan  # compilation: recorded, never timed
        error, softmax_error, notes = math.nan, math.nan, []
        if config.check_accuracy and reference_bytes(variant, spec) <= config.reference_budget_bytes:
            error = max_error(variant, q, k, v, mask)
            if not math.isfinite(error):
                return Measurement(status="error", reason=f"non-finite output (max error {error})", **base)
            if not variant.exact:
                softmax_error = max_error(variant, q, k, v, mask, reference=reference_attention)
        elif config.check_accuracy:
            notes.append("accuracy not checked: float64 reference over its memory budget")
        first = time_once(call, spec.device)
        if first * calls > config.time_budget_s:
            return Measurement(
                status="timeout", samples=(first,), runs=1, max_error=error,
                reason=f"one call took {first:.2f} s; {calls} calls exceed the time budget {config.time_budget_s:g} s",
                **base,
            )
        samples, runs = time_call(call, spec.device, config.timer)
        peak, method = peak_tensor_bytes(variant, spec, call) if config.measure_memory else (math.nan, "")
        rss = float(memory.peak_rss_bytes(call)) if config.measure_rss else math.nan
        extra: dict[str, object] = {}
        if variant.PROVENANCE:
            extra["kernel"] = "+".join(sdpa_backends(call, spec.device)) or "unknown"
        if config.cuda_graphs and spec.device_type == "cuda":
            try:
                extra["graph_replay_s"] = cuda_graph_seconds(call, spec.device)
            except RuntimeError as exc:  # not capturable: say so, keep the eager figures
                extra["graph_replay_s"] = math.nan
                notes.append(f"CUDA graph capture failed: {str(exc).splitlines()[0][:120]}")
        return Measurement(
            status="ok", reason="; ".join(notes), samples=tuple(samples), runs=runs,
            timing_method="cuda_events" if spec.device_type == "cuda" else "wall", peak_tensor_bytes=peak,
            memory_method=method, peak_rss_bytes=rss, max_error=error, softmax_error=softmax_error,
            compile_seconds=compile_seconds, extra=extra, **base,
        )
    except Exception as exc:  # noqa: BLE001 - one bad case must never end a sweep
        status = "oom" if _is_oom(exc) else "error"
        return Measurement(status=status, reason=f"{type(exc).__name__}: {str(exc).splitlines()[0][:300]}", **base)
    finally:
        _free(spec.device)


def sweep(
    cases: Iterable[tuple[str, AttnSpec]],
    config: MeasureConfig | None = None,
    *,
    progress: ProgressCallback | None = None,
    on_result: ResultCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    isolate: bool = False,
    workers: WorkerPool | None = None,
    case_timeout_s: float | None = None,
    memory_cap: bool = True,
) -> list[Measurement]:
    """Measure every ``(variant, spec)`` case in order, with fixed threads and one environment.

    Args:
        cases: ``(variant name, spec)`` pairs; names are validated before anything runs.
        config: measurement policy (``threads`` is applied for the sweep and restored after).
        progress: called as ``progress(index, total, variant, spec)`` before each case.
        on_result: called as ``on_result(index, measurement)`` after each case (e.g. to log it durably).
        should_stop: checked before each case; when it returns True the sweep returns what it has.
        isolate: measure each case in a fresh worker process (see :mod:`attnbench.measure.worker`):
            a hang is killed (``timeout``), a native crash or an OOM kill ends only that case
            (``crashed`` / ``oom``). False measures in this process (variants registered
            interactively are visible; a crash ends the caller).
        workers: the pool to use when isolating (default: a new one with no extra environment).
        case_timeout_s: hard limit for one isolated case (default ``2 * time_budget_s + 60``).
        memory_cap: isolated CPU cases get ``RLIMIT_DATA`` = current use + memory budget + 1 GiB.

    Raises:
        ValueError: an unknown variant name or a non-positive ``case_timeout_s``, before anything runs.
    """
    config = config or MeasureConfig()
    cases = list(cases)
    for name, _ in cases:
        get_variant(name)  # unknown names fail here, before any measurement
    if case_timeout_s is not None and not (case_timeout_s > 0 and math.isfinite(case_timeout_s)):
        raise ValueError(f"case_timeout_s must be a finite number > 0, got {case_timeout_s}")
    timeout = case_timeout_s or 2 * config.time_budget_s + 60
    if isolate and workers is None:
        workers = WorkerPool()
    saved_threads = torch.get_num_threads()
    if config.threads is not None:
        torch.set_num_threads(config.threads)
    try:
        devices = sorted({spec.device for _, spec in cases})
        envs = {d: environment(d) for d in devices}
        peaks = {d: matmul_peak(d, "float32") for d in devices if not d.startswith("cuda") or torch.cuda.is_available()}
        results: list[Measurement] = []
        for i, (name, spec) in enumerate(cases):
            if should_stop is not None and should_stop():
                break
            if progress is not None:
                progress(i, len(cases), name, spec)
            peak, env = peaks.get(spec.device, 1e12), envs[spec.device]
            if isolate:
                cap = None
                if memory_cap and spec.device_type == "cpu":
                    cap = int(config.memory_budget(spec.device)) + CAP_ALLOWANCE_BYTES
                job = CaseJob(name, spec, config, peak, env, sys_path=list(sys.path), memory_cap_bytes=cap,
                              environ=dict(os.environ))
                result = workers.run(job, timeout)
            else:
                result = measure(name, spec, config, peak_flops=peak, env=env)
            results.append(result)
            if on_result is not None:
                on_result(i, result)
        return results
    finally:
        torch.set_num_threads(saved_threads)


def default_lengths(variant: Variant, lengths: Sequence[int]) -> list[int]:
    """The lengths of ``lengths`` a variant is swept over by default (``loop`` stops at 128)."""
    if variant.SECONDS_PER_PAIR > 0:
        return [n for n in lengths if n <= 128]
    return list(lengths)
