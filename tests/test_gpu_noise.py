"""CUDA cases are judged noisy on the GPU's evidence, never on the CPU matmul probe.

On an idle H100 the CPU probe (1.26x-1.52x) marked 25 of 137 cases noisy. These tests script a CUDA
case on a machine without one: the event-timed blocks, the GPU probe, the CPU probe and the
processes on the card are stand-ins, so each signal can be planted alone.
"""

from __future__ import annotations

import os

import pytest
import torch

from attnbench.measure import probe, runner, schedstat
from attnbench.measure.config import MeasureConfig
from attnbench.measure.runner import timed_attempts
from attnbench.measure.timer import Blocks, TimerConfig

FAST = TimerConfig(min_runs=3, min_time=0.02, max_time=0.5)
PERFECT = [1e-3] * 20  # event-timed blocks, all alike
# a smooth ladder (no gap of 1.3x: not bimodal) whose IQR is twice its median
SPREAD = [1e-3 * 1.2**i for i in range(20)]


@pytest.fixture
def cuda_case(monkeypatch):
    """A CUDA case: quiet GPU probe, a CPU probe 3x slower than anything, nothing else on the card,
    no run-queue figures, blocks from ``set_blocks``."""
    state = {"blocks": PERFECT, "neighbours": ()}
    monkeypatch.setattr(probe, "gpu_probe_seconds", lambda device="cuda": 1e-3)
    monkeypatch.setattr(probe, "cpu_probe_seconds", lambda: 3e-3)  # a slow host
    monkeypatch.setattr(probe, "gpu_neighbours", lambda device="cuda": state["neighbours"])
    monkeypatch.setattr(schedstat, "runqueue_seconds", lambda: None)
    monkeypatch.setattr(
        runner, "time_blocks", lambda *a, **k: Blocks(list(state["blocks"]), len(state["blocks"]))
    )

    def run(device: str = "cuda"):
        config = MeasureConfig(timer=FAST, retries=1, probe_baseline_s=1e-3)
        return timed_attempts(lambda: None, device, config)

    run.state = state
    return run


def test_perfect_event_samples_beside_a_slow_cpu_probe_are_not_noisy(cuda_case):
    """Planted: the CPU matmul probe 3x slower than the baseline (the old rule: noisy)."""
    timed = cuda_case()
    assert not timed.disturbance.disturbed, timed.disturbance.describe()
    assert timed.attempts == 1 and timed.disturbance.gpu
    assert timed.disturbance.slowdown == pytest.approx(1.0)  # the GPU probe, not the CPU one
    # the same host slows a CPU case: there the CPU probe is the evidence
    assert cuda_case("cpu").disturbance.disturbed


def test_a_gpu_neighbour_process_makes_the_case_noisy(cuda_case):
    """Planted: another process listed on the card, everything else perfect."""
    cuda_case.state["neighbours"] = (4242,)
    seen = cuda_case().disturbance
    assert seen.disturbed and "1 other process(es) on the GPU (pid 4242)" in seen.describe()


def test_spread_event_samples_make_the_case_noisy(cuda_case):
    """Planted: event samples whose IQR is twice their median (an idle H100: at most 0.58x)."""
    cuda_case.state["blocks"] = SPREAD
    seen = cuda_case().disturbance
    assert not seen.bimodal and seen.spread == pytest.approx(2.0, abs=0.1)
    assert seen.disturbed and "CUDA event samples spread 1.96x" in seen.describe()


def test_a_slow_gpu_probe_makes_the_case_noisy(cuda_case, monkeypatch):
    """Planted: the GPU probe (a neighbour's kernels sharing the SMs) 1.5x the sweep's typical."""
    monkeypatch.setattr(probe, "gpu_probe_seconds", lambda device="cuda": 1.5e-3)
    seen = cuda_case().disturbance
    assert seen.disturbed and "GPU probe 1.50x slower" in seen.describe()


def test_the_probe_on_cuda_is_the_gpus(monkeypatch):
    monkeypatch.setattr(probe, "gpu_probe_seconds", lambda device="cuda": 7.0)
    monkeypatch.setattr(probe, "cpu_probe_seconds", lambda: 3.0)
    assert probe.probe_seconds("cuda:0") == 7.0 and probe.probe_seconds("cpu") == 3.0


@pytest.mark.parametrize(
    "listing, expected",
    [
        ("GPU:0\nprocess {me:>10d} uses 500.000 MB GPU memory", ()),
        (
            "GPU:0\nprocess       4242 uses 9000.000 MB GPU memory\n"
            "process {me:>10d} uses 500.000 MB GPU memory",
            (4242,),
        ),
        ("GPU:0\nno processes are running", ()),
        ("pynvml module not found, please install pynvml", None),
    ],
)
def test_gpu_neighbours_reads_the_listed_processes_but_this_one(monkeypatch, listing, expected):
    monkeypatch.setattr(probe, "_nvml_pids", lambda index: None)
    text = listing.format(me=os.getpid())  # this process: never its own neighbour
    monkeypatch.setattr(torch.cuda, "list_gpu_processes", lambda device=None: text)
    assert probe.gpu_neighbours("cuda:0") == expected


def test_the_process_that_started_this_one_is_no_neighbour(monkeypatch):
    """A sweep's parent holds a CUDA context (it measured the roof) while its worker measures."""
    parent = os.getppid()
    monkeypatch.setattr(probe, "_nvml_pids", lambda index: [parent, os.getpid(), 4242])
    assert probe.gpu_neighbours("cuda:0") == (4242,)
    assert {os.getpid(), parent} <= probe.this_run()
