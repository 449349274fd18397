"""The contract every attention variant follows.

Letters: B batch, H heads, Lq queries, Lk keys, D query/key head dim, Dv value head dim.

A variant is a callable ``variant(q, k, v, mask=None)`` with ``q (B, H, Lq, D)``,
``k (B, H, Lk, D)``, ``v (B, H, Lk, Dv)`` returning ``(B, H, Lq, Dv)``. The mask is boolean and
broadcastable to ``(B, H, Lq, Lk)``; True means "may attend" (the SDPA convention). Rows with no
allowed key return zeros in every exact variant.

Capabilities are declared, not asserted: ``SUPPORTED_DEVICES``, ``SUPPORTED_DTYPES``,
``SUPPORTED_MASKS`` and friends feed :meth:`Variant.not_supported_reasons`, which the test
matrix and the benchmark runner use to turn an impossible case into a skipped row with a reason.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, TypeVar

import torch

from attnbench import masks
from attnbench._checks import as_4d_mask, check_qkv
from attnbench.reference import reference_attention
from attnbench.spec import DTYPES, AttnSpec

ALL_DTYPES = frozenset(DTYPES)
FLOAT_DTYPES = frozenset({"float32", "float64"})
ALL_MASKS = frozenset(masks.MASK_KINDS)
KEY_PADDING_MASKS = frozenset({"none", "valid_lengths"})
T = TypeVar("T")
BACKWARD_FACTOR = 2.5
"""FLOPs of a backward pass relative to its forward (two matmuls per forward matmul, plus softmax)."""


@dataclass(frozen=True)
class Flops:
    """Analytic floating-point operation counts of one case."""

    useful: int  # work on (query, key) pairs the mask allows
    executed: int  # work the implementation actually performs (>= useful for masked dense)


class Variant(ABC):
    """Base class: validation, declared support, analytic cost model and the exact reference."""

    name: str = "variant"  # registry name; set by the registry on each instance it builds
    exact: ClassVar[bool] = True  # computes softmax(QK^T * scale) V exactly (up to rounding)
    time_exponent: ClassVar[float] = 2.0  # time ~ L ** time_exponent for self-attention
    memory_exponent: ClassVar[float] = 2.0  # extra memory ~ L ** memory_exponent
    source: ClassVar[str] = ""  # the seed or paper the variant comes from
    SUPPORTED_DEVICES: ClassVar[frozenset[str]] = frozenset({"cpu", "cuda"})
    SUPPORTED_DTYPES: ClassVar[frozenset[str]] = ALL_DTYPES
    SUPPORTED_MASKS: ClassVar[frozenset[str]] = ALL_MASKS
    SUPPORTS_CROSS: ClassVar[bool] = True  # Lq != Lk allowed
    SUPPORTS_BACKWARD: ClassVar[bool] = True  # differentiable with autograd
    SCORE_BUFFERS: ClassVar[float] = 2.0  # live (Lq, Lk) buffers per (B, H) at the forward peak
    SECONDS_PER_PAIR: ClassVar[float] = 0.0  # interpreter overhead per (query, key) pair
    EFFICIENCY: ClassVar[float] = 0.25  # assumed fraction of matmul peak, for time predictions only
    IN_DEFAULT_SWEEP: ClassVar[bool] = True  # False for variants whose set-up (compilation) costs seconds per shape
    PROVENANCE: ClassVar[bool] = False  # record which SDPA kernel ran (SDPA-backed variants)
    APPROX_ERROR_BOUND: ClassVar[float | None] = None  # approximate variants: allowed max |out - softmax attention|

    def __init__(self, scale: float | None = None) -> None:
        if scale is not None and (not isinstance(scale, (int, float)) or scale <= 0):
            raise ValueError(f"scale must be a positive number or None, got {scale!r}")
        self.scale = scale

    # ---- calling -------------------------------------------------------------------------
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Validate inputs, then run the variant. See the module docstring for shapes."""
        return self.forward(q, k, v, self.validate(q, k, v, mask))

    def validate(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None
    ) -> torch.Tensor | None:
        """Check the inputs against the contract and this variant's declared support.

        Benchmarks call this once while preparing and then time :meth:`forward` alone, so
        validation never sits in a timed region.

        Returns:
            The mask as rank 4 (or None), ready for :meth:`forward`.

        Raises:
            TypeError, ValueError: naming the offending argument or the unsupported feature.
        """
        check_qkv(q, k, v, mask, same_qk_dim=self._same_qk_dim())
        reasons = self._reasons(
            device=q.device.type,
            dtype=str(q.dtype).removeprefix("torch."),
            lq=q.shape[2],
            lk=k.shape[2],
            mask_kinds=self._tensor_mask_kinds(mask),
            dv=v.shape[-1],
            d=q.shape[-1],
        )
        if reasons:
            raise ValueError(f"{self.name} cannot run these inputs: " + "; ".join(reasons))
        return as_4d_mask(mask)

    def warm_up(self, call: Callable[[], T]) -> tuple[T, float]:
        """Make the first call of the timed closure, outside any timed region.

        The benchmark's first call goes through the very closure it then times (same grad mode,
        same inputs), so whatever a variant prepares on first use (compilation, cached masks) is
        prepared for exactly the calls that are timed; the runner checks the returned result.

        Returns:
            ``(what call returned, seconds of one-off preparation)``: 0.0 for variants that need none.
        """
        return call(), 0.0

    @abstractmethod
    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None
    ) -> torch.Tensor:
        """Compute attention on inputs already passed through :meth:`validate` (mask None or rank 4)."""

    def scale_for(self, head_dim: int) -> float:
        return 1.0 / math.sqrt(head_dim) if self.scale is None else float(self.scale)

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> torch.Tensor:
        """Ground truth (float64 by default) for exactly what this variant claims to compute.

        With ``dtype`` set to the inputs' dtype it is the plain implementation at the same
        precision, whose error scales the test tolerance.
        """
        return reference_attention(q, k, v, mask, scale=self.scale_for(q.shape[-1]), dtype=dtype)

    # ---- declared support ----------------------------------------------------------------
    def _same_qk_dim(self) -> bool:
        return True

    def _tensor_mask_kinds(self, mask: torch.Tensor | None) -> frozenset[str]:
        """Mask kinds a concrete tensor needs: any query-dependent mask needs general support."""
        if mask is None:
            return frozenset({"none"})
        if masks.is_key_padding(mask):
            return frozenset({"valid_lengths"})
        return frozenset({"causal", "sliding_window"})

    def _reasons(
        self,
        *,
        device: str,
        dtype: str,
        lq: int,
        lk: int,
        mask_kinds: frozenset[str],
        d: int,
        dv: int,
    ) -> list[str]:
        reasons = []
        if device not in self.SUPPORTED_DEVICES:
            reasons.append(f"device {device!r} not supported (supports {sorted(self.SUPPORTED_DEVICES)})")
        if dtype not in self.SUPPORTED_DTYPES:
            reasons.append(f"dtype {dtype} not supported (supports {sorted(self.SUPPORTED_DTYPES)})")
        if not mask_kinds <= self.SUPPORTED_MASKS:
            reasons.append(
                f"mask {'/'.join(sorted(mask_kinds))} not supported "
                f"(supports {sorted(self.SUPPORTED_MASKS)})"
            )
        if lq != lk and not self.SUPPORTS_CROSS:
            reasons.append(f"cross-attention (Lq={lq} != Lk={lk}) not supported")
        return reasons + self.extra_reasons(device=device, dtype=dtype, lq=lq, lk=lk, d=d, dv=dv)

    def extra_reasons(self, *, device: str, dtype: str, lq: int, lk: int, d: int, dv: int) -> list[str]:
        """Variant-specific limits beyond the declared sets; override where needed."""
        return []

    def not_supported_reasons(self, spec: AttnSpec) -> list[str]:
        """Readable reasons why ``spec`` cannot run here; empty when it can.

        Example:
            >>> from attnbench import get_variant
            >>> get_variant("sdpa_efficient").not_supported_reasons(AttnSpec(device="cpu"))
            ['SDPA backend efficient needs CUDA (this case is on cpu)']
        """
        reasons = self._reasons(
            device=spec.device_type,
            dtype=spec.dtype,
            lq=spec.lq,
            lk=spec.lk,
            mask_kinds=frozenset({spec.mask}),
            d=spec.head_dim,
            dv=spec.dv,
        )
        if spec.mode == "backward" and not self.SUPPORTS_BACKWARD:
            reasons.append("backward pass not supported")
        if spec.device_type == "cuda" and not torch.cuda.is_available():
            reasons.append("CUDA is not available on this machine")
        return reasons

    # ---- analytic cost model -------------------------------------------------------------
    def executed_pairs(self, spec: AttnSpec) -> int:
        """(query, key) pairs per (batch, head) whose score the implementation computes."""
        return spec.lq * spec.lk

    def useful_pairs(self, spec: AttnSpec) -> int:
        """(query, key) pairs per (batch, head) that contribute to the output."""
        return spec.allowed_pairs()

    def flops(self, spec: AttnSpec) -> Flops:
        """Score (2D) plus weighted sum (2Dv) per pair; backward adds 2.5x the forward."""
        per_pair = 2 * (spec.head_dim + spec.dv) * spec.batch * spec.heads
        factor = 1.0 + (BACKWARD_FACTOR if spec.mode == "backward" else 0.0)
        useful = min(self.useful_pairs(spec), self.executed_pairs(spec))
        return Flops(
            useful=int(per_pair * useful * factor),
            executed=int(per_pair * self.executed_pairs(spec) * factor),
        )

    def scratch_elements(self, spec: AttnSpec) -> float:
        """Elements of temporary storage live at the forward peak, beyond inputs and output."""
        return self.SCORE_BUFFERS * spec.batch * spec.heads * spec.lq * spec.lk

    def predicted_peak_bytes(self, spec: AttnSpec) -> int:
        """Predicted peak tensor bytes above the inputs (scratch + output, x3 for backward).

        The backward factor covers saved activations, their gradients and the input gradients.
        """
        fwd = self.scratch_elements(spec) * spec.elem_bytes + spec.output_bytes
        if spec.mode == "backward":
            return int(3 * fwd + spec.input_bytes)
        return int(fwd)

    def describe(self) -> dict[str, object]:
        """Declared properties as a flat dict (used by ``attnbench list`` and the README table)."""
        return {
            "name": self.name,
            "exact": self.exact,
            "time": f"O(L^{self.time_exponent:g})",
            "memory": f"O(L^{self.memory_exponent:g})",
            "devices": ",".join(sorted(self.SUPPORTED_DEVICES)),
            "dtypes": ",".join(sorted(self.SUPPORTED_DTYPES)),
            "masks": ",".join(m for m in masks.MASK_KINDS if m in self.SUPPORTED_MASKS),
            "cross": self.SUPPORTS_CROSS,
            "source": self.source,
        }
