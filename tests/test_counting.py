"""Instruction counting around a run: a killed run takes its valgrind counter with it, the folders
of gone counters are removed, and counting after the sweep stops at its time limit (on a scripted
clock) and says how to take the counts left.

Only the kill test needs valgrind. The counts themselves are tests/test_instructions.py's, whose
module marks every test slow and valgrind-only.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from attnbench.spec import AttnSpec


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


def _fake_valgrind(tmp_path: Path) -> str:
    """A folder holding a ``valgrind`` that answers ``--version`` and, asked to count, prints the
    ``ATTNBENCH_TEST_MARK`` of the environment it started in and fails."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "valgrind"
    fake.write_text(
        '#!/bin/sh\n[ "$1" = --version ] && { echo valgrind-3.19.0; exit 0; }\n'
        'echo "fake valgrind, mark=$ATTNBENCH_TEST_MARK"; exit 1\n'
    )
    fake.chmod(0o755)
    return str(bin_dir)


def _environ_with_the_fake(tmp_path: Path) -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{_fake_valgrind(tmp_path)}:{os.environ['PATH']}",
        "ATTNBENCH_TEST_MARK": "given",
    }


def test_the_counting_process_starts_from_the_environment_it_is_given(tmp_path, monkeypatch):
    """valgrind is found on the given environment's PATH and its process starts from that
    environment, whatever this process's own holds. Planted: a fake valgrind only the given PATH
    leads to, which prints a variable only the given environment has."""
    from attnbench.measure.instructions import CountError, count_instructions

    environ = _environ_with_the_fake(tmp_path)
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("ATTNBENCH_TEST_MARK", "this process")
    with pytest.raises(CountError, match="fake valgrind, mark=given"):
        count_instructions([("batched", AttnSpec(seq_len=64))], environ=environ)


def test_counting_beside_a_sweep_is_not_disturbed_by_the_fork_servers_environment(
    tmp_path, monkeypatch
):
    """The sweep starts its fork server by swapping the process environment (clear, then refill)
    while the counting thread starts valgrind. A thread reading the environment then can miss
    PATH, or start a child from a half-written environment (``execve`` fails with EFAULT: 60% of
    ``valgrind --version`` calls beside a swapping loop on 2026-11-28). The counter takes its copy
    when it is made: each of ten counters beside the swapping reaches the (fake) valgrind's count
    run, started from that copy."""
    from attnbench.measure.instructions import Beside, CountConfig

    monkeypatch.setattr("attnbench.measure.instructions._idle_priority", lambda: None)
    for key, value in _environ_with_the_fake(tmp_path).items():
        monkeypatch.setenv(key, value)
    for _ in range(10):
        counter = Beside([("batched", AttnSpec(seq_len=64))], CountConfig())
        deadline = time.monotonic() + 60
        while not counter.done and time.monotonic() < deadline:
            saved = dict(os.environ)  # what WorkerPool._start_server does
            os.environ.clear()
            os.environ.update(saved)
        assert counter.done and counter.error is not None
        assert "fake valgrind, mark=given" in str(counter.error), counter.error


def _grid(*variants: str) -> list[tuple[str, AttnSpec]]:
    return [
        (v, AttnSpec(seq_len=n, heads=2, head_dim=16, mode=m))
        for v in variants
        for n in (64, 128)
        for m in ("forward", "backward")
    ]


def test_the_counting_processes_each_take_whole_variants_the_dearest_first():
    """asv's Instructions class counts in two valgrind processes: each variant's cases in one of them (the same split
    on every commit), the work balanced, the cases decided without valgrind (unsupported) with the first."""
    from attnbench.measure.instructions import CountConfig, _split

    cases = _grid("batched", "loop", "sdpa_cudnn", "chunked", "linear_elu")
    groups = _split(cases, CountConfig(), 2)
    assert sorted(i for g in groups for i in g) == list(range(len(cases)))
    names = [{cases[i][0] for i in g} for g in groups]
    assert all(len(a & b) == 0 for a in names for b in names if a is not b)
    # the Python loop outweighs the other three together; sdpa_cudnn (CUDA only here) is skipped, free, with the first
    assert names == [{"loop", "sdpa_cudnn"}, {"batched", "chunked", "linear_elu"}], names
    assert _split(_grid("batched"), CountConfig(), 2) == [
        list(range(4))
    ]  # one variant, one process
    assert _split(cases, CountConfig(), 1) == [list(range(len(cases)))]


def test_counting_in_processes_keeps_the_cases_order_and_hands_each_the_same_environment(
    tmp_path, monkeypatch
):
    """Each process's counts come back in the cases' order, the progress counts every case of every process, and every
    process starts from one copy of the environment taken before the threads (planted: a fake valgrind only the copy's
    PATH leads to, while this process's environment changes under the threads)."""
    import attnbench.measure.instructions as instructions
    from attnbench.measure.record import Count

    cases = _grid("batched", "chunked", "linear_elu")
    seen, progress = [], []

    def fake(batch, config=None, *, progress=None, environ=None):
        seen.append((batch[0][0], environ))
        os.environ["ATTNBENCH_TEST_MARK"] = "changed under the threads"
        counts = [
            Count(n, s, "ok", instructions=float(s.seq_len), valgrind="fake") for n, s in batch
        ]
        for k, count in enumerate(counts, 1):
            progress(k, len(batch), count)
        return counts

    monkeypatch.setenv("ATTNBENCH_TEST_MARK", "before")
    monkeypatch.setattr(instructions, "count_instructions", fake)
    found = instructions.count_in_processes(
        cases, processes=2, progress=lambda done, total, c: progress.append((done, total))
    )
    assert [(c.variant, c.spec) for c in found] == cases
    assert (
        len(seen) == 2
        and seen[0][1] is seen[1][1]
        and seen[0][1]["ATTNBENCH_TEST_MARK"] == "before"
    )
    assert sorted(done for done, _ in progress) == list(range(1, len(cases) + 1))
    assert {total for _, total in progress} == {len(cases)}
    with pytest.raises(ValueError, match="processes must be an int >= 1"):
        instructions.count_in_processes(cases, processes=0)


def test_a_failing_counting_process_fails_the_whole_count(tmp_path, monkeypatch):
    """Two processes, both started from the given environment's (fake) valgrind: its failure is raised, not lost."""
    from attnbench.measure.instructions import CountError, count_in_processes

    for key, value in _environ_with_the_fake(tmp_path).items():
        monkeypatch.setenv(key, value)
    with pytest.raises(CountError, match="fake valgrind, mark=given"):
        count_in_processes(_grid("batched", "chunked"), processes=2)


def test_a_dump_counts_by_its_totals_line_not_its_summary(tmp_path):
    """callgrind writes ``summary:`` as its running total less the one at the previous dump; switching
    instrumentation around each case restarts that total, and the summary then said a case's count less the
    previous case's. ``totals:`` (the sum of the dump's cost lines) stays the case's own (the lines below are
    from such a dump: 23.7 million per call, not 1.95)."""
    from attnbench.measure.instructions import CountConfig, _count_of

    (tmp_path / "callgrind.out.2").write_text(
        "events: Ir\nfn=(1) f\n0 47399247\nsummary: 3904897\ntotals: 47399247\n"
    )
    case = ("batched", AttnSpec(batch=1, heads=8, seq_len=128, head_dim=64))
    count = _count_of(
        {"index": 0, "status": "ok", "dump": 2},
        [case],
        tmp_path / "callgrind.out",
        "valgrind-3.19.0",
        CountConfig(calls=2),
    )
    assert count.status == "ok" and count.instructions == 47399247 / 2, count


def test_client_requests_answer_nothing_outside_valgrind():
    """The request stub runs natively too (valgrind's marker is a no-op there): it answers 0 to "running on
    valgrind?", so no switch is offered and nothing is switched."""
    from attnbench.measure.instructions import _client_requests, _requests_possible

    if not _requests_possible():
        pytest.skip("the request stub is x86-64 Linux machine code")
    assert _client_requests() is None
