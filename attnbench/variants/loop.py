"""Self-attention as Python loops over queries and keys: one scalar score at a time.

The textbook baseline (``AttentionFromDsy``): every (query, key) pair costs a handful of
interpreter round-trips and tiny kernel launches, which is exactly what it is here to show.
"""

from __future__ import annotations

import torch

from attnbench.variants.base import GqaMode, Variant

__all__ = ["LoopAttention"]


class LoopAttention(Variant):
    """For each (b, h, i): score every key j as a scalar, softmax, then sum ``p_j * v_j``.

    Letters: B batch, H heads, Lq queries, Lk keys, D head dim, Dv value head dim.
    """

    time_exponent = 2.0
    memory_exponent = 1.0  # one row of Lk scores alive at a time
    source = "Python loops, one scalar score at a time (AttentionFromDsy); Bahdanau et al. 2015"
    SCORE_BUFFERS = 0.0
    SUPPORTS_GQA = GqaMode.NATIVE  # query head h indexes key/value head h // G: no copy
    # interpreter cost per (query, key) pair, for time predictions: an order of magnitude measured
    # on a 2-core CPU machine (2026-11-22)
    SECONDS_PER_PAIR = 20e-6
    # torch.dot and the scalar-times-vector accumulation carry its contractions; FlopCounterMode
    # counts neither, so its FLOPs are checked against an instrumented count instead.
    OPAQUE_KERNELS = frozenset({"aten.dot", "aten.mul", "aten.add"})

    def executed_pairs(self, spec):  # noqa: D102 - masked keys are skipped, never scored
        return min(spec.allowed_pairs(), spec.lq * spec.lk)

    def scores_visible(self, spec):
        return False

    def scratch_elements(self, spec):  # noqa: D102 - two rows of Lk scalars per query
        return 2.0 * spec.lk

    def forward(self, q, k, v, mask):
        b_sz, h_sz, lq, d = q.shape
        lk = k.shape[2]
        g = h_sz // k.shape[1]  # query heads per key/value head
        scale = self.scale_for(d)
        allowed = None if mask is None else mask.expand(b_sz, h_sz, lq, lk)
        rows = []
        for b in range(b_sz):
            for h in range(h_sz):
                # (Lq, D), (Lk, D), (Lk, Dv): 2-D Q, K, V per (b, h)
                q_bh, k_bh, v_bh = q[b, h], k[b, h // g], v[b, h // g]
                for i in range(lq):
                    keep = None if allowed is None else allowed[b, h, i].tolist()
                    q_i = q_bh[i]  # (D,)
                    scores, kept = [], []
                    for j in range(lk):
                        if keep is None or keep[j]:
                            scores.append(torch.dot(q_i, k_bh[j]) * scale)  # one scalar score
                            kept.append(j)
                    out_i = torch.zeros(v.shape[-1], dtype=v.dtype, device=v.device)  # (Dv,)
                    if kept:
                        probs = torch.softmax(torch.stack(scores), dim=0)  # (n_kept,)
                        for p, j in zip(probs, kept, strict=True):
                            out_i = out_i + p * v_bh[j]
                    rows.append(out_i)
        return torch.stack(rows).view(b_sz, h_sz, lq, v.shape[-1])  # (B, H, Lq, Dv)
