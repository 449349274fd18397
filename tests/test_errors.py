"""Bad input raises a clear ValueError/TypeError naming the argument, before any heavy work."""

from __future__ import annotations

import pytest
import torch

import attnbench

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
