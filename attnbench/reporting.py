"""load -> analyse -> render, the report's whole pipeline, with git's order of a history's commits.

:mod:`attnbench.report` only draws and writes; the analysis starts no process. This module asks
git (:mod:`attnbench.gate.gitlog`) for the order of a history's commits, in the current
directory's repository as the command line always has, and hands it to
:func:`~attnbench.analysis.summary.analyse`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from attnbench.analysis.summary import analyse, history_commits_of, load_results
from attnbench.gate.gitlog import read_git_log
from attnbench.report.html import render
from attnbench.report.markup import ReportOutcome

__all__ = ["build_report", "make_report"]


def make_report(
    sources: Iterable[str | Path],
    out_dir: str | Path,
    title: str = "attnbench report",
    demos: bool = False,
    repo: str | Path | None = None,
) -> ReportOutcome:
    """Load, analyse and render: ``render(analyse(load_results(sources), git), ...)``.

    A history's commits are ordered by ``repo``'s git (default: the current directory's), where it
    knows them all; else by asv's recorded dates.
    """
    loaded = load_results(sources)
    commits = history_commits_of(loaded.frame)
    git = read_git_log(Path.cwd() if repo is None else repo, commits) if commits else None
    return render(analyse(loaded, git), out_dir, title, demos=demos)


def build_report(
    sources: Iterable[str | Path],
    out_dir: str | Path,
    title: str = "attnbench report",
    demos: bool = False,
) -> Path:
    """Load ``sources`` (asv results dirs and/or run dirs), analyse, draw, and write the report.

    Returns:
        Path of ``report.html`` inside ``out_dir`` (which also receives ``figures/``,
        ``tidy.csv``, ``fits.csv`` and ``problems.json``). :func:`make_report` also says what
        loaded.
    """
    return make_report(sources, out_dir, title, demos=demos).page
