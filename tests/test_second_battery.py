"""Issue 28's fault battery: each trial that was silently wrong, crashed, lost work or failed obscurely,
planted here so it stays fixed (the correctness gate's blind spots are planted in tests/test_gate.py).
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench import mask_mods, masks
from attnbench.analysis.frame import load, load_run
from attnbench.measure import MeasureConfig
from attnbench.measure.record import Measurement
from attnbench.reference import reference_attention
from attnbench.runs import (
    LOG,
    LOG_SCHEMA,
    MANIFEST,
    MANIFEST_SCHEMA,
    RunDirectory,
    RunDirError,
    case_key,
    read_log,
    write_run,
)

ROOT = Path(__file__).resolve().parents[1]
MEASURED = [Measurement(variant="batched", spec=attnbench.AttnSpec(batch=1, heads=2, head_dim=16, seq_len=n), status="ok",
                        samples=(1e-3, 1.1e-3, 0.9e-3), runs=3, timing_method="wall") for n in (16, 32, 64)]


# ---- 4: a predicate is known by identity, not by its name ------------------------------------
def _strictly_causal() -> mask_mods.MaskMod:
    return mask_mods.MaskMod("causal", lambda b, h, q, kv: kv < q)  # named "causal", sees less


@pytest.mark.parametrize("name", ["sdpa", "sdpa_math", "sdpa_flash"])
def test_sdpa_runs_a_custom_predicate_named_causal_as_what_it_computes(name):
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.float64, generator=gen) for _ in range(3))
    mod = _strictly_causal()
    assert not mod.is_causal and masks.kind_of(mod) is None
    expected = reference_attention(q, k, v, mask_mods.dense(mod, 1, 2, 8, 8))
    torch.testing.assert_close(attnbench.get_variant(name)(q, k, v, mod), expected)
    assert mask_mods.causal().is_causal and masks.kind_of(mask_mods.causal()) == "causal"


# ---- 6, 8, 9: a full disk, a torn log resumed, a log of another format -------------------------
CLI_FAST = ["--quiet", "--threads", "1", "--min-time", "0.01", "--max-time", "0.05", "--min-runs", "2", "--no-probe",
            "--no-report"]
GRID = ["--variants", "batched,sdpa", "--lengths", "16,32,48,64"]


def _cli(*args: str, file_limit: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> None:  # as a full disk does: writes beyond this size fail (EFBIG; Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run([sys.executable, "-m", "attnbench.cli", *args], env=env, capture_output=True, text=True,
                          timeout=300, preexec_fn=limit if file_limit else None)


@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_with_the_directory_named_and_resume_loses_nothing(tmp_path):
    """Was an ENOSPC traceback while rewriting manifest.json; each cases.jsonl line is ~1.6 kB, so the log fails
    to grow past 8 kB a few cases in."""
    run = tmp_path / "run"
    full = _cli("run", *GRID, "--out", str(run), *CLI_FAST, file_limit=8000)
    assert full.returncode == 1, full.stderr
    assert "Traceback" not in full.stderr and f"cannot write {run}" in full.stderr and "--resume" in full.stderr
    kept = read_log(run / LOG)
    assert 0 < len(kept.measurements) < 8 and kept.notes == ()  # whole lines only: the partial one was cut
    resumed = _cli("run", *GRID, "--out", str(run), "--resume", *CLI_FAST)
    assert resumed.returncode == 0, resumed.stderr
    log = read_log(run / LOG)
    keys = [case_key(m.variant, m.spec) for m in log.measurements]
    assert len(keys) == len(set(keys)) == 8 and log.notes == ()


def test_resume_cuts_a_torn_last_line_instead_of_keeping_it_inside_the_log(tmp_path):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    lines = (run / LOG).read_bytes().splitlines(keepends=True)
    (run / LOG).write_bytes(b"".join(lines[:-1]) + lines[-1][:40])  # a power cut while the last case was written
    with RunDirectory(run, resume=True) as directory:
        todo = directory.start(MeasureConfig(), [(m.variant, m.spec) for m in MEASURED])
        assert len(todo) == 1
        directory.add(MEASURED[2])
    log = read_log(run / LOG)
    assert log.notes == () and len(log.measurements) == 3
    assert load_run(run).attrs["problems"] == []


@pytest.mark.parametrize("file", [LOG, MANIFEST])
def test_a_run_written_in_another_format_is_refused_not_mixed(tmp_path, file):
    run = write_run(tmp_path / "run", MEASURED[:2], MeasureConfig(), seconds=1.0, command=["test"])
    text = (run / file).read_text()
    (run / file).write_text(text.replace(LOG_SCHEMA, "attnbench.log/2").replace(MANIFEST_SCHEMA, "attnbench.run/2"))
    problems = load_run(run).attrs["problems"]
    assert any("format 'attnbench." in p and "/2'" in p for p in problems), problems
    if file == LOG:
        with pytest.raises(RunDirError, match="format 'attnbench.log/2'"), RunDirectory(run, resume=True) as directory:
            directory.start(MeasureConfig(), [(m.variant, m.spec) for m in MEASURED])
        assert len(load_run(run)) == 0


# ---- 10, 11: a source given twice, numbers no float holds -------------------------------------
def test_the_same_run_given_twice_is_read_once(tmp_path):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    (tmp_path / "link").symlink_to(run)
    once = load([run])
    frame = load([run, f"{run}/", tmp_path / "link", os.path.relpath(run)])
    assert len(frame) == len(once) > 0
    assert sum("given twice: read once" in n for n in frame.attrs["notes"]) == 3


@pytest.mark.parametrize(("sample", "why"), [("1" + "0" * 400, "too large for a float"), ("1e999", "inf"),
                                             ("-1e-3", "-0.001")])
def test_a_sample_no_float_holds_rejects_its_case_by_name(tmp_path, sample, why):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    lines = (run / LOG).read_text().splitlines()
    item = json.loads(lines[1])
    first = json.dumps(item["measurement"]["samples"][0])
    lines[1] = lines[1].replace(f'"samples": [{first}', f'"samples": [{sample}', 1)
    (run / LOG).write_text("\n".join(lines) + "\n")
    frame = load_run(run)
    assert any("line 2" in p and why in p for p in frame.attrs["problems"]), frame.attrs["problems"]
    assert len(set(frame["seq_len"])) == len(MEASURED) - 1  # the others load
