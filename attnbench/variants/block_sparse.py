"""BigBird/Longformer-style block-sparse attention, computed blockwise.

The sequence is cut into blocks of ``block`` tokens. Query block r attends to key block c when:
  * global: r < ``global_blocks`` (global queries see everything) or c < ``global_blocks``
    (every query sees the global tokens);
  * window: ``|r - c| <= window_blocks``;
  * random: c is one of ``random_blocks`` blocks drawn per row from a generator seeded with
    ``seed`` (fixed per sequence length, so the pattern is reproducible).
Global query rows are computed densely (O(g * L)); every other query block gathers a fixed
number of key blocks, so time and memory are O(L). The variant is exact on its own pattern:
``reference_attention(q, k, v, mask & pattern)``.

Letters: B batch, H heads, L sequence length, D head dim, Nb blocks, Nk gathered keys per block.
"""

from __future__ import annotations

import functools

import torch

from attnbench import masks
from attnbench._checks import check_positive_int, check_seed
from attnbench.mask_mods import MaskMod, tile
from attnbench.reference import repeat_kv
from attnbench.variants._blockwise import gathered_block_attention
from attnbench.variants._ops import masked_softmax_, zero_empty_rows
from attnbench.variants.base import GqaMode, Variant, dense_mask

__all__ = ["block_pattern", "BlockSparseAttention"]

_MAX_PATTERN_BLOCKS = 2**14
"""Most blocks per side of the ``(Nb, Nb)`` pattern this variant builds (256 MiB of bools, seconds
to draw): longer sequences are declared unsupported (L <= 16384 x block: 1,048,576 at the default
block of 64)."""


@functools.lru_cache(maxsize=64)
def block_pattern(
    num_blocks: int, global_blocks: int, window_blocks: int, random_blocks: int, seed: int
) -> torch.Tensor:
    """``(Nb, Nb)`` bool block-level pattern (see the module docstring)."""
    r = torch.arange(num_blocks)[:, None]
    c = torch.arange(num_blocks)[None, :]
    pattern = ((r - c).abs() <= window_blocks) | (r < global_blocks) | (c < global_blocks)
    gen = torch.Generator().manual_seed(seed)
    for row in range(global_blocks, num_blocks):
        free = (~pattern[row]).nonzero().flatten()
        if len(free) and random_blocks:
            pick = free[torch.randperm(len(free), generator=gen)[:random_blocks]]
            pattern[row, pick] = True
    return pattern


class BlockSparseAttention(Variant):
    """Local blocks + global tokens + random blocks (BigBird ITC); self-attention only."""

    SUPPORTS_GQA = GqaMode.REPEAT  # k and v repeated to H heads at entry (counted in the peak)

    time_exponent = 1.0
    memory_exponent = 1.0
    SOFTMAX_ATTENTION = False  # softmax over its sparse pattern only
    source = "Zaheer et al. 2020 (BigBird); Beltagy et al. 2020 (Longformer)"
    SUPPORTS_CROSS = False
    MASK_MODS = True  # evaluates the predicate on its gathered tiles (never a dense mask row)

    def __init__(
        self,
        block: int = 64,
        global_blocks: int = 1,
        window_blocks: int = 1,
        random_blocks: int = 2,
        seed: int = 0,
        scale: float | None = None,
    ) -> None:
        super().__init__(scale)
        self.block = check_positive_int("block", block)
        for name, value in (
            ("global_blocks", global_blocks),
            ("window_blocks", window_blocks),
            ("random_blocks", random_blocks),
        ):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ValueError(f"{name} must be a non-negative int, got {value!r}")
        self.global_blocks, self.window_blocks, self.random_blocks = (
            global_blocks,
            window_blocks,
            random_blocks,
        )
        self.seed = check_seed(seed)

    def blocks(self, length: int) -> torch.Tensor:
        return block_pattern(
            -(-length // self.block),
            self.global_blocks,
            self.window_blocks,
            self.random_blocks,
            self.seed,
        )

    def pattern(self, lq: int, lk: int, device: torch.device | str = "cpu") -> torch.Tensor:
        """The dense boolean pattern this variant computes exactly, ``(1, 1, L, L)``."""
        if lq != lk:
            raise ValueError(f"block_sparse is self-attention only: Lq={lq} != Lk={lk}")
        dense = self.blocks(lq).repeat_interleave(self.block, 0).repeat_interleave(self.block, 1)
        return dense[:lq, :lk].to(device)[None, None]

    def reference(self, q, k, v, mask=None, dtype=torch.float64):
        k, v = repeat_kv(k, v, q.shape[1])  # (B, H, Lk, D), (B, H, Lk, Dv)
        pattern = self.pattern(q.shape[2], k.shape[2], q.device)
        return super().reference(q, k, v, masks.combine(pattern, dense_mask(mask, q, k)), dtype)

    def _key_table(self, length: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """Per non-global query block, the gathered key positions ``(Nb', Nk)`` and validity."""
        pattern = self.blocks(length)[self.global_blocks :]  # (Nb', Nb)
        width = int(pattern.sum(1).max()) if len(pattern) else 0
        # Allowed block ids first (stable sort keeps them in order), then padding: (Nb', W).
        order = torch.sort((~pattern).to(torch.int8), dim=1, stable=True).indices[:, :width]
        block_valid = pattern.gather(1, order)  # (Nb', W)
        offsets = torch.arange(self.block)
        key_index = (order[:, :, None] * self.block + offsets).flatten(1)  # (Nb', W*blk)
        key_valid = block_valid.repeat_interleave(self.block, 1) & (key_index < length)
        return key_index.to(device), key_valid.to(device)

    def extra_reasons(self, call):
        nb = -(-call.lq // self.block)
        if nb > _MAX_PATTERN_BLOCKS:
            return [
                f"L={call.lq} is {nb} blocks of {self.block}: block_sparse draws an (Nb x Nb) "
                f"block pattern, at most {_MAX_PATTERN_BLOCKS} blocks "
                f"(L <= {_MAX_PATTERN_BLOCKS * self.block})"
            ]
        return []

    # The cost model counts the pattern without drawing it (O(1) in the length). A non-global row
    # r holds its window and the global columns, plus min(random_blocks, free) random columns:
    # min(Nb, union + random_blocks), which is piecewise linear in r with kinks where the window
    # meets an edge (r = w, r = Nb - 1 - w) or leaves the global columns (r = g + w).
    def _row_blocks(self, nb: int, r: int, cap: bool = True) -> int:
        """Key blocks in row ``r`` (``global_blocks <= r < Nb``) of :func:`block_pattern`, undrawn.

        ``cap=False``: window and global columns plus ``random_blocks``, before the cap at Nb.
        """
        g, w = min(self.global_blocks, nb), self.window_blocks
        lo, hi = max(0, r - w), min(nb - 1, r + w)
        # window + global columns, shared ones once
        union = (hi - lo + 1) + g - max(0, min(g - 1, hi) - lo + 1)
        return min(nb, union + self.random_blocks) if cap else union + self.random_blocks

    def _row_pieces(self, nb: int) -> list[tuple[int, int]]:
        """Ranges ``[a, b]`` of non-global rows on each of which the uncapped count is linear."""
        g, w = min(self.global_blocks, nb), self.window_blocks
        cuts = sorted({g, nb} | {k + 1 for k in (w, nb - 1 - w, g + w) if g < k + 1 < nb})
        return [(a, end - 1) for a, end in zip(cuts[:-1], cuts[1:], strict=True) if a < end]

    def _row_sum(self, nb: int) -> int:
        """O(1) sum of :meth:`_row_blocks` over non-global rows: ``min(Nb, h0 + s*t)`` per piece."""
        total = 0
        for a, b in self._row_pieces(nb):
            n, h0 = b - a + 1, self._row_blocks(nb, a, cap=False)
            slope = (self._row_blocks(nb, b, cap=False) - h0) // (b - a) if b > a else 0
            if slope == 0:
                total += n * min(nb, h0)
            elif slope > 0:  # the first c rows stay at or below the cap
                c = min(n, max(0, (nb - h0) // slope + 1))
                total += c * h0 + slope * c * (c - 1) // 2 + (n - c) * nb
            else:  # the first c rows are above the cap
                c = min(n, max(0, -(-(h0 - nb) // -slope)))
                total += c * nb + (n - c) * h0 + slope * (n * (n - 1) // 2 - c * (c - 1) // 2)
        return total

    def _split(self, spec) -> tuple[int, int, int]:
        """(global rows, non-global query blocks, key blocks gathered per such block), in O(1).

        The widest non-global row of the pattern; a piecewise-linear count peaks at a piece's end.
        """
        nb = -(-spec.lq // self.block)
        g = min(self.global_blocks, nb)
        width = max(
            (self._row_blocks(nb, r) for piece in self._row_pieces(nb) for r in piece), default=0
        )
        return min(g * self.block, spec.lq), nb - g, width

    def executed_pairs(self, spec):
        global_rows, blocks, width = self._split(spec)
        return global_rows * spec.lk + blocks * self.block * width * self.block

    def pattern_pairs(self, length: int) -> int:
        """Pattern (query, key) pairs: O(1) if ``block`` divides L, else O(Nb^2), never O(L^2).

        Block r holds ``size[r]`` tokens (the last block may be partial), so the count is
        ``size^T P size`` for the ``(Nb, Nb)`` block pattern ``P``. With every block full that is
        ``block^2`` times the pattern's cells, counted without drawing it (:meth:`_row_sum`). A
        partial last block needs the random draws that hit it, so the pattern is drawn; beyond
        :data:`_MAX_PATTERN_BLOCKS` (a length this variant refuses) the full-block count is
        returned, an upper bound.
        """
        nb = -(-length // self.block)
        if length % self.block == 0 or nb > _MAX_PATTERN_BLOCKS:
            return self.block * self.block * (min(self.global_blocks, nb) * nb + self._row_sum(nb))
        blocks = self.blocks(length)  # (Nb, Nb) bool
        nb = blocks.shape[0]
        size = torch.full((nb,), self.block, dtype=torch.float64)
        size[-1] = length - (nb - 1) * self.block
        return int(round(float(size @ blocks.to(torch.float64) @ size)))

    def useful_pairs(self, spec):
        """Pattern pairs; with another mask, an upper bound (the smaller of the two counts)."""
        pattern_pairs = self.pattern_pairs(spec.lq)
        return pattern_pairs if spec.mask == "none" else min(pattern_pairs, spec.allowed_pairs())

    def scratch_elements(self, spec):  # noqa: D102 - scores + probs + gathered K and V
        _, blocks, width = self._split(spec)
        gathered = blocks * width * self.block * (spec.head_dim + spec.dv)
        return spec.batch * spec.heads * (2 * self.executed_pairs(spec) + gathered)

    def forward(self, q, k, v, mask):
        b, h, length, d = q.shape
        k, v = repeat_kv(k, v, h)  # (B, H, Lk, D), (B, H, Lk, Dv)
        scale = self.scale_for(d)
        n_global = min(self.global_blocks * self.block, length)
        out = torch.empty(b, h, length, v.shape[-1], dtype=q.dtype, device=q.device)
        if n_global:
            scores = (q[:, :, :n_global] @ k.transpose(-2, -1)).mul_(scale)  # (B, H, G, L)
            if isinstance(mask, MaskMod):  # the global rows' own (G, L) predicate values
                mask_g = tile(mask, b, h, 0, n_global, 0, length, q.device)  # (B?, H?, G?, L)
            else:
                mask_g = mask if mask is None or mask.shape[-2] == 1 else mask[:, :, :n_global]
            out[:, :, :n_global] = zero_empty_rows(masked_softmax_(scores, mask_g) @ v, mask_g)
        if n_global < length:
            key_index, key_valid = self._key_table(length, q.device)
            out[:, :, n_global:] = gathered_block_attention(
                q[:, :, n_global:],
                k,
                v,
                mask,
                block=self.block,
                key_index=key_index,
                key_valid=key_valid,
                scale=scale,
                q_offset=n_global,
            )
        return out
