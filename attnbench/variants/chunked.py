"""Exact attention in query/key blocks with an online (streaming) softmax and block skipping.

Each query block keeps a running maximum ``m``, a running normaliser ``l`` and an unnormalised
accumulator; every key block rescales them (Milakov & Gimelshein 2018; Rabe & Staats 2021;
FlashAttention's outer loop, Dao et al. 2022). Peak extra memory is one ``(q_chunk, k_chunk)``
score block per (B, H) plus the running statistics: linear in sequence length.

Given the mask as a predicate (:class:`~attnbench.mask_mods.MaskMod`, what the runner passes), each
(query block, key block) tile is classified first (:func:`~attnbench.mask_mods.block_state`, closed
form for the built-in masks): an empty tile is skipped (no matmul at all), a full tile does no mask
work, and only a partial tile evaluates the predicate on its own ``(Cq, Ck)`` indices, so no dense
mask exists. Causal attention thus executes about half the pairs of unmasked attention, plus the
diagonal tiles (:meth:`ChunkedAttention.executed_pairs` counts exactly the tiles computed). A dense
boolean tensor is still accepted (every tile is then treated as partial).

Letters: B batch, H heads, Lq queries, Lk keys, D head dim, Dv value head dim, C chunk sizes.
"""

from __future__ import annotations

import torch

from attnbench import mask_mods
from attnbench._checks import check_positive_int
from attnbench.reference import repeat_kv
from attnbench.variants.base import Variant


def _rows(mask: torch.Tensor | None, start: int, stop: int, axis: int) -> torch.Tensor | None:
    """Slice a broadcastable mask along ``axis`` unless that axis is broadcast (size 1)."""
    if mask is None or mask.shape[axis] == 1:
        return mask
    return mask.narrow(axis, start, stop - start)


def default_chunks(lq: int, lk: int, dtype: str) -> tuple[int, int]:
    """Tile sizes ``(q_chunk, k_chunk)`` for a length and dtype.

    Chosen from single-thread CPU timings at L=4096 (B1 H8 D64, float32): tiles from 128 to 512 on
    either axis timed within the machine's noise of each other, while 1024-wide query tiles or
    key tiles of 2048+ were clearly slower (score blocks fall out of cache). Longer sequences take
    512-row query tiles (fewer Python-level tile steps); reduced precision halves the bytes per
    score, so its key tiles may be twice as long (not timed separately). Short sequences use one tile.
    """
    k_chunk = 1024 if dtype in ("float16", "bfloat16") else 512
    q_chunk = 512 if lq >= 2048 else 256
    return min(q_chunk, lq), min(k_chunk, lk)


class ChunkedAttention(Variant):
    """Blockwise exact attention; ``q_chunk`` and ``k_chunk`` set the tile sizes (None: :func:`default_chunks`)."""

    memory_exponent = 1.0
    source = "Rabe & Staats 2021 (self-attention does not need O(n^2) memory)"
    MASK_MODS = True  # evaluates the predicate per tile: skips empty tiles, no mask work on full ones
    SUPPORTS_GQA = "repeat"  # k and v repeated to H heads at entry (counted in the peak)

    def __init__(self, q_chunk: int | None = None, k_chunk: int | None = None, scale: float | None = None) -> None:
        super().__init__(scale)
        self.q_chunk = None if q_chunk is None else check_positive_int("q_chunk", q_chunk)
        self.k_chunk = None if k_chunk is None else check_positive_int("k_chunk", k_chunk)

    def chunks(self, lq: int, lk: int, dtype: str) -> tuple[int, int]:
        """The tile sizes used for these lengths and dtype (explicit ones win over the tuned defaults)."""
        cq, ck = default_chunks(lq, lk, dtype)
        return min(self.q_chunk or cq, lq), min(self.k_chunk or ck, lk)

    def _tile_states(self, mod: mask_mods.MaskMod | None, batch: int, heads: int, lq: int, lk: int, dtype: str):
        """``[(q0, q1, [(k0, k1, state), ...]), ...]`` over the tile grid; empty tiles left out."""
        cq, ck = self.chunks(lq, lk, dtype)
        grid = []
        for q0 in range(0, lq, cq):
            q1 = min(q0 + cq, lq)
            row = []
            for k0 in range(0, lk, ck):
                k1 = min(k0 + ck, lk)
                state = mask_mods.FULL if mod is None else mask_mods.block_state(mod, batch, heads, q0, q1, k0, k1)
                if state != mask_mods.EMPTY:
                    row.append((k0, k1, state))
            grid.append((q0, q1, row))
        return grid

    def executed_pairs(self, spec):
        """Pairs in the tiles computed: every non-empty tile of the predicate (O((L/C)^2) work)."""
        if self.mask_form(spec) != "mod":
            return spec.lq * spec.lk
        mod = spec.mask_mod(device="cpu")
        grid = self._tile_states(mod, spec.batch, spec.heads, spec.lq, spec.lk, spec.dtype)
        return sum((q1 - q0) * (k1 - k0) for q0, q1, row in grid for k0, k1, _ in row)

    def scratch_elements(self, spec):  # noqa: D102 - 2 score-block buffers + running state
        cq, ck = self.chunks(spec.lq, spec.lk, spec.dtype)
        return spec.batch * spec.heads * (2 * cq * ck + 3 * cq * (spec.dv + 2))

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        k, v = repeat_kv(k, v, h)  # (B, H, Lk, D), (B, H, Lk, Dv)
        lk, dv = k.shape[2], v.shape[-1]
        dtype = str(q.dtype).removeprefix("torch.")
        mod = mask if isinstance(mask, mask_mods.MaskMod) else None
        dense = None if mod is not None else mask
        if dense is None:
            grid = self._tile_states(mod, b, h, lq, lk, dtype)
        else:  # a dense tensor: every tile is partial (no skipping without reading the whole mask)
            grid = [(q0, q1, [(k0, k1, mask_mods.PARTIAL) for k0, k1, _ in row])
                    for q0, q1, row in self._tile_states(None, b, h, lq, lk, dtype)]
        # In-place updates save temporaries, but autograd needs the originals: out of place when differentiating.
        inplace = not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad))
        q = q * self.scale_for(d)  # (B, H, Lq, D), scaled once
        kt = k.transpose(-2, -1)  # (B, H, D, Lk)
        out = torch.zeros(b, h, lq, dv, dtype=q.dtype, device=q.device)
        for q0, q1, row in grid:
            if not row:
                continue  # every key masked for this block: output rows stay zero
            q_blk = q[:, :, q0:q1]  # (B, H, Cq, D)
            mask_q = _rows(dense, q0, q1, -2)
            run_max = run_sum = acc = None
            for k0, k1, state in row:
                scores = torch.matmul(q_blk, kt[..., k0:k1])  # (B, H, Cq, Ck)
                partial = state == mask_mods.PARTIAL
                if partial:
                    allowed = (mask_mods.tile(mod, b, h, q0, q1, k0, k1, q.device) if mod is not None
                               else _rows(mask_q, k0, k1, -1))  # (B?, H?, Cq?, Ck)
                    scores = (scores.masked_fill_ if inplace else scores.masked_fill)(~allowed, float("-inf"))
                tile_max = scores.amax(dim=-1, keepdim=True)  # (B, H, Cq, 1)
                new_max = tile_max if run_max is None else torch.maximum(run_max, tile_max)
                # A row that has seen only masked keys keeps max -inf: shift it by 0 so exp() gives 0, not NaN.
                shift = torch.where(torch.isinf(new_max), 0.0, new_max) if partial or run_max is None else new_max
                probs = scores.sub_(shift).exp_() if inplace else torch.exp(scores - shift)  # (B, H, Cq, Ck), unnormalised
                block_sum = probs.sum(dim=-1, keepdim=True)  # (B, H, Cq, 1)
                block_out = torch.matmul(probs, v[:, :, k0:k1])  # (B, H, Cq, Dv)
                if run_max is None:
                    run_sum, acc = block_sum, block_out
                else:
                    rescale = torch.exp(run_max - shift)  # (B, H, Cq, 1); 0 where run_max is -inf
                    if inplace:
                        run_sum = run_sum.mul_(rescale).add_(block_sum)
                        acc = acc.mul_(rescale).add_(block_out)
                    else:
                        run_sum = run_sum * rescale + block_sum
                        acc = acc * rescale + block_out
                run_max = new_max
            # Rows with no allowed key have run_sum == 0 and acc == 0: the output row is zero.
            out[:, :, q0:q1] = acc / torch.where(run_sum > 0, run_sum, 1.0)
        return out
