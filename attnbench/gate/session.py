"""The gate's asv and git processes: benchmark BASE and HEAD with asv, then decide.

asv's exit codes do not say whether something regressed (``asv continuous`` exits 1 for usage
errors too, ``asv compare`` always 0), so the gate runs ``asv run`` on both commits (interleaved
rounds, the regime of :mod:`attnbench.measure.regime`, the CI grid), reads the result files
(:mod:`attnbench.gate.results`) and decides on them (:mod:`attnbench.gate.decision`, full rules:
docs/regression.md).

Exit codes of ``attnbench regress``: 0 nothing regressed (every case decided), 1 something
regressed or is wrong, 2 usage error (bad revision, BASE == HEAD, a factor that is nan, inf or
<= 1), 3 the benchmarks could not be measured, 4 no regression but a time case stayed undecided.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import significance
from attnbench.contract import GateVerdict
from attnbench.gate.decision import (
    GateOptions,
    Outcome,
    check_at_length,
    check_metric,
    compare,
    mark_not_timed,
)
from attnbench.gate.progress import HEARTBEAT_S, MIN_GAP_S, AsvProgress, parameter_sets
from attnbench.gate.results import (
    SESSION_MARK,
    RegressError,
    load_results,
    read_corrected,
    read_probes,
    write_verdicts,
)
from attnbench.gate.seed import seed_environments
from attnbench.io import check_writable_dir, output_tail
from attnbench.measure import regime
from attnbench.measure.instructions import in_parallel, missing_message, valgrind_version

__all__ = [
    "CI_SUBSET",
    "GATED",
    "HEARTBEAT_S",
    "INSTRUCTIONS",
    "PROBES",
    "REGIME",
    "TIME_BENCHMARK",
    "TIME_CASES",
    "AsvSession",
    "regress",
    "regress_many",
    "time_selection",
    "twin_environments",
]

CI_SUBSET = contract.grid_environment(contract.GRIDS["ci"])
"""The ``ci`` grid (short lengths, a few representative variants) as asv's grid variables."""
TIME_BENCHMARK = contract.TIME_BENCHMARK
GATED = "|".join(contract.GATED_BENCHMARKS)
INSTRUCTIONS = contract.INSTRUCTIONS_BENCHMARK
REGIME = regime.Regime(threads=regime.DEFAULT_THREADS)


PROBES = "probes.jsonl"
"""The calibration probes of the gate's time rounds, in its work directory."""


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {repo}: {out.stderr.strip()}")
    return out.stdout.strip()


def _asv(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log,
    progress: Callable[[str], None] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
    watch: Callable[[AsvProgress], None] | None = None,
) -> subprocess.CompletedProcess:
    """Run asv, its output (stdout and stderr) kept for the log and the caller.

    With ``progress``, where asv is (:class:`AsvProgress`) is told at least every ``heartbeat_s``
    seconds while it runs (a gate run is minutes of asv); ``watch`` adds what asv does not say
    (:class:`_CaseWatch`).
    """
    cmd = [sys.executable, "-m", "asv", *args]
    if progress is None:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    else:
        env = {**env, "PYTHONUNBUFFERED": "1"}
        out = _streamed(cmd, cwd, env, progress, heartbeat_s, watch)
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{out.stdout}\n{out.stderr}\n")
        log.flush()
    return out


def _streamed(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    progress: Callable[[str], None],
    heartbeat_s: float,
    watch: Callable[[AsvProgress], None] | None = None,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` that tells where asv is (:class:`AsvProgress`, updated by ``watch`` at
    each tick where given) at least every ``heartbeat_s`` seconds.

    asv's stdout is read as it is written, a line before its end included: a benchmark's line is
    written when it starts and ended when it is done. The output kept for the log has each line
    stamped with the seconds into the step at which it started.
    """
    import codecs
    import threading

    start = time.monotonic()
    tracker = AsvProgress(start, heartbeat_s=heartbeat_s, min_gap_s=min(MIN_GAP_S, heartbeat_s))
    lock = threading.Lock()
    stamped = _Stamped(start)
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    errors: list[bytes] = []

    def read_out() -> None:
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := os.read(proc.stdout.fileno(), 65536):  # type: ignore[union-attr]
            text, now = decoder.decode(chunk), time.monotonic()
            with lock:
                tracker.feed(text, now)
            stamped.add(text, now)

    def read_err() -> None:
        errors.append(proc.stderr.read())  # type: ignore[union-attr]

    readers = [threading.Thread(target=f, daemon=True) for f in (read_out, read_err)]
    for reader in readers:
        reader.start()
    while True:
        try:
            proc.wait(timeout=min(1.0, heartbeat_s / 4))
            break
        except subprocess.TimeoutExpired:
            with lock:
                if watch is not None:
                    watch(tracker)
                line = tracker.due(time.monotonic())
            if line:
                progress(line)
    for reader in readers:
        reader.join()
    err = b"".join(errors).decode("utf-8", errors="replace")
    return subprocess.CompletedProcess(cmd, proc.returncode, stamped.text(), err)


class _Stamped:
    """Output kept line by line, each stamped with the seconds into the step it started at."""

    def __init__(self, start: float) -> None:
        self.start, self.lines, self.partial, self.at = start, [], "", None

    def add(self, text: str, now: float) -> None:
        for piece in text.splitlines(keepends=True):
            if self.at is None:
                self.at = now
            self.partial += piece
            if piece.endswith("\n"):
                self.lines.append(f"[{self.at - self.start:6.1f} s] {self.partial}")
                self.partial, self.at = "", None

    def text(self) -> str:
        tail = f"[{self.at - self.start:6.1f} s] {self.partial}" if self.partial else ""
        return "".join(self.lines) + tail


class _CaseWatch:
    """Tells an :class:`AsvProgress` which case the time benchmark is at: the newest sample of the
    gate's probe log (one line per sample, :func:`attnbench.asv_bench.timed_teardown`) among the
    parameter sets of the call (asv's ``benchmarks.json`` and the call's ``--bench`` pattern).

    asv says nothing while one benchmark runs all its cases (minutes, in the gate's time rounds).
    """

    def __init__(self, probe_log: Path, benchmarks: Path, pattern: str | None) -> None:
        self.probe_log, self.benchmarks, self.pattern = probe_log, benchmarks, pattern
        self.read = probe_log.stat().st_size if probe_log.is_file() else 0  # this call's only
        self.known: float | None = None  # the benchmarks.json read (its mtime)

    def __call__(self, tracker: AsvProgress) -> None:
        try:
            changed = self.benchmarks.stat().st_mtime
            if changed != self.known:
                tracker.cases = parameter_sets(
                    json.loads(self.benchmarks.read_text()), self.pattern
                )
                self.known = changed
            with open(self.probe_log, "rb") as log:
                log.seek(self.read)
                new = log.read()
        except (OSError, ValueError):  # not there yet, or asv writing it: the next tick
            return
        lines = new.split(b"\n")
        self.read += len(new) - len(lines[-1])  # a line not yet ended is read when it is
        for line in reversed(lines[:-1]):
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            if isinstance(sample, dict):
                tracker.note_sample(sample)
                return


_BUILD_CACHE_SIZE = 8
"""Wheels asv keeps per environment (its default: 2; attnbench's is about 0.6 MB). Every time round
installs every commit again: with BASE and three HEADs, asv built each wheel again in every round
and call (seen: BASE's built at the start of each of six asv calls), 2 s of a core apiece."""


def _config(repo: Path, work: Path) -> Path:
    """The repository's asv.conf.json with results, envs and html redirected under ``work``.

    asv keeps at least :data:`_BUILD_CACHE_SIZE` built wheels (a repository that asks for more
    keeps its own number).
    """
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    conf.update(  # joining an absolute path keeps it as it is
        build_cache_size=max(int(conf.get("build_cache_size", 2)), _BUILD_CACHE_SIZE),
        repo=str(repo),
        benchmark_dir=str(repo / conf.get("benchmark_dir", "benchmarks")),
        results_dir=str(work / "results"),
        html_dir=str(work / "html"),
        # envs are reused across gate runs (and across clones, with ATTNBENCH_ASV_ENV_DIR)
        env_dir=str(
            Path(
                os.environ.get(contract.ENV_ENV_DIR) or repo / conf.get("env_dir", ".asv/env")
            ).resolve()
        ),
    )
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def _ci_subset(conf: Path) -> dict[str, str]:
    """:data:`CI_SUBSET` for the repository of asv's configuration ``conf``.

    In a repository of your own (asv's project is not attnbench: one ``attnbench init`` set up),
    the variants are those its suite names (its ``ATTNBENCH_ASV_VARIANTS`` default: yours), not
    the CI grid's built-in ones, which are the same pinned attnbench at every one of your commits.
    """
    if json.loads(conf.read_text()).get("project") == "attnbench":
        return dict(CI_SUBSET)
    return {k: v for k, v in CI_SUBSET.items() if k != contract.ENV_VARIANTS}


def regress(base: str, head: str, **options) -> Outcome:
    """Benchmark ``base`` and ``head`` with asv and compare them: :func:`regress_many` of one HEAD.

    Takes the keyword arguments of :func:`regress_many`.
    """
    (outcome,) = regress_many(base, [head], **options).values()
    write_verdicts(outcome)
    return outcome


def _commits(repo: Path, base: str, heads: list[str]) -> tuple[str, dict[str, str]]:
    """BASE's full hash and each HEAD's (keyed as given); ValueError where they cannot compare."""
    if not heads:
        raise ValueError("heads must name at least one revision")
    if not (repo / "asv.conf.json").exists():
        raise ValueError(
            "repo must hold an asv.conf.json (attnbench's checkout, or a repository of your own "
            f"that `attnbench init` set up), got {repo}"
        )
    base_hash = _git(repo, "rev-parse", "--verify", f"{base}^{{commit}}")
    head_hashes = {
        head: _git(repo, "rev-parse", "--verify", f"{head}^{{commit}}") for head in heads
    }
    for head, head_hash in head_hashes.items():
        if head_hash == base_hash:
            raise ValueError(
                f"BASE {base!r} and HEAD {head!r} are the same commit ({base_hash[:12]}): "
                "nothing to compare"
            )
    if len(set(head_hashes.values())) < len(heads):
        raise ValueError(f"heads must be different commits, got {heads}")
    return base_hash, head_hashes


TIME_CASES = ("longest", "all")
"""Which time cases the gate times where instruction counts decide (``--metric both`` or
``instructions``): ``longest``, the longest length of each variant in the grid, or ``all`` of them
(with ``--metric time``: always all)."""


def time_selection(subset: dict[str, str]) -> tuple[str, int]:
    """``(asv --bench pattern, length)``: the time benchmark at ``subset``'s longest length only.

    Where instruction counts decide, time tells what counts cannot see: cache misses, page faults,
    memory bandwidth and waiting. They weigh most where the working set is largest and least where
    it fits in the caches: at the grid's shorter lengths (the CI grid's 256 and 512: scores of 2 and
    8 MiB) a call's time follows its instructions, which the counts already judge exactly. asv
    selects parameter sets by a regular expression on ``name('variant', length, ...)``.
    """
    lengths = [int(x) for x in subset.get(contract.ENV_LENGTHS, "").split(",") if x.strip()]
    longest = max(lengths) if lengths else max(contract.GRIDS["ci"].lengths)
    return rf"{re.escape(TIME_BENCHMARK)}\('[^']*', {longest}, ", longest


_MACHINE_FILE_RETRIES = 4
_MACHINE_FILE_RACE = re.compile(r"Error parsing JSON in file '[^']*\.asv-machine\.json'")
_TWIN_SUFFIX = "-twin"
"""Names a second copy of asv's environment directory, for a second asv process at the same time."""


def twin_environments(env_dir: Path) -> Path:
    """``<env_dir>-twin``: every environment of ``env_dir`` again, for a second asv process.

    The second process installs another commit while the first measures its own (an environment
    holds one commit at a time). The interpreter's libraries (``lib/``: torch and the pinned
    packages, over a gigabyte, never written by asv) are hard links, made in seconds (a copy where
    links cannot be made); everything asv writes per commit (the project checkout it builds from,
    its wheel cache, its install record, ``bin/``) is copied, so neither process touches the other's
    files. pip replaces a package's files by new ones (it never writes into an installed file), so
    the commit installed in one copy is never seen in the other. A twin whose ``asv-env-info.json``
    (the pins) differs from its original's is made again.
    """
    import shutil

    twin_dir = env_dir.with_name(env_dir.name + _TWIN_SUFFIX)
    for env in (
        sorted(p for p in env_dir.iterdir() if (p / "asv-env-info.json").is_file())
        if env_dir.is_dir()
        else []
    ):
        twin = twin_dir / env.name
        info = (env / "asv-env-info.json").read_text()
        if (twin / "asv-env-info.json").is_file() and (
            twin / "asv-env-info.json"
        ).read_text() == info:
            continue
        shutil.rmtree(twin, ignore_errors=True)
        twin.mkdir(parents=True)
        for part in env.iterdir():
            target = twin / part.name
            if part.is_symlink() or not part.is_dir():
                shutil.copy2(part, target, follow_symlinks=False)
            elif part.name in ("lib", "lib64", "include", "share"):
                shutil.copytree(part, target, symlinks=True, copy_function=_link_or_copy)
            else:
                shutil.copytree(part, target, symlinks=True)
    return twin_dir


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: a copy
        import shutil

        shutil.copy2(src, dst)


@dataclass
class AsvSession:
    """One asv configuration, machine and environment for a series of ``asv run`` calls on commits.

    The gate's (:func:`regress_many`) and the bisection's (:mod:`attnbench.gate.bisect`). The
    environment is made by the first session in ``ATTNBENCH_ASV_ENV_DIR`` or the checkout's
    ``.asv/env`` (of this interpreter's packages, :mod:`attnbench.gate.seed`, or built by asv:
    minutes) and reused by every later one; each run installs its commits into it (seconds each).
    """

    repo: Path
    work: Path
    conf: Path
    env: dict[str, str]
    machine: str
    log_file: Path
    say: Callable[[str], None]

    @classmethod
    def open(
        cls,
        repo: Path,
        work_dir: str | Path | None,
        subset: dict[str, str] | None,
        machine: str,
        log_path: str | Path | None,
        say: Callable[[str], None] | None = None,
        fresh: bool = True,
    ) -> AsvSession:
        """A session: its configuration written under the work directory, asv's machine registered.

        RegressError where asv cannot register the machine.
        ``fresh``: start from an empty results directory. A verdict is taken on this session's
        measurements only: a work directory kept from an earlier run (the CLI's ``.asv/regress``)
        still held, say, BASE's counts of that run where this one took none of HEAD's, and compare()
        read "ran on BASE, not on HEAD": regressed.
        """
        # Relative to where the caller stands, resolved now: asv runs with cwd=work, where a
        # relative path would be taken a second time (".asv/regress/.asv/regress").
        repo = Path(repo).resolve()
        work = (
            check_writable_dir(work_dir, "work_dir", create=True).resolve()
            if work_dir
            else Path(tempfile.mkdtemp(prefix="attnbench-regress-"))
        )
        conf = _config(repo, work)
        seed_environments(conf, say or (lambda line: None))
        if fresh:
            _shutil_rmtree(work / "results")
        if subset is None:  # the grid variables the caller set (e.g. ATTNBENCH_ASV_VARIANTS)
            subset = {k: os.environ[k] for k in contract.GRID_ENV if os.environ.get(k, "").strip()}
        # whatever they leave unset stays the CI grid's (not asv's whole grid)
        subset = {**_ci_subset(conf), **subset}
        env = {
            **os.environ,
            **subset,
            **regime.child_env(REGIME),
            contract.ENV_PROBE_LOG: str(work / PROBES),
        }
        session = cls(
            repo=repo,
            work=work,
            conf=conf,
            env=env,
            machine=machine,
            log_file=Path(log_path or work / "asv.log"),
            say=say or (lambda line: None),
        )
        with open(session.log_file, "a", encoding="utf-8") as log:  # the log is kept across runs
            log.write(f"{SESSION_MARK} in {repo}\n")
        session._register_machine()
        return session

    def _register_machine(self) -> None:
        """Register asv's machine in this session's configuration (RegressError where it fails)."""
        out = self.asv(
            ["machine", "--yes", "--machine", self.machine, "--config", str(self.conf)], quiet=True
        )
        if out.returncode != 0:
            raise RegressError(
                f"asv machine failed (exit {out.returncode}):\n{output_tail(out)}\n"
                f"full log: {self.log_file}"
            )

    @property
    def subset(self) -> dict[str, str]:
        return {k: self.env[k] for k in contract.GRID_ENV if k in self.env}

    @property
    def env_dir(self) -> Path:
        return Path(json.loads(self.conf.read_text())["env_dir"])

    def twin(self) -> AsvSession:
        """A second session beside this one, for a second asv process at the same time.

        The same repository, grid and machine, its own environments (:func:`twin_environments`, made
        from this session's once they exist) and its own results directory (``<work>/twin/results``:
        two asv processes must not write one ``benchmarks.json``). Its results join this session's
        with :meth:`adopt`.
        """
        # this session's environments must exist first (asv setup's exit code is its return value, a
        # list: unused); where the session could not make them it builds asv's pinned virtualenv
        # (minutes), so it reports its progress like a run
        out = self.asv(["setup", "--config", str(self.conf)])
        if not any(self.env_dir.glob("*/asv-env-info.json")):
            raise RegressError(
                f"asv setup made no environment in {self.env_dir}:\n{output_tail(out)}\n"
                f"full log: {self.log_file}"
            )
        work = self.work / "twin"
        work.mkdir(exist_ok=True)
        conf = json.loads(self.conf.read_text())
        conf.update(
            env_dir=str(twin_environments(self.env_dir)),
            results_dir=str(work / "results"),
            html_dir=str(work / "html"),
        )
        (work / "asv.conf.json").write_text(json.dumps(conf, indent=1))
        twin = AsvSession(
            repo=self.repo,
            work=work,
            conf=work / "asv.conf.json",
            env=self.env,
            machine=self.machine,
            log_file=work / "asv.log",
            say=self.say,
        )
        twin._register_machine()
        return twin

    def adopt(self, other: AsvSession, commits: list[str]) -> None:
        """Move ``other``'s results of ``commits`` and its log into this session's.

        Its results replace what this session held of those commits: they were measured again.
        """
        from attnbench.shards import merge_results

        mine, theirs = self.work / "results", other.work / "results"
        if (theirs / "benchmarks.json").is_file():  # else asv wrote nothing (see its log)
            for commit in commits:
                for path in (mine / self.machine).glob(f"{commit[:8]}-*.json"):
                    path.unlink()
            merge_results([theirs], mine)
        _shutil_rmtree(theirs)
        if other.log_file.exists():
            with open(self.log_file, "a", encoding="utf-8") as log:
                log.write(other.log_file.read_text(encoding="utf-8", errors="replace"))
            other.log_file.unlink()

    def asv(self, args: list[str], quiet: bool = False) -> subprocess.CompletedProcess:
        """Run asv; again where it died reading ``~/.asv-machine.json`` as another asv rewrote it.

        asv keeps its machines in one file in the home directory and rewrites it in place
        (``asv machine --yes``), so an asv process started at that moment reads it empty and stops
        ("Error parsing JSON"): where the home directory is shared with other asv runs, a BASE whose
        every result is missing.
        """
        for attempt in range(_MACHINE_FILE_RETRIES + 1):
            with open(self.log_file, "a", encoding="utf-8") as log:
                out = _asv(
                    args,
                    cwd=self.work,
                    env=self.env,
                    log=log,
                    **({} if quiet else {"progress": self.say, "watch": self._case_watch(args)}),
                )
            if out.returncode == 0 or not _MACHINE_FILE_RACE.search(f"{out.stdout}\n{out.stderr}"):
                return out
            if attempt < _MACHINE_FILE_RETRIES:
                self.say(
                    "asv read ~/.asv-machine.json while it was being rewritten: "
                    f"again ({attempt + 1})"
                )
                time.sleep(1.0 + attempt)
        return out

    def _case_watch(self, args: list[str]) -> _CaseWatch:
        """What tells the progress of asv ``args`` the time benchmark's case under way."""
        pattern = args[args.index("--bench") + 1] if "--bench" in args[:-1] else None
        results = Path(json.loads(self.conf.read_text())["results_dir"])
        return _CaseWatch(
            Path(self.env.get(contract.ENV_PROBE_LOG) or self.work / PROBES),
            results / "benchmarks.json",
            pattern,
        )

    def run(
        self,
        commits: list[str],
        bench: str,
        *,
        rounds: int | None = None,
        samples: bool = False,
        append: bool = False,
    ) -> subprocess.CompletedProcess:
        """``asv run`` of ``bench`` on ``commits`` (full hashes); ``rounds``: interleaved rounds.

        ``--attribute rounds`` applies to every benchmark of the call, so deterministic ones run in
        calls of their own, once. Exit codes are deliberately unused: the result files are the truth
        (:meth:`load`).
        """
        hashes = self.work / "hashes.txt"
        hashes.write_text("".join(f"{h}\n" for h in commits))
        args = [
            "run",
            f"HASHFILE:{hashes}",
            "--config",
            str(self.conf),
            "--machine",
            self.machine,
            "--show-stderr",
            "--bench",
            bench,
        ]
        if rounds is not None:
            args += ["--interleave-rounds", "--attribute", f"rounds={rounds}"]
        if samples:
            args.append("--record-samples")
        if append:
            args.append("--append-samples")
        return self.asv(args)

    def load(self, commits: list[str]) -> tuple[pd.DataFrame, dict]:
        """``(frame, samples)`` of the results, for :func:`compare`; each commit must have some."""
        return load_results(self.work, self.machine, commits, self.log_file)


def _shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def regress_many(
    base: str,
    heads: list[str],
    *,
    repo: str | Path = ".",
    time_factor: float = contract.TIME_FACTOR,
    memory_factor: float = contract.MEMORY_FACTOR,
    rounds: int = 2,
    subset: dict[str, str] | None = None,
    work_dir: str | Path | None = None,
    machine: str = "attnbench-ci",
    log_path: str | Path | None = None,
    metric: str = "time",
    instructions_factor: float = contract.INSTRUCTIONS_FACTOR,
    progress: Callable[[str], None] | None = None,
    time_cases: str = "longest",
    deterministic: bool = True,
    parallel: bool = True,
    at_length: int | None = None,
) -> dict[str, Outcome]:
    """Benchmark ``base`` and each of ``heads`` in one asv session; compare each HEAD with BASE.

    BASE is measured once for all HEADs and the time rounds interleave every commit, so several
    candidates cost one BASE and one set of rounds that share the machine's moments. Where counts
    decide, time is taken at each variant's longest length only (``time_cases="longest"``:
    :func:`time_selection`). The steps: the README's "What a gate run does, in order".

    Args:
        base, heads: git revisions of ``repo``; the outcomes are keyed by ``heads`` as given.
        time_factor, memory_factor, instructions_factor: allowed HEAD/BASE ratios (:func:`compare`).
        rounds: asv rounds of the time benchmark, interleaved across the commits; 0: no time
            rounds, the exact measures decide alone (bytes, FLOPs, the error ratio and how they
            grow, and counts where they decide): a gate that judges no time, in seconds.
        subset: grid variables narrowing :data:`CI_SUBSET` (default: those of ``GRID_ENV`` set).
        work_dir, log_path, machine: where results and asv's output go (default: a temporary
            directory, its ``asv.log``), and the asv machine they are recorded under.
        metric: what decides (:data:`.decision.GATE_METRICS`); time_cases: :data:`TIME_CASES`.
        progress: told each step, and asv's progress at least every :data:`HEARTBEAT_S` seconds.
        deterministic: also measure bytes, FLOPs and the error ratio (bisect's time probes do not).
        parallel: the deterministic measures of BASE and of the HEADs in two asv processes at once.
        at_length: the length the exact metrics' growth is predicted at (:func:`compare`).

    Raises:
        ValueError: bad arguments (unknown revision, a HEAD that is BASE, repeated HEADs, ...).
        RegressError: asv gave no results for a commit, or counts were asked for without valgrind.
    """
    say = progress or (lambda line: None)
    options = _checked_options(
        metric, time_cases, rounds, time_factor, memory_factor, instructions_factor, at_length
    )
    _check_something_measured(metric, rounds, deterministic)
    repo = Path(repo).resolve()
    base_hash, head_hashes = _commits(repo, base, heads)
    session = AsvSession.open(repo, work_dir, subset, machine, log_path, say)
    (session.work / PROBES).unlink(missing_ok=True)  # this gate run's rounds only
    timed = _timed_rounds(metric, time_cases, session.subset)
    gate = _GateRun(session, base_hash, head_hashes, metric, options, *timed, at_length)
    say(f"measuring {gate.described} on the CI subset (log {session.log_file})")
    gate.measure_exact(deterministic, parallel)
    return gate.time_and_decide(rounds)


def _check_something_measured(metric: str, rounds: int, deterministic: bool) -> None:
    """A usage error where the options leave nothing to measure."""
    if rounds == 0 and metric == "time" and not deterministic:  # no time, no exact measures
        raise ValueError("rounds=0 with deterministic=False measures nothing")


def _timed_rounds(metric: str, time_cases: str, subset: dict[str, str]) -> tuple[str, int | None]:
    """``(asv --bench pattern, length)`` of the time rounds (None: every length, see
    :func:`time_selection`)."""
    if metric != "time" and time_cases == "longest":
        return time_selection(subset)
    return TIME_BENCHMARK, None


def _checked_options(
    metric: str,
    time_cases: str,
    rounds: int,
    time_factor: float,
    memory_factor: float,
    instructions_factor: float,
    at_length: int | None = None,
) -> GateOptions:
    """The gate's factors, checked with its other options in the order their usage errors come."""
    check_metric(metric)
    check_at_length(at_length)
    if time_cases not in TIME_CASES:
        raise ValueError(f"time_cases must be one of {TIME_CASES}, got {time_cases!r}")
    instructions_factor = significance.check_factor("instructions_factor", instructions_factor)
    if metric != "time" and valgrind_version() is None:
        raise RegressError(missing_message())
    # nan, inf and <= 1: usage errors
    options = GateOptions(time_factor, memory_factor, instructions_factor).checked()
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 0:
        raise ValueError(f"rounds must be an int >= 0, got {rounds!r}")
    return options


@dataclass(frozen=True)
class _GateRun:
    """One run of :func:`regress_many`: its asv session, commits and rules, and its steps."""

    session: AsvSession
    base: str  # full hash
    heads: dict[str, str]  # each HEAD's full hash, keyed by the revision as given
    metric: str  # GATE_METRICS
    options: GateOptions
    timed_bench: str  # asv's --bench pattern of the time rounds
    timed_length: int | None  # where counts decide: the one length timed (None: every length)
    at_length: int | None = None  # where growth is predicted (None: the workload's default)

    @property
    def commits(self) -> list[str]:
        return [self.base, *self.heads.values()]

    @property
    def described(self) -> str:
        return f"BASE {self.base[:10]} and " + ", ".join(
            f"HEAD {h[:10]}" for h in self.heads.values()
        )

    def measure_exact(self, deterministic: bool, parallel: bool) -> None:
        """The deterministic measures, once per commit, before the time rounds.

        Peak tensor bytes, FLOPs and the error ratio (``deterministic``), then, where counts decide,
        the instruction counts (one valgrind process per commit).
        """
        counts_decide = self.metric != "time"
        exact = (
            [b for b in contract.GATED_BENCHMARKS if b != TIME_BENCHMARK] if deterministic else []
        )
        exact += [INSTRUCTIONS] if counts_decide else []
        if exact:
            what = ", ".join(
                filter(
                    None,
                    (
                        "peak tensor bytes, FLOPs and the correctness gate"
                        if deterministic
                        else "",
                        "instruction counts under valgrind (torch starts in about half a minute)"
                        if counts_decide
                        else "",
                    ),
                )
            )
            _measure_exact(self.session, self.commits, exact, what, parallel)

    def time_and_decide(self, rounds: int) -> dict[str, Outcome]:
        """Each HEAD's outcome, from time rounds interleaved across the commits.

        What the rounds leave undecided gets a confirmation round, of every commit. No rounds: the
        exact measures' outcome.
        """
        if rounds == 0:
            self.session.say("no time rounds: the exact measures decide")
            return {head: self.outcome(head, table, 0) for head, table in self.decide().items()}
        where = (
            f"at L={self.timed_length} only (counts decide the shorter lengths; "
            "time sees what they cannot where the working set is largest)"
            if self.timed_length
            else "of every case"
        )
        self.session.say(f"timing: {rounds} interleaved asv round(s) {where}")
        self.session.run(self.commits, self.timed_bench, rounds=rounds, samples=True)
        tables = self.decide()
        undecided = sum(int((t["verdict"] == GateVerdict.UNDECIDED).sum()) for t in tables.values())
        confirmed = 0
        if undecided:  # cannot tell yet: more samples of every commit, decided on all of them
            self.session.say(f"{undecided} time case(s) undecided: a confirmation round")
            self.session.run(
                self.commits, self.timed_bench, rounds=rounds, samples=True, append=True
            )
            tables = self.decide()
            confirmed = 1
        return {head: self.outcome(head, table, confirmed) for head, table in tables.items()}

    def decide(self) -> dict[str, pd.DataFrame]:
        """Each HEAD's table (:func:`compare`) on every result, sample and probe so far."""
        frame, samples = self.session.load(self.commits)
        log = self.session.work / PROBES
        probes, shares, corrected = (
            read_probes(log),
            read_probes(log, "runqueue_share"),
            read_corrected(log),
        )
        tables = {
            head: compare(
                frame,
                self.base,
                head_hash,
                self.options.time_factor,
                self.options.memory_factor,
                samples=samples,
                probes=probes,
                metric=self.metric,
                instructions_factor=self.options.instructions_factor,
                runqueue_shares=shares,
                corrected=corrected,
                at_length=self.at_length,
            )
            for head, head_hash in self.heads.items()
        }
        return {head: mark_not_timed(table, self.timed_length) for head, table in tables.items()}

    def outcome(self, head: str, table: pd.DataFrame, confirmed: int) -> Outcome:
        table["confirmation_runs"] = confirmed
        return Outcome(
            table=table,
            regressions=table[table["verdict"].isin([GateVerdict.REGRESSED, GateVerdict.WRONG])],
            undecided=table[table["verdict"] == GateVerdict.UNDECIDED],
            base=self.base,
            head=self.heads[head],
            results_dir=self.session.work / "results",
        )


def _measure_exact(
    session: AsvSession, commits: list[str], benchmarks: list[str], what: str, parallel: bool
) -> None:
    """The deterministic benchmarks of ``commits``, in one asv call per process.

    None of them takes rounds (only time benchmarks do), so the counts run in the same call as the
    bytes, FLOPs and error ratio: a second call discovered the suite, started asv's fork server
    (torch imported, 4 s of a core each) and checked the installed commit again, per process. With
    ``parallel`` (and more than one commit), the commits are split between ``session`` and its twin,
    measured at once.
    """
    bench = "|".join(benchmarks)

    def measure(target: AsvSession, mine: list[str]) -> None:
        target.run(mine, bench)

    if not parallel or len(commits) < 2:
        session.say(f"{what}: once per commit")
        measure(session, commits)
        return
    say = session.say
    twin = session.twin()
    first, second = commits[0::2], commits[1::2]
    say(
        f"{what}: once per commit, two asv processes at once "
        "(the second in a twin of the environment)"
    )

    def label(mine: list[str]) -> str:
        return mine[0][:8] + (f" and {len(mine) - 1} more" if len(mine) > 1 else "")

    session.say = lambda line: say(f"[{label(first)}] {line.strip()}")
    twin.say = lambda line: say(f"[{label(second)}] {line.strip()}")
    try:
        in_parallel([lambda: measure(session, first), lambda: measure(twin, second)])
    finally:
        session.say = say
        session.adopt(twin, second)
