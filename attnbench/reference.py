"""Float64 ground truth: the slow, obviously right version every variant is checked against.

Letters: B batch, H heads, Lq queries, Lk keys, D query/key head dim, Dv value head dim.
"""

from __future__ import annotations

import math

import torch

from attnbench._checks import check_qkv


def attend(
    scores: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """softmax(scores) @ v, with masked keys removed and empty rows set to zero.

    Args:
        scores: ``(B, H, Lq, Lk)`` attention logits from any scoring function.
        v: ``(B, H, Lk, Dv)`` values.
        mask: optional bool mask broadcastable to ``scores`` (True = may attend).
        dtype: compute dtype; float64 for ground truth, the inputs' own dtype for the "plain
            implementation at the same precision" that test tolerances are scaled by.

    Returns:
        ``(B, H, Lq, Dv)`` tensor of ``dtype``.
    """
    scores = scores.to(dtype)
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # (B, H, Lq, Lk), NaN on rows with no allowed key
    probs = torch.nan_to_num(probs, nan=0.0)
    return torch.einsum("bhqk,bhkv->bhqv", probs, v.to(dtype))


def kernel_attend(
    q_features: torch.Tensor,
    k_features: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Normalised kernel attention ``(phi(q) phi(k)^T) v / (phi(q) phi(k)^T 1)``.

    The dense, quadratic form of what linear attention computes in O(L); used as the exact
    reference for kernelised variants (linear transformer, Performer).
    """
    weights = torch.einsum("bhqf,bhkf->bhqk", q_features.to(dtype), k_features.to(dtype))
    if mask is not None:
        weights = weights.masked_fill(~mask, 0.0)
    norm = weights.sum(-1, keepdim=True)  # (B, H, Lq, 1)
    out = torch.einsum("bhqk,bhkv->bhqv", weights, v.to(dtype))
    return torch.where(norm > 0, out / norm.clamp_min(torch.finfo(dtype).tiny), 0.0)


def reference_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    scale: float | None = None,
    dtype: torch.dtype = torch.float64,
) -> torch.Tensor:
    """Scaled dot-product attention with einsum, in float64 unless ``dtype`` says otherwise.

    Args:
        q: ``(B, H, Lq, D)`` queries.
        k: ``(B, H, Lk, D)`` keys.
        v: ``(B, H, Lk, Dv)`` values.
        mask: bool, broadcastable to ``(B, H, Lq, Lk)``; True = may attend. Rows with no allowed
            key return zeros.
        scale: score multiplier; default ``1 / sqrt(D)``.
        dtype: compute dtype (see :func:`attend`).

    Returns:
        ``(B, H, Lq, Dv)`` tensor of ``dtype``.

    Example:
        >>> q = k = v = torch.ones(1, 1, 2, 4)
        >>> reference_attention(q, k, v).tolist()
        [[[[1.0, 1.0, 1.0, 1.0], [1.0, 1.0, 1.0, 1.0]]]]
    """
    check_qkv(q, k, v, mask)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = torch.einsum("bhqd,bhkd->bhqk", q.to(dtype), k.to(dtype)) * scale  # (B, H, Lq, Lk)
    return attend(scores, v, mask, dtype)
