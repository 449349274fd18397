"""``chunked``'s tiling, its two code paths (reused buffers / functional) and its memory model."""

from __future__ import annotations

import math
import zlib
from unittest import mock

import numpy as np
import pytest
import torch

import attnbench
from attnbench import AttnSpec, mask_mods
from attnbench.analysis.complexity import fit_deterministic
from attnbench.measure.memory import cpu_peak_tensor_bytes
from attnbench.variants.chunked import ChunkedAttention, default_chunks
from tests.conftest import assert_close_to_reference


def test_unmasked_rows_are_a_few_wide_tiles_and_causal_rows_skip_the_empty_half():
    v = ChunkedAttention(q_chunk=128)
    assert v.chunks(4096, 4096, "float32") == (128, 4096)  # 2 MiB of float32 keys per (B, H) tile
    for _, _, row in v._tile_states(None, 1, 8, 4096, 4096, "float32"):
        assert row == [(0, 4096, mask_mods.TileState.FULL)]
    causal = mask_mods.causal()
    grid = v._tile_states(causal, 1, 8, 4096, 4096, "float32")
    assert grid[0][2] == [(0, 128, mask_mods.TileState.PARTIAL)]
    for i, (q0, _, row) in enumerate(
        grid[1:], start=1
    ):  # one merged full run, then the diagonal block
        assert row == [
            (0, q0, mask_mods.TileState.FULL),
            (q0, q0 + 128, mask_mods.TileState.PARTIAL),
        ], i
    # the eager default: 256 x 2048, full runs merged up to 2048 keys
    assert default_chunks(4096, 4096, "float32") == (256, 2048)
    assert default_chunks(4096, 8192, "bfloat16") == (256, 4096)
    row = ChunkedAttention()._tile_states(causal, 1, 1, 4096, 4096, "float32")[-1][2]
    assert [(k0, k1) for k0, k1, _ in row] == [(0, 2048), (2048, 3840), (3840, 4096)]


@pytest.mark.parametrize("mask", ["none", "causal", "document", "valid_lengths"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_many_tiles_match_the_reference_in_every_dtype(mask, dtype):
    """Tiles of 16 rows, keys merged up to 48 wide: exp2, the merged runs and the reused buffers."""
    spec = AttnSpec(
        batch=2, heads=2, seq_len=100, seq_len_k=130, head_dim=16, mask=mask, dtype=dtype
    )
    q, k, v, mod = spec.make_inputs(
        seed=zlib.crc32(f"chunked-{mask}-{dtype}".encode()), mask_form="mod"
    )
    variant = ChunkedAttention(q_chunk=16, k_chunk=48)
    variant.name = "chunked"
    with torch.no_grad():
        assert_close_to_reference(variant, q, k, v, mod)


@pytest.mark.parametrize("mask", ["none", "causal"])
def test_reused_buffers_and_the_functional_path_agree_and_backward_is_exact(mask):
    spec = AttnSpec(batch=1, heads=2, seq_len=96, head_dim=8, mask=mask, dtype="float64")
    q, k, v, mod = spec.make_inputs(seed=zlib.crc32(f"paths-{mask}".encode()), mask_form="mod")
    variant = ChunkedAttention(q_chunk=16, k_chunk=32)
    with torch.no_grad():
        reused = variant(q, k, v, mod)  # no autograd: in-place updates of one score buffer
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    functional = variant(*leaves, mod)
    torch.testing.assert_close(reused, functional.detach(), rtol=0, atol=1e-12)
    grad = torch.randn_like(functional)
    functional.backward(grad)
    ref_leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    dense = None if mod is None else mask_mods.dense(mod, 1, 2, 96, 96)
    attnbench.reference_attention(*ref_leaves, dense).backward(grad)
    for ours, ref in zip(leaves, ref_leaves, strict=True):
        torch.testing.assert_close(ours.grad, ref.grad, rtol=1e-9, atol=1e-10)


MEMORY_CASES = [
    dict(seq_len=1024, heads=4, head_dim=32),
    dict(seq_len=2048, heads=2, head_dim=64, mask="causal"),
    dict(seq_len=1536, heads=2, head_dim=64, dtype="bfloat16"),
]


def _peak(variant, spec, functional=False):
    q, k, v, mod = spec.make_inputs(mask_form="mod")
    mask4 = variant.validate(q, k, v, mod)
    with torch.no_grad(), mock.patch.object(torch.compiler, "is_compiling", lambda: functional):
        # functional: the path torch.compile traces, a fresh score tile per tile
        return cpu_peak_tensor_bytes(lambda: variant.forward(q, k, v, mask4))


def _gemm_scratch(variant, spec) -> int:
    """Bytes torch's own CPU GEMMs allocate inside one query block's two products (scores ``Q Kᵀ``, then ``P V``),
    measured on the forward's own shapes: 0 where the CPU multiplies the dtype natively; a float32 tile's worth where
    it does not (bfloat16 without AVX512-BF16 or AMX: seen 140,288 to 214,656 bytes for the first product and
    197,632 for the second at L=1536, H=2, with one or both alive at the forward's peak, by process history). Not
    attnbench's buffers, so not in its model: the sum bounds what they add."""
    cq, ck = variant.chunks(spec.lq, spec.lk, spec.dtype)
    q, k, v, _ = spec.make_inputs(mask_form="mod")
    q, k, v = (t.flatten(0, 1) for t in (q, k, v))  # (B*H, L, D)
    scores, acc = q.new_empty(q.shape[0], cq, ck), q.new_empty(q.shape[0], cq, v.shape[-1])
    products = (
        lambda: torch.bmm(q[:, :cq], k[:, :ck].transpose(1, 2), out=scores),
        lambda: torch.bmm(scores, v[:, :ck], out=acc),
    )
    return sum(cpu_peak_tensor_bytes(product) or 0 for product in products)


@pytest.mark.parametrize(
    "case", MEMORY_CASES, ids=lambda c: "-".join(f"{k}{v}" for k, v in c.items())
)
def test_forward_peak_matches_the_memory_model(case):
    """The measured forward peak is the predicted one (1%), plus at most torch's own GEMM scratch on this CPU (none in
    float32); planted: the per-tile functional path exceeds it."""
    spec = AttnSpec(batch=1, **case)
    variant = attnbench.get_variant("chunked")
    predicted = variant.predicted_peak_bytes(spec)
    peak = _peak(variant, spec)
    if peak is None:
        pytest.skip("the profiler's memory timeline is unavailable")
    scratch = _gemm_scratch(variant, spec)
    tile = (
        math.prod(variant.chunks(spec.lq, spec.lk, spec.dtype)) * 4
    )  # one float32 score tile of one head
    assert scratch <= 2 * 1.05 * tile * torch.get_num_threads(), (
        scratch,
        tile,
    )  # a tile a thread a product at most
    assert -0.01 * predicted < peak - predicted < scratch + 0.01 * predicted, (
        peak,
        scratch,
        predicted,
    )
    # A score buffer allocated per tile (what the reuse defends against) is visibly more than the model.
    assert _peak(variant, spec, functional=True) > 1.1 * predicted


# ---- the recomputing backward (FlashAttention-2's scheme): exact gradients in O(L) memory ------
GRAD_MASKS = ["none", "causal", "valid_lengths", "sliding_window", "document", "prefix_lm"]


@pytest.mark.parametrize("mask", GRAD_MASKS)
def test_backward_passes_float64_gradcheck_on_every_mask_kind(mask):
    """Odd shapes (Lq != Lk, GQA, Dv != D) and tiles that do not divide them; every mask chunked takes."""
    spec = AttnSpec(
        batch=2, heads=2, kv_heads=1, seq_len=7, seq_len_k=9, head_dim=3, head_dim_v=2,
        mask=mask, window=4, dtype="float64",
    )  # fmt: skip
    if ChunkedAttention().not_supported_reasons(spec):
        pytest.skip("; ".join(ChunkedAttention().not_supported_reasons(spec)))
    q, k, v, mod = spec.make_inputs(seed=zlib.crc32(f"gradcheck-{mask}".encode()), mask_form="mod")
    variant = ChunkedAttention(q_chunk=3, k_chunk=4)
    mask4 = variant.validate(q, k, v, mod)
    leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
    assert torch.autograd.gradcheck(lambda *x: variant.forward(*x, mask4), leaves)


@pytest.mark.parametrize("mask", ["none", "causal", "valid_lengths"])
def test_float32_gradients_match_the_batched_variants_autograd(mask):
    spec = AttnSpec(batch=1, heads=4, kv_heads=2, seq_len=160, head_dim=16, mask=mask)
    q, k, v, mod = spec.make_inputs(seed=zlib.crc32(f"vs-batched-{mask}".encode()), mask_form="mod")
    grad = torch.randn(1, 4, 160, 16, generator=torch.Generator().manual_seed(3))
    grads = []
    for variant in (ChunkedAttention(q_chunk=32, k_chunk=48), attnbench.get_variant("batched")):
        leaves = [t.clone().requires_grad_(True) for t in (q, k, v)]
        out = variant(*leaves, mod)
        grads.append(torch.autograd.grad(out, leaves, grad))
    for ours, theirs in zip(*grads, strict=True):
        torch.testing.assert_close(ours, theirs, rtol=1e-4, atol=1e-5)


def _backward_peak(variant, spec):
    q, k, v, mod = spec.make_inputs(requires_grad=True, mask_form="mod")
    mask4 = variant.validate(q, k, v, mod)
    grad = torch.ones(*q.shape[:3], v.shape[-1])

    def step():
        return torch.autograd.grad(variant.forward(q, k, v, mask4), (q, k, v), grad)

    return cpu_peak_tensor_bytes(step)


@pytest.mark.slow
@pytest.mark.parametrize("mask", ["none", "causal"])
def test_backward_peak_memory_grows_linearly(mask):
    """Forward + backward peak bytes at four lengths fit L^1.1 or less (autograd through the tiles,
    the code before the recomputing backward: L^1.9)."""
    variant = ChunkedAttention(q_chunk=64, k_chunk=64)
    lengths = [128, 256, 512, 1024]
    peaks = [
        _backward_peak(variant, AttnSpec(batch=1, heads=2, seq_len=n, head_dim=16, mask=mask))
        for n in lengths
    ]
    if None in peaks:
        pytest.skip("the profiler's memory timeline is unavailable")
    fit = fit_deterministic(np.array(lengths), np.array(peaks, dtype=float))
    assert fit["exponent"] <= 1.1, (fit["exponent"], peaks)
