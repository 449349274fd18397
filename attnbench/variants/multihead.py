"""Hand-written multi-head attention core, explicit head split and merge (d2l's transpose_qkv).

The textbook layer folds heads into the batch with ``transpose_qkv`` and unfolds them with
``transpose_output``. Here the inputs arrive per head ``(B, H, L, D)``; they are merged to the
projection layout ``(B, L, H*D)`` and then split again exactly as the textbook does, so the
reshapes and copies a real MHA layer pays are part of what is measured.
"""

from __future__ import annotations

import torch

from attnbench.variants._ops import masked_softmax_, merge_heads, zero_empty_rows
from attnbench.variants.base import GqaMode, Variant

__all__ = ["transpose_qkv", "transpose_output", "MultiheadAttentionCore"]


def transpose_qkv(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B, L, H*D) -> (B*H, L, D)``: heads folded into the batch for parallel bmm."""
    b, n, _ = x.shape
    x = x.reshape(b, n, heads, -1)  # (B, L, H, D)
    x = x.permute(0, 2, 1, 3)  # (B, H, L, D)
    return x.reshape(b * heads, n, x.shape[-1])  # (B*H, L, D)


def transpose_output(x: torch.Tensor, heads: int) -> torch.Tensor:
    """``(B*H, L, D) -> (B, L, H*D)``; the inverse of :func:`transpose_qkv`."""
    x = x.reshape(-1, heads, x.shape[1], x.shape[2])  # (B, H, L, D)
    x = x.permute(0, 2, 1, 3)  # (B, L, H, D)
    return x.reshape(x.shape[0], x.shape[1], -1)  # (B, L, H*D)


class MultiheadAttentionCore(Variant):
    """Merge heads, fold them into the batch, attend with bmm, unfold, split heads."""

    source = "MultiHeadAttention with transpose_qkv/transpose_output; Vaswani et al. 2017"
    # keys and values folded with their own Hkv heads; a group's queries share one bmm
    SUPPORTS_GQA = GqaMode.GROUPED

    def scratch_elements(self, spec):  # noqa: D102 - scores + probs + head-folded copies
        b, h = spec.batch, spec.heads
        copies = b * (
            h * spec.lq * (spec.head_dim + spec.dv) + spec.hkv * spec.lk * (spec.head_dim + spec.dv)
        )
        return self.SCORE_BUFFERS * b * h * spec.lq * spec.lk + copies

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        hkv, lk = k.shape[1], k.shape[2]
        queries = transpose_qkv(merge_heads(q), h)  # (B*H, Lq, D)
        keys = transpose_qkv(merge_heads(k), hkv)  # (B*Hkv, Lk, D)
        values = transpose_qkv(merge_heads(v), hkv)  # (B*Hkv, Lk, Dv)
        # (B*Hkv, G*Lq, D): a group's heads share one bmm
        queries = queries.reshape(b * hkv, (h // hkv) * lq, d)
        # (B*Hkv, G*Lq, Lk)
        scores = torch.bmm(queries, keys.transpose(1, 2)).mul_(self.scale_for(d))
        # (B*Hkv, G*Lq, Lk)
        probs = masked_softmax_(scores.view(b, h, lq, lk), mask).view(b * hkv, -1, lk)
        out = transpose_output(torch.bmm(probs, values).view(b * h, lq, -1), h)  # (B, Lq, H*Dv)
        out = out.view(b, lq, h, -1).transpose(1, 2)  # (B, H, Lq, Dv)
        return zero_empty_rows(out, mask)
