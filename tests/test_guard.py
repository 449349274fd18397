"""The guard counts everything a case allocates before it is allocated (fault-planting tests).

Each known hole is reproduced with a budget the machine can afford (1.5 GiB): the case must come
back ``skipped`` with a reason, without allocating (the tests would otherwise need gigabytes).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

import attnbench
from attnbench.measure import MeasureConfig, guard, measure, sweep
from attnbench.measure.timer import TimerConfig
from attnbench.variants.base import Variant
from attnbench.variants.batched import BatchedAttention

BUDGET = 1.5 * 2**30
SMALL_BUDGET = MeasureConfig(
    memory_budget_bytes=BUDGET,
    measure_rss=False,
    probe=False,
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.1),
)
needs_weight_model = pytest.mark.skipif(
    not hasattr(Variant, "parameter_bytes"),
    reason="the variant cost models count weights on the 'flops' branch",
)


def test_mask_bytes_counts_the_dense_mask():
    spec = attnbench.AttnSpec(batch=2, seq_len=300, seq_len_k=200)
    for kind, expected in (
        ("none", 0),
        ("causal", 300 * 200),
        ("sliding_window", 300 * 200),
        ("valid_lengths", 2 * 200),
    ):
        s = spec.replace(mask=kind)
        mask = s.make_mask()
        assert (
            s.mask_bytes == expected == (0 if mask is None else mask.numel() * mask.element_size())
        )


def test_the_guard_counts_the_mask_and_grad_out():
    spec = attnbench.AttnSpec(
        batch=1, heads=1, seq_len=4096, head_dim=8, mask="causal", mode="backward"
    )
    v = attnbench.get_variant("batched")  # receives the dense mask
    need = guard.predicted_bytes(v, spec)
    assert need == spec.input_bytes + spec.mask_bytes + spec.output_bytes + v.predicted_peak_bytes(
        spec
    )
    m = measure(
        "batched",
        spec,
        MeasureConfig(memory_budget_bytes=need - 1, check_accuracy=False),
        peak_flops=1e10,
    )
    assert m.status == "skipped" and "inputs+mask" in m.reason
    # chunked takes the predicate: no dense mask is built, so none is counted.
    c = attnbench.get_variant("chunked")
    assert guard.predicted_bytes(
        c, spec
    ) == spec.input_bytes + spec.output_bytes + c.predicted_peak_bytes(spec)


def test_the_guard_counts_the_reference():
    spec = attnbench.AttnSpec(batch=1, heads=2, seq_len=512, head_dim=16)
    v = attnbench.get_variant("chunked")
    unchecked = guard.predicted_bytes(v, spec)
    m = measure("chunked", spec, MeasureConfig(memory_budget_bytes=unchecked + 1), peak_flops=1e10)
    assert m.status == "skipped" and "reference" in m.reason
    assert (
        measure(
            "chunked",
            spec,
            MeasureConfig(memory_budget_bytes=unchecked + 1, check_accuracy=False, probe=False),
            peak_flops=1e10,
        ).status
        == "ok"
    )


class _BrokenModel(BatchedAttention):
    """A variant whose cost model raises (as block_sparse's dense pattern did at L=65536)."""

    def flops(self, spec):
        raise MemoryError("cost model tried to allocate 34 GB")


def test_a_cost_model_exception_is_a_row_not_a_dead_sweep():
    attnbench.register("plant_broken_model", _BrokenModel)
    try:
        results = sweep(
            [
                ("plant_broken_model", attnbench.AttnSpec(seq_len=64, heads=2)),
                ("batched", attnbench.AttnSpec(seq_len=64, heads=2)),
            ],
            SMALL_BUDGET,
        )
    finally:
        attnbench.unregister("plant_broken_model")
    assert [m.status for m in results] == ["oom", "ok"]
    assert "cost model tried to allocate" in results[0].reason


@needs_weight_model
def test_torch_mha_weights_are_counted():
    """H16 D1024 L8: E = 16384, four E x E float32 projections = 4 GiB (was predicted at 4 MiB)."""
    spec = attnbench.AttnSpec(heads=16, head_dim=1024, seq_len=8)
    assert attnbench.get_variant("torch_mha").predicted_peak_bytes(spec) >= 4 * 16384**2 * 4
    m = measure("torch_mha", spec, SMALL_BUDGET, peak_flops=1e10)
    assert m.status == "skipped" and "exceeds the memory budget" in m.reason


@needs_weight_model
def test_block_sparse_at_65536_is_skipped_without_building_a_dense_pattern():
    script = (
        "import resource, attnbench\n"
        "from attnbench.measure import MeasureConfig, measure\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 * 2**30, resource.RLIM_INFINITY))\n"  # a dense L x L pattern is 4 GiB
        f"m = measure('block_sparse', attnbench.AttnSpec(seq_len=65536), MeasureConfig(memory_budget_bytes={BUDGET}), peak_flops=1e11)\n"
        "print(m.status, '|', m.reason)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr[-2000:]
    status, reason = out.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert status == "skipped" and "exceeds the memory budget" in reason, reason


def test_profile_goes_through_the_guard(tmp_path, capsys):
    """``attnbench profile batched --seq-len 16384`` went past 8 GB: now refused before anything is built."""
    from attnbench.cli import main
    from attnbench.profile import profile_case

    spec = attnbench.AttnSpec(seq_len=16384)
    with pytest.raises(ValueError, match="refused by the guard.*exceeds the memory budget"):
        profile_case(
            "batched", spec, tmp_path / "p", config=MeasureConfig(memory_budget_bytes=BUDGET)
        )
    need = guard.predicted_bytes(attnbench.get_variant("batched"), spec)
    if need <= MeasureConfig().memory_budget("cpu"):
        pytest.skip("this machine has the memory for the case: the CLI would profile it")
    code = main(["profile", "batched", "--seq-len", "16384", "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and "refused by the guard" in err and "exceeds the memory budget" in err
    assert not (tmp_path / "p" / "trace.json.gz").exists()


# --- the matmul peak cache and the time guard's prediction --------------------------------------------------


def test_extrapolation_scales_the_measured_time_by_the_declared_exponent():
    spec = attnbench.AttnSpec(seq_len=4096)
    assert guard.extrapolated_seconds(
        attnbench.get_variant("batched"), spec, 2048, 1.5
    ) == pytest.approx(6.0)
    assert guard.extrapolated_seconds(
        attnbench.get_variant("linear_elu"), spec, 2048, 0.1
    ) == pytest.approx(0.2)
    assert (
        guard.extrapolated_seconds(attnbench.get_variant("batched"), spec, 4096, 1.0) is None
    )  # not shorter
    assert (
        guard.extrapolated_seconds(
            attnbench.get_variant("batched"), spec.replace(seq_len_k=512), 2048, 1.0
        )
        is None
    )
    reasons = guard.guard_reasons(
        attnbench.get_variant("batched"),
        spec,
        memory_budget=1e12,
        time_budget=60,
        peak_flops=1e15,
        calls=10,
        call_s=7.0,
    )
    assert reasons and "extrapolated" in reasons[0]


def test_the_sweep_extrapolates_instead_of_trusting_a_poisoned_peak(monkeypatch):
    """Planted: a matmul peak 1,000x too low. The cost model alone skips batched at L=256 (the direct
    call shows it); the sweep predicts L=256 from its own L=32 measurement and runs it. (The gate's
    reference is still predicted from the peak: the cache's best-of defends that, tested above.)"""
    from attnbench.measure import runner

    monkeypatch.setattr(runner, "matmul_peak", lambda device, dtype: 1e8)
    config = MeasureConfig(
        time_budget_s=3.0,
        probe=False,
        measure_rss=False,
        measure_memory=False,
        check_accuracy=False,
        timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.1),
    )
    spec = attnbench.AttnSpec(heads=2)
    alone = measure("batched", spec.replace(seq_len=256), config)
    assert alone.status == "skipped" and "cost model" in alone.reason
    short, long = sweep(
        [("batched", spec.replace(seq_len=32)), ("batched", spec.replace(seq_len=256))], config
    )
    assert short.status == "ok" and long.status == "ok", long.reason
