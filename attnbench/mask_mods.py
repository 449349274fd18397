"""Masks as named predicates over ``(batch, head, q_idx, kv_idx)``, composable with ``&`` and ``|``.

One definition feeds every consumer: the dense tensor (:func:`dense`), a blockwise engine's tiles
(:func:`tile`) and their :class:`TileState` (:func:`block_state`), FlexAttention's ``mask_mod``
(:attr:`MaskMod.fn`) and the counts cost models read (:func:`allowed_pairs`,
:func:`nonempty_tile_pairs`), in closed form for built-ins and compositions. True = may attend
(SDPA's convention); ``causal`` is top-left aligned if ``Lq != Lk``, as with ``is_causal=True``.

Example:
    >>> m = causal() & sliding_window(1)
    >>> dense(m, batch=1, heads=1, lq=4, lk=4)[0, 0].int().tolist()
    [[1, 0, 0, 0], [1, 1, 0, 0], [0, 1, 1, 0], [0, 0, 1, 1]]
    >>> m.name, allowed_pairs(m, batch=1, lq=4, lk=4)
    ('causal & sliding_window(1)', 7)
"""

from __future__ import annotations

import enum
import weakref
from bisect import bisect_right
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from functools import partial
from itertools import combinations, pairwise

import torch

from attnbench._checks import check_int
from attnbench.mask_sums import band_tile_pairs, segment_pairs, span_width, sum_min

__all__ = [
    "TileState",
    "Predicate",
    "Bounds",
    "MaskMod",
    "Piece",
    "nonempty_tile_pairs",
    "builtin_kind",
    "causal",
    "sliding_window",
    "prefix_lm",
    "document",
    "valid_lengths",
    "and_",
    "or_",
    "tile",
    "shifted",
    "dense",
    "block_state",
    "allowed_pairs",
]


class TileState(enum.StrEnum):
    """What a tile of the mask holds, for every batch entry and head (:func:`block_state`)."""

    EMPTY = "empty"  # no allowed pair: a block-skipping engine skips the tile
    FULL = "full"  # every pair allowed: no mask work
    PARTIAL = "partial"  # some pairs allowed: the predicate is evaluated on the tile


Predicate = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
"""``fn(b, h, q_idx, kv_idx) -> bool`` on broadcastable int64 indices (a FlexAttention mask_mod)."""
Bounds = Callable[[int, int, int, int], TileState | None]
"""``(q0, q1, k0, k1) -> TileState`` for the tile ``[q0, q1) x [k0, k1)``, valid for
every batch and head; None when the predicate has no closed form (the tile is then evaluated)."""


@dataclass(frozen=True, eq=False)
class MaskMod:
    """A named predicate with what it depends on, so dense masks keep their smallest shape."""

    name: str  # readable description, e.g. "causal & sliding_window(128)"
    fn: Predicate  # the predicate itself
    uses_batch: bool = False  # depends on b (key padding per sequence)
    uses_head: bool = False  # depends on h
    uses_query: bool = True  # depends on q_idx (False: a key-padding mask, (B, 1, 1, Lk))
    bounds: Bounds | None = None  # closed-form tile classification, if any
    # closed-form allowed pairs (batch, lq, lk), if any
    pairs: Callable[[int, int, int], int] | None = None
    # closed-form non-empty tile pairs (lq, lk, tq, tk)
    tile_pairs: Callable[[int, int, int, int], int] | None = None
    # raises ValueError when it cannot describe (batch, lq)
    fits: Callable[[int, int], None] | None = None
    # an or of ands of built-in predicates (counted in closed form)
    form: tuple[frozenset[_Atom], ...] | None = None

    def check_fits(self, batch: int, lq: int) -> None:
        """Raise ``ValueError`` if the predicate cannot describe this batch and query count.

        A predicate that holds per-sequence data (``valid_lengths``) indexes it by batch entry and
        query: a mismatch would read past it (an IndexError deep inside a variant) or silently use
        only part of it, so it is refused before any work.
        """
        if self.fits is not None:
            self.fits(batch, lq)

    def __call__(
        self, b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor
    ) -> torch.Tensor:
        return self.fn(b, h, q, kv)

    def __and__(self, other: MaskMod) -> MaskMod:
        return and_(self, other)

    def __or__(self, other: MaskMod) -> MaskMod:
        return or_(self, other)

    @property
    def is_causal(self) -> bool:
        """Exactly :func:`causal`'s top-left causal mask (SDPA can then take ``is_causal=True``).

        Known by identity, never by its name: ``MaskMod("causal", other_fn)`` is not causal.
        """
        return builtin_kind(self) == "causal"

    def __repr__(self) -> str:
        return f"MaskMod({self.name})"


def _state(full: bool, empty: bool) -> TileState:
    return TileState.FULL if full else TileState.EMPTY if empty else TileState.PARTIAL


# ---- compositions: counting ands and ors of the built-in predicates --------------------------
# Each built-in predicate lets query row i see one interval of keys [lo(i), hi(i)), lo and hi
# piecewise linear in i with slopes 0 or 1 and integer constants (a few pieces; one per document
# for ``document``). An ``&`` of predicates lets row i see [max lo, min hi): on a stretch of rows
# where every predicate stays on one piece and the max and the min stay on one line each (of the
# lines of one slope only the highest lo and the lowest hi count, and two lines cross at most
# once, so there are O(pieces) stretches, each O(predicates)), the count is an arithmetic series. On
# a tq x tk tile grid, :func:`block_state` calls a tile of a predicate non-empty when its key tile
# meets [lo(q0), hi(q1 - 1)), and of an ``&`` when it is non-empty for every predicate: the key
# tiles [floor(max lo / tk), ceil(min hi / tk)), summed with ``mask_sums._floor_sum``. An
# ``|`` is an or of ands (distributed out when combined) and is counted by inclusion-exclusion, for
# pairs and tiles alike: |A or B| = |A| + |B| - |A and B|.

Piece = tuple[int, int, int, int, int]
"""``(first_row, lo_slope, lo_const, hi_slope, hi_const)``: from ``first_row`` up to the next
piece's first row, row i sees keys ``[lo_slope * i + lo_const, hi_slope * i + hi_const)``."""

_MAX_TERMS = 10
"""Most ands an or may hold and still be counted by inclusion-exclusion (2**terms - 1
intersections); a larger composition is counted by walking its tiles, refused beyond
:data:`_WALK_LIMIT` tiles."""

_WALK_LIMIT = 2**18
"""Most tiles a count without a closed form walks (a second or so) before refusing."""


@dataclass(frozen=True, eq=False)
class _Atom:
    """One built-in predicate as per-row key intervals; atoms of equal ``key`` allow equal pairs."""

    key: tuple
    # sorted by first row, the first at row 0; valid_lengths: its tile-grid range
    pieces: tuple[Piece, ...]
    starts: tuple[int, ...]  # each piece's first row (for bisecting)
    lens: torch.Tensor | None = None  # valid_lengths only: (B,) or (B, Lq), for exact pair counts

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Atom) and self.key == other.key

    def __hash__(self) -> int:
        return hash(self.key)

    def at(self, row: int) -> Piece:
        """The piece holding ``row``."""
        return self.pieces[bisect_right(self.starts, row) - 1]


def _atom(key: tuple, pieces: tuple[Piece, ...], lens: torch.Tensor | None = None) -> _Atom:
    return _Atom(key, pieces, tuple(p[0] for p in pieces), lens)


def _form(
    key: tuple, pieces: tuple[Piece, ...], lens: torch.Tensor | None = None
) -> tuple[frozenset[_Atom], ...]:
    """The form of one built-in predicate: an or of one and of one atom."""
    return (frozenset({_atom(key, pieces, lens)}),)


def _absorb(terms) -> tuple[frozenset[_Atom], ...]:
    """Drop repeated ands and every and holding all of another's atoms (a subset of its pairs).

    Exact for pairs and for tile states alike, and it keeps inclusion-exclusion small.
    """
    unique = list(dict.fromkeys(terms))
    return tuple(t for t in unique if not any(u < t for u in unique))


def _and_tile_pairs(atoms: list[_Atom], lq: int, lk: int, tq: int, tk: int) -> int:
    """Pairs in the ``tq x tk`` tiles that every atom's :func:`block_state` calls non-empty.

    With ``tq = tk = 1`` a tile is one pair: the allowed pairs of the atoms' ``&``.
    """
    full = lq // tq  # query tiles i < full have tq rows; a last short one is counted directly
    total = 0
    if full:
        cuts = {0, full}
        for atom in atoms:  # tile i reads lo at row i*tq and hi at row i*tq + tq - 1
            for first in atom.starts[1:]:
                for x in (-(-first // tq), -(-(first - tq + 1) // tq)):
                    if 0 < x < full:
                        cuts.add(x)
        bounds = sorted(cuts)
        for s, e in pairwise(bounds):
            los, his = [], []
            for atom in atoms:
                _, lm, lc, _, _ = atom.at(s * tq)
                _, _, _, hm, hc = atom.at(s * tq + tq - 1)
                los.append((lm * tq, lc))
                his.append((hm * tq, hm * (tq - 1) + hc))
            total += tq * segment_pairs(s, e, los, his, lk, tk)
    if lq % tq:
        q0, start, end = full * tq, 0, lk
        for atom in atoms:
            _, lm, lc, _, _ = atom.at(q0)
            _, _, _, hm, hc = atom.at(lq - 1)
            lo, hi = max(0, lm * q0 + lc), min(lk, hm * (lq - 1) + hc)
            if lo >= hi:
                return total
            start, end = max(start, lo), min(end, hi)
        total += (lq - q0) * max(0, min(lk, -(-end // tk) * tk) - start // tk * tk)
    return total


def _and_pairs(atoms: frozenset[_Atom], batch: int, lq: int, lk: int) -> int:
    """Allowed pairs of the atoms' ``&``, summed over the batch (valid_lengths differ per entry)."""
    padded = [a for a in atoms if a.lens is not None]
    fixed = [a for a in atoms if a.lens is None]
    # arbitrary per row: O(B * Lq) data, counted with tensor ops
    if any(a.lens.dim() == 2 for a in padded):
        rows = torch.arange(lq)
        lo, hi = torch.zeros((), dtype=torch.long), torch.full((), lk, dtype=torch.long)
        for atom in atoms:
            a_lo, a_hi = _rows_tensor(atom, rows)
            lo, hi = torch.maximum(lo, a_lo), torch.minimum(hi, a_hi)
        return int((hi - lo).clamp(min=0).sum())
    if not padded:
        return batch * _and_tile_pairs(fixed, lq, lk, 1, 1)
    # batch entry b sees [0, min over the valid_lengths of their length b)
    per_entry: dict[int, int] = {}
    for lens in zip(*(a.lens.tolist() for a in padded), strict=True):
        per_entry[min(lens)] = per_entry.get(min(lens), 0) + 1
    return sum(
        n * _and_tile_pairs([*fixed, _atom((), ((0, 0, 0, 0, v),))], lq, lk, 1, 1)
        for v, n in per_entry.items()
    )


def _rows_tensor(atom: _Atom, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(lo, hi)`` of every row, broadcastable to ``(B, len(rows))``."""
    if atom.lens is not None:
        lens = atom.lens.cpu().long()
        return torch.zeros((), dtype=torch.long), lens if lens.dim() == 2 else lens[:, None]
    table = torch.tensor(atom.pieces, dtype=torch.long)[
        torch.searchsorted(torch.tensor(atom.starts), rows, right=True) - 1
    ]
    return table[:, 1] * rows + table[:, 2], table[:, 3] * rows + table[:, 4]


def _union(form: tuple[frozenset[_Atom], ...], count: Callable[[frozenset[_Atom]], int]) -> int:
    """``count`` of an or of ands by inclusion-exclusion (each distinct intersection once)."""
    signs: dict[frozenset[_Atom], int] = {}
    for r in range(1, len(form) + 1):
        for terms in combinations(form, r):
            both = frozenset().union(*terms)
            signs[both] = signs.get(both, 0) + (1 if r % 2 else -1)
    return sum(sign * count(both) for both, sign in signs.items() if sign)


def nonempty_tile_pairs(
    mod: MaskMod | None, batch: int, heads: int, lq: int, lk: int, tq: int, tk: int
) -> int:
    """Pairs per (batch, head) in the ``tq x tk`` tiles :func:`block_state` does not call empty.

    What a block-skipping engine computes (it computes every pair of a non-empty tile). Closed form
    (:attr:`MaskMod.tile_pairs`) for the built-in predicates and their compositions; anything else
    (a predicate without a closed form) walks the tiles, refused beyond :data:`_WALK_LIMIT` of them.

    Raises:
        TypeError, ValueError: for a size that is not an int >= 1.
        ValueError: for a walk of more than :data:`_WALK_LIMIT` tiles.
    """
    for name, value in (
        ("batch", batch),
        ("heads", heads),
        ("lq", lq),
        ("lk", lk),
        ("tq", tq),
        ("tk", tk),
    ):
        check_int(name, value, 1)
    if mod is None:
        return lq * lk
    if mod.tile_pairs is not None:
        return mod.tile_pairs(lq, lk, tq, tk)
    _check_walk(mod, lq, lk, tq, tk)
    return sum(
        (min(q0 + tq, lq) - q0) * (min(k0 + tk, lk) - k0)
        for q0 in range(0, lq, tq)
        for k0 in range(0, lk, tk)
        if block_state(mod, batch, heads, q0, min(q0 + tq, lq), k0, min(k0 + tk, lk))
        != TileState.EMPTY
    )


# ---- the named predicates ---------------------------------------------------------------------
_BUILTIN: weakref.WeakKeyDictionary[MaskMod, str] = weakref.WeakKeyDictionary()
"""The predicates the factories below made, with their kind: a variant may trust what these compute
(``is_causal=True``, a band's closed-form tiles) because this module made them, not for a name."""


def _builtin(kind: str, mod: MaskMod) -> MaskMod:
    _BUILTIN[mod] = kind
    return mod


def builtin_kind(mod: MaskMod) -> str | None:
    """The factory that made ``mod`` ("causal", "sliding_window", ...); None for other predicates.

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
        return band_tile_pairs(lq, lk, tq, tk, None, 0, 0)

    mod = MaskMod(
        "causal",
        fn,
        bounds=bounds,
        pairs=pairs,
        tile_pairs=tile_pairs,
        form=_form(("causal",), ((0, 0, 0, 1, 1),)),
    )
    return _builtin("causal", mod)


def sliding_window(window: int) -> MaskMod:
    """Query i sees keys j with ``|i - j| <= window`` (with :func:`causal`: looks back only)."""
    w = check_int("window", window, 0)

    def fn(b, h, q, kv):
        return (q - kv).abs() <= w

    def bounds(q0, q1, k0, k1):
        farthest = max(abs(q0 - (k1 - 1)), abs((q1 - 1) - k0))
        nearest = (
            0 if k0 <= q1 - 1 and q0 <= k1 - 1 else min(abs(k0 - (q1 - 1)), abs(q0 - (k1 - 1)))
        )
        return _state(full=farthest <= w, empty=nearest > w)

    def pairs(batch, lq, lk):
        # Key j = i + d: offsets d = 0..w reach min(lq, lk - d) queries, offsets d = -1..-w reach
        # min(lq + d, lk) queries.
        return sum_min(lq, lk - min(w, lk - 1), lk) + sum_min(lk, lq - min(w, lq - 1), lq - 1)

    # query tile [q0, q1) meets the key tiles that meet [q0 - w, q1 + w)
    def tile_pairs(lq, lk, tq, tk):
        return band_tile_pairs(lq, lk, tq, tk, w, w, 0)

    mod = MaskMod(
        f"sliding_window({w})",
        fn,
        bounds=bounds,
        pairs=pairs,
        tile_pairs=tile_pairs,
        form=_form(("sliding_window", w), ((0, 1, -w, 1, w + 1),)),
    )
    return _builtin("sliding_window", mod)


def prefix_lm(prefix: int) -> MaskMod:
    """Bidirectional over the first ``prefix`` keys, causal after (T5/PaLM prefix LMs)."""
    p = check_int("prefix", prefix, 0)

    def fn(b, h, q, kv):
        return (kv < p) | (kv <= q)

    def bounds(q0, q1, k0, k1):
        return _state(full=k1 <= p or k1 - 1 <= q0, empty=k0 >= p and k0 > q1 - 1)

    def pairs(batch, lq, lk):
        # rows i < p see min(lk, p) keys; row i >= p sees min(lk, i + 1)
        return min(lq, p) * min(lk, p) + sum_min(lk, p + 1, lq)

    # query tile [q0, q1) meets the key tiles that meet [0, max(p, q1))
    def tile_pairs(lq, lk, tq, tk):
        return band_tile_pairs(lq, lk, tq, tk, None, 0, p)

    rows = ((0, 0, 0, 0, p),) if p else ()  # rows i < p see [0, p), rows from p on see [0, i + 1)
    mod = MaskMod(
        f"prefix_lm({p})",
        fn,
        bounds=bounds,
        pairs=pairs,
        tile_pairs=tile_pairs,
        form=_form(("prefix_lm", p), (*rows, (p, 0, 0, 1, 1))),
    )
    return _builtin("prefix_lm", mod)


_EAGER_DOCUMENT_IDS = 2**22
"""Positions up to which ``document`` builds its position -> document table when made (32 MiB)."""


def _document_lengths(lengths: Sequence[int]) -> list[int]:
    """``lengths`` as a list of ints >= 1 (at least one), else ``TypeError`` or ``ValueError``."""
    if isinstance(lengths, (str, bytes)) or not isinstance(lengths, Iterable):
        raise TypeError(
            "lengths must be a sequence of ints (one length per document), "
            f"got {type(lengths).__name__}"
        )
    lengths = [check_int("document length", n, 1) for n in lengths]
    if not lengths:
        raise ValueError("lengths must name at least one document")
    return lengths


def _document_of(starts: list[int], position: int) -> int:
    """The document holding ``position``, given each document's first position and then the end."""
    return bisect_right(starts, position) - 1


def _document_bounds(starts: list[int], q0: int, q1: int, k0: int, k1: int) -> TileState:
    """The state of the tile ``[q0, q1) x [k0, k1)`` of :func:`document`."""
    total = starts[-1]
    qb, kb = min(q1, total), min(k1, total)  # positions past the packed end see nothing
    if q0 >= qb or k0 >= kb:
        return TileState.EMPTY
    lo_q, hi_q = _document_of(starts, q0), _document_of(starts, qb - 1)
    lo_k, hi_k = _document_of(starts, k0), _document_of(starts, kb - 1)
    full = q1 <= total and k1 <= total and lo_q == hi_q == lo_k == hi_k
    return _state(full=full, empty=hi_q < lo_k or hi_k < lo_q)


def _document_pairs(starts: list[int], batch: int, lq: int, lk: int) -> int:
    """Allowed pairs of :func:`document`: each document's queries x its keys, cut at lq and lk."""
    count = 0
    for start, stop in zip(starts[:-1], starts[1:], strict=True):
        count += max(0, min(stop, lq) - start) * max(0, min(stop, lk) - start)
    return count


def _document_tile_pairs(starts: list[int], lq: int, lk: int, tq: int, tk: int) -> int:
    """Pairs in the non-empty tiles of :func:`document` on a ``tq x tk`` grid.

    A query tile meets the key tiles that meet the positions of the documents it spans,
    [start of doc(q0), end of doc(last row)). Tiles are grouped by doc(q0): all but the last
    tile of a group lie inside that document; the last one may reach into later documents.
    """
    total = starts[-1]
    nq, count = -(-lq // tq), 0
    for start, stop in zip(starts[:-1], starts[1:], strict=True):
        first, end = -(-start // tq), min(-(-stop // tq), nq)
        if first >= end:
            continue
        count += (end - 1 - first) * tq * span_width(start, stop, lk, tk)
        q0 = (end - 1) * tq
        q1 = min(q0 + tq, lq)
        count += (q1 - q0) * span_width(
            start, starts[_document_of(starts, min(q1, total) - 1) + 1], lk, tk
        )
    return count


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
    lengths = _document_lengths(lengths)
    total = sum(lengths)
    starts = [0]  # first position of each document, then the end
    for n in lengths:
        starts.append(starts[-1] + n)
    table: dict[str, torch.Tensor] = {}

    def ids() -> torch.Tensor:
        if "ids" not in table:
            # position -> document, (total,)
            table["ids"] = torch.repeat_interleave(
                torch.arange(len(lengths)), torch.tensor(lengths)
            ).to(device)
        return table["ids"]

    if total <= _EAGER_DOCUMENT_IDS:
        ids()

    def fn(b, h, q, kv):
        inside = (q < total) & (kv < total)
        table_ = ids()
        return inside & (table_[q.clamp(max=total - 1)] == table_[kv.clamp(max=total - 1)])

    # Rows of document d see [start_d, end_d); rows past the end see the empty [total, total), which
    # keeps both ends non-decreasing (a tile's rows then reach exactly [lo(q0), hi(q1 - 1))).
    rows = tuple((a, 0, a, 0, b) for a, b in zip(starts[:-1], starts[1:], strict=True)) + (
        (total, 0, total, 0, total),
    )
    mod = MaskMod(
        f"document({len(lengths)} docs)",
        fn,
        bounds=partial(_document_bounds, starts),
        pairs=partial(_document_pairs, starts),
        tile_pairs=partial(_document_tile_pairs, starts),
        form=_form(("document", tuple(lengths)), rows),
    )
    return _builtin("document", mod)


def _valid_lens(valid_lens: torch.Tensor) -> torch.Tensor:
    """``valid_lens`` as int64, refused unless an integer tensor of shape (B,) or (B, Lq)."""
    if not isinstance(valid_lens, torch.Tensor):
        raise TypeError(f"valid_lens must be a torch.Tensor, got {type(valid_lens).__name__}")
    if valid_lens.is_floating_point() or valid_lens.is_complex() or valid_lens.dtype == torch.bool:
        raise TypeError(f"valid_lens must be an integer tensor, got {valid_lens.dtype}")
    if valid_lens.dim() not in (1, 2):
        raise ValueError(f"valid_lens must be 1-D (B,) or 2-D (B, Lq), got {valid_lens.dim()}-D")
    if valid_lens.numel() == 0:
        raise ValueError(
            f"valid_lens must hold at least one length, got shape {tuple(valid_lens.shape)}"
        )
    return valid_lens.long()


def valid_lengths(valid_lens: torch.Tensor) -> MaskMod:
    """Key padding with the d2l ``masked_softmax(X, valid_lens)`` semantics.

    Args:
        valid_lens: integer tensor; 1-D ``(B,)``: batch b sees keys ``j < valid_lens[b]``; 2-D
            ``(B, Lq)``: query i of batch b sees ``j < valid_lens[b, i]``.
    """
    lens = _valid_lens(valid_lens)
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

    # every query tile meets the key tiles that meet [0, longest length)
    def tile_pairs(lq, lk, tq, tk):
        return lq * span_width(0, hi, lk, tk)

    def fits(batch, lq):
        if lens.shape[0] != batch:
            raise ValueError(
                f"valid_lengths holds lengths for a batch of {lens.shape[0]}, "
                f"but the batch is {batch}"
            )
        if per_query and lens.shape[1] != lq:
            raise ValueError(
                f"valid_lengths of shape (B, Lq) = {tuple(lens.shape)} must have one column "
                f"per query, but Lq is {lq}"
            )

    # Tile states hold for every batch entry and row, so every row of the grid reaches [0, longest).
    mod = MaskMod(
        "valid_lengths",
        fn,
        uses_batch=True,
        uses_query=per_query,
        bounds=bounds,
        pairs=pairs,
        tile_pairs=tile_pairs,
        fits=fits,
        form=_form(("valid_lengths", id(lens)), ((0, 0, 0, 0, hi),), lens),
    )
    return _builtin("valid_lengths", mod)


# ---- composition ------------------------------------------------------------------------------
def _combine(a: MaskMod, b: MaskMod, op: str) -> MaskMod:
    for m in (a, b):
        if not isinstance(m, MaskMod):
            raise TypeError(f"masks combine only with MaskMod, got {type(m).__name__}")
    both = op == "&"

    def fn(bi, hi, q, kv):
        return (
            a.fn(bi, hi, q, kv) & b.fn(bi, hi, q, kv)
            if both
            else a.fn(bi, hi, q, kv) | b.fn(bi, hi, q, kv)
        )

    bounds = None
    if a.bounds is not None and b.bounds is not None:

        def bounds(q0, q1, k0, k1):
            sa, sb = a.bounds(q0, q1, k0, k1), b.bounds(q0, q1, k0, k1)
            if both:
                return _state(
                    full=sa == TileState.FULL and sb == TileState.FULL,
                    empty=TileState.EMPTY in (sa, sb),
                )
            return _state(
                full=TileState.FULL in (sa, sb),
                empty=sa == TileState.EMPTY and sb == TileState.EMPTY,
            )

    def fits(batch, lq):
        a.check_fits(batch, lq)
        b.check_fits(batch, lq)

    # Counts in closed form while both sides are ors of ands of built-in predicates: an &
    # distributes (every and of one side with every and of the other), an | joins the two lists.
    form = pairs = tile_pairs = None
    if a.form is not None and b.form is not None:
        form = _absorb(x | y for x in a.form for y in b.form) if both else _absorb(a.form + b.form)
        if len(form) > _MAX_TERMS:
            form = None
    if form is not None:

        def pairs(batch, lq, lk):
            return _union(form, lambda atoms: _and_pairs(atoms, batch, lq, lk)) // batch

        def tile_pairs(lq, lk, tq, tk):
            return _union(form, lambda atoms: _and_tile_pairs(list(atoms), lq, lk, tq, tk))

    return MaskMod(
        f"{a.name} {op} {b.name}",
        fn,
        uses_batch=a.uses_batch or b.uses_batch,
        uses_head=a.uses_head or b.uses_head,
        uses_query=a.uses_query or b.uses_query,
        bounds=bounds,
        pairs=pairs,
        tile_pairs=tile_pairs,
        fits=fits,
        form=form,
    )


def _fold(name: str, op: str, mods: tuple) -> MaskMod:
    if not mods:
        raise TypeError(f"{name}() needs at least one MaskMod, got none")
    for m in mods:
        if not isinstance(m, MaskMod):
            raise TypeError(f"{name}() takes MaskMod arguments, got {type(m).__name__}")
    out = mods[0]
    for m in mods[1:]:
        out = _combine(out, m, op)
    return out


def and_(*mods: MaskMod) -> MaskMod:
    """Pairs every predicate allows (at least one predicate)."""
    return _fold("and_", "&", mods)


def or_(*mods: MaskMod) -> MaskMod:
    """Pairs any predicate allows (at least one predicate)."""
    return _fold("or_", "|", mods)


# ---- consumers --------------------------------------------------------------------------------
def _indices(
    mod: MaskMod, batch: int, heads: int, q0: int, q1: int, k0: int, k1: int, device
) -> tuple:
    """Broadcastable index tensors for the tile, of the smallest shape the predicate needs."""
    b = torch.arange(batch if mod.uses_batch else 1, device=device).view(-1, 1, 1, 1)
    h = torch.arange(heads if mod.uses_head else 1, device=device).view(1, -1, 1, 1)
    q = (
        torch.arange(q0, q1, device=device)
        if mod.uses_query
        else torch.zeros(1, dtype=torch.long, device=device)
    ).view(1, 1, -1, 1)
    kv = torch.arange(k0, k1, device=device).view(1, 1, 1, -1)
    return b, h, q, kv


def tile(
    mod: MaskMod,
    batch: int,
    heads: int,
    q0: int,
    q1: int,
    k0: int,
    k1: int,
    device: torch.device | str = "cpu",
) -> torch.Tensor:
    """The predicate on tile ``[q0, q1) x [k0, k1)``: bool ``(B?, H?, Cq?, Ck)``, 1 where unused."""
    b, h, q, kv = _indices(mod, batch, heads, q0, q1, k0, k1, device)
    out = mod.fn(b, h, q, kv)
    return out.expand(b.shape[0], h.shape[1], q.shape[2], kv.shape[3])


def shifted(mod: MaskMod, batch: int, head: int) -> MaskMod:
    """``mod`` seen from batch entry ``batch`` and head ``head`` on: index (b, h) reads theirs.

    A slice ``[batch:, head:]`` of the inputs (the correctness gate checks one (batch, head) slice
    at a time) keeps its own rows of a per-sequence or per-head predicate. Closed-form counts are
    dropped (they describe the whole batch); tile states do not depend on b or h, so they stay.
    """
    if not (mod.uses_batch and batch) and not (mod.uses_head and head):
        return mod
    fn = mod.fn
    return replace(
        mod,
        name=f"{mod.name} from b={batch}, h={head}",
        fn=lambda b, h, q, kv: fn(b + batch, h + head, q, kv),
        pairs=None,
        tile_pairs=None,
        fits=None,
        form=None,
    )


def dense(
    mod: MaskMod, batch: int, heads: int, lq: int, lk: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """The whole mask as a bool tensor of the smallest broadcastable shape ``(B?, H?, Lq?, Lk)``.

    Raises:
        ValueError: when the predicate cannot describe this batch and query count
            (:meth:`MaskMod.check_fits`).
    """
    mod.check_fits(batch, lq)
    return tile(mod, batch, heads, 0, lq, 0, lk, device).contiguous()


def block_state(
    mod: MaskMod, batch: int, heads: int, q0: int, q1: int, k0: int, k1: int
) -> TileState:
    """The tile's :class:`TileState`, the same for every batch entry and head."""
    if mod.bounds is not None:
        return mod.bounds(q0, q1, k0, k1)
    values = tile(mod, batch, heads, q0, q1, k0, k1)
    return _state(full=bool(values.all()), empty=not bool(values.any()))


def allowed_pairs(mod: MaskMod | None, batch: int, lq: int, lk: int, block: int = 512) -> int:
    """Allowed (query, key) pairs per (batch, head), averaged over the batch (rounded down).

    Closed form (:attr:`MaskMod.pairs`) for the built-in predicates and their compositions, at any
    length. Anything else (a predicate without a closed form) walks ``block x block`` tiles,
    classifying each and evaluating only partial ones, refused beyond :data:`_WALK_LIMIT` tiles.

    Raises:
        TypeError, ValueError: for a size that is not an int >= 1, or a predicate that cannot
            describe this batch and query count (:meth:`MaskMod.check_fits`).
        ValueError: for a walk of more than :data:`_WALK_LIMIT` tiles.
    """
    for name, value in (("batch", batch), ("lq", lq), ("lk", lk), ("block", block)):
        check_int(name, value, 1)
    if mod is None:
        return lq * lk
    mod.check_fits(batch, lq)
    if mod.pairs is not None:
        return mod.pairs(batch, lq, lk)
    _check_walk(mod, lq, lk, block, block)
    total = 0
    for q0 in range(0, lq, block):
        q1 = min(q0 + block, lq)
        for k0 in range(0, lk, block):
            k1 = min(k0 + block, lk)
            state = block_state(mod, batch, 1, q0, q1, k0, k1)
            if state == TileState.FULL:
                total += (q1 - q0) * (k1 - k0) * batch
            elif state == TileState.PARTIAL:
                values = tile(mod, batch, 1, q0, q1, k0, k1)  # (B?, 1, Cq?, Ck)
                total += (
                    int(values.sum()) * (batch // values.shape[0]) * ((q1 - q0) // values.shape[2])
                )
    return total // batch


def _check_walk(mod: MaskMod, lq: int, lk: int, tq: int, tk: int) -> None:
    """Refuse a count that would walk more than :data:`_WALK_LIMIT` tiles (minutes at long L)."""
    tiles = -(-lq // tq) * -(-lk // tk)
    if tiles > _WALK_LIMIT:
        raise ValueError(
            f"counting {mod.name!r} (no closed form: not a composition of at most {_MAX_TERMS} ors "
            f"of the built-in predicates) would walk {tiles} tiles of {tq} x {tk}, "
            f"more than {_WALK_LIMIT}; use larger tiles or shorter lengths"
        )
