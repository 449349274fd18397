"""Properties that say more than examples: permutation invariance, causality, chunking, sparsity."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnbench
from attnbench import masks
from tests.conftest import cheap_variants

# Compiled variants recompile for every new shape hypothesis draws; their eager bases are covered.
POSITION_FREE = [n for n in cheap_variants() if not hasattr(attnbench.get_variant(n), "pattern")]
CAUSAL_CAPABLE = [
    n for n in cheap_variants() if "causal" in attnbench.get_variant(n).SUPPORTED_MASKS
]


def _runnable(name: str, spec: attnbench.AttnSpec):
    variant = attnbench.get_variant(name)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    return variant


@pytest.mark.parametrize("name", POSITION_FREE)
@given(lk=st.integers(2, 24), seed=st.integers(0, 2**16))
def test_permuting_keys_and_values_together_changes_nothing(name, lk, seed):
    spec = attnbench.AttnSpec(
        batch=1, heads=2, seq_len=7, seq_len_k=lk, head_dim=8, dtype="float64"
    )
    variant = _runnable(name, spec)
    q, k, v, _ = spec.make_inputs(seed=seed)
    perm = torch.randperm(lk, generator=torch.Generator().manual_seed(seed))
    out = variant(q, k, v)
    out_perm = variant(q, k[:, :, perm], v[:, :, perm])
    torch.testing.assert_close(out, out_perm, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("name", CAUSAL_CAPABLE)
@given(length=st.integers(2, 24), data=st.data())
def test_causal_output_ignores_the_future(name, length, data):
    spec = attnbench.AttnSpec(
        batch=1, heads=2, seq_len=length, head_dim=8, dtype="float64", mask="causal"
    )
    variant = _runnable(name, spec)
    i = data.draw(st.integers(0, length - 2), label="position")
    q, k, v, mask = spec.make_inputs(seed=length)
    k2, v2 = k.clone(), v.clone()
    k2[:, :, i + 1 :] += 3.0  # change only the future of position i
    v2[:, :, i + 1 :] -= 5.0
    before = variant(q, k, v, mask)[:, :, : i + 1]
    after = variant(q, k2, v2, mask)[:, :, : i + 1]
    torch.testing.assert_close(before, after, rtol=1e-9, atol=1e-10)


@given(
    lq=st.integers(1, 40),
    lk=st.integers(1, 40),
    q_chunk=st.integers(1, 45),
    k_chunk=st.integers(1, 45),
    mask_kind=st.sampled_from(masks.MASK_KINDS),
)
def test_chunked_equals_dense_for_every_chunk_size(lq, lk, q_chunk, k_chunk, mask_kind):
    spec = attnbench.AttnSpec(
        batch=2,
        heads=1,
        seq_len=lq,
        seq_len_k=lk,
        head_dim=4,
        dtype="float64",
        mask=mask_kind,
        window=3,
    )
    q, k, v, mask = spec.make_inputs(seed=lq * 100 + lk)
    chunked = attnbench.get_variant("chunked", q_chunk=q_chunk, k_chunk=k_chunk)
    dense = attnbench.get_variant("batched")
    torch.testing.assert_close(chunked(q, k, v, mask), dense(q, k, v, mask), rtol=1e-9, atol=1e-10)


@given(
    length=st.integers(1, 90),
    block=st.integers(1, 16),
    global_blocks=st.integers(0, 2),
    window_blocks=st.integers(0, 2),
    random_blocks=st.integers(0, 3),
    seed=st.integers(0, 100),
    mask_kind=st.sampled_from(masks.MASK_KINDS),
)
def test_block_sparse_equals_reference_with_its_own_mask(
    length, block, global_blocks, window_blocks, random_blocks, seed, mask_kind
):
    variant = attnbench.get_variant(
        "block_sparse",
        block=block,
        global_blocks=global_blocks,
        window_blocks=window_blocks,
        random_blocks=random_blocks,
        seed=seed,
    )
    spec = attnbench.AttnSpec(
        batch=2, heads=2, seq_len=length, head_dim=4, dtype="float64", mask=mask_kind, window=5
    )
    q, k, v, mask = spec.make_inputs(seed=seed)
    expected = attnbench.reference_attention(
        q, k, v, masks.combine(variant.pattern(length, length), mask)
    )
    torch.testing.assert_close(variant(q, k, v, mask), expected, rtol=1e-9, atol=1e-10)


@given(
    lq=st.integers(1, 60),
    lk=st.integers(1, 60),
    window=st.integers(0, 9),
    mask_kind=st.sampled_from(masks.MASK_KINDS),
)
def test_local_equals_reference_with_sliding_window(lq, lk, window, mask_kind):
    spec = attnbench.AttnSpec(
        batch=2,
        heads=1,
        seq_len=lq,
        seq_len_k=lk,
        head_dim=4,
        dtype="float64",
        mask=mask_kind,
        window=4,
    )
    q, k, v, mask = spec.make_inputs(seed=lq + 7 * lk)
    expected = attnbench.reference_attention(
        q, k, v, masks.combine(masks.sliding_window(lq, lk, window), mask)
    )
    torch.testing.assert_close(
        attnbench.get_variant("local", window=window)(q, k, v, mask),
        expected,
        rtol=1e-9,
        atol=1e-10,
    )


def test_block_sparse_pattern_has_global_window_and_random_blocks():
    variant = attnbench.get_variant(
        "block_sparse", block=4, global_blocks=1, window_blocks=1, random_blocks=2, seed=0
    )
    blocks = variant.blocks(64)  # 16 blocks
    assert blocks[0].all() and blocks[:, 0].all()  # global row and column
    assert all(blocks[r, r - 1] and blocks[r, r] for r in range(1, 16))
    extra = (
        blocks.sum(1)[3:-1] - 4
    )  # rows away from the edges: global + 3 window blocks, plus random
    assert (extra == 2).all()
    assert not blocks.all()  # it is sparse
