"""The correctness gate: is what the timed closure returned right?

One rule, used by the runner, asv and the tests: a result's max error against the float64
reference of what the variant claims to compute must be at most ``FACTOR`` times the error of the
plain implementation at the inputs' own precision (``variant.reference(..., dtype=q.dtype)``) plus
a per-dtype floor. NaN or inf never passes.

The checked result is the timed closure's own return value (forward: the output; backward: the
output and dq, dk, dv for a fixed ``grad_out``), so a variant cannot pass the gate through a
different code path from the one that is timed. The reference is computed one (batch, head)
slice at a time, so its memory stays at one slice's worth: every slice when the float64 reference
of all of them fits the reference budget, else a seeded sample that always holds the first and the
last slice (so swapped heads or batch entries are caught at any size). Backward compares the
gradients with autograd through the variant's own float64 reference, with the same ``grad_out``.

Grouped-query attention (Hkv < H): query head h is checked against key/value head ``h // G``
(G = H // Hkv). A shared head's gradients dk, dv sum over its G query heads, so backward checks
whole groups: every checked query head brings the other heads of its group.

An approximate variant (``exact = False``) is checked exactly against its own reference (the dense
evaluation of its own kernel) and, when it declares ``APPROX_ERROR_BOUND``, its distance from exact
softmax attention must stay within that bound.

Letters: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq queries, Lk keys,
D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from attnbench.reference import reference_attention
from attnbench.spec import AttnSpec
from attnbench.variants.base import Variant

FACTOR = 3.0
"""Allowed multiple of the plain same-precision implementation's error."""
FLOORS: dict[torch.dtype, float] = {torch.float64: 1e-10, torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}
"""Absolute floor added to the scaled plain-implementation error, per dtype."""
REFERENCE_BUFFERS = 3.0
"""Live float64 (Lq, Lk) buffers of one slice's forward reference (scores, probabilities, a copy)."""
BACKWARD_REFERENCE_FACTOR = 2.5
"""A slice's backward reference (autograd) relative to its forward: saved tensors and their gradients."""


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


def max_abs_diff(a: torch.Tensor, b: torch.Tensor) -> float:
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
    grad_error: float = math.nan  # backward: max |grad - reference grad| of the worst of dq, dk, dv (by ratio)
    grad_tolerance: float = math.nan  # backward: that gradient's allowed max error
    grad_name: str = ""  # which gradient is the worst ("dq", "dk" or "dv")
    softmax_error: float = math.nan  # approximate variants: max |out - exact softmax attention|
    softmax_mean_error: float = math.nan  # approximate variants: mean |out - exact softmax attention|
    softmax_bound: float = math.nan  # approximate variants: the declared bound on softmax_mean_error (NaN: none)
    slices: int = 0  # (batch, head) slices checked
    total_slices: int = 0  # (batch, head) slices in the case

    @property
    def error_ratio(self) -> float:
        """Worst error / tolerance over the output, the gradients and the declared bound (inf if non-finite)."""
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
        parts = []
        where = f"{self.slices}/{self.total_slices} (batch, head) slices checked"
        if not passes(self.max_error, self.tolerance):
            parts.append(f"output max error {self.max_error:.3g} > tolerance {self.tolerance:.3g}")
        if not math.isnan(self.grad_tolerance) and not passes(self.grad_error, self.grad_tolerance):
            parts.append(f"gradient {self.grad_name} max error {self.grad_error:.3g} > tolerance {self.grad_tolerance:.3g}")
        if not math.isnan(self.softmax_bound) and not passes(self.softmax_mean_error, self.softmax_bound):
            parts.append(f"mean softmax error {self.softmax_mean_error:.3g} > declared bound {self.softmax_bound:.3g}")
        return "" if not parts else "correctness gate failed: " + "; ".join(parts) + f" ({where})"


def _ratio(error: float, tol: float) -> float:
    return error / tol if math.isfinite(error) else math.inf


def slice_reference_bytes(variant: Variant, spec: AttnSpec) -> float:
    """Float64 bytes one (batch, head) slice's reference needs (its own scratch model at float64).

    Backward with grouped-query attention checks a whole group of G query heads at once (see the
    module docstring), so its slice is G heads' worth.
    """
    one = spec.replace(batch=1, heads=1, kv_heads=None, dtype="float64", mode="forward")
    fwd = (REFERENCE_BUFFERS * spec.lq * spec.lk + variant.scratch_elements(one)) * 8 + 2 * one.input_bytes
    return fwd * (BACKWARD_REFERENCE_FACTOR * spec.group if spec.mode == "backward" else 1.0)


def checked_slices(spec: AttnSpec, per_slice_bytes: float, budget_bytes: float, seed: int = 0) -> list[tuple[int, int]]:
    """The (batch, head) slices to check: all when affordable, else a seeded sample with the first and last.

    Affordable means the float64 reference of every slice together fits ``budget_bytes``. The sample
    takes as many slices as the budget holds, at least 3 (first, last and one seeded draw); it
    depends only on the shape and ``seed`` (a seeded ``torch.randperm``), so it is the same in
    every process.
    """
    n = spec.batch * spec.heads
    if n * per_slice_bytes <= budget_bytes or n <= 3:
        flat = list(range(n))
    else:
        want = min(n, max(3, int(budget_bytes // max(per_slice_bytes, 1.0))))
        gen = torch.Generator().manual_seed(seed)
        middle = (torch.randperm(n - 2, generator=gen)[: want - 2] + 1).tolist()
        flat = sorted({0, n - 1, *middle})
    return [(i // spec.heads, i % spec.heads) for i in flat]


def _mask_slice(mask: torch.Tensor | None, b: int, h0: int, h1: int) -> torch.Tensor | None:
    """``(1, h1 - h0 | 1, Lq|1, Lk)`` slice of a rank-4 broadcastable mask (query heads h0 .. h1 - 1)."""
    if mask is None:
        return None
    bi = b if mask.shape[0] > 1 else 0
    return mask[bi : bi + 1, h0:h1] if mask.shape[1] > 1 else mask[bi : bi + 1]


def _units(slices: Sequence[tuple[int, int]], heads: int, kv_heads: int, backward: bool) -> list[tuple[int, int, int, int]]:
    """``(b, first query head, last + 1, key/value head)`` per checked unit.

    A unit is one query head, or (backward with G > 1) a whole group, whose shared head's
    gradients sum over its G query heads.
    """
    group = heads // kv_heads
    if backward and group > 1:
        return [(b, j * group, (j + 1) * group, j) for b, j in sorted({(b, h // group) for b, h in slices})]
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
            out = reference_attention(qs, ks, vs, mask, scale=variant.scale_for(q.shape[-1]), dtype=dtype)
        else:
            out = variant.reference(qs, ks, vs, mask, dtype=dtype)
        grads = torch.autograd.grad(out, (qs, ks, vs), grad_out.to(dtype)) if grad else ()
    return out.detach(), tuple(grads)


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
    """Check a closure's ``result`` on ``slices`` against the variant's float64 reference.

    Args:
        variant: the variant that produced ``result``.
        q, k, v: the inputs the closure was called with, ``(B, H, L, D)``.
        mask: rank-4 bool mask (or None), as the closure received it.
        result: the closure's return value: the output ``(B, H, Lq, Dv)``, or for backward
            ``(out, dq, dk, dv)``.
        slices: (batch, head) pairs to check (see :func:`checked_slices`).
        grad_out: backward: the upstream gradient the closure used, ``(B, H, Lq, Dv)``.

    Raises:
        TypeError: if ``result`` does not have the shape of a forward or backward result.
    """
    backward = grad_out is not None
    if backward:
        if not (isinstance(result, (tuple, list)) and len(result) == 4):
            raise TypeError(f"a backward result must be (out, dq, dk, dv), got {type(result).__name__}")
        out, *grads = result
    else:
        if not isinstance(result, torch.Tensor):
            raise TypeError(f"a forward result must be a tensor, got {type(result).__name__}")
        out, grads = result, []
    expected = (*q.shape[:3], v.shape[-1])
    if tuple(out.shape) != expected or any(tuple(g.shape) != tuple(x.shape) for g, x in zip(grads, (q, k, v)[: len(grads)], strict=True)):
        floor = FLOORS[q.dtype]  # a wrongly shaped result cannot be compared: it fails
        return GateResult(max_error=math.nan, tolerance=floor, grad_error=math.nan,
                          grad_tolerance=floor if backward else math.nan, slices=0, total_slices=q.shape[0] * q.shape[1])
    err = plain_err = soft_err = soft_sum = 0.0
    soft_count = 0
    g_err, g_plain = [0.0] * 3, [0.0] * 3
    approx = not variant.exact
    units = _units(slices, q.shape[1], k.shape[1], backward)
    for b, h0, h1, j in units:
        qs = q.detach()[b : b + 1, h0:h1]  # (1, 1 or G, Lq, D): a query head, or a whole group
        ks, vs = (x.detach()[b : b + 1, j : j + 1] for x in (k, v))  # (1, 1, Lk, D): their key/value head
        ms = _mask_slice(mask, b, h0, h1)
        gs = None if grad_out is None else grad_out[b : b + 1, h0:h1]
        truth, t_grads = _reference(variant, qs, ks, vs, ms, gs, torch.float64)
        plain, p_grads = _reference(variant, qs, ks, vs, ms, gs, q.dtype)
        got = out[b : b + 1, h0:h1]
        err = _worst(err, max_abs_diff(got, truth))
        plain_err = _worst(plain_err, max_abs_diff(plain, truth))
        for i in range(len(t_grads)):
            rows = slice(h0, h1) if i == 0 else slice(j, j + 1)  # dq per query head, dk and dv per shared head
            g_err[i] = _worst(g_err[i], max_abs_diff(grads[i][b : b + 1, rows], t_grads[i]))
            g_plain[i] = _worst(g_plain[i], max_abs_diff(p_grads[i], t_grads[i]))
        if approx:
            exact, _ = _reference(variant, qs, ks, vs, ms, None, torch.float64, exact_softmax=True)
            soft_err = _worst(soft_err, max_abs_diff(got, exact))
            soft_sum += float((got.double() - exact).abs().sum())
            soft_count += exact.numel()
    fields: dict[str, object] = {}
    if backward:
        tols = [tolerance(p, q.dtype) if math.isfinite(p) else FLOORS[q.dtype] for p in g_plain]
        worst = max(range(3), key=lambda i: _ratio(g_err[i], tols[i]))
        fields = dict(grad_error=g_err[worst], grad_tolerance=tols[worst], grad_name=("dq", "dk", "dv")[worst])
    bound = getattr(variant, "APPROX_ERROR_BOUND", None)
    return GateResult(
        max_error=err,
        tolerance=tolerance(plain_err, q.dtype) if math.isfinite(plain_err) else FLOORS[q.dtype],
        softmax_error=soft_err if approx else math.nan,
        softmax_mean_error=soft_sum / soft_count if approx and soft_count else math.nan,
        softmax_bound=float(bound) if approx and bound is not None else math.nan,
        slices=sum(h1 - h0 for _, h0, h1, _ in units),
        total_slices=q.shape[0] * q.shape[1],
        **fields,
    )


def _worst(a: float, b: float) -> float:
    """Running maximum where NaN (non-finite output) is the worst value and sticks."""
    if math.isnan(a) or math.isnan(b):
        return math.nan
    return max(a, b)
