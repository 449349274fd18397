"""Which SDPA kernel actually ran: read from the profiler's operator and kernel names.

Forcing a backend is not enough to know what executed: ``auto`` picks one per call, and on CUDA a
mask or an unsupported dtype silently sends a call to the O(L^2)-memory math path. One profiled
call tells the truth; the report lists it beside the backend that was asked for.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch.profiler import ProfilerActivity, profile

from attnbench.measure.memory import quiet_stderr

__all__ = ["backends_in", "sdpa_backends"]

# (substring of an operator or CUDA kernel name, backend label); the first match wins.
_SIGNATURES: tuple[tuple[str, str], ...] = (
    ("_scaled_dot_product_flash_attention_for_cpu", "flash"),
    ("_scaled_dot_product_flash_attention", "flash"),
    ("_scaled_dot_product_efficient_attention", "efficient"),
    ("_scaled_dot_product_cudnn_attention", "cudnn"),
    ("_scaled_dot_product_fused_attention_overrideable", "overrideable"),
    ("_scaled_dot_product_attention_math", "math"),
    ("flash_fwd", "flash"),
    ("fmha_cutlass", "efficient"),
    ("cudnn", "cudnn"),
)


def backends_in(names: list[str]) -> list[str]:
    """Backend labels found in a list of operator/kernel names, in first-seen order."""
    found: list[str] = []
    for name in names:
        for needle, label in _SIGNATURES:
            if needle in name:
                if label not in found:
                    found.append(label)
                break
    return found


def sdpa_backends(fn: Callable[[], object], device: str) -> list[str]:
    """Profile one call of ``fn`` and return the SDPA backends that executed (may be empty)."""
    activities = [ProfilerActivity.CPU] + (
        [ProfilerActivity.CUDA] if device.startswith("cuda") else []
    )
    with quiet_stderr(), profile(activities=activities) as prof:
        fn()
        if device.startswith("cuda"):
            torch.cuda.synchronize()
    return backends_in([e.key for e in prof.key_averages()])
