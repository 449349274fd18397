"""What git says of a history's commits: their topological order and subjects.

The one place the history's readers ask git (the analysis and the report start no process): the
command line reads a :class:`~attnbench.analysis.changes.GitLog` here and hands it on.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path

from attnbench.analysis.changes import GitLog

__all__ = ["read_git_log"]


def _git_lines(repo: Path, *args: str) -> list[str] | None:
    try:
        out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.splitlines() if out.returncode == 0 else None


def read_git_log(repo: str | Path | None, commits: Iterable[str]) -> GitLog | None:
    """``repo``'s topological order and the subjects of ``commits``, or None.

    None where ``repo`` is not a directory, no commit is given, or git cannot answer; the subjects
    are read only where the repository knows every one of ``commits`` (else the order is not git's).
    """
    commits = list(dict.fromkeys(commits))
    if repo is None or not Path(repo).is_dir() or not commits:
        return None
    topo = _git_lines(Path(repo), "rev-list", "--topo-order", "--reverse", "--all")
    if topo is None:
        return None
    subjects: dict[str, str] = {}
    if set(commits) <= set(topo):
        log = _git_lines(Path(repo), "log", "--no-walk=unsorted", "--format=%H %s", *commits)
        subjects = dict(line.split(" ", 1) if " " in line else (line, "") for line in log or [])
    return GitLog(repo=Path(repo).resolve(), topo=tuple(topo), subjects=subjects)
