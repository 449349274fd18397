"""Float64 ground truth: the slow, obviously right version every variant is checked against.

Letters: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq queries, Lk keys,
D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from attnbench import mask_mods
from attnbench._checks import check_float_dtype, check_mask, check_qkv, check_scale

__all__ = [
    "TILE_ELEMENTS",
    "Q_TILE",
    "repeat_kv",
    "attend",
    "kernel_attend",
    "reference_attention",
    "blockwise_reference_attention",
]

TILE_ELEMENTS = 2**20
"""Most (query, key) pairs per head in one tile of :func:`blockwise_reference_attention`.

8 MiB of float64 scores per head: with a few such buffers live, a slice's reference stays well
inside the gate's reference budget at any length, O(L * tile) in all.
"""
Q_TILE = 512
"""Query rows per forward tile of :func:`blockwise_reference_attention` (keys fill the rest)."""


def repeat_kv(k: torch.Tensor, v: torch.Tensor, heads: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``k`` and ``v`` with each key/value head repeated for its G query heads (H heads in all).

    Query head h reads key/value head ``h // G`` (``repeat_interleave``: the convention of SDPA's
    ``enable_gqa``). Returns the inputs themselves when ``Hkv == heads`` (no copy); otherwise the
    copies hold ``B * H * Lk * (D + Dv)`` elements, which a variant that repeats declares in its
    cost model.

    Args:
        k: keys ``(B, Hkv, Lk, D)``.
        v: values ``(B, Hkv, Lk, Dv)``.
        heads: H, the number of query heads (a multiple of Hkv).
    """
    group = heads // k.shape[1]
    if group == 1:
        return k, v
    # (B, H, Lk, D), (B, H, Lk, Dv)
    return k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)


def _weighted_sum(
    weights: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor | None
) -> torch.Tensor:
    """``weights @ v`` where a non-finite ``v`` entry reaches the output only through allowed keys.

    ``0 * NaN`` is NaN, so a plain product would let a masked-out key's NaN value poison every
    row. Non-finite values are zeroed for the product, and the output entries that an *allowed*
    key's non-finite value feeds are set to NaN afterwards.

    Args:
        weights: ``(B, H, Lq, Lk)`` in the compute dtype, zero on masked keys.
        v: ``(B, H, Lk, Dv)`` in the compute dtype.
        allowed: bool broadcastable to ``(B, H, Lq, Lk)``, or None (every key allowed).
    """
    bad = ~torch.isfinite(v)  # (B, H, Lk, Dv)
    if not bool(bad.any()):
        return weights @ v  # (B, H, Lq, Dv)
    out = weights @ torch.where(bad, 0.0, v)
    reach = (
        torch.ones_like(weights)
        if allowed is None
        else allowed.to(weights.dtype).expand_as(weights)
    )
    # (B, H, Lq, Dv): an allowed key's value is non-finite
    poisoned = (reach @ bad.to(weights.dtype)) > 0
    return out.masked_fill(poisoned, float("nan"))


def attend(
    scores: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """softmax(scores) @ v, with masked keys removed and empty rows set to zero.

    Non-finite values propagate from allowed positions only: a NaN score or value at an allowed
    (query, key) pair makes that output row (or entry) NaN; one at a masked-out pair has no
    effect. So the reference can see a variant's NaN bugs instead of hiding them.

    Args:
        scores: ``(B, H, Lq, Lk)`` attention logits from any scoring function.
        v: ``(B, H, Lk, Dv)`` values.
        mask: optional bool mask broadcastable to ``scores`` (True = may attend).
        dtype: compute dtype; float64 for ground truth, the inputs' own dtype for the "plain
            implementation at the same precision" that test tolerances are scaled by.

    Returns:
        ``(B, H, Lq, Dv)`` tensor of ``dtype``.
    """
    check_float_dtype("dtype", dtype)
    scores = scores.to(dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))  # masked NaN scores are dropped here
    probs = torch.softmax(scores, dim=-1)  # (B, H, Lq, Lk); NaN on rows with no allowed key
    if mask is not None:
        empty = ~mask.any(dim=-1, keepdim=True)  # (B?, H?, Lq?, 1)
        probs = probs.masked_fill(empty, 0.0)
    return _weighted_sum(probs, v.to(dtype), mask)


def kernel_attend(
    q_features: torch.Tensor,
    k_features: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Normalised kernel attention ``(phi(q) phi(k)^T) v / (phi(q) phi(k)^T 1)``.

    The dense, quadratic form of what linear attention computes in O(L); used as the exact
    reference for kernelised variants (linear transformer, Performer). Non-finite values
    propagate from allowed keys only, as in :func:`attend`.
    """
    check_float_dtype("dtype", dtype)
    weights = torch.einsum("bhqf,bhkf->bhqk", q_features.to(dtype), k_features.to(dtype))
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    norm = weights.sum(-1, keepdim=True)  # (B, H, Lq, 1)
    out = _weighted_sum(weights, v.to(dtype), mask)
    safe = torch.where(norm > 0, out / norm.clamp_min(torch.finfo(dtype).tiny), 0.0)
    return torch.where(torch.isnan(norm), float("nan"), safe)


def _check_not_meta(q: torch.Tensor) -> None:
    """Refuse meta tensors: a reference computes values, and a meta tensor holds none."""
    if q.device.type == "meta":
        raise ValueError(
            "q, k, v must hold values (on 'cpu' or 'cuda'), got meta tensors: the reference "
            "computes the attention's values, which a meta tensor does not have"
        )


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Scaled dot-product attention by einsum, ``(B, H, Lq, Dv)`` in ``dtype`` (default float64).

    Dense: it builds the whole ``(B, H, Lq, Lk)`` score matrix.
    :func:`blockwise_reference_attention` computes the same in O(L * tile) memory.

    Unlike the variants, it accepts non-finite inputs: NaN or inf in ``q``, ``k`` or ``v`` spreads
    NaN from allowed positions only (see :func:`attend`), so it can see a variant's NaN bugs.

    Args:
        q: ``(B, H, Lq, D)`` queries.
        k: ``(B, Hkv, Lk, D)`` keys (Hkv divides H; query head h reads key head
            ``h // (H // Hkv)``).
        v: ``(B, Hkv, Lk, Dv)`` values.
        mask: bool, broadcastable to ``(B, H, Lq, Lk)``; True = may attend (a row with none: zeros).
        scale: score multiplier; default ``1 / sqrt(D)``.
        dtype: compute dtype, a floating-point ``torch.dtype`` (see :func:`attend`).

    Raises:
        TypeError, ValueError: for bad shapes, dtypes or devices (as every variant; non-finite
            values are accepted), meta tensors, a bad ``scale``, or a ``dtype`` that is not a
            floating-point ``torch.dtype`` (``"float64"``, ``torch.int64``).

    Example:
        >>> q = k = v = torch.ones(1, 1, 2, 4)
        >>> reference_attention(q, k, v).tolist()
        [[[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]]]
    """
    check_qkv(q, k, v, mask)
    _check_not_meta(q)
    scale = check_scale(scale)
    check_float_dtype("dtype", dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(dtype), k.to(dtype)) * scale  # (B, H, Lq, Lk)
    return attend(scores, v, mask, dtype)


_TileMask = Callable[[int, int, int, int], "torch.Tensor | None"]
"""``(q0, q1, k0, k1) -> allowed (B?, H?, Cq?, Ck)`` on one tile, or None (every pair allowed)."""


def _tile_masker(
    mask: torch.Tensor | mask_mods.MaskMod | None, batch: int, heads: int, device
) -> _TileMask:
    """The mask of any tile, read from a broadcastable bool tensor or evaluated from a predicate."""
    if mask is None:
        return lambda q0, q1, k0, k1: None
    if isinstance(mask, mask_mods.MaskMod):
        return lambda q0, q1, k0, k1: mask_mods.tile(mask, batch, heads, q0, q1, k0, k1, device)
    m = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))  # (B?, H?, Lq?, Lk?)

    def cut(q0: int, q1: int, k0: int, k1: int) -> torch.Tensor:
        rows = m if m.shape[2] == 1 else m[:, :, q0:q1]
        return rows if rows.shape[3] == 1 else rows[:, :, :, k0:k1]

    return cut


def blockwise_reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | mask_mods.MaskMod | None = None,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """:func:`reference_attention` in O(L * tile) memory: online softmax over key tiles.

    Query blocks of up to :data:`Q_TILE` rows each fold their key tiles (up to
    :data:`TILE_ELEMENTS` pairs per head) into a running maximum, normaliser and accumulator in
    ``dtype`` (Milakov & Gimelshein 2018), so no ``(Lq, Lk)`` matrix exists, and a mask given as a
    predicate is evaluated one tile at a time. It agrees with the dense reference to ``dtype``
    rounding, non-finite inputs included (NaN spreads from allowed positions only). Under autograd
    the backward recomputes one query block at a time with the dense reference
    (``Q_TILE``-independent: blocks of ``TILE_ELEMENTS // Lk`` rows), so gradients are O(L * tile)
    too.

    Args:
        q, k, v, scale, dtype: as :func:`reference_attention`.
        mask: bool tensor broadcastable to ``(B, H, Lq, Lk)``, a
            :class:`~attnbench.mask_mods.MaskMod` predicate, or None.

    Raises:
        TypeError, ValueError: as :func:`reference_attention`.
    """
    mod = mask if isinstance(mask, mask_mods.MaskMod) else None
    check_qkv(q, k, v, None if mod is not None else mask)
    if mask is not None and mod is None and not isinstance(mask, torch.Tensor):
        check_mask(mask, (q.shape[0], q.shape[1], q.shape[2], k.shape[2]), q.device)
    _check_not_meta(q)
    scale = check_scale(scale)
    check_float_dtype("dtype", dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    masker = _tile_masker(mask, q.shape[0], q.shape[1], q.device)
    return _BlockwiseReference.apply(q, k, v, masker, scale, dtype)


class _BlockwiseReference(torch.autograd.Function):
    """Forward by online softmax over tiles; backward one query block at a time, densely."""

    @staticmethod
    def forward(ctx, q, k, v, masker: _TileMask, scale: float, dtype: torch.dtype):
        ctx.save_for_backward(q, k, v)
        ctx.masker, ctx.scale, ctx.dtype = masker, scale, dtype
        kr, vr = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        lq, lk = q.shape[2], k.shape[2]
        cq = min(lq, Q_TILE)
        ck = min(lk, max(1, TILE_ELEMENTS // cq))
        blocks = [
            _online_rows(q[:, :, q0 : q0 + cq], kr, vr, masker, q0, ck, scale, dtype)
            for q0 in range(0, lq, cq)
        ]
        return torch.cat(blocks, dim=2)  # (B, H, Lq, Dv)

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v = ctx.saved_tensors
        lq, lk = q.shape[2], k.shape[2]
        rows = max(1, min(lq, TILE_ELEMENTS // lk))
        dq = torch.zeros_like(q)
        dk, dv = torch.zeros_like(k), torch.zeros_like(v)
        for q0 in range(0, lq, rows):
            q1 = min(q0 + rows, lq)
            with torch.enable_grad():
                qb, kb, vb = (x.detach().requires_grad_(True) for x in (q[:, :, q0:q1], k, v))
                allowed = ctx.masker(q0, q1, 0, lk)  # (B?, H?, Cq?, Lk) or None
                out = reference_attention(qb, kb, vb, allowed, ctx.scale, ctx.dtype)
                # (B, H, Cq, D), (B, Hkv, Lk, D), (B, Hkv, Lk, Dv)
                gq, gk, gv = torch.autograd.grad(out, (qb, kb, vb), grad_out[:, :, q0:q1])
            dq[:, :, q0:q1] = gq
            dk += gk
            dv += gv
        return dq, dk, dv, None, None, None


def _online_rows(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    masker: _TileMask,
    q0: int,
    ck: int,
    scale: float,
    dtype: torch.dtype,
) -> torch.Tensor:
    """One query block's attention ``(B, H, Cq, Dv)`` in ``dtype``, folding key tiles of ``ck``.

    Args:
        q: ``(B, H, Cq, D)`` the block's queries (rows ``q0 ..``); k, v: ``(B, H, Lk, *)``.
    """
    b, h, cq = q.shape[:3]
    lk = k.shape[2]
    qd = q.to(dtype)
    run_max = torch.full((b, h, cq, 1), -math.inf, dtype=dtype, device=q.device)
    run_sum = torch.zeros_like(run_max)  # (B, H, Cq, 1)
    acc = torch.zeros(b, h, cq, v.shape[-1], dtype=dtype, device=q.device)  # (B, H, Cq, Dv)
    seen = None  # (B?, H?, Cq?, 1): a key was allowed (None: no mask, every key is)
    for k0 in range(0, lk, ck):
        k1 = min(k0 + ck, lk)
        allowed = masker(q0, q0 + cq, k0, k1)  # (B?, H?, Cq?, Ck) or None
        # (B, H, Cq, Ck)
        scores = torch.einsum("bhqd,bhkd->bhqk", qd, k[:, :, k0:k1].to(dtype)) * scale
        if allowed is not None:
            scores = scores.masked_fill(~allowed, -math.inf)  # masked NaN scores dropped here
            any_allowed = allowed.any(dim=-1, keepdim=True)
            seen = any_allowed if seen is None else seen | any_allowed
        new_max = torch.maximum(run_max, scores.amax(dim=-1, keepdim=True))  # NaN sticks
        # a row that has seen only -inf keeps max -inf: shift it by 0 so exp() gives 0, not NaN
        shift = torch.where(new_max == -math.inf, 0.0, new_max)  # (B, H, Cq, 1)
        probs = torch.exp(scores - shift)  # (B, H, Cq, Ck), unnormalised
        rescale = torch.exp(run_max - shift)  # (B, H, Cq, 1)
        run_sum = run_sum * rescale + probs.sum(dim=-1, keepdim=True)
        acc = acc * rescale + _weighted_sum(probs, v[:, :, k0:k1].to(dtype), allowed)
        run_max = new_max
    # no allowed key: zeros (as attend); allowed keys whose scores are all -inf, or a NaN sum:
    # NaN (as softmax)
    out = acc / torch.where(run_sum > 0, run_sum, 1.0)
    empty = torch.zeros((), dtype=dtype, device=q.device)
    return torch.where(
        run_sum > 0, out, math.nan if seen is None else torch.where(seen, math.nan, empty)
    )
