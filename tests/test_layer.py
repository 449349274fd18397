"""AttentionLayer's state_dict is interchangeable with torch.nn.MultiheadAttention's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import attnbench
from attnbench import AttentionLayer, masks
from tests.conftest import cheap_variants

CORES = ["batched", "sdpa", "chunked", "multihead", "vectorized"]


def _inputs(kdim, vdim, lk=9):
    gen = torch.Generator().manual_seed(0)
    query = torch.randn(2, 7, 16, generator=gen)
    key = torch.randn(2, lk, kdim, generator=gen)
    value = torch.randn(2, lk, vdim, generator=gen)
    return query, key, value


@pytest.mark.parametrize("core", CORES)
@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("dims", [(16, 16), (12, 20)], ids=["same-dims", "kdim-vdim"])
@pytest.mark.parametrize("direction", ["torch-to-ours", "ours-to-torch"])
def test_state_dict_interchangeable(core, bias, dims, direction):
    kdim, vdim = dims
    torch.manual_seed(1)
    ref = nn.MultiheadAttention(16, 4, bias=bias, batch_first=True, kdim=kdim, vdim=vdim)
    ours = AttentionLayer(16, 4, variant=core, bias=bias, kdim=kdim, vdim=vdim)
    if direction == "torch-to-ours":
        ours.load_state_dict(ref.state_dict())
    else:
        with torch.no_grad():  # make our weights non-default so loading is observable
            for p in ours.parameters():
                p.normal_()
        ref.load_state_dict(ours.state_dict())
    assert set(ours.state_dict()) == set(ref.state_dict())
    query, key, value = _inputs(kdim, vdim)
    ref.eval()
    expected, _ = ref(query, key, value, need_weights=False)
    torch.testing.assert_close(ours(query, key, value), expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("core", CORES)
def test_masks_agree_with_mha(core):
    torch.manual_seed(2)
    ref = nn.MultiheadAttention(16, 4, batch_first=True).eval()
    ours = AttentionLayer(16, 4, variant=core)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 9, 16)
    causal = masks.causal(9, 9)
    expected, _ = ref(x, x, x, attn_mask=~causal[0, 0], need_weights=False)  # MHA: True = blocked
    torch.testing.assert_close(ours(x, mask=causal), expected, rtol=1e-5, atol=1e-5)
    padding = masks.valid_lengths(torch.tensor([9, 4]), 9, 9)
    expected, _ = ref(x, x, x, key_padding_mask=~padding[:, 0, 0], need_weights=False)
    torch.testing.assert_close(ours(x, mask=padding), expected, rtol=1e-5, atol=1e-5)


def test_sequence_first_layout():
    torch.manual_seed(3)
    ref = nn.MultiheadAttention(16, 2, batch_first=False).eval()
    ours = AttentionLayer(16, 2, batch_first=False)
    ours.load_state_dict(ref.state_dict())
    x = torch.randn(5, 3, 16)  # (L, B, E)
    torch.testing.assert_close(
        ours(x, x, x), ref(x, x, x, need_weights=False)[0], rtol=1e-5, atol=1e-5
    )


def test_every_registered_core_runs_in_the_layer():
    x = torch.randn(1, 8, 16)
    for name in cheap_variants():
        variant = attnbench.get_variant(name)
        if variant.not_supported_reasons(
            attnbench.AttnSpec(batch=1, heads=2, seq_len=8, head_dim=8)
        ):
            continue
        assert AttentionLayer(16, 2, variant=variant)(x).shape == (1, 8, 16), name


def test_layer_rejects_bad_configuration():
    with pytest.raises(ValueError, match="divisible"):
        AttentionLayer(10, 3)
    with pytest.raises(ValueError, match="unknown variant 'nope'"):
        AttentionLayer(8, 2, variant="nope")
    with pytest.raises(TypeError, match="variant"):
        AttentionLayer(8, 2, variant=42)
    with pytest.raises(ValueError, match="query must have shape"):
        AttentionLayer(8, 2)(torch.randn(2, 3, 5))


@pytest.mark.parametrize("core", ["batched", "sdpa", "chunked", "multihead"])
@pytest.mark.parametrize("kv_heads", [4, 2, 1])
def test_gqa_layer_is_the_mha_layer_with_shared_key_value_projections(core, kv_heads):
    """kv_heads = Hkv: k/v projections of Hkv*Dh features; equal to MHA whose k/v weights repeat each group's head."""
    torch.manual_seed(2)
    gqa = AttentionLayer(16, 4, variant=core, kv_heads=kv_heads)
    mha = AttentionLayer(16, 4, variant=core, kdim=16, vdim=16, kv_heads=None)
    dh, g = 4, 4 // kv_heads
    w_q, w_k, w_v = gqa._weights()
    assert w_k.shape == (kv_heads * dh, 16) and gqa.in_proj_bias.shape == (16 + 2 * kv_heads * dh,)
    with torch.no_grad():
        b_q, b_k, b_v = torch.randn(16), torch.randn(kv_heads * dh), torch.randn(kv_heads * dh)
        gqa.in_proj_bias.copy_(torch.cat([b_q, b_k, b_v]))
        # head h of the MHA layer uses rows of kv head h // G
        rows = torch.cat([torch.arange(dh) + (h // g) * dh for h in range(4)])
        mha.in_proj_weight.copy_(torch.cat([w_q, w_k[rows], w_v[rows]]))
        mha.in_proj_bias.copy_(torch.cat([b_q, b_k[rows], b_v[rows]]))
        mha.out_proj.load_state_dict(gqa.out_proj.state_dict())
    query, key, value = _inputs(16, 16)
    assert torch.allclose(gqa(query, key, value), mha(query, key, value), atol=1e-5)


def test_gqa_layer_state_dict_does_not_load_into_mha():
    gqa = AttentionLayer(16, 4, variant="batched", kv_heads=2)
    with pytest.raises(RuntimeError, match="size mismatch"):
        nn.MultiheadAttention(16, 4, batch_first=True, kdim=16, vdim=16).load_state_dict(
            gqa.state_dict(), strict=False
        )


@pytest.mark.parametrize("kv_heads", [3, 0])
def test_gqa_layer_rejects_kv_heads_not_dividing(kv_heads):
    with pytest.raises(ValueError, match="kv_heads"):
        AttentionLayer(16, 4, kv_heads=kv_heads)


def test_gqa_layer_with_a_core_without_gqa_names_the_reason():
    layer = AttentionLayer(16, 4, variant="torch_mha", kv_heads=2)
    with pytest.raises(ValueError, match="grouped-query attention"):
        layer(torch.randn(1, 5, 16))
