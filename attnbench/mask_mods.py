"""Masks as named predicates over ``(batch, head, q_idx, kv_idx)``, composable with ``&`` and ``|``.

One definition feeds every consumer: the dense boolean tensor the reference and dense variants
take (:func:`dense`), the tiles blockwise engines evaluate (:func:`tile`), whether a whole tile is
empty, full or partial (:func:`block_state`, closed-form where the predicate allows, so engines
skip empty tiles and do no mask work on full ones), the count of allowed pairs that useful FLOPs
come from (:func:`allowed_pairs`, without O(L^2) work for the built-in predicates), and
FlexAttention's ``mask_mod`` (the predicate itself, :attr:`MaskMod.fn`), and the pairs a
block-skipping engine computes on a tile grid (:func:`nonempty_tile_pairs`). The counts are closed
forms for the built-in predicates (O(1), or O(documents)), so cost models answer at any length.

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

import weakref
from bisect import bisect_right
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
    tile_pairs: Callable[[int, int, int, int], int] | None = None  # closed-form non-empty tile pairs (lq, lk, tq, tk)
    fits: Callable[[int, int], None] | None = None  # raises ValueError when it cannot describe (batch, lq)

    def check_fits(self, batch: int, lq: int) -> None:
        """Raise ``ValueError`` when the predicate cannot describe a call with this batch and query count.

        A predicate that holds per-sequence data (``valid_lengths``) indexes it by batch entry and
        query: a mismatch would read past it (an IndexError deep inside a variant) or silently use
        only part of it, so it is refused before any work.
        """
        if self.fits is not None:
            self.fits(batch, lq)

    def __call__(self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        return self.fn(b, h, q, kv)

    def __and__(self, other: MaskMod) -> MaskMod:
        return and_(self, other)

    def __or__(self, other: MaskMod) -> MaskMod:
        return or_(self, other)

    @property
    def is_causal(self) -> bool:
        """Exactly the top-left causal mask of :func:`causal` (SDPA can then take ``is_causal=True``).

        Known by identity, never by its name: ``MaskMod("causal", other_fn)`` is not causal.
        """
        return builtin_kind(self) == "causal"

    def __repr__(self) -> str:
        return f"MaskMod({self.name})"


def _state(full: bool, empty: bool) -> str:
    return FULL if full else EMPTY if empty else PARTIAL


# ---- closed-form counting ---------------------------------------------------------------------
# Cost models ask how many pairs a mask allows and how many pairs a block-skipping engine computes
# on its tile grid, before anything runs and at any length (a guard must answer at L = 10**9 at
# once). Walking the tiles is O((L/tile)^2) and a per-row sum O(L), so the built-in predicates
# count with the sums below instead: O(1) or O(log) each, O(documents) for ``document``.


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` for ``n, a, b >= 0`` and ``m >= 1``, in O(log m) steps.

    The Euclid-like reduction of AtCoder Library's ``floor_sum``.
    """
    total = 0
    while n > 0:
        if a >= m:
            total += n * (n - 1) // 2 * (a // m)
            a %= m
        if b >= m:
            total += n * (b // m)
            b %= m
        y_max = a * n + b
        if y_max < m:
            break
        n, b = y_max // m, y_max % m
        m, a = a, m
    return total


def _sum_min(cap: int, lo: int, hi: int) -> int:
    """``sum(min(cap, x) for x in range(lo, hi + 1))`` in O(1) (0 for an empty range)."""
    if lo > hi:
        return 0
    top = min(hi, cap)  # x <= cap contribute x, the rest contribute cap
    below = (lo + top) * (top - lo + 1) // 2 if lo <= top else 0
    return below + cap * (hi - max(lo, cap + 1) + 1 if hi > cap else 0)


def _span_width(a: int, b: int, lk: int, tk: int) -> int:
    """Keys in the ``tk``-wide key tiles (the last one cut at ``lk``) that meet ``[a, b)``."""
    a, b = max(a, 0), min(b, lk)
    if a >= b:
        return 0
    return min(lk, -(-b // tk) * tk) - (a // tk) * tk


def _band_tile_pairs(lq: int, lk: int, tq: int, tk: int, back: int | None, fwd: int, reach: int) -> int:
    """Pairs in the non-empty tiles of a ``tq x tk`` grid when query tile ``[q0, q1)`` meets exactly the
    key tiles that meet ``[max(0, q0 - back), max(reach, q1 + fwd))`` (``back=None``: from key 0).

    Causal is ``(None, 0, 0)``, ``sliding_window(w)`` is ``(w, w, 0)``, ``prefix_lm(p)`` is
    ``(None, 0, p)``. Full query tiles are summed in closed form, the last (short) one directly.
    """
    nq, nk = -(-lq // tq), -(-lk // tk)
    q_last = (nq - 1) * tq
    total = (lq - q_last) * _span_width(0 if back is None else q_last - back, max(reach, lq + fwd), lk, tk)
    # Full tiles i < n (rows tq, q0 = i*tq, q1 = (i+1)*tq); with a back edge, tiles from q0 >= lk + back on are empty.
    n = nq - 1 if back is None else min(nq - 1, -(-(lk + back) // tq))
    if n <= 0:
        return total
    # Ends: min(lk, tk * ceil(B_i / tk)), B_i = reach while (i+1)*tq + fwd < reach, then (i+1)*tq + fwd.
    i0 = min(n, max(0, -(-(reach - fwd) // tq) - 1))
    ends = i0 * min(lk, -(-reach // tk) * tk)
    i1 = min(n, max(i0, -(-((nk - 1) * tk + 1 - tq - fwd) // tq)))  # from i1 on, the end is lk
    ends += tk * _floor_sum(i1 - i0, tk, tq, tq * i0 + tq + fwd + tk - 1) + lk * (n - i1)
    # Starts: tk * floor(A_i / tk), A_i = max(0, i*tq - back) (below lk for every non-empty tile).
    starts = 0
    if back is not None:
        i2 = min(n, -(-back // tq))
        starts = tk * _floor_sum(n - i2, tk, tq, tq * i2 - back)
    return total + tq * (ends - starts)


def nonempty_tile_pairs(mod: MaskMod | None, batch: int, heads: int, lq: int, lk: int, tq: int, tk: int) -> int:
    """Pairs per (batch, head) in the tiles of a ``tq x tk`` grid that :func:`block_state` does not call empty.

    What a block-skipping engine computes (it computes every pair of a non-empty tile). Closed form
    for the built-in predicates (:attr:`MaskMod.tile_pairs`); for compositions, the tiles are walked.
    """
    if mod is None:
        return lq * lk
    if mod.tile_pairs is not None:
        return mod.tile_pairs(lq, lk, tq, tk)
    return sum(
        (min(q0 + tq, lq) - q0) * (min(k0 + tk, lk) - k0)
        for q0 in range(0, lq, tq) for k0 in range(0, lk, tk)
        if block_state(mod, batch, heads, q0, min(q0 + tq, lq), k0, min(k0 + tk, lk)) != EMPTY
    )


# ---- the named predicates ---------------------------------------------------------------------
_BUILTIN: weakref.WeakKeyDictionary[MaskMod, str] = weakref.WeakKeyDictionary()
"""The predicates the factories below made, with their kind: a variant may trust what these compute
(``is_causal=True``, a band's closed-form tiles) because they were made here, not because of a name."""


def _builtin(kind: str, mod: MaskMod) -> MaskMod:
    _BUILTIN[mod] = kind
    return mod


def builtin_kind(mod: MaskMod) -> str | None:
    """The factory that made ``mod`` ("causal", "sliding_window", ...); None for any other predicate.

    Example:
        >>> builtin_kind(causal()), builtin_kind(MaskMod("causal", lambda b, h, q, kv: kv <= q))
        ('causal', None)
    """
    return _BUILTIN.get(mod)


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

    def tile_pairs(lq, lk, tq, tk):  # query tile [q0, q1) meets the key tiles that meet [0, q1)
        return _band_tile_pairs(lq, lk, tq, tk, None, 0, 0)

    return _builtin("causal", MaskMod("causal", fn, bounds=bounds, pairs=pairs, tile_pairs=tile_pairs))


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
        # Key j = i + d: offsets d = 0..w reach min(lq, lk - d) queries, d = -1..-w reach min(lq + d, lk).
        return _sum_min(lq, lk - min(w, lk - 1), lk) + _sum_min(lk, lq - min(w, lq - 1), lq - 1)

    def tile_pairs(lq, lk, tq, tk):  # query tile [q0, q1) meets the key tiles that meet [q0 - w, q1 + w)
        return _band_tile_pairs(lq, lk, tq, tk, w, w, 0)

    return _builtin("sliding_window", MaskMod(f"sliding_window({w})", fn, bounds=bounds, pairs=pairs, tile_pairs=tile_pairs))


def prefix_lm(prefix: int) -> MaskMod:
    """Bidirectional over the first ``prefix`` keys, causal after (T5/PaLM prefix language models)."""
    p = check_int("prefix", prefix, 0)

    def fn(b, h, q, kv):
        return (kv < p) | (kv <= q)

    def bounds(q0, q1, k0, k1):
        return _state(full=k1 <= p or k1 - 1 <= q0, empty=k0 >= p and k0 > q1 - 1)

    def pairs(batch, lq, lk):
        # rows i < p see min(lk, p) keys; row i >= p sees min(lk, i + 1)
        return min(lq, p) * min(lk, p) + _sum_min(lk, p + 1, lq)

    def tile_pairs(lq, lk, tq, tk):  # query tile [q0, q1) meets the key tiles that meet [0, max(p, q1))
        return _band_tile_pairs(lq, lk, tq, tk, None, 0, p)

    return _builtin("prefix_lm", MaskMod(f"prefix_lm({p})", fn, bounds=bounds, pairs=pairs, tile_pairs=tile_pairs))


_EAGER_DOCUMENT_IDS = 2**22
"""Positions up to which ``document`` builds its position -> document table when made (32 MiB)."""


def document(lengths: Sequence[int], device: torch.device | str = "cpu") -> MaskMod:
    """Block-diagonal mask of packed sequences: a query sees the keys of its own document only.

    Everything but the predicate itself is O(documents): tile states and counts bisect the
    documents' start positions. The predicate reads a position -> document table (FlexAttention's
    document-mask idiom), built when the mask is made for up to :data:`_EAGER_DOCUMENT_IDS`
    positions and on first evaluation beyond, so a cost model at any length allocates nothing.

    Args:
        lengths: per-document lengths, in packing order; positions past their sum belong to no
            document and see nothing.
    """
    lengths = [check_int("document length", n, 1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must name at least one document")
    total = sum(lengths)
    starts = [0]  # first position of each document, then the end
    for n in lengths:
        starts.append(starts[-1] + n)
    table: dict[str, torch.Tensor] = {}

    def ids() -> torch.Tensor:
        if "ids" not in table:
            table["ids"] = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths)).to(device)  # (total,)
        return table["ids"]

    if total <= _EAGER_DOCUMENT_IDS:
        ids()

    def doc(position: int) -> int:
        return bisect_right(starts, position) - 1

    def fn(b, h, q, kv):
        inside = (q < total) & (kv < total)
        table_ = ids()
        return inside & (table_[q.clamp(max=total - 1)] == table_[kv.clamp(max=total - 1)])

    def bounds(q0, q1, k0, k1):
        qb, kb = min(q1, total), min(k1, total)  # positions past the packed end see nothing
        if q0 >= qb or k0 >= kb:
            return EMPTY
        lo_q, hi_q, lo_k, hi_k = doc(q0), doc(qb - 1), doc(k0), doc(kb - 1)
        full = q1 <= total and k1 <= total and lo_q == hi_q == lo_k == hi_k
        return _state(full=full, empty=hi_q < lo_k or hi_k < lo_q)

    def pairs(batch, lq, lk):
        count = 0
        for start, stop in zip(starts[:-1], starts[1:], strict=True):
            count += max(0, min(stop, lq) - start) * max(0, min(stop, lk) - start)
        return count

    def tile_pairs(lq, lk, tq, tk):
        # A query tile meets the key tiles that meet the positions of the documents it spans,
        # [start of doc(q0), end of doc(last row)). Tiles are grouped by doc(q0): all but the last
        # tile of a group lie inside that document; the last one may reach into later documents.
        nq, count = -(-lq // tq), 0
        for start, stop in zip(starts[:-1], starts[1:], strict=True):
            first, end = -(-start // tq), min(-(-stop // tq), nq)
            if first >= end:
                continue
            count += (end - 1 - first) * tq * _span_width(start, stop, lk, tk)
            q0 = (end - 1) * tq
            q1 = min(q0 + tq, lq)
            count += (q1 - q0) * _span_width(start, starts[doc(min(q1, total) - 1) + 1], lk, tk)
        return count

    return _builtin("document", MaskMod(f"document({len(lengths)} docs)", fn, bounds=bounds, pairs=pairs,
                                        tile_pairs=tile_pairs))


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
    if valid_lens.numel() == 0:
        raise ValueError(f"valid_lens must hold at least one length, got shape {tuple(valid_lens.shape)}")
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

    def tile_pairs(lq, lk, tq, tk):  # every query tile meets the key tiles that meet [0, longest length)
        return lq * _span_width(0, hi, lk, tk)

    def fits(batch, lq):
        if lens.shape[0] != batch:
            raise ValueError(f"valid_lengths holds lengths for a batch of {lens.shape[0]}, but the batch is {batch}")
        if per_query and lens.shape[1] != lq:
            raise ValueError(
                f"valid_lengths of shape (B, Lq) = {tuple(lens.shape)} must have one column per query, but Lq is {lq}"
            )

    return _builtin("valid_lengths", MaskMod("valid_lengths", fn, uses_batch=True, uses_query=per_query, bounds=bounds,
                                             pairs=pairs, tile_pairs=tile_pairs, fits=fits))


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

    def fits(batch, lq):
        a.check_fits(batch, lq)
        b.check_fits(batch, lq)

    return MaskMod(
        f"{a.name} {op} {b.name}", fn,
        uses_batch=a.uses_batch or b.uses_batch, uses_head=a.uses_head or b.uses_head,
        uses_query=a.uses_query or b.uses_query, bounds=bounds, fits=fits,
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
    """The whole mask as a bool tensor of the smallest broadcastable shape ``(B?, H?, Lq?, Lk)``.

    Raises:
        ValueError: when the predicate cannot describe this batch and query count (:meth:`MaskMod.check_fits`).
    """
    mod.check_fits(batch, lq)
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
    mod.check_fits(batch, lq)
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
