"""Issue 12's API holes, each planted: bad scales, devices, NaN, layouts, masks and options."""

from __future__ import annotations

import math
import subprocess
import sys

import pytest
import torch

import attnbench
from attnbench.variants.base import declared_attributes
from tests.conftest import cheap_variants

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


def test_linear_elu_takes_a_1d_key_padding_mask():
    q = torch.randn(1, 2, 5, 4, dtype=torch.float64)
    mask = torch.tensor([True, True, False, True, False])
    variant = attnbench.get_variant("linear_elu")
    torch.testing.assert_close(variant(q, q, q, mask), variant.reference(q, q, q, mask))


@pytest.mark.parametrize("name", ["performer", "block_sparse", "additive"])
@pytest.mark.parametrize("seed,exc", [("x", TypeError), (-1, ValueError), (1.5, TypeError)])
def test_bad_seed_fails_when_built(name, seed, exc):
    with pytest.raises(exc, match="seed"):
        attnbench.get_variant(name, seed=seed)


def test_huge_scale_that_would_overflow_is_refused():
    q = torch.full((1, 1, 4, 8), 100.0)
    with pytest.raises(ValueError, match="overflow"):
        attnbench.get_variant("batched", scale=1e35)(q, q, q)


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


def test_listing_and_describing_changes_no_dynamo_setting():
    code = (
        "import torch._dynamo.config as c\n"
        "before = (c.recompile_limit, c.fail_on_recompile_limit_hit)\n"
        "import attnbench\n"
        "from attnbench.registry import variant_class, variant_defaults\n"
        "for n in attnbench.variant_names():\n"
        "    variant_class(n); variant_defaults(n); attnbench.get_variant(n).describe()\n"
        "print(before == (c.recompile_limit, c.fail_on_recompile_limit_hit))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.strip() == "True"


def test_registry_imports_no_variant_module_until_asked():
    code = (
        "import sys, attnbench.registry as r\n"
        "print('attnbench.variants.compiled' in sys.modules)\n"
        "print(r.variant_class('compiled_batched').__name__, r.variant_defaults('compiled_batched'))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    assert out.stdout.split("\n")[:2] == ["False", "CompiledVariant {'base': 'batched'}"]


@pytest.mark.parametrize(
    ("axis", "values"),
    [
        ("lengths", [256, 256]),
        ("dtypes", ["float32", "float32"]),
        ("variants", ["batched", "sdpa", "batched"]),
    ],
)
def test_a_repeated_grid_entry_is_refused(axis, values):
    """Planted: a repeated length measured the same case twice, and a later --resume found the manifest incomplete."""
    from attnbench.runs import grid

    kwargs = {"variants": ["batched"], "lengths": [64], axis: values}
    with pytest.raises(ValueError, match=f"{axis}: .* given more than once"):
        grid(**kwargs)


@pytest.mark.parametrize("limit_slow", [True, False])
def test_an_unknown_variant_is_refused_whatever_limit_slow_says(limit_slow):
    """Planted: with ``limit_slow=False`` the grid skipped the registry lookup and planned a case of no variant."""
    from attnbench.runs import grid

    with pytest.raises(ValueError, match="unknown variant 'nosuch'"):
        grid(["nosuch"], [64], limit_slow=limit_slow)
