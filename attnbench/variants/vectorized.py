"""One sequence and one head at a time, with matrix products (the ``Q = W_Q X`` column form).

Columns are tokens: ``Q^T (D, Lq)``, ``K^T (D, Lk)``, ``V^T (Dv, Lk)``;
``A = softmax_over_keys(K Q^T)`` and ``H = V^T A``.
"""

from __future__ import annotations

import torch

from attnbench.variants._ops import masked_softmax_, zero_empty_rows
from attnbench.variants.base import GqaMode, Variant

__all__ = ["VectorizedAttention"]


class VectorizedAttention(Variant):
    """Loops over (batch, head) in Python; each iteration is three matrix products."""

    source = "self-attention in the Q = W_Q X column form; Vaswani et al. 2017"
    SCORE_BUFFERS = 2.0
    SUPPORTS_GQA = GqaMode.NATIVE  # query head h indexes key/value head h // G: no copy

    def scratch_elements(self, spec):  # noqa: D102 - one (Lk, Lq) head at a time
        return self.SCORE_BUFFERS * spec.lq * spec.lk

    def forward(self, q, k, v, mask):
        b_sz, h_sz, lq, d = q.shape
        g = h_sz // k.shape[1]  # query heads per key/value head
        scale = self.scale_for(d)
        out = torch.empty(b_sz, h_sz, lq, v.shape[-1], dtype=q.dtype, device=q.device)
        for b in range(b_sz):
            for h in range(h_sz):
                qt, kt, vt = q[b, h].T, k[b, h // g].T, v[b, h // g].T  # (D, Lq), (D, Lk), (Dv, Lk)
                scores = (kt.T @ qt).mul_(scale).T  # (Lq, Lk), computed as (Lk, Lq)
                m = (
                    None
                    if mask is None
                    else mask[min(b, mask.shape[0] - 1), min(h, mask.shape[1] - 1)]
                )
                probs = masked_softmax_(scores, m)  # (Lq, Lk)
                out[b, h] = (vt @ probs.T).T  # (Dv, Lq) -> (Lq, Dv)
        return zero_empty_rows(out, mask)
