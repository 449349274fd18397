"""Mask predicates: every consumer (dense tensor, tiles, tile states, pair counts) agrees with brute force."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from attnbench import mask_mods as mm


def _brute(mod: mm.MaskMod, batch: int, lq: int, lk: int) -> torch.Tensor:
    """The predicate evaluated one pair at a time: the slow, obviously right version."""
    out = torch.zeros(batch, 1, lq, lk, dtype=torch.bool)
    for b in range(batch):
        for i in range(lq):
            for j in range(lk):
                out[b, 0, i, j] = bool(mod.fn(torch.tensor(b), torch.tensor(0), torch.tensor(i), torch.tensor(j)))
    return out


@st.composite
def mods(draw, lq: int, batch: int, depth: int = 2) -> mm.MaskMod:
    kind = draw(st.sampled_from(["causal", "sliding", "prefix", "document", "valid", "and", "or"] if depth else ["causal", "sliding", "prefix", "document", "valid"]))
    if kind == "causal":
        return mm.causal()
    if kind == "sliding":
        return mm.sliding_window(draw(st.integers(0, 6)))
    if kind == "prefix":
        return mm.prefix_lm(draw(st.integers(0, lq)))
    if kind == "document":
        return mm.document(draw(st.lists(st.integers(1, 9), min_size=1, max_size=5)))
    if kind == "valid":
        return mm.valid_lengths(torch.tensor(draw(st.lists(st.integers(0, 30), min_size=batch, max_size=batch))))
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
    if state == mm.FULL:
        assert values.all(), mod.name
    elif state == mm.EMPTY:
        assert not values.any(), mod.name
    elif " & " not in mod.name and " | " not in mod.name:  # a primitive's closed form is exact
        assert values.any() and not values.all(), (mod.name, q0, q1, k0, k1)


def test_smallest_broadcast_shapes():
    assert mm.dense(mm.causal(), 4, 8, 5, 6).shape == (1, 1, 5, 6)
    assert mm.dense(mm.valid_lengths(torch.tensor([1, 2])), 2, 8, 5, 6).shape == (2, 1, 1, 6)
    assert mm.dense(mm.valid_lengths(torch.tensor([[1, 2], [3, 4]])), 2, 8, 2, 6).shape == (2, 1, 2, 6)
    assert mm.dense(mm.causal() & mm.valid_lengths(torch.tensor([1, 2])), 2, 8, 5, 6).shape == (2, 1, 5, 6)


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
    [(mm.sliding_window, (-1,), ValueError), (mm.prefix_lm, (1.5,), TypeError), (mm.document, ([],), ValueError),
     (mm.document, ([3, 0],), ValueError), (mm.valid_lengths, ([1, 2],), TypeError),
     (mm.valid_lengths, (torch.tensor([1.0]),), TypeError)],
)
def test_bad_arguments_are_named(factory, args, exc):
    with pytest.raises(exc):
        factory(*args)


def test_flex_attention_takes_the_predicate_as_its_mask_mod():
    flex = pytest.importorskip("torch.nn.attention.flex_attention")
    mod = mm.causal() & mm.document([5, 9, 2])
    block = flex.create_block_mask(mod.fn, None, None, 16, 16, device="cpu", BLOCK_SIZE=4)
    assert torch.equal(block.to_dense().bool().any() , torch.tensor(True))
    dense_blocks = block.to_dense()[0, 0].bool()  # (Lq/4, Lk/4) tiles flex will visit
    for i in range(4):
        for j in range(4):
            state = mm.block_state(mod, 1, 1, 4 * i, 4 * i + 4, 4 * j, 4 * j + 4)
            assert bool(dense_blocks[i, j]) == (state != mm.EMPTY), (i, j, state)
