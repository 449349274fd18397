"""Declared FLOPs are what ran: checked against FlopCounterMode, or a hand count where it is blind.

See ``attnbench/variants/base.py`` for what "executed FLOPs" means. Every registered variant is
checked on both passes; a variant whose contractions hide in a kernel the counter has no formula
for declares it (``OPAQUE_KERNELS``) and the test first proves the kernel really runs and really
is unknown to the counter, then checks the hidden part against an independent count.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode

import attnbench
from attnbench import AttnSpec
from attnbench.variants.base import Contraction
from attnbench.variants.batched import BatchedAttention
from studies.flop_audit import counted_flops
from tests.conftest import all_variants
from tests.cost_work import work_at, work_at_short

COUNTER_CANNOT_RUN = {"flex"}  # FlopCounterMode has no implementation for the CPU flex HOP
SHAPES = {
    "self": dict(batch=2, heads=2, seq_len=40, head_dim=16),
    "cross": dict(batch=1, heads=2, seq_len=24, seq_len_k=56, head_dim=16, head_dim_v=8),
    "gqa": dict(
        batch=1, heads=8, kv_heads=2, seq_len=24, head_dim=16
    ),  # 4 query heads per key/value head
}


def _spec_or_skip(variant, **fields):
    spec = AttnSpec(**fields)
    reasons = variant.not_supported_reasons(spec)
    if reasons:
        pytest.skip("; ".join(reasons))
    return spec


def _relative_gap(declared: int, counted: int) -> float:
    return abs(declared - counted) / max(counted, 1) if declared or counted else 0.0


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("mask", ["none", "causal", "valid_lengths", "document"])
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("name", all_variants())
def test_declared_flops_match_the_counter(name, shape, mask, mode):
    """The counter-visible part of the declared executed FLOPs is within 5% of FlopCounterMode."""
    if name in COUNTER_CANNOT_RUN:
        pytest.skip(f"{name}: FlopCounterMode cannot run it (hand-counted below)")
    variant = attnbench.get_variant(name)
    spec = _spec_or_skip(variant, **SHAPES[shape], mask=mask, mode=mode, window=5)
    counted = counted_flops(variant, spec)
    declared = variant.counter_visible_flops(spec)
    assert _relative_gap(declared, counted) <= 0.05, (
        f"{name} {spec.label}: declared {declared}, counted {counted}"
    )
    if not variant.OPAQUE_KERNELS:
        assert declared == variant.flops(spec).executed, (
            f"{name} declares hidden FLOPs but no opaque kernel"
        )


class _Ops(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.add(str(func.overloadpacket))
        return func(*args, **(kwargs or {}))


OPAQUE = [
    n
    for n in all_variants()
    if attnbench.get_variant(n).OPAQUE_KERNELS and n not in COUNTER_CANNOT_RUN and n != "loop"
]


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("name", OPAQUE)
def test_opaque_kernels_really_run_and_are_really_unknown_to_the_counter(name, mode):
    variant = attnbench.get_variant(name)
    spec = _spec_or_skip(variant, batch=1, heads=2, seq_len=32, head_dim=16, mode=mode)
    q, k, v, _ = spec.make_inputs(requires_grad=mode == "backward")
    with _Ops() as log:
        out = variant(q, k, v)
        if mode == "backward":
            torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    ran = log.ops & variant.OPAQUE_KERNELS
    assert ran, f"{name}: none of {sorted(variant.OPAQUE_KERNELS)} ran (ops: {sorted(log.ops)})"
    known = {str(op) for op in flop_counter.flop_registry}
    assert not ran & known, f"{name}: {sorted(ran & known)} has a FlopCounterMode formula"


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("name", OPAQUE)
def test_hidden_sdpa_flops_match_the_counters_own_formula(name, mode):
    """The hidden part equals what FlopCounterMode's SDPA formulas give for those shapes (as on CUDA)."""
    variant = attnbench.get_variant(name)
    spec = _spec_or_skip(
        variant, batch=2, heads=3, seq_len=48, seq_len_k=80, head_dim=16, mode=mode
    )
    q_shape = (spec.batch, spec.heads, spec.lq, spec.head_dim)
    k_shape = (spec.batch, spec.heads, spec.lk, spec.head_dim)
    v_shape = (spec.batch, spec.heads, spec.lk, spec.dv)
    expected = flop_counter.sdpa_flop_count(q_shape, k_shape, v_shape)
    if mode == "backward":
        expected += flop_counter.sdpa_backward_flop_count(
            (*q_shape[:3], spec.dv), q_shape, k_shape, v_shape
        )
    hidden = variant.flops(spec).executed - variant.counter_visible_flops(spec)
    assert hidden == expected


def test_eager_and_fused_backward_factors():
    spec = AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16)
    assert attnbench.get_variant("batched").backward_factor(spec) == 2.0
    assert attnbench.get_variant("sdpa_math").backward_factor(spec) == 2.0
    assert attnbench.get_variant("sdpa").backward_factor(spec) == 2.5
    assert attnbench.get_variant("sdpa_flash").backward_factor(spec) == 2.5


class _LoopCount(TorchDispatchMode):
    """Contractions of the Python loop: each ``dot`` of n (2n) and each scalar x vector(n) product (2n, with its add)."""

    def __init__(self) -> None:
        super().__init__()
        self.flops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        if name == "aten.dot":
            self.flops += 2 * args[0].numel()
        elif name == "aten.mul" and all(isinstance(a, torch.Tensor) for a in args[:2]):
            a, b = args[:2]
            if {a.dim(), b.dim()} == {0, 1}:
                self.flops += 2 * max(a.numel(), b.numel())
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("mask", ["none", "causal", "valid_lengths"])
def test_loop_flops_match_an_instrumented_count(mask):
    variant = attnbench.get_variant("loop")
    spec = AttnSpec(batch=2, heads=1, seq_len=6, seq_len_k=9, head_dim=5, head_dim_v=3, mask=mask)
    q, k, v, m = spec.make_inputs()
    with torch.no_grad(), _LoopCount() as count:
        variant(q, k, v, m)
    assert count.flops == variant.flops(spec).executed
    assert variant.counter_visible_flops(spec) == 0  # the counter sees none of it (aten.dot, mul)
    assert variant.backward_factor(spec) == 2.0


@pytest.mark.parametrize("mask", attnbench.masks.MASK_KINDS)
def test_flex_executed_pairs_match_its_block_mask(mask):
    from torch.nn.attention.flex_attention import create_block_mask

    variant = attnbench.get_variant("flex", compiled=False)
    spec = AttnSpec(batch=2, heads=1, seq_len=300, seq_len_k=420, head_dim=8, mask=mask, window=100)
    m = spec.make_mask()
    if m is None:
        expected = spec.lq * spec.lk
    else:
        m = m.expand(spec.batch, 1, spec.lq, spec.lk)
        bm = create_block_mask(
            lambda b, h, qi, ki: m[b, 0, qi, ki], spec.batch, None, spec.lq, spec.lk, device="cpu"
        )
        t = variant.TILE
        expected = 0
        for b in range(spec.batch):
            for r in range(bm.kv_num_blocks.shape[2]):
                rows = min(t, spec.lq - r * t)
                cols = [
                    *bm.kv_indices[b, 0, r, : bm.kv_num_blocks[b, 0, r]].tolist(),
                    *bm.full_kv_indices[b, 0, r, : bm.full_kv_num_blocks[b, 0, r]].tolist(),
                ]
                expected += sum(rows * min(t, spec.lk - c * t) for c in cols)
        expected //= spec.batch
    assert variant.executed_pairs(spec) == expected


def test_planted_wrong_backward_factor_is_caught():
    """A variant claiming the fused 2.5 backward while running eager autograd fails the check."""

    class Wrong(BatchedAttention):
        RECOMPUTES_SCORES = True

    spec = AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16, mode="backward")
    wrong = Wrong()
    assert _relative_gap(wrong.counter_visible_flops(spec), counted_flops(wrong, spec)) > 0.05


def test_planted_phantom_contraction_is_caught():
    """A declared contraction the implementation never performs (linear_elu's old feature matmul)."""

    class Phantom(BatchedAttention):
        def contractions(self, spec):
            extra = 2 * spec.batch * spec.heads * spec.lq * spec.head_dim * spec.head_dim
            return [*super().contractions(spec), Contraction("phantom", extra, extra, 2.0)]

    spec = AttnSpec(batch=1, heads=2, seq_len=64, head_dim=64)
    assert (
        _relative_gap(Phantom().counter_visible_flops(spec), counted_flops(Phantom(), spec)) > 0.05
    )


def test_cost_models_do_no_quadratic_work_at_long_lengths(tmp_path_factory):
    """flops / predicted_peak_bytes / useful_pairs / executed_pairs at L=65536 (and torch_mha at H16 D1024): small work, small RSS.

    Work is counted, never timed (a timed bound failed beside other work): the Python lines every
    cost model runs at L=65536 stay those it runs at L=4096 (a tile walk grows 256-fold, a row sum
    16-fold), no tensor beyond O(L) elements is built, and the fresh process's peak RSS, which
    measures only these calls, stays small (a dense L x L bool pattern at L=65536 alone is 4.3 GB).
    """
    (short, _), (long, rss) = work_at_short(tmp_path_factory), work_at(65536)
    grown = {k: (short[k][0], long[k][0]) for k in short if long[k][0] > 2 * short[k][0] + 200}
    assert not grown, f"Python lines (L=4096, L=65536) that grew with the length: {grown}"
    quadratic = {k: v[1] for k, v in long.items() if v[1] > 65536}
    assert not quadratic, f"tensors larger than L=65536 elements: {quadratic}"
    assert rss < 1_500_000_000, f"peak RSS {rss / 1e9:.2f} GB"


@pytest.mark.parametrize(
    "name,options,weights",
    [
        ("torch_mha", {}, lambda s: 4 * (s.heads * s.head_dim) ** 2 * s.elem_bytes),
        ("bilinear", {}, lambda s: s.head_dim**2 * s.elem_bytes),
        ("additive", {}, lambda s: (2 * 32 * s.head_dim + 32) * s.elem_bytes),
        ("performer", {}, lambda s: 256 * s.head_dim * s.elem_bytes),
    ],
)
def test_predicted_peak_includes_the_variants_own_weights(name, options, weights):
    spec = AttnSpec(batch=1, heads=16, seq_len=8, head_dim=1024 if name == "torch_mha" else 64)
    variant = attnbench.get_variant(name, **options)
    assert variant.parameter_bytes(spec) >= weights(spec)
    assert variant.predicted_peak_bytes(spec) >= weights(spec)
    if name == "torch_mha":
        assert (
            variant.predicted_peak_bytes(spec) > 8 * 2**30 * 0.5
        )  # 4 x (16384 x 16384) float32 = 4 GiB
