"""Crash-safe, isolated sweeps: planted hangs, crashes and hogs end only their case; kills lose nothing."""

from __future__ import annotations

import fcntl
import importlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import attnbench
from attnbench import plugins
from attnbench.analysis.rundir import load_run
from attnbench.measure import MeasureConfig, sweep
from attnbench.measure.timer import TimerConfig
from attnbench.rundir_format import LOG, MANIFEST, MEASUREMENTS, read_log
from attnbench.runs import RunDirectory, RunDirError, write_run

ROOT = Path(__file__).resolve().parents[1]
FAST = MeasureConfig(
    timer=TimerConfig(min_runs=2, min_time=0.01, max_time=0.1),
    measure_rss=False,
    threads=1,
    probe=False,
)  # these tests are about processes, not about a busy machine (tests/test_noise.py)
SMALL = attnbench.AttnSpec(batch=1, heads=2, seq_len=64, head_dim=16)
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
    "--no-instructions",
]  # about processes, not counts (tests/test_instructions.py)
ABANDONED_WITHIN_S = 30.0
"""A signalled run ends this soon though its case in hand hangs: waiting for that case would last until its
worker is killed at --case-timeout (80 s by default). The report of what was done is written in between: 10 s
was missed by 0.4 s with the machine at load 7."""


@pytest.fixture
def planted(monkeypatch):
    """Register tests.planted_variants here and name it in ATTNBENCH_PLUGINS for the workers."""
    monkeypatch.setenv(plugins.PLUGINS_ENV, "tests.planted_variants")
    module = importlib.import_module("tests.planted_variants")
    module = importlib.reload(module)
    yield module
    for name in module.PLANTED:
        if name in attnbench.variant_names():
            attnbench.unregister(name)
    sys.modules.pop("tests.planted_variants", None)


def test_faults_end_only_their_own_case(planted):
    config = MeasureConfig(
        timer=FAST.timer, measure_rss=False, threads=1, memory_budget_bytes=64 * 2**20
    )
    names = [
        "planted_hang",
        "planted_abort",
        "planted_segv",
        "planted_oomkill",
        "planted_hog",
        "batched",
    ]
    results = sweep([(n, SMALL) for n in names], config, isolate=True, case_timeout_s=4)
    got = {m.variant: m for m in results}
    assert [m.variant for m in results] == names
    assert (
        got["planted_hang"].status == "timeout" and "killed after 4 s" in got["planted_hang"].reason
    )
    assert got["planted_abort"].status == "crashed" and "SIGABRT" in got["planted_abort"].reason
    assert got["planted_segv"].status == "crashed" and "SIGSEGV" in got["planted_segv"].reason
    # planted: a SIGKILL nobody can attribute is what it is, not a guess at the OOM killer
    assert (
        got["planted_oomkill"].status == "crashed"
        and "signal 9 (SIGKILL)" in got["planted_oomkill"].reason
    )
    # 8 GiB of untouched address space succeeds without a cap (overcommit); the cap refuses it.
    assert got["planted_hog"].status == "oom" and "allocate" in got["planted_hog"].reason, got[
        "planted_hog"
    ].reason
    assert got["batched"].status in ("ok", "noisy"), got[
        "batched"
    ].reason  # noisy: the machine was busy (probe)


def test_a_sigkill_is_oom_only_when_the_cgroup_counted_an_oom_kill(planted, monkeypatch):
    """Planted: the cgroup's OOM-kill count goes up while the worker dies of SIGKILL (what the kernel's OOM killer does)."""
    import attnbench.measure.worker as worker

    counts = iter([3, 4])
    monkeypatch.setattr(worker, "cgroup_oom_kills", lambda: next(counts))
    config = MeasureConfig(timer=FAST.timer, measure_rss=False, threads=1, probe=False)
    (m,) = sweep([("planted_oomkill", SMALL)], config, isolate=True)
    assert m.status == "oom" and "OOM killer" in m.reason and "from 3 to 4" in m.reason, m.reason


def test_every_case_runs_in_a_fresh_process(planted, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    monkeypatch.setenv("PLANTED_PID_FILE", str(pids))
    results = sweep(
        [("planted_pid", SMALL.replace(seq_len=n)) for n in (16, 32, 48)], FAST, isolate=True
    )
    assert [m.status for m in results] == ["ok"] * 3
    seen = pids.read_text().split()
    assert (
        len(set(seen)) == 3 and str(os.getpid()) not in seen
    )  # several calls per case, one process per case


def test_a_worker_without_the_plugin_records_an_error_row(planted, monkeypatch):
    monkeypatch.setenv(
        plugins.PLUGINS_ENV, ""
    )  # the parent knows the variant, the worker cannot import it
    (m,) = sweep([("planted_pid", SMALL)], FAST, isolate=True)
    assert m.status == "error" and "planted_pid" in m.reason


def test_torn_last_line_is_ignored_with_a_note(tmp_path):
    results = sweep([("batched", SMALL), ("sdpa", SMALL)], FAST)
    run = write_run(tmp_path / "run", results, FAST, seconds=1.0, command=["t"])
    with open(run / LOG, "ab") as f:
        f.write(b'{"kind": "case", "measurement": {"variant": "batch')  # a kill mid-write
    log = read_log(run / LOG)
    assert len(log.measurements) == 2 and log.header["planned"] == 2
    assert len(log.notes) == 1 and "torn last line" in log.notes[0]
    with RunDirectory(run, resume=True) as rd:
        assert rd.start(FAST, [("batched", SMALL), ("sdpa", SMALL)]) == []  # both survived
        rd.add(
            results[1]
        )  # appended where the torn line began: the fragment is cut, never kept inside
    log = read_log(run / LOG)
    assert len(log.measurements) == 3 and log.notes == ()


def test_resume_refuses_another_configuration(tmp_path):
    results = sweep([("batched", SMALL)], FAST)
    run = write_run(tmp_path / "run", results, FAST, seconds=1.0, command=["t"])
    other = MeasureConfig(
        timer=TimerConfig(min_runs=3, min_time=0.01, max_time=0.1), measure_rss=False, threads=1
    )
    with (
        RunDirectory(run, resume=True) as rd,
        pytest.raises(RunDirError, match=r"timer.min_runs: 2 in the log, 3 now"),
    ):
        rd.start(other, [("batched", SMALL)])
    with (
        RunDirectory(run, resume=True) as rd,
        pytest.raises(RunDirError, match=r"grid: 1 cases in the log, 2 now"),
    ):
        rd.start(FAST, [("batched", SMALL), ("sdpa", SMALL)])


def test_out_is_checked_before_measuring(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(RunDirError, match="existing file"):
        RunDirectory(tmp_path / "file")
    with pytest.raises(RunDirError, match="cannot be created"):
        RunDirectory(tmp_path / "file" / "sub")
    busy = tmp_path / "busy"
    with RunDirectory(busy), pytest.raises(RunDirError, match="in use by another attnbench run"):
        RunDirectory(busy)
    RunDirectory(busy).close()  # released on close
    (busy / MANIFEST).write_text("{}")
    with pytest.raises(RunDirError, match="--resume .* or --force"):
        RunDirectory(busy)
    with open(busy / ".lock", "a+") as held:  # another process's lock, by flock
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        with pytest.raises(RunDirError, match="in use"):
            RunDirectory(busy, force=True)


def _cli(*args: str, env: dict | None = None, **kw) -> subprocess.Popen:
    env = env or {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.Popen(
        [sys.executable, "-m", "attnbench.cli", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
        **kw,
    )


def _cases_logged(run: Path) -> int:
    try:
        return sum(1 for line in (run / LOG).read_text().splitlines() if '"kind": "case"' in line)
    except OSError:
        return 0


def _wait_for_cases(run: Path, n: int, proc: subprocess.Popen, limit: float = 240) -> None:
    end = time.monotonic() + limit
    while _cases_logged(run) < n:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < end, "sweep too slow"
        time.sleep(0.05)


GRID = ["--variants", "batched,sdpa", "--lengths", "16,32,48,64"]


def _main(capsys: pytest.CaptureFixture, *args: str) -> tuple[int, str, str]:
    """``attnbench *args`` in this process: its exit code, stdout and stderr.

    For the runs no signal is sent to: a new process would import torch and start a fork server again (about 7
    CPU-s a run); this process has both. The signalled runs stay processes of their own (:func:`_cli`)."""
    from attnbench.cli import main

    capsys.readouterr()
    code = main(list(args))
    out, err = capsys.readouterr()
    return code, out, err


@pytest.mark.slow
def test_kill_9_keeps_every_finished_case_and_resume_completes(tmp_path, capsys):
    """The killed run is a process of its own; the resume runs here (:func:`_main`)."""
    run = tmp_path / "run"
    proc = _cli("run", *GRID, "--out", str(run), "--no-report", *CLI_FAST)
    _wait_for_cases(run, 3, proc)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate()
    kept = read_log(run / LOG).measurements
    assert len(kept) >= 3
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["planned"] == 8 and manifest["complete"] is False and manifest["cases"] >= 2
    rows = len((run / MEASUREMENTS).read_text().splitlines()) - 1
    assert rows in (len(kept), len(kept) - 1)  # the kill may land between the log line and the rows
    assert rows - 1 <= manifest["cases"] <= rows  # ... or between the rows and the manifest
    read = load_run(run)  # either way the run loads as what it is: incomplete, not corrupt
    assert read.problems == () and any("incomplete" in n for n in read.notes)
    code, out, err = _main(capsys, "run", *GRID, "--out", str(run), "--resume", *CLI_FAST)
    assert code == 0, err
    assert f"{len(kept)} of 8 cases already measured" in err
    log = read_log(run / LOG)
    assert len(log.measurements) == 8  # nothing measured twice
    assert log.measurements[: len(kept)] == kept
    manifest = json.loads((run / MANIFEST).read_text())
    assert manifest["cases"] == 8 and manifest["complete"] is True
    assert (run / "report" / "report.html").exists()


@pytest.mark.slow
def test_ctrl_c_finishes_the_case_in_hand_writes_and_exits_130(tmp_path):
    run = tmp_path / "run"
    proc = _cli("run", *GRID, "--out", str(run), *CLI_FAST)
    _wait_for_cases(run, 2, proc)
    os.killpg(proc.pid, signal.SIGINT)  # as a terminal does: the whole process group
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "KeyboardInterrupt" not in err
    assert "interrupted: stopped" in err and "--resume" in err
    manifest = json.loads((run / MANIFEST).read_text())
    assert 2 <= manifest["cases"] < 8 and manifest["complete"] is False
    assert (run / "report" / "report.html").exists()  # the report of what was done


@pytest.mark.slow
def test_second_ctrl_c_abandons_a_hung_case_at_once(tmp_path):
    run = tmp_path / "run"
    env = {"ATTNBENCH_PLUGINS": "tests.planted_variants"}
    proc = _cli(
        "run",
        "--variants",
        "batched,planted_hang",
        "--lengths",
        "16",
        "--out",
        str(run),
        *CLI_FAST,
        cwd=ROOT,
        env={**os.environ, **env, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])},
    )
    _wait_for_cases(run, 1, proc)
    time.sleep(1.0)  # the hang is in hand
    os.killpg(proc.pid, signal.SIGINT)
    time.sleep(0.5)
    start = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < ABANDONED_WITHIN_S
    assert proc.returncode == 130, err
    assert "Traceback" not in err and "interrupted: aborted" in err
    assert json.loads((run / MANIFEST).read_text())["cases"] == 1


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sig", "to_group"),
    [(signal.SIGTERM, False), (signal.SIGHUP, True)],
    ids=["SIGTERM-to-the-parent", "SIGHUP-to-the-group"],
)
def test_sigterm_abandons_the_case_in_hand_writes_what_is_done_and_resume_completes(
    tmp_path, sig, to_group, planted, capsys
):
    """``kill -TERM`` (a CI runner, ``timeout``, systemd) ended the run at once (exit 143): no resume line, the
    case in hand lost, an orphaned worker's BrokenPipeError traceback. Sent to the parent alone or to the group.
    The signalled run is a process of its own; the refused and the completing resume run here (:func:`_main`)."""
    run = tmp_path / "run"
    env = {
        **os.environ,
        "ATTNBENCH_PLUGINS": "tests.planted_variants",
        "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path]),
    }
    variants = "batched,planted_hang,sdpa"  # the hang is in hand when the signal comes
    proc = _cli(
        "run",
        "--variants",
        variants,
        "--lengths",
        "16",
        "--out",
        str(run),
        *CLI_FAST,
        cwd=ROOT,
        env=env,
    )
    _wait_for_cases(run, 1, proc)
    time.sleep(1.0)
    start = time.monotonic()
    (os.killpg if to_group else os.kill)(proc.pid, sig)
    out, err = proc.communicate(timeout=60)
    assert time.monotonic() - start < ABANDONED_WITHIN_S, "the case in hand was waited for"
    assert proc.returncode == 128 + sig, err
    assert "Traceback" not in err and "BrokenPipe" not in err
    assert f"rerun with --resume --out {run}" in err
    assert [m.variant for m in read_log(run / LOG).measurements] == [
        "batched"
    ]  # the abandoned case is not logged
    assert (
        json.loads((run / MANIFEST).read_text())["cases"] == 1
        and (run / "report" / "report.html").exists()
    )
    code, _, err = _main(
        capsys,
        "run",
        *("--variants", "batched,sdpa", "--lengths", "16", "--out", str(run), "--resume"),
        *CLI_FAST,
    )
    assert code == 2, err  # a different grid is refused, never mixed in
    code, out, err = _main(
        capsys,
        "run",
        *("--variants", variants, "--lengths", "16", "--out", str(run), "--resume"),
        "--no-report",  # the report of a finished run: test_kill_9_keeps_every_finished_case_and_resume_completes
        *CLI_FAST,
        *("--case-timeout", "3"),
    )
    assert code == 0, err
    keys = [(m.variant, m.spec.seq_len) for m in read_log(run / LOG).measurements]
    assert sorted(keys) == sorted(set(keys)) and {k[0] for k in keys} == {
        "batched",
        "planted_hang",
        "sdpa",
    }


@pytest.mark.slow
def test_force_replaces_and_no_report_leaves_no_stale_report(tmp_path, capsys):
    """No signal is sent: the three runs run here (:func:`_main`)."""
    run = tmp_path / "run"
    code, _, err = _main(
        capsys, "run", "--variants", "batched", "--lengths", "16", "--out", str(run), *CLI_FAST
    )
    assert code == 0, err
    assert (run / "report" / "report.html").exists()
    sdpa = ("--variants", "sdpa", "--lengths", "16", "--out", str(run), "--no-report")
    code, _, err = _main(capsys, "run", *sdpa, *CLI_FAST)
    assert code == 2 and "--force" in err, err
    code, out, err = _main(capsys, "run", *sdpa, "--force", *CLI_FAST)
    assert code == 0, err
    assert "planned this session" in out and "): {'ok': 1}" in out, out  # plain words
    assert not (run / "report").exists()
    assert [m.variant for m in read_log(run / LOG).measurements] == ["sdpa"]


def _sigint_disposition(conn) -> None:
    conn.send(signal.getsignal(signal.SIGINT) == signal.SIG_IGN)


def test_workers_start_with_ctrl_c_ignored():
    """A Ctrl-C to the process group just as a case starts killed the worker before it ignored SIGINT itself
    (recorded ``crashed``, then counted done by --resume). The fork server's children ignore it from the start;
    planted: a fork server without that preload hands its children Python's KeyboardInterrupt handler."""
    from attnbench.measure.worker import PRELOAD, WorkerPool

    def disposition(pool: WorkerPool) -> bool:
        parent, child = pool.ctx.Pipe(duplex=False)
        proc = pool.ctx.Process(target=_sigint_disposition, args=(child,))
        proc.start()
        got = parent.recv()
        proc.join()
        return got

    import attnbench.measure.worker as worker

    # As under a terminal: Python's KeyboardInterrupt handler (an xdist worker ignores SIGINT, and a process
    # started from one inherits that, which would hide the planted fault below).
    previous, saved = signal.signal(signal.SIGINT, signal.default_int_handler), list(PRELOAD)
    try:
        assert disposition(WorkerPool(env={"PLANT": "a"}))
        worker.PRELOAD[:] = [m for m in PRELOAD if m != "attnbench.measure._forkserver"]
        assert not disposition(WorkerPool(env={"PLANT": "b"}))  # planted: the preload removed
    finally:
        worker.PRELOAD[:] = saved
        WorkerPool(env={"PLANT": "c"})  # a server with the full preload again
        signal.signal(signal.SIGINT, previous)


def test_counts_logged_beside_the_sweep_attach_to_their_cases_in_any_order(tmp_path):
    """A count may arrive before its case is timed or after: each is its own log line, attached on reading, and a
    resumed run knows which cases are counted already."""
    from attnbench.measure.record import Count

    cases = [("batched", SMALL), ("sdpa", SMALL)]
    results = sweep(cases, FAST)
    with RunDirectory(tmp_path / "run") as rd:
        rd.start(FAST, cases)
        rd.add_count(
            Count("sdpa", SMALL, "ok", instructions=123.0, calls=2, valgrind="v")
        )  # before its case
        rd.add(results[0])
        rd.add(results[1])
        rd.add_count(
            Count("batched", SMALL, "ok", instructions=456.0, calls=2, valgrind="v")
        )  # after it
        assert [m.instructions for m in rd.measurements] == [456.0, 123.0]
    log = read_log(tmp_path / "run" / LOG)
    assert [m.instructions for m in log.measurements] == [456.0, 123.0] and log.notes == ()
    with RunDirectory(tmp_path / "run", resume=True) as rd:
        assert rd.start(FAST, cases) == [] and len(rd.counted) == 2


@pytest.mark.parametrize(
    ("axis", "values"),
    [
        ("lengths", [256, 256]),
        ("dtypes", ["float32", "float32"]),
        ("variants", ["batched", "sdpa", "batched"]),
    ],
)
def test_a_repeated_grid_entry_is_refused(axis, values):
    """Planted: a repeated length measured the same case twice, and a later --resume found the manifest incomplete."""
    from attnbench.runs import grid

    kwargs = {"variants": ["batched"], "lengths": [64], axis: values}
    with pytest.raises(ValueError, match=f"{axis}: .* given more than once"):
        grid(**kwargs)


@pytest.mark.parametrize("limit_slow", [True, False])
def test_an_unknown_variant_is_refused_whatever_limit_slow_says(limit_slow):
    """Planted: with ``limit_slow=False`` the grid skipped the registry lookup and planned a case of no variant."""
    from attnbench.runs import grid

    with pytest.raises(ValueError, match="unknown variant 'nosuch'"):
        grid(["nosuch"], [64], limit_slow=limit_slow)
