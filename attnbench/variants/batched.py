"""All batches and heads at once with ``torch.bmm`` on ``(B*H, L, D)`` (the textbook
``DotProductAttention``). The textbook O(L^2)-memory implementation: scores and probabilities
are both materialised.
"""

from __future__ import annotations

import torch

from attnbench.variants._ops import masked_softmax_, zero_empty_rows
from attnbench.variants.base import Variant


class BatchedAttention(Variant):
    """``softmax(Q K^T * scale) V`` with two bmm calls; peak = scores + probabilities + output."""

    source = "DotProductAttention with torch.bmm; Vaswani et al. 2017"

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[-1]
        q3 = q.reshape(b * h, lq, d)  # (B*H, Lq, D)
        k3 = k.reshape(b * h, lk, d)  # (B*H, Lk, D)
        v3 = v.reshape(b * h, lk, dv)  # (B*H, Lk, Dv)
        scores = torch.bmm(q3, k3.transpose(1, 2)).mul_(self.scale_for(d))  # (B*H, Lq, Lk)
        probs = masked_softmax_(scores.view(b, h, lq, lk), mask)  # (B, H, Lq, Lk)
        out = torch.bmm(probs.view(b * h, lq, lk), v3)  # (B*H, Lq, Dv)
        return zero_empty_rows(out.view(b, h, lq, dv), mask)
