"""Closed-form sums behind the masks' pair and tile counts (:mod:`attnbench.mask_mods`).

Integer arithmetic only: a floor sum, the keys a band of queries reaches on a tile grid, and the
keys in the non-empty key tiles of a stretch of query tiles whose key range is linear in the tile.
"""

from __future__ import annotations

from itertools import combinations, pairwise

__all__ = [
    "sum_min",
    "span_width",
    "band_tile_pairs",
    "where_positive",
    "segment_pairs",
]


# ---- closed-form counting ---------------------------------------------------------------------
# Cost models ask how many pairs a mask allows and how many pairs a block-skipping engine computes
# on its tile grid, before anything runs and at any length (a guard must answer at L = 10**9 at
# once). Walking the tiles is O((L/tile)^2) and a per-row sum O(L), so the built-in predicates
# count with the sums below instead: O(1) or O(log) each, O(documents) for ``document``.


def _floor_sum(n: int, m: int, a: int, b: int) -> int:
    """``sum(floor((a*i + b) / m) for i in range(n))`` in O(log m) steps.

    For ``n, a, b >= 0`` and ``m >= 1``; the Euclid-like reduction of AtCoder Library's
    ``floor_sum``.
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


def sum_min(cap: int, lo: int, hi: int) -> int:
    """``sum(min(cap, x) for x in range(lo, hi + 1))`` in O(1) (0 for an empty range)."""
    if lo > hi:
        return 0
    top = min(hi, cap)  # x <= cap contribute x, the rest contribute cap
    below = (lo + top) * (top - lo + 1) // 2 if lo <= top else 0
    return below + cap * (hi - max(lo, cap + 1) + 1 if hi > cap else 0)


def span_width(a: int, b: int, lk: int, tk: int) -> int:
    """Keys in the ``tk``-wide key tiles (the last one cut at ``lk``) that meet ``[a, b)``."""
    a, b = max(a, 0), min(b, lk)
    if a >= b:
        return 0
    return min(lk, -(-b // tk) * tk) - (a // tk) * tk


def band_tile_pairs(
    lq: int, lk: int, tq: int, tk: int, back: int | None, fwd: int, reach: int
) -> int:
    """Pairs in the non-empty tiles of a ``tq x tk`` grid for a band of keys around each query tile.

    Query tile ``[q0, q1)`` meets exactly the key tiles that meet
    ``[max(0, q0 - back), max(reach, q1 + fwd))`` (``back=None``: from key 0).

    Causal is ``(None, 0, 0)``, ``sliding_window(w)`` is ``(w, w, 0)``, ``prefix_lm(p)`` is
    ``(None, 0, p)``. Full query tiles are summed in closed form, the last (short) one directly.
    """
    nq, nk = -(-lq // tq), -(-lk // tk)
    q_last = (nq - 1) * tq
    total = (lq - q_last) * span_width(
        0 if back is None else q_last - back, max(reach, lq + fwd), lk, tk
    )
    # Full tiles i < n (rows tq, q0 = i*tq, q1 = (i+1)*tq); with a back edge, the tiles from
    # q0 >= lk + back on are empty.
    n = nq - 1 if back is None else min(nq - 1, -(-(lk + back) // tq))
    if n <= 0:
        return total
    # Ends: min(lk, tk * ceil(B_i / tk)), where B_i = reach while (i+1)*tq + fwd < reach, then
    # B_i = (i+1)*tq + fwd.
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


def where_positive(m: int, c: int, s: int, e: int) -> tuple[int, int]:
    """The ``i`` in ``[s, e)`` with ``m * i + c > 0``: one interval (empty as ``(s, s)``)."""
    if m > 0:
        s = max(s, -c // m + 1)
    elif m < 0:
        e = min(e, -(c // m))  # i < c / -m, i.e. i < ceil(c / -m)
    elif c <= 0:
        e = s
    return (s, e) if s < e else (s, s)


def segment_pairs(s: int, e: int, los: list, his: list, lk: int, tk: int) -> int:
    """Keys in the non-empty key tiles of query tiles ``i in [s, e)``, summed over i (one row each).

    In query tile i, atom a reaches keys ``[los[a](i), his[a](i))``, each a line ``(slope, const)``
    in i with slope >= 0, and is non-empty on the key tiles meeting that range clipped to
    ``[0, lk)``. A key tile counts when it is non-empty for every atom: none when some atom reaches
    no key, else the key tiles ``[floor(max lo / tk), ceil(min hi / tk))`` (the last cut at ``lk``).
    """
    for (lm, lc), (hm, hc) in zip(los, his, strict=True):  # each atom: lo < hi, lo < lk and hi > 0
        for m, c in ((hm - lm, hc - lc), (-lm, lk - lc), (hm, hc)):
            s, e = where_positive(m, c, s, e)
    if s >= e:
        return 0
    # The clips are lines too; of lines with one slope only the highest lo and the lowest hi matter.
    low: dict[int, int] = {0: 0}
    high: dict[int, int] = {0: lk}
    for m, c in los:
        low[m] = max(low.get(m, c), c)
    for m, c in his:
        high[m] = min(high.get(m, c), c)
    los, his = list(low.items()), list(high.items())
    cuts = {s, e}
    # where the max of the lo lines or the min of the hi lines changes line
    for lines in (los, his):
        for (m1, c1), (m2, c2) in combinations(lines, 2):
            if m1 != m2:
                # ceil((c2 - c1) / (m1 - m2)): the faster line leads from x on
                x = -((c1 - c2) // (m1 - m2))
                if s < x < e:
                    cuts.add(x)
    last = (-(-lk // tk) - 1) * tk  # first key of the last (cut) key tile
    total = 0
    bounds = sorted(cuts)
    for a, b in pairwise(bounds):
        lm, lc = max(los, key=lambda line: (line[0] * a + line[1], line[0]))
        hm, hc = min(his, key=lambda line: (line[0] * a + line[1], line[0]))
        # The ranges of key tiles meet when floor(lo / tk) < ceil(hi / tk); where hi - lo <= -tk
        # they cannot, elsewhere the width below is >= 0 (and 0 exactly when they do not meet).
        a, b = where_positive(hm - lm, hc - lc + tk, a, b)
        if a >= b:
            continue
        # from x on, hi lies in the last key tile, whose end is lk
        x = min(b, max(a, (last - hc) // hm + 1)) if hm else a if hc > last else b
        ends = tk * _floor_sum(x - a, tk, hm, hm * a + hc + tk - 1) + lk * (b - x)
        total += ends - tk * _floor_sum(b - a, tk, lm, lm * a + lc)
    return total
