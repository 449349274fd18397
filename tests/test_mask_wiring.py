"""Masks as predicates, wired through spec, runner, guard and variants (each defence with its planted fault)."""

from __future__ import annotations

import math
import zlib

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given
from hypothesis import strategies as st

import attnbench
from attnbench import AttnSpec, mask_mods, masks
from attnbench.capability import CallInfo
from attnbench.measure import guard, memory, runner
from attnbench.reference import reference_attention
from attnbench.variants.chunked import ChunkedAttention
from attnbench.variants.sdpa import hand_table_only
from tests.conftest import assert_close_to_reference, cheap_variants


def _dense_count(spec: AttnSpec) -> int:
    """Allowed pairs per (batch, head), averaged over the batch, by counting the dense tensor."""
    m = spec.make_mask()
    if m is None:
        return spec.lq * spec.lk
    return int(m.expand(spec.batch, 1, spec.lq, spec.lk).sum()) // spec.batch


@given(
    kind=st.sampled_from(masks.MASK_KINDS),
    lq=st.integers(1, 70),
    lk=st.integers(1, 70),
    batch=st.integers(1, 3),
    window=st.integers(1, 9),
    prefix=st.one_of(st.none(), st.integers(0, 80)),
)
def test_allowed_pairs_come_from_the_predicate_and_match_the_dense_count(
    kind, lq, lk, batch, window, prefix
):
    spec = AttnSpec(
        batch=batch,
        heads=1,
        seq_len=lq,
        seq_len_k=lk,
        head_dim=4,
        mask=kind,
        window=window,
        prefix=prefix,
    )
    assert spec.allowed_pairs() == _dense_count(spec)


def test_allowed_pairs_need_no_quadratic_work():
    """A 2^20-long causal or document spec is counted instantly (a dense count would need 1 TiB)."""
    for kind in ("causal", "document", "prefix_lm"):
        spec = AttnSpec(seq_len=2**20, mask=kind)
        assert 0 < spec.allowed_pairs() < spec.lq * spec.lk


def test_document_packing_is_deterministic_mixed_and_covers_the_sequence():
    for length in (1, 7, 33, 1000, 4096):
        lens = masks.default_document_lengths(length)
        assert sum(lens) == length and lens == masks.default_document_lengths(length)
        if length >= 33:
            assert len(set(lens)) >= 4, lens  # mixed lengths, not equal blocks
    dense = AttnSpec(batch=1, heads=1, seq_len=32, head_dim=4, mask="document").make_mask()[0, 0]
    assert dense.sum(-1).tolist() == [12] * 12 + [4] * 4 + [8] * 8 + [2] * 2 + [6] * 6


def test_prefix_lm_default_and_explicit_prefix():
    spec = AttnSpec(batch=1, heads=1, seq_len=16, head_dim=4, mask="prefix_lm")
    assert spec.prefix_len == 4
    rows = spec.make_mask()[0, 0].sum(-1).tolist()
    assert rows == [4, 4, 4, 4] + list(range(5, 17))
    assert spec.replace(prefix=10).make_mask()[0, 0, 0].sum() == 10
    with pytest.raises(ValueError, match="prefix"):
        spec.replace(prefix=-1)


def test_mask_bytes_are_the_dense_tensor_and_only_for_variants_that_receive_it():
    spec = AttnSpec(batch=2, heads=2, seq_len=30, seq_len_k=20, head_dim=4)
    for kind in masks.MASK_KINDS:
        s = spec.replace(mask=kind)
        m = s.make_mask()
        assert s.mask_bytes == (0 if m is None else m.numel() * m.element_size()), kind
        batched, chunked = attnbench.get_variant("batched"), attnbench.get_variant("chunked")
        assert guard.case_bytes(s, batched) == s.input_bytes + s.mask_bytes
        assert (
            guard.case_bytes(s, chunked) == s.input_bytes
        )  # chunked takes the predicate: no dense mask


def test_guard_skips_a_case_whose_dense_mask_alone_exceeds_the_budget():
    """Planted: a budget that holds q, k, v and the variant's peak but not the L^2 causal mask."""
    spec = AttnSpec(batch=1, heads=1, seq_len=4096, head_dim=8, mask="causal")
    variant = attnbench.get_variant("sdpa_dense_mask")
    without_mask = guard.case_bytes(
        spec.replace(mask="none"), variant
    ) + variant.predicted_peak_bytes(spec)
    budget = without_mask + spec.mask_bytes // 2
    reasons = guard.guard_reasons(
        variant, spec, memory_budget=budget, time_budget=1e9, peak_flops=1e12, calls=1
    )
    assert reasons and "inputs+mask" in reasons[0]
    # The same budget runs the predicate-taking sdpa (is_causal: nothing L^2 is built).
    assert not guard.guard_reasons(
        attnbench.get_variant("sdpa"),
        spec,
        memory_budget=budget,
        time_budget=1e9,
        peak_flops=1e12,
        calls=1,
    )


def test_runner_hands_predicates_to_variants_that_declare_them():
    spec = AttnSpec(batch=1, heads=2, seq_len=40, head_dim=8, mask="causal")
    for name, form in (
        ("chunked", mask_mods.MaskMod),
        ("sdpa", mask_mods.MaskMod),
        ("local", mask_mods.MaskMod),
        ("sdpa_dense_mask", torch.Tensor),
        ("batched", torch.Tensor),
    ):
        _, _, mask = runner.make_call(attnbench.get_variant(name), spec, seed=0)
        assert isinstance(mask, form), name
    # sdpa takes only the exactly causal predicate; anything else becomes the dense tensor.
    _, _, mask = runner.make_call(
        attnbench.get_variant("sdpa"), spec.replace(mask="prefix_lm"), seed=0
    )
    assert isinstance(mask, torch.Tensor)


def _mod_cases():
    for name in cheap_variants():
        for kind in masks.MASK_KINDS[1:]:
            for shape in ("self", "cross"):
                yield pytest.param(name, kind, shape, id=f"{name}-{kind}-{shape}")


SHAPES = {
    "self": dict(batch=2, heads=2, seq_len=45, head_dim=16),
    "cross": dict(batch=2, heads=2, seq_len=29, seq_len_k=47, head_dim=16),
}


@pytest.mark.parametrize("name,kind,shape", list(_mod_cases()))
def test_every_variant_matches_the_reference_given_the_predicate(name, kind, shape):
    """Every variant accepts the predicate (taking it or evaluating it densely) and matches float64."""
    variant = attnbench.get_variant(name)
    spec = AttnSpec(**SHAPES[shape], mask=kind, window=5)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    q, k, v, mod = spec.make_inputs(seed=zlib.crc32(f"{name}-{kind}".encode()), mask_form="mod")
    assert isinstance(mod, mask_mods.MaskMod)
    assert_close_to_reference(variant, q, k, v, mod)


class _SkipsPartialTiles(ChunkedAttention):
    """Planted: treats partial tiles as empty (a wrong block classification)."""

    def _tile_states(self, mod, batch, heads, lq, lk, dtype):
        grid = super()._tile_states(mod, batch, heads, lq, lk, dtype)
        return [
            (q0, q1, [t for t in row if t[2] != mask_mods.TileState.PARTIAL])
            for q0, q1, row in grid
        ]


@pytest.mark.parametrize("kind", ["causal", "document", "prefix_lm"])
def test_planted_wrong_tile_classification_is_caught(kind):
    spec = AttnSpec(batch=1, heads=2, seq_len=64, head_dim=8, mask=kind)
    q, k, v, mod = spec.make_inputs(mask_form="mod")
    bad = _SkipsPartialTiles(q_chunk=16, k_chunk=16)
    bad.name = "planted"
    with pytest.raises(AssertionError, match="max error"):
        assert_close_to_reference(bad, q, k, v, mod)
    good = ChunkedAttention(q_chunk=16, k_chunk=16)
    good.name = "chunked"
    assert_close_to_reference(good, q, k, v, mod)


def test_unsupported_mask_kinds_give_a_reason():
    """A variant that only takes key padding names the new kinds it cannot run."""
    spec = AttnSpec(batch=1, heads=1, seq_len=16, head_dim=4)
    for name in cheap_variants():
        v = attnbench.get_variant(name)
        for kind in ("document", "prefix_lm"):
            if kind not in v.SUPPORTED_MASKS:
                reasons = v.not_supported_reasons(spec.replace(mask=kind))
                assert any(kind in r for r in reasons), (name, reasons)
                q, k, vv, mod = spec.replace(mask=kind).make_inputs(mask_form="mod")
                with pytest.raises(ValueError, match=kind):
                    v(q, k, vv, mod)


def test_sdpa_calls_is_causal_and_sdpa_dense_mask_passes_the_tensor(monkeypatch):
    calls = []
    real = F.scaled_dot_product_attention

    def spy(*args, **kwargs):
        calls.append((kwargs.get("is_causal", False), kwargs.get("attn_mask")))
        return real(*args, **kwargs)

    monkeypatch.setattr(F, "scaled_dot_product_attention", spy)
    spec = AttnSpec(batch=1, heads=2, seq_len=24, seq_len_k=40, head_dim=8, mask="causal")
    for name in ("sdpa", "sdpa_dense_mask"):
        variant = attnbench.get_variant(name)
        call, _, _ = runner.make_call(variant, spec, seed=0)
        call()
    (causal_flag, causal_mask), (dense_flag, dense_mask) = calls
    assert causal_flag is True and causal_mask is None
    assert (
        dense_flag is False
        and isinstance(dense_mask, torch.Tensor)
        and dense_mask.shape[-2:] == (24, 40)
    )


def test_cuda_flash_declares_causal_as_pytorch_does():
    flash, cudnn = attnbench.get_variant("sdpa_flash"), attnbench.get_variant("sdpa_cudnn")
    square = AttnSpec(
        batch=1, heads=2, seq_len=64, head_dim=16, dtype="float16", device="cuda", mask="causal"
    )

    def own(v, s):  # the hand table's rule (on a GPU, torch's answer would take its place)
        with hand_table_only():  # without "CUDA is not available on this machine"
            return [r for r in v.not_supported_reasons(s) if "not available" not in r]

    assert own(flash, square) == [] and own(cudnn, square) == []
    assert any("Lq=64 != Lk=96" in r for r in own(flash, square.replace(seq_len_k=96)))
    assert any("no explicit boolean mask" in r for r in own(flash, square.replace(mask="document")))
    assert any(
        "no explicit boolean mask" in r for r in own(flash, square.replace(mask="sliding_window"))
    )


def test_chunked_causal_executes_about_half_the_pairs():
    variant = attnbench.get_variant("chunked")
    spec = AttnSpec(seq_len=4096, mask="causal")
    ratio = variant.executed_pairs(spec) / (spec.lq * spec.lk)
    cq, ck = variant.chunks(4096, 4096, "float32")
    assert ratio == pytest.approx(
        0.5 + 0.5 * min(cq, ck) / 4096, abs=0.01
    )  # key blocks classified min(Cq, Ck) wide
    assert variant.flops(spec).executed < 0.6 * variant.flops(spec.replace(mask="none")).executed


def _peak(variant, spec, mask_form):
    q, k, v, mask = spec.make_inputs(mask_form=mask_form)
    mask4 = variant.validate(q, k, v, mask)
    with torch.no_grad():
        return memory.cpu_peak_tensor_bytes(lambda: variant.forward(q, k, v, mask4))


@pytest.mark.parametrize("name", ["local", "block_sparse"])
def test_blockwise_peak_stays_linear_with_a_causal_predicate(name):
    """Peak tensor bytes grow ~L with the causal predicate; planted: the dense-row path grows faster."""
    variant = attnbench.get_variant(name)
    base = AttnSpec(batch=1, heads=1, seq_len=4096, head_dim=16, mask="causal")
    peaks = {
        form: [_peak(variant, base.replace(seq_len=n), form) for n in (4096, 16384)]
        for form in ("mod", "dense")
    }
    if None in peaks["mod"] + peaks["dense"]:
        pytest.skip("the profiler's memory timeline is unavailable")
    exponent = {f: math.log(p[1] / p[0]) / math.log(4) for f, p in peaks.items()}
    assert exponent["mod"] <= 1.1, exponent
    assert exponent["dense"] > exponent["mod"] + 0.25, (
        exponent
    )  # the planted dense-row gather is visibly worse


def test_asv_grid_has_the_mask_parameter_and_cases_use_it():
    """The asv table gains ``mask`` (none, causal); a parameter set's case really carries its mask."""
    from attnbench import asv_bench

    assert (
        asv_bench.PARAMS["mask"] == ["none", "causal"]
        or "ATTNBENCH_ASV_MASKS" in __import__("os").environ
    )
    assert asv_bench.params()[1][-1] == "mask"
    call, spec = asv_bench.case("chunked", 256, "cpu", "forward", "causal")
    assert spec.mask == "causal"
    # FLOPs of the spec a parameter set names (asv_bench.flops would also run the speed guard, which
    # depends on how fast this machine is; the cost model does not)
    chunked = attnbench.get_variant("chunked")
    flops = {
        m: chunked.flops(asv_bench.spec_for("chunked", 2048, "cpu", "forward", m)).executed
        for m in ("none", "causal")
    }
    assert flops["causal"] < 0.7 * flops["none"]  # the causal case is really causal (tiles skipped)


def test_linear_elu_takes_a_1d_key_padding_mask():
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([True, True, False, True, False])
    variant = attnbench.get_variant("linear_elu")
    torch.testing.assert_close(variant(q, q, q, mask), variant.reference(q, q, q, mask))


def _per_query_lengths(batch: int = 2, lq: int = 6) -> mask_mods.MaskMod:
    return mask_mods.valid_lengths(
        torch.tensor([[1 + (i + b) % lq for i in range(lq)] for b in range(batch)])
    )


@pytest.mark.parametrize("name", ["linear_elu", "performer"])
def test_kernel_variants_refuse_per_query_valid_lengths(name):
    """Was silently wrong (max error ~3 against their own reference): the per-query part was ignored."""
    variant = attnbench.get_variant(name)
    q, k, v = (
        torch.randn(2, 2, 6, 4, generator=torch.Generator().manual_seed(i)) for i in range(3)
    )
    mask = _per_query_lengths()
    with pytest.raises(ValueError, match=f"{name} cannot run these inputs: mask"):
        variant(q, k, v, mask)
    assert variant.reasons_for(
        CallInfo.from_tensors(q, k, v, mask)
    )  # the declared rule says so, not the kernel


@pytest.mark.parametrize("name", ["linear_elu", "performer"])
def test_kernel_variants_still_run_key_padding_predicates(name):
    variant = attnbench.get_variant(name)
    q, k, v = (
        torch.randn(2, 2, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(i))
        for i in range(3)
    )
    mask = mask_mods.valid_lengths(torch.tensor([3, 6]))
    torch.testing.assert_close(variant(q, k, v, mask), variant.reference(q, k, v, mask))


def _strictly_causal() -> mask_mods.MaskMod:
    return mask_mods.MaskMod("causal", lambda b, h, q, kv: kv < q)  # named "causal", sees less


@pytest.mark.parametrize("name", ["sdpa", "sdpa_math", "sdpa_flash"])
def test_sdpa_runs_a_custom_predicate_named_causal_as_what_it_computes(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    mod = _strictly_causal()
    assert not mod.is_causal and masks.kind_of(mod) is None
    expected = reference_attention(q, k, v, mask_mods.dense(mod, 1, 2, 8, 8))
    torch.testing.assert_close(attnbench.get_variant(name)(q, k, v, mod), expected)
    assert mask_mods.causal().is_causal and masks.kind_of(mask_mods.causal()) == "causal"
