"""The contract every attention variant follows: its call, its declared support, its cost model.

``variant(q, k, v, mask=None)`` maps ``q (B, H, Lq, D)``, ``k (B, Hkv, Lk, D)``,
``v (B, Hkv, Lk, Dv)`` to ``(B, H, Lq, Dv)``; ``Hkv < H`` is grouped-query attention (query head h
reads key/value head ``h // G``, G = H // Hkv), run only by a variant that declares how
(:class:`GqaMode`). The mask is None, a bool tensor broadcastable to ``(B, H, Lq, Lk)`` (True = may
attend; causal is top-left aligned) or a :class:`~attnbench.mask_mods.MaskMod`, which
:meth:`Variant.validate` evaluates densely while the runner prepares (never timed; the guard counts
the bytes) unless :meth:`Variant.takes_mask_mod`. Rows with no allowed key are zeros.

Support is declared, not asserted (``SUPPORTED_DEVICES``, ...): tensors and a planned
:class:`AttnSpec` reduce to one :class:`~attnbench.capability.CallInfo` judged by
:meth:`Variant.reasons_for`, so ``validate`` raises exactly what ``not_supported_reasons`` reports,
and a sweep records an impossible case as skipped with the reason. FLOPs: :class:`Flops`.
"""

from __future__ import annotations

import enum
import math
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import torch

from attnbench import mask_mods, masks
from attnbench._checks import (
    as_4d_mask,
    check_finite,
    check_qkv,
    check_scale,
    check_score_range,
    cuda_present,
)
from attnbench.capability import CallInfo
from attnbench.reference import blockwise_reference_attention
from attnbench.spec import DTYPES, AttnSpec, MaskForm

__all__ = [
    "ALL_DTYPES",
    "FLOAT_DTYPES",
    "ALL_MASKS",
    "KEY_PADDING_MASKS",
    "T",
    "EAGER_BACKWARD",
    "CONSTANT_OPERAND_BACKWARD",
    "GqaMode",
    "GQA_MODES",
    "RECOMPUTE_BACKWARD",
    "Flops",
    "Contraction",
    "dense_mask",
    "declared_attributes",
    "Variant",
]

ALL_DTYPES = frozenset(DTYPES)
FLOAT_DTYPES = frozenset({"float32", "float64"})
ALL_MASKS = frozenset(masks.MASK_KINDS)
KEY_PADDING_MASKS = frozenset({"none", "valid_lengths"})
T = TypeVar("T")
EAGER_BACKWARD = 2.0
"""Backward FLOPs per forward FLOP of a matmul whose operands both need a gradient (eager)."""
CONSTANT_OPERAND_BACKWARD = 1.0
"""Backward FLOPs per forward FLOP of a matmul with one constant operand (a fixed weight)."""


class GqaMode(enum.StrEnum):
    """How a variant runs grouped-query attention (``SUPPORTS_GQA``; "" where it cannot)."""

    NATIVE = "native"
    GROUPED = "grouped"
    REPEAT = "repeat"


GQA_MODES: dict[str, str] = {
    GqaMode.NATIVE: "the kernel reads each key/value head for its G query heads (no copy)",
    GqaMode.GROUPED: "grouped matmul: q viewed as (B, Hkv, G*Lq, D) against k (B, Hkv, Lk, D) "
    "(no copy)",
    GqaMode.REPEAT: "k and v repeated to H heads first (copies of B*H*Lk*(D+Dv) elements, "
    "counted in the peak)",
}
"""What each :class:`GqaMode` does."""
RECOMPUTE_BACKWARD = 3.0
"""Backward FLOPs per forward FLOP of the scores ``Q K^T`` in a fused kernel: recompute, dQ, dK."""


@dataclass(frozen=True)
class Flops:
    """Analytic floating-point operation counts of one case, as every cost model defines them.

    Executed FLOPs are 2 x the multiply-accumulates of every *contraction* the implementation
    performs (matmul, bmm, dot, matrix-vector products, the fused kernels' internal Q K^T and P V)
    on every pair it computes, masked or not; elementwise work (exp, softmax, tanh, scaling,
    masking) and plain reductions (sum, max) are not counted. That is exactly what
    ``torch.utils.flop_counter.FlopCounterMode`` counts, so the declared count is checked against
    it. Backward: eager autograd runs two matmuls of the forward's size per matmul whose operands
    both need a gradient (:data:`EAGER_BACKWARD`), one when an operand is a constant weight
    (:data:`CONSTANT_OPERAND_BACKWARD`); fused kernels that recompute the scores add one more
    ``Q K^T`` (2.5 overall when Dv == D, the counter's formula). Contractions inside a kernel the
    counter cannot see (CPU flash SDPA, CPU FlexAttention, the Python loop's scalar dots) are
    declared ``visible=False`` and checked against a hand count instead.
    """

    useful: int  # work on (query, key) pairs the mask allows
    executed: int  # work the implementation actually performs (>= useful for masked dense)


@dataclass(frozen=True)
class Contraction:
    """One contraction (matmul-like product) of a variant's forward pass, for the cost model."""

    name: str  # what it computes, e.g. "Q K^T"
    executed: int  # forward FLOPs performed (2 x multiply-accumulates), masked pairs included
    useful: int  # forward FLOPs on pairs the mask allows (== executed for mask-free work)
    # backward FLOPs per forward FLOP (EAGER_BACKWARD, CONSTANT_OPERAND_BACKWARD, ...)
    backward: float
    visible: bool = True  # FlopCounterMode sees it (False inside kernels it has no formula for)

    def total(self, backward: bool, useful: bool = False) -> int:
        """Forward FLOPs, plus the backward pass's when ``backward``."""
        base = self.useful if useful else self.executed
        return int(round(base * (1.0 + (self.backward if backward else 0.0))))


def dense_mask(
    mask: torch.Tensor | mask_mods.MaskMod | None, q: torch.Tensor, k: torch.Tensor
) -> torch.Tensor | None:
    """The mask as a bool tensor for ``q (B, H, Lq, D)`` and ``k (B, H, Lk, D)``."""
    if isinstance(mask, mask_mods.MaskMod):
        return mask_mods.dense(mask, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
    return mask


def declared_attributes() -> tuple[str, ...]:
    """Names of every class-level declaration of :class:`Variant` (its ``ClassVar`` annotations)."""
    return tuple(n for n, a in Variant.__annotations__.items() if str(a).startswith("ClassVar"))


class Variant(ABC):
    """Base class: validation, declared support, analytic cost model and the exact reference."""

    name: str = "variant"  # registry name; set by the registry on each instance it builds
    exact: ClassVar[bool] = True  # computes softmax(QK^T * scale) V exactly (up to rounding)
    # over every pair the mask allows (False: another function, e.g. a band)
    SOFTMAX_ATTENTION: ClassVar[bool] = True
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
    # False for variants whose set-up (compilation) costs seconds per shape
    IN_DEFAULT_SWEEP: ClassVar[bool] = True
    VARIANT_OPTIONS: dict[str, dict[str, dict[str, Any]]] = {}  # noqa: RUF012
    """Constructor options that take another variant: option -> {variant name: its options}, read
    from the class. :func:`attnbench.registry.get_variant` builds a registered name given there
    (``compiled_chunked``'s ``base="chunked"``), so no variant looks another up itself."""
    PROVENANCE: ClassVar[bool] = False  # record which SDPA kernel ran (SDPA-backed variants)
    # backward recomputes Q K^T (fused kernels): factor 2.5, not 2.0
    RECOMPUTES_SCORES: ClassVar[bool] = False
    # aten ops FlopCounterMode has no formula for
    OPAQUE_KERNELS: ClassVar[frozenset[str]] = frozenset()
    REJECTS_NONFINITE: ClassVar[bool] = True  # validate() rejects NaN/inf in q, k, v (see validate)
    # approximate variants: allowed mean |out - softmax attention|
    APPROX_ERROR_BOUND: ClassVar[float | None] = None
    # forward takes a MaskMod predicate itself (see takes_mask_mod)
    MASK_MODS: ClassVar[bool] = False
    SUPPORTS_GQA: ClassVar[str] = ""  # how Hkv < H is run: a GqaMode, "" = not at all

    def __init__(self, scale: float | None = None) -> None:
        self.scale = check_scale(scale)

    # ---- calling -------------------------------------------------------------------------
    def __call__(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None = None,
    ) -> torch.Tensor:
        """Validate inputs, then run the variant. See the module docstring for shapes."""
        return self.forward(q, k, v, self.validate(q, k, v, mask))

    def validate(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None = None,
    ) -> torch.Tensor | mask_mods.MaskMod | None:
        """Check the inputs against the contract and this variant's declared support.

        Benchmarks call this once while preparing and then time :meth:`forward` alone, so
        validation never sits in a timed region. Order: types, ranks and shapes
        (:func:`check_qkv`); then exactly the reasons :meth:`reasons_for` gives for the call's
        :class:`CallInfo` (the same ones :meth:`not_supported_reasons` gives for the equivalent
        spec); then the values: non-finite q/k/v are rejected (see :func:`check_finite`) and so
        is a scale that could overflow the scores.

        Returns:
            The mask ready for :meth:`forward`: the predicate itself when :meth:`takes_mask_mod`
            says so, else a bool tensor of rank 4 with its key axis at length Lk (a view; a
            predicate is evaluated densely here), or None.

        Raises:
            TypeError, ValueError: naming the offending argument or the unsupported feature.
        """
        mod = mask if isinstance(mask, mask_mods.MaskMod) else None
        check_qkv(q, k, v, None if mod is not None else mask, same_qk_dim=self._same_qk_dim())
        if mod is not None:
            mod.check_fits(q.shape[0], q.shape[2])
        reasons = self.reasons_for(CallInfo.from_tensors(q, k, v, mask))
        if reasons:
            raise ValueError(f"{self.name} cannot run these inputs: " + "; ".join(reasons))
        if self.REJECTS_NONFINITE:
            check_finite(q=q, k=k, v=v)
        self.check_values(q, k, v)
        if mod is not None:
            if self.takes_mask_mod(mod):
                return mod
            mask = mask_mods.dense(mod, q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        mask4 = as_4d_mask(mask)
        # A view with the key axis at full length: blockwise variants index keys in the mask.
        return None if mask4 is None else mask4.expand(*mask4.shape[:3], k.shape[2])

    def takes_mask_mod(self, mod: mask_mods.MaskMod | None) -> bool:
        """Whether :meth:`forward` takes this predicate itself (else the dense bool tensor)."""
        return self.MASK_MODS and mod is not None

    def mask_form(self, spec: AttnSpec) -> MaskForm:
        """``"mod"`` when the runner hands this variant the spec's predicate, else ``"dense"``."""
        return MaskForm.MOD if self.takes_mask_mod(spec.mask_mod(device="cpu")) else MaskForm.DENSE

    def mask_bytes(self, spec: AttnSpec) -> int:
        """Bytes of the mask the runner builds here: 0 for a predicate, else the dense tensor's."""
        return 0 if self.mask_form(spec) == MaskForm.MOD else spec.mask_bytes

    def check_values(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Value checks beyond finiteness; by default, that ``scale * q . k`` cannot overflow."""
        check_score_range(q, k, self.scale_for(q.shape[-1]))

    def warm_up(self, call: Callable[[], T]) -> tuple[T, float]:
        """Make the first call of the timed closure, outside any timed region.

        The benchmark's first call goes through the very closure it then times (same grad mode,
        same inputs), so whatever a variant prepares on first use (compilation, cached masks) is
        prepared for exactly the calls that are timed; the runner checks the returned result.

        Returns:
            ``(what call returned, seconds of one-off preparation)``, 0.0 where nothing is prepared.
        """
        return call(), 0.0

    @abstractmethod
    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None,
    ) -> torch.Tensor:
        """Attention on inputs :meth:`validate` passed (mask None, rank 4 or a predicate)."""

    def scale_for(self, head_dim: int) -> float:
        return 1.0 / math.sqrt(head_dim) if self.scale is None else float(self.scale)

    def reference(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> torch.Tensor:
        """Ground truth (float64 by default) for exactly what this variant claims to compute.

        With ``dtype`` set to the inputs' dtype it is the plain implementation at the same
        precision, whose error scales the test tolerance. Computed blockwise
        (:func:`~attnbench.reference.blockwise_reference_attention`: O(L * tile) memory, a
        predicate evaluated per tile), so the gate can check any length the machine can time.
        """
        return blockwise_reference_attention(
            q, k, v, mask, scale=self.scale_for(q.shape[-1]), dtype=dtype
        )

    def reference_is_blockwise(self) -> bool:
        """Whether :meth:`reference` runs in O(L * tile) memory (the default one); else dense.

        The gate sizes a slice's reference by this
        (:func:`attnbench.measure.gate.slice_reference_bytes`).
        """
        return type(self).reference is Variant.reference

    # ---- declared support ----------------------------------------------------------------
    def _same_qk_dim(self) -> bool:
        return True

    def reasons_for(self, call: CallInfo) -> list[str]:
        """Readable reasons why ``call`` cannot run here; empty when it can.

        The one capability rule: :meth:`validate` (tensors) and :meth:`not_supported_reasons`
        (specs) both come here.
        """
        reasons = []
        if call.device not in self.SUPPORTED_DEVICES:
            if len(self.SUPPORTED_DEVICES) == 1 and "cuda" in self.SUPPORTED_DEVICES:
                reasons.append(f"{self.name} needs CUDA (this case is on {call.device})")
            else:
                reasons.append(
                    f"device {call.device!r} not supported "
                    f"(supports {sorted(self.SUPPORTED_DEVICES)})"
                )
        if call.dtype not in self.SUPPORTED_DTYPES:
            reasons.append(
                f"dtype {call.dtype} not supported (supports {sorted(self.SUPPORTED_DTYPES)})"
            )
        if not call.mask_kinds <= self.SUPPORTED_MASKS:
            reasons.append(
                f"mask {'/'.join(sorted(call.mask_kinds))} not supported "
                f"(supports {sorted(self.SUPPORTED_MASKS)})"
            )
        if call.lq != call.lk and not self.SUPPORTS_CROSS:
            reasons.append(f"cross-attention (Lq={call.lq} != Lk={call.lk}) not supported")
        if call.backward and not self.SUPPORTS_BACKWARD:
            reasons.append("backward pass not supported")
        if call.hkv != call.heads and not self.gqa_mode(call):
            reasons.append(
                f"grouped-query attention (Hkv={call.hkv} key/value heads for H={call.heads}) "
                "not supported"
            )
        if call.device == "cuda" and not cuda_present():
            reasons.append("CUDA is not available on this machine")
        return reasons + self.extra_reasons(call)

    def gqa_mode(self, call: CallInfo) -> str:
        """How this call's grouped-query attention runs (a :class:`GqaMode`); "" when it cannot.

        ``SUPPORTS_GQA`` by default; a variant whose answer depends on the call (a backend, a
        device) overrides this, and the cost model follows what it returns.
        """
        return self.SUPPORTS_GQA

    def extra_reasons(self, call: CallInfo) -> list[str]:
        """Variant-specific limits beyond the declared sets; override where needed."""
        return []

    def not_supported_reasons(self, spec: AttnSpec) -> list[str]:
        """Readable reasons why ``spec`` cannot run here; empty when it can.

        Example:
            >>> from attnbench import get_variant
            >>> get_variant("sdpa_efficient").not_supported_reasons(AttnSpec(device="cpu"))
            ['sdpa_efficient needs CUDA (this case is on cpu)']

        Raises:
            TypeError: ``spec`` is not an :class:`AttnSpec`.
        """
        if not isinstance(spec, AttnSpec):
            raise TypeError(f"spec must be an AttnSpec, got {type(spec).__name__} {spec!r:.60}")
        return self.reasons_for(CallInfo.from_spec(spec))

    # ---- analytic cost model -------------------------------------------------------------
    def executed_pairs(self, spec: AttnSpec) -> int:
        """(query, key) pairs per (batch, head) whose score the implementation computes."""
        return spec.lq * spec.lk

    def useful_pairs(self, spec: AttnSpec) -> int:
        """(query, key) pairs per (batch, head) that contribute to the output."""
        return spec.allowed_pairs()

    def scores_visible(self, spec: AttnSpec) -> bool:
        """Whether FlopCounterMode sees Q K^T and P V (False inside opaque kernels)."""
        return True

    def contractions(self, spec: AttnSpec) -> list[Contraction]:
        """Forward contractions; by default ``Q K^T`` (2D) and ``P V`` (2Dv) per computed pair."""
        bh = spec.batch * spec.heads
        executed = self.executed_pairs(spec)
        useful = min(self.useful_pairs(spec), executed)
        visible = self.scores_visible(spec)
        scores_backward = RECOMPUTE_BACKWARD if self.RECOMPUTES_SCORES else EAGER_BACKWARD
        return [
            Contraction(
                "Q K^T",
                2 * bh * spec.head_dim * executed,
                2 * bh * spec.head_dim * useful,
                scores_backward,
                visible,
            ),
            Contraction(
                "P V",
                2 * bh * spec.dv * executed,
                2 * bh * spec.dv * useful,
                EAGER_BACKWARD,
                visible,
            ),
        ]

    def flops(self, spec: AttnSpec) -> Flops:
        """Executed and useful FLOPs of the case (forward, plus backward in "backward" mode).

        :class:`Flops` says what is counted. O(1) work in the sequence length.
        """
        backward = spec.mode == "backward"
        parts = self.contractions(spec)
        return Flops(
            useful=sum(c.total(backward, useful=True) for c in parts),
            executed=sum(c.total(backward) for c in parts),
        )

    def executed_flops_unknown(self, spec: AttnSpec) -> str:
        """Why ``flops(spec).executed`` is only an upper bound here ("" when it is the count).

        A kernel that skips tiles at sizes this suite does not know executes an unknown part of the
        pairs; its rate is then not reported (the runner records this reason instead).
        """
        return ""

    def counter_visible_flops(self, spec: AttnSpec) -> int:
        """The part of ``flops(spec).executed`` that FlopCounterMode can see."""
        backward = spec.mode == "backward"
        return sum(c.total(backward) for c in self.contractions(spec) if c.visible)

    def backward_factor(self, spec: AttnSpec) -> float:
        """Backward FLOPs per forward FLOP (2.0 eager autograd, 2.5 fused kernels recomputing)."""
        fwd = self.flops(spec.replace(mode="forward")).executed
        return (self.flops(spec.replace(mode="backward")).executed - fwd) / fwd if fwd else 0.0

    def parameter_bytes(self, spec: AttnSpec) -> int:
        """Bytes of the variant's own weights (and any transient copies made to build them)."""
        return 0

    def scratch_elements(self, spec: AttnSpec) -> float:
        """Elements of temporary storage live at the forward peak, beyond inputs and output."""
        return self.SCORE_BUFFERS * spec.batch * spec.heads * spec.lq * spec.lk

    def kv_copy_elements(self, spec: AttnSpec) -> int:
        """Elements of the k and v copies a "repeat" GQA makes, ``B*H*Lk*(D+Dv)``; else 0."""
        if spec.hkv == spec.heads or self.gqa_mode(CallInfo.from_spec(spec)) != GqaMode.REPEAT:
            return 0
        return spec.batch * spec.heads * spec.lk * (spec.head_dim + spec.dv)

    def predicted_peak_bytes(self, spec: AttnSpec) -> int:
        """Predicted peak tensor bytes above the inputs: scratch, k/v copies, output, weights.

        Backward is three times the forward's (saved activations, their gradients and the input
        gradients) plus the inputs; the variant's own parameters (:meth:`parameter_bytes`) are added
        once. O(1) work.
        """
        fwd = (
            self.scratch_elements(spec) + self.kv_copy_elements(spec)
        ) * spec.elem_bytes + spec.output_bytes
        if spec.mode == "backward":
            fwd = 3 * fwd + spec.input_bytes
        return int(fwd + self.parameter_bytes(spec))

    def describe(self) -> dict[str, object]:
        """Declared properties as a flat dict (``attnbench list`` and the docs' variants page)."""
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
