"""Decide before running whether a case fits the memory and time budgets.

Predictions come from the variant's analytic model (:meth:`Variant.predicted_peak_bytes`,
:meth:`Variant.flops`, ``SECONDS_PER_PAIR``), so a case that would exhaust memory or run for
minutes becomes a skipped row with a reason instead of an OOM kill or a stalled sweep.
"""

from __future__ import annotations

import psutil
import torch

from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant


def free_bytes(device: str) -> int:
    """Available RAM on CPU, free device memory on CUDA."""
    if device.startswith("cuda"):
        return torch.cuda.mem_get_info(torch.device(device))[0]
    return psutil.virtual_memory().available


def predicted_bytes(variant: Variant, spec: AttnSpec) -> int:
    """Inputs plus the variant's predicted peak above them."""
    return spec.input_bytes + variant.predicted_peak_bytes(spec)


def predicted_seconds(variant: Variant, spec: AttnSpec, peak_flops: float) -> float:
    """One call's predicted duration: FLOPs at the variant's assumed fraction of peak + overhead."""
    compute = variant.flops(spec).executed / (peak_flops * variant.EFFICIENCY)
    overhead = variant.SECONDS_PER_PAIR * variant.executed_pairs(spec) * spec.batch * spec.heads
    if spec.mode == "backward":
        overhead *= 3.5
    return compute + overhead


def guard_reasons(
    variant: Variant,
    spec: AttnSpec,
    *,
    memory_budget: float,
    time_budget: float,
    peak_flops: float,
    calls: int,
) -> list[str]:
    """Reasons to skip ``spec`` under the budgets; empty when it should run.

    Args:
        memory_budget: bytes the case may use (inputs + predicted peak).
        time_budget: seconds the whole case may take.
        peak_flops: this machine's matmul FLOP/s.
        calls: how many calls the case makes at minimum (warm-up, check, timing, memory).
    """
    reasons = []
    need = predicted_bytes(variant, spec)
    if need > memory_budget:
        reasons.append(f"predicted peak {need / 2**20:,.0f} MiB exceeds the memory budget {memory_budget / 2**20:,.0f} MiB")
    seconds = predicted_seconds(variant, spec, peak_flops) * calls
    if seconds > time_budget:
        reasons.append(f"predicted {seconds:,.1f} s for {calls} calls exceeds the time budget {time_budget:g} s")
    return reasons
