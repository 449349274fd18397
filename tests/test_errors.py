"""Bad input raises a clear ValueError/TypeError naming the argument, before any heavy work.

Malformed API inputs are also thrown at every cheap variant by a deterministic battery and a
hypothesis property: each call either raises a ValueError/TypeError naming the argument, or returns
what the float64 reference returns (tolerance rule of the tests; NaN exactly where the reference is
NaN). Never an obscure error, never a silently wrong result. See ``studies/api_battery.py``.
"""

from __future__ import annotations

import math
import re

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

import attnbench
from attnbench import AttnSpec, mask_mods
from attnbench.measure import measure
from attnbench.variants.batched import BatchedAttention
from studies.api_battery import cases, classify, run
from tests.conftest import cheap_variants

Q = torch.randn(1, 2, 5, 4)
K = torch.randn(1, 2, 6, 4)
V = torch.randn(1, 2, 6, 3)


@pytest.mark.parametrize(
    "args,exc,match",
    [
        ((Q[0], K, V, None), ValueError, "q must have rank 4"),
        ((Q, K, V[0], None), ValueError, "v must have rank 4"),
        ((Q, torch.randn(2, 2, 6, 4), V, None), ValueError, "batch and heads"),
        ((Q, torch.randn(1, 3, 6, 4), V, None), ValueError, "batch and heads"),
        ((Q, torch.randn(1, 2, 6, 5), V, None), ValueError, "head_dim"),
        ((Q, K, torch.randn(1, 2, 7, 3), None), ValueError, "key length"),
        ((Q.long(), K, V, None), TypeError, "q must be a floating-point"),
        ((Q, K.double(), V, None), TypeError, "share one dtype"),
        ((Q, K, V, torch.ones(5, 6)), TypeError, "mask must have dtype torch.bool"),
        ((Q, K, V, torch.ones(5, 7, dtype=torch.bool)), ValueError, "not broadcastable"),
        ((Q, K, V, torch.ones(1, 1, 1, 5, 6, dtype=torch.bool)), ValueError, "rank <= 4"),
        ((torch.randn(1, 2, 0, 4), K, V, None), ValueError, "zero-sized"),
        (("q", K, V, None), TypeError, "q must be a torch.Tensor"),
        ((Q, K, V, "causal"), TypeError, "mask must be a bool"),
    ],
)
@pytest.mark.parametrize("name", ["batched", "chunked", "loop", "local", "linear_elu"])
def test_bad_inputs(name, args, exc, match):
    with pytest.raises(exc, match=match):
        attnbench.get_variant(name)(*args)


def test_mixed_devices_are_named():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA to build a tensor on a second device")
    with pytest.raises(ValueError, match="one device"):
        attnbench.get_variant("batched")(Q, K.cuda(), V)


def test_reference_validates_too():
    with pytest.raises(ValueError, match="rank 4"):
        attnbench.reference_attention(Q[0], K, V)


def test_unknown_variant_lists_known_names():
    with pytest.raises(ValueError, match="known variants: loop, vectorized"):
        attnbench.get_variant("flashy")


@pytest.mark.parametrize(
    "name,options,match",
    [
        ("sdpa", {"backend": "turbo"}, "backend must be one of"),
        ("chunked", {"q_chunk": 0}, "q_chunk must be >= 1"),
        ("chunked", {"k_chunk": 2.5}, "k_chunk must be an int"),
        ("local", {"window": -1}, "window"),
        ("performer", {"num_features": 0}, "num_features"),
        ("additive", {"score": "cosine"}, "score must be one of"),
        ("batched", {"scale": -1.0}, "scale"),
        ("block_sparse", {"random_blocks": -2}, "random_blocks"),
    ],
)
def test_bad_variant_options(name, options, match):
    with pytest.raises((ValueError, TypeError), match=match):
        attnbench.get_variant(name, **options)


def test_duplicate_registration_is_an_error():
    cls = type(attnbench.get_variant("batched"))
    with pytest.raises(ValueError, match="already registered"):
        attnbench.register("batched", cls)
    with pytest.raises(TypeError, match="Variant subclass"):
        attnbench.register("not_a_variant", dict)


@pytest.mark.parametrize(
    "field,value,exc",
    [
        ("seq_len", 0, ValueError),
        ("heads", 2.0, TypeError),
        ("dtype", "int8", ValueError),
        ("device", "tpu", ValueError),
        ("mask", "diagonal", ValueError),
        ("mode", "sideways", ValueError),
    ],
)
def test_spec_validation_names_the_field(field, value, exc):
    with pytest.raises(exc, match=field):
        attnbench.AttnSpec(**{field: value})


SCALED = ["batched", "chunked", "sdpa", "sdpa_math", "local", "vectorized", "block_sparse"]


@pytest.mark.parametrize(
    "scale,exc",
    [
        (math.nan, ValueError),
        (math.inf, ValueError),
        (True, TypeError),
        (0.0, ValueError),
        ("1", TypeError),
    ],
)
@pytest.mark.parametrize("name", SCALED)
def test_bad_scales_are_refused_when_built(name, scale, exc):
    with pytest.raises(exc, match="scale"):
        attnbench.get_variant(name, scale=scale)


@pytest.mark.parametrize("scale", [math.nan, math.inf, True])
def test_reference_refuses_bad_scales(scale):
    q = torch.randn(1, 1, 3, 4)
    with pytest.raises((ValueError, TypeError), match="scale"):
        attnbench.reference_attention(q, q, q, scale=scale)


@pytest.mark.parametrize("device", ["cpu:7", "cpu:0", "cuda:-1", "cuda:x", "gpu", ""])
def test_spec_refuses_bad_devices(device):
    with pytest.raises(ValueError, match="device"):
        attnbench.AttnSpec(device=device)


def test_spec_accepts_cuda_index():
    assert attnbench.AttnSpec(device="cuda:1").device_type == "cuda"


@pytest.mark.parametrize("name", cheap_variants())
@pytest.mark.parametrize("which", ["q", "k", "v"])
def test_variants_refuse_non_finite_inputs_naming_the_tensor(name, which):
    variant = attnbench.get_variant(name)
    spec = attnbench.AttnSpec(batch=1, heads=2, seq_len=8, head_dim=4)
    if variant.not_supported_reasons(spec):
        pytest.skip("; ".join(variant.not_supported_reasons(spec)))
    q, k, v, _ = spec.make_inputs()
    dict(q=q, k=k, v=v)[which][0, 0, -1, 0] = math.nan
    mask = torch.tensor([True] * 7 + [False])  # the NaN sits in a masked-out key for k and v
    if "valid_lengths" not in variant.SUPPORTED_MASKS:
        mask = None
    with pytest.raises(ValueError, match=f"{which} must be finite"):
        variant(q, k, v, mask)


def test_flash_with_transposed_inputs_is_refused_by_validation_and_spec_rule():
    variant = attnbench.get_variant("sdpa_flash")
    q = torch.randn(1, 2, 16, 8).transpose(-1, -2)  # (1, 2, 8, 16) with stride 1 along L, not D
    with pytest.raises(ValueError, match="stride 1 along the head dim"):
        variant(q, q, q)
    out = attnbench.get_variant("sdpa")(q, q, q)  # auto falls back: same result as the reference
    torch.testing.assert_close(
        out.double(), attnbench.reference_attention(q, q, q), atol=1e-5, rtol=1e-5
    )


@pytest.mark.parametrize("name", ["performer", "block_sparse", "additive"])
@pytest.mark.parametrize("seed,exc", [("x", TypeError), (-1, ValueError), (1.5, TypeError)])
def test_bad_seed_fails_when_built(name, seed, exc):
    with pytest.raises(exc, match="seed"):
        attnbench.get_variant(name, seed=seed)


def test_huge_scale_that_would_overflow_is_refused():
    q = torch.full((1, 1, 4, 8), 100.0)
    with pytest.raises(ValueError, match="overflow"):
        attnbench.get_variant("batched", scale=1e35)(q, q, q)


NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)


@pytest.mark.parametrize(
    "trial,build,exc,word",
    [
        (
            "flex compiled='no'",
            lambda: attnbench.get_variant("flex", compiled="no"),
            TypeError,
            "compiled",
        ),
        (
            "linear_elu scale=0.5",
            lambda: attnbench.get_variant("linear_elu", scale=0.5),
            TypeError,
            "scale",
        ),
        (
            "layer batch_first='yes'",
            lambda: attnbench.AttentionLayer(8, 2, batch_first="yes"),
            TypeError,
            "batch_first",
        ),
        ("layer bias='no'", lambda: attnbench.AttentionLayer(8, 2, bias="no"), TypeError, "bias"),
        (
            "make_inputs seed=-1",
            lambda: AttnSpec(seq_len=4).make_inputs(seed=-1),
            ValueError,
            "seed",
        ),
        (
            "make_inputs seed='1'",
            lambda: AttnSpec(seq_len=4).make_inputs(seed="1"),
            TypeError,
            "seed",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_ignored_options_are_refused(trial, build, exc, word):
    with pytest.raises(exc, match=word):
        build()


@pytest.mark.parametrize(
    "name", ["batched", "chunked", "local", "sdpa", "linear_elu", "block_sparse"]
)
@pytest.mark.parametrize(
    "lengths", [[1, 2, 3], [1]], ids=["3 lengths for batch 2", "1 length for batch 2"]
)
def test_valid_lengths_for_another_batch_are_refused(name, lengths):
    """3 lengths for batch 2 were silently cut to 2; 1 length for batch 2 raised IndexError."""
    q = torch.randn(2, 1, 4, 4)
    with pytest.raises(ValueError, match="valid_lengths holds lengths for a batch of"):
        attnbench.get_variant(name)(q, q, q, mask_mods.valid_lengths(torch.tensor(lengths)))


def test_scale_whose_scaled_queries_overflow_is_refused():
    """scale=3e38 with tiny keys kept scale * D * |q| * |k| finite, but chunked's scaled queries became inf (NaN out)."""
    g = torch.Generator().manual_seed(0)
    q, k, v = (
        torch.randn(1, 2, 6, 8, generator=g) * 4,
        torch.randn(1, 2, 6, 8, generator=g) * 1e-9,
        torch.randn(1, 2, 6, 8, generator=g),
    )
    with pytest.raises(ValueError, match="overflow"):
        attnbench.get_variant("chunked", scale=3e38)(q, k, v)


def _layer_forward(dtype: torch.dtype):
    return lambda: attnbench.AttentionLayer(8, 2)(torch.ones(1, 3, 8, dtype=dtype))


@pytest.mark.parametrize(
    "trial,call,exc,word",
    [
        ("measure spec='not a spec'", lambda: measure("batched", "not a spec"), TypeError, "spec"),
        (
            "measure config='fast'",
            lambda: measure("batched", AttnSpec(seq_len=8), config="fast"),
            TypeError,
            "config",
        ),
        (
            "measure peak_flops=nan",
            lambda: measure("batched", AttnSpec(seq_len=8), peak_flops=math.nan),
            ValueError,
            "peak_flops",
        ),
        (
            "reference dtype='float64'",
            lambda: attnbench.reference_attention(*[torch.ones(1, 1, 2, 4)] * 3, dtype="float64"),
            TypeError,
            "dtype",
        ),
        (
            "reference dtype=int64",
            lambda: attnbench.reference_attention(*[torch.ones(1, 1, 2, 4)] * 3, dtype=torch.int64),
            TypeError,
            "dtype",
        ),
        (
            "reference dtype=bool",
            lambda: attnbench.reference_attention(*[torch.ones(1, 1, 2, 4)] * 3, dtype=torch.bool),
            TypeError,
            "dtype",
        ),
        (
            "linear reference dtype='float64'",
            lambda: attnbench.get_variant("linear_elu").reference(
                *[torch.ones(1, 1, 2, 4)] * 3, dtype="float64"
            ),
            TypeError,
            "dtype",
        ),
        (
            "layer int64 input",
            _layer_forward(torch.int64),
            TypeError,
            "query must have the layer's dtype",
        ),
        (
            "layer float64 input",
            _layer_forward(torch.float64),
            TypeError,
            "query must have the layer's dtype",
        ),
        (
            "layer dtype=int64",
            lambda: attnbench.AttentionLayer(8, 2, dtype=torch.int64),
            TypeError,
            "dtype",
        ),
        (
            "valid_lengths(empty)",
            lambda: mask_mods.valid_lengths(torch.tensor([], dtype=torch.long)),
            ValueError,
            "valid_lens",
        ),
        (
            "valid_lengths Lq mismatch",
            lambda: attnbench.get_variant("batched")(
                *[torch.randn(2, 1, 4, 4)] * 3,
                mask_mods.valid_lengths(torch.ones(2, 3, dtype=torch.long)),
            ),
            ValueError,
            "one column per query",
        ),
        (
            "compiled mode='bogus'",
            lambda: attnbench.get_variant("compiled_batched", mode="bogus"),
            ValueError,
            "mode",
        ),
        (
            "compiled dynamic='maybe'",
            lambda: attnbench.get_variant("compiled_batched", dynamic="maybe"),
            TypeError,
            "dynamic",
        ),
    ],
    ids=lambda x: x if isinstance(x, str) else "",
)
def test_obscure_errors_are_clear(trial, call, exc, word):
    with pytest.raises(exc, match=word):
        call()


@NO_CUDA
@pytest.mark.parametrize(
    "call",
    [
        lambda: AttnSpec(device="cuda").make_inputs(),
        lambda: AttnSpec(device="cuda", mask="causal").make_mask(),
        lambda: attnbench.AttentionLayer(8, 2, device="cuda"),
    ],
    ids=["spec make_inputs", "spec make_mask", "AttentionLayer"],
)
def test_cuda_without_cuda_is_a_clear_error(call):
    """Was an AssertionError from torch ("Torch not compiled with CUDA enabled")."""
    with pytest.raises(ValueError, match="device='cuda' needs CUDA"):
        call()


def test_absurd_feature_count_is_refused_before_anything_is_drawn():
    """num_features=10**9 spent minutes drawing orthogonal blocks before its allocation failed."""
    variant = attnbench.get_variant("performer", num_features=10**9)
    q = torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="num_features=1000000000 needs about"):
        variant(q, q, q)
    assert not variant._projections  # nothing was drawn


@pytest.mark.parametrize(
    ("call", "error", "said"),
    [
        (
            lambda: attnbench.AttnSpec().make_inputs(seed=2**64),
            ValueError,
            "seed must be >= 0 and < 2**64",
        ),
        (
            lambda: attnbench.AttentionLayer(8, 2, device="mps"),
            ValueError,
            "device='mps': attnbench runs on 'cpu' and 'cuda'",
        ),
        (
            lambda: attnbench.get_variant("batched").not_supported_reasons("x"),
            TypeError,
            "spec must be an AttnSpec",
        ),
        (
            lambda: attnbench.register(" batched", BatchedAttention),
            ValueError,
            "so that --variants can select it",
        ),
        (
            lambda: attnbench.register("a,b", BatchedAttention),
            ValueError,
            "so that --variants can select it",
        ),
    ],
)
def test_obscure_errors_now_name_the_argument(call, error, said):
    with pytest.raises(error, match=re.escape(said)):
        call()


def test_battery_has_no_obscure_errors_and_no_wrong_results():
    counts, rows = run(cheap_variants())
    assert len(cases()) >= 100 or sum(counts.values()) >= 100
    bad = [r for r in rows if r[2] in ("obscure error", "wrong")]
    assert not bad, bad[:5]
    assert counts["clear error"] > 0 and counts["correct"] > 0


def test_classifier_catches_planted_faults():
    """The battery's judge itself: a wrong result and an obscure error are recognised as such."""
    import attnbench
    from attnbench.variants.batched import BatchedAttention

    class Scaled(BatchedAttention):
        def forward(self, q, k, v, mask):
            return super().forward(q, k, v, mask) * 1.1

    class Crashes(BatchedAttention):
        def forward(self, q, k, v, mask):
            raise RuntimeError("No available kernel.")

    q = torch.randn(1, 1, 3, 4)
    for name, cls, expected in (
        ("_planted_scaled", Scaled, "wrong"),
        ("_planted_crash", Crashes, "obscure error"),
    ):
        attnbench.register(name, cls)
        try:
            assert classify(name, q, q, q)[0] == expected
        finally:
            attnbench.unregister(name)


_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64, torch.bool]


@st.composite
def malformed_calls(draw):
    """Random (q, k, v, mask, scale): ranks, shapes, dtypes, masks, non-finite entries, scales, layouts."""

    def size(high: int) -> int:  # zero now and then
        return 0 if draw(st.integers(0, 19)) == 0 else draw(st.integers(1, high))

    b, h, lq, lk = size(3), size(3), size(6), size(6)
    d, dv = size(5), size(5)
    shapes = [[b, h, lq, d], [b, h, lk, d], [b, h, lk, dv]]
    for s in shapes:
        if draw(st.integers(0, 19)) == 0:  # a wrong rank now and then
            del s[draw(st.integers(0, len(s) - 1))]
        if draw(st.integers(0, 19)) == 0:  # a wrong size now and then
            s[draw(st.integers(0, len(s) - 1))] += 1
    dtype = draw(st.sampled_from(_DTYPES)) if draw(st.integers(0, 3)) == 0 else torch.float32
    gen = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    tensors = []
    for s in shapes:
        t = torch.randn(*s, generator=gen, dtype=torch.float64)
        if t.numel() and draw(st.integers(0, 14)) == 0:
            t.view(-1)[draw(st.integers(0, t.numel() - 1))] = draw(
                st.sampled_from([math.nan, math.inf, -math.inf])
            )
        t = t.to(dtype)
        if t.dim() >= 2 and draw(st.booleans()):  # same values, last two axes non-contiguous
            t = t.transpose(-1, -2).contiguous().transpose(-1, -2)
        tensors.append(t)
    mask_kind = draw(
        st.sampled_from(["none", "none", "key", "key", "full", "full", "odd", "float", "rank5"])
    )
    mask = {
        "none": None,
        "key": torch.rand(max(lk, 1), generator=gen) > 0.3,
        "full": torch.rand(b or 1, 1, max(lq, 1), max(lk, 1), generator=gen) > 0.3,
        "odd": torch.ones(draw(st.integers(1, 4)), draw(st.integers(1, 4)), dtype=torch.bool),
        "float": torch.ones(max(lq, 1), max(lk, 1)),
        "rank5": torch.ones(1, 1, 1, 1, 1, dtype=torch.bool),
    }[mask_kind]
    odd_scale = st.sampled_from([0.5, 2, 1e-8, math.nan, math.inf, -1.0, 0.0, True, "x"])
    scale = draw(odd_scale) if draw(st.integers(0, 3)) == 0 else "default"
    return (*tensors, mask, scale)


@pytest.mark.parametrize("name", cheap_variants())
@given(call=malformed_calls())
def test_malformed_calls_raise_clearly_or_match_the_reference(name, call):
    category, detail = classify(name, *call)
    assert category in ("clear error", "correct"), detail
