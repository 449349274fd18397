"""All batches and heads at once with ``torch.bmm`` on ``(B*H, L, D)``.

The textbook ``DotProductAttention`` and O(L^2)-memory implementation: scores and probabilities
are both materialised.
"""

from __future__ import annotations

import torch

from attnbench.variants._ops import masked_softmax_, zero_empty_rows
from attnbench.variants.base import GqaMode, Variant

__all__ = ["BatchedAttention"]


class BatchedAttention(Variant):
    """``softmax(Q K^T * scale) V`` with two bmm calls; peak = scores + probabilities + output."""

    source = "DotProductAttention with torch.bmm; Vaswani et al. 2017"
    # the G query heads of a group share one bmm against their key/value head
    SUPPORTS_GQA = GqaMode.GROUPED

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        hkv, lk, dv = k.shape[1], k.shape[2], v.shape[-1]
        g = h // hkv  # query heads per key/value head (1: multi-head)
        q3 = q.reshape(b * hkv, g * lq, d)  # (B*Hkv, G*Lq, D): head h = j*G + i of group j
        k3 = k.reshape(b * hkv, lk, d)  # (B*Hkv, Lk, D)
        v3 = v.reshape(b * hkv, lk, dv)  # (B*Hkv, Lk, Dv)
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(self.scale_for(d))  # (B*Hkv, G*Lq, Lk)
        probs = masked_softmax_(scores.view(b, h, lq, lk), mask)  # (B, H, Lq, Lk)
        out = torch.bmm(probs.view(b * hkv, g * lq, lk), v3)  # (B*Hkv, G*Lq, Dv)
        return zero_empty_rows(out.view(b, h, lq, dv), mask)
