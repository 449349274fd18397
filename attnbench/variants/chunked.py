"""Exact attention in query/key blocks with an online (streaming) softmax.

Each query block keeps a running maximum ``m``, a running normaliser ``l`` and an unnormalised
accumulator; every key block rescales them (Milakov & Gimelshein 2018; Rabe & Staats 2021;
FlashAttention's outer loop, Dao et al. 2022). Peak extra memory is one ``(q_chunk, k_chunk)``
score block per (B, H) plus the running statistics: linear in sequence length.

Letters: B batch, H heads, Lq queries, Lk keys, D head dim, Dv value head dim, C chunk sizes.
"""

from __future__ import annotations

import torch

from attnbench._checks import check_positive_int
from attnbench.variants.base import Variant


def _rows(mask: torch.Tensor | None, start: int, stop: int, axis: int) -> torch.Tensor | None:
    """Slice a broadcastable mask along ``axis`` unless that axis is broadcast (size 1)."""
    if mask is None or mask.shape[axis] == 1:
        return mask
    return mask.narrow(axis, start, stop - start)


class ChunkedAttention(Variant):
    """Blockwise exact attention; ``q_chunk`` and ``k_chunk`` set the block sizes."""

    memory_exponent = 1.0
    source = "Rabe & Staats 2021 (self-attention does not need O(n^2) memory)"

    def __init__(self, q_chunk: int = 256, k_chunk: int = 256, scale: float | None = None) -> None:
        super().__init__(scale)
        self.q_chunk = check_positive_int("q_chunk", q_chunk)
        self.k_chunk = check_positive_int("k_chunk", k_chunk)

    def scratch_elements(self, spec):  # noqa: D102 - 3 score-block buffers + running state
        cq, ck = min(self.q_chunk, spec.lq), min(self.k_chunk, spec.lk)
        return spec.batch * spec.heads * (3 * cq * ck + 2 * cq * (spec.dv + 2))

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[-1]
        scale = self.scale_for(d)
        neg_inf = float("-inf")
        out = torch.empty(b, h, lq, dv, dtype=q.dtype, device=q.device)
        for qs in range(0, lq, self.q_chunk):
            qe = min(qs + self.q_chunk, lq)
            q_blk = q[:, :, qs:qe] * scale  # (B, H, Cq, D)
            mask_q = _rows(mask, qs, qe, -2)
            run_max = torch.full((b, h, qe - qs, 1), neg_inf, dtype=q.dtype, device=q.device)
            run_sum = torch.zeros_like(run_max)  # (B, H, Cq, 1)
            acc = torch.zeros(b, h, qe - qs, dv, dtype=q.dtype, device=q.device)  # (B, H, Cq, Dv)
            for ks in range(0, lk, self.k_chunk):
                ke = min(ks + self.k_chunk, lk)
                scores = q_blk @ k[:, :, ks:ke].transpose(-2, -1)  # (B, H, Cq, Ck)
                mask_qk = _rows(mask_q, ks, ke, -1)
                if mask_qk is not None:
                    scores = scores.masked_fill(~mask_qk, neg_inf)
                new_max = torch.maximum(run_max, scores.amax(dim=-1, keepdim=True))  # (B, H, Cq, 1)
                # A row that has seen only masked keys keeps max -inf; shift by 0 so exp() gives 0, not NaN.
                shift = torch.where(torch.isinf(new_max), 0.0, new_max)
                probs = torch.exp(scores - shift)  # (B, H, Cq, Ck), unnormalised
                rescale = torch.exp(run_max - shift)  # (B, H, Cq, 1)
                run_sum = run_sum * rescale + probs.sum(dim=-1, keepdim=True)
                acc = acc * rescale + probs @ v[:, :, ks:ke]  # (B, H, Cq, Dv)
                run_max = new_max
            # Rows with no allowed key have run_sum == 0 and acc == 0: the output row is zero.
            out[:, :, qs:qe] = acc / torch.where(run_sum > 0, run_sum, 1.0)
        return out
