"""The third fault battery: output targets refused before any work, by the option or variable's
name; the last tracebacks (a name too long, a symlink loop, a reader that leaves the pipe)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.markdown import STEP_SUMMARY

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
    import attnbench.regress  # noqa: F401  (imported before the clock starts)

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


def test_a_symlink_loop_is_a_problem_not_a_traceback(tmp_path, capsys):
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert main(["export", str(loop), "--format", "bmf"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Symlink loop" in err
    assert main(["report", "--from", str(loop), "--out", str(tmp_path / "r")]) == 1
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Symlink loop" in err


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
