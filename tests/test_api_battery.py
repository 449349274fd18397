"""Malformed API inputs: a deterministic battery and a hypothesis property, over every cheap variant.

Each call either raises a ValueError/TypeError naming the argument, or returns what the float64
reference returns (tolerance rule of the tests; NaN exactly where the reference is NaN). Never an
obscure error, never a silently wrong result. See ``studies/api_battery.py``.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from studies.api_battery import cases, classify, run
from tests.conftest import cheap_variants


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
