"""Issue 23's fault battery, library side: each trial that was silently wrong, ignored an option,
hung or failed obscurely, planted here so it stays fixed.

Cost models are checked two ways: every closed form against the walk or per-row sum it replaced
(kept below as the oracle, over many shapes), and by the work they do at L = 10**9, counted in
Python lines and tensor elements, never in seconds.
"""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import attnbench
from attnbench import AttnSpec, mask_mods
from attnbench.capability import CallInfo
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.timer import TimerConfig
from attnbench.variants.block_sparse import BlockSparseAttention, block_pattern
from attnbench.variants.compiled import FlexAttention
from tests.cost_work import SHORT, work_at, work_at_short

FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2),
    measure_rss=False,
    measure_memory=False,
    probe=False,
)
NO_CUDA = pytest.mark.skipif(
    torch.cuda.is_available(), reason="checks the refusal on a machine without CUDA"
)


# ---- 1: per-query valid lengths are no key padding -------------------------------------------
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


# ---- 2: compiled CPU FlexAttention's kernel fault is declared ---------------------------------
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


# ---- 4: options that were accepted and ignored ------------------------------------------------
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


# ---- 6: obscure errors become clear ones -------------------------------------------------------
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


# ---- 5: closed-form cost models equal what they replaced --------------------------------------
def _walk(mod, batch, lq, lk, tq, tk) -> int:
    """The tile walk the closed forms replaced (what chunked and flex counted before)."""
    return sum(
        (min(q0 + tq, lq) - q0) * (min(k0 + tk, lk) - k0)
        for q0 in range(0, lq, tq)
        for k0 in range(0, lk, tk)
        if mask_mods.block_state(mod, batch, 1, q0, min(q0 + tq, lq), k0, min(k0 + tk, lk))
        != mask_mods.TileState.EMPTY
    )


@st.composite
def builtin_mods(draw, lq: int):
    kind = draw(st.sampled_from(["causal", "sliding", "prefix", "document", "valid"]))
    if kind == "causal":
        return mask_mods.causal(), 1
    if kind == "sliding":  # narrow windows (cross-attention rows past every key) and wide ones
        return mask_mods.sliding_window(draw(st.integers(0, 40) | st.integers(0, 2 * lq))), 1
    if kind == "prefix":
        return mask_mods.prefix_lm(draw(st.integers(0, 2 * lq))), 1
    if kind == "document":
        return mask_mods.document(
            draw(st.lists(st.integers(1, max(1, lq // 2)), min_size=1, max_size=8))
        ), 1
    lens = draw(st.lists(st.integers(-2, 2 * lq), min_size=1, max_size=3))
    return mask_mods.valid_lengths(torch.tensor(lens)), len(lens)


@settings(max_examples=300)
@given(
    data=st.data(),
    lq=st.integers(1, 500),
    lk=st.integers(1, 500),
    tq=st.integers(2, 64),
    tk=st.integers(2, 64),
)
def test_closed_form_tile_pairs_equal_the_tile_walk(data, lq, lk, tq, tk):
    mod, batch = data.draw(builtin_mods(lq))
    assert mask_mods.nonempty_tile_pairs(mod, batch, 1, lq, lk, tq, tk) == _walk(
        mod, batch, lq, lk, tq, tk
    ), mod.name
    walked = dataclasses.replace(
        mod, tile_pairs=None
    )  # no closed form: the generic fallback walks the tiles
    assert mask_mods.nonempty_tile_pairs(walked, batch, 1, lq, lk, tq, tk) == _walk(
        mod, batch, lq, lk, tq, tk
    )


def _old_sliding_pairs(w: int, lq: int, lk: int) -> int:
    return sum(max(0, min(lk - 1, i + w) - max(0, i - w) + 1) for i in range(lq))


def _old_prefix_pairs(p: int, lq: int, lk: int) -> int:
    return sum(min(lk, max(p, i + 1)) for i in range(lq))


@settings(max_examples=300)
@given(
    lq=st.integers(1, 3000), lk=st.integers(1, 3000), n=st.integers(0, 50) | st.integers(0, 4000)
)
def test_closed_form_allowed_pairs_equal_the_row_sums(lq, lk, n):
    assert mask_mods.allowed_pairs(mask_mods.sliding_window(n), 1, lq, lk) == _old_sliding_pairs(
        n, lq, lk
    )
    assert mask_mods.allowed_pairs(mask_mods.prefix_lm(n), 1, lq, lk) == _old_prefix_pairs(
        n, lq, lk
    )


@given(lq=st.integers(1, 40), lk=st.integers(1, 40), n=st.integers(0, 45))
def test_closed_form_allowed_pairs_equal_the_dense_count(lq, lk, n):
    for mod in (mask_mods.sliding_window(n), mask_mods.prefix_lm(n)):
        assert mask_mods.allowed_pairs(mod, 1, lq, lk) == int(
            mask_mods.dense(mod, 1, 1, lq, lk).sum()
        )


SPEC_MASKS = [m for m in attnbench.masks.MASK_KINDS if m != "none"]


@settings(max_examples=150)
@given(
    mask=st.sampled_from(SPEC_MASKS),
    lq=st.integers(1, 2500),
    lk=st.integers(1, 2500),
    batch=st.integers(1, 3),
    q_chunk=st.sampled_from([None, 7, 64, 256]),
    k_chunk=st.sampled_from([None, 5, 100, 2048]),
    dtype=st.sampled_from(["float32", "bfloat16"]),
    window=st.integers(1, 40) | st.integers(1, 400),
)
def test_chunked_counts_exactly_the_tiles_its_forward_computes(
    mask, lq, lk, batch, q_chunk, k_chunk, dtype, window
):
    variant = attnbench.get_variant("chunked", q_chunk=q_chunk, k_chunk=k_chunk)
    spec = AttnSpec(
        batch=batch,
        heads=1,
        seq_len=lq,
        seq_len_k=lk,
        head_dim=4,
        mask=mask,
        dtype=dtype,
        window=window,
    )
    grid = variant._tile_states(spec.mask_mod(), batch, 1, lq, lk, dtype)  # the forward's own grid
    assert variant.executed_pairs(spec) == sum(
        (q1 - q0) * (k1 - k0) for q0, q1, row in grid for k0, k1, _ in row
    )


def _old_flex_pairs(spec: AttnSpec) -> int:
    t, lq, lk = FlexAttention.TILE, spec.lq, spec.lk
    if spec.mask == "none":
        return lq * lk
    if spec.mask == "valid_lengths":
        r_lo = torch.arange(0, lq, t)[:, None]
        c_lo = torch.arange(0, lk, t)[None, :]
        sizes = ((r_lo + t - 1).clamp(max=lq - 1) - r_lo + 1) * (
            (c_lo + t - 1).clamp(max=lk - 1) - c_lo + 1
        )
        return (
            sum(
                int((sizes * (c_lo < n)).sum())
                for n in attnbench.masks.default_valid_lens(spec.batch, lk)
            )
            // spec.batch
        )
    return _walk(spec.mask_mod(), spec.batch, lq, lk, t, t)


@settings(max_examples=150)
@given(
    mask=st.sampled_from(attnbench.masks.MASK_KINDS),
    lq=st.integers(1, 3000),
    lk=st.integers(1, 3000),
    batch=st.integers(1, 4),
    window=st.integers(1, 40) | st.integers(1, 600),
)
def test_flex_counts_equal_the_tile_walk(mask, lq, lk, batch, window):
    spec = AttnSpec(
        batch=batch, heads=1, seq_len=lq, seq_len_k=lk, head_dim=16, mask=mask, window=window
    )
    assert attnbench.get_variant("flex").executed_pairs(spec) == _old_flex_pairs(spec)


def _pattern_counts(v: BlockSparseAttention, length: int) -> tuple[int, int, int]:
    """(global rows, widest gathered row, pattern pairs) read off the drawn pattern (the old cost model)."""
    nb = -(-length // v.block)
    blocks = block_pattern(nb, v.global_blocks, v.window_blocks, v.random_blocks, v.seed)
    g = min(v.global_blocks, nb)
    size = torch.full((nb,), v.block, dtype=torch.float64)
    size[-1] = length - (nb - 1) * v.block
    width = int(blocks[g:].sum(1).max()) if nb > g else 0
    return (
        min(g * v.block, length),
        width,
        int(round(float(size @ blocks.to(torch.float64) @ size))),
    )


@settings(max_examples=400)
@given(
    block=st.integers(1, 40),
    global_blocks=st.integers(0, 6),
    window_blocks=st.integers(0, 8),
    random_blocks=st.integers(0, 8),
    seed=st.integers(0, 3),
    length=st.integers(1, 600),
)
def test_block_sparse_counts_equal_its_drawn_pattern(
    block, global_blocks, window_blocks, random_blocks, seed, length
):
    v = BlockSparseAttention(block, global_blocks, window_blocks, random_blocks, seed)
    rows, width, pairs = _pattern_counts(v, length)
    spec = AttnSpec(batch=1, heads=1, seq_len=length, head_dim=4)
    assert v._split(spec) == (
        rows,
        -(-length // block) - min(global_blocks, -(-length // block)),
        width,
    )
    assert v.pattern_pairs(length) == pairs


def test_block_sparse_refuses_lengths_beyond_its_pattern_limit():
    spec = AttnSpec(seq_len=10**9)
    assert any(
        "block pattern" in r
        for r in attnbench.get_variant("block_sparse").not_supported_reasons(spec)
    )
    assert not attnbench.get_variant("block_sparse").not_supported_reasons(AttnSpec(seq_len=2**20))


# ---- 5 and 13: cost models answer at any length, counted in work, never in seconds -----------
@pytest.fixture(scope="module")
def work(tmp_path_factory):
    return {SHORT: work_at_short(tmp_path_factory), 10**9: work_at(10**9)}


def test_cost_models_answer_at_a_billion_with_the_work_of_a_short_length(work):
    """Every variant x mask x mode, and measure()'s guard: the same Python work at L = 10**9 as at 4096."""
    short, _ = work[SHORT]
    huge, _ = work[10**9]
    assert short.keys() == huge.keys()
    grown = {k: (short[k][0], huge[k][0]) for k in short if huge[k][0] > 2 * short[k][0] + 200}
    assert not grown, f"Python lines (L=4096, L=10**9) that grew with the length: {grown}"
    largest = {k: v[1] for k, v in huge.items() if v[1] > 2**16}
    assert not largest, f"tensors with more than 2**16 elements built for L=10**9: {largest}"
