"""The runner: one (variant, spec) in, one :class:`Measurement` out, whatever happens.

A case goes: cost model and declared support -> budget guard (all counted before anything is
allocated) -> inputs -> the first call of the timed closure (warm-up, ``compile_seconds``) -> the
correctness gate on its result -> timing -> peak tensor memory -> peak RSS -> later calls checked.
Unsupported or over budget: ``skipped``; failing the gate: ``wrong``, never timed (a number the
suite cannot stand behind is not produced); an allocation failure: ``oom``; a call over the time
budget: ``timeout``; any other exception, the cost model's included: ``error``. Only bad arguments
to the runner itself raise.

A busy neighbour slows every block alike, so a tight IQR proves nothing: :func:`timed_attempts`
re-times blocks that waited for a core (:mod:`.schedstat`) and attempts the probe (:mod:`.probe`)
or bimodal blocks call disturbed; a case still disturbed is ``noisy``. The correctness check has a
time budget of its own (:func:`check_plan`): it takes fewer slices rather than cost a length.
"""

from __future__ import annotations

import dataclasses
import functools
import gc
import math
import numbers
import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch

from attnbench.contract import Method, Status
from attnbench.io import error_line
from attnbench.measure import gate, guard, memory, probe, regime, schedstat
from attnbench.measure.config import MeasureConfig
from attnbench.measure.env import environment
from attnbench.measure.peak import matmul_peak
from attnbench.measure.provenance import sdpa_backends
from attnbench.measure.record import Environment, Measurement
from attnbench.measure.timer import (
    Blocks,
    cuda_graph_seconds,
    measured_calls,
    time_blocks,
    time_once,
)
from attnbench.registry import get_variant
from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant, dense_mask

__all__ = [
    "make_call",
    "check_plan",
    "run_gate",
    "GatedCall",
    "peak_tensor_bytes",
    "measure",
    "rng_devices",
    "BASELINE_PROBES",
    "baseline_probes",
    "typical_speed",
    "timed_attempts",
    "default_lengths",
]


def _is_oom(exc: BaseException) -> bool:
    if isinstance(exc, (MemoryError, torch.cuda.OutOfMemoryError)):
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and (
        "out of memory" in text or "can't allocate memory" in text
    )


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda") and torch.cuda.is_available():
        torch.cuda.empty_cache()


def make_call(
    variant: Variant, spec: AttnSpec, seed: int
) -> tuple[Callable[[], object], tuple[torch.Tensor, ...], torch.Tensor | None]:
    """Build and validate inputs (untimed) and the closure to time: forward, or forward + backward.

    The closure calls :meth:`Variant.forward` directly (validation happened here, once) and returns
    what it computed, so the correctness gate checks the very call that is timed: forward returns
    the output ``(B, H, Lq, Dv)``; backward returns ``(out, dq, dk, dv)`` for the fixed random
    ``grad_out`` of :func:`_grad_output`.

    The mask: a variant that takes the predicate (:meth:`Variant.takes_mask_mod`: block skipping,
    ``is_causal``) receives the spec's :class:`~attnbench.mask_mods.MaskMod`; every other variant
    receives the dense bool tensor, built here (untimed) and counted by the guard
    (:meth:`Variant.mask_bytes`).

    Returns:
        ``(call, (q, k, v), mask)`` with the mask as the closure receives it (rank 4, a predicate,
        or None).
    """
    backward = spec.mode == "backward"
    q, k, v, mask = spec.make_inputs(
        seed=seed, requires_grad=backward, mask_form=variant.mask_form(spec)
    )
    mask4 = variant.validate(q, k, v, mask)
    if not backward:

        def call() -> object:
            with torch.no_grad():
                return variant.forward(q, k, v, mask4)

        return call, (q, k, v), mask4
    grad_out = _grad_output(spec, seed).to(q)

    def call_backward() -> object:
        out = variant.forward(q, k, v, mask4)
        return (out.detach(), *torch.autograd.grad(out, (q, k, v), grad_out))

    return call_backward, (q, k, v), mask4


def _grad_output(spec: AttnSpec, seed: int) -> torch.Tensor:
    """A backward case's fixed upstream gradient: ``(B, H, Lq, Dv)`` float32 on CPU, nonzero."""
    gen = torch.Generator().manual_seed((seed + 1) % 2**64)
    return torch.randn(spec.batch, spec.heads, spec.lq, spec.dv, generator=gen)


@dataclass(frozen=True)
class _CheckPlan:
    """How the correctness gate will check a case (decided before anything is allocated)."""

    slices: tuple[tuple[int, int], ...]  # (batch, head) slices to check; empty when not checked
    # memory the reference needs: one slice's working set, float64 and plain, and the truths kept
    reference_bytes: float
    note: str  # why the case is not checked ("" when it is)


def check_plan(
    variant: Variant,
    spec: AttnSpec,
    config: MeasureConfig,
    *,
    peak_flops: float | None = None,
    call_s: float | None = None,
) -> _CheckPlan:
    """Which slices the gate checks: all when affordable, else a seeded sample (see :mod:`.gate`).

    Affordable in memory (``config.reference_budget_bytes``) and, given ``peak_flops``, in time: the
    check's own budget (``config.check_seconds``) holds the float64 reference of the checked slices
    (:func:`.guard.reference_seconds`) and the :data:`_LATER_CHECKS` calls checked after the timed
    ones. A sample holds at least the first and the last slice; when not even one slice fits, the
    case is measured unchecked, with the reason as its note (the check never decides which lengths
    are measured).

    Args:
        peak_flops: this machine's matmul FLOP/s, for the reference's predicted time; None: memory
            alone decides.
        call_s: one call's seconds (None: the cost model's :func:`.guard.predicted_seconds`).
    """
    if not config.check_accuracy:
        return _CheckPlan((), 0.0, "")
    per_slice = gate.slice_reference_bytes(variant, spec)
    if per_slice > config.reference_budget_bytes:
        return _CheckPlan(
            (),
            0.0,
            (
                f"accuracy not checked: one (batch, head) slice of the float64 reference needs "
                f"{_size(per_slice)} > reference budget {_size(config.reference_budget_bytes)}"
            ),
        )
    limit = None
    if peak_flops is not None:
        calls_s = _LATER_CHECKS * (
            guard.predicted_seconds(variant, spec, peak_flops) if call_s is None else call_s
        )
        slice_s = guard.reference_seconds(variant, spec, 1, peak_flops)
        limit = math.floor((config.check_seconds - calls_s) / slice_s) if slice_s > 0 else None
        if limit is not None and limit < 1:
            return _CheckPlan(
                (),
                0.0,
                (
                    f"accuracy not checked: one (batch, head) slice of the float64 reference "
                    f"is predicted to take {slice_s:,.1f} s "
                    f"(and {_LATER_CHECKS} checked calls {calls_s:,.1f} s) "
                    f"> the check's time budget {config.check_seconds:g} s"
                ),
            )
    slices = gate.checked_slices(
        spec, per_slice, config.reference_budget_bytes, config.seed, limit=limit
    )
    return _CheckPlan(
        tuple(slices), 2 * per_slice + len(slices) * gate.slice_truth_bytes(variant, spec), ""
    )


def _size(nbytes: float) -> str:
    """Bytes in a unit that shows the number: MiB from 1 MiB, KiB from 1 KiB, else bytes."""
    for unit, size in (("MiB", 2**20), ("KiB", 2**10)):
        if nbytes >= size:
            return f"{nbytes / size:,.0f} {unit}"
    return f"{nbytes:,.0f} bytes"


def run_gate(
    variant: Variant,
    spec: AttnSpec,
    result: object,
    inputs: tuple[torch.Tensor, ...],
    mask: torch.Tensor | None,
    plan: _CheckPlan,
    seed: int,
) -> gate.GateResult | None:
    """Check one ``result`` of the closure on the planned slices; None when not checked."""
    reference = _gate_reference(variant, spec, inputs, mask, plan, seed)
    return None if reference is None else reference.check(result)


def _gate_reference(
    variant: Variant,
    spec: AttnSpec,
    inputs: tuple[torch.Tensor, ...],
    mask: torch.Tensor | None,
    plan: _CheckPlan,
    seed: int,
) -> gate.Reference | None:
    """The gate's float64 reference of the planned slices (None when the plan checks nothing)."""
    if not plan.slices:
        return None
    q, k, v = inputs
    grad_out = _grad_output(spec, seed).to(q) if spec.mode == "backward" else None
    if not variant.reference_is_blockwise():
        mask = dense_mask(mask, q, k)  # a dense reference evaluates a predicate densely (untimed)
    return gate.Reference(variant, q, k, v, mask, plan.slices, grad_out)


_LATER_CHECKS = 2
"""Consecutive calls checked after the timed ones: a fault on every second call shows in one."""


class GatedCall:
    """The timed closure of a case, its first call made and checked, later calls checked on demand.

    The inputs' bytes are fingerprinted before the first call and compared before every check, so a
    variant that writes into its inputs fails (the reference would otherwise be computed from inputs
    it had already changed). The float64 reference is computed once, at the first check.

    Args:
        variant, spec: the case.
        plan: which slices the gate checks (:func:`check_plan`); none: results are not checked.
        seed: the inputs' seed.
    """

    def __init__(self, variant: Variant, spec: AttnSpec, plan: _CheckPlan, seed: int) -> None:
        self.variant, self.spec, self.plan, self.seed = variant, spec, plan, seed
        self.call, self.inputs, self.mask = make_call(variant, spec, seed)
        self._watched = (*self.inputs, self.mask if isinstance(self.mask, torch.Tensor) else None)
        self._before = gate.fingerprint(self._watched) if plan.slices else ()
        self._reference: gate.Reference | None = None
        # The first call goes through the timed closure itself (same grad mode, same inputs): it
        # compiles whatever a compiled variant compiles, outside the timed region, and its result is
        # what the gate checks.
        result, compile_seconds = variant.warm_up(self.call)
        self.compile_seconds = compile_seconds or math.nan
        self.first = self.check(result)

    def check(self, result: object) -> gate.GateResult | None:
        """The gate on one result of the closure (None when the plan checks nothing)."""
        if not self.plan.slices:
            return None
        changed = gate.changed_inputs(self._before, self._watched)
        if changed:
            q = self.inputs[0]
            return gate.GateResult.breach(
                f"the variant changed its inputs in place ({', '.join(changed)})",
                q.dtype,
                self.spec.batch * self.spec.heads,
                self.spec.mode == "backward",
            )
        if self._reference is None:
            self._reference = _gate_reference(
                self.variant, self.spec, self.inputs, self.mask, self.plan, self.seed
            )
        return self._reference.check(result)

    def check_later(self, calls: int = _LATER_CHECKS) -> tuple[gate.GateResult | None, int]:
        """Make ``calls`` more checked calls: the first failure and its number, else the last."""
        checked = None
        for i in range(1, calls + 1):
            checked = self.check(self.call())
            if checked is not None and not checked.passed:
                return checked, i
        return checked, calls


def peak_tensor_bytes(
    variant: Variant, spec: AttnSpec, call: Callable[[], object]
) -> tuple[float, Method]:
    """Peak tensor bytes above the inputs during one ``call``, and how they were obtained.

    CUDA: allocator statistics. CPU: the profiler's memory timeline, except for interpreter-bound
    variants (``loop``), whose millions of scalar operations would make profiling slower than the
    benchmark itself; those, and any case the private profiler API cannot measure, fall back to the
    variant's analytic prediction (method "model": a prediction, never to be fitted as a
    measurement).
    """
    if spec.device_type == "cuda":
        return float(memory.cuda_peak_tensor_bytes(call, spec.device)), Method.CUDA
    if variant.SECONDS_PER_PAIR == 0.0:
        measured = memory.cpu_peak_tensor_bytes(call)
        if measured is not None:
            return float(measured), Method.PROFILER
    return float(variant.predicted_peak_bytes(spec)), Method.MODEL


def measure(
    variant_name: str,
    spec: AttnSpec,
    config: MeasureConfig | None = None,
    *,
    peak_flops: float | None = None,
    env: Environment | None = None,
    expected_call_s: float | None = None,
) -> Measurement:
    """Measure one case; never raises for a failing case (see the module docstring).

    Args:
        variant_name, spec: a registered variant and the case.
        config: measurement policy (None: the defaults).
        peak_flops: this machine's matmul FLOP/s for the time guard (measured if None).
        env: environment to record (collected if None).
        expected_call_s: one call's seconds as :func:`sweep` extrapolates them from the same case at
            a shorter length (:func:`.guard.extrapolated_seconds`), for the time guard; None: the
            cost model.

    Example:
        >>> m = measure("batched", AttnSpec(seq_len=256, heads=2))
        >>> str(m.status), m.median > 0
        ('ok', True)

    Raises:
        TypeError, ValueError: before anything is measured, for an unknown variant, a spec or config
            of the wrong type, or a ``peak_flops`` or ``expected_call_s`` not a finite number > 0.
    """
    _check_measure_args(
        variant_name, spec, config, env, peak_flops=peak_flops, expected_call_s=expected_call_s
    )
    config = config or MeasureConfig()
    variant = get_variant(variant_name)
    saved_threads = torch.get_num_threads()
    # The regime is applied here, the one place every entry point goes through (workers, a direct
    # call, profile): a process that did not apply it would time with glibc's dynamic thresholds,
    # raised by whatever it freed before (the gate's float64 reference, for one).
    regime.apply(regime.Regime(threads=config.threads or saved_threads))
    env = env or environment(spec.device)
    # Recorded from this process (a worker applies the regime itself): what was in force, not what
    # was asked.
    env = dataclasses.replace(env, threads=torch.get_num_threads(), regime=regime.describe())
    base: dict[str, object] = dict(
        variant=variant_name, spec=spec, env=env, workload=config.workload
    )
    # a variant that seeds (torch.manual_seed in forward) must not reseed its caller
    with torch.random.fork_rng(devices=rng_devices(spec.device)):
        try:  # the cost model runs in here too: a variant whose model raises is a row
            base.update(_cost_model(variant, spec))
            return _guard_and_run(variant, spec, config, base, peak_flops, expected_call_s)
        except (Exception, SystemExit) as exc:  # noqa: BLE001
            # one bad case (even one calling sys.exit) never ends a sweep
            status = Status.OOM if _is_oom(exc) else Status.ERROR
            return Measurement(status=status, reason=error_line(exc), **base)
        finally:
            _free(spec.device)
            torch.set_num_threads(saved_threads)


def rng_devices(device: str) -> list[int]:
    """The CUDA devices whose RNG state :func:`measure` saves and restores around a case.

    Every device once CUDA is initialized in this process (a CPU case's variant may still call
    ``torch.manual_seed``, which seeds them all), else the case's own CUDA device (its case
    initializes CUDA), else none: saving a state would initialize CUDA for a CPU case.
    """
    if not torch.cuda.is_available():
        return []
    if torch.cuda.is_initialized():
        return list(range(torch.cuda.device_count()))
    if device.startswith("cuda"):
        index = torch.device(device).index
        return [torch.cuda.current_device() if index is None else index]
    return []


def _check_measure_args(
    variant_name: object, spec: object, config: object, env: object, **positive: object
) -> None:
    """Raise TypeError or ValueError for arguments :func:`measure` refuses (see its docstring)."""
    if not isinstance(variant_name, str):
        raise TypeError(
            f"variant_name must be a registered variant's name (a str), "
            f"got {type(variant_name).__name__}"
        )
    if not isinstance(spec, AttnSpec):
        raise TypeError(f"spec must be an AttnSpec, got {type(spec).__name__} {spec!r:.80}")
    if config is not None and not isinstance(config, MeasureConfig):
        raise TypeError(
            f"config must be a MeasureConfig or None, got {type(config).__name__} {config!r:.80}"
        )
    for name, value in positive.items():
        if value is not None and (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not (math.isfinite(value) and value > 0)
        ):
            raise ValueError(f"{name} must be a finite number > 0 or None, got {value!r}")
    if env is not None and not isinstance(env, Environment):
        raise TypeError(f"env must be an Environment or None, got {type(env).__name__}")


def _guard_and_run(
    variant: Variant,
    spec: AttnSpec,
    config: MeasureConfig,
    base: dict,
    peak_flops: float | None,
    expected_call_s: float | None,
) -> Measurement:
    """Declared support and the budget guard, then the case (raises; :func:`measure` records)."""
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        return Measurement(status=Status.SKIPPED, reason="; ".join(reasons), **base)
    if peak_flops is None:
        peak_flops = matmul_peak(spec.device, "float32")
    predicted_s = (
        expected_call_s
        if expected_call_s is not None
        else guard.predicted_seconds(variant, spec, peak_flops)
    )
    calls = _calls(config, predicted_s)
    plan = check_plan(variant, spec, config, peak_flops=peak_flops, call_s=predicted_s)
    reasons = guard.guard_reasons(
        variant,
        spec,
        memory_budget=config.memory_budget(spec.device),
        time_budget=config.time_budget_s,
        peak_flops=peak_flops,
        calls=calls,
        reference_bytes=plan.reference_bytes,
        call_s=expected_call_s,
    )
    if reasons:
        return Measurement(status=Status.SKIPPED, reason="; ".join(reasons), **base)
    if config.probe and config.probe_baseline_s is None:
        # A direct call (a fresh process, profile) judges disturbance by the rule sweep uses, not by
        # the case's own probes: those, taken beside a neighbour, would set a slow baseline and hide
        # it.
        config = dataclasses.replace(
            config, probe_baseline_s=typical_speed(baseline_probes(spec.device))
        )
    return _run(variant, spec, config, plan, calls, base)


def _cost_model(variant: Variant, spec: AttnSpec) -> dict[str, float]:
    """The variant's FLOP counts and predicted peak bytes, each a finite number >= 0.

    Raises:
        ValueError: naming the figure a cost model got wrong (a NaN would fail later as an obscure
            int conversion).
    """
    flops = variant.flops(spec)
    figures = dict(
        flops_useful=flops.useful,
        flops_executed=flops.executed,
        predicted_peak_bytes=variant.predicted_peak_bytes(spec),
    )
    for name, value in figures.items():
        if (
            isinstance(value, bool)
            or not isinstance(value, numbers.Real)
            or not (math.isfinite(value) and value >= 0)
        ):
            raise ValueError(
                f"the cost model of {variant.name} gave {name} = {value!r} "
                "(expected a finite number >= 0)"
            )
    return {**figures, "predicted_peak_bytes": float(figures["predicted_peak_bytes"])}


def _gate_fields(checked: gate.GateResult) -> dict[str, float]:
    """The Measurement fields of a gate's result."""
    return dict(
        max_error=checked.max_error,
        tolerance=checked.tolerance,
        grad_error=checked.grad_error,
        grad_tolerance=checked.grad_tolerance,
        softmax_error=checked.softmax_error,
        error_ratio=checked.error_ratio,
    )


def _run(
    variant: Variant,
    spec: AttnSpec,
    config: MeasureConfig,
    plan: _CheckPlan,
    calls: int,
    base: dict,
) -> Measurement:
    """Inputs, the checked warm-up call, timing and memory, then later calls checked again.

    Failures raise; :func:`measure` records them. The later checks hold no result during timing:
    they call again after the timed calls.
    """
    gated = GatedCall(variant, spec, plan, config.seed)
    checked = gated.first
    fields = _first_call_fields(gated)
    # a number the suite cannot stand behind is not produced: never timed
    if checked is not None and not checked.passed:
        return Measurement(status=Status.WRONG, reason=checked.reason(), **fields, **base)
    faults_before = memory.minor_faults()
    first = time_once(gated.call, spec.device)
    # Page faults of one call after the gate: fresh pages the call maps (the allocator regime shows
    # here).
    fields["extra"] = {**fields["extra"], "page_faults": memory.minor_faults() - faults_before}
    calls = _calls(config, first)
    if first * calls > config.time_budget_s:
        return Measurement(
            status=Status.TIMEOUT,
            samples=(first,),
            runs=1,
            reason=(
                f"one call took {first:.2f} s; "
                f"{calls} calls exceed the time budget {config.time_budget_s:g} s"
            ),
            **fields,
            **base,
        )
    return _time_case(gated, config, first, fields, base)


def _time_case(
    gated: GatedCall, config: MeasureConfig, first: float, fields: dict[str, object], base: dict
) -> Measurement:
    """Timing, peak tensor bytes and RSS of a case whose first call passed, then later checks."""
    variant, spec, call = gated.variant, gated.spec, gated.call
    timed = timed_attempts(call, spec.device, config, first)
    fields.update(
        probe_slowdown=timed.disturbance.slowdown if config.probe else math.nan,
        attempts=timed.attempts,
    )
    # the sweep's typical speed takes it in
    extra_probe = {"probe_median_s": timed.probe_median_s} if config.probe else {}
    extra_probe.update(_runqueue_extra(timed.shares))
    if config.probe and timed.disturbance.gpu:  # the GPU evidence the disturbance rule read
        extra_probe.update(
            event_spread=timed.disturbance.spread, gpu_neighbours=len(timed.disturbance.neighbours)
        )
    peak, method = (
        peak_tensor_bytes(variant, spec, call) if config.measure_memory else (math.nan, "")
    )
    rss = float(memory.peak_rss_bytes(call)) if config.measure_rss else math.nan
    # state kept between calls, or a fault on every other call, shows after the first call
    if gated.first is not None:
        later, number = gated.check_later()
        if not later.passed:
            return Measurement(
                status=Status.WRONG,
                reason=f"right on the first call, wrong on call {number} of "
                f"{_LATER_CHECKS} checked after the timed ones: {later.reason()}",
                **{**fields, **_gate_fields(later)},
                **base,
            )
    call_extra, call_notes = _call_extra(variant, spec, call, config)
    extra = {**fields.pop("extra"), **extra_probe, **call_extra}
    status, disturbed = _disturbance_status(timed, config)
    reason = "; ".join(filter(None, (disturbed, gated.plan.note, *call_notes)))
    return Measurement(
        status=status,
        reason=reason,
        samples=tuple(timed.samples),
        runs=timed.runs,
        timing_method=Method.CUDA_EVENTS if spec.device_type == "cuda" else Method.WALL,
        peak_tensor_bytes=peak,
        memory_method=method,
        peak_rss_bytes=rss,
        extra=extra,
        **fields,
        **base,
    )


def _disturbance_status(timed: _Timed, config: MeasureConfig) -> tuple[Status, str]:
    """ok, or noisy when even the kept attempt was disturbed, and what disturbed it ("" if ok)."""
    if config.probe and timed.disturbance.disturbed:
        kept = (
            "kept its only attempt"
            if timed.attempts == 1
            else f"kept the least disturbed of {timed.attempts} attempts"
        )
        return Status.NOISY, f"{timed.disturbance.describe()} ({kept})"
    return Status.OK, ""


def _first_call_fields(gated: GatedCall) -> dict[str, object]:
    """The Measurement fields of the checked warm-up call: its compile time and gate figures.

    The gate's figures are there when the call was checked (``extra`` holds what the check
    covered).
    """
    checked = gated.first
    fields: dict[str, object] = dict(compile_seconds=gated.compile_seconds, extra={})
    if checked is not None:
        fields.update(_gate_fields(checked))
        fields["extra"] = {"checked_slices": f"{checked.slices}/{checked.total_slices}"}
        if not math.isnan(checked.softmax_mean_error):
            fields["extra"]["softmax_mean_error"] = checked.softmax_mean_error
    return fields


def _call_extra(
    variant: Variant, spec: AttnSpec, call: Callable[[], object], config: MeasureConfig
) -> tuple[dict[str, object], list[str]]:
    """The ``extra`` keys about the call itself, and notes on them.

    The keys: the SDPA kernel that ran, why the executed FLOPs are unknown (``flops_unknown``, also
    a note) and, on CUDA with ``config.cuda_graphs``, the graph replay's time (a failed capture
    leaves a note).
    """
    extra: dict[str, object] = {}
    notes: list[str] = []
    if variant.PROVENANCE:
        extra["kernel"] = "+".join(sdpa_backends(call, spec.device)) or "unknown"
    unknown = variant.executed_flops_unknown(spec)
    if unknown:  # the rate on an upper bound of the FLOPs is not a fact: not reported
        extra["flops_unknown"] = unknown
        notes.append(unknown)
    if config.cuda_graphs and spec.device_type == "cuda":
        try:
            extra["graph_replay_s"] = cuda_graph_seconds(call, spec.device)
        except RuntimeError as exc:  # not capturable: say so, keep the eager figures
            extra["graph_replay_s"] = math.nan
            notes.append(f"CUDA graph capture failed: {str(exc).splitlines()[0][:120]}")
    return extra, notes


BASELINE_PROBES = 5
"""Probes the sweep takes before its first case to set the baseline."""


def baseline_probes(device: str) -> list[float]:
    """The probes a sweep (or a direct :func:`measure` call) takes before its first case."""
    return [probe.probe_seconds(device) for _ in range(BASELINE_PROBES)]


def typical_speed(probes: Sequence[float]) -> float:
    """The sweep's typical probe time: the median of what it has seen.

    Not a low percentile or the minimum: a shared virtual machine runs for seconds at a time much
    faster than usual (host clocks), and a baseline taken in such a moment flagged nearly every
    later case of a quiet sweep. The sweep feeds it one figure for its start probes and one per
    case (that case's median probe), so a start in an unusual moment is outvoted after two cases.

    Example:
        >>> typical_speed([0.64e-3, 1.03e-3, 1.02e-3])
        0.00102
    """
    return float(np.median(probes))


@dataclass(frozen=True)
class _Timed:
    """The kept timing attempt of a case, and what the probe and the scheduler saw around it."""

    # per-call seconds per block of the kept attempt (its undisturbed blocks, if any)
    samples: list[float]
    runs: int  # calls timed in those blocks
    # the kept attempt's probes against the sweep's typical probe time, and its wait
    disturbance: probe.Disturbance
    attempts: int  # attempts made (1 + retries used)
    probe_median_s: float  # median of the kept attempt's probes (NaN when not probed)
    # run-queue share of every block the kept attempt timed (dropped ones included)
    shares: tuple[float, ...] = ()


def _runqueue_extra(shares: Sequence[float]) -> dict[str, float]:
    """The ``extra`` keys of a case's run-queue wait (none when the kernel does not report it).

    ``waited_blocks``: the share of timed blocks that waited for a core over
    ``schedstat.WAIT_LIMIT`` of their time (each dropped and timed again when interference is
    judged); ``runqueue_share``: the median block's wait per wall second; ``runqueue_max``: the
    worst block's.

    Example:
        >>> runqueue_extra([0.0, 0.0, 0.5, 0.02])
        {'waited_blocks': 0.25, 'runqueue_share': 0.01, 'runqueue_max': 0.5}
    """
    if not shares:
        return {}
    waited = sum(share > schedstat.WAIT_LIMIT for share in shares)
    return {
        "waited_blocks": waited / len(shares),
        "runqueue_share": float(statistics.median(shares)),
        "runqueue_max": float(max(shares)),
    }


def _probe_into(probes: list[float], device: str) -> None:
    probes.append(probe.probe_seconds(device))


def _seen(
    typical: float, probes: Sequence[float], blocks: Blocks, device: str = "cpu"
) -> probe.Disturbance:
    """What disturbed an attempt; on CUDA also the event samples' spread and the processes there."""
    gpu = str(device).startswith("cuda")
    return probe.Disturbance(
        typical,
        tuple(probes),
        probe.is_bimodal(blocks.samples),
        waited=blocks.waited(),
        blocks=len(blocks.shares),
        short=blocks.short,
        gpu=gpu,
        spread=_relative_iqr(blocks.samples) if gpu else math.nan,
        neighbours=(probe.gpu_neighbours(device) or ()) if gpu else (),
    )


def _relative_iqr(samples: Sequence[float]) -> float:
    """IQR / median of ``samples`` (NaN for fewer than 4 or a zero median).

    Example:
        >>> _relative_iqr([1.0, 1.0, 2.0, 2.0])
        1.0
    """
    if len(samples) < 4:
        return math.nan
    q1, median, q3 = statistics.quantiles(samples, n=4, method="inclusive")
    return (q3 - q1) / median if median > 0 else math.nan


def _calls(config: MeasureConfig, call_s: float | None) -> int:
    """The measurement's calls: the first after the gate, the timer's, memory and RSS.

    The timer's are :func:`.timer.measured_calls`. The check's own calls and its reference are
    budgeted apart (:func:`check_plan`): never a user's length.
    """
    return (
        1
        + measured_calls(config.timer, call_s)
        + int(config.measure_memory)
        + int(config.measure_rss)
    )


def timed_attempts(
    call: Callable[[], object], device: str, config: MeasureConfig, first_s: float = 0.0
) -> _Timed:
    """Time ``call`` in probed blocks, re-timing descheduled ones; retry disturbed attempts.

    Probes run around the blocks and, for long attempts, between them.

    With ``config.probe`` a block that waited for a core more than ``schedstat.WAIT_LIMIT`` of its
    wall time is dropped and another timed in its place while the retry budget lasts
    (:func:`.timer.time_blocks`). An attempt is disturbed when too few undisturbed blocks were left
    when that budget ran out, when a probe is more than ``probe.SLOWDOWN_LIMIT`` x slower or faster
    than the sweep's typical probe (``config.probe_baseline_s``), or when its blocks are bimodal. Up
    to ``config.retries`` more attempts are made while the case's attempts took less than
    ``config.retry_budget_s`` in total (a machine busy for the whole sweep must not triple its
    length: long cases are probed between blocks instead) and the time budget allows; the least
    disturbed attempt is returned.
    """
    # measure() always sets it
    typical = config.probe_baseline_s if config.probe_baseline_s is not None else math.nan
    kept: tuple[Blocks, list[float], probe.Disturbance] | None = None
    kept_deviation = math.inf
    attempts, spent = 0, 0.0
    while True:
        attempts += 1
        blocks, probes, seconds = _attempt(call, device, config, first_s, spent)
        spent += seconds
        if not config.probe:
            return _Timed(
                blocks.samples,
                blocks.runs,
                probe.Disturbance(math.nan, (), False),
                attempts,
                math.nan,
                tuple(blocks.shares),
            )
        seen = _seen(typical, probes, blocks, device)
        score = seen.deviation
        if seen.disturbed:  # a signal other than the probe ranks the attempt as disturbed too
            score = max(score, probe.SLOWDOWN_LIMIT * 1.01)
        if kept is None or score < kept_deviation:
            kept, kept_deviation = (blocks, probes, seen), score
        if not seen.disturbed or attempts > config.retries:
            break
        # Another attempt must fit the budget next to what this case already spent (warm-up, gate,
        # first call).
        if (
            spent >= config.retry_budget_s
            or first_s * 4 + spent * (attempts + 1) / attempts > config.time_budget_s
        ):
            break
    blocks, probes, seen = kept
    return _Timed(
        blocks.samples, blocks.runs, seen, attempts, statistics.median(probes), tuple(blocks.shares)
    )


class _Attempt(NamedTuple):
    """One timing attempt at a case."""

    blocks: Blocks
    # the probes before, between and after its blocks (none without ``config.probe``)
    probes: list[float]
    seconds: float  # what its blocks took, the probes before and after not included


def _attempt(
    call: Callable[[], object], device: str, config: MeasureConfig, first_s: float, spent: float
) -> _Attempt:
    """Time ``call`` once in blocks.

    With ``config.probe``: probed before, between (long attempts) and after, descheduled blocks
    re-timed within the retry budget left after ``spent`` seconds.
    """
    probes: list[float] = []
    between = None
    if config.probe:
        probes.append(probe.probe_seconds(device))
        # this attempt's probes, between blocks
        between = functools.partial(_probe_into, probes, device)
    t0 = time.perf_counter()
    blocks = time_blocks(
        call,
        device,
        config.timer,
        between=between,
        wait_limit=schedstat.WAIT_LIMIT if config.probe else None,
        redo_s=max(0.0, config.retry_budget_s - spent),
        warm_s=first_s or None,
    )
    seconds = time.perf_counter() - t0
    if config.probe:
        probes.append(probe.probe_seconds(device))
    return _Attempt(blocks, probes, seconds)


_SLOW_MAX_LENGTH = 128  # interpreter-bound variants stop here by default (seconds per case)
# interpreter-bound variants get at least this many lengths: the shortest sets the fit's overhead
# floor, 4 remain to fit
_SLOW_MIN_LENGTHS = 5


def default_lengths(variant: Variant, lengths: Sequence[int]) -> list[int]:
    """The lengths a variant is swept over by default.

    Interpreter-bound variants (``SECONDS_PER_PAIR > 0``, i.e. ``loop``) keep the lengths up to
    ``_SLOW_MAX_LENGTH``; when that leaves fewer than ``_SLOW_MIN_LENGTHS`` (a grid starting at 64
    keeps only 64 and 128), halvings of the shortest are added (64 -> 32 -> 16 -> 8) so that the
    exponent fit (which treats the shortest length's value as the overhead floor) has 4 points
    above the floor. A grid with no length that short gives such a variant none.

    Example:
        >>> default_lengths(get_variant("loop"), [64, 128, 256, 512])
        [8, 16, 32, 64, 128]
    """
    if variant.SECONDS_PER_PAIR <= 0:
        return list(lengths)
    short = sorted({int(n) for n in lengths if n <= _SLOW_MAX_LENGTH})
    while short and len(short) < _SLOW_MIN_LENGTHS and short[0] >= 2:
        short.insert(0, short[0] // 2)
    return short
