"""The correctness gate: is what the timed closure returned right, on every call that is checked?

A result passes when it keeps the call contract (shape, dtype, device, layout of the inputs) and its
max error against the float64 reference of what the variant claims to compute is at most ``FACTOR``
times the plain same-precision implementation's error plus a per-dtype floor; NaN never passes. The
checked result is the timed closure's own return value, so no other code path can pass for it.
:class:`Reference` computes the truth of the checked (batch, head) slices once (all when affordable,
else a seeded sample holding the first and the last), so several calls of a case cost comparisons;
:func:`fingerprint` shows a variant that writes into its inputs. Grouped-query backward checks
whole groups (a shared head's dk, dv sum over its G query heads); an approximate variant is checked
against its own kernel's dense evaluation and, with ``APPROX_ERROR_BOUND``, against softmax.

Letters: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq queries, Lk keys, D and Dv
head dims.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnbench import mask_mods
from attnbench.reference import TILE_ELEMENTS, blockwise_reference_attention
from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant

__all__ = [
    "FACTOR",
    "FLOORS",
    "REFERENCE_BUFFERS",
    "tolerance",
    "passes",
    "GateResult",
    "slice_reference_bytes",
    "slice_truth_bytes",
    "checked_slices",
    "Reference",
    "check",
    "fingerprint",
    "changed_inputs",
]

FACTOR = 3.0
"""Allowed multiple of the plain same-precision implementation's error."""
FLOORS: dict[torch.dtype, float] = {
    torch.float64: 1e-10,
    torch.float32: 2e-6,
    torch.bfloat16: 2e-2,
    torch.float16: 2e-3,
}
"""Absolute floor added to the scaled plain-implementation error, per dtype."""
REFERENCE_BUFFERS = 3.0
"""Live float64 (Lq, Lk) buffers of one slice's forward reference: scores, probabilities, a copy."""
_BACKWARD_REFERENCE_FACTOR = 2.5
"""A slice's backward reference (autograd) relative to its forward: saved tensors, their grads."""


def tolerance(plain_error: float, dtype: torch.dtype, factor: float = FACTOR) -> float:
    """The allowed max error given the plain same-precision implementation's max error.

    Raises:
        ValueError: for a dtype without a floor.
    """
    if dtype not in FLOORS:
        raise ValueError(f"dtype must be one of {list(FLOORS)}, got {dtype}")
    return factor * plain_error + FLOORS[dtype]


def passes(error: float, tol: float) -> bool:
    """True when ``error`` is finite and within ``tol`` (NaN/inf never pass)."""
    return math.isfinite(error) and error <= tol


def _max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Max |a - b| in float64; NaN when either holds a non-finite value."""
    diff = a.detach().double() - b.detach().double()
    if not torch.isfinite(diff).all():
        return math.nan
    return float(diff.abs().max()) if diff.numel() else 0.0


@dataclass(frozen=True)
class GateResult:
    """What the gate found on one result."""

    max_error: float  # output: max |out - float64 reference| over the checked slices
    tolerance: float  # output: allowed max error (FACTOR x plain error + floor)
    # backward: max |grad - reference grad| of the worst of dq, dk, dv (by ratio)
    grad_error: float = math.nan
    grad_tolerance: float = math.nan  # backward: that gradient's allowed max error
    grad_name: str = ""  # which gradient is the worst ("dq", "dk" or "dv")
    softmax_error: float = math.nan  # approximate variants: max |out - exact softmax attention|
    # approximate variants: mean |out - exact softmax attention|
    softmax_mean_error: float = math.nan
    # approximate variants: the declared bound on softmax_mean_error (NaN: none)
    softmax_bound: float = math.nan
    slices: int = 0  # (batch, head) slices checked
    total_slices: int = 0  # (batch, head) slices in the case
    # what the result breaks of the call contract (shape, dtype, device, layout); "" when nothing
    contract: str = ""

    @classmethod
    def breach(
        cls, contract: str, dtype: torch.dtype, total_slices: int, backward: bool
    ) -> GateResult:
        """A failed result that could not be compared: it broke the call ``contract`` (why)."""
        floor = FLOORS[dtype]
        return cls(
            max_error=math.nan,
            tolerance=floor,
            grad_error=math.nan,
            grad_tolerance=floor if backward else math.nan,
            total_slices=total_slices,
            contract=contract,
        )

    @property
    def error_ratio(self) -> float:
        """Worst error / tolerance over output, gradients and declared bound (inf: non-finite)."""
        ratios = [_ratio(self.max_error, self.tolerance)]
        if not math.isnan(self.grad_tolerance):
            ratios.append(_ratio(self.grad_error, self.grad_tolerance))
        if not math.isnan(self.softmax_bound):
            ratios.append(_ratio(self.softmax_mean_error, self.softmax_bound))
        return max(ratios)

    @property
    def passed(self) -> bool:
        return self.error_ratio <= 1.0

    def reason(self) -> str:
        """Why the result failed ("" when it passed)."""
        parts = [f"the result breaks the call contract: {self.contract}"] if self.contract else []
        where = f"{self.slices}/{self.total_slices} (batch, head) slices checked"
        if not self.contract and not passes(self.max_error, self.tolerance):
            parts.append(f"output max error {self.max_error:.3g} > tolerance {self.tolerance:.3g}")
        if not math.isnan(self.grad_tolerance) and not passes(self.grad_error, self.grad_tolerance):
            parts.append(
                f"gradient {self.grad_name} max error {self.grad_error:.3g} "
                f"> tolerance {self.grad_tolerance:.3g}"
            )
        if not math.isnan(self.softmax_bound) and not passes(
            self.softmax_mean_error, self.softmax_bound
        ):
            parts.append(
                f"mean softmax error {self.softmax_mean_error:.3g} "
                f"> declared bound {self.softmax_bound:.3g}"
            )
        return "" if not parts else "correctness gate failed: " + "; ".join(parts) + f" ({where})"


def _ratio(error: float, tol: float) -> float:
    return error / tol if math.isfinite(error) else math.inf


def slice_reference_bytes(variant: Variant, spec: AttnSpec) -> float:
    """Float64 bytes one (batch, head) slice's reference needs.

    A blockwise reference (:meth:`~attnbench.variants.base.Variant.reference_is_blockwise`) holds
    :data:`REFERENCE_BUFFERS` + 1 tiles of at most
    :data:`~attnbench.reference.TILE_ELEMENTS` pairs (a backward query block spans all Lk keys)
    and its output; a dense one, :data:`REFERENCE_BUFFERS` ``(Lq, Lk)`` matrices and the
    variant's own scratch model at float64. Both hold float64 and plain copies of the inputs.
    Backward with grouped-query attention checks a whole group of G query heads at once (see the
    module docstring), so its slice is G heads' worth.
    """
    one = spec.replace(batch=1, heads=1, kv_heads=None, dtype="float64", mode="forward")
    if variant.reference_is_blockwise():
        tile = min(spec.lq * spec.lk, max(TILE_ELEMENTS, spec.lk))
        work = (REFERENCE_BUFFERS + 1) * tile + 2 * spec.lq * spec.dv
    else:
        work = REFERENCE_BUFFERS * spec.lq * spec.lk + variant.scratch_elements(one)
    fwd = work * 8 + 2 * one.input_bytes
    return fwd * (_BACKWARD_REFERENCE_FACTOR * spec.group if spec.mode == "backward" else 1.0)


def slice_truth_bytes(variant: Variant, spec: AttnSpec) -> float:
    """Float64 bytes :class:`Reference` keeps per checked slice.

    Its output rows (twice for an approximate variant: its kernel's and exact softmax's); backward,
    also dq and part of dk, dv.
    """
    out = spec.lq * spec.dv * (1 if variant.exact else 2)
    grads = (
        spec.lq * spec.head_dim + spec.lk * (spec.head_dim + spec.dv)
        if spec.mode == "backward"
        else 0
    )
    return 8.0 * (out + grads)


def checked_slices(
    spec: AttnSpec,
    per_slice_bytes: float,
    budget_bytes: float,
    seed: int = 0,
    limit: int | None = None,
) -> list[tuple[int, int]]:
    """The (batch, head) slices to check: all when affordable, else a seeded sample with both ends.

    Affordable means the float64 reference of every slice together fits ``budget_bytes`` and, with
    ``limit`` (how many slices the check's time budget holds), that there are no more than ``limit``
    slices. The sample takes as many slices as both hold: at least 3 for memory (first, last and one
    seeded draw), at least the first and the last for time. It depends only on the shape, the
    budgets and ``seed`` (a seeded ``torch.randperm``), so it is the same in every process.

    Example:
        >>> checked_slices(AttnSpec(heads=8), 1.0, 100.0, limit=2)
        [(0, 0), (0, 7)]
    """
    n = spec.batch * spec.heads
    if n * per_slice_bytes <= budget_bytes or n <= 3:
        want = n
    else:
        want = min(n, max(3, int(budget_bytes // max(per_slice_bytes, 1.0))))
    if limit is not None:
        want = min(want, max(limit, 2))
    if want >= n:
        flat = list(range(n))
    else:
        gen = torch.Generator().manual_seed(seed)
        middle = (torch.randperm(n - 2, generator=gen)[: want - 2] + 1).tolist()
        flat = sorted({0, n - 1, *middle})
    return [(i // spec.heads, i % spec.heads) for i in flat]


def _mask_slice(
    mask: torch.Tensor | mask_mods.MaskMod | None, b: int, h0: int, h1: int
) -> torch.Tensor | mask_mods.MaskMod | None:
    """``(1, h1 - h0 | 1, Lq|1, Lk)`` slice of a rank-4 broadcastable mask (heads h0..h1-1).

    A predicate is shifted instead (:func:`~attnbench.mask_mods.shifted`): evaluated per tile by
    the blockwise reference, it never exists as a dense tensor.
    """
    if mask is None:
        return None
    if isinstance(mask, mask_mods.MaskMod):
        return mask_mods.shifted(mask, b, h0)
    bi = b if mask.shape[0] > 1 else 0
    return mask[bi : bi + 1, h0:h1] if mask.shape[1] > 1 else mask[bi : bi + 1]


def _units(
    slices: Sequence[tuple[int, int]], heads: int, kv_heads: int, backward: bool
) -> list[tuple[int, int, int, int]]:
    """``(b, first query head, last + 1, key/value head)`` per checked unit.

    A unit is one query head, or (backward with G > 1) a whole group, whose shared head's
    gradients sum over its G query heads.
    """
    group = heads // kv_heads
    if backward and group > 1:
        return [
            (b, j * group, (j + 1) * group, j)
            for b, j in sorted({(b, h // group) for b, h in slices})
        ]
    return [(b, h, h + 1, h // group) for b, h in slices]


def _slice(x: torch.Tensor, b: int, h: int, dtype: torch.dtype, grad: bool) -> torch.Tensor:
    return x.detach()[b : b + 1, h : h + 1].to(dtype).requires_grad_(grad)  # (1, 1, L, D)


def _reference(
    variant: Variant, q, k, v, mask, grad_out, dtype: torch.dtype, exact_softmax: bool = False
) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """One slice's reference output at ``dtype`` and, with ``grad_out``, its (dq, dk, dv)."""
    grad = grad_out is not None
    qs, ks, vs = (x.detach().to(dtype).requires_grad_(grad) for x in (q, k, v))
    with torch.set_grad_enabled(grad):
        if exact_softmax:
            out = blockwise_reference_attention(
                qs, ks, vs, mask, scale=variant.scale_for(q.shape[-1]), dtype=dtype
            )
        else:
            out = variant.reference(qs, ks, vs, mask, dtype=dtype)
        grads = torch.autograd.grad(out, (qs, ks, vs), grad_out.to(dtype)) if grad else ()
    return out.detach(), tuple(grads)


def _contract_breach(
    result: object, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, backward: bool
) -> str:
    """What the result breaks of the call contract ("" when nothing): form, shape, dtype, device.

    A forward result is one strided tensor ``(B, H, Lq, Dv)`` of the inputs' dtype on their device;
    a backward result is ``(out, dq, dk, dv)``, each gradient shaped, typed and placed as its input.
    A variant that computed in float64 for a float32 case would be closer to the reference than the
    plain implementation, and pass the error check: the dtype is part of the promise.
    """
    if backward:
        if not (isinstance(result, (tuple, list)) and len(result) == 4):
            return f"a backward result must be (out, dq, dk, dv), got {type(result).__name__}"
        named = list(zip(("output", "dq", "dk", "dv"), result, strict=True))
    else:
        if not isinstance(result, torch.Tensor):
            return f"a forward result must be a tensor, got {type(result).__name__}"
        named = [("output", result)]
    expected = {
        "output": (*q.shape[:3], v.shape[-1]),
        "dq": tuple(q.shape),
        "dk": tuple(k.shape),
        "dv": tuple(v.shape),
    }
    for name, x in named:
        if not isinstance(x, torch.Tensor):
            return f"{name} must be a tensor, got {type(x).__name__}"
        for what, got, want in (
            ("shape", tuple(x.shape), expected[name]),
            ("dtype", x.dtype, q.dtype),
            ("device", x.device, q.device),
            ("layout", x.layout, torch.strided),
        ):
            if got != want:
                return f"{name} {what} {got} != {want} (the inputs')"
    return ""


@dataclass(frozen=True)
class _Truth:
    """One checked unit's float64 reference: its output rows, gradients and exact softmax."""

    b: int
    h0: int
    h1: int
    j: int  # the unit's key/value head
    out: torch.Tensor  # (1, h1 - h0, Lq, Dv) float64
    # backward: dq (1, h1 - h0, Lq, D), dk and dv (1, 1, Lk, D) float64
    grads: tuple[torch.Tensor, ...]
    exact: torch.Tensor | None  # approximate variants: exact softmax attention of the unit, float64


class Reference:
    """The correctness gate of one case: the float64 reference of its checked slices, computed once.

    Every result of the case's closure (the first call, calls after the timed ones) is checked
    against the same truth with :meth:`check`, so checking more calls costs comparisons, not
    references. The plain same-precision implementation's error, which sets the tolerance, is
    measured once here too. The truths held are the checked slices' outputs (and gradients) in
    float64: O(L) per slice, never a score matrix.

    Args:
        variant: the variant whose results are checked.
        q, k, v: the inputs the closure is called with, ``(B, H, L, D)``.
        mask: rank-4 bool mask, a predicate (for a variant whose reference is blockwise) or None.
        slices: (batch, head) pairs to check (see :func:`checked_slices`).
        grad_out: backward: the upstream gradient the closure uses, ``(B, H, Lq, Dv)``.
    """

    def __init__(
        self,
        variant: Variant,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        mask: torch.Tensor | mask_mods.MaskMod | None,
        slices: Sequence[tuple[int, int]],
        grad_out: torch.Tensor | None = None,
    ) -> None:
        self.variant, self.q, self.k, self.v = variant, q, k, v
        self.backward = grad_out is not None
        self.total_slices = q.shape[0] * q.shape[1]
        plain_err, g_plain = 0.0, [0.0] * 3
        self.truths: list[_Truth] = []
        for b, h0, h1, j in _units(slices, q.shape[1], k.shape[1], self.backward):
            qs = q.detach()[b : b + 1, h0:h1]  # (1, 1 or G, Lq, D): a query head, or a whole group
            # (1, 1, Lk, D): their key/value head
            ks, vs = (x.detach()[b : b + 1, j : j + 1] for x in (k, v))
            ms = _mask_slice(mask, b, h0, h1)
            gs = None if grad_out is None else grad_out[b : b + 1, h0:h1]
            truth, t_grads = _reference(variant, qs, ks, vs, ms, gs, torch.float64)
            plain, p_grads = _reference(variant, qs, ks, vs, ms, gs, q.dtype)
            plain_err = _worst(plain_err, _max_abs_diff(plain, truth))
            for i in range(len(t_grads)):
                g_plain[i] = _worst(g_plain[i], _max_abs_diff(p_grads[i], t_grads[i]))
            exact = None
            if not variant.exact:
                exact, _ = _reference(
                    variant, qs, ks, vs, ms, None, torch.float64, exact_softmax=True
                )
            self.truths.append(_Truth(b, h0, h1, j, truth, t_grads, exact))
        floor = FLOORS[q.dtype]
        self.tolerance = tolerance(plain_err, q.dtype) if math.isfinite(plain_err) else floor
        self.grad_tolerances = [
            tolerance(p, q.dtype) if math.isfinite(p) else floor for p in g_plain
        ]

    @property
    def slices(self) -> int:
        """(batch, head) slices checked."""
        return sum(t.h1 - t.h0 for t in self.truths)

    def check(self, result: object) -> GateResult:
        """Check one return value of the closure: the output, or ``(out, dq, dk, dv)``."""
        q = self.q
        breach = _contract_breach(result, q, self.k, self.v, self.backward)
        # a result that breaks the contract cannot be compared: it fails, with the reason
        if breach:
            return GateResult.breach(breach, q.dtype, self.total_slices, self.backward)
        out, *grads = result if self.backward else (result,)
        err = soft_err = soft_sum = 0.0
        soft_count = 0
        g_err = [0.0] * 3
        for t in self.truths:
            got = out[t.b : t.b + 1, t.h0 : t.h1]
            err = _worst(err, _max_abs_diff(got, t.out))
            for i, truth in enumerate(t.grads):
                # dq per query head, dk and dv per shared head
                rows = slice(t.h0, t.h1) if i == 0 else slice(t.j, t.j + 1)
                g_err[i] = _worst(g_err[i], _max_abs_diff(grads[i][t.b : t.b + 1, rows], truth))
            if t.exact is not None:
                soft_err = _worst(soft_err, _max_abs_diff(got, t.exact))
                soft_sum += float((got.double() - t.exact).abs().sum())
                soft_count += t.exact.numel()
        fields: dict[str, object] = {}
        if self.backward:
            tols = self.grad_tolerances
            worst = max(range(3), key=lambda i: _ratio(g_err[i], tols[i]))
            fields = dict(
                grad_error=g_err[worst],
                grad_tolerance=tols[worst],
                grad_name=("dq", "dk", "dv")[worst],
            )
        approx = not self.variant.exact
        bound = getattr(self.variant, "APPROX_ERROR_BOUND", None)
        return GateResult(
            max_error=err,
            tolerance=self.tolerance,
            softmax_error=soft_err if approx else math.nan,
            softmax_mean_error=soft_sum / soft_count if approx and soft_count else math.nan,
            softmax_bound=float(bound) if approx and bound is not None else math.nan,
            slices=self.slices,
            total_slices=self.total_slices,
            **fields,
        )


def check(
    variant: Variant,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    result: object,
    slices: Sequence[tuple[int, int]],
    grad_out: torch.Tensor | None = None,
) -> GateResult:
    """Check one ``result`` on ``slices`` against the variant's float64 :class:`Reference`.

    Args:
        variant: the variant that produced ``result``.
        q, k, v: the inputs the closure was called with, ``(B, H, L, D)``.
        mask: rank-4 bool mask (or None), as the closure received it.
        result: the closure's return value: the output ``(B, H, Lq, Dv)``, or for backward
            ``(out, dq, dk, dv)``.
        slices: (batch, head) pairs to check (see :func:`checked_slices`).
        grad_out: backward: the upstream gradient the closure used, ``(B, H, Lq, Dv)``.
    """
    return Reference(variant, q, k, v, mask, slices, grad_out).check(result)


# ---- inputs a variant must not change -----------------------------------------------------------
def fingerprint(tensors: Sequence[torch.Tensor | None]) -> tuple[bytes, ...]:
    """A digest of each tensor's bytes (b"" for None): writing into an input changes its digest.

    The reference is computed from the inputs as they are when the gate runs, so an in-place
    update (``q.mul_(1.01)``) would otherwise be checked against inputs it had already changed.
    """
    return tuple(b"" if x is None else _digest(x) for x in tensors)


def _digest(x: torch.Tensor) -> bytes:
    # the raw bytes, whatever the dtype
    flat = x.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return hashlib.blake2b(memoryview(flat.numpy()), digest_size=16).digest()


def changed_inputs(
    before: tuple[bytes, ...],
    tensors: Sequence[torch.Tensor | None],
    names: Sequence[str] = ("q", "k", "v", "mask"),
) -> list[str]:
    """The names of the tensors whose bytes differ from ``before`` (:func:`fingerprint`)."""
    return [
        name
        for name, old, new in zip(names, before, fingerprint(tensors), strict=False)
        if old != new
    ]


def _worst(a: float, b: float) -> float:
    """Running maximum where NaN (non-finite output) is the worst value and sticks."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
