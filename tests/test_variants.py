"""Every registered variant x (self, cross) x mask kind x dtype against its float64 reference.

Cases come from the registry and each variant's declared support: a newly registered variant is
tested here the moment it registers, and an unsupported case is skipped with the variant's own
reason (so the skip list doubles as documentation of the support matrix).
"""

from __future__ import annotations

import math
import zlib

import pytest
import torch

import attnbench
from attnbench import AttnSpec
from attnbench.masks import MASK_KINDS
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.timer import TimerConfig
from attnbench.variants.base import declared_attributes
from attnbench.variants.compiled import FlexAttention
from tests.conftest import DEVICES, all_variants, assert_close_to_reference, is_expensive

SHAPES = {
    "self": dict(batch=2, heads=2, seq_len=33, head_dim=16),
    "cross": dict(batch=2, heads=2, seq_len=19, seq_len_k=41, head_dim=16, head_dim_v=12),
}
DTYPES = ["float32", "float64", "bfloat16"]
COMPILED_SELF = dict(SHAPES["self"], heads=8)
"""The compiled variants' self case is the grouped-query test's H = 8 shape (:func:`_gqa_spec`): its Hkv = 8 case,
plain multi-head attention of the same tensors, then reuses that compile where the mask reaches the variant in the
same form (no mask; compiled_batched's causal, a dense tensor both times; the grouped-query test hands chunked and
flex a dense causal mask, this matrix their mask_mod). Dynamo keeps one graph per shape and mask; a new one costs 2
to 10 CPU-s with Inductor's caches warm. H = 2 stays covered by the cross case."""


def _cases():
    """The full matrix; compiled variants (seconds per shape) get float32 with no mask and causal."""
    for name in all_variants():
        expensive = is_expensive(name)
        for shape in SHAPES:
            for mask in ("none", "causal") if expensive else MASK_KINDS:
                for dtype in ["float32"] if expensive else DTYPES:
                    for device in DEVICES:
                        yield pytest.param(
                            name,
                            shape,
                            mask,
                            dtype,
                            device,
                            id=f"{name}-{shape}-{mask}-{dtype}-{device}",
                        )


@pytest.mark.parametrize("name,shape,mask,dtype,device", list(_cases()))
def test_matches_reference(name, shape, mask, dtype, device):
    variant = attnbench.get_variant(name)
    fields = COMPILED_SELF if is_expensive(name) and shape == "self" else SHAPES[shape]
    spec = attnbench.AttnSpec(**fields, mask=mask, dtype=dtype, device=device, window=6)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    q, k, v, m = case_inputs(
        variant, spec, seed=zlib.crc32(f"{name}-{shape}-{mask}-{dtype}".encode())
    )
    assert_close_to_reference(variant, q, k, v, m)


def case_inputs(variant, spec, seed: int):
    """The case's inputs in the mask form the runner hands this variant (a predicate it takes)."""
    return spec.make_inputs(seed=seed, mask_form=variant.mask_form(spec))


@pytest.mark.parametrize("name", all_variants())
def test_unsupported_call_raises_readable_error(name):
    """Calling a variant on a case it declares unsupported raises ValueError naming it."""
    variant = attnbench.get_variant(name)
    for mask in MASK_KINDS:
        spec = attnbench.AttnSpec(**SHAPES["cross"], mask=mask)
        reasons = variant.not_supported_reasons(spec)
        if reasons:
            q, k, v, m = spec.make_inputs()
            with pytest.raises(ValueError, match=name):
                variant(q, k, v, m)
            return
    pytest.skip(f"{name} supports every CPU float32 case in the matrix")


@pytest.mark.parametrize("name", all_variants())
def test_rows_without_keys_are_zero(name):
    variant = attnbench.get_variant(name)
    spec = attnbench.AttnSpec(batch=3, heads=2, seq_len=12, head_dim=8)
    q, k, v, _ = spec.make_inputs()
    if "causal" in variant.SUPPORTED_MASKS:
        mask = torch.ones(3, 1, 12, 12, dtype=torch.bool)
        mask[1, :, 4] = False  # batch 1, query 4 sees nothing
        rows = (1, slice(None), 4)
    else:
        mask = attnbench.masks.valid_lengths(
            torch.tensor([12, 0, 5]), 12, 12
        )  # batch 1 sees nothing
        rows = (1,)
    if variant.not_supported_reasons(spec):
        pytest.skip("; ".join(variant.not_supported_reasons(spec)))
    out = variant(q, k, v, mask)
    assert torch.isfinite(out).all()
    assert out[rows].abs().max().item() == 0.0


@pytest.mark.parametrize("name", all_variants())
def test_backward_matches_reference_gradients(name):
    variant = attnbench.get_variant(name)
    spec = attnbench.AttnSpec(
        batch=1, heads=2, seq_len=20, head_dim=8, dtype="float64", mode="backward", mask="none"
    )
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    _assert_gradients_match_reference(variant, spec)


def _assert_gradients_match_reference(variant, spec) -> None:
    """dq, dk, dv of ``sum(out**2)`` equal the float64 reference's (a shared GQA head's sum over its group)."""
    q, k, v, _ = spec.make_inputs(requires_grad=True)
    grads = torch.autograd.grad(variant(q, k, v).square().sum(), (q, k, v))
    ref = torch.autograd.grad(variant.reference(q, k, v).square().sum(), (q, k, v))
    for g, r, t, n in zip(grads, ref, (q, k, v), "qkv", strict=True):
        assert g.shape == t.shape and torch.allclose(g, r, atol=1e-8, rtol=1e-6), (
            f"{variant.name}: d/d{n} differs"
        )


def test_declarations_are_complete():
    for name in all_variants():
        v = attnbench.get_variant(name)
        info = v.describe()
        assert info["name"] == name
        assert v.source, f"{name} has no source"
        assert v.time_exponent in (1.0, 2.0) and v.memory_exponent in (1.0, 2.0)
        assert "none" in v.SUPPORTED_MASKS


def test_declared_complexities_match_the_issue():
    expect = {
        "batched": (2, 2),
        "chunked": (2, 1),
        "linear_elu": (1, 1),
        "performer": (1, 1),
        "local": (1, 1),
        "sdpa_math": (2, 2),
    }
    for name, (t, m) in expect.items():
        v = attnbench.get_variant(name)
        assert (v.time_exponent, v.memory_exponent) == (t, m), name


def test_approximate_flags():
    assert not attnbench.get_variant("performer").exact
    assert all(attnbench.get_variant(n).exact for n in all_variants() if n != "performer")


def test_performer_error_shrinks_with_features():
    """FAVOR+ approximates softmax attention; more random features, smaller error (averaged over seeds)."""
    spec = attnbench.AttnSpec(batch=1, heads=4, seq_len=64, head_dim=16, dtype="float64")
    q, k, v, _ = spec.make_inputs(seed=3)
    q, k = q * 0.5, k * 0.5  # moderate logits, the regime FAVOR+ is designed for
    exact = attnbench.reference_attention(q, k, v)

    def mean_error(features: int) -> float:
        errs = [
            (attnbench.get_variant("performer", num_features=features, seed=s)(q, k, v) - exact)
            .abs()
            .mean()
            .item()
            for s in range(4)
        ]
        return sum(errs) / len(errs)

    errors = [mean_error(f) for f in (16, 64, 256, 1024)]
    assert all(a > b for a, b in zip(errors, errors[1:], strict=False)), errors
    assert errors[-1] < errors[0] / 3, errors


def _performer_error(q, k, v, exact, features: int) -> float:
    variant = attnbench.get_variant("performer", num_features=features)
    return (variant(q, k, v).double() - exact).abs().mean().item()


def test_performer_error_falls_like_one_over_sqrt_features():
    """64x more features: error at least 4x smaller (an unbiased Monte Carlo estimate gives 8x)."""
    spec = attnbench.AttnSpec(batch=1, heads=4, seq_len=256, head_dim=16, dtype="float64")
    q, k, v, _ = spec.make_inputs(seed=0)
    q, k = q * 0.5, k * 0.5
    exact = attnbench.reference_attention(q, k, v)
    assert _performer_error(q, k, v, exact, 4096) < _performer_error(q, k, v, exact, 64) / 4


# ---- grouped-query attention (Hkv < H): ratios H/Hkv = 1, 4, 8 -----------------------------------
GQA_KV_HEADS = (8, 2, 1)  # H = 8: multi-head, 4 query heads per key/value head, multi-query


def _gqa_spec(kv_heads: int, mask: str = "none", **changes) -> attnbench.AttnSpec:
    return attnbench.AttnSpec(
        batch=2, heads=8, kv_heads=kv_heads, seq_len=33, head_dim=16, mask=mask, window=6, **changes
    )


def _gqa_cases():
    for name in all_variants():
        for kv_heads in GQA_KV_HEADS:
            for mask in (
                ("none", "causal") if is_expensive(name) else ("none", "causal", "valid_lengths")
            ):
                yield pytest.param(name, kv_heads, mask, id=f"{name}-Hkv{kv_heads}-{mask}")


@pytest.mark.parametrize("name,kv_heads,mask", list(_gqa_cases()))
def test_gqa_matches_reference(name, kv_heads, mask):
    """Every variant that declares grouped-query attention matches the float64 reference at ratios 1, 4, 8."""
    variant = attnbench.get_variant(name)
    spec = _gqa_spec(kv_heads, mask)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        if kv_heads < 8 and not variant.not_supported_reasons(spec.replace(kv_heads=None)):
            assert any("grouped-query" in r for r in reasons), (
                f"{name}: {reasons}"
            )  # GQA is the only reason
        pytest.skip("; ".join(reasons))
    q, k, v, m = spec.make_inputs(seed=zlib.crc32(f"gqa-{name}-{kv_heads}-{mask}".encode()))
    assert k.shape[1] == kv_heads
    assert_close_to_reference(variant, q, k, v, m)


@pytest.mark.parametrize("name", [n for n in all_variants() if not is_expensive(n)])
def test_gqa_backward_matches_reference_gradients(name):
    """dk and dv of a shared head sum over its G query heads (float64, Hkv = 2 for H = 8)."""
    variant = attnbench.get_variant(name)
    spec = _gqa_spec(2, dtype="float64", mode="backward")
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    _assert_gradients_match_reference(variant, spec)


@pytest.mark.parametrize("name", all_variants())
def test_gqa_undeclared_gives_the_reason(name):
    """A variant that does not declare GQA (for this call) says so, and refuses the tensors with that reason."""
    variant = attnbench.get_variant(name)
    spec = _gqa_spec(2)
    if variant.not_supported_reasons(spec.replace(kv_heads=None)):
        pytest.skip("the multi-head case is unsupported already")
    reasons = variant.not_supported_reasons(spec)
    declared = bool(variant.gqa_mode(attnbench.capability.CallInfo.from_spec(spec)))
    assert declared == (not reasons), f"{name}: declared {declared}, reasons {reasons}"
    if reasons:
        q, k, v, m = spec.make_inputs()
        with pytest.raises(ValueError, match="grouped-query attention"):
            variant(q, k, v, m)


def test_reference_gqa_is_sdpa_enable_gqa_and_an_explicit_repeat():
    """Query head h reads key/value head h // G: the float64 reference equals SDPA(enable_gqa) and a hand repeat."""
    import torch.nn.functional as F

    from attnbench.reference import reference_attention

    spec = _gqa_spec(2, dtype="float64")
    q, k, v, _ = spec.make_inputs(seed=11)
    ref = reference_attention(q, k, v)
    sdpa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    by_hand = torch.stack(
        [
            reference_attention(
                q[:, h : h + 1], k[:, h // 4 : h // 4 + 1], v[:, h // 4 : h // 4 + 1]
            )[:, 0]
            for h in range(8)
        ],
        dim=1,
    )  # (B, H, Lq, Dv), one query head at a time
    assert torch.allclose(ref, sdpa, atol=1e-12) and torch.allclose(ref, by_hand, atol=1e-12)
    modulo = reference_attention(
        q, k[:, [h % 2 for h in range(8)]], v[:, [h % 2 for h in range(8)]]
    )
    assert not torch.allclose(
        ref, modulo, atol=1e-3
    )  # the other plausible mapping differs: the test can fail


@pytest.mark.parametrize("kv_heads", [3, 16])
def test_kv_heads_that_do_not_divide_heads_are_refused(kv_heads):
    q = torch.randn(1, 8, 4, 8)
    k = v = torch.randn(1, kv_heads, 4, 8)
    with pytest.raises(ValueError, match="Hkv dividing"):
        attnbench.get_variant("batched")(q, k, v)


def test_reference_propagates_nan_from_allowed_positions_only():
    q, k, v = (torch.randn(1, 1, 4, 3, dtype=torch.float64) for _ in range(3))
    mask = torch.tensor([True, True, True, False])  # key 3 masked out (1-D key padding)
    k[..., 3, :] = math.nan
    v[..., 3, :] = math.nan
    out = attnbench.reference_attention(q, k, v, mask)
    assert torch.isfinite(out).all()  # masked-out NaN never leaks
    v[..., 1, 0] = math.nan  # an allowed value: column 0 of every row is NaN
    out = attnbench.reference_attention(q, k, v, mask)
    assert torch.isnan(out[..., 0]).all() and torch.isfinite(out[..., 1:]).all()
    q[..., 2, :] = math.nan  # an allowed query row
    assert torch.isnan(attnbench.reference_attention(q, k, v, mask)[..., 2, :]).all()


@pytest.mark.parametrize("name", attnbench.variant_names())
def test_validate_raises_exactly_the_spec_reasons(name):
    """For every mask kind, dtype and shape: validate(tensors) fails iff the spec has reasons, with those reasons."""
    variant = attnbench.get_variant(name)
    for mask in attnbench.masks.MASK_KINDS:
        for dtype in ("float32", "float64"):
            for extra in ({}, {"seq_len_k": 9, "head_dim_v": 3}):
                spec = attnbench.AttnSpec(
                    batch=2,
                    heads=1,
                    seq_len=6,
                    head_dim=4,
                    mask=mask,
                    dtype=dtype,
                    window=2,
                    **extra,
                )
                reasons = variant.not_supported_reasons(spec)
                if not reasons:
                    continue
                q, k, v, m = spec.make_inputs()
                with pytest.raises(ValueError) as info:
                    variant.validate(q, k, v, m)
                assert str(info.value) == f"{name} cannot run these inputs: " + "; ".join(
                    variant.reasons_for(attnbench.capability.CallInfo.from_tensors(q, k, v, m))
                )
                for r in reasons:
                    if "mask" not in r:  # a tensor mask of a named kind may need broader support
                        assert r in str(info.value)


def test_cuda_only_backends_declare_cuda_only():
    for name in ("sdpa_efficient", "sdpa_cudnn"):
        assert attnbench.get_variant(name).describe()["devices"] == "cuda"


@pytest.mark.parametrize("name", ["compiled_batched", "compiled_chunked"])
def test_compiled_variant_declares_everything_its_base_declares(name):
    compiled = attnbench.get_variant(name)
    for attr in declared_attributes():
        if attr in (
            "IN_DEFAULT_SWEEP",
            "source",
        ):  # by design: not swept by default; names torch.compile
            continue
        assert getattr(compiled, attr) == getattr(compiled.base, attr), attr
    assert "PROVENANCE" in declared_attributes() and "SECONDS_PER_PAIR" in declared_attributes()
    spec = attnbench.AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16, mode="backward")
    assert compiled.flops(spec) == compiled.base.flops(spec)
    assert compiled.predicted_peak_bytes(spec) == compiled.base.predicted_peak_bytes(spec)


FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2),
    measure_rss=False,
    measure_memory=False,
    probe=False,
)


FLEX_WRONG = [  # shapes where compiled CPU flex was measured wrong (issue 23 and the boundary search)
    dict(batch=1, heads=1, seq_len=8, head_dim=8),
    dict(batch=1, heads=1, seq_len=8, head_dim=16),
    dict(batch=2, heads=8, seq_len=24, head_dim=16),
    dict(batch=1, heads=1, seq_len=72, head_dim=16),
    dict(batch=1, heads=1, seq_len=264, head_dim=16),
    dict(batch=1, heads=1, seq_len=24, head_dim=16, mask="causal"),
    dict(batch=1, heads=1, seq_len=120, head_dim=8, mask="causal"),
    dict(batch=1, heads=1, seq_len=200, seq_len_k=24, head_dim=16, mask="causal"),
    dict(batch=1, heads=1, seq_len=24, head_dim=16, dtype="bfloat16"),
]


FLEX_RIGHT = [  # and where it was measured right
    dict(batch=1, heads=1, seq_len=24, head_dim=64),
    dict(batch=1, heads=1, seq_len=24, head_dim=24),
    dict(batch=1, heads=1, seq_len=32, head_dim=16),
    dict(batch=1, heads=1, seq_len=31, head_dim=16),
    dict(batch=1, heads=1, seq_len=136, head_dim=16, mask="causal"),
    dict(batch=1, heads=1, seq_len=8, seq_len_k=32, head_dim=16),
]


@pytest.mark.parametrize("fields", FLEX_WRONG, ids=lambda f: AttnSpec(**f).label)
def test_flex_declares_the_cpu_kernel_fault(fields):
    reasons = attnbench.get_variant("flex").not_supported_reasons(AttnSpec(**fields))
    assert any("compiled CPU FlexAttention computes this shape wrong" in r for r in reasons), (
        reasons
    )
    assert not attnbench.get_variant("flex", compiled=False).not_supported_reasons(
        AttnSpec(**fields)
    )  # eager is right


@pytest.mark.parametrize("fields", FLEX_RIGHT, ids=lambda f: AttnSpec(**f).label)
def test_flex_runs_the_shapes_its_kernel_gets_right(fields):
    assert not attnbench.get_variant("flex").not_supported_reasons(AttnSpec(**fields))


def test_a_sweep_records_the_flex_fault_as_skipped_with_the_reason():
    m = measure("flex", AttnSpec(batch=2, heads=8, seq_len=24, head_dim=16), FAST, peak_flops=1e10)
    assert m.status == "skipped" and "computes this shape wrong" in m.reason, (m.status, m.reason)


class _FlexWrongLikeItsCpuKernel(FlexAttention):
    """Eager flex whose last query row is corrupted, as the compiled CPU kernel corrupts it (NaN or garbage)."""

    def __init__(self) -> None:
        super().__init__(compiled=False)

    def forward(self, q, k, v, mask):
        out = super().forward(q, k, v, mask).clone()
        out[:, :, -1] = out[:, :, -1] * 3.0 + 1.0
        return out


def test_the_gate_flags_a_wrong_flex_result_the_declared_rule_misses():
    """A shape outside the declared rule is still checked: a wrong flex result is recorded wrong, never timed."""
    attnbench.register("plant_flex_wrong", _FlexWrongLikeItsCpuKernel)
    try:
        spec = AttnSpec(batch=1, heads=2, seq_len=32, head_dim=16, mask="causal")
        assert not attnbench.get_variant("plant_flex_wrong").not_supported_reasons(spec)
        m = measure("plant_flex_wrong", spec, FAST, peak_flops=1e10)
    finally:
        attnbench.unregister("plant_flex_wrong")
    assert m.status == "wrong" and m.max_error > m.tolerance and m.runs == 0, (m.status, m.reason)
