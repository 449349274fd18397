"""Writes cut short: a disk that fills during a sweep, a log whose last line a power cut tore. The
run stops with its directory named, and ``--resume`` loses nothing and keeps no partial line.

A module of its own (the full-disk sweep takes most of a minute), so that tests/test_sweep.py,
already long, is not that much heavier on its loadscope worker in CI.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from attnbench.analysis.rundir import load_run
from attnbench.measure import MeasureConfig
from attnbench.rundir_format import LOG, case_key, read_log
from attnbench.runs import RunDirectory, write_run
from tests.test_loading import MEASURED
from tests.test_sweep import CLI_FAST as SWEEP_FAST

ROOT = Path(__file__).resolve().parents[1]


CLI_FAST = [*SWEEP_FAST, "--no-report"]


GRID = ["--variants", "batched,sdpa", "--lengths", "16,32,48,64"]


def _cli(*args: str, file_limit: int | None = None) -> subprocess.CompletedProcess:
    def limit() -> (
        None
    ):  # as a full disk does: writes beyond this size fail (EFBIG; Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (file_limit, resource.RLIM_INFINITY))

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limit if file_limit else None,
    )


@pytest.mark.slow
def test_a_full_disk_stops_the_sweep_with_the_directory_named_and_resume_loses_nothing(tmp_path):
    """Was an ENOSPC traceback while rewriting manifest.json; each cases.jsonl line is ~1.6 kB, so the log fails
    to grow past 8 kB a few cases in."""
    run = tmp_path / "run"
    full = _cli("run", *GRID, "--out", str(run), *CLI_FAST, file_limit=8000)
    assert full.returncode == 1, full.stderr
    assert (
        "Traceback" not in full.stderr
        and f"cannot write {run}" in full.stderr
        and "--resume" in full.stderr
    )
    kept = read_log(run / LOG)
    assert (
        0 < len(kept.measurements) < 8 and kept.notes == ()
    )  # whole lines only: the partial one was cut
    resumed = _cli("run", *GRID, "--out", str(run), "--resume", *CLI_FAST)
    assert resumed.returncode == 0, resumed.stderr
    log = read_log(run / LOG)
    keys = [case_key(m.variant, m.spec) for m in log.measurements]
    assert len(keys) == len(set(keys)) == 8 and log.notes == ()


def test_resume_cuts_a_torn_last_line_instead_of_keeping_it_inside_the_log(tmp_path):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    lines = (run / LOG).read_bytes().splitlines(keepends=True)
    (run / LOG).write_bytes(
        b"".join(lines[:-1]) + lines[-1][:40]
    )  # a power cut while the last case was written
    with RunDirectory(run, resume=True) as directory:
        todo = directory.start(MeasureConfig(), [(m.variant, m.spec) for m in MEASURED])
        assert len(todo) == 1
        directory.add(MEASURED[2])
    log = read_log(run / LOG)
    assert log.notes == () and len(log.measurements) == 3
    assert load_run(run).problems == ()
