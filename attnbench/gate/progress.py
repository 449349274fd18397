"""Where a long asv run is, as a line that moves: the commit, the benchmark, i of n, the seconds.

A gate run is minutes of asv, and one asv benchmark (the time benchmark of a commit, or the
instruction counts' ``setup_cache``) can take ten of them. asv 0.6.6 writes its progress on stdout
(``asv_runner.console.Log``), each message after ``[ N%]`` (its items done, counting the one under
way) and dots for its depth::

    · Running 8 total benchmarks (2 commits * 1 environments * 4 benchmarks)
    [ 0.00%] · For attnbench commit 1a2b3c4d <main> (round 1/2):
    [ 0.00%] ·· Building for virtualenv-py3.11-...
    [ 0.00%] ·· Benchmarking virtualenv-py3.11-...
    [12.50%] ··· Setting up bench_attention:123                  ok
    [12.50%] ··· Running (bench_attention.Attention.time_attention--)...
    [62.50%] ··· bench_attention.Attention.time_attention        ok

A benchmark's line is written when it starts and ended (``ok``, its value, a table) when it is
done, so it is read as it grows, not line by line: a reader that waited for the newline saw the
line before it (``Benchmarking virtualenv-...``) for as long as the benchmark ran. With rounds, a
round before the last says ``Running (name--)`` at most every 30 s and a dot per benchmark.

:class:`AsvProgress` keeps what the output said so far and words it
(``asv item 3 of 8: commit 1a2b3c4d, round 1 of 2, bench_attention.Attention.time_attention,
95 s in (312 s into this step)``); :meth:`AsvProgress.due` says when to tell it: at least every
``heartbeat_s`` (the seconds in it change, so the line always moves), and as soon as a new item
starts, but no more often than ``min_gap_s`` (nor in a call's first ``min_gap_s``). Pure: fed
text and a clock, it starts nothing (:meth:`attnbench.gate.session.AsvSession.asv` runs asv and
feeds it).
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass, field

__all__ = ["HEARTBEAT_S", "MIN_GAP_S", "AsvProgress", "parameter_sets"]

HEARTBEAT_S = 20.0
"""The most seconds between two progress lines (with the tick's delay, well within 30 s)."""
MIN_GAP_S = 5.0
"""The least seconds between two progress lines: a new item is told at once, a burst is not."""

_LINE = re.compile(r"^(?:\[\s*(?P<pct>\d+(?:\.\d+)?)%\]\s*)?(?P<depth>·+)\s+(?P<msg>.*)$")
"""asv's message line: ``[ 33.33%] ··· message`` (no percentage before it counts anything)."""
_TOTAL = re.compile(r"^Running (?P<n>\d+) total benchmarks")
_COMMIT = re.compile(
    r"^For \S+ commit (?P<hash>[0-9a-f]+)\b.*?(?:\(round (?P<r>\d+)/(?P<of>\d+)\))?:"
)
_SETUP = re.compile(r"^Setting up (?P<key>\S+)")
_ROUND = re.compile(r"^Running \((?P<name>[\w.]+?)--\)")
_BENCHMARK = re.compile(r"^(?P<name>[A-Za-z_]\w*(?:\.\w+)+)(?:\s|$)")
"""A benchmark's own line: its dotted name (``bench_attention.Attention.time_attention  ok``)."""
_PHASES = (
    ("Building for", "installing the commit"),
    ("Benchmarking", "starting its benchmarks"),
    ("Creating", "creating asv's environment"),
    ("Discovering", "discovering the benchmarks"),
    ("Installing", "installing"),
)
"""asv's steps before a benchmark runs, as the progress line names them."""
_MAX_ROUNDS = 10
"""The most rounds :meth:`AsvProgress._rounds` infers (asv's default is 2, the gate's 2)."""
_ANSI = re.compile(r"\x1b\[[0-9;]*m")


@dataclass
class AsvProgress:
    """What asv's output said so far, and the progress line it makes (see the module)."""

    started: float  # the clock when asv started
    heartbeat_s: float = HEARTBEAT_S
    min_gap_s: float = MIN_GAP_S
    total: int = 0  # asv's benchmarks x commits x environments (0: not said yet)
    rounds: int = 0  # asv's rounds where it said them (interleaved: each commit's "(round r/R)")
    round: int = 0
    commit: str = ""
    percent: float | None = None
    doing: str = ""  # the benchmark, setup_cache or step under way
    benchmark: bool = False  # ``doing`` is a benchmark (or its setup_cache), not a step of asv's
    since: float = 0.0  # when it started
    _partial: str = ""  # the line asv is still writing
    _said: tuple[float, tuple] | None = None  # when the last line was told, and of what item
    _item: tuple = field(default_factory=tuple)
    _percents: set[float] = field(default_factory=set)  # every percentage asv wrote
    # per parameterized benchmark of this call: its parameter names and sets (parameter_sets)
    cases: dict[str, tuple[list[str], list[tuple[str, ...]]]] = field(default_factory=dict)
    _case: tuple[tuple, str] | None = None  # the item it was seen in, and "case i of n (...)"

    def feed(self, text: str, now: float) -> None:
        """Read more of asv's stdout (any chunk: a line is read as it grows)."""
        lines = (self._partial + text).split("\n")
        self._partial = lines.pop()
        for line in [*lines, self._partial]:
            self._read(_ANSI.sub("", line).replace("\r", "").strip(), now)

    def _read(self, line: str, now: float) -> None:
        found = _LINE.match(line)
        if not found:
            return
        msg = found.group("msg")
        if found.group("pct") is not None:
            self.percent = float(found.group("pct"))
            self._percents.add(self.percent)
        if total := _TOTAL.match(msg):
            self.total = int(total.group("n"))
        elif commit := _COMMIT.match(msg):
            self.commit = commit.group("hash")[:8]
            if commit.group("of"):
                self.round, self.rounds = int(commit.group("r")), int(commit.group("of"))
            self._start("preparing the commit", now, benchmark=False)
        elif setup := _SETUP.match(msg):
            self._start(f"setup_cache of {setup.group('key')}", now)
        elif running := _ROUND.match(msg):
            self._start(running.group("name"), now)
        elif benchmark := _BENCHMARK.match(msg):
            self._start(benchmark.group("name"), now)
        else:
            phase = next((name for word, name in _PHASES if msg.startswith(word)), None)
            if phase:
                self._start(phase, now, benchmark=False)

    def _start(self, doing: str, now: float, benchmark: bool = True) -> None:
        """``doing`` is under way (a benchmark, or a step between them); its seconds start now
        unless it is what was under way already (a line read again as it grows)."""
        item = (self.commit, self.round, self.percent, doing)
        if item != self._item:
            self._item, self.doing, self.since, self.benchmark = item, doing, now, benchmark

    @property
    def item(self) -> tuple[int, int] | None:
        """``(i, n)``: asv's items counted of all it runs in this call (None: not counting yet).

        asv counts benchmarks x commits x environments, each once per round; its percentage
        counts a benchmark under way, not a step between two.
        """
        n = self.total * self._rounds()
        if not n or self.percent is None:
            return None
        i = round(self.percent / 100 * n)
        return (i, n) if 0 <= i <= n else None

    def _rounds(self) -> int:
        """asv's rounds: as it said them, else the fewest that make every percentage it wrote a
        whole count (rounds it runs one after the other, ``--attribute rounds`` or a time
        benchmark's own 2, it never names)."""
        if self.rounds:
            return self.rounds
        for rounds in range(1, _MAX_ROUNDS + 1):
            n = self.total * rounds
            if all(abs(p / 100 * n - round(p / 100 * n)) < 0.05 for p in self._percents):
                return rounds
        return 1

    def _counted(self) -> str:
        """``asv item 3 of 8`` (a benchmark under way), ``asv, 2 of 8 items done`` (a step between
        two), or asv's percentage where it did not say how many items it runs."""
        if self.item is None:
            return "asv" if self.percent is None else f"asv at {self.percent:.0f}%"
        i, n = self.item
        return f"asv item {i} of {n}" if self.benchmark and i else f"asv, {i} of {n} items done"

    def line(self, now: float) -> str:
        """The progress line: where asv is, and the seconds in it (they always move)."""
        where = [self._counted()]
        if self.commit:
            where.append(f"commit {self.commit}")
        if self.round:
            where.append(f"round {self.round} of {self.rounds}")
        doing = self.doing or "starting"
        if self._case and self._case[0] == self._item:
            doing += f", {self._case[1]}"
        return (
            f"{where[0]}: {', '.join([*where[1:], doing])}, {now - self.since:.0f} s in "
            f"({now - self.started:.0f} s into this step)"
        )

    def due(self, now: float) -> str | None:
        """The line to tell now, or None: at least every ``heartbeat_s``, and when a new item has
        started, but never within ``min_gap_s`` of the last."""
        if self._said is None:
            if now - self.started < self.min_gap_s:  # a short asv call says nothing
                return None
        else:
            last, item = self._said
            fresh = item != self._item
            if now - last < (self.min_gap_s if fresh else self.heartbeat_s):
                return None
        self._said = (now, self._item)
        return self.line(now)

    def note_sample(self, sample: dict) -> None:
        """The time benchmark logged a sample (a line of the gate's probe log): its case, as the
        case i of n asv runs of the benchmark under way, joins the line until the next item."""
        names, sets = self.cases.get(self.doing, ([], []))
        commit = str(sample.get("commit", ""))
        if not names or any(n not in sample for n in names) or not commit.startswith(self.commit):
            return
        key = tuple(repr(v) if isinstance(v, str) else str(v) for v in (sample[n] for n in names))
        if key in sets:
            mode = "bwd" if sample.get("mode") == "backward" else "fwd"
            mask = f" {sample['mask']}" if sample.get("mask", "none") != "none" else ""
            label = f"{sample.get('variant')} L={sample.get('seq_len')} {mode}{mask}"
            self._case = (self._item, f"case {sets.index(key) + 1} of {len(sets)} ({label})")


def parameter_sets(
    benchmarks: dict, pattern: str | None
) -> dict[str, tuple[list[str], list[tuple[str, ...]]]]:
    """Per parameterized benchmark of asv's ``benchmarks.json``: its parameter names, and the sets
    ``asv run --bench pattern`` runs, in the order it runs them.

    asv's own selection (``asv.benchmarks.Benchmarks``): ``re.search`` of the pattern in
    ``name(p1, p2, ...)``, each value as asv writes it (``'sdpa'``, ``1024``).
    """
    out = {}
    for name, bench in benchmarks.items():
        if not isinstance(bench, dict) or not bench.get("params"):
            continue
        sets = [
            combo
            for combo in itertools.product(*bench["params"])
            if not pattern or re.search(pattern, f"{name}({', '.join(combo)})")
        ]
        out[name] = (list(bench.get("param_names", [])), sets)
    return out
