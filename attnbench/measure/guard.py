"""Decide before running whether a case fits the memory and time budgets.

Everything a case allocates is counted before it is allocated: the inputs, the mask, ``grad_out``
(backward), the variant's predicted peak above the inputs (:meth:`Variant.predicted_peak_bytes`,
its parameters included) and the gate's float64 reference of one (batch, head) slice. Time is the
same case's measured time at the sweep's previous length scaled by the variant's declared exponent
(:func:`extrapolated_seconds`), else the variant's analytic model (:meth:`Variant.flops`,
``SECONDS_PER_PAIR``, the matmul peak of :mod:`.peak`), for the measurement's calls alone: the
check's own budget decides how many slices it checks (:func:`attnbench.measure.runner.check_plan`,
with :func:`reference_seconds`), never whether the case runs. A case over budget becomes a skipped
row with the reason instead of an OOM kill or a stalled sweep.

The cost model runs inside the runner's ``try`` (an exception is a row, not a dead sweep) and must
not do O(L^2) work.
"""

from __future__ import annotations

import math

import psutil
import torch

from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant

__all__ = [
    "free_bytes",
    "case_bytes",
    "predicted_bytes",
    "predicted_seconds",
    "extrapolated_seconds",
    "reference_seconds",
    "guard_reasons",
]

_REFERENCE_EFFICIENCY = 0.1
"""Assumed share of the float32 matmul peak the float64 einsum reference reaches (time only)."""


def free_bytes(device: str) -> int:
    """Available RAM on CPU, free device memory on CUDA."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def case_bytes(spec: AttnSpec, variant: Variant | None = None) -> int:
    """What the runner allocates before the variant runs: q, k, v, the mask, backward ``grad_out``.

    The mask is the dense bool tensor the runner builds for ``variant`` (:meth:`Variant.mask_bytes`:
    nothing for a variant that takes the predicate); without a variant, the dense tensor's bytes.
    """
    grad_out = spec.output_bytes if spec.mode == "backward" else 0
    mask = spec.mask_bytes if variant is None else variant.mask_bytes(spec)
    return spec.input_bytes + mask + grad_out


def _reference_mask_bytes(spec: AttnSpec, reference_bytes: float) -> int:
    """The dense mask the gate's reference evaluates from a predicate (only when it checks)."""
    return spec.mask_bytes if reference_bytes > 0 else 0


def predicted_bytes(variant: Variant, spec: AttnSpec, reference_bytes: float = 0.0) -> int:
    """Inputs, mask, ``grad_out``, the variant's predicted peak (weights too), the reference's.

    When the gate checks a variant that took the predicate, the reference's dense mask counts too.
    """
    reference_mask = (
        _reference_mask_bytes(spec, reference_bytes) if variant.mask_bytes(spec) == 0 else 0
    )
    return int(
        case_bytes(spec, variant)
        + variant.predicted_peak_bytes(spec)
        + reference_bytes
        + reference_mask
    )


def predicted_seconds(variant: Variant, spec: AttnSpec, peak_flops: float) -> float:
    """One call's predicted duration: FLOPs at the variant's assumed fraction of peak + overhead."""
    compute = variant.flops(spec).executed / (peak_flops * variant.EFFICIENCY)
    overhead = variant.SECONDS_PER_PAIR * variant.executed_pairs(spec) * spec.batch * spec.heads
    if spec.mode == "backward":
        overhead *= 3.5
    return compute + overhead


def extrapolated_seconds(
    variant: Variant, spec: AttnSpec, measured_len: int, measured_s: float
) -> float | None:
    """One call's seconds at ``spec``, from the same case measured here at a shorter length.

    ``measured_s * (L / measured_len) ** variant.time_exponent``: the variant's declared scaling
    from a time this machine took, under the load it has now. Unlike :func:`predicted_seconds` it
    needs no assumed efficiency or matmul peak (a peak measured on a busy machine makes every
    prediction too slow, and skips lengths the sweep could measure). None when it does not apply:
    cross-attention (``seq_len_k`` set), a measured time that is not a positive number, or a
    ``measured_len`` that is not shorter.

    Example:
        >>> from attnbench.registry import get_variant
        >>> extrapolated_seconds(get_variant("batched"), AttnSpec(seq_len=2048), 1024, 0.1)
        0.4
    """
    if spec.seq_len_k is not None or not 0 < measured_len < spec.seq_len:
        return None
    if not (isinstance(measured_s, float) and measured_s > 0 and math.isfinite(measured_s)):
        return None
    return measured_s * (spec.seq_len / measured_len) ** variant.time_exponent


def reference_seconds(variant: Variant, spec: AttnSpec, slices: int, peak_flops: float) -> float:
    """Predicted seconds of the correctness gate's float64 and plain references.

    They run on ``slices`` slices, once: every checked call of a case is compared with the same
    truth (:class:`~attnbench.measure.gate.Reference`).
    """
    if slices <= 0:
        return 0.0
    # dense einsum evaluation of one (b, h)
    per_slice = 2 * spec.lq * spec.lk * (spec.head_dim + spec.dv)
    # float64 truth, plain same precision, exact softmax (approximate variants)
    passes = 2 + int(not variant.exact)
    factor = 3.5 if spec.mode == "backward" else 1.0
    return slices * per_slice * passes * factor / (peak_flops * _REFERENCE_EFFICIENCY)


def guard_reasons(
    variant: Variant,
    spec: AttnSpec,
    *,
    memory_budget: float,
    time_budget: float,
    peak_flops: float,
    calls: int,
    reference_bytes: float = 0.0,
    call_s: float | None = None,
) -> list[str]:
    """Reasons to skip ``spec`` under the budgets; empty when it should run.

    Args:
        memory_budget: bytes the case may use (everything :func:`predicted_bytes` counts).
        time_budget: seconds the case's measurement calls may take (the correctness check has its
            own budget).
        peak_flops: this machine's matmul FLOP/s.
        calls: how many calls the measurement makes at minimum (warm-up, timing, memory).
        reference_bytes: the correctness gate's reference memory (one slice, float64 and plain).
        call_s: one call's seconds extrapolated from a measurement (:func:`extrapolated_seconds`);
            None: the cost model's :func:`predicted_seconds`.
    """
    reasons = []
    peak = variant.predicted_peak_bytes(spec)
    need = predicted_bytes(variant, spec, reference_bytes)
    if need > memory_budget:
        mib = 2**20
        reasons.append(
            f"predicted peak {need / mib:,.0f} MiB "
            f"(inputs+mask {case_bytes(spec, variant) / mib:,.0f}, variant {peak / mib:,.0f}, "
            f"reference {reference_bytes / mib:,.0f}) "
            f"exceeds the memory budget {memory_budget / mib:,.0f} MiB"
        )
    per_call = predicted_seconds(variant, spec, peak_flops) if call_s is None else call_s
    seconds = per_call * calls
    if seconds > time_budget:
        source = "cost model" if call_s is None else "extrapolated from the shorter length"
        reasons.append(
            f"predicted {seconds:,.1f} s ({source}) for {calls} calls "
            f"exceeds the time budget {time_budget:g} s (attnbench run --time-budget "
            f"{math.ceil(1.5 * seconds)} measures it)"
        )
    return reasons
