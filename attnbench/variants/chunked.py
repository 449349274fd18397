"""Exact attention in query/key blocks with an online (streaming) softmax and block skipping.

Each query block keeps a running maximum, a running normaliser and an unnormalised accumulator
that every key block rescales (Milakov & Gimelshein 2018; Rabe & Staats 2021; FlashAttention's
outer loop, Dao et al. 2022). Extra memory is the scaled queries, one ``(q_chunk, k_chunk)`` score
block per (B, H) (reused by every tile when autograd is off) and the running statistics: linear
in L. Probabilities are computed in base 2 (``exp2``, with ``log2(e)`` folded into the query
scale), the cheaper CPU kernel. Given the mask as a predicate (what the runner passes), each tile
is classified first (:func:`~attnbench.mask_mods.block_state`): an empty tile is skipped, a full
one does no mask work, and only a partial one evaluates the predicate on its own indices, so
causal executes about half the pairs (:meth:`ChunkedAttention.executed_pairs` counts the tiles
computed). A dense boolean tensor is accepted too (every tile is then partial).

Letters: B batch, H heads, Lq queries, Lk keys, D head dim, Dv value head dim, C chunk sizes.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from attnbench import mask_mods
from attnbench._checks import check_positive_int
from attnbench.reference import repeat_kv
from attnbench.spec import MaskForm
from attnbench.variants.base import GqaMode, Variant

__all__ = ["default_chunks", "ChunkedAttention"]

_LOG2_E = math.log2(math.e)


def _rows(mask: torch.Tensor | None, start: int, stop: int, axis: int) -> torch.Tensor | None:
    """Slice a broadcastable mask along ``axis`` unless that axis is broadcast (size 1)."""
    if mask is None or mask.shape[axis] == 1:
        return mask
    return mask.narrow(axis, start, stop - start)


def _buffer(flat: torch.Tensor, *shape: int) -> torch.Tensor:
    """A contiguous ``shape`` view of the front of a flat scratch buffer."""
    return flat[: shape[0] * shape[1] * shape[2]].view(shape)


class _Scratch(NamedTuple):
    """The flat buffers every tile of a no-autograd forward reuses."""

    scores: torch.Tensor  # B*H*Cq*Ck elements: one score tile
    acc: torch.Tensor  # B*H*Cq*Dv elements: one query block's accumulator


class _Running(NamedTuple):
    """A query block's online softmax after the key tiles so far (unnormalised)."""

    # (B*H, Cq, 1) row maxima of the base-2 scores; -inf where every key was masked
    run_max: torch.Tensor
    run_sum: torch.Tensor  # (B*H, Cq, 1) sums of exp2(score - run_max)
    acc: torch.Tensor  # (B*H, Cq, Dv) those weights times the values


def _tile_mask(mask, b: int, h: int, q0: int, q1: int, device):
    """``(k0, k1) -> allowed (B?, H?, Cq?, Ck)``: the mask on a tile of query block ``[q0, q1)``."""
    if isinstance(mask, mask_mods.MaskMod):
        return lambda k0, k1: mask_mods.tile(mask, b, h, q0, q1, k0, k1, device)
    mask_q = _rows(mask, q0, q1, -2)
    return lambda k0, k1: _rows(mask_q, k0, k1, -1)


def _attend_row(q_blk, k, v, row, allowed, b: int, h: int, scratch: _Scratch | None) -> _Running:
    """Fold the key tiles of one query block into its online softmax, in place when ``scratch``.

    Args:
        q_blk: ``(B*H, Cq, D)`` scaled queries; k: ``(B*H, Lk, D)``; v: ``(B*H, Lk, Dv)``.
        row: the block's ``(k0, k1, state)`` tiles (at least one); allowed: :func:`_tile_mask`'s.
        b, h: B and H, to view the scores as ``(B, H, Cq, Ck)`` for the mask.
    """
    bh, cq = q_blk.shape[0], q_blk.shape[1]
    reuse = scratch is not None
    run = None
    for k0, k1, state in row:
        out = None if scratch is None else _buffer(scratch.scores, bh, cq, k1 - k0)
        scores = torch.bmm(q_blk, k[:, k0:k1].transpose(1, 2), out=out)  # (B*H, Cq, Ck)
        partial = state == mask_mods.TileState.PARTIAL
        if partial:
            scores4 = scores.view(b, h, cq, k1 - k0)  # (B, H, Cq, Ck)
            scores4 = (scores4.masked_fill_ if reuse else scores4.masked_fill)(
                ~allowed(k0, k1), float("-inf")
            )
            scores = scores4.view(bh, cq, k1 - k0)  # (B*H, Cq, Ck)
        run = _fold_tile(run, scores, v[:, k0:k1], partial, scratch)
    return run


def _fold_tile(
    run: _Running | None, scores, v_blk, partial: bool, scratch: _Scratch | None
) -> _Running:
    """``run`` rescaled to the new row maxima plus a tile's ``scores`` (B*H, Cq, Ck) and values."""
    reuse = scratch is not None
    tile_max = scores.amax(dim=-1, keepdim=True)  # (B*H, Cq, 1)
    new_max = tile_max if run is None else torch.maximum(run.run_max, tile_max)
    # A row that has seen only masked keys keeps max -inf: shift it by 0 so exp() gives 0, not NaN.
    shift = torch.where(torch.isinf(new_max), 0.0, new_max) if partial or run is None else new_max
    # unnormalised probabilities, (B*H, Cq, Ck)
    probs = scores.sub_(shift).exp2_() if reuse else torch.exp2(scores - shift)
    block_sum = probs.sum(dim=-1, keepdim=True)  # (B*H, Cq, 1)
    if run is None:
        acc_out = (
            None if scratch is None else _buffer(scratch.acc, *scores.shape[:2], v_blk.shape[-1])
        )
        # the accumulator starts as probs @ v_blk, (B*H, Cq, Dv)
        return _Running(new_max, block_sum, torch.bmm(probs, v_blk, out=acc_out))
    rescale = torch.exp2(run.run_max - shift)  # (B*H, Cq, 1); 0 where run_max is -inf
    if reuse:
        run_sum = run.run_sum.mul_(rescale).add_(block_sum)
        # acc * rescale + probs @ v_blk
        acc = torch.baddbmm(run.acc.mul_(rescale), probs, v_blk, out=run.acc)
    else:
        run_sum = run.run_sum * rescale + block_sum
        acc = torch.baddbmm(run.acc * rescale, probs, v_blk)  # (B*H, Cq, Dv)
    return _Running(new_max, run_sum, acc)


_Q_CHUNK = 256
"""Query rows per tile by default (and the width of the key blocks classified under a mask)."""
_TILE_BYTES = 2 * 2**20
"""Most bytes of one (batch, head) score tile by default: the key tile is as wide as this allows."""


def default_chunks(lq: int, lk: int, dtype: str, q_chunk: int | None = None) -> tuple[int, int]:
    """Tile sizes ``(q_chunk, k_chunk)`` for a length and dtype: keys as wide as 2 MiB allows.

    ``q_chunk`` rows (default :data:`_Q_CHUNK`) by as many keys as fit :data:`_TILE_BYTES` per
    (batch, head): 256 x 2048 float32, 256 x 4096 in 16-bit dtypes, so the scratch stays O(L).
    Chosen from single-thread CPU timings at L=4096 (B1 H8 D64 float32, interleaved; 2026-11-22,
    ``python -m studies.chunked_speed``): eager, tiles from 512 x 512 to 256 x 2048 timed within the
    machine's noise of each other (about 5%), 128 x 4096 slower (narrow matmuls); compiled,
    128 x 4096 was fastest, so ``compiled_chunked`` asks for 128-row tiles
    (:mod:`attnbench.variants.compiled`). Short sequences use one tile.

    Args:
        lq: query length; lk: key length; dtype: torch dtype name ("float32", ...).
        q_chunk: query rows per tile (None: :data:`_Q_CHUNK`).
    """
    rows = min(q_chunk or _Q_CHUNK, lq)
    item = torch.empty((), dtype=getattr(torch, dtype)).element_size()
    return rows, min(max(rows, _TILE_BYTES // (item * rows)), lk)


class ChunkedAttention(Variant):
    """Blockwise exact attention in ``q_chunk x k_chunk`` tiles (None: :func:`default_chunks`)."""

    memory_exponent = 1.0
    source = "Rabe & Staats 2021 (self-attention does not need O(n^2) memory)"
    # evaluates the predicate per tile: skips empty tiles, no mask work on full ones
    MASK_MODS = True
    SUPPORTS_GQA = GqaMode.REPEAT  # k and v repeated to H heads at entry (counted in the peak)
    # backward recomputes each tile (Q K^T once more): FlashAttention-2's 2.5x, not eager 2.0
    RECOMPUTES_SCORES = True

    def __init__(
        self, q_chunk: int | None = None, k_chunk: int | None = None, scale: float | None = None
    ) -> None:
        super().__init__(scale)
        self.q_chunk = None if q_chunk is None else check_positive_int("q_chunk", q_chunk)
        self.k_chunk = None if k_chunk is None else check_positive_int("k_chunk", k_chunk)

    def chunks(self, lq: int, lk: int, dtype: str) -> tuple[int, int]:
        """The tile sizes for these lengths and dtype (explicit ones win over tuned defaults)."""
        cq, ck = default_chunks(lq, lk, dtype, self.q_chunk)
        return cq, min(self.k_chunk or ck, lk)

    def _tile_states(
        self, mod: mask_mods.MaskMod | None, batch: int, heads: int, lq: int, lk: int, dtype: str
    ):
        """``[(q0, q1, [(k0, k1, state), ...]), ...]`` over the tile grid; empty tiles left out.

        Key blocks are classified ``min(q_chunk, k_chunk)`` wide (fine enough that causal skips
        about half the pairs), and each run of consecutive full blocks is merged into one tile at
        most ``k_chunk`` wide: few, wide matmuls where there is no mask work, narrow ones where
        there is.
        """
        cq, ck = self.chunks(lq, lk, dtype)
        grain = ck if mod is None else min(cq, ck)
        grid = []
        for q0 in range(0, lq, cq):
            q1 = min(q0 + cq, lq)
            row = []
            for k0 in range(0, lk, grain):
                k1 = min(k0 + grain, lk)
                state = (
                    mask_mods.TileState.FULL
                    if mod is None
                    else mask_mods.block_state(mod, batch, heads, q0, q1, k0, k1)
                )
                if state == mask_mods.TileState.EMPTY:
                    continue
                if (
                    state == mask_mods.TileState.FULL
                    and row
                    and row[-1][2] == state
                    and row[-1][1] == k0
                    and k1 - row[-1][0] <= ck
                ):
                    row[-1] = (row[-1][0], k1, state)  # widen the previous full tile
                else:
                    row.append((k0, k1, state))
            grid.append((q0, q1, row))
        return grid

    def executed_pairs(self, spec):
        """Pairs in the tiles computed: every non-empty ``Cq x min(Cq, Ck)`` tile of the predicate.

        The pairs of :meth:`_tile_states`' grid (merging full tiles changes no count), counted in
        closed form for the built-in masks (:func:`~attnbench.mask_mods.nonempty_tile_pairs`), so
        the guard answers at any length instead of walking O((L/C)^2) tiles.
        """
        if self.mask_form(spec) != MaskForm.MOD:
            return spec.lq * spec.lk
        cq, ck = self.chunks(spec.lq, spec.lk, spec.dtype)
        return mask_mods.nonempty_tile_pairs(
            spec.mask_mod(device="cpu"), spec.batch, spec.heads, spec.lq, spec.lk, cq, min(cq, ck)
        )

    def scratch_elements(self, spec):
        """No-autograd forward buffers per (B, H): scaled ``q``, a score tile, the accumulator.

        Plus a few ``(Cq, 1)`` running statistics and, under a mask, a partial tile's boolean mask
        and its negation (bytes, converted to elements); exact for causal-like predicates, an
        over-estimate (by under 2% at L=1000) for key padding, whose tile mask broadcasts over
        queries.
        """
        cq, ck = self.chunks(spec.lq, spec.lk, spec.dtype)
        per_head = spec.lq * spec.head_dim + cq * ck + cq * (spec.dv + 6)
        mask_tile = 0.0
        if spec.mask != "none":  # one partial tile: classified min(Cq, Ck) wide for a predicate
            mask_tile = (
                2
                * cq
                * (min(cq, ck) if self.mask_form(spec) == MaskForm.MOD else ck)
                / spec.elem_bytes
            )
        return spec.batch * spec.heads * per_head + mask_tile

    def _forward_grid(self, mask, b: int, h: int, lq: int, lk: int, dtype: str):
        """:meth:`_tile_states` for ``forward``'s mask; for a dense tensor, every tile partial."""
        if not isinstance(mask, torch.Tensor):
            return self._tile_states(mask, b, h, lq, lk, dtype)
        # no skipping without reading the whole mask
        return [
            (q0, q1, [(k0, k1, mask_mods.TileState.PARTIAL) for k0, k1, _ in row])
            for q0, q1, row in self._tile_states(None, b, h, lq, lk, dtype)
        ]

    def forward(self, q, k, v, mask):
        b, h, lq, d = q.shape
        k, v = repeat_kv(k, v, h)  # (B, H, Lk, D), (B, H, Lk, Dv)
        lk = k.shape[2]
        dtype = str(q.dtype).removeprefix("torch.")
        plan = _Plan(
            self._forward_grid(mask, b, h, lq, lk, dtype),
            mask,
            b,
            h,
            self.chunks(lq, lk, dtype),
            self.scale_for(d) * _LOG2_E,
        )
        differentiating = torch.is_grad_enabled() and (
            q.requires_grad or k.requires_grad or v.requires_grad
        )
        if differentiating:
            # O(L) training: the backward recomputes each tile from q, k, v, the output and the
            # row logsumexp instead of autograd keeping every tile's probabilities (O(L^2)).
            return _RecomputingAttention.apply(q, k, v, plan)
        # Without autograd, every tile reuses one score buffer and one accumulator and updates them
        # in place: no per-tile allocation (under the measurement regime each would map and fault in
        # fresh pages). torch.compile plans its own buffers: functional form.
        out, _ = _stream(q, k, v, plan, reuse=not torch.compiler.is_compiling())
        return out


class _Plan(NamedTuple):
    """What one call of the tile loop needs beyond q, k, v (the same for forward and backward)."""

    grid: list  # ChunkedAttention._tile_states' [(q0, q1, [(k0, k1, state), ...]), ...]
    mask: object  # a MaskMod, a rank-4 bool tensor or None
    b: int  # batch B
    h: int  # heads H
    chunks: tuple[int, int]  # (q_chunk, k_chunk)
    scale2: float  # the score scale times log2(e): scores in base 2


def _stream(q, k, v, plan: _Plan, reuse: bool, want_lse: bool = False):
    """The online-softmax forward over ``plan``'s tiles: ``(out (B, H, Lq, Dv), lse or None)``.

    ``lse`` (with ``want_lse``) is the base-2 row logsumexp ``(B*H, Lq, 1)`` of the scaled scores,
    ``+inf`` on rows with no allowed key (so the backward's ``exp2(s - lse)`` is 0 there).

    Args:
        q: ``(B, H, Lq, D)``; k: ``(B, H, Lk, D)``; v: ``(B, H, Lk, Dv)`` (k and v repeated to H).
        reuse: update one score buffer and one accumulator in place (no autograd through this).
    """
    b, h, lq, d = q.shape
    lk, dv = k.shape[2], v.shape[-1]
    bh = b * h
    # Scores in base 2: exp(x) == exp2(x * log2(e)), and exp2 is the cheaper kernel; log2(e)
    # rides on the scale.
    q = (q * plan.scale2).reshape(bh, lq, d)  # (B*H, Lq, D), scaled once
    k, v = k.reshape(bh, lk, d), v.reshape(bh, lk, dv)  # (B*H, Lk, D), (B*H, Lk, Dv)
    # the output (B*H, Lq, Dv), written in place per query block
    out = torch.zeros(bh, lq, dv, dtype=q.dtype, device=q.device) if reuse else None
    lse = torch.full((bh, lq, 1), math.inf, dtype=q.dtype, device=q.device) if want_lse else None
    blocks = []  # functional form: each query block's output, concatenated once at the end
    cq, ck = plan.chunks
    scratch = _Scratch(q.new_empty(bh * cq * ck), q.new_empty(bh * cq * dv)) if reuse else None
    for q0, q1, row in plan.grid:
        if not row:  # every key masked for this block: output rows stay zero
            if not reuse:
                blocks.append(q.new_zeros(bh, q1 - q0, dv))
            continue
        allowed = _tile_mask(plan.mask, b, h, q0, q1, q.device)
        run = _attend_row(q[:, q0:q1], k, v, row, allowed, b, h, scratch)
        # Rows with no allowed key have run_sum == 0 and acc == 0: the output row is zero.
        seen = run.run_sum > 0  # (B*H, Cq, 1)
        denom = torch.where(seen, run.run_sum, 1.0)  # (B*H, Cq, 1)
        if lse is not None:
            lse[:, q0:q1] = torch.where(seen, run.run_max + torch.log2(denom), math.inf)
        if reuse:
            torch.div(run.acc, denom, out=out[:, q0:q1])
        else:
            blocks.append(run.acc / denom)
    if not reuse:
        out = torch.cat(blocks, dim=1)  # (B*H, Lq, Dv)
    return out.view(b, h, lq, dv), lse  # (B, H, Lq, Dv)


class _RecomputingAttention(torch.autograd.Function):
    """Chunked attention whose backward recomputes each tile (FlashAttention-2's scheme).

    Saved for the backward: q, k, v, the output and the base-2 row logsumexp, O(L) in all. The
    backward walks the forward's tile grid (the same skipped tiles) and per tile recomputes the
    scores ``S``, the probabilities ``P = exp2(S - lse)``, then ``dV += P^T dO``,
    ``dP = dO V^T``, ``dS = P * (dP - rowsum(dO * O))``, ``dQ += dS K``, ``dK += dS^T Q``: five
    matmuls per tile against the forward's two (:data:`~attnbench.variants.base.RECOMPUTE_BACKWARD`
    on ``Q K^T``, eager 2.0 on ``P V``).
    """

    @staticmethod
    def forward(ctx, q, k, v, plan: _Plan):
        out, lse = _stream(q, k, v, plan, reuse=True, want_lse=True)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.plan = plan
        return out

    @staticmethod
    def backward(ctx, grad_out):
        q, k, v, out, lse = ctx.saved_tensors
        plan: _Plan = ctx.plan
        b, h, lq, d = q.shape
        lk, dv = k.shape[2], v.shape[-1]
        bh = b * h
        qs = (q * plan.scale2).reshape(bh, lq, d)  # (B*H, Lq, D), base-2 scaled as in forward
        kf, vf = k.reshape(bh, lk, d), v.reshape(bh, lk, dv)  # (B*H, Lk, D), (B*H, Lk, Dv)
        g = grad_out.reshape(bh, lq, dv)  # (B*H, Lq, Dv)
        # delta = rowsum(dO * O), (B*H, Lq, 1): the softmax Jacobian's correction term
        delta = (g * out.reshape(bh, lq, dv)).sum(dim=-1, keepdim=True)
        dq = torch.zeros_like(qs)  # (B*H, Lq, D), in base-2-scaled units until the end
        dk, dvv = torch.zeros_like(kf), torch.zeros_like(vf)  # (B*H, Lk, D), (B*H, Lk, Dv)
        for q0, q1, row in plan.grid:
            allowed = _tile_mask(plan.mask, b, h, q0, q1, q.device)
            rows = _Rows(qs[:, q0:q1], g[:, q0:q1], lse[:, q0:q1], delta[:, q0:q1], dq[:, q0:q1])
            for k0, k1, state in row:
                _backward_tile(rows, kf, vf, dk, dvv, (k0, k1, state), allowed, b, h)
        # S = scale * q k^T: dq = scale * dS k; dk = scale * dS^T q = dS^T qs / log2(e)
        scale = plan.scale2 / _LOG2_E
        return (
            dq.mul_(scale).view(b, h, lq, d),
            dk.mul_(1.0 / _LOG2_E).view(b, h, lk, d),
            dvv.view(b, h, lk, dv),
            None,
        )


class _Rows(NamedTuple):
    """One query block's slices for the backward (views into the whole-length tensors)."""

    qs: torch.Tensor  # (B*H, Cq, D) base-2 scaled queries
    g: torch.Tensor  # (B*H, Cq, Dv) upstream gradient dO
    lse: torch.Tensor  # (B*H, Cq, 1) base-2 row logsumexp (+inf: no allowed key)
    delta: torch.Tensor  # (B*H, Cq, 1) rowsum(dO * O)
    dq: torch.Tensor  # (B*H, Cq, D) the block's dq accumulator (a view: updated in place)


def _backward_tile(rows: _Rows, k, v, dk, dv, tile, allowed, b: int, h: int) -> None:
    """Add one recomputed tile's share to ``rows.dq``, ``dk`` and ``dv`` (in place).

    Args:
        k: ``(B*H, Lk, D)``; v: ``(B*H, Lk, Dv)``; dk, dv: their accumulators, same shapes.
        tile: ``(k0, k1, state)``; allowed: :func:`_tile_mask`'s for the block.
    """
    k0, k1, state = tile
    cq = rows.qs.shape[1]
    kb, vb = k[:, k0:k1], v[:, k0:k1]  # (B*H, Ck, D), (B*H, Ck, Dv)
    scores = torch.bmm(rows.qs, kb.transpose(1, 2))  # (B*H, Cq, Ck), base 2
    if state == mask_mods.TileState.PARTIAL:
        scores4 = scores.view(b, h, cq, k1 - k0)  # (B, H, Cq, Ck)
        scores4.masked_fill_(~allowed(k0, k1), float("-inf"))
    probs = scores.sub_(rows.lse).exp2_()  # (B*H, Cq, Ck): softmax probabilities P
    # In-place baddbmm_ would save a (Ck, Dv) temporary, but FlopCounterMode does not see it.
    dv[:, k0:k1] += torch.bmm(probs.transpose(1, 2), rows.g)  # dV += P^T dO, (B*H, Ck, Dv)
    dp = torch.bmm(rows.g, vb.transpose(1, 2))  # dP = dO V^T, (B*H, Cq, Ck)
    ds = probs.mul_(dp.sub_(rows.delta))  # dS = P * (dP - delta), (B*H, Cq, Ck)
    rows.dq.add_(torch.bmm(ds, kb))  # dQ += dS K, (B*H, Cq, D)
    dk[:, k0:k1] += torch.bmm(ds.transpose(1, 2), rows.qs)  # dK += dS^T Q, (B*H, Ck, D)
