"""The matmul roof does not depend on the machine's history (attnbench/measure/peak.py).

Each defence is planted: a cache filled by a busy hour, a sample timed while its thread waited for
a core, a quieter moment after a busy best, a roof above the CPU's theoretical peak, and a run whose
own rates come out above the roof it started with.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attnbench.measure import peak
from attnbench.measure.peak import RoofSample
from attnbench.rundir_format import LOG, MANIFEST, read_log

QUIET = 5e10  # what a quiet measurement gives in these tests
LOW = 5e9  # what the busy hour gave


def _cache(tmp_path, monkeypatch, entry, measured: float | None, load: float = 1.0):
    """A cache holding ``entry`` for this process's key, at load average ``load`` now.

    Measuring gives ``measured`` from undisturbed blocks (None: nothing may be measured). Returns
    the list of measurements made.
    """
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(peak.os, "getloadavg", lambda: (load, load, load))
    monkeypatch.setattr(peak, "cpu_ceiling", lambda dtype, threads: None)
    tmp_path.joinpath(peak.cache_path().name).write_text(
        json.dumps({peak._key("cpu", "float32"): entry})
    )
    calls = []

    def fake_sample(device, dtype):
        assert measured is not None, "the cache had what it needs: nothing should be measured"
        calls.append(device)
        return RoofSample(measured, 0.0)

    monkeypatch.setattr(peak, "sample_matmul_peak", fake_sample)
    return calls


def _kept(tmp_path) -> list[dict]:
    return json.loads(tmp_path.joinpath(peak.cache_path().name).read_text())[
        peak._key("cpu", "float32")
    ]


@pytest.mark.parametrize("waited", [None, 0.9], ids=["no wait read (older attnbench)", "waited"])
def test_a_busy_hour_that_filled_the_cache_does_not_set_the_roof(tmp_path, monkeypatch, waited):
    """Planted: three fresh 5 GFLOP/s samples taken at load 4 five minutes ago, as the cache held
    after a test run (18.7, 3.0 and 64.6 against 72-78 quiet). Before, three fresh samples stopped
    the measuring and the best of them was the roof for a week."""
    now = time.time()
    busy = [{"flops": LOW, "at": now - 300 + i, "load": 4.0} for i in range(3)]
    if waited is not None:
        busy = [{**s, "waited": waited} for s in busy]
    calls = _cache(tmp_path, monkeypatch, busy, measured=QUIET, load=0.3)
    assert peak.matmul_peak("cpu", "float32") == QUIET and len(calls) == 1
    assert [s["flops"] for s in _kept(tmp_path)] == [LOW, LOW, LOW, QUIET]


def test_a_quieter_moment_than_the_best_samples_is_sampled(tmp_path, monkeypatch):
    """Three trusted samples, the best taken at load 4: at load 0.3 another is taken, and wins."""
    now = time.time()
    entry = [{"flops": LOW, "at": now - 300 + i, "load": 4.0, "waited": 0.0} for i in range(3)]
    calls = _cache(tmp_path, monkeypatch, entry, measured=QUIET, load=0.3)
    assert peak.matmul_peak("cpu", "float32") == QUIET and len(calls) == 1
    # ...and not again while that sample is the newest at this load
    calls = _cache(tmp_path, monkeypatch, _kept(tmp_path), measured=None, load=0.3)
    assert peak.matmul_peak("cpu", "float32") == QUIET


@pytest.mark.parametrize("load", [6.5, 5.0, 0.5], ids=["same load", "load falling", "quiet"])
def test_a_busy_machine_adds_a_sample_a_minute_at_most(tmp_path, monkeypatch, load):
    """No trusted sample, and the last one is a few seconds old: no other, whatever the load does
    (an asv setup asking the roof per case resampled whenever the load average had moved)."""
    busy = [{"flops": LOW, "at": time.time() - 5, "load": 6.5, "waited": 1.0}]
    _cache(tmp_path, monkeypatch, busy, measured=None, load=load)
    assert peak.matmul_peak("cpu", "float32") == LOW  # the best there is, marked untrusted


def test_a_busy_peak_measurement_does_not_poison_the_cache(tmp_path, monkeypatch):
    """Planted: one measurement taken on a busy machine (1 GFLOP/s), two minutes old. The next use
    measures again and the best one wins; the busy one stays outvoted."""
    busy = {"flops": 1e9, "at": time.time() - 120, "load": 6.4}
    calls = _cache(tmp_path, monkeypatch, [busy], measured=QUIET)
    assert peak.matmul_peak("cpu", "float32") == QUIET and len(calls) == 1
    kept = _kept(tmp_path)
    assert [s["flops"] for s in kept] == [1e9, QUIET]
    assert all({"load", "at"} <= set(s) for s in kept) and kept[-1]["waited"] == 0.0


def test_a_single_cached_number_is_measured_again(tmp_path, monkeypatch):
    """The old cache held one number forever (22 GFLOP/s for a 90 GFLOP/s core): it counts as stale."""
    calls = _cache(tmp_path, monkeypatch, 2.2e10, measured=9e10)
    assert peak.matmul_peak("cpu", "float32") == 9e10 and len(calls) == 1


def test_stale_measurements_are_dropped(tmp_path, monkeypatch):
    old = [{"flops": 2e11, "at": time.time() - peak.STALE_S - 1, "load": 0.1, "waited": 0.0}]
    _cache(tmp_path, monkeypatch, old, measured=9e10)
    assert peak.matmul_peak("cpu", "float32") == 9e10


@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.lists(st.floats(min_value=1e8, max_value=1e12), min_size=3, max_size=8))
def test_enough_trusted_samples_give_their_best_without_measuring(tmp_path, monkeypatch, flops):
    now = time.time()
    entry = [
        {"flops": f, "at": now - 10 * i, "load": 1.0, "waited": 0.0} for i, f in enumerate(flops)
    ]
    _cache(tmp_path, monkeypatch, entry, measured=None, load=1.0)
    assert peak.matmul_peak("cpu", "float32") == max(flops[: peak.KEEP])


class _ScriptedWaits:
    """``schedstat.runqueue_seconds`` for a thread that waits 0.5 s in ``share`` of its blocks.

    The timer reads the wait before and after each block: the second read of a waiting block is
    0.5 s later than the first.
    """

    def __init__(self, every: int, of: int) -> None:
        self.reads, self.total, self.every, self.of = 0, 0.0, every, of

    def __call__(self) -> float:
        self.reads += 1
        block, closing = divmod(self.reads - 1, 2)
        if closing and block % self.of < self.every:
            self.total += 0.5
        return self.total


@pytest.mark.parametrize("every, of", [(2, 3), (1, 1)], ids=["two blocks in three", "every block"])
def test_a_sample_whose_thread_waited_for_its_core_is_marked(monkeypatch, every, of):
    """Scripted: the timing thread waits for its core in most blocks. The timer drops those blocks
    and times others in their place; the sample says what share waited, and is not trusted."""
    monkeypatch.setattr(peak.schedstat, "runqueue_seconds", _ScriptedWaits(every, of))
    sample = peak.sample_matmul_peak("cpu", "float32", n=64)
    assert sample.waited is not None and sample.waited > peak._MOSTLY_WAITED, sample
    assert not peak._trusted({"flops": sample.flops, "at": 0.0, "waited": sample.waited}, None)


def test_a_sample_whose_thread_never_waited_is_trusted(monkeypatch):
    monkeypatch.setattr(peak.schedstat, "runqueue_seconds", lambda: 0.0)
    sample = peak.sample_matmul_peak("cpu", "float32", n=64)
    assert sample.waited == 0.0
    assert peak._trusted({"flops": sample.flops, "at": 0.0, "waited": sample.waited}, None)


def test_no_roof_passes_the_cpus_theoretical_peak(tmp_path, monkeypatch):
    """Planted: a sample of 3x the ceiling (a mis-timed call). The roof is the best sample
    below the ceiling; with none, the ceiling itself."""
    now = time.time()
    entry = [
        {"flops": 3e11, "at": now - 20, "load": 1.0, "waited": 0.0},
        {"flops": 6e10, "at": now - 10, "load": 1.0, "waited": 0.0},
        {"flops": 5e10, "at": now, "load": 1.0, "waited": 0.0},
    ]
    _cache(tmp_path, monkeypatch, entry, measured=None)
    monkeypatch.setattr(peak, "cpu_ceiling", lambda dtype, threads: 1e11)
    monkeypatch.setattr(peak, "_MIN_SAMPLES", 2)
    assert peak.matmul_peak("cpu", "float32") == 6e10
    monkeypatch.setattr(peak, "sample_matmul_peak", lambda d, t: RoofSample(4e11, 0.0))
    assert peak.matmul_peak("cpu", "float32", refresh=True) == 6e10
    _cache(tmp_path, monkeypatch, entry[:1], measured=None)  # only the mis-timed one
    monkeypatch.setattr(peak, "cpu_ceiling", lambda dtype, threads: 1e11)
    monkeypatch.setattr(peak, "_wants_sample", lambda *args: False)
    assert peak.matmul_peak("cpu", "float32") == 1e11


def test_the_ceiling_is_read_from_the_max_clock_and_the_vector_width(tmp_path, monkeypatch):
    freq, info = tmp_path / "max_freq", tmp_path / "cpuinfo"
    freq.write_text("3000000\n")  # kHz
    info.write_text("processor : 0\nflags : fpu sse2 avx2 fma\n")
    monkeypatch.setattr(peak, "_MAX_FREQ", str(freq))
    monkeypatch.setattr(peak, "_CPUINFO", str(info))
    monkeypatch.setattr(peak.os, "cpu_count", lambda: 2)
    assert peak.cpu_ceiling("float32", 1) == 3e9 * 32
    assert peak.cpu_ceiling("float64", 4) == 3e9 * 16 * 2  # at most the cores there are
    assert peak.cpu_ceiling("bfloat16", 1) is None
    info.write_text("processor : 0\nflags : fpu sse2 avx2 avx512f\n")
    assert peak.cpu_ceiling("float32", 1) == 3e9 * 64
    freq.unlink()  # a virtual machine that hides its clock
    assert peak.cpu_ceiling("float32", 1) is None


ROOT = Path(__file__).resolve().parents[1]


def _run(tmp_path: Path, entry: list[dict]) -> tuple[dict, str, Path]:
    """``attnbench run`` of sdpa at L=256 with ``entry`` planted for one thread; its manifest."""
    cache = tmp_path / "cache"
    cache.mkdir()
    key = f"cpu|float32|threads=1|torch={torch.__version__}"
    (cache / peak.cache_path().name).write_text(json.dumps({key: entry}))
    env = {**os.environ, "ATTNBENCH_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "run", "--variants", "sdpa", "--lengths", "256"]
        + ["--out", str(out), "--no-report", "--quiet", "--threads", "1", "--no-probe"]
        + ["--no-instructions", "--min-time", "0.05", "--max-time", "0.3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    return json.loads((out / MANIFEST).read_text()), done.stderr, out


@pytest.mark.slow
def test_a_run_whose_rates_are_above_its_roof_measures_the_roof_again(tmp_path):
    """Planted: three trusted-looking samples of 0.5 GFLOP/s taken just now at load 0, so the cache
    rule takes no other. sdpa's own rate is far above that roof: the run measures the matmul again
    before its manifest, logs the new roof, and says so."""
    now = time.time()
    entry = [{"flops": 5e8, "at": now - i, "load": 0.0, "waited": 0.0} for i in range(3)]
    manifest, stderr, out = _run(tmp_path, entry)
    assert "the roof was measured again" in stderr, stderr
    assert manifest["peak_gflops"]["float32"] > 10 * 0.5
    assert (
        read_log(out / LOG).header["peak_gflops"]["float32"] == manifest["peak_gflops"]["float32"]
    )
    assert '"kind": "roof"' in (out / LOG).read_text()


@pytest.mark.slow
def test_a_cache_filled_by_a_busy_hour_gives_a_run_a_true_roof(tmp_path):
    """Planted: three fresh 5 GFLOP/s samples taken at load 4 by an attnbench that read no wait
    (the cache this machine held). The run's roof is a measurement of its own, whichever rule
    takes it: the cache's (untrusted samples) or the run's (its rates above the roof)."""
    now = time.time()
    entry = [{"flops": 5e9, "at": now - i, "load": 4.0} for i in range(3)]
    manifest, _, _ = _run(tmp_path, entry)
    assert manifest["peak_gflops"]["float32"] > 5.0
