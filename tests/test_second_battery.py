"""Issue 28's fault battery: each trial that was silently wrong, crashed, lost work or failed obscurely,
planted here so it stays fixed (the correctness gate's blind spots are planted in tests/test_gate.py).
"""

from __future__ import annotations

import json
import math
import os
import re
import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import attnbench
from attnbench import mask_mods, masks
from attnbench.analysis.frame import load
from attnbench.analysis.rundir import load_run
from attnbench.measure import MeasureConfig, measure
from attnbench.measure.record import Measurement
from attnbench.reference import reference_attention
from attnbench.rundir_format import LOG, LOG_SCHEMA, MANIFEST, MANIFEST_SCHEMA, case_key, read_log
from attnbench.runs import RunDirectory, RunDirError, write_run
from attnbench.variants.batched import BatchedAttention

ROOT = Path(__file__).resolve().parents[1]
MEASURED = [
    Measurement(
        variant="batched",
        spec=attnbench.AttnSpec(batch=1, heads=2, head_dim=16, seq_len=n),
        status="ok",
        samples=(1e-3, 1.1e-3, 0.9e-3),
        runs=3,
        timing_method="wall",
    )
    for n in (16, 32, 64)
]


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
CLI_FAST = [
    "--quiet",
    "--threads",
    "1",
    "--min-time",
    "0.01",
    "--max-time",
    "0.05",
    "--min-runs",
    "2",
    "--no-probe",
    "--no-report",
    "--no-instructions",
]
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


@pytest.mark.parametrize("file", [LOG, MANIFEST])
def test_a_run_written_in_another_format_is_refused_not_mixed(tmp_path, file):
    run = write_run(tmp_path / "run", MEASURED[:2], MeasureConfig(), seconds=1.0, command=["test"])
    text = (run / file).read_text()
    (run / file).write_text(
        text.replace(LOG_SCHEMA, "attnbench.log/2").replace(MANIFEST_SCHEMA, "attnbench.run/2")
    )
    problems = load_run(run).problems
    assert any("format 'attnbench." in p and "/2'" in p for p in problems), problems
    if file == LOG:
        with (
            pytest.raises(RunDirError, match="format 'attnbench.log/2'"),
            RunDirectory(run, resume=True) as directory,
        ):
            directory.start(MeasureConfig(), [(m.variant, m.spec) for m in MEASURED])
        assert len(load_run(run).frame) == 0


# ---- 10, 11: a source given twice, numbers no float holds -------------------------------------
def test_the_same_run_given_twice_is_read_once(tmp_path):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    (tmp_path / "link").symlink_to(run)
    once = load([run]).frame
    frame_read = load([run, f"{run}/", tmp_path / "link", os.path.relpath(run)])
    frame = frame_read.frame
    assert len(frame) == len(once) > 0
    assert sum("given twice: read once" in n for n in frame_read.notes) == 3


@pytest.mark.parametrize(
    ("sample", "why"),
    [("1" + "0" * 400, "too large for a float"), ("1e999", "inf"), ("-1e-3", "-0.001")],
)
def test_a_sample_no_float_holds_rejects_its_case_by_name(tmp_path, sample, why):
    run = write_run(tmp_path / "run", MEASURED, MeasureConfig(), seconds=1.0, command=["test"])
    lines = (run / LOG).read_text().splitlines()
    item = json.loads(lines[1])
    first = json.dumps(item["measurement"]["samples"][0])
    lines[1] = lines[1].replace(f'"samples": [{first}', f'"samples": [{sample}', 1)
    (run / LOG).write_text("\n".join(lines) + "\n")
    frame_read = load_run(run)
    frame = frame_read.frame
    assert any("line 2" in p and why in p for p in frame_read.problems), frame_read.problems
    assert len(set(frame["seq_len"])) == len(MEASURED) - 1  # the others load


# ---- 7: a home that takes no cache -----------------------------------------------------------
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


# ---- 12, 13: variables and folders named, results validated ------------------------------------
@pytest.mark.parametrize(
    ("variable", "value", "said"),
    [
        ("ATTNBENCH_ASV_LENGTHS", "abc", "integers >= 1"),
        ("ATTNBENCH_ASV_VARIANTS", "bogus", "registered variant names (valid: loop,"),
        ("ATTNBENCH_ASV_MODES", "sideways", "passes: forward, backward"),
        ("ATTNBENCH_ASV_MASKS", "none,diagonal", "mask kinds"),
        ("ATTNBENCH_ASV_MAX_CALL_S", "nan", "a number of seconds > 0"),
        ("ATTNBENCH_THREADS", "0", "an integer >= 1"),
        ("ATTNBENCH_ASV_GRID", "fast", "must be one of default, full"),
        ("ATTNBENCH_ASV_COUNT_BUDGET_S", "-5", "a number of seconds > 0, or none"),
    ],
)
@pytest.mark.parametrize("command", [["shard", "1/2", "--grid", "ci"], ["regress", "HEAD", "HEAD"]])
def test_every_grid_variable_is_checked_before_any_work(variable, value, said, command):
    env = {**os.environ, variable: value, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    proc = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", *command],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert variable in proc.stderr and repr(value) in proc.stderr and said in proc.stderr


def test_a_missing_benchmarks_folder_is_named(tmp_path):
    from attnbench.shards import ShardError, shard_environment

    for folder in (tmp_path / "nonexistent", tmp_path):
        with pytest.raises(ShardError, match=f"--benchmarks {folder} "):
            shard_environment(folder, 1, 2, "ci")


def test_merge_results_refuses_a_benchmarks_json_asv_cannot_read(tmp_path):
    from attnbench.shards import ShardError, merge_results

    source = tmp_path / "shard"
    source.mkdir()
    (source / "benchmarks.json").write_bytes(os.urandom(512))
    with pytest.raises(ShardError, match="not a readable asv benchmarks.json"):
        merge_results([source], tmp_path / "out")
    (source / "benchmarks.json").write_text('{"version": 2}')
    with pytest.raises(ShardError, match="not an asv benchmarks.json"):
        merge_results([source], tmp_path / "out")
    assert not (tmp_path / "out" / "benchmarks.json").exists()


# ---- 14, 16: options that contradict, and messages that name what was wrong ---------------------
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


def test_run_refuses_a_max_time_shorter_than_min_time():
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench.cli",
            "run",
            "--variants",
            "batched",
            "--lengths",
            "16",
            "--min-time",
            "0.2",
            "--max-time",
            "0.01",
            "--no-report",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert proc.returncode == 2 and "--max-time 0.01 is shorter than --min-time 0.2" in proc.stderr


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


@pytest.mark.parametrize(
    ("call", "error", "said"),
    [
        (
            lambda: attnbench.AttnSpec().make_inputs(seed=2**64),
            ValueError,
            "seed must be >= 0 and < 2**64",
        ),
        (
            lambda: attnbench.AttentionLayer(8, 2, device="mps"),
            ValueError,
            "device='mps': attnbench runs on 'cpu' and 'cuda'",
        ),
        (
            lambda: attnbench.get_variant("batched").not_supported_reasons("x"),
            TypeError,
            "spec must be an AttnSpec",
        ),
        (
            lambda: attnbench.register(" batched", BatchedAttention),
            ValueError,
            "so that --variants can select it",
        ),
        (
            lambda: attnbench.register("a,b", BatchedAttention),
            ValueError,
            "so that --variants can select it",
        ),
    ],
)
def test_obscure_errors_now_name_the_argument(call, error, said):
    with pytest.raises(error, match=re.escape(said)):
        call()
