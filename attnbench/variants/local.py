"""Sliding-window (local) attention in O(L * w) time and memory.

Query i attends to keys j with ``|i - j| <= window`` (intersected with any mask given; pass a
causal mask for the look-back-only window of Longformer/Mistral). Queries are processed in blocks
of ``window`` rows, each against the ``3 * window`` keys that can reach it; the mask, taken as a
predicate, is evaluated on those gathered positions only, so no (Lq, Lk) tensor exists at any point.
"""

from __future__ import annotations

import torch

from attnbench import masks
from attnbench.reference import repeat_kv
from attnbench.variants._blockwise import gathered_block_attention
from attnbench.variants.base import GqaMode, Variant, dense_mask

__all__ = ["LocalAttention"]


class LocalAttention(Variant):
    """Banded attention; exact on its own pattern ``sliding_window(window) & mask``."""

    SUPPORTS_GQA = GqaMode.REPEAT  # k and v repeated to H heads at entry (counted in the peak)

    time_exponent = 1.0
    memory_exponent = 1.0
    SOFTMAX_ATTENTION = False  # softmax over its band only
    source = "Beltagy et al. 2020 (Longformer sliding window)"
    MASK_MODS = True  # evaluates the predicate on its gathered tiles (never a dense mask row)

    def __init__(self, window: int = 128, scale: float | None = None) -> None:
        super().__init__(scale)
        if not isinstance(window, int) or isinstance(window, bool) or window < 0:
            raise ValueError(f"window must be a non-negative int, got {window!r}")
        self.window = window

    @property
    def block(self) -> int:
        return max(self.window, 1)

    def _keys_per_block(self) -> int:
        return self.block + 2 * self.window

    def executed_pairs(self, spec):
        blocks = -(-spec.lq // self.block)
        return blocks * self.block * self._keys_per_block()

    def useful_pairs(self, spec):
        """Band pairs; with another mask, an upper bound (the smaller of the two counts)."""
        band = spec.replace(mask="sliding_window", window=self.window).allowed_pairs()
        return band if spec.mask == "none" else min(band, spec.allowed_pairs())

    def scratch_elements(self, spec):  # noqa: D102 - scores + probs + gathered K and V
        pairs = self.executed_pairs(spec) * spec.batch * spec.heads
        gathered = -(-spec.lq // self.block) * self._keys_per_block() * (spec.head_dim + spec.dv)
        return 2 * pairs + spec.batch * spec.heads * gathered

    def pattern(self, lq: int, lk: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The dense boolean pattern this variant computes exactly, ``(1, 1, Lq, Lk)``."""
        return masks.sliding_window(lq, lk, self.window, device)

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        pattern = self.pattern(q.shape[2], k.shape[2], q.device)
        return super().reference(q, k, v, masks.combine(pattern, dense_mask(mask, q, k)), dtype)

    def forward(self, q, k, v, mask):
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        lq, w, blk = q.shape[2], self.window, self.block
        nb = -(-lq // blk)
        starts = torch.arange(nb, device=q.device)[:, None] * blk - w  # (Nb, 1)
        key_index = starts + torch.arange(blk + 2 * w, device=q.device)[None, :]  # (Nb, Nk)
        key_valid = (key_index >= 0) & (key_index < k.shape[2])
        return gathered_block_attention(
            q,
            k,
            v,
            mask,
            block=blk,
            key_index=key_index,
            key_valid=key_valid,
            scale=self.scale_for(q.shape[-1]),
            predicate=lambda qp, kp: (qp - kp).abs() <= w,
        )
