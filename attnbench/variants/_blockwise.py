"""Attention over gathered key blocks: the engine behind ``local`` and ``block_sparse``.

Queries are cut into blocks of ``block`` rows. Query block n attends to the keys listed in
``key_index[n]`` (a fixed number ``Nk`` per block, padded with invalid entries), so scores are
``(B, H, Nb, block, Nk)``: O(L * Nk) time and memory instead of O(L^2). A per-element
``predicate(query_pos, key_pos)`` (e.g. a band) and the caller's mask are applied to the gathered
positions only. A mask given as a :class:`~attnbench.mask_mods.MaskMod` is evaluated on those
positions (:func:`_mod_at`), so no dense (Lq, Lk) tensor exists at any point; a dense boolean mask
is read at the gathered positions (:func:`_gather_mask`, which indexes full mask rows).

Letters: B batch, H heads, Lq queries, Lk keys, D head dim, Dv value head dim,
Nb query blocks, Nk keys gathered per block.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from attnbench.mask_mods import MaskMod

__all__ = ["gathered_block_attention"]

_Predicate = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _gather_mask(mask: torch.Tensor, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
    """Read a rank-4 broadcastable mask at gathered positions.

    Args:
        mask: ``(B?, H?, Lq?, Lk)`` bool (a ? axis may be 1).
        q_pos: ``(Nb, blk)`` query positions, already clamped to the valid range.
        k_pos: ``(Nb, Nk)`` key positions, already clamped.

    Returns:
        ``(B?, H?, Nb, blk, Nk)`` bool (``blk`` is 1 when the mask is a key-padding mask).
    """
    if mask.shape[-2] == 1:
        return mask[:, :, 0][:, :, k_pos].unsqueeze(-2)  # (B?, H?, Nb, 1, Nk)
    rows = mask[:, :, q_pos]  # (B?, H?, Nb, blk, Lk)
    index = k_pos[:, None, :].expand(q_pos.shape[0], q_pos.shape[1], k_pos.shape[1])
    index = index.expand(rows.shape[0], rows.shape[1], *index.shape)  # (B?, H?, Nb, blk, Nk)
    return rows.gather(-1, index)


def _mod_at(
    mod: MaskMod, batch: int, heads: int, q_pos: torch.Tensor, k_pos: torch.Tensor
) -> torch.Tensor:
    """Evaluate a predicate at gathered positions only (no dense mask row is ever built).

    Args:
        mod: the mask predicate.
        batch: B; heads: H (used only when the predicate depends on them).
        q_pos: ``(Nb, blk)`` query positions, already clamped to the valid range.
        k_pos: ``(Nb, Nk)`` key positions, already clamped.

    Returns:
        ``(B?, H?, Nb, blk, Nk)`` bool.
    """
    device = q_pos.device
    b = torch.arange(batch if mod.uses_batch else 1, device=device).view(-1, 1, 1, 1, 1)
    h = torch.arange(heads if mod.uses_head else 1, device=device).view(1, -1, 1, 1, 1)
    qi = q_pos[None, None, :, :, None]  # (1, 1, Nb, blk, 1)
    ki = k_pos[None, None, :, None, :]  # (1, 1, Nb, 1, Nk)
    return mod.fn(b, h, qi, ki)


def gathered_block_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None,
    *,
    block: int,
    key_index: torch.Tensor,
    key_valid: torch.Tensor,
    scale: float,
    predicate: _Predicate | None = None,
    q_offset: int = 0,
) -> torch.Tensor:
    """Blockwise attention of ``q`` over per-block gathered keys.

    Args:
        q: ``(B, H, Lq', D)`` queries, positions ``q_offset .. q_offset + Lq' - 1``.
        k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)``.
        mask: rank-4 bool mask over the *full* query range, a predicate, or None.
        block: query rows per block; ``Nb = ceil(Lq' / block)`` must equal ``key_index.shape[0]``.
        key_index: ``(Nb, Nk)`` long key positions (any value where ``key_valid`` is False).
        key_valid: ``(Nb, Nk)`` bool.
        scale: score multiplier.
        predicate: optional ``f(q_pos (Nb, blk, 1), k_pos (Nb, 1, Nk)) -> bool`` restriction.
        q_offset: absolute position of ``q``'s first row.

    Returns:
        ``(B, H, Lq', Dv)``; rows with no allowed key are zero.
    """
    b, h, lq, d = q.shape
    lk = k.shape[2]
    nb = key_index.shape[0]
    pad = nb * block - lq
    q_blocks = F.pad(q, (0, 0, 0, pad)).view(b, h, nb, block, d)  # (B, H, Nb, blk, D)
    k_pos = key_index.clamp(0, lk - 1)  # (Nb, Nk)
    k_blocks = k[:, :, k_pos]  # (B, H, Nb, Nk, D)
    v_blocks = v[:, :, k_pos]  # (B, H, Nb, Nk, Dv)
    scores = torch.matmul(q_blocks, k_blocks.transpose(-2, -1)).mul_(scale)  # (B, H, Nb, blk, Nk)

    q_abs = q_offset + torch.arange(nb * block, device=q.device).view(nb, block)  # (Nb, blk)
    allowed = key_valid[:, None, :] & (q_abs < q_offset + lq)[:, :, None]  # (Nb, blk, Nk)
    if predicate is not None:
        allowed = allowed & predicate(q_abs[:, :, None], key_index[:, None, :])
    if mask is not None:
        q_clamped = q_abs.clamp(max=q_offset + lq - 1)
        if isinstance(mask, MaskMod):
            allowed = allowed & _mod_at(mask, b, h, q_clamped, k_pos)  # (B?, H?, Nb, blk, Nk)
        else:
            allowed = allowed & _gather_mask(mask, q_clamped, k_pos)  # (B?, H?, Nb, blk, Nk)

    scores.masked_fill_(~allowed, torch.finfo(scores.dtype).min)
    probs = torch.softmax(scores, dim=-1)  # (B, H, Nb, blk, Nk)
    out = torch.matmul(probs, v_blocks)  # (B, H, Nb, blk, Dv)
    out = out.masked_fill(~allowed.any(dim=-1, keepdim=True), 0.0)
    return out.view(b, h, nb * block, -1)[:, :, :lq]  # (B, H, Lq', Dv)
