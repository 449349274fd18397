"""Compiled variants warm up through the timed closure: the first timed call compiles nothing."""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.runner import make_call
from attnbench.measure.timer import TimerConfig
from attnbench.variants.compiled import _compiler_reasons

pytestmark = pytest.mark.skipif(
    bool(_compiler_reasons("cpu")), reason="torch.compile on CPU needs a C compiler"
)


def _compiles(fn) -> int:
    """Graphs Dynamo compiled while running ``fn`` (0 when every frame hit its cache)."""
    from torch._dynamo.utils import counters

    counters.clear()
    fn()
    return counters["stats"]["unique_graphs"] + counters["frames"]["ok"]


@pytest.mark.parametrize("mode", ["forward", "backward"])
@pytest.mark.parametrize("name", ["compiled_batched", "compiled_chunked"])
def test_the_first_timed_call_compiles_nothing(name, mode):
    # Dynamo caches per code object, across instances: a test that compiled these shapes earlier in the
    # process (test_flops does) would turn the control's compilation into a cache hit.
    torch._dynamo.reset()
    variant = attnbench.get_variant(name)
    spec = attnbench.AttnSpec(batch=1, heads=2, seq_len=48, head_dim=16, mode=mode)
    call, (q, k, v), mask = make_call(variant, spec, seed=0)
    result, seconds = variant.warm_up(call)
    assert seconds > 0 and result is not None
    assert _compiles(call) == 0  # the first call the timer makes
    # Control: the counter does see a compilation, e.g. the same inputs under the other grad mode
    # (what a warm-up outside the closure did before: compile with grad on, time under no_grad).
    with torch.set_grad_enabled(mode == "forward"):
        assert (
            _compiles(
                lambda: variant.forward(q.detach().requires_grad_(mode == "forward"), k, v, mask)
            )
            > 0
        )


def test_compile_time_is_recorded_apart_from_the_timing():
    config = MeasureConfig(
        timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.2), measure_rss=False, probe=False
    )
    m = measure(
        "compiled_chunked",
        attnbench.AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16),
        config,
        peak_flops=1e10,
    )
    assert m.status == "ok", m.reason
    assert m.compile_seconds > 0 and not math.isnan(m.compile_seconds)
    assert m.median < m.compile_seconds  # compiling is not in the samples
