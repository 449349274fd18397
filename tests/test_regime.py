"""Measurement regime and interference detection: pinned allocator, probe, bimodality."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from attnbench.measure import probe, regime

FAULTS = """
import json, resource, sys, torch
from attnbench.measure import regime
torch.set_num_threads(1)
if sys.argv[1] == "pinned":
    regime.apply(regime.Regime(threads=1))
big = torch.ones(30 * 2**20 // 4)  # one 30 MiB tensor, freed: glibc raises its thresholds unless pinned
del big
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    t = torch.ones(4 * 2**20 // 4)  # 4 MiB, touched
    del t
print(json.dumps(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before))
"""


def _faults(mode: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_pinned_allocator_does_not_depend_on_process_history():
    """Planted history: a freed 30 MiB block. Unpinned, glibc then serves 4 MiB buffers from reused heap
    pages (few faults); pinned, every process maps fresh pages alike (about 1,024 faults per 4 MiB)."""
    if regime._libc() is None:
        pytest.skip("not a glibc process: nothing to pin")
    pinned, dynamic = _faults("pinned"), _faults("dynamic")
    assert pinned > 20 * 900, pinned
    assert dynamic < pinned / 5, (dynamic, pinned)


def test_regime_is_applied_and_described():
    import torch

    saved = torch.get_num_threads()
    try:
        regime.apply(regime.Regime(threads=1))
        assert torch.get_num_threads() == 1
        text = regime.describe()
        assert text.startswith("threads=1 ") and "thp=kernel=" in text
        env = regime.child_env(regime.Regime(threads=1))
        assert (
            env["MALLOC_MMAP_THRESHOLD_"] == str(regime.PINNED_BYTES)
            and env["OMP_NUM_THREADS"] == "1"
        )
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_regime_rejects_bad_threads(bad):
    with pytest.raises(ValueError, match="threads"):
        regime.Regime(threads=bad)


def test_bimodality():
    assert probe.is_bimodal([1, 1.01, 0.99, 1.02, 2.5, 2.6, 2.4])
    assert not probe.is_bimodal([1, 1.01, 0.99, 1.02, 1.03, 5.0])  # one outlier is not a mode
    assert not probe.is_bimodal([1, 1.1, 1.2, 1.3, 1.4, 1.5])  # a spread is not two clusters
    assert not probe.is_bimodal([1.0, 2.0, 3.0])  # too few samples to say


def test_disturbance_verdicts():
    quiet = probe.Disturbance(baseline_s=1e-3, probes_s=(1.05e-3, 1.1e-3), bimodal=False)
    assert not quiet.disturbed and quiet.describe() == "undisturbed"
    busy = probe.Disturbance(baseline_s=1e-3, probes_s=(1.0e-3, 3.0e-3), bimodal=False)
    assert (
        busy.disturbed and busy.slowdown == pytest.approx(3.0) and "3.00x slower" in busy.describe()
    )
    split = probe.Disturbance(baseline_s=1e-3, probes_s=(1e-3,), bimodal=True)
    assert split.disturbed and "bimodal" in split.describe()


def test_probe_measures_something():
    assert 0 < probe.probe_seconds("cpu") < 1.0


FRESH_LINE = """
import sys
{plant}
from attnbench.measure.config import MeasureConfig
from attnbench.measure.runner import measure
from attnbench.measure.timer import TimerConfig
from attnbench.spec import AttnSpec
m = measure("batched", AttnSpec(seq_len=64, heads=2), MeasureConfig(probe=False, timer=TimerConfig(min_runs=2, min_time=0.01)))
print(m.env.regime)
"""
ASV_LINE = (
    "import attnbench.asv_bench\nfrom attnbench.measure import regime\nprint(regime.describe())"
)
PLAIN_ENV = {
    k: v
    for k, v in os.environ.items()
    if not k.startswith(("MALLOC_", "OMP_", "MKL_", "ATTNBENCH_"))
}


def _line(code: str) -> str:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env=PLAIN_ENV
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_worker_fresh_process_and_asv_measure_in_the_same_state():
    """``attnbench run``'s worker, a plain process calling ``measure`` and asv's process report one state.

    The line covers what decides the speed of the same code (threads, inter-op threads, allocator,
    huge pages, denormals, CPUs). Planted: a process that flushes denormals (the regime resets it)
    still matches, and one restricted to fewer CPUs does not (the line sees it).
    """
    from attnbench.measure.config import MeasureConfig
    from attnbench.measure.sweep import sweep
    from attnbench.measure.timer import TimerConfig
    from attnbench.measure.worker import WorkerPool
    from attnbench.spec import AttnSpec

    pool = WorkerPool(env=regime.child_env(regime.Regime(threads=regime.DEFAULT_THREADS)))
    config = MeasureConfig(probe=False, timer=TimerConfig(min_runs=2, min_time=0.01))
    (m,) = sweep([("batched", AttnSpec(seq_len=64, heads=2))], config, isolate=True, workers=pool)
    assert m.status == "ok", m.reason
    fresh = _line(FRESH_LINE.format(plant=""))
    assert m.env.regime == fresh == _line(ASV_LINE), (m.env.regime, fresh)
    assert _line(FRESH_LINE.format(plant="import torch; torch.set_flush_denormal(True)")) == fresh
    if len(os.sched_getaffinity(0)) > 1:
        assert (
            _line(
                FRESH_LINE.format(
                    plant="import os; os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})"
                )
            )
            != fresh
        )


GATE_FAULTS = """
import json, sys
from attnbench.measure import regime
if sys.argv[2] == "unpinned":  # planted: measure cannot pin the allocator
    regime.allocator_pinned = lambda r: False
from attnbench.measure.config import MeasureConfig
from attnbench.measure.runner import measure
from attnbench.measure.timer import TimerConfig
from attnbench.spec import AttnSpec
m = measure("local", AttnSpec(seq_len=1024, heads=8), MeasureConfig(
    probe=False, check_accuracy=sys.argv[1] == "gate", measure_memory=False, measure_rss=False,
    timer=TimerConfig(warmup=0, warmup_time=0.0, min_runs=1, min_time=0.001)))
assert m.status == "ok", m.reason
print(json.dumps(m.extra["page_faults"]))
"""


def _gate_faults(gate: str, pin: str) -> int:
    out = subprocess.run(
        [sys.executable, "-c", GATE_FAULTS, gate, pin],
        capture_output=True,
        text=True,
        timeout=300,
        env=PLAIN_ENV,
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_page_faults_of_a_timed_call_do_not_depend_on_the_gate_running_first():
    """The gate's float64 reference frees large buffers just before timing. In the regime (which ``measure``
    applies itself) the timed call maps the same pages either way; planted, an unpinned allocator lets
    the gate's freed memory serve the call (local at L=1024: up to about 10,000 faults a call fewer)."""
    if regime._libc() is None:
        pytest.skip("not a glibc process: nothing to pin")
    after_gate, alone = _gate_faults("gate", "pinned"), _gate_faults("none", "pinned")
    assert alone > 1000 and abs(after_gate - alone) <= 0.02 * alone, (after_gate, alone)
    # Planted: unpinned, how much of the gate's freed memory serves the call varies from process to process
    # (faults left after the gate, as a share of alone: 0.00 to 0.19 on this machine, 0.80 on a CI runner).
    # One try in three far beyond the 2% allowed above shows the check sees it; each try is two processes.
    ratios = []
    for _ in range(3):
        ratios.append(_gate_faults("gate", "unpinned") / _gate_faults("none", "unpinned"))
        if ratios[-1] < 0.9:
            break
    assert ratios[-1] < 0.9, ratios
