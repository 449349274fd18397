"""Issue-6 features: SDPA provenance, compile time outside the timed region, cache flushing, and
the CUDA paths (which skip with a reason on machines without a GPU)."""

from __future__ import annotations

import math

import pytest
import torch

import attnbench
import attnbench.analysis.rundir
from attnbench.analysis.summary import provenance
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.provenance import backends_in
from attnbench.measure.timer import TimerConfig, cuda_graph_seconds, time_call
from attnbench.runs import write_run

FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.3), measure_rss=False, probe=False
)
SMALL = attnbench.AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16)
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device; run on a GPU machine"
)


def test_backend_signatures():
    assert backends_in(["aten::_scaled_dot_product_flash_attention_for_cpu", "aten::bmm"]) == [
        "flash"
    ]
    assert backends_in(["aten::_scaled_dot_product_attention_math", "aten::softmax"]) == ["math"]
    assert backends_in(["void pytorch_flash::flash_fwd_kernel<...>"]) == ["flash"]
    assert backends_in(["fmha_cutlassF_f16_aligned_64x64_rf_sm80"]) == ["efficient"]
    assert backends_in(["aten::mm"]) == []


@pytest.mark.parametrize(
    "name,kernel",
    [("sdpa_math", "math"), ("sdpa_flash", "flash"), ("sdpa", "flash"), ("torch_mha", "flash")],
)
def test_provenance_is_recorded(name, kernel):
    m = measure(name, SMALL, FAST, peak_flops=1e10)
    assert m.status == "ok" and m.extra["kernel"] == kernel


def test_provenance_table_flags_math_fallbacks(tmp_path):
    results = [measure(n, SMALL, FAST, peak_flops=1e10) for n in ("sdpa_math", "sdpa")]
    object.__setattr__(results[1], "extra", {"kernel": "math"})  # simulate a silent fallback
    run = write_run(tmp_path / "run", results, FAST, seconds=1.0, command=["x"])
    table = provenance(attnbench.analysis.rundir.load_run(run).frame).set_index("variant")
    assert table.loc["sdpa_math", "note"] == ""
    assert "fell back to math" in table.loc["sdpa", "note"]


@pytest.mark.slow
def test_compile_time_is_recorded_and_never_timed():
    torch._dynamo.reset()  # a graph compiled by an earlier test for this shape would be reused
    spec = SMALL.replace(
        seq_len=40, head_dim=12
    )  # a shape no other test compiles (Inductor's in-process caches)
    with torch._inductor.config.patch(force_disable_caches=True):  # ... and its on-disk caches
        compiled = measure("compiled_batched", spec, FAST, peak_flops=1e10)
    eager = measure("batched", spec, FAST, peak_flops=1e10)
    assert compiled.status == "ok", compiled.reason
    assert (
        compiled.compile_seconds > 0.5 > compiled.median
    )  # compilation took seconds, a call does not
    assert math.isnan(eager.compile_seconds)
    assert compiled.max_error < 1e-5


def test_flex_runs_with_masks_on_cpu():
    spec = SMALL.replace(mask="causal")
    m = measure("flex", spec, FAST, peak_flops=1e10)
    assert m.status == "ok" and m.max_error < 1e-5 and m.compile_seconds > 0


def test_flush_cache_times_one_call_per_sample(monkeypatch):
    """One warm-up call, one sizing call, then one call per sample. A sizing call that waited for a
    core is made again (tests/test_noise.py), so here no wait is read: beside CI's parallel tests the
    count depended on a neighbour (6 calls for 3 samples)."""
    from attnbench.measure import schedstat

    monkeypatch.setattr(schedstat, "runqueue_seconds", lambda: None)
    calls = []
    samples, runs = time_call(
        lambda: calls.append(1),
        "cpu",
        TimerConfig(min_runs=3, min_time=1e-6, max_time=1.0, flush_cache=True, warmup_time=0.0),
    )
    assert runs == len(samples) == len(calls) - 2


def test_dtype_sweep_records_per_dtype_roof(tmp_path, capsys):
    from attnbench.cli import main

    out = tmp_path / "run"
    assert (
        main(
            [
                "run",
                "--variants",
                "batched",
                "--lengths",
                "32",
                "--dtypes",
                "float32,bfloat16",
                "--out",
                str(out),
                "--no-report",
                "--quiet",
                "--min-time",
                "0.01",
                "--max-time",
                "0.1",
                "--min-runs",
                "2",
                "--no-instructions",
            ]
        )
        == 0
    )
    frame = attnbench.analysis.rundir.load_run(out).frame
    roofs = frame.groupby("dtype")["peak_gflops"].first()
    assert set(roofs.index) == {"float32", "bfloat16"} and roofs.notna().all()
    assert "bfloat16" in capsys.readouterr().out


@needs_cuda
def test_cuda_measurement_uses_allocator_stats_and_records_the_gpu():
    m = measure("batched", SMALL.replace(device="cuda"), FAST)
    assert m.status == "ok" and m.memory_method == "cuda" and m.peak_tensor_bytes > 0
    assert m.env.gpu_name and m.env.device_name == m.env.gpu_name


@needs_cuda
def test_cuda_graph_replay_is_faster_or_equal_for_short_sequences():
    q, k, v, _ = SMALL.replace(device="cuda").make_inputs()
    variant = attnbench.get_variant("batched")
    graph = cuda_graph_seconds(lambda: variant(q, k, v), "cuda")
    eager, _ = time_call(lambda: variant(q, k, v), "cuda")
    assert 0 < graph <= sorted(eager)[len(eager) // 2] * 1.5


@needs_cuda
@pytest.mark.parametrize("backend", ["flash", "efficient", "math"])
def test_forced_backends_on_cuda(backend):
    spec = attnbench.AttnSpec(
        batch=1, heads=4, seq_len=256, head_dim=64, dtype="bfloat16", device="cuda"
    )
    m = measure(f"sdpa_{backend}", spec, FAST)
    refused = attnbench.get_variant(f"sdpa_{backend}").not_supported_reasons(spec)
    if refused:  # this card or torch cannot run it: a skipped row with the reason, never an error
        assert m.status == "skipped" and refused[0] in m.reason
        return
    assert m.status == "ok", m.reason
    assert m.extra["kernel"] == backend
