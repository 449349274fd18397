"""How cost grows from BASE to HEAD: each side's fitted exponent and cost split, and the ratio they
predict at the length users run.

The gate measures at short lengths (the CI grid's L = 256..1024) and compares ratios against
factors. A change that adds an O(L²) buffer with a small constant stays within x1.1 of peak bytes at
L=1024 and costs 50x at L=128K. So for every exact metric (instruction counts, peak tensor bytes,
FLOPs) of every case, each side is fitted over the lengths it measured, with the project's own
fitters (:func:`attnbench.analysis.complexity.fit_deterministic` for the exponent,
:func:`~attnbench.analysis.complexity.cost_split` for c0 + c1·L + c2·L²), and judged by
:func:`judge`:

* the **predicted ratio** HEAD / BASE at the target length (:data:`AT_LENGTH`) regresses beyond the
  metric's own factor; the least ratio the metric's noise (:data:`NOISE`) allows must exceed it, so
  a count that moved by its A/A spread never extrapolates into a verdict;
* the **exponent** grows by more than :data:`EXPONENT_THRESHOLD` while HEAD costs more at the target
  (an exponent that rises because a constant cost went away is an improvement, not a regression).

Nothing here runs a benchmark: :mod:`attnbench.gate.decision` calls :func:`growth_rows` on its
table, :func:`exponent_series` feeds the history and the export.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from attnbench import contract
from attnbench.analysis import text
from attnbench.analysis.complexity import CostSplit, cost_split, fit_deterministic
from attnbench.contract import DETERMINISTIC_POINTS, Basis, GateVerdict, Status

__all__ = [
    "GROWTH_METRICS",
    "AT_LENGTH",
    "NOISE",
    "EXPONENT_THRESHOLD",
    "exponent_text",
    "fit_side",
    "judge",
    "growth_rows",
    "EXPONENT_SUFFIX",
    "exponent_metric",
    "SERIES",
    "exponent_series",
    "moved_series",
]

GROWTH_METRICS = ("instructions", "peak_tensor_bytes", "flops")
"""The exact metrics whose growth along L is judged (time is too noisy to extrapolate)."""
AT_LENGTH: dict[str, int] = {"prefill": 131072, "decode": 131072}
"""The length the predicted ratio is taken at, per workload (``--at-length`` overrides it).

Prefill: 128K tokens is the context length long-context models are served at, and what attention's
quadratic terms cost there is the point of this project. Decode: one step attends the cache the
prefill left, so the same 128K keys (``run-decode``'s longest length too); a decode step's cost is
linear in the cache, so a further length would change no verdict an O(L) term does not already."""
NOISE: dict[str, float] = {"instructions": 3e-4}
"""Per metric, the largest relative error of one value: docs/regression.md measured the
same case counted twice in one process to differ by up to 0.03%. Peak tensor bytes and FLOPs are
exact (0)."""
EXPONENT_THRESHOLD = 0.02
"""How far a fitted exponent may grow before it is a regression by itself.

The A/A spread: over the gate's three lengths (a factor 4) the least-squares slope of log(value)
moves by at most ``NOISE / ln 2`` per side when every value is off by up to ``NOISE``: 4.3e-4 for
counts, 9e-4 for the difference of two sides (``test_growth.py`` measures it on noisy rows), 0 for
bytes and FLOPs. 0.02 is over 20x that, and it is what matters: an exponent 0.02 higher compounds to
128^0.02 = x1.10 between L=1024 and L=131072, the memory factor."""


def exponent_text(exponent: float) -> str:
    """``L^1.93`` (``L^?`` where there is no fit)."""
    return f"L^{exponent:.2f}" if math.isfinite(exponent) else "L^?"


@dataclass(frozen=True)
class _SideFit:
    """One side's metric along L: the fitted exponent, its local slopes' range, the cost split."""

    lengths: tuple[int, ...]
    values: tuple[float, ...]
    exponent: float
    low: float  # the least local slope over the fitted lengths
    high: float  # the largest
    split: CostSplit

    def at(self, length: float) -> float:
        """The cost split's value at ``length``: c0 + c1·L + c2·L²."""
        s = self.split
        return s.c0 + s.c1 * length + s.c2 * length**2

    def bounds_at(self, length: float, noise: float) -> tuple[float, float]:
        """The least and largest prediction at ``length`` when each value is off by up to ``noise``.

        Every corner of the box (each value scaled by 1 ± noise) is fitted again: the fit is
        linear in the values, so the extremes of its prediction lie at corners.
        """
        if noise <= 0:
            value = self.at(length)
            return value, value
        lengths, values = np.array(self.lengths, float), np.array(self.values, float)
        predictions = []
        for signs in itertools.product((-1.0, 1.0), repeat=len(values)):
            split = cost_split(lengths, values * (1 + noise * np.array(signs)))
            if split is not None:
                predictions.append(split.c0 + split.c1 * length + split.c2 * length**2)
        return min(predictions), max(predictions)


def fit_side(lengths: Sequence[float], values: Sequence[float]) -> _SideFit | None:
    """The exponent and cost split of one side (None: fewer than three positive values).

    Args:
        lengths: the sequence lengths measured.
        values: the metric at each length (NaN or <= 0: not measured).
    """
    x, y = np.asarray(lengths, float), np.asarray(values, float)
    keep = np.isfinite(y) & (y > 0) & np.isfinite(x) & (x > 0)
    x, y = x[keep], y[keep]
    if len(np.unique(x)) < DETERMINISTIC_POINTS:
        return None
    split = cost_split(x, y)
    fit = fit_deterministic(x, y)
    if split is None or not math.isfinite(fit["exponent"]):
        return None
    order = np.argsort(x)
    return _SideFit(
        lengths=tuple(int(v) for v in x[order]),
        values=tuple(float(v) for v in y[order]),
        exponent=float(fit["exponent"]),
        low=float(fit["ci_low"]),
        high=float(fit["ci_high"]),
        split=split,
    )


@dataclass(frozen=True)
class _Growth:
    """One case's metric, BASE against HEAD: exponents, measured and predicted ratios, verdict."""

    metric: str
    base: _SideFit
    head: _SideFit
    at_length: int
    factor: float
    predicted_ratio: float  # HEAD / BASE of the cost splits at ``at_length``
    low: float  # the least predicted ratio the metric's noise allows
    high: float  # the largest
    measured_ratio: float  # HEAD / BASE at the longest length both measured
    measured_length: int
    verdict: GateVerdict  # ok or regressed
    improved: bool  # the predicted ratio below 1 / factor, whatever the noise
    threshold: float = EXPONENT_THRESHOLD  # how far the exponent may grow

    @property
    def exponent_change(self) -> float:
        return self.head.exponent - self.base.exponent

    @property
    def _fired(self) -> list[tuple[str, str]]:
        """Each rule that regressed the series: ``(what it saw, the limit it passed)``."""
        fired = []
        if self.low > self.factor:  # FLOPs' factor is 1 + 1e-9: no growth
            fired.append(
                (
                    f"predicted {text.ratio(self.predicted_ratio, self.metric)} "
                    f"at L={self.at_length}",
                    f"x{self.factor:.10g}",
                )
            )
        if self.exponent_change > self.threshold and self.low > 1:
            fired.append((f"exponent {self.exponent_change:+.2f}", f"+{self.threshold:g}"))
        return fired

    @property
    def rule(self) -> str:
        """Which rule regressed the series, in the words a reader checks it by ("" when neither).

        ``predicted x14.30 at L=131072``, ``exponent +0.04``, or both joined by "and": an exponent
        that went down beside a regression then reads as what it is, not as the cause.
        """
        return " and ".join(seen for seen, _ in self._fired)

    @property
    def reason(self) -> str:
        """The rule that fired first, then the figures behind it.

        ``predicted x14.30 at L=131072 beyond x1.1 (L^1.00 -> L^1.93; measured x1.06 at L=1024)``;
        a series within both rules: ``within x1.1 and +0.02: predicted x1.00 at L=131072, L^2.00 ->
        L^2.00; measured x1.00 at L=1024``.
        """
        change = f"{exponent_text(self.base.exponent)} -> {exponent_text(self.head.exponent)}"
        measured = (
            f"measured {text.ratio(self.measured_ratio, self.metric)} at L={self.measured_length}"
        )
        if self._fired:
            beyond = " and ".join(f"{seen} beyond {limit}" for seen, limit in self._fired)
            return f"{beyond} ({change}; {measured})"
        predicted = text.ratio(self.predicted_ratio, self.metric)
        return (
            f"within x{self.factor:.10g} and +{self.threshold:g}: predicted {predicted} at "
            f"L={self.at_length}, {change}; {measured}"
        )


def judge(
    base: _SideFit,
    head: _SideFit,
    *,
    metric: str,
    factor: float,
    at_length: int,
    threshold: float = EXPONENT_THRESHOLD,
    noise: float | None = None,
) -> _Growth:
    """The verdict on how one case's ``metric`` grows from ``base`` to ``head`` (see the module).

    Args:
        base, head: each side's fit (:func:`fit_side`).
        metric: the metric's name (its noise: :data:`NOISE`, unless ``noise`` is given).
        factor: the ratio the metric may reach (the gate's own factor for it).
        at_length: the length to predict the ratio at.
        threshold: how far the exponent may grow (:data:`EXPONENT_THRESHOLD`).
        noise: the largest relative error of one value (default: the metric's).

    Raises:
        ValueError: ``at_length`` not a positive integer, or ``factor`` not a finite number > 1.
    """
    if isinstance(at_length, bool) or not isinstance(at_length, (int, np.integer)) or at_length < 1:
        raise ValueError(f"at_length must be a positive integer, got {at_length!r}")
    if not (math.isfinite(factor) and factor > 1):
        raise ValueError(f"factor must be a finite number > 1, got {factor!r}")
    noise = NOISE.get(metric, 0.0) if noise is None else noise
    base_at, head_at = base.at(at_length), head.at(at_length)
    predicted = head_at / base_at if base_at > 0 else math.inf
    (base_low, base_high), (head_low, head_high) = (
        base.bounds_at(at_length, noise),
        head.bounds_at(at_length, noise),
    )
    low = head_low / base_high if base_high > 0 else math.inf
    high = head_high / base_low if base_low > 0 else math.inf
    common = sorted(set(base.lengths) & set(head.lengths))
    longest = common[-1] if common else max(base.lengths)
    measured = (
        head.values[head.lengths.index(longest)] / base.values[base.lengths.index(longest)]
        if common
        else math.nan
    )
    grew = head.exponent - base.exponent > threshold and low > 1
    return _Growth(
        metric=metric,
        base=base,
        head=head,
        at_length=int(at_length),
        factor=factor,
        predicted_ratio=predicted,
        low=low,
        high=high,
        measured_ratio=measured,
        measured_length=longest,
        verdict=GateVerdict.REGRESSED if low > factor or grew else GateVerdict.OK,
        improved=high < 1 / factor,
        threshold=threshold,
    )


_GROWTH_COLUMNS = ["base_exponent", "head_exponent", "predicted_ratio", "at_length"]
"""Columns :func:`growth_rows` gives every row of the gate's table of an exact metric."""
_LENGTH_FREE = ["benchmark", "variant", "device", "mode", "mask", "metric"]
"""A case without its length, and the metric: one series along L."""


def _at_length_of(workload: object, at_length: int | None) -> int:
    """``at_length`` where given, else :data:`AT_LENGTH` of ``workload`` (prefill's by default)."""
    if at_length is not None:
        return at_length
    return AT_LENGTH.get(str(workload), AT_LENGTH["prefill"])


def growth_rows(
    table: pd.DataFrame,
    factor_of: Callable[[str], float],
    at_length: int | None = None,
    threshold: float = EXPONENT_THRESHOLD,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The gate's side-by-side ``table`` with the growth columns, and one predicted row per series.

    A series is a case without its length and an exact metric, measured ``ok`` on both sides at
    three lengths or more. Its predicted row has ``seq_len`` = the target length, the cost splits'
    values there as ``base_value``/``head_value``, the predicted ratio as ``ratio``, ``basis``
    "predicted" and :func:`judge`'s verdict and reason; the measured rows of the series get
    ``basis`` "measured" and the series' exponents and predicted ratio beside their own ratio.

    Args:
        table: rows with ``benchmark``, ``variant``, ``seq_len``, ``device``, ``mode``, ``mask``,
            ``metric``, ``base_value``, ``head_value``, ``base_status``, ``head_status`` (and
            ``workload`` where known).
        factor_of: a metric's factor.
        at_length: the target length (None: :data:`AT_LENGTH` of each row's workload).
        threshold: :data:`EXPONENT_THRESHOLD` unless given.
    """
    table = table.assign(basis=Basis.MEASURED, **{c: math.nan for c in _GROWTH_COLUMNS})
    predicted = []
    exact = table[table["metric"].isin(GROWTH_METRICS)]
    for key, rows in exact.groupby(_LENGTH_FREE, sort=True, dropna=False):
        target = _at_length_of(rows["workload"].iloc[0] if "workload" in rows else "", at_length)
        growth = _judge_rows(rows, key[-1], factor_of(key[-1]), target, threshold)
        if growth is None:
            continue
        table.loc[rows.index, _GROWTH_COLUMNS] = [
            growth.base.exponent,
            growth.head.exponent,
            growth.predicted_ratio,
            target,
        ]
        predicted.append(_predicted_row(dict(zip(_LENGTH_FREE, key, strict=True)), growth))
    return table, pd.DataFrame(predicted)


def _judge_rows(
    rows: pd.DataFrame, metric: str, factor: float, at_length: int, threshold: float
) -> _Growth | None:
    """:func:`judge` on one series' rows (None: a side with fewer than three ``ok`` lengths)."""
    sides = []
    for side in ("base", "head"):
        ok = rows[rows[f"{side}_status"] == Status.OK]
        sides.append(fit_side(ok["seq_len"].astype(float), ok[f"{side}_value"].astype(float)))
    if sides[0] is None or sides[1] is None:
        return None
    return judge(
        sides[0], sides[1], metric=metric, factor=factor, at_length=at_length, threshold=threshold
    )


def _predicted_row(case: dict, growth: _Growth) -> dict:
    """The table row of one series' prediction (see :func:`growth_rows`)."""
    return {
        **case,
        "seq_len": growth.at_length,
        "base_value": growth.base.at(growth.at_length),
        "head_value": growth.head.at(growth.at_length),
        "base_status": Status.OK,
        "head_status": Status.OK,
        "ratio": growth.predicted_ratio,
        "verdict": growth.verdict,
        "reason": growth.reason,
        "rule": growth.rule,
        "improved": growth.improved,
        "note": "",
        "basis": Basis.PREDICTED,
        "base_exponent": growth.base.exponent,
        "head_exponent": growth.head.exponent,
        "predicted_ratio": growth.predicted_ratio,
        "at_length": growth.at_length,
        "measured_ratio": growth.measured_ratio,
        "measured_length": growth.measured_length,
    }


EXPONENT_SUFFIX = "_exponent"
"""A history's series of fitted exponents is named after its metric (``flops_exponent``)."""


def exponent_metric(metric: str) -> str:
    """The name of ``metric``'s exponent series in a history (``flops`` -> ``flops_exponent``)."""
    return f"{metric}{EXPONENT_SUFFIX}"


SERIES = (
    "benchmark",
    *contract.case_columns(without=contract.LENGTHS),
    "metric",
    "commit",
)
"""One series along L of a results frame: a commit's case without its length (every other column of
the case's identity, so two dtypes or head dims are never fitted as one), and its metric."""


def exponent_series(frame: pd.DataFrame) -> pd.DataFrame:
    """Per commit, case (without its length) and exact metric, the exponent fitted along L.

    The length is ``seq_len_k`` where a row has it (decode: a few queries over Lk keys), else
    ``seq_len``; only ``ok`` rows count, and a series with fewer than three lengths has no row.

    Returns:
        the :data:`SERIES` columns, ``exponent``, ``low`` and ``high`` (the local slopes' range
        over the fitted lengths), ``shortest`` and ``longest`` (the lengths fitted) and ``date``
        (the commit's, where the frame has it).
    """
    columns = [*SERIES, "exponent", "low", "high", "shortest", "longest", "date"]
    rows = frame[frame["metric"].isin(GROWTH_METRICS) & (frame["status"] == Status.OK)]
    if not len(rows):
        return pd.DataFrame(columns=columns)
    rows = rows.assign(
        **{c: rows[c].astype(object).where(rows[c].notna(), "") for c in SERIES if c in rows},
        **{c: "" for c in SERIES if c not in rows},
    )
    short = rows["seq_len_k"] if "seq_len_k" in rows else pd.Series(math.nan, index=rows.index)
    rows = rows.assign(_length=pd.to_numeric(short, errors="coerce").fillna(rows["seq_len"]))
    out = []
    for key, group in rows.groupby(list(SERIES), sort=True):
        group = group.drop_duplicates("_length", keep="last")
        fit = fit_side(group["_length"].astype(float), group["value"].astype(float))
        if fit is None:
            continue
        out.append(
            {
                **dict(zip(SERIES, key, strict=True)),
                "exponent": fit.exponent,
                "low": fit.low,
                "high": fit.high,
                "shortest": fit.lengths[0],
                "longest": fit.lengths[-1],
                "date": group["date"].min() if "date" in group else pd.NaT,
            }
        )
    return pd.DataFrame(out, columns=columns)


def moved_series(table: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """The gate table's growth rows (``predicted``) and those the gate's summaries list: regressed,
    improved, or with an exponent that moved by half :data:`EXPONENT_THRESHOLD` or more. Both are
    empty when the table has no growth rows."""
    if "basis" not in table.columns:
        return table.iloc[0:0], table.iloc[0:0]
    predicted = table[table["basis"] == Basis.PREDICTED]
    change = predicted["head_exponent"] - predicted["base_exponent"]
    moved = predicted[
        (predicted["verdict"] == GateVerdict.REGRESSED)
        | (change.abs() >= EXPONENT_THRESHOLD / 2)
        | predicted["improved"].fillna(False).astype(bool)
    ]
    return predicted, moved
