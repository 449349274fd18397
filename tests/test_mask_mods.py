"""Mask predicates: every consumer (dense tensor, tiles, tile states, pair counts) agrees with brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from attnbench import mask_mods as mm
from attnbench import mask_sums


def _brute(mod: mm.MaskMod, batch: int, lq: int, lk: int) -> torch.Tensor:
    """The predicate evaluated one pair at a time: the slow, obviously right version."""
    out = torch.zeros(batch, 1, lq, lk, dtype=torch.bool)
    for b in range(batch):
        for i in range(lq):
            for j in range(lk):
                out[b, 0, i, j] = bool(
                    mod.fn(torch.tensor(b), torch.tensor(0), torch.tensor(i), torch.tensor(j))
                )
    return out


@st.composite
def mods(draw, lq: int, batch: int, depth: int = 2) -> mm.MaskMod:
    kind = draw(
        st.sampled_from(
            ["causal", "sliding", "prefix", "document", "valid", "and", "or"]
            if depth
            else ["causal", "sliding", "prefix", "document", "valid"]
        )
    )
    if kind == "causal":
        return mm.causal()
    if kind == "sliding":
        return mm.sliding_window(draw(st.integers(0, 6)))
    if kind == "prefix":
        return mm.prefix_lm(draw(st.integers(0, lq)))
    if kind == "document":
        return mm.document(draw(st.lists(st.integers(1, 9), min_size=1, max_size=5)))
    if kind == "valid":
        return mm.valid_lengths(
            torch.tensor(draw(st.lists(st.integers(0, 30), min_size=batch, max_size=batch)))
        )
    a, b = draw(mods(lq, batch, depth - 1)), draw(mods(lq, batch, depth - 1))
    return a & b if kind == "and" else a | b


@given(data=st.data(), lq=st.integers(1, 14), lk=st.integers(1, 14), batch=st.integers(1, 3))
def test_dense_and_counts_match_brute_force(data, lq, lk, batch):
    mod = data.draw(mods(lq, batch))
    truth = _brute(mod, batch, lq, lk)
    dense = mm.dense(mod, batch, 1, lq, lk)
    assert torch.equal(dense.expand(batch, 1, lq, lk), truth), mod.name
    assert mm.allowed_pairs(mod, batch, lq, lk, block=4) == int(truth.sum()) // batch, mod.name


@given(data=st.data(), lq=st.integers(1, 14), lk=st.integers(1, 14), batch=st.integers(1, 3))
def test_tile_states_are_sound_and_primitives_exact(data, lq, lk, batch):
    mod = data.draw(mods(lq, batch))
    truth = _brute(mod, batch, lq, lk)
    q0 = data.draw(st.integers(0, lq - 1))
    q1 = data.draw(st.integers(q0 + 1, lq))
    k0 = data.draw(st.integers(0, lk - 1))
    k1 = data.draw(st.integers(k0 + 1, lk))
    values = truth[:, :, q0:q1, k0:k1]
    assert torch.equal(mm.tile(mod, batch, 1, q0, q1, k0, k1).expand_as(values), values)
    state = mm.block_state(mod, batch, 1, q0, q1, k0, k1)
    if state == mm.TileState.FULL:
        assert values.all(), mod.name
    elif state == mm.TileState.EMPTY:
        assert not values.any(), mod.name
    elif " & " not in mod.name and " | " not in mod.name:  # a primitive's closed form is exact
        assert values.any() and not values.all(), (mod.name, q0, q1, k0, k1)


def test_smallest_broadcast_shapes():
    assert mm.dense(mm.causal(), 4, 8, 5, 6).shape == (1, 1, 5, 6)
    assert mm.dense(mm.valid_lengths(torch.tensor([1, 2])), 2, 8, 5, 6).shape == (2, 1, 1, 6)
    assert mm.dense(mm.valid_lengths(torch.tensor([[1, 2], [3, 4]])), 2, 8, 2, 6).shape == (
        2,
        1,
        2,
        6,
    )
    assert mm.dense(mm.causal() & mm.valid_lengths(torch.tensor([1, 2])), 2, 8, 5, 6).shape == (
        2,
        1,
        5,
        6,
    )


def test_causal_identity_and_names():
    assert mm.causal().is_causal
    assert not (mm.causal() & mm.sliding_window(4)).is_causal
    assert (mm.prefix_lm(3) | mm.causal()).name == "prefix_lm(3) | causal"


def test_counts_at_long_lengths_do_no_quadratic_work():
    """Composed masks at L=65536 are counted from tile states: seconds, not 4e9 evaluations."""
    import time

    t0 = time.perf_counter()
    n = mm.allowed_pairs(mm.causal() & mm.sliding_window(128), 1, 65536, 65536)
    assert time.perf_counter() - t0 < 20
    assert n == sum(min(i, 128) + 1 for i in range(65536))


@pytest.mark.parametrize(
    "factory,args,exc",
    [
        (mm.sliding_window, (-1,), ValueError),
        (mm.prefix_lm, (1.5,), TypeError),
        (mm.document, ([],), ValueError),
        (mm.document, ([3, 0],), ValueError),
        (mm.valid_lengths, ([1, 2],), TypeError),
        (mm.valid_lengths, (torch.tensor([1.0]),), TypeError),
    ],
)
def test_bad_arguments_are_named(factory, args, exc):
    with pytest.raises(exc):
        factory(*args)


def test_flex_attention_takes_the_predicate_as_its_mask_mod():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    mod = mm.causal() & mm.document([5, 9, 2])
    block = flex.create_block_mask(mod.fn, None, None, 16, 16, device="cpu", BLOCK_SIZE=4)
    assert torch.equal(block.to_dense().bool().any(), torch.tensor(True))
    dense_blocks = block.to_dense()[0, 0].bool()  # (Lq/4, Lk/4) tiles flex will visit
    for i in range(4):
        for j in range(4):
            state = mm.block_state(mod, 1, 1, 4 * i, 4 * i + 4, 4 * j, 4 * j + 4)
            assert bool(dense_blocks[i, j]) == (state != mm.TileState.EMPTY), (i, j, state)


# ---- compositions: closed-form counts against brute force -------------------------------------
def _tile_walk(mod: mm.MaskMod, batch: int, lq: int, lk: int, tq: int, tk: int) -> int:
    """Pairs in the tiles that block_state does not call empty, one tile at a time."""
    return sum(
        (min(q0 + tq, lq) - q0) * (min(k0 + tk, lk) - k0)
        for q0 in range(0, lq, tq)
        for k0 in range(0, lk, tk)
        if mm.block_state(mod, batch, 1, q0, min(q0 + tq, lq), k0, min(k0 + tk, lk))
        != mm.TileState.EMPTY
    )


@st.composite
def builtins(draw, lq: int, lk: int, batch: int) -> mm.MaskMod:
    """One built-in predicate with parameters reaching past both lengths (cross-attention shapes included)."""
    kind = draw(st.sampled_from(["causal", "sliding", "prefix", "document", "valid", "valid_rows"]))
    top = max(lq, lk) + 3
    if kind == "causal":
        return mm.causal()
    if kind == "sliding":
        return mm.sliding_window(draw(st.integers(0, 5) | st.integers(0, top)))
    if kind == "prefix":
        return mm.prefix_lm(draw(st.integers(0, top)))
    if kind == "document":  # documents may end before, at or after the longer length
        return mm.document(draw(st.lists(st.integers(1, max(1, top // 2)), min_size=1, max_size=6)))
    if kind == "valid":
        return mm.valid_lengths(
            torch.tensor(draw(st.lists(st.integers(-2, lk + 2), min_size=batch, max_size=batch)))
        )
    rows = draw(
        st.lists(
            st.lists(st.integers(-1, lk + 2), min_size=lq, max_size=lq),
            min_size=batch,
            max_size=batch,
        )
    )
    return mm.valid_lengths(torch.tensor(rows))


@st.composite
def compositions(draw, lq: int, lk: int, batch: int, depth: int) -> mm.MaskMod:
    """A random tree of & and | over built-in predicates, ``depth`` levels at most."""
    if depth == 0 or draw(st.integers(0, 3)) == 0:
        return draw(builtins(lq, lk, batch))
    a = draw(compositions(lq, lk, batch, depth - 1))
    b = draw(compositions(lq, lk, batch, depth - 1))
    return a & b if draw(st.booleans()) else a | b


@settings(max_examples=400, deadline=None)
@given(
    data=st.data(),
    lq=st.integers(1, 24),
    lk=st.integers(1, 24),
    batch=st.integers(1, 3),
    tq=st.integers(1, 9),
    tk=st.integers(1, 9),
    depth=st.integers(1, 3),
)
def test_composed_counts_equal_the_dense_count_and_the_tile_walk(
    data, lq, lk, batch, tq, tk, depth
):
    """allowed_pairs and nonempty_tile_pairs of & / | trees are closed forms, exact against brute force."""
    mod = data.draw(compositions(lq, lk, batch, depth))
    assume(
        mod.form is not None
    )  # beyond the term limit the walk counts (checked by the walk itself)
    assert mod.pairs is not None and mod.tile_pairs is not None
    truth = mm.dense(mod, batch, 1, lq, lk).expand(batch, 1, lq, lk)
    assert mm.allowed_pairs(mod, batch, lq, lk) == int(truth.sum()) // batch, mod.name
    assert mm.nonempty_tile_pairs(mod, batch, 1, lq, lk, tq, tk) == _tile_walk(
        mod, batch, lq, lk, tq, tk
    ), mod.name


@settings(max_examples=200, deadline=None)
@given(
    data=st.data(),
    lq=st.integers(1, 300),
    lk=st.integers(1, 300),
    batch=st.integers(1, 2),
    tq=st.integers(1, 64),
    tk=st.integers(1, 64),
)
def test_one_predicate_through_the_composition_counter_equals_its_own_closed_form(
    data, lq, lk, batch, tq, tk
):
    """``m & m`` is ``m`` (absorbed) counted by the composition code: it agrees with m's own formulas."""
    mod = data.draw(builtins(lq, lk, batch))
    same = mod & mod
    assert len(same.form) == 1 and len(same.form[0]) == 1
    assert mm.allowed_pairs(same, batch, lq, lk) == mm.allowed_pairs(mod, batch, lq, lk), mod.name
    assert mm.nonempty_tile_pairs(same, batch, 1, lq, lk, tq, tk) == mm.nonempty_tile_pairs(
        mod, batch, 1, lq, lk, tq, tk
    )


@settings(max_examples=60, deadline=None)
@given(
    data=st.data(),
    lq=st.integers(1, 400),
    lk=st.integers(1, 400),
    tq=st.integers(2, 64),
    tk=st.integers(2, 64),
)
def test_composed_tile_counts_at_longer_lengths(data, lq, lk, tq, tk):
    """Longer lengths, wider tiles and windows: many tiles per document and per piece."""
    a = data.draw(compositions(lq, lk, 1, 1))
    b = data.draw(compositions(lq, lk, 1, 1))
    for mod in (a & b, a | b):
        assume(mod.form is not None)
        assert mm.nonempty_tile_pairs(mod, 1, 1, lq, lk, tq, tk) == _tile_walk(
            mod, 1, lq, lk, tq, tk
        ), mod.name
        assert mm.allowed_pairs(mod, 1, lq, lk) == int(
            mm.dense(mod, 1, 1, lq, lk).expand(1, 1, lq, lk).sum()
        ), mod.name


LONG = 10**9
LONG_COMPOSITIONS = [
    lambda: mm.causal() & mm.sliding_window(8),
    lambda: mm.causal() & mm.document([3 * 10**8, 10**8, 4 * 10**8, 2 * 10**8]),
    lambda: mm.prefix_lm(4096) | mm.sliding_window(128),
    lambda: (mm.prefix_lm(10**6) | mm.sliding_window(128)) & mm.causal(),
    lambda: mm.document([5 * 10**8, 5 * 10**8]) & (mm.sliding_window(64) | mm.prefix_lm(10**5)),
    lambda: mm.causal() & mm.valid_lengths(torch.tensor([10**8, 7 * 10**8])),
]


@pytest.mark.parametrize("make", LONG_COMPOSITIONS)
def test_composed_counts_answer_at_a_billion_in_well_under_a_second(make):
    """The battery's hang: causal & sliding_window(8) at L=10**9 walked ~4e6 tiles and never answered."""
    import time

    mod = make()
    t0 = time.perf_counter()
    pairs = mm.allowed_pairs(mod, 2 if mod.uses_batch else 1, LONG, LONG)
    tiles = mm.nonempty_tile_pairs(mod, 2 if mod.uses_batch else 1, 1, LONG, LONG, 128, 64)
    assert time.perf_counter() - t0 < 0.5, mod.name
    assert 0 < pairs <= tiles <= LONG * LONG


def test_composed_counts_at_a_billion_match_hand_sums():
    n = LONG
    assert (
        mm.allowed_pairs(mm.causal() & mm.sliding_window(8), 1, n, n) == 9 * n - 36
    )  # rows i see min(i, 8) + 1
    docs = [3 * 10**8, 10**8, 6 * 10**8]
    assert mm.allowed_pairs(mm.causal() & mm.document(docs), 1, n, n) == sum(
        d * (d + 1) // 2 for d in docs
    )
    # prefix_lm(p) | causal is prefix_lm(p); causal | sliding_window(w) adds w keys ahead of each row but the last w
    assert mm.allowed_pairs(mm.prefix_lm(10**4) | mm.causal(), 1, n, n) == mm.allowed_pairs(
        mm.prefix_lm(10**4), 1, n, n
    )
    assert (
        mm.allowed_pairs(mm.causal() | mm.sliding_window(5), 1, n, n)
        == n * (n + 1) // 2 + 5 * n - 15
    )
    # Tiles of 64: causal & sliding_window(8) meets the diagonal tile and, past the first row of tiles, the one before it
    assert mm.nonempty_tile_pairs(
        mm.causal() & mm.sliding_window(8), 1, 1, 64 * n, 64 * n, 64, 64
    ) == 64 * 64 * (2 * n - 1)


def test_counts_without_a_closed_form_refuse_instead_of_hanging():
    import dataclasses
    import time

    walked = dataclasses.replace(mm.causal() & mm.sliding_window(8), pairs=None, tile_pairs=None)
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match="would walk"):
        mm.allowed_pairs(walked, 1, LONG, LONG)
    with pytest.raises(ValueError, match="would walk"):
        mm.nonempty_tile_pairs(walked, 1, 1, LONG, LONG, 64, 64)
    assert time.perf_counter() - t0 < 0.5
    assert mm.allowed_pairs(walked, 1, 100, 90, block=8) == mm.allowed_pairs(
        mm.causal() & mm.sliding_window(8), 1, 100, 90
    )


def test_absorbed_and_repeated_terms():
    c, w = mm.causal(), mm.sliding_window(3)
    assert len((c | (c & w)).form) == 1  # c | (c & w) is c
    assert len(((c | w) & (c | w)).form) == 2
    assert mm.allowed_pairs(c | (c & w), 1, 50, 40) == mm.allowed_pairs(c, 1, 50, 40)


@pytest.mark.parametrize(
    "call,exc,match",
    [
        (lambda: mm.and_(), TypeError, "at least one MaskMod"),
        (lambda: mm.or_(), TypeError, "at least one MaskMod"),
        (lambda: mm.and_(mm.causal(), 5), TypeError, "MaskMod"),
        (lambda: mm.document(5), TypeError, "sequence of ints"),
        (lambda: mm.allowed_pairs(mm.causal(), 1, -1, 4), ValueError, "lq"),
        (lambda: mm.allowed_pairs(None, 1, 4, 0), ValueError, "lk"),
        (lambda: mm.allowed_pairs(mm.causal(), True, 4, 4), TypeError, "batch"),
        (lambda: mm.allowed_pairs(mm.causal(), 1, 4, 4, block=0), ValueError, "block"),
        (lambda: mm.nonempty_tile_pairs(mm.causal(), 1, 1, 4, 4, 0, 4), ValueError, "tq"),
        (lambda: mm.nonempty_tile_pairs(mm.causal(), 1, 1, 4, 4, 4, 2.0), TypeError, "tk"),
        (lambda: mm.nonempty_tile_pairs(mm.causal(), 1, False, 4, 4, 4, 4), TypeError, "heads"),
    ],
)
def test_bad_calls_are_named(call, exc, match):
    with pytest.raises(exc, match=match):
        call()


@given(m=st.integers(-5, 5), c=st.integers(-30, 30), s=st.integers(-10, 10), n=st.integers(0, 12))
def test_the_half_line_helper_is_exact(m, c, s, n):
    """``where_positive`` bounds every sum above; some of its branches no built-in predicate reaches."""
    lo, hi = mask_sums.where_positive(m, c, s, s + n)
    assert [i for i in range(s, s + n) if m * i + c > 0] == list(range(lo, hi))
