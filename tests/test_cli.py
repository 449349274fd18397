"""The command line rejects bad input before any work: exit 2, the option named, no traceback, nothing written.

Output targets too (``--out``, ``--summary``, ``--work-dir``, the step summary), by the option's
or variable's name; and the last tracebacks: a name too long, a reader that leaves the pipe.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from attnbench.cli import main
from attnbench.gate.markdown import STEP_SUMMARY

ROOT = Path(__file__).resolve().parents[1]
NO_CUDA = not torch.cuda.is_available()
FAST = [
    "--quiet",
    "--no-report",
    "--min-time",
    "0.01",
    "--max-time",
    "0.05",
    "--min-runs",
    "2",
    "--no-instructions",
]

# (arguments, text the error must contain). "{file}" is an existing regular file, "{root}" this checkout.
BAD = [
    (["run", "--lengths", ""], "--lengths"),
    (["run", "--lengths", ","], "--lengths"),
    (["run", "--lengths", "64,,128"], "--lengths"),
    (["run", "--lengths", "-5"], "--lengths"),
    (["run", "--lengths", "0"], "--lengths"),
    (["run", "--lengths", "abc"], "--lengths"),
    (["run", "--lengths", "1.5"], "--lengths"),
    (["run", "--variants", ""], "--variants"),
    (["run", "--variants", "nope"], "--variants"),
    (["run", "--variants", "batched,nope"], "batched, "),  # lists the known names
    (["run", "--variants", "loop", "--lengths", "1000000"], "--no-limit"),
    (["run", "--time-budget", "nan"], "--time-budget"),
    (["run", "--time-budget", "inf"], "--time-budget"),
    (["run", "--time-budget", "0"], "--time-budget"),
    (["run", "--time-budget", "-1"], "--time-budget"),
    (["run", "--min-time", "nan"], "--min-time"),
    (["run", "--max-time", "0"], "--max-time"),
    (["run", "--budget-mb", "nan"], "--budget-mb"),
    (["run", "--budget-mb", "-5"], "--budget-mb"),
    (["run", "--budget-fraction", "0"], "--budget-fraction"),
    (["run", "--budget-fraction", "1.5"], "--budget-fraction"),
    (["run", "--budget-fraction", "nan"], "--budget-fraction"),
    (["run", "--dtypes", "float8"], "float32, float64, bfloat16, float16"),
    (["run", "--dtypes", ""], "--dtypes"),
    (["run", "--masks", "casual"], "none, causal, valid_lengths, sliding_window"),
    (["run", "--modes", "fwd"], "forward, backward"),
    (["run", "--device", "gpu"], "--device"),
    (["run", "--device", "cuda:x"], "--device"),
    (["run", "--batch", "0"], "--batch"),
    (["run", "--heads", "-1"], "--heads"),
    (["run", "--head-dim", "x"], "--head-dim"),
    (["run", "--threads", "0"], "--threads"),
    (["run", "--workload", "training"], "--workload"),
    (["run", "--kv-heads", "3"], "--kv-heads 3 must divide --heads 8"),
    (["run", "--kv-heads", "2,5"], "--kv-heads 5 must divide"),
    (["run", "--kv-heads", "0"], "--kv-heads"),
    (["run", "--kv-heads", ""], "--kv-heads"),
    (["run", "--q-len", "0"], "--q-len"),
    (["run", "--q-len", "4"], "--workload decode"),
    (["run", "--head-dims", "64,,128"], "--head-dims"),
    (["run", "--head-dims", "64,x"], "--head-dims"),
    (["run", "--batches", "1,0"], "--batches"),
    (["run", "--min-runs", "0"], "--min-runs"),
    (["run", "--case-timeout", "0"], "--case-timeout"),
    (["run", "--case-timeout", "nan"], "--case-timeout"),
    (["run", "--resume"], "--resume needs --out"),
    (["run", "--resume", "--force", "--out", "r"], "--resume and --force"),
    (["run", "--variants", "batched", "--lengths", "32", "--out", "{file}"], "existing file"),
    (
        ["run", "--variants", "batched", "--lengths", "32", "--out", "{file}/sub"],
        "cannot be created",
    ),
    (
        ["profile", "batched", "--seq-len", "64", "--out", "{file}"],
        "--out {file} is an existing file",
    ),
    (
        ["profile", "batched", "--seq-len", "64", "--out", "{file}/sub"],
        "--out {file}/sub cannot be created",
    ),
    (
        ["regress", "HEAD~1", "HEAD", "--repo", "{root}", "--work-dir", "{file}"],
        "--work-dir {file} is an existing file",
    ),
    (
        ["regress", "HEAD~1", "HEAD", "--repo", "{root}", "--work-dir", "{file}/sub"],
        "--work-dir {file}/sub cannot be",
    ),
    (["publish", "--html-dir", "{file}"], "--html-dir {file} is an existing file"),
    (["publish", "--html-dir", "{file}/sub"], "--html-dir {file}/sub cannot be created"),
    (
        ["run", "--variants", "batched", "--lengths", "256,256"],
        "--lengths: 256 given more than once",
    ),
    (
        ["run", "--variants", "batched", "--dtypes", "float32,float32"],
        "float32 given more than once",
    ),
    (["run", "--variants", "batched,sdpa,batched"], "--variants: batched given more than once"),
    (["peak", "--device", "tpu"], "--device"),
    (["peak", "--dtype", "float8"], "--dtype"),
    (["profile", "nope", "--seq-len", "64"], "variant"),
    (["profile", "batched", "--seq-len", "0"], "--seq-len"),
    (["regress", "HEAD", "HEAD", "--repo", "{root}"], "same commit"),
    (["regress", "HEAD~1", "HEAD", "--time-factor", "nan"], "--time-factor"),
    (["regress", "HEAD~1", "HEAD", "--time-factor", "1"], "--time-factor"),
    (["regress", "HEAD~1", "HEAD", "--memory-factor", "inf"], "--memory-factor"),
    (["regress", "HEAD~1", "HEAD", "--rounds", "-1"], "--rounds"),  # 0: no time rounds
    (["bisect", "HEAD~1", "HEAD", "--rounds", "0"], "--rounds"),  # a time probe needs a round
    (["regress", "no-such-rev", "HEAD", "--repo", "{root}"], "no-such-rev"),
    (["--plugin", "no_such_plugin_module", "list"], "no_such_plugin_module"),
]
if NO_CUDA:
    BAD += [
        (["run", "--variants", "batched", "--device", "cuda"], "CUDA is not available"),
        (["peak", "--device", "cuda"], "CUDA is not available"),
        (["profile", "batched", "--seq-len", "64", "--device", "cuda"], "CUDA is not available"),
    ]


def _exit_code(argv: list[str]) -> int:
    try:
        return main(argv)
    except SystemExit as exc:  # argparse's own usage errors
        return exc.code


@pytest.mark.parametrize(("argv", "needle"), BAD, ids=[" ".join(a) or "<empty>" for a, _ in BAD])
def test_bad_invocation_is_a_clear_usage_error(argv, needle, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "afile").write_text("not a directory")
    argv = [a.replace("{file}", str(tmp_path / "afile")).replace("{root}", str(ROOT)) for a in argv]
    needle = needle.replace("{file}", str(tmp_path / "afile"))
    before = sorted(p.name for p in tmp_path.rglob("*"))
    if argv[0] == "run":
        argv += FAST
    code = _exit_code(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert needle in err, err
    assert "Traceback" not in err
    assert sorted(p.name for p in tmp_path.rglob("*")) == before  # nothing written


def test_the_battery_is_large_enough():
    assert len(BAD) >= 35


def test_a_usage_error_prints_no_traceback_from_the_console_entry_point(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "attnbench.cli", "run", "--lengths", "-5"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2
    assert "argument --lengths" in out.stderr and "Traceback" not in out.stderr
    assert list(tmp_path.iterdir()) == []


def test_run_help_shows_defaults(capsys):
    assert main(["run", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    for default in (
        "(default: 10.0)",
        "(default: ['float32'])",
        "(default: cpu)",
        "(default: reports/runs)",
        "(default: [64, 128, 256, 512, 1024, 2048, 4096])",
        "(default: 0.5)",
    ):
        assert default in text, default


def test_empty_grid_names_the_reason(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert _exit_code(["run", "--variants", "loop", "--lengths", "1000000", *FAST]) == 2
    err = capsys.readouterr().err
    assert "nothing to run" in err and "loop" in err and "<= 128" in err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(
    ("argv", "flush"),
    [
        ([], False),
        (["--workload", "decode"], True),  # a real decode step reads a cold KV cache
        (["--workload", "decode", "--no-flush-cache"], False),
        (["--flush-cache"], True),
    ],
)
def test_decode_flushes_caches_by_default(argv, flush):
    from attnbench.cli import build_parser, run_options
    from attnbench.session import measure_config

    options = run_options(build_parser().parse_args(["run", *argv]))
    assert measure_config(options).timer.flush_cache is flush


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


UNWRITABLE = Path("/sys/attnbench-out.json")
"""A file no process can create, root included (sysfs takes no new files)."""


TOO_LONG = "x" * 256  # one path component over NAME_MAX


def _refused(capsys, argv: list[str], *words: str) -> float:
    """Run ``attnbench argv``: exit 2, the words in its error; the seconds it took."""
    started = time.perf_counter()
    assert main(argv) == 2, argv
    seconds = time.perf_counter() - started
    err = capsys.readouterr().err
    assert "Traceback" not in err
    for word in words:
        assert word in err, (word, err)
    return seconds


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    from tests.test_export import BASE, _hand_run

    return _hand_run(tmp_path, [BASE])


def test_export_out_is_checked_before_the_export(tmp_path, run_dir, capsys):
    a_file = tmp_path / "file"
    a_file.write_text("x")
    for out, why in [
        (tmp_path, "is a directory"),
        (UNWRITABLE, "cannot be created or written"),
        (a_file / "bmf.json", "is a file"),
        (tmp_path / TOO_LONG, "over the system's limit"),
    ]:
        _refused(
            capsys, ["export", str(run_dir), "--format", "bmf", "--out", str(out)], "--out", why
        )
    # a missing parent is made, as for every other output
    out = tmp_path / "new" / "bmf.json"
    assert main(["export", str(run_dir), "--format", "bmf", "--out", str(out)]) == 0
    assert out.read_text().startswith("{")


def test_history_summary_and_step_summary_are_checked_before_the_page(
    tmp_path, run_dir, capsys, monkeypatch
):
    page = tmp_path / "page"
    history = ["history", "--from", str(run_dir), "--out", str(page)]
    _refused(capsys, [*history, "--summary", str(UNWRITABLE)], "--summary", "cannot be created")
    _refused(capsys, [*history, "--summary", str(tmp_path)], "--summary", "is a directory")
    for step, why in [(tmp_path / "missing" / "s.md", "does not exist"), (tmp_path, "directory")]:
        monkeypatch.setenv(STEP_SUMMARY, str(step))
        _refused(capsys, history, STEP_SUMMARY, why)
    assert not page.exists(), "refused before the page was written"


@pytest.mark.parametrize("target", ["--summary", STEP_SUMMARY, "--work-dir"])
def test_regress_refuses_a_bad_output_target_before_measuring(
    tmp_path, capsys, monkeypatch, target
):
    """The gate measures for minutes: a bad target is refused first, in well under a second."""
    import attnbench.gate  # noqa: F401  (imported before the clock starts)

    argv = ["regress", "HEAD~1", "HEAD", "--repo", str(tmp_path), "--metric", "time"]
    argv += ["--work-dir", str(tmp_path / "work")] if target != "--work-dir" else []
    if target == "--summary":
        argv += ["--summary", str(tmp_path)]
    elif target == STEP_SUMMARY:
        monkeypatch.setenv(STEP_SUMMARY, str(tmp_path / "missing" / "summary.md"))
    else:
        argv += ["--work-dir", str(tmp_path / TOO_LONG)]
    assert _refused(capsys, argv, target) < 1.0


def test_run_out_with_a_name_too_long_is_refused_by_name(tmp_path, capsys):
    argv = ["run", "--variants", "sdpa", "--lengths", "16", "--no-instructions", "--out"]
    _refused(capsys, [*argv, str(tmp_path / TOO_LONG)], "--out", "over the system's limit of 255")
    deep = tmp_path.joinpath(*["d" * 200] * 21)  # every component fine, the whole over PATH_MAX
    _refused(capsys, [*argv, str(deep)], "--out", "over the system's limit of 4095")


def test_a_reader_that_leaves_the_pipe_ends_nothing(monkeypatch):
    """``attnbench list --wide | head -c 5``: the rest goes nowhere, exit 0, no BrokenPipeError."""
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    stream = open(write, "w", buffering=1, encoding="utf-8")  # noqa: SIM115
    monkeypatch.setattr("sys.stdout", stream)
    try:
        assert main(["list", "--wide"]) == 0
    finally:
        stream.close()


@pytest.mark.slow
def test_run_piped_into_head_exits_0_without_a_traceback(tmp_path):
    """The real thing: ``attnbench run ... | head -c 5``, with the reader gone before the first
    write (so it does not hang on timing): data and report written, exit 0, no traceback."""
    import subprocess
    import sys

    run = [sys.executable, "-m", "attnbench.cli", "run", "--variants", "sdpa", "--lengths", "16"]
    run += ["--no-instructions", "--no-probe", "--out", str(tmp_path / "r")]
    read, write = os.pipe()
    os.close(read)
    try:
        out = subprocess.run(run, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "BrokenPipeError" not in out.stderr and "Traceback" not in out.stderr, out.stderr
    assert (tmp_path / "r" / "measurements.csv").exists()
    assert (tmp_path / "r" / "report" / "report.html").exists()


def test_bisect_validates_the_asv_grid_variables_as_regress_does(tmp_path, capsys, monkeypatch):
    """``bogus`` in either variable went into asv's environment build; refused first, by name."""
    argv = ["bisect", "HEAD~1", "HEAD", "--repo", str(tmp_path), "--work-dir", str(tmp_path / "w")]
    for name in ("ATTNBENCH_ASV_GRID", "ATTNBENCH_ASV_VARIANTS"):
        with monkeypatch.context() as env:
            env.setenv(name, "bogus")
            _refused(capsys, argv, name)


def test_a_log_of_many_unreadable_lines_prints_a_capped_list(tmp_path, run_dir, capsys):
    """100,000 bad lines printed 100,001 lines (and took minutes: see load_run); 2,000 show it."""
    from attnbench.cli import PROBLEMS_SHOWN

    log = run_dir / "cases.jsonl"
    log.write_text(log.read_text() + "{not json\n" * 2_000)
    assert main(["export", str(run_dir), "--format", "bmf"]) == 0
    lines = capsys.readouterr().err.splitlines()
    problems = [line for line in lines if line.startswith("problem:")]
    assert len(problems) == PROBLEMS_SHOWN + 1, len(problems)
    assert "2,000 in all" in problems[-1], problems[-1]
