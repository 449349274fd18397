"""Masks as named predicates over ``(batch, head, q_idx, kv_idx)``, composable with ``&`` and ``|``.

One definition feeds every consumer: the dense boolean tensor the reference and dense variants
take (:func:`dense`), the tiles blockwise engines evaluate (:func:`tile`), whether a whole tile is
empty, full or partial (:func:`block_state`, closed-form where the predicate allows, so engines
skip empty tiles and do no mask work on full ones), the count of allowed pairs that useful FLOPs
come from (:func:`allowed_pairs`, without O(L^2) work for the built-in predicates), and
FlexAttention's ``mask_mod`` (the predicate itself, :attr:`MaskMod.fn`).

Convention: True = the query may attend to the key (the SDPA convention). Indices are absolute
positions; when ``Lq != Lk``, ``causal`` is aligned to the top-left corner (query i sees keys
j <= i), as PyTorch's ``is_causal=True`` is.

Example:
    >>> m = causal() & sliding_window(1)
    >>> dense(m, batch=1, heads=1, lq=4, lk=4)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    >>> m.name
    'causal & sliding_window(1)'
    >>> allowed_pairs(m, batch=1, lq=4, lk=4)
    7
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from attnbench._checks import check_int

Predicate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``fn(b, h, q_idx, kv_idx) -> bool``, on broadcastable int64 index tensors (FlexAttention's mask_mod)."""
Bounds = Callable[[int, int, int, int], str | None]
"""``(q0, q1, k0, k1) -> "empty" | "full" | "partial"`` for the tile ``[q0, q1) x [k0, k1)``, valid for
every batch and head; None when the predicate has no closed form (the tile is then evaluated)."""

EMPTY, FULL, PARTIAL = "empty", "full", "partial"


@dataclass(frozen=True, eq=False)
class MaskMod:
    """A named predicate with what it depends on (so dense masks keep their smallest broadcast shape)."""

    name: str  # readable description, e.g. "causal & sliding_window(128)"
    fn: Predicate  # the predicate itself
    uses_batch: bool = False  # depends on b (key padding per sequence)
    uses_head: bool = False  # depends on h
    uses_query: bool = True  # depends on q_idx (False: a key-padding mask, (B, 1, 1, Lk))
    bounds: Bounds | None = None  # closed-form tile classification, if any
    pairs: Callable[[int, int, int], int] | None = None  # closed-form allowed pairs (batch, lq, lk), if any

    def __call__(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.fn(b, h, q, kv)

    def __and__(self, other: MaskMod) -> MaskMod:
        return and_(self, other)

    def __or__(self, other: MaskMod) -> MaskMod:
        return or_(self, other)

    @property
    def is_causal(self) -> bool:
        """Exactly the top-left causal mask (SDPA can then take ``is_causal=True``)."""
        return self.name == "causal"

    def __repr__(self) -> str:
        return f"MaskMod({self.name})"


def _state(full: bool, empty: bool) -> str:
    return FULL if full else EMPTY if empty else PARTIAL


# ---- the named predicates ---------------------------------------------------------------------
def causal() -> MaskMod:
    """Query i sees keys j <= i (top-left aligned when Lq != Lk, as ``is_causal=True``)."""

    def fn(b, h, q, kv):
        return kv <= q

    def bounds(q0, q1, k0, k1):
        return _state(full=k1 - 1 <= q0, empty=k0 > q1 - 1)

    def pairs(batch, lq, lk):
        # rows i < lk see i + 1 keys; rows i >= lk see all lk
        n = min(lq, lk)
        return n * (n + 1) // 2 + max(0, lq - lk) * lk

    return MaskMod("causal", fn, bounds=bounds, pairs=pairs)


def sliding_window(window: int) -> MaskMod:
    """Query i sees keys j with ``|i - j| <= window`` (combine with :func:`causal` to look back only)."""
    w = check_int("window", window, 0)

    def fn(b, h, q, kv):
        return (q - kv).abs() <= w

    def bounds(q0, q1, k0, k1):
        farthest = max(abs(q0 - (k1 - 1)), abs((q1 - 1) - k0))
        nearest = 0 if k0 <= q1 - 1 and q0 <= k1 - 1 else min(abs(k0 - (q1 - 1)), abs(q0 - (k1 - 1)))
        return _state(full=farthest <= w, empty=nearest > w)

    def pairs(batch, lq, lk):
        return sum(max(0, min(lk - 1, i + w) - max(0, i - w) + 1) for i in range(lq))

    return MaskMod(f"sliding_window({w})", fn, bounds=bounds, pairs=pairs)


def prefix_lm(prefix: int) -> MaskMod:
    """Bidirectional over the first ``prefix`` keys, causal after (T5/PaLM prefix language models)."""
    p = check_int("prefix", prefix, 0)

    def fn(b, h, q, kv):
        return (kv < p) | (kv <= q)

    def bounds(q0, q1, k0, k1):
        return _state(full=k1 <= p or k1 - 1 <= q0, empty=k0 >= p and k0 > q1 - 1)

    def pairs(batch, lq, lk):
        return sum(min(lk, max(p, i + 1)) for i in range(lq))

    return MaskMod(f"prefix_lm({p})", fn, bounds=bounds, pairs=pairs)


def document(lengths: Sequence[int], device: torch.device | str = "cpu") -> MaskMod:
    """Block-diagonal mask of packed sequences: a query sees the keys of its own document only.

    Args:
        lengths: per-document lengths, in packing order; positions past their sum belong to no
            document and see nothing.
    """
    lengths = [check_int("document length", n, 1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must name at least one document")
    total = sum(lengths)
    doc_ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))  # (total,)
    ids = doc_ids.to(device)
    starts = [0]  # first position of each document, then the end
    for n in lengths:
        starts.append(starts[-1] + n)

    doc_list = doc_ids.tolist()

    def fn(b, h, q, kv):
        inside = (q < total) & (kv < total)
        return inside & (ids[q.clamp(max=total - 1)] == ids[kv.clamp(max=total - 1)])

    def bounds(q0, q1, k0, k1):
        qb, kb = min(q1, total), min(k1, total)  # positions past the packed end see nothing
        if q0 >= qb or k0 >= kb:
            return EMPTY
        lo_q, hi_q, lo_k, hi_k = doc_list[q0], doc_list[qb - 1], doc_list[k0], doc_list[kb - 1]
        full = q1 <= total and k1 <= total and lo_q == hi_q == lo_k == hi_k
        return _state(full=full, empty=hi_q < lo_k or hi_k < lo_q)

    def pairs(batch, lq, lk):
        count = 0
        for start, stop in zip(starts[:-1], starts[1:], strict=True):
            count += max(0, min(stop, lq) - start) * max(0, min(stop, lk) - start)
        return count

    return MaskMod(f"document({len(lengths)} docs)", fn, bounds=bounds, pairs=pairs)


def valid_lengths(valid_lens: torch.Tensor) -> MaskMod:
    """Key padding with the d2l ``masked_softmax(X, valid_lens)`` semantics.

    Args:
        valid_lens: integer tensor; 1-D ``(B,)``: batch b sees keys ``j < valid_lens[b]``; 2-D
            ``(B, Lq)``: query i of batch b sees ``j < valid_lens[b, i]``.
    """
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be a torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must be an integer tensor, got {valid_lens.dtype}")
    if valid_lens.dim() not in (1, 2):
        raise ValueError(f"valid_lens must be 1-D (B,) or 2-D (B, Lq), got {valid_lens.dim()}-D")
    lens = valid_lens.long()
    per_query = lens.dim() == 2
    lo, hi = int(lens.min()), int(lens.max())

    def fn(b, h, q, kv):
        return kv < (lens[b, q] if per_query else lens[b])

    def bounds(q0, q1, k0, k1):
        return _state(full=k1 <= lo, empty=k0 >= hi)

    def pairs(batch, lq, lk):
        clipped = lens.clamp(0, lk)
        total = int(clipped.sum()) if per_query else int(clipped.sum()) * lq
        return total // max(1, lens.shape[0])

    return MaskMod("valid_lengths", fn, uses_batch=True, uses_query=per_query, bounds=bounds, pairs=pairs)


# ---- composition ------------------------------------------------------------------------------
def _combine(a: MaskMod, b: MaskMod, op: str) -> MaskMod:
    for m in (a, b):
        if not isinstance(m, MaskMod):
            raise TypeError(f"masks combine only with MaskMod, got {type(m).__name__}")
    both = op == "&"

    def fn(bi, hi, q, kv):
        return a.fn(bi, hi, q, kv) & b.fn(bi, hi, q, kv) if both else a.fn(bi, hi, q, kv) | b.fn(bi, hi, q, kv)

    bounds = None
    if a.bounds is not None and b.bounds is not None:

        def bounds(q0, q1, k0, k1):
            sa, sb = a.bounds(q0, q1, k0, k1), b.bounds(q0, q1, k0, k1)
            if both:
                return _state(full=sa == FULL and sb == FULL, empty=EMPTY in (sa, sb))
            return _state(full=FULL in (sa, sb), empty=sa == EMPTY and sb == EMPTY)

    return MaskMod(
        f"{a.name} {op} {b.name}", fn,
        uses_batch=a.uses_batch or b.uses_batch, uses_head=a.uses_head or b.uses_head,
        uses_query=a.uses_query or b.uses_query, bounds=bounds,
    )


def and_(*mods: MaskMod) -> MaskMod:
    """Pairs every predicate allows."""
    out = mods[0]
    for m in mods[1:]:
        out = _combine(out, m, "&")
    return out


def or_(*mods: MaskMod) -> MaskMod:
    """Pairs any predicate allows."""
    out = mods[0]
    for m in mods[1:]:
        out = _combine(out, m, "|")
    return out


# ---- consumers --------------------------------------------------------------------------------
def _indices(mod: MaskMod, batch: int, heads: int, q0: int, q1: int, k0: int, k1: int, device) -> tuple:
    """Broadcastable index tensors for the tile, of the smallest shape the predicate needs."""
    b = torch.arange(batch if mod.uses_batch else 1, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads if mod.uses_head else 1, device=device).view(1, -1, 1, 1)
    q = (torch.arange(q0, q1, device=device) if mod.uses_query else torch.zeros(1, dtype=torch.long, device=device)).view(1, 1, -1, 1)
    kv = torch.arange(k0, k1, device=device).view(1, 1, 1, -1)
    return b, h, q, kv


def tile(
    mod: MaskMod, batch: int, heads: int, q0: int, q1: int, k0: int, k1: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The predicate on the tile ``[q0, q1) x [k0, k1)``: bool ``(B?, H?, Cq?, Ck)`` (? = 1 if unused)."""
    b, h, q, kv = _indices(mod, batch, heads, q0, q1, k0, k1, device)
    out = mod.fn(b, h, q, kv)
    return out.expand(b.shape[0], h.shape[1], q.shape[2], kv.shape[3])


def dense(mod: MaskMod, batch: int, heads: int, lq: int, lk: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """The whole mask as a bool tensor of the smallest broadcastable shape ``(B?, H?, Lq?, Lk)``."""
    return tile(mod, batch, heads, 0, lq, 0, lk, device).contiguous()


def block_state(mod: MaskMod, batch: int, heads: int, q0: int, q1: int, k0: int, k1: int) -> str:
    """``"empty"``, ``"full"`` or ``"partial"`` for the tile, for every batch and head."""
    if mod.bounds is not None:
        return mod.bounds(q0, q1, k0, k1)
    values = tile(mod, batch, heads, q0, q1, k0, k1)
    return _state(full=bool(values.all()), empty=not bool(values.any()))


def allowed_pairs(mod: MaskMod | None, batch: int, lq: int, lk: int, block: int = 512) -> int:
    """Allowed (query, key) pairs per (batch, head), averaged over the batch (rounded down).

    Closed-form for the built-in predicates; for compositions, tiles are classified first and only
    partial tiles are evaluated, so banded and causal masks cost O(L * block), not O(L^2).
    """
    if mod is None:
        return lq * lk
    if mod.pairs is not None:
        return mod.pairs(batch, lq, lk)
    total = 0
    for q0 in range(0, lq, block):
        q1 = min(q0 + block, lq)
        for k0 in range(0, lk, block):
            k1 = min(k0 + block, lk)
            state = block_state(mod, batch, 1, q0, q1, k0, k1)
            if state == FULL:
                total += (q1 - q0) * (k1 - k0) * batch
            elif state == PARTIAL:
                values = tile(mod, batch, 1, q0, q1, k0, k1)  # (B?, 1, Cq?, Ck)
                total += int(values.sum()) * (batch // values.shape[0]) * ((q1 - q0) // values.shape[2])
    return total // batch
