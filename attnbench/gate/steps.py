"""Steps in a results history: where each case's metric moved, commit by commit, and slow drifts.

The regression gate compares two commits; a history (the ``benchmark-results`` branch, or any asv
results directory of several commits) holds many. Per machine, case and metric, in commit order:

* exact metrics (instructions, peak tensor bytes, FLOPs) use the gate's own factors: a **step** is a
  commit beyond the factor from the previous one, a **drift** commits within it one by one but
  beyond it together, over at most ``window`` commits (:func:`exact_changes`);
* time is noisy: asv's step detection turns it into levels first (:func:`time_levels`), and the same
  rules then run on those levels with the time factor;
* a case that ran at one commit and fails or is wrong at the next is a regression of its own kind;
* how cost grows: each commit's exact metrics of a case are fitted along L
  (:func:`attnbench.analysis.growth.exponent_series`), and the exponents form series of their own
  (``peak_tensor_bytes_exponent``): a step moves the exponent by more than
  :data:`~attnbench.analysis.growth.EXPONENT_THRESHOLD`, a drift as much over the window
  (:func:`exponent_changes`).

What a change is and how it reads: :mod:`attnbench.analysis.changes`. Nothing here runs a
benchmark, draws or starts a process: git's order of the commits comes in as a
:class:`~attnbench.analysis.changes.GitLog` (:mod:`attnbench.gate.gitlog` reads it).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import replace

import numpy as np
import pandas as pd

from attnbench.analysis import growth
from attnbench.analysis.changes import (
    CASE,
    DEFAULT_WINDOW,
    METRICS,
    STEP_COLUMNS,
    TIMED,
    Change,
    ChangeKind,
    Direction,
    GitLog,
    History,
    default_factors,
    grid_of,
)
from attnbench.contract import Status

__all__ = [
    "PENALTY",
    "commit_order",
    "exact_changes",
    "exponent_changes",
    "find_steps",
    "history_commits",
    "noise",
    "status_changes",
    "time_levels",
]


def exact_changes(
    values: Sequence[float], factor: float, window: int = DEFAULT_WINDOW
) -> list[Change]:
    """Steps and drifts of one deterministic series (NaN: not measured at that commit), in order.

    A step: ``values[i] / values[previous measured]`` beyond ``factor`` (or below ``1 / factor``). A
    drift: between steps, ``values[i] / min(values[j])`` (or ``/ max``) beyond the factor for a
    ``j`` at most ``window`` commits before ``i``; overlapping detections are one drift, from the
    first commit after its lowest level to the commit of its highest.
    """
    y = np.asarray(values, dtype=float)
    present = [i for i in range(len(y)) if math.isfinite(y[i]) and y[i] > 0]
    changes: list[Change] = []
    segments, begin = [], 0
    for k in range(1, len(present)):
        i, j = present[k], present[k - 1]
        ratio = y[i] / y[j]
        if ratio > factor or ratio < 1 / factor:
            direction = Direction.REGRESSION if ratio > 1 else Direction.IMPROVEMENT
            changes.append(Change(ChangeKind.STEP, direction, i, i, y[j], y[i], start=j))
            segments.append(present[begin:k])
            begin = k
    segments.append(present[begin:])
    for segment in segments:
        changes += _drifts(y, segment, factor, window)
    return sorted(changes, key=lambda c: (c.first, c.kind))


def _drifts(y: np.ndarray, points: list[int], factor: float, window: int) -> list[Change]:
    """Drifts in a segment without steps: moves beyond ``factor`` within ``window`` commits."""
    found: list[Change] = []
    for direction, sign in ((Direction.REGRESSION, 1), (Direction.IMPROVEMENT, -1)):
        spans: list[list[int]] = []
        for k, i in enumerate(points):
            earlier = [j for j in points[:k] if i - j <= window]
            if not earlier:
                continue
            j = min(earlier, key=lambda p: sign * y[p])  # the best level within the window
            if (y[i] / y[j]) ** sign > factor:
                if spans and j <= spans[-1][1]:
                    spans[-1][1] = i
                else:
                    spans.append([j, i])
        # within it of a level is that level: noise does not move a drift's ends
        tolerance = (factor - 1) / 4
        for a, b in spans:
            inside = [p for p in points if a <= p <= b]
            low, high = max(
                ((p, q) for p in inside for q in inside if p < q),
                key=lambda pq: (y[pq[1]] / y[pq[0]]) ** sign,
            )
            start = max(p for p in inside if p < high and _near(y[p], y[low], tolerance))
            end = min(p for p in inside if p > start and _near(y[p], y[high], tolerance))
            first = next(p for p in inside if p > start)
            found.append(
                Change(ChangeKind.DRIFT, direction, first, end, y[start], y[end], start=start)
            )
    return found


def _near(value: float, level: float, tolerance: float) -> bool:
    """``value`` within ``tolerance`` (relative) of ``level``."""
    return abs(value / level - 1) <= tolerance


PENALTY = 2.0
"""The Potts penalty per level change, in units of the series' noise x log(n + 1) (see
:func:`time_levels`). ``python -m studies.step_rates`` simulates how often it names a slow ramp, a
step and pure noise (the README's "Steps in the history" quotes the rates)."""


def noise(values: Sequence[float]) -> float:
    """A robust noise scale of a series: 1.4826 x the MAD of its successive differences / sqrt(2).

    Differences of a piecewise-constant signal are noise except at its few steps, which the median
    ignores (a ramp's are small)."""
    d = np.diff(np.asarray(values, dtype=float))
    if not len(d):
        return 0.0
    return float(1.4826 * np.median(np.abs(d - np.median(d))) / math.sqrt(2))


def time_levels(
    values: Sequence[float], weights: Sequence[float] | None = None, penalty: float = PENALTY
) -> np.ndarray:
    """The piecewise-constant levels asv's Potts solver fits to a series (NaN: not measured).

    :func:`asv.step_detect.solve_potts_approx` (asv 0.6.6: the fit ``asv publish`` runs for its
    regressions page) with the penalty ``penalty x noise x log(n + 1)`` (:func:`noise`), each point
    weighted by asv's rule (2 / the width of its 99% interval) normalised to the median weight, as
    ``detect_steps`` does. Not ``detect_steps``' own choice of penalty: it models the noise as
    correlated (AR(1)) and so takes a slow ramp for noise. Chosen over E-divisive, which needs a
    package or a permutation test of its own, is random, and has little to work with in one median
    per commit.

    A level held by a single commit between two others is an outlier: that commit gets NaN (no
    level), so the exact rules step over it rather than name a step up and a step down (asv's
    ``detect_regressions`` drops such short intervals too).
    """
    from asv.step_detect import solve_potts_approx

    y = np.asarray(
        [float(v) if v is not None and math.isfinite(v) and v > 0 else np.nan for v in values]
    )
    levels = np.full(len(y), np.nan)
    index = np.flatnonzero(np.isfinite(y))
    if not len(index):
        return levels
    points = y[index]
    if weights is None:
        w = np.ones(len(points))
    else:
        raw = np.asarray(
            [float(v) if v is not None and math.isfinite(v) and v > 0 else np.nan for v in weights]
        )[index]
        typical = np.nanmedian(raw) if np.isfinite(raw).any() else 1.0
        w = np.where(np.isfinite(raw), raw / typical, 1.0)
    scale = max(noise(points), 1e-9 * float(np.median(points)))
    gamma = penalty * scale * math.log(len(points) + 1)
    rights, values_, _ = solve_potts_approx(list(points), list(w), gamma=gamma)
    left = 0
    for k, (right, value) in enumerate(zip(rights, values_, strict=True)):
        # an interior one-commit level: an outlier
        if not (0 < k < len(rights) - 1 and right - left == 1):
            levels[index[left:right]] = value
        left = right
    return levels


def status_changes(statuses: Sequence[str]) -> list[Change]:
    """A case that ran (``ok``) at one commit and ``wrong`` or failed at the next measured one."""
    out, previous = [], None
    for i, status in enumerate(statuses):
        if status in ("", Status.SKIPPED, None) or (
            isinstance(status, float) and math.isnan(status)
        ):
            continue
        if previous == Status.OK and status in (Status.WRONG, Status.FAILED):
            out.append(Change(ChangeKind(status), Direction.REGRESSION, i, i, math.nan, math.nan))
        previous = status
    return out


def commit_order(commits: pd.DataFrame, git: GitLog | None = None) -> tuple[pd.DataFrame, str]:
    """``commits`` in history order with ``position`` and ``subject``, and how they were ordered.

    Where ``git`` (:func:`attnbench.gate.gitlog.read_git_log`) knows every commit, its topological
    order (``git rev-list --topo-order``: a parent before its children, whatever the dates say) and
    the commits' subjects; otherwise asv's recorded commit dates (commits of the same second keep
    their hash order, and the order says so).
    """
    commits = commits.drop_duplicates("commit").reset_index(drop=True)
    subjects: dict[str, str] = {}
    order = "commit date (asv's record)"
    ranked = None
    if git is not None and len(commits):
        rank = {c: i for i, c in enumerate(git.topo)}
        if all(c in rank for c in commits["commit"]):
            ranked = commits["commit"].map(rank)
            order = f"git topological order of {git.repo}"
            subjects = git.subjects
    if ranked is None:
        commits = commits.sort_values(["date", "commit"], kind="stable")
        if commits["date"].duplicated().any():
            order += "; commits of the same second are in hash order (give --repo for git's order)"
    else:
        commits = commits.assign(_rank=ranked).sort_values("_rank").drop(columns="_rank")
    commits = commits.reset_index(drop=True)
    commits["position"] = range(len(commits))
    commits["subject"] = commits["commit"].map(lambda c: subjects.get(c, ""))
    return commits, order


def history_commits(frame: pd.DataFrame, metrics: Sequence[str] = METRICS) -> list[str]:
    """The commits :func:`find_steps` orders (those of ``metrics``' rows): what git is asked of."""
    rows = frame[
        frame["metric"].isin(list(metrics)) & frame["commit"].fillna("").astype(str).ne("")
    ]
    return list(dict.fromkeys(rows["commit"]))


def find_steps(
    frame: pd.DataFrame,
    *,
    factors: dict[str, float] | None = None,
    window: int = DEFAULT_WINDOW,
    git: GitLog | None = None,
    metrics: Sequence[str] = METRICS,
) -> History:
    """Every step, drift and failure of ``frame``, a tidy frame of asv results.

    The frame is one :func:`attnbench.analysis.frame.load` returns.

    Args:
        frame: rows of several commits (the rows without a commit, e.g. ``attnbench run``
            directories, are ignored).
        factors: metric -> the factor a value must move by (default :func:`default_factors`, the
            gate's).
        window: commits a drift may spread over.
        git: what a git repository says of the commits, to order them by (see
            :func:`commit_order`; read with :func:`attnbench.gate.gitlog.read_git_log`).
        metrics: which metrics to read (default :data:`METRICS`).

    Raises:
        ValueError: a factor that is not a finite number > 1, or a window < 2.
    """
    from attnbench.analysis.significance import check_factor

    factors = {**default_factors(), **(factors or {})}
    for name in metrics:
        check_factor(f"{name} factor", factors[name])
    if window < 2:
        raise ValueError(f"window must be at least 2 commits, got {window}")
    rows, commits, order = _rows_by_commit(frame, metrics, git)
    levels, found = [], []
    for key, group in rows.groupby([*CASE, "metric"], sort=True):
        metric = key[-1]
        values, statuses, weights = _series(group, len(commits))
        level = time_levels(values, weights) if metric in TIMED else values
        changes = exact_changes(level, factors[metric], window) + status_changes(statuses)
        levels.append(group.assign(level=group["position"].map(lambda p, lv=level: lv[p])))
        case = dict(zip(CASE, key[:-1], strict=True))
        found += [_step_row(case, metric, change, commits, factors[metric]) for change in changes]
    exponent_levels, exponent_found = exponent_changes(rows, commits, window)
    levels, found = levels + exponent_levels, found + exponent_found
    steps = pd.DataFrame(found, columns=STEP_COLUMNS)
    if len(steps):  # regressions first, then by where they happened
        steps = steps.sort_values(
            ["direction", "first_pos", "variant", "seq_len", "metric"],
            ascending=[False, True, True, True, True],
            kind="stable",
        ).reset_index(drop=True)
    series = pd.concat(levels, ignore_index=True) if levels else rows.assign(level=np.nan)
    series["grid"] = series["benchmark"].map(grid_of)
    if len(steps):
        steps.insert(1, "grid", steps["benchmark"].map(grid_of))
    return History(
        commits=commits, series=series, steps=steps, factors=factors, window=window, order=order
    )


def exponent_changes(
    rows: pd.DataFrame, commits: pd.DataFrame, window: int = DEFAULT_WINDOW
) -> tuple[list[pd.DataFrame], list[dict]]:
    """Each case's fitted exponents of L along the commits, and their steps and drifts.

    ``rows`` carry ``position`` (:func:`_rows_by_commit`). An exponent is a power, so a change is
    a difference, not a ratio: :func:`exact_changes` runs on exp(exponent) with the factor
    exp(threshold), and the changes are read back as exponents (``before``, ``after``).

    Returns:
        the series' rows (``metric`` ``<metric>_exponent``, no length, ``value`` and ``level`` the
        exponent, ``ci_low``/``ci_high`` its local slopes' range) and their change rows.
    """
    fits = growth.exponent_series(rows)
    if not len(fits):
        return [], []
    fits["position"] = fits["commit"].map(
        dict(zip(commits["commit"], commits["position"], strict=True))
    )
    keys = [c for c in growth.SERIES if c != "commit"]
    threshold = growth.EXPONENT_THRESHOLD
    levels, found = [], []
    for key, group in fits.groupby(keys, sort=True):
        values = np.full(len(commits), np.nan)
        values[group["position"].to_numpy(int)] = group["exponent"].to_numpy(float)
        case = {**dict(zip(keys[:-1], key[:-1], strict=True)), "seq_len": "", "seq_len_k": ""}
        metric = growth.exponent_metric(key[-1])
        for change in exact_changes(np.exp(values), math.exp(threshold), window):
            exponents = replace(
                change, before=math.log(change.before), after=math.log(change.after)
            )
            found.append(_step_row(case, metric, exponents, commits, threshold))
        levels.append(
            group.assign(**case, metric=metric, value=group["exponent"], level=group["exponent"])
            .assign(status=Status.OK, ci_low=group["low"], ci_high=group["high"])
            .drop(columns=["exponent", "low", "high", "shortest", "longest"])
        )
    return levels, found


def _rows_by_commit(
    frame: pd.DataFrame, metrics: Sequence[str], git: GitLog | None
) -> tuple[pd.DataFrame, pd.DataFrame, str]:
    """The rows of ``metrics`` that name a commit, with its ``position``, and the commit order.

    One row per case, metric and commit (the last loaded); the commits and how they were ordered
    come from :func:`commit_order`."""
    rows = frame[
        frame["metric"].isin(list(metrics)) & frame["commit"].fillna("").astype(str).ne("")
    ].copy()
    commits, order = commit_order(
        rows.groupby("commit", as_index=False).agg(date=("date", "min")), git
    )
    position = dict(zip(commits["commit"], commits["position"], strict=True))
    rows["position"] = rows["commit"].map(position)
    for col in CASE:
        rows[col] = rows[col].astype(object).where(rows[col].notna(), "")
    rows = rows.sort_values("position", kind="stable").drop_duplicates(
        [*CASE, "metric", "position"], keep="last"
    )
    return rows, commits, order


def _series(group: pd.DataFrame, n: int) -> tuple[np.ndarray, list[str], np.ndarray]:
    """One series' values (NaN: not ok), statuses ("": not run) and asv weights, by position."""
    values = np.full(n, np.nan)
    statuses: list[str] = [""] * n
    weights = np.full(n, np.nan)
    for rec in group.itertuples(index=False):
        statuses[rec.position] = rec.status
        if rec.status == Status.OK:
            values[rec.position] = rec.value
            width = rec.ci_high - rec.ci_low
            # asv's own weight (asv._stats.get_weight)
            weights[rec.position] = 2 / width if width > 0 else np.nan
    return values, statuses, weights


def _step_row(
    case: dict, metric: str, change: Change, commits: pd.DataFrame, factor: float
) -> dict:
    """One change of one case's metric as a row of :attr:`History.steps` (but its ``grid``)."""
    return {
        **case,
        "metric": metric,
        "kind": change.kind,
        "direction": change.direction,
        "first": commits["commit"].iloc[change.first],
        "last": commits["commit"].iloc[change.last],
        "first_pos": change.first,
        "last_pos": change.last,
        "commits": change.last - change.first + 1,
        "before": change.before,
        "after": change.after,
        "ratio": change.ratio,
        "factor": factor,
    }
