"""The bandwidth roof: STREAM's byte count, arrays beyond the cache, the cache file, the CLI and the run manifest."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attnbench import cli
from attnbench.analysis.rundir import load_run
from attnbench.measure import bandwidth as bw
from attnbench.rundir_format import MANIFEST
from attnbench.runs import write_run
from tests.test_loading import measurements

ROOT = Path(__file__).resolve().parents[1]


def test_stream_counts_two_words_for_copy_and_three_for_triad(monkeypatch):
    """With every timed block taking 1 ms, copy moves 2 x 4 bytes per element and triad 3 x 4."""
    monkeypatch.setattr(
        bw, "time_call", lambda fn, device, config: (fn(), ([1e-3, 1e-3, 2e-3], 3))[1]
    )
    n = 1024
    measured = bw.measure_bandwidth("cpu", nbytes=4 * n)
    assert measured.copy == pytest.approx(2 * 4 * n / 1e-3)
    assert measured.triad == pytest.approx(3 * 4 * n / 1e-3)  # the median block, not the mean
    assert measured.roof == measured.triad and measured.array_bytes == 4 * n


def test_the_kernels_compute_what_stream_computes(monkeypatch):
    seen = {}

    def fake(fn, device, config):
        seen[len(seen)] = fn()
        return [1e-3], 1

    monkeypatch.setattr(bw, "time_call", fake)
    bw.measure_bandwidth("cpu", nbytes=4 * 16)
    assert torch.equal(seen[0], torch.ones(16))  # copy: c = a = 1
    assert torch.equal(
        seen[1], torch.full((16,), 2.0 + bw.SCALAR * 1.0)
    )  # triad: a = b + s * c = 2 + 3 x 1


def test_a_real_measurement_is_positive_and_plausible():
    measured = bw.measure_bandwidth("cpu", nbytes=8 * 2**20)
    assert 1e8 < measured.copy < 1e13 and 1e8 < measured.triad < 1e13


def test_arrays_are_at_least_four_times_the_last_level_cache(monkeypatch):
    monkeypatch.setattr(bw, "last_level_cache_bytes", lambda device="cpu": 200 * 2**20)
    assert bw.array_bytes() == 800 * 2**20
    monkeypatch.setattr(bw, "last_level_cache_bytes", lambda device="cpu": 0)
    assert bw.array_bytes() == bw.MIN_ARRAY_BYTES


def test_the_cpu_cache_size_is_read_from_sys():
    from pathlib import Path

    sizes = list(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"))
    if not sizes:
        pytest.skip("no /sys cache information on this machine")
    assert bw.last_level_cache_bytes("cpu") >= 256 * 2**10


@pytest.mark.parametrize("nbytes", [0, -4, 6, 4.0, True])
def test_bad_sizes_are_refused_before_allocating(nbytes):
    with pytest.raises(ValueError, match="nbytes"):
        bw.measure_bandwidth("cpu", nbytes=nbytes)


def test_cached_per_device_threads_and_torch(tmp_path, monkeypatch):
    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    calls = []
    monkeypatch.setattr(
        bw,
        "measure_bandwidth",
        lambda device="cpu", nbytes=None: calls.append(device) or bw.Bandwidth(1e9, 2e9, 4096),
    )
    assert bw.bandwidth("cpu").triad == 2e9 and bw.bandwidth("cpu").copy == 1e9
    assert len(calls) == 1  # the second call read the cache
    bw.bandwidth("cpu", refresh=True)
    assert len(calls) == 2
    key = next(iter(json.loads((tmp_path / "bandwidth.json").read_text())))
    assert key.startswith("cpu|threads=") and torch.__version__ in key
    (tmp_path / "bandwidth.json").write_text(json.dumps({key: {"copy": "garbled"}}))
    assert bw.bandwidth("cpu").triad == 2e9 and len(calls) == 3  # a garbled entry is measured again
    (tmp_path / "bandwidth.json").write_text("not json")
    assert bw.bandwidth("cpu").copy == 1e9 and len(calls) == 4


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_bandwidth_beyond_the_l2():
    assert bw.array_bytes("cuda") >= bw.CACHE_MULTIPLE * bw.last_level_cache_bytes("cuda")
    measured = bw.measure_bandwidth("cuda")
    assert measured.triad > 1e10


def test_peak_prints_flops_and_both_bandwidths(monkeypatch, capsys, tmp_path):
    from attnbench.measure import peak

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path))
    monkeypatch.setattr(peak, "matmul_peak", lambda device, dtype, refresh=False: 5e10)
    monkeypatch.setattr(
        bw, "bandwidth", lambda device, refresh=False: bw.Bandwidth(7e9, 9e9, 2**28)
    )
    assert cli.main(["peak"]) == 0
    out = capsys.readouterr().out
    assert (
        "50.0 GFLOP/s" in out
        and "copy 7.0 GB/s" in out
        and "triad 9.0 GB/s" in out
        and "256 MiB" in out
    )
    assert cli.main(["peak", "--no-bandwidth"]) == 0
    assert "GB/s" not in capsys.readouterr().out


def test_the_run_manifest_carries_the_bandwidth_roof_into_the_frame(tmp_path):
    from attnbench.measure.config import MeasureConfig

    run = write_run(
        tmp_path / "run",
        measurements("box"),
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 10.0},
        peak_gbps={"copy": 7.0, "triad": 9.0},
    )
    assert json.loads((run / MANIFEST).read_text())["peak_gbps"] == {"copy": 7.0, "triad": 9.0}
    frame = load_run(run).frame
    assert (frame["peak_gbps"] == 9.0).all()  # triad: the roofline's roof
    old = write_run(
        tmp_path / "old",
        measurements("box"),
        MeasureConfig(),
        seconds=1.0,
        command=["t"],
        peak_gflops={"float32": 10.0},
    )
    assert load_run(old).frame["peak_gbps"].isna().all()  # not recorded: NaN, never a guess


def test_a_run_whose_bandwidth_cannot_be_measured_still_runs(tmp_path, monkeypatch, capsys):
    """Three arrays of 4x the LLC may not fit in memory: the sweep runs and records no bandwidth."""
    from attnbench.measure import peak

    monkeypatch.setenv("ATTNBENCH_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(peak, "matmul_peak", lambda device, dtype, refresh=False: 5e10)

    def no_memory(device, refresh=False):
        raise MemoryError("planted")

    monkeypatch.setattr(bw, "bandwidth", no_memory)
    code = cli.main(
        [
            "run",
            "--variants",
            "batched",
            "--lengths",
            "32",
            "--no-probe",
            "--out",
            str(tmp_path / "run"),
            "--no-report",
            "--quiet",
            "--min-time",
            "0.01",
            "--min-runs",
            "1",
            "--no-instructions",
        ]
    )
    assert code == 0 and "memory bandwidth not measured" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / MANIFEST).read_text())["peak_gbps"] is None


def test_a_home_that_is_a_file_costs_the_cache_not_the_run(tmp_path):
    home = tmp_path / "home"
    home.write_text("not a directory")
    env = {k: v for k, v in os.environ.items() if k not in ("ATTNBENCH_CACHE", "XDG_CACHE_HOME")}
    env.update(HOME=str(home), PYTHONPATH=os.pathsep.join([str(ROOT), *sys.path]))
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "peak", "--no-bandwidth"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("note: cannot write the cache in") == 1 and "GFLOP/s" in proc.stdout
    env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")  # honoured when set
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "peak", "--no-bandwidth"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0 and "note:" not in proc.stderr
    assert (tmp_path / "xdg" / "attnbench" / "matmul_peaks.json").exists()
