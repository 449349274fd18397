"""The measurement engine: statuses, guards, OOM, memory model, timer, atomic writes, schema.

Nothing here depends on how fast the machine is: speed is shown by benchmark runs, not tests.
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

import attnbench
from attnbench.io import atomic_write_text
from attnbench.measure import MeasureConfig, Measurement, measure, sweep
from attnbench.measure.memory import cpu_peak_tensor_bytes, peak_from_timeline
from attnbench.measure.timer import TimerConfig, time_call
from attnbench.rundir_format import MANIFEST, MEASUREMENTS
from attnbench.runs import write_run
from attnbench.variants.batched import BatchedAttention

FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.5), measure_rss=False, probe=False
)
SMALL = attnbench.AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16)


class _Failing(BatchedAttention):
    """Test double: raises a chosen exception from the call."""

    exc: Exception = RuntimeError("boom")

    def forward(self, q, k, v, mask):
        raise self.exc


class _Oom(_Failing):
    exc = RuntimeError(
        "DefaultCPUAllocator: can't allocate memory: you tried to allocate 1000000000000 bytes."
    )


class _Sleepy(BatchedAttention):
    def forward(self, q, k, v, mask):
        time.sleep(0.2)
        return super().forward(q, k, v, mask)


@pytest.fixture
def registered():
    names = []

    def add(name, cls):
        attnbench.register(name, cls)
        names.append(name)
        return name

    yield add
    for n in names:
        attnbench.unregister(n)


def test_ok_measurement_has_every_field():
    m = measure("batched", SMALL, FAST, peak_flops=1e10)
    assert m.status == "ok" and m.reason == ""
    assert m.runs >= 2 and len(m.samples) >= 1 and all(s > 0 for s in m.samples)
    assert m.median > 0 and m.iqr >= 0 or len(m.samples) == 1
    assert m.peak_tensor_bytes > 0 and m.memory_method == "profiler"
    assert m.flops_executed == 4 * 1 * 2 * 64 * 64 * 16 == m.flops_useful
    assert m.max_error < 1e-5
    assert m.env is not None and m.env.torch == torch.__version__ and m.env.threads >= 1


def test_unsupported_case_is_skipped_with_reason():
    m = measure("sdpa_efficient", SMALL, FAST, peak_flops=1e10)
    assert m.status == "skipped" and "needs CUDA" in m.reason


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only skip path")
def test_cuda_case_skips_cleanly_without_gpu():
    m = measure("batched", SMALL.replace(device="cuda"), FAST, peak_flops=1e10)
    assert m.status == "skipped" and "CUDA is not available" in m.reason


def test_memory_guard_skips_before_running():
    m = measure("batched", SMALL, MeasureConfig(memory_budget_bytes=1), peak_flops=1e10)
    assert m.status == "skipped" and "exceeds the memory budget" in m.reason
    assert m.samples == ()


def test_time_guard_skips_the_loop_at_long_lengths():
    m = measure(
        "loop", SMALL.replace(seq_len=4096), MeasureConfig(time_budget_s=30), peak_flops=1e10
    )
    assert m.status == "skipped" and "exceeds the time budget" in m.reason


def test_measured_timeout(registered):
    name = registered("sleepy", _Sleepy)
    m = measure(
        name, SMALL, MeasureConfig(time_budget_s=1.0, check_accuracy=False), peak_flops=1e12
    )
    assert m.status == "timeout" and "exceed the time budget" in m.reason and m.runs == 1


def test_error_and_oom_become_rows_and_the_sweep_goes_on(registered):
    fail, oom = registered("failing", _Failing), registered("oomy", _Oom)
    results = sweep([(fail, SMALL), (oom, SMALL), ("batched", SMALL)], FAST)
    assert [m.status for m in results] == ["error", "oom", "ok"]
    assert "RuntimeError: boom" in results[0].reason
    assert "can't allocate memory" in results[1].reason


class _BareMemoryError(_Failing):
    exc = MemoryError()  # Python's own out-of-memory: no message at all


def test_a_bare_memory_error_is_an_oom_row(registered):
    """Planted: an exception with an empty message made measure() itself raise IndexError (its first line)."""
    name = registered("bare_oom", _BareMemoryError)
    m = measure(name, SMALL, FAST)
    assert m.status == "oom" and m.reason == "MemoryError", (m.status, m.reason)


def test_sweep_rejects_unknown_variants_before_running():
    with pytest.raises(ValueError, match="unknown variant"):
        sweep([("batched", SMALL), ("nope", SMALL)], FAST)


def test_real_out_of_memory_is_recorded(tmp_path):
    """Cap the address space of a child process, disable the guard, and ask for too much."""
    script = """
import resource, psutil, torch
torch.set_num_threads(1)
import attnbench
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.timer import TimerConfig
vms = psutil.Process().memory_info().vms
resource.setrlimit(resource.RLIMIT_AS, (vms + 400 * 2**20, resource.RLIM_INFINITY))
spec = attnbench.AttnSpec(batch=1, heads=8, seq_len=4096, head_dim=64)  # scores alone: 512 MiB
config = MeasureConfig(memory_budget_bytes=1e15, check_accuracy=False, measure_rss=False,
                       timer=TimerConfig(min_runs=1, min_time=0.01, max_time=0.1))
m = measure("batched", spec, config, peak_flops=1e12)
print(m.status, "|", m.reason)
"""
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-2000:]
    status, reason = out.stdout.strip().splitlines()[-1].split(" | ", 1)
    assert status == "oom", reason


@pytest.mark.parametrize("seq_len", [256, 512])
def test_cpu_peak_memory_matches_the_analytic_count_for_batched(seq_len):
    """Scores + probabilities + output, within 10% (272.6 MB at L=2048 on this project's machines)."""
    spec = attnbench.AttnSpec(batch=1, heads=8, seq_len=seq_len, head_dim=64)
    variant = attnbench.get_variant("batched")
    q, k, v, _ = spec.make_inputs()
    with torch.no_grad():
        peak = cpu_peak_tensor_bytes(lambda: variant(q, k, v))
    analytic = (2 * 8 * seq_len * seq_len + 8 * seq_len * 64) * 4
    assert peak is not None and abs(peak - analytic) / analytic < 0.10, (peak, analytic)
    assert abs(variant.predicted_peak_bytes(spec) - analytic) / analytic < 0.01


def test_chunked_peak_is_far_below_batched():
    spec = attnbench.AttnSpec(batch=1, heads=4, seq_len=1024, head_dim=32)
    q, k, v, _ = spec.make_inputs()
    peaks = {}
    for name in ("batched", "chunked"):
        variant = attnbench.get_variant(name)
        with torch.no_grad():
            peaks[name] = cpu_peak_tensor_bytes(lambda variant=variant: variant(q, k, v))
    assert peaks["chunked"] < peaks["batched"] / 4, peaks


def test_peak_from_timeline_ignores_preexisting():
    class A:
        def __init__(self, name):
            self.name = name

    timeline = [
        (0, A("PREEXISTING"), None, 100),
        (1, A("CREATE"), None, 10),
        (2, A("CREATE"), None, 5),
        (3, A("DESTROY"), None, 10),
        (4, A("CREATE"), None, 7),
    ]
    assert peak_from_timeline(timeline) == 15


def test_profiler_noise_never_reaches_stderr():
    script = "import torch\nfrom attnbench.measure.memory import cpu_peak_tensor_bytes\nprint(cpu_peak_tensor_bytes(lambda: torch.ones(1000) * 2))"
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and int(out.stdout.strip()) >= 4000
    assert out.stderr.strip() == "", out.stderr


def test_timer_counts_calls_and_agrees_with_blocked_autorange_structurally():
    from torch.utils.benchmark import Timer

    def work():
        time.sleep(0.004)

    samples, runs = time_call(work, "cpu", TimerConfig(min_runs=5, min_time=0.05, max_time=1.0))
    assert runs >= 5 and len(samples) >= 2
    ours = sorted(samples)[len(samples) // 2]
    theirs = Timer("work()", globals={"work": work}).blocked_autorange(min_run_time=0.1).median
    assert 0.5 < ours / theirs < 2.0  # a per-call bookkeeping bug would be off by the block size


def test_cache_flushes_are_inside_max_time_and_reuse_one_buffer(monkeypatch):
    """Planted: a flush costing 50 ms before every 1 us call (a fake clock: counted, never timed). ``max_time`` bounds
    the wall time, flushes included: before, it bounded the timed calls alone, and a decode case at the default
    0.25 s of timed calls took 2 minutes of flushing (0.3 ms calls, 0.12 s flushes). One buffer per timing."""
    from attnbench.measure import timer

    now = [0.0]
    monkeypatch.setattr(timer.time, "perf_counter", lambda: now[0])
    made = []

    def flusher(device):
        made.append(device)

        def flush():
            now[0] += 0.05

        return flush

    def call():
        now[0] += 1e-6

    monkeypatch.setattr(timer, "cache_flusher", flusher)
    samples, calls = time_call(
        call,
        "cpu",
        TimerConfig(
            warmup=1, warmup_time=0.0, min_runs=2, min_time=0.25, max_time=0.3, flush_cache=True
        ),
    )
    assert len(made) == 1
    assert (
        2 <= len(samples) == calls <= 7
    )  # 0.3 s of 50 ms flushes: six or seven samples, never 250,000
    assert all(s == pytest.approx(1e-6) for s in samples)


def test_measurement_statistics_are_derived():
    m = Measurement(variant="x", spec=SMALL, status="ok", samples=(1.0, 2.0, 3.0, 4.0, 100.0))
    assert m.median == 3.0 and m.iqr == 2.0 and m.noisy
    with pytest.raises(ValueError, match="status"):
        Measurement(variant="x", spec=SMALL, status="fine")


def test_backward_flops_are_3x_forward_for_eager_autograd():
    v = attnbench.get_variant("batched")
    fwd, bwd = v.flops(SMALL), v.flops(SMALL.replace(mode="backward"))
    assert (
        bwd.executed == 3 * fwd.executed
    )  # forward + backward at 2x (two matmuls per forward matmul)
    assert measure("chunked", SMALL.replace(mode="backward"), FAST, peak_flops=1e10).status == "ok"


def test_causal_and_sparse_flops_report_useful_and_executed():
    causal = SMALL.replace(mask="causal")
    dense = attnbench.get_variant("batched").flops(causal)
    assert dense.useful == pytest.approx(dense.executed * (65 / 128), rel=1e-6)
    local = attnbench.get_variant("local", window=8).flops(SMALL)
    assert local.useful < local.executed < dense.executed


def test_atomic_write_never_leaves_half_files(tmp_path):
    target = tmp_path / "out.txt"
    atomic_write_text(target, "old")

    def boom(_tmp):
        Path(_tmp).write_text("half")
        raise OSError("disk full")

    from attnbench.io import atomic_write

    with pytest.raises(OSError):
        atomic_write(target, boom)
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.txt"]


def test_run_directory_schema(tmp_path):
    results = sweep([("batched", SMALL), ("sdpa_cudnn", SMALL)], FAST)
    run = write_run(tmp_path / "run", results, FAST, seconds=1.0, command=["attnbench", "run"])
    frame = pd.read_csv(run / MEASUREMENTS)
    manifest = json.loads((run / MANIFEST).read_text())
    required = {
        "variant",
        "spec_seq_len",
        "spec_device",
        "spec_mode",
        "status",
        "reason",
        "median_s",
        "iqr_s",
        "runs",
        "peak_tensor_bytes",
        "peak_rss_bytes",
        "flops_executed",
        "gflops_per_s",
        "max_error",
        "env_torch",
        "env_threads",
        "env_cpu_model",
    }
    assert required <= set(frame.columns)
    assert frame["status"].tolist() == ["ok", "skipped"]
    assert (
        manifest["statuses"] == {"ok": 1, "skipped": 1}
        and manifest["environment"]["torch"] == torch.__version__
    )


def test_cli_run_smoke(tmp_path, capsys):
    from attnbench.cli import main

    code = main(
        [
            "run",
            "--variants",
            "batched,sdpa_efficient",
            "--lengths",
            "32,64",
            "--out",
            str(tmp_path / "r"),
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
    out = capsys.readouterr().out
    assert code == 0 and "batched" in out and "skipped" in out
    assert (tmp_path / "r" / MEASUREMENTS).exists()


def test_cli_rejects_bad_arguments_before_measuring(capsys):
    from attnbench.cli import main

    def code(argv: list[str]) -> int:
        try:
            return main(argv)
        except SystemExit as exc:  # argparse's own usage errors
            return exc.code

    assert code(["run", "--variants", "nope", "--quiet", "--no-report"]) == 2
    assert "--variants" in (err := capsys.readouterr().err) and "nope" in err
    assert code(["run", "--variants", "batched", "--batch", "0", "--quiet", "--no-report"]) == 2
    assert "--batch" in capsys.readouterr().err
    assert code(["profile", "sdpa_efficient", "--seq-len", "64"]) == 2
    assert "needs CUDA" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("fields", "error", "said"),
    [
        (
            dict(time_budget_s=float("nan")),
            ValueError,
            "time_budget_s must be a finite number > 0, got nan",
        ),
        (
            dict(memory_budget_bytes=-1),
            ValueError,
            "memory_budget_bytes must be a finite number > 0, got -1",
        ),
        (dict(time_budget_s="10"), TypeError, "time_budget_s must be a number, got str '10'"),
        (dict(check_accuracy="no"), TypeError, "check_accuracy must be a bool"),
        (dict(seed=2**64), ValueError, "seed must be >= 0 and < 2**64"),
    ],
)
def test_measure_config_names_the_field_it_refuses(fields, error, said):
    with pytest.raises(error, match=re.escape(said)):
        MeasureConfig(**fields)


class _Exits(BatchedAttention):
    def forward(self, q, k, v, mask):
        raise SystemExit(3)


class _NanModel(BatchedAttention):
    def predicted_peak_bytes(self, spec):
        return math.nan


@pytest.mark.parametrize(
    ("cls", "said"),
    [
        (_Exits, "SystemExit: 3"),
        (_NanModel, "gave predicted_peak_bytes = nan (expected a finite number >= 0)"),
    ],
)
def test_a_variant_that_exits_or_a_cost_model_that_says_nan_is_a_row(cls, said):
    attnbench.register("plant_battery", cls)
    try:
        m = measure(
            "plant_battery",
            attnbench.AttnSpec(batch=1, heads=2, seq_len=16, head_dim=8),
            MeasureConfig(probe=False, measure_rss=False),
            peak_flops=1e10,
        )
    finally:
        attnbench.unregister("plant_battery")
    assert m.status == "error" and said in m.reason, m.reason


def test_measure_leaves_the_callers_rng_as_it_found_it():
    import torch

    import attnbench
    from attnbench.measure.config import MeasureConfig
    from attnbench.measure.runner import measure
    from attnbench.variants.batched import BatchedAttention

    class Seeds(BatchedAttention):
        IN_DEFAULT_SWEEP = False

        def forward(self, q, k, v, mask):
            torch.manual_seed(0)
            return super().forward(q, k, v, mask)

    attnbench.register("plant_seeds", Seeds)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    try:
        m = measure(
            "plant_seeds",
            attnbench.AttnSpec(batch=1, heads=2, seq_len=16, head_dim=8),
            MeasureConfig(probe=False, measure_rss=False),
            peak_flops=1e10,
        )
    finally:
        attnbench.unregister("plant_seeds")
    assert m.status == "ok", m.reason
    assert torch.equal(torch.get_rng_state(), before)


def test_the_cuda_rng_states_saved_are_those_a_case_can_change(monkeypatch):
    """CUDA, scripted: every device once CUDA is up, else the case's own, else none (a CPU case must
    not initialize CUDA to save a state)."""
    import torch

    from attnbench.measure.runner import rng_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert rng_devices("cpu") == []
    assert rng_devices("cuda:0") == [0] and rng_devices("cuda") == [1]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert rng_devices("cpu") == [0, 1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rng_devices("cuda:0") == []


def test_a_noisy_reason_counts_its_attempts_in_plain_english():
    """A reader of a noisy case saw "(kept the least disturbed of 1 attempts)": one attempt is
    "its only attempt", more are counted in the plural. Planted (seen failing): the old f-string."""
    from attnbench.contract import Status
    from attnbench.measure import probe, runner
    from attnbench.measure.config import MeasureConfig

    def reason(attempts: int) -> str:
        seen = probe.Disturbance(1.0, (1.0,), bimodal=True)
        timed = runner._Timed([1.0], 1, seen, attempts, 1.0)
        status, why = runner._disturbance_status(timed, MeasureConfig(probe=True))
        assert status == Status.NOISY, status
        return why

    assert reason(1).endswith("(kept its only attempt)"), reason(1)
    assert reason(3).endswith("(kept the least disturbed of 3 attempts)"), reason(3)
