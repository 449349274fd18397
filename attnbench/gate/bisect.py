"""``attnbench bisect GOOD BAD``: the first commit after GOOD to exceed GOOD by the gate's factor.

The candidates are the first-parent commits after GOOD up to BAD (one per merge on a branch that
merges pull requests). GOOD is measured once, BAD is taken to be bad (as ``git bisect`` does), and
the commit halfway between the last good and the first bad is probed until they are neighbours. A
probe is judged against GOOD by the gate (:func:`attnbench.gate.decision.compare`):
``instructions`` and ``peak_tensor_bytes`` are exact, one asv run per probe; for ``time`` each probe
is the gate's time verdict itself (:func:`attnbench.gate.session.regress_many`) and may be
``undecided``. The search goes round ``undecided`` and ``skip`` probes (a commit that does not build
or measure), as ``git bisect skip`` does, and where it cannot get past them names the range it
narrowed to.

Not ``asv find``: it never measures GOOD, so it cannot name the first commit after it, has no
threshold, and judges one value per commit without the gate's noise checks (README, "Which commit
did it").
"""

from __future__ import annotations

import enum
import functools
import math
import re
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import changes, significance, text
from attnbench.contract import Basis, GateVerdict, Status
from attnbench.errors import UsageError
from attnbench.gate.decision import compare
from attnbench.gate.results import RegressError

__all__ = [
    "BENCHMARKS",
    "CASE",
    "METRICS",
    "VERDICTS",
    "BisectError",
    "Bisection",
    "Judge",
    "Probe",
    "ProbeVerdict",
    "answer",
    "bisect",
    "candidates",
    "case_subset",
    "judge_table",
    "probe_line",
    "search",
]

METRICS = ("instructions", "peak_tensor_bytes", "time")
"""What a bisection can search on: the gate's deterministic metrics, and time."""
BENCHMARKS = {
    "instructions": contract.INSTRUCTIONS_BENCHMARK,
    "peak_tensor_bytes": contract.TENSOR_BYTES_BENCHMARK,
}
"""The asv benchmark each deterministic metric is read from."""


class ProbeVerdict(enum.StrEnum):
    """A probed commit's verdict against GOOD."""

    GOOD = "good"  # every case within the factor
    BAD = "bad"  # a case beyond the factor, failed where GOOD ran, or wrong
    UNDECIDED = "undecided"  # the gate's time verdict could not decide
    SKIP = "skip"  # does not build, or no case could be measured


VERDICTS = tuple(ProbeVerdict)


class BisectError(ValueError, UsageError):
    """A bisection that cannot start (a usage error: exit 2).

    Bad revisions, a GOOD that is not an ancestor of BAD, a bad case.
    """


@dataclass(frozen=True)
class Probe:
    """One commit measured and judged against GOOD."""

    commit: str
    subject: str
    verdict: ProbeVerdict
    ratio: float  # the worst case's ratio to GOOD (NaN when none could be compared)
    case: str  # the worst case ("batched L=256")
    reason: str  # why this verdict, in a few words
    elapsed_s: float  # wall time of this probe's measurement


@dataclass
class Bisection:
    """The search's state and its answer."""

    good: str
    bad: str
    candidates: list[str]  # first-parent commits after GOOD up to BAD, oldest first
    subjects: dict[str, str]
    metric: str
    probes: list[Probe] = field(default_factory=list)
    first_bad: str | None = None  # the commit named, when the search could name one
    low: int = -1  # index of the last commit known good (-1: GOOD)
    high: int = -1  # index of the first commit known or taken to be bad
    elapsed_s: float = 0.0

    @property
    def verdicts(self) -> dict[str, Probe]:
        return {p.commit: p for p in self.probes}

    @property
    def culprit(self) -> Probe | None:
        return self.verdicts.get(self.first_bad) if self.first_bad else None

    @property
    def unresolved(self) -> list[str]:
        """The commits the first bad one is among where the search could not name it, else none."""
        if self.first_bad is not None or self.nothing or self.high < 0:
            return []
        return self.candidates[self.low + 1 : self.high + 1]

    @property
    def nothing(self) -> bool:
        """Every candidate up to BAD, BAD included, is good: there is nothing to find."""
        return bool(self.candidates) and self.low == len(self.candidates) - 1


Judge = Callable[[str], Probe]


def search(
    state: Bisection, judge: Judge, progress: Callable[[Probe, int], None] | None = None
) -> Bisection:
    """Binary search over ``state.candidates`` (BAD, the last, taken to be bad) with ``judge``.

    ``judge(commit)`` measures a commit and returns its :class:`Probe`; ``progress(probe, number)``
    is told each one. ``skip`` and ``undecided`` probes are left out of the search (the next probe
    is the nearest untried commit to the middle); when nothing is left to try between the last good
    and the first bad, the answer is that range.
    """
    n = len(state.candidates)
    low, high = -1, n - 1
    tried: dict[int, Probe] = {}

    def probe(i: int) -> Probe:
        result = judge(state.candidates[i])
        tried[i] = result
        state.probes.append(result)
        if progress is not None:
            progress(result, len(state.probes))
        return result

    while high - low > 1:
        middle = (low + high) // 2
        untried = [i for i in range(low + 1, high) if i not in tried]
        if not untried:  # every commit between is skipped or undecided: the answer is a range
            break
        i = min(untried, key=lambda k: (abs(k - middle), k))
        verdict = probe(i).verdict
        if verdict == ProbeVerdict.BAD:
            high = i
        elif verdict == ProbeVerdict.GOOD:
            low = i
    # the search ended on BAD, which nobody measured: is it bad at all?
    if high not in tried and probe(high).verdict == ProbeVerdict.GOOD:
        low = high
    state.low, state.high = low, high
    if high - low == 1 and tried[high].verdict == ProbeVerdict.BAD:
        state.first_bad = state.candidates[high]
    return state


# ---- measuring commits with the gate's machinery -------------------------------------------------
def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if out.returncode != 0:
        raise BisectError(f"git {' '.join(args)} failed in {repo}: {out.stderr.strip()}")
    return out.stdout.strip()


def candidates(repo: Path, good: str, bad: str) -> tuple[str, str, list[str], dict[str, str]]:
    """GOOD's and BAD's hashes, the first-parent commits after GOOD up to BAD, their subjects."""
    good_hash = _git(repo, "rev-parse", "--verify", f"{good}^{{commit}}")
    bad_hash = _git(repo, "rev-parse", "--verify", f"{bad}^{{commit}}")
    if good_hash == bad_hash:
        raise BisectError(
            f"GOOD {good!r} and BAD {bad!r} are the same commit ({good_hash[:12]}): "
            "nothing to search"
        )
    if (
        subprocess.run(
            ["git", "merge-base", "--is-ancestor", good_hash, bad_hash], cwd=repo
        ).returncode
        != 0
    ):
        raise BisectError(
            f"GOOD {good!r} ({good_hash[:12]}) is not an ancestor of BAD {bad!r} ({bad_hash[:12]})"
        )
    commits = _git(
        repo, "rev-list", "--first-parent", "--reverse", f"{good_hash}..{bad_hash}"
    ).split()
    if not commits:
        raise BisectError(f"no first-parent commit between {good!r} and {bad!r}")
    log = _git(
        repo, "log", "--no-walk=unsorted", "--format=%H %s", good_hash, *commits
    ).splitlines()
    subjects = dict(line.split(" ", 1) if " " in line else (line, "") for line in log)
    return good_hash, bad_hash, commits, subjects


CASE = re.compile(r"^([A-Za-z0-9_]+):([1-9]\d*)$")
"""``VARIANT:L``, L an int >= 1 (asv would go on at L=0 and measure nothing)."""


def case_subset(cases: Sequence[str]) -> dict[str, str]:
    """``["batched:256", "chunked:512"]`` -> the grid variables that narrow asv to those cases.

    asv's grid is a product: several cases give every named variant at every named length.

    Raises:
        BisectError: a case that is not ``VARIANT:L``, or a variant that is not registered.
    """
    from attnbench.registry import variant_names

    variants, lengths = [], []
    for case in cases:
        found = CASE.match(case.strip())
        if not found:
            raise BisectError(
                f"--case must be VARIANT:L, L an int >= 1 (e.g. batched:256), got {case!r}"
            )
        if found[1] not in variant_names():
            raise BisectError(f"--case {case!r}: unknown variant {found[1]!r}")
        variants += [found[1]] if found[1] not in variants else []
        lengths += [found[2]] if found[2] not in lengths else []
    return (
        {contract.ENV_VARIANTS: ",".join(variants), contract.ENV_LENGTHS: ",".join(lengths)}
        if cases
        else {}
    )


def judge_table(
    table: pd.DataFrame, metric: str, commit: str, subject: str, elapsed_s: float
) -> Probe:
    """A probe's verdict from the gate's table of GOOD and the commit (:func:`compare`)."""
    rows = table[table["metric"] == metric]
    if metric != "time":  # a wrong result shows on the error ratio's rows too
        rows = table[(table["metric"] == metric) | (table["verdict"] == GateVerdict.WRONG)]
    ran = rows[rows["base_status"] == Status.OK]
    if not len(ran):
        return _skipped(commit, subject, f"GOOD measured no {metric} case", elapsed_s)
    if (ran["head_status"] != Status.OK).all() and not (ran["verdict"] == GateVerdict.WRONG).any():
        return _skipped(
            commit,
            subject,
            f"no case could be measured ({len(ran)} failed): see asv.log",
            elapsed_s,
        )
    # the worst measured ratio; a prediction at the target length decides (below), never shows here
    measured = ran[ran["basis"] != Basis.PREDICTED] if "basis" in ran else ran
    compared = measured[measured["ratio"].notna()]
    worst = compared.loc[compared["ratio"].idxmax()] if len(compared) else ran.iloc[0]
    ratio = float(worst["ratio"]) if len(compared) else math.nan
    label = changes.case_label(worst.to_dict())
    bad = ran[ran["verdict"].isin([GateVerdict.REGRESSED, GateVerdict.WRONG])]
    if len(bad):
        first = bad.loc[bad["ratio"].fillna(math.inf).idxmax()]
        why = first["reason"] or first["verdict"]
        if first["head_status"] != Status.OK:
            why = f"{first['verdict']}: {first['head_status']} on this commit"
        return Probe(
            commit,
            subject,
            ProbeVerdict.BAD,
            float(first["ratio"]),
            changes.case_label(first.to_dict()),
            f"{len(bad)} case(s) beyond the factor; worst: {why}",
            elapsed_s,
        )
    undecided = ran[ran["verdict"] == GateVerdict.UNDECIDED]
    if len(undecided):
        return Probe(
            commit,
            subject,
            ProbeVerdict.UNDECIDED,
            ratio,
            label,
            f"{len(undecided)} time case(s) undecided: {undecided['reason'].iloc[0]}",
            elapsed_s,
        )
    return Probe(
        commit, subject, ProbeVerdict.GOOD, ratio, label, "every case within the factor", elapsed_s
    )


def _skipped(commit: str, subject: str, reason: str, elapsed_s: float) -> Probe:
    return Probe(commit, subject, ProbeVerdict.SKIP, math.nan, "", reason, elapsed_s)


def bisect(
    good: str,
    bad: str,
    *,
    repo: str | Path = ".",
    metric: str = "instructions",
    cases: Sequence[str] = (),
    work_dir: str | Path | None = ".asv/bisect",
    machine: str = "attnbench-ci",
    instructions_factor: float = contract.INSTRUCTIONS_FACTOR,
    memory_factor: float = contract.MEMORY_FACTOR,
    time_factor: float = contract.TIME_FACTOR,
    rounds: int = 2,
    progress: Callable[[str], None] | None = None,
    on_probe: Callable[[Probe, int], None] | None = None,
) -> Bisection:
    """The first commit after ``good`` up to ``bad`` whose ``metric`` exceeds GOOD's by its factor.

    Args:
        good, bad: git revisions of the checkout ``repo``; GOOD must be an ancestor of BAD.
        metric: :data:`METRICS`.
        cases: ``VARIANT:L`` cases (default: the CI grid, narrowed by any ``ATTNBENCH_ASV_*`` set).
        work_dir: asv's results and log (the environment is the gate's, ``ATTNBENCH_ASV_ENV_DIR``).
        instructions_factor, memory_factor, time_factor: the gate's factors.
        rounds: time rounds per probe (``time`` only).
        progress: told each step of the measuring (asv's progress at least every 30 s).
        on_probe: told each probe as it is judged, with its number.

    Raises:
        BisectError, ValueError: bad arguments. RegressError: GOOD itself could not be measured.
    """
    from attnbench.gate import session as gate_session

    say = progress or (lambda line: None)
    repo = Path(repo).resolve()
    _check_arguments(repo, metric, instructions_factor, memory_factor, time_factor)
    good_hash, bad_hash, commits, subjects = candidates(repo, good, bad)
    state = Bisection(good_hash, bad_hash, candidates=commits, subjects=subjects, metric=metric)
    subset = case_subset(cases) or None
    started = time.monotonic()
    if metric == "time":
        gate = functools.partial(
            gate_session.regress_many,
            repo=repo,
            subset=subset,
            work_dir=work_dir,
            machine=machine,
            time_factor=time_factor,
            memory_factor=memory_factor,
            rounds=rounds,
            progress=say,
        )
        judge = _time_judge(state, gate)
    else:
        session = gate_session.AsvSession.open(repo, work_dir, subset, machine, None, say)
        _measure_good(session, state)
        judge = _exact_judge(session, state, instructions_factor, memory_factor)
    search(state, judge, on_probe)
    state.elapsed_s = time.monotonic() - started
    return state


def _check_arguments(
    repo: Path, metric: str, instructions_factor: float, memory_factor: float, time_factor: float
) -> None:
    """Raise for arguments a bisect cannot run with.

    BisectError for an unknown metric or a ``repo`` without asv.conf.json, ValueError for a bad
    factor, RegressError for counts without valgrind.
    """
    if metric not in METRICS:
        raise BisectError(f"--metric must be one of {', '.join(METRICS)}, got {metric!r}")
    factor = {
        "instructions": instructions_factor,
        "peak_tensor_bytes": memory_factor,
        "time": time_factor,
    }[metric]
    significance.check_factor(f"{metric} factor", factor)
    if metric == "instructions":
        from attnbench.measure.instructions import missing_message, valgrind_version

        if valgrind_version() is None:
            raise RegressError(missing_message())
    if not (repo / "asv.conf.json").exists():
        raise BisectError(
            "repo must hold an asv.conf.json (attnbench's checkout, or a repository of your own "
            f"that `attnbench init` set up), got {repo}"
        )


def _measure_good(session, state: Bisection) -> None:
    """GOOD's measures, which every probe is judged against (RegressError where it has none)."""
    clock = time.monotonic()
    subset = session.subset
    session.say(
        f"measuring GOOD {state.good[:10]} ({state.subjects.get(state.good, '')[:60]}): "
        f"{state.metric} of {subset.get(contract.ENV_VARIANTS)} "
        f"at L={subset.get(contract.ENV_LENGTHS)}"
    )
    session.run([state.good], BENCHMARKS[state.metric])
    session.load([state.good])  # GOOD must measure: RegressError otherwise
    n = len(state.candidates)
    session.say(
        f"GOOD measured in {time.monotonic() - clock:.0f} s; {n} candidate commits: "
        f"{max(1, math.ceil(math.log2(n)))} probes "
        "(one more where the search ends on BAD unmeasured)"
    )


def _exact_judge(
    session, state: Bisection, instructions_factor: float, memory_factor: float
) -> Judge:
    """Each probe one asv run of the commit, compared with GOOD's results in the same session."""

    def judge(commit: str) -> Probe:
        clock = time.monotonic()
        subject = state.subjects.get(commit, "")
        session.run([commit], BENCHMARKS[state.metric])
        try:
            frame, _ = session.load([state.good, commit])
        except RegressError as exc:
            return _skipped(commit, subject, _skip_reason(str(exc)), time.monotonic() - clock)
        table = compare(
            frame,
            state.good,
            commit,
            memory_factor=memory_factor,
            instructions_factor=instructions_factor,
            metric="instructions" if state.metric == "instructions" else "time",
        )
        return judge_table(table, state.metric, commit, subject, time.monotonic() - clock)

    return judge


def _time_judge(state: Bisection, gate: Callable[..., dict]) -> Judge:
    """Each probe the gate's time verdict on GOOD and the commit.

    ``gate`` is :func:`attnbench.gate.session.regress_many` with the bisection's options bound.
    """

    def judge(commit: str) -> Probe:
        clock = time.monotonic()
        subject = state.subjects.get(commit, "")
        try:
            (outcome,) = gate(state.good, [commit], metric="time", deterministic=False).values()
        except RegressError as exc:
            return _skipped(commit, subject, _skip_reason(str(exc)), time.monotonic() - clock)
        return judge_table(outcome.table, "time", commit, subject, time.monotonic() - clock)

    return judge


def _skip_reason(message: str) -> str:
    """Why a commit gave no results: asv's log line saying so (a build error), else ``message``."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    for line in reversed(lines):
        if (
            re.search(r"(Error|error:|failed|Traceback)", line)
            and "asv produced no results" not in line
        ):
            return f"does not build or measure: {line[:160]}"
    return f"does not build or measure: {lines[0][:160] if lines else 'asv produced no results'}"


# ---- what the command prints ---------------------------------------------------------------------
def probe_line(probe: Probe, number: int, metric: str) -> str:
    """A probe as the command prints it: commit, verdict, worst ratio and case, seconds, subject."""
    ratio = "" if math.isnan(probe.ratio) else f" {text.ratio(probe.ratio, metric)}"
    where = f" ({probe.case})" if probe.case and ratio else ""
    why = (
        f" [{probe.reason}]" if probe.verdict in (ProbeVerdict.SKIP, ProbeVerdict.UNDECIDED) else ""
    )
    return (
        f"probe {number}: {probe.commit[:10]} {probe.verdict}{ratio}{where} "
        f"in {probe.elapsed_s:.0f} s: {probe.subject[:60]}{why}"
    )


def answer(state: Bisection) -> tuple[int, list[str]]:
    """``(exit code, lines)``: 1 a commit named, 0 none exceeds GOOD, 4 a range (or BAD not bad)."""
    probes = len(state.probes)
    took = f"{probes} probe(s) beside GOOD, {state.elapsed_s:.0f} s"
    culprit = state.culprit
    if culprit is not None:
        ratio = text.ratio(culprit.ratio, state.metric)
        return 1, [
            f"first bad commit: {culprit.commit} {ratio} {state.metric} ({culprit.case}) "
            f'"{culprit.subject}"',
            f"  {culprit.reason}",
            f"  {took}",
        ]
    if state.nothing:
        return 0, [
            f"nothing exceeds GOOD {state.good[:10]} by the factor "
            f"up to BAD {state.bad[:10]} ({took})"
        ]
    unresolved = state.unresolved
    verdicts = state.verdicts
    end = verdicts.get(state.candidates[state.high]) if state.high >= 0 else None
    # only BAD itself can be neither good nor bad here
    if end is not None and end.verdict != ProbeVerdict.BAD:
        lines = [
            f"BAD {state.bad[:10]} could not be shown to exceed GOOD: "
            f"{end.verdict} ({end.reason}); {took}"
        ]
        if len(unresolved) > 1:
            lines.append(
                f"  and {len(unresolved) - 1} commit(s) before it could not be judged either:"
            )
            lines += [
                f"  {c[:10]} [{verdicts[c].verdict}: {verdicts[c].reason}]"
                for c in unresolved[:-1]
                if c in verdicts
            ]
        return 4, lines
    lines = [
        f"the first bad commit is one of {len(unresolved)} "
        f"(the search could narrow no further; {took}):"
    ]
    for commit in unresolved:
        probe = verdicts.get(commit)
        mark = f"{probe.verdict}: {probe.reason}" if probe else "not measured"
        lines.append(f"  {commit[:10]} {state.subjects.get(commit, '')[:60]} [{mark}]")
    return 4, lines
