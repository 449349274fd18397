"""Measurement regime and interference detection: pinned allocator, probe, bimodality."""

from __future__ import annotations

import json
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
    out = subprocess.run([sys.executable, "-c", FAULTS, mode], capture_output=True, text=True, timeout=120)
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
        assert env["MALLOC_MMAP_THRESHOLD_"] == str(regime.PINNED_BYTES) and env["OMP_NUM_THREADS"] == "1"
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
    assert busy.disturbed and busy.slowdown == pytest.approx(3.0) and "3.00x slower" in busy.describe()
    split = probe.Disturbance(baseline_s=1e-3, probes_s=(1e-3,), bimodal=True)
    assert split.disturbed and "bimodal" in split.describe()


def test_probe_measures_something():
    assert 0 < probe.probe_seconds("cpu") < 1.0
