"""Float64 ground truth: the slow, obviously right version every variant is checked against.

Letters: B batch, H query heads, Hkv key/value heads, G = H // Hkv, Lq queries, Lk keys,
D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math

import torch

from attnbench._checks import check_float_dtype, check_qkv, check_scale


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


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Scaled dot-product attention by einsum, ``(B, H, Lq, Dv)`` in ``dtype`` (default float64).

    Args:
        q: ``(B, H, Lq, D)`` queries.
        k: ``(B, Hkv, Lk, D)`` keys (Hkv divides H; query head h reads key head
            ``h // (H // Hkv)``).
        v: ``(B, Hkv, Lk, Dv)`` values.
        mask: bool, broadcastable to ``(B, H, Lq, Lk)``; True = may attend (a row with none: zeros).
        scale: score multiplier; default ``1 / sqrt(D)``.
        dtype: compute dtype, a floating-point ``torch.dtype`` (see :func:`attend`).

    Raises:
        TypeError, ValueError: for bad inputs (as every variant), a bad ``scale``, or a ``dtype``
            that is not a floating-point ``torch.dtype`` (``"float64"``, ``torch.int64``).

    Example:
        >>> q = k = v = torch.ones(1, 1, 2, 4)
        >>> reference_attention(q, k, v).tolist()
        [[[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]]]
    """
    check_qkv(q, k, v, mask)
    scale = check_scale(scale)
    check_float_dtype("dtype", dtype)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(dtype), k.to(dtype)) * scale  # (B, H, Lq, Lk)
    return attend(scores, v, mask, dtype)
