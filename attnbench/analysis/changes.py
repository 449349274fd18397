"""The vocabulary of a results history's changes: what moved a case, which way, and how it reads.

A history (the ``benchmark-results`` branch, or any asv results directory of several commits) is
read by :func:`attnbench.gate.steps.find_steps` into a :class:`History`: per machine, case and
metric, the commits where a value stepped or drifted beyond the gate's factor, or where a case
stopped running. This module holds what those readings are (:class:`ChangeKind`,
:class:`Direction`, :class:`Change`, :class:`History`) and how a change is named in a table, a
figure or a summary (:func:`case_label`, :func:`_ratio_text`, :func:`table`).

Nothing here runs a benchmark, a process or draws: :mod:`attnbench.report` draws,
:mod:`attnbench.gate.markdown` writes the summary, ``attnbench history`` prints.
"""

from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import growth, text

__all__ = [
    "CASE",
    "DEFAULT_WINDOW",
    "FIGURE_CASE",
    "METRICS",
    "STEP_COLUMNS",
    "TIMED",
    "Change",
    "ChangeKind",
    "Direction",
    "GitLog",
    "History",
    "case_label",
    "default_factors",
    "grid_of",
    "table",
]

DEFAULT_WINDOW = 10
"""Commits a drift may spread over.

Counts do not wander by themselves (an unchanged commit counts alike far within the gate's factor:
docs/regression.md), so a long window adds no false drift."""
_EXACT = ("instructions", "peak_tensor_bytes", "flops")
"""Deterministic metrics: exact rules on the values themselves."""
TIMED = ("time",)
"""Noisy metrics: levels from asv's step detection first."""
METRICS = (*_EXACT, *TIMED)
_MAIN_GRID_CLASSES = (
    "Attention",
    "AttentionMetrics",
    "AttentionAccuracy",
    "AttentionCuda",
    "Instructions",
)
"""The asv classes of the main grid's shape; a case label names the class of any other."""
CASE = ("machine", "benchmark", *contract.ASV_CASE)
"""What makes one series (with ``metric``): a machine's benchmark at one parameter set."""
STEP_COLUMNS = [
    *CASE,
    "metric",
    "kind",
    "direction",
    "first",
    "last",
    "first_pos",
    "last_pos",
    "commits",
    "before",
    "after",
    "ratio",
    "factor",
]


def default_factors() -> dict[str, float]:
    """The factor each metric's value must move by (the gate's defaults)."""
    return {
        "instructions": contract.INSTRUCTIONS_FACTOR,
        "peak_tensor_bytes": contract.MEMORY_FACTOR,
        "flops": contract.FLOPS_FACTOR,
        "time": contract.TIME_FACTOR,
    }


class ChangeKind(enum.StrEnum):
    """What moved a series at a commit (the ``kind`` column of :attr:`History.steps`)."""

    STEP = "step"  # beyond the factor from the previous commit
    DRIFT = "drift"  # beyond it over several commits, none of them alone
    FAILED = "failed"  # ran at the previous commit, failed at this one (its status: failed)
    WRONG = "wrong"  # right at the previous commit, wrong at this one (its status: wrong)


class Direction(enum.StrEnum):
    """Which way a change went (the ``direction`` column)."""

    REGRESSION = "regression"
    IMPROVEMENT = "improvement"


@dataclass(frozen=True)
class Change:
    """One step, drift or failure in one series, by positions in the commit order."""

    kind: ChangeKind
    direction: Direction
    first: int  # position of the first commit of the change (a step: the commit itself)
    last: int  # position of the last commit of the change
    before: float  # the level before it
    after: float  # the level it reached
    start: int = -1  # position of the commit that held ``before`` (the level it is measured from)

    @property
    def ratio(self) -> float:
        return self.after / self.before if self.before else math.nan


# ---- a results history ---------------------------------------------------------------------------
@dataclass(frozen=True)
class GitLog:
    """What a git repository says of a history's commits (read by :mod:`attnbench.gate.gitlog`).

    The analysis orders commits by it and starts no process itself."""

    repo: Path  # the repository, resolved
    topo: tuple[str, ...]  # every commit, a parent before its children (rev-list --topo-order)
    subjects: dict[str, str] = field(default_factory=dict)  # commit -> subject line


@dataclass(frozen=True)
class History:
    """The steps of a results history and what they were read from."""

    # commit, date, position (0 = oldest), subject ("" when no repository knows it)
    commits: pd.DataFrame
    # the rows read (ok or not), with ``position`` and ``level`` (the value the rules saw)
    series: pd.DataFrame
    steps: pd.DataFrame  # STEP_COLUMNS, one row per change
    factors: dict[str, float] = field(default_factory=default_factors)
    window: int = DEFAULT_WINDOW
    order: str = ""  # how the commits were ordered (said in the table's caption)

    @property
    def regressions(self) -> pd.DataFrame:
        return self.steps[self.steps["direction"] == Direction.REGRESSION]

    @property
    def improvements(self) -> pd.DataFrame:
        return self.steps[self.steps["direction"] == Direction.IMPROVEMENT]

    def subject(self, commit: str) -> str:
        rows = self.commits[self.commits["commit"] == commit]
        return str(rows["subject"].iloc[0]) if len(rows) else ""


FIGURE_CASE = ("machine", "grid", *contract.ASV_CASE)
"""What one history figure shows: a case's metrics (``grid``: :func:`grid_of` its benchmark)."""


def grid_of(benchmark: object) -> str:
    """The asv class a benchmark's shape is (``Decode``), or "" for the main grid's classes."""
    parts = str(benchmark).split(".")
    cls = parts[-2] if len(parts) >= 2 else ""
    return "" if cls in _MAIN_GRID_CLASSES else cls


def case_label(rec: dict | pd.Series) -> str:
    """``batched L=256`` (with the device, mode and mask where they are not cpu, forward, none)."""
    length = rec.get("seq_len")
    parts = [str(rec.get("variant", ""))]
    length_k = rec.get("seq_len_k")
    known = [v not in ("", None) and not pd.isna(v) for v in (length, length_k)]
    # decode: a few queries over a cache of Lk keys
    if known[1] and (not known[0] or int(length_k) != int(length)):
        parts.append(f"Lk={length_k}")
    elif known[0]:
        parts.append(f"L={length}")
    parts += [
        str(rec[c])
        for c, usual in (("device", "cpu"), ("mode", "forward"), ("mask", "none"))
        if rec.get(c) not in ("", None, usual)
    ]
    grid = rec.get("grid") if "grid" in rec else grid_of(rec.get("benchmark", ""))
    if grid:  # Decode, GroupedQuery: another shape than the main grid's
        parts.append(f"({grid})")
    return " ".join(parts)


def _ratio_text(rec: dict | pd.Series) -> str:
    """The ratio with the digits its metric needs (counts: 4; a 0.2% change is a verdict)."""
    if rec["kind"] in (ChangeKind.FAILED, ChangeKind.WRONG):
        return rec["kind"]
    if str(rec["metric"]).endswith(growth.EXPONENT_SUFFIX):  # a power: from one to the other
        return f"{growth.exponent_text(rec['before'])} -> {growth.exponent_text(rec['after'])}"
    return text.ratio(rec["ratio"], rec["metric"])


def _commits_text(rec: dict | pd.Series, short: int = 8) -> str:
    """``abc12345`` for a step, ``abc12345..def67890 (5 commits)`` for a drift."""
    if rec["first"] == rec["last"]:
        return str(rec["first"])[:short]
    return f"{str(rec['first'])[:short]}..{str(rec['last'])[:short]} ({rec['commits']} commits)"


def table(history: History) -> pd.DataFrame:
    """The printed table: commit(s), case, metric, ratio, what it is (one row per change)."""
    steps = history.steps
    if not len(steps):
        return pd.DataFrame(columns=["commit", "case", "metric", "ratio", "change", "subject"])
    return pd.DataFrame(
        {
            "commit": [_commits_text(r) for r in steps.to_dict("records")],
            "case": [case_label(r) for r in steps.to_dict("records")],
            "metric": steps["metric"].to_numpy(),
            "ratio": [_ratio_text(r) for r in steps.to_dict("records")],
            "change": (steps["direction"] + " (" + steps["kind"] + ")").to_numpy(),
            "subject": [history.subject(c) for c in steps["first"]],
        }
    )
