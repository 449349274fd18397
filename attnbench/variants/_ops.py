"""Small tensor helpers shared by the dense variants.

A masked key gets the dtype's most negative finite value rather than -inf: an unmasked row is
unchanged (exp underflows to exactly 0), and a row with no allowed key stays finite, so both the
forward and the backward pass are NaN-free; :func:`zero_empty_rows` then zeroes such rows.
"""

from __future__ import annotations

import torch

__all__ = ["masked_softmax_", "zero_empty_rows", "merge_heads", "split_heads"]


def masked_softmax_(scores: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis after filling disallowed keys *in place* in ``scores``.

    Args:
        scores: ``(..., Lq, Lk)`` logits; overwritten where the mask is False.
        mask: bool, broadcastable to ``scores``; True = may attend.
    """
    if mask is not None:
        scores.masked_fill_(~mask, torch.finfo(scores.dtype).min)
    return torch.softmax(scores, dim=-1)


def zero_empty_rows(out: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """Zero the output rows whose query has no allowed key (``out (B, H, Lq, Dv)``)."""
    if mask is None:
        return out
    empty = ~mask.any(dim=-1, keepdim=True)  # (B?, H?, Lq?, 1)
    return out.masked_fill(empty, 0.0)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """``(B, H, L, D) -> (B, L, H*D)``: the layout projections produce and consume."""
    b, h, n, d = x.shape
    return x.transpose(1, 2).reshape(b, n, h * d)


def split_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, L, H*D) -> (B, H, L, D)``; the inverse of :func:`merge_heads`."""
    b, n, e = x.shape
    return x.view(b, n, heads, e // heads).transpose(1, 2)
