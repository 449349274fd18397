"""The third fault battery: output targets refused before any work, by the option or variable's
name; the last tracebacks (a name too long, a symlink loop, a reader that leaves the pipe)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from attnbench.cli import main
from attnbench.gate.markdown import STEP_SUMMARY
from attnbench.spec import AttnSpec

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


# ---- obscure -------------------------------------------------------------------------------------
def test_bisect_validates_the_asv_grid_variables_as_regress_does(tmp_path, capsys, monkeypatch):
    """``bogus`` in either variable went into asv's environment build; refused first, by name."""
    argv = ["bisect", "HEAD~1", "HEAD", "--repo", str(tmp_path), "--work-dir", str(tmp_path / "w")]
    for name in ("ATTNBENCH_ASV_GRID", "ATTNBENCH_ASV_VARIANTS"):
        with monkeypatch.context() as env:
            env.setenv(name, "bogus")
            _refused(capsys, argv, name)


def test_bisect_refuses_a_case_at_length_0():
    from attnbench.gate.bisect import BisectError, case_subset

    with pytest.raises(BisectError, match="L an int >= 1"):
        case_subset(["sdpa:0"])
    with pytest.raises(BisectError, match="L an int >= 1"):
        case_subset(["sdpa:007x"])
    assert case_subset(["sdpa:16"])["ATTNBENCH_ASV_LENGTHS"] == "16"


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


def test_measure_leaves_the_callers_rng_as_it_found_it():
    import torch

    import attnbench
    from attnbench.measure.config import MeasureConfig
    from attnbench.measure.runner import measure
    from attnbench.variants.batched import BatchedAttention

    class Seeds(BatchedAttention):
        IN_DEFAULT_SWEEP = False

        def forward(self, q, k, v, mask):
            torch.manual_seed(0)
            return super().forward(q, k, v, mask)

    attnbench.register("plant_seeds", Seeds)
    torch.manual_seed(1234)
    before = torch.get_rng_state()
    try:
        m = measure(
            "plant_seeds",
            attnbench.AttnSpec(batch=1, heads=2, seq_len=16, head_dim=8),
            MeasureConfig(probe=False, measure_rss=False),
            peak_flops=1e10,
        )
    finally:
        attnbench.unregister("plant_seeds")
    assert m.status == "ok", m.reason
    assert torch.equal(torch.get_rng_state(), before)


def test_the_cuda_rng_states_saved_are_those_a_case_can_change(monkeypatch):
    """CUDA, scripted: every device once CUDA is up, else the case's own, else none (a CPU case must
    not initialize CUDA to save a state)."""
    import torch

    from attnbench.measure.runner import rng_devices

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 1)
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: False)
    assert rng_devices("cpu") == []
    assert rng_devices("cuda:0") == [0] and rng_devices("cuda") == [1]
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    assert rng_devices("cpu") == [0, 1]
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert rng_devices("cuda:0") == []


# ---- kill -9 does not orphan the counter ---------------------------------------------------------
def _session(sid: int) -> dict[int, str]:
    """The live processes of session ``sid``: pid -> command line."""
    found = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError):
            continue
        if int(fields[3]) == sid and fields[0] != "Z":  # field 6 of stat: the session id
            found[int(stat.parent.name)] = cmdline
    return found


@pytest.mark.slow
def test_kill_9_of_the_run_takes_its_valgrind_counter_with_it(tmp_path):
    """``attnbench run`` killed with SIGKILL (the parent only, as ``kill -9 PID``): 5 s later no
    process of the run is left, and the next count removes the counter's folder."""
    import shutil
    import signal
    import subprocess
    import sys

    from attnbench.measure.instructions import TMP_PREFIX, remove_orphans

    if shutil.which("valgrind") is None:
        pytest.skip("needs valgrind")
    argv = [sys.executable, "-m", "attnbench.cli", "run", "--variants", "sdpa", "--lengths", "16"]
    argv += ["--instructions", "--no-probe", "--no-report", "--out", str(tmp_path / "r")]
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    proc = subprocess.Popen(
        argv, env=env, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        end = time.monotonic() + 120
        log = tmp_path / "r" / "cases.jsonl"  # a case logged: the workers' fork server is up
        while not (
            any("callgrind" in c for c in _session(proc.pid).values())
            and log.exists()
            and '"kind": "case"' in log.read_text()
        ):
            assert proc.poll() is None, proc.communicate()[1][-2000:]
            assert time.monotonic() < end, "no valgrind process and case within 120 s"
            time.sleep(0.2)
        assert list(tmp_path.glob(f"{TMP_PREFIX}{proc.pid}-*")), "the counter's folder"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        time.sleep(5)
        assert _session(proc.pid) == {}, "survived the run"
    finally:
        for pid in _session(proc.pid):
            os.kill(pid, signal.SIGKILL)
    assert remove_orphans(tmp_path) and not list(tmp_path.glob(f"{TMP_PREFIX}*"))


def test_the_folders_of_gone_counters_are_removed_and_no_other(tmp_path):
    import subprocess

    from attnbench.measure.instructions import TMP_PREFIX, remove_orphans

    gone = subprocess.Popen(["true"])
    gone.wait()  # its pid names no process now
    dead = tmp_path / f"{TMP_PREFIX}{gone.pid}-abc"
    live = tmp_path / f"{TMP_PREFIX}{os.getpid()}-def"
    other = tmp_path / f"{TMP_PREFIX}xyz"  # an older name, without a pid: not ours to judge
    for folder in (dead, live, other):
        (folder / "sub").mkdir(parents=True)
    assert remove_orphans(tmp_path) == [dead]
    assert not dead.exists() and live.exists() and other.exists()


# ---- the counting budget bounds the run ----------------------------------------------------------
class _ScriptedCounter:
    """:class:`attnbench.measure.instructions.Beside` on a script: count ``i`` arrives at
    ``arrivals[i]`` seconds of a clock that moves only when the caller waits (``take``)."""

    def __init__(self, arrivals: list[float]) -> None:
        from attnbench.measure.instructions import CANCELLED
        from attnbench.measure.record import Count

        self.arrivals, self.now, self.stopped, self.error, self.seconds = (
            arrivals,
            0.0,
            False,
            None,
            1.0,
        )
        self.total, self.received, self._given = len(arrivals), 0, 0
        spec = AttnSpec(seq_len=16)
        self._count = lambda i, reason="": Count(
            "sdpa", spec.replace(seq_len=16 + i), "ok" if not reason else "error", 1e5, 2, reason
        )
        self._cancelled = CANCELLED

    def clock(self) -> float:
        return self.now

    @property
    def done(self) -> bool:
        return self.stopped or self._given == self.total

    def take(self, wait_s: float = 0.0) -> list:
        self.now += wait_s
        if self.stopped:
            new = [self._count(i, self._cancelled) for i in range(self._given, self.total)]
        else:
            new = [
                self._count(i)
                for i in range(self._given, self.total)
                if self.arrivals[i] <= self.now
            ]
        self._given += len(new)
        self.received += len(new)
        return new

    def stop(self) -> None:
        self.stopped = True


def test_counting_after_the_sweep_stops_at_its_time_limit_and_keeps_what_it_counted(capsys):
    from attnbench.measure.instructions import CANCELLED
    from attnbench.session import _finish_counting

    counter = _ScriptedCounter([0.0, 3.0, 8.0, 40.0, 90.0])
    logged, skipped = [], []

    def log(wait_s: float) -> int:
        new = counter.take(wait_s)
        logged.extend(c for c in new if c.reason != CANCELLED)
        skipped.extend(c for c in new if c.reason == CANCELLED)
        return sum(c.reason == CANCELLED for c in new)

    left = _finish_counting(counter, log, True, wait_s=10.0, clock=counter.clock)
    assert left == 2 and len(logged) == 3 and len(skipped) == 2
    assert counter.now <= 11.0, "stopped within a wait of its limit"
    assert "3 case(s)" in capsys.readouterr().err
    # no limit (--instructions): every count, however long
    counter = _ScriptedCounter([0.0, 3.0, 8.0, 40.0, 90.0])
    logged.clear()
    assert _finish_counting(counter, log, True, wait_s=None, clock=counter.clock) == 0
    assert len(logged) == 5 and counter.now >= 90.0


def test_a_run_with_counts_takes_about_1_5x_its_sweep():
    from attnbench.runs import COUNT_FLOOR_S, count_wait_s

    for sweep_s in (120.0, 600.0, 3600.0):
        assert sweep_s + count_wait_s(sweep_s) <= 1.5 * sweep_s + 1e-9
    assert count_wait_s(1.0) == COUNT_FLOOR_S  # a short sweep's counts still get valgrind's start


def test_the_counts_left_are_said_with_how_to_take_them_and_resume_can(
    tmp_path, monkeypatch, capsys
):
    """The run level: a stopped count is not logged (so --resume counts it) and the note says how."""
    import attnbench.runs
    from attnbench.cli import build_parser, run_options
    from attnbench.measure.config import MeasureConfig
    from attnbench.session import _Sweep

    monkeypatch.setattr(attnbench.runs, "COUNT_FLOOR_S", 0.3)  # the limit: 0.3 s of real time
    counter = _ScriptedCounter([0.0, 1e9, 1e9])
    logged = []

    class RunDir:
        path = tmp_path / "run"

        def add_count(self, count, seconds=None):
            logged.append(count)

    sweep = _Sweep(
        run_options(build_parser().parse_args(["run", "--quiet"])),
        RunDir(),
        [],
        MeasureConfig(),
        counter,
        None,
        0,
        start=time.perf_counter(),
    )
    real_take = counter.take
    counter.take = lambda wait_s=0.0: (time.sleep(min(wait_s, 0.05)), real_take(0.0))[1]
    sweep._finish_counting()
    err = capsys.readouterr().err
    assert len(logged) == 1, logged
    assert "2 of 3 instruction count(s) not taken" in err
    assert f"attnbench run --resume --out {tmp_path / 'run'} --instructions" in err


def test_counted_cases_come_cheapest_first():
    from attnbench.runs import counted_cases

    cases = [("batched", AttnSpec(seq_len=n, heads=2, head_dim=16)) for n in (512, 256, 64, 128)]
    assert [s.seq_len for _, s in counted_cases(cases)] == [64, 128, 256, 512]
