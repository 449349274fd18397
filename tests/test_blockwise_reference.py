"""The blockwise float64 reference: online softmax over key tiles, equal to the dense reference.

Tiles are made tiny (a few rows and keys) so every shape drawn spans many of them, partial ones
at the edges included.
"""

from __future__ import annotations

import math
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench import AttnSpec, mask_mods, masks, reference
from attnbench.measure.memory import cpu_peak_tensor_bytes
from attnbench.reference import blockwise_reference_attention, reference_attention


def _tiny_tiles(rows: int = 3, elements: int = 3 * 4):
    """Query blocks of ``rows`` and tiles of ``elements`` pairs (keys: elements // rows)."""
    return mock.patch.multiple(reference, Q_TILE=rows, TILE_ELEMENTS=elements)


def _block_pattern(lq: int, lk: int, block: int, seed: int) -> torch.Tensor:
    """A random block pattern ``(Lq, Lk)``, as block-sparse variants use (edge blocks partial)."""
    gen = torch.Generator().manual_seed(seed)
    blocks = torch.rand(-(-lq // block), -(-lk // block), generator=gen) > 0.5
    return blocks.repeat_interleave(block, 0)[:lq].repeat_interleave(block, 1)[:, :lk]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    mask=st.sampled_from([*masks.MASK_KINDS, "blocks"]),
    batch=st.integers(1, 2),
    kv_heads=st.sampled_from([1, 2]),
    group=st.sampled_from([1, 3]),
    lq=st.integers(1, 17),
    lk=st.integers(1, 19),
    dims=st.tuples(st.integers(1, 5), st.integers(1, 4)),
    tile=st.tuples(st.integers(1, 5), st.integers(1, 7)),
    seed=st.integers(0, 2**16),
)
def test_blockwise_equals_dense_on_every_mask_kind_at_odd_shapes(
    mask, batch, kv_heads, group, lq, lk, dims, tile, seed
):
    spec = AttnSpec(
        batch=batch, heads=kv_heads * group, kv_heads=kv_heads, seq_len=lq, seq_len_k=lk,
        head_dim=dims[0], head_dim_v=dims[1], dtype="float64", window=3,
        mask="none" if mask == "blocks" else mask,
    )  # fmt: skip
    q, k, v, mod = spec.make_inputs(seed=seed, mask_form="mod")
    if mask == "blocks":
        dense = _block_pattern(lq, lk, 2, seed)
        given_masks = [dense]
    else:
        dense = None if mod is None else mask_mods.dense(mod, batch, spec.heads, lq, lk)
        given_masks = [mod, dense]  # the predicate (per tile) and the tensor give the same
    want = reference_attention(q, k, v, dense)
    with _tiny_tiles(tile[0], tile[0] * tile[1]):
        for m in given_masks:
            got = blockwise_reference_attention(q, k, v, m)
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14)


def test_non_finite_inputs_spread_nan_from_allowed_positions_only():
    """As the dense reference: NaN in an allowed key's value poisons, in a masked one does not."""
    spec = AttnSpec(batch=1, heads=2, seq_len=9, head_dim=4, mask="causal", dtype="float64")
    q, k, v, _ = spec.make_inputs(seed=5)
    dense = mask_mods.dense(mask_mods.causal(), 1, 2, 9, 9)
    v[0, 0, 4, 1] = math.nan  # allowed for queries 4.. only
    q[0, 1, 2, 0] = math.inf  # query row 2 of head 1: inf scores
    k[0, 1, 7, 2] = math.nan  # key 7 of head 1: masked for queries 0..6
    want = reference_attention(q, k, v, dense)
    with _tiny_tiles(2, 2 * 3):
        got = blockwise_reference_attention(q, k, v, dense)
    assert torch.equal(got.isnan(), want.isnan()) and want.isnan().any()
    torch.testing.assert_close(got.nan_to_num(), want.nan_to_num(), rtol=1e-12, atol=1e-14)


@pytest.mark.parametrize("fn", [reference_attention, blockwise_reference_attention])
def test_meta_tensors_are_refused_with_a_clear_error(fn):
    q = torch.empty(1, 2, 8, 4, device="meta")
    with pytest.raises(ValueError, match="meta tensors"):
        fn(q, q, q)


@pytest.mark.slow
def test_gradients_equal_the_dense_ones_in_o_l_tile_memory():
    """Backward recomputes one query block at a time: dense gradients, a fraction of the memory."""
    spec = AttnSpec(batch=1, heads=2, kv_heads=1, seq_len=256, head_dim=8, mask="valid_lengths")
    spec = spec.replace(dtype="float64")
    q, k, v, mod = spec.make_inputs(seed=11, mask_form="mod")
    dense = mask_mods.dense(mod, 1, 2, 256, 256)
    grad = torch.randn(
        1, 2, 256, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1)
    )

    def grads(fn, m):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        return torch.autograd.grad(fn(*leaves, m), leaves, grad)

    with _tiny_tiles(32, 32 * 64):
        ours = grads(blockwise_reference_attention, mod)
        peak = cpu_peak_tensor_bytes(lambda: grads(blockwise_reference_attention, mod))
    for got, want in zip(ours, grads(reference_attention, dense), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-11, atol=1e-13)
    if peak is None:
        pytest.skip("the profiler's memory timeline is unavailable")
    one_matrix = 2 * 256 * 256 * 8  # one (H, Lq, Lk) float64 score matrix: dense keeps several
    assert peak < one_matrix / 2, peak
