"""The kernel's answer, and how its memory and work grow, checked by attnbench.testing."""

from blockwise_attention import blockwise_attention

import attnbench
from attnbench.testing import assert_growth, assert_within, check_answer, wrap

kernel = wrap(blockwise_attention, call="sdpa", masks=attnbench.masks.MASK_KINDS, gqa=True)
CAUSAL = attnbench.AttnSpec(heads=8, head_dim=64, mask="causal")


def test_answer_matches_the_float64_reference():
    check_answer(kernel)


def test_memory_grows_linearly():
    assert_growth(kernel, "peak_tensor_bytes", spec=CAUSAL, max_exponent=1.05, max_at_length=4e9)


def test_causal_blocks_do_no_more_work_than_dense_attention():
    assert_within(kernel, "batched", "flops", spec=CAUSAL, factor=1.0)


def test_no_slower_than_dense_attention():
    # 10 ms a side is too few samples for the gate's noise rules: this skips, and says why
    assert_within(kernel, "batched", "time", [128, 256, 512], spec=CAUSAL, seconds=0.01)
