"""Claims from a tidy frame: fitted exponents against declared ones, crossovers, memory model.

A sampled metric (time) is fitted by :data:`FIT_RULE`, which the report prints: Theil-Sen over the
points above the overhead floor with a bootstrap interval; too few points or too wide an interval is
*inconclusive*, never a match. Exact metrics (bytes, FLOPs, instruction counts) have a rule of their
own (:func:`fit_deterministic`), and every fit carries the cost split c0 + c1·L + c2·L²
(:func:`cost_split`) that explains a slope shallower than declared. Only ``ok``, measured rows are
fitted or compared: never ``wrong`` or ``noisy`` cases, nor predicted values (method "model"), which
would only agree with themselves. The roofline is :mod:`.roofline`.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from scipy import optimize, stats

from attnbench import contract
from attnbench.analysis.text import agree, count
from attnbench.contract import (
    DECLARED,
    DETERMINISTIC_POINTS,
    FITTED,
    METRICS,
    SWEPT_LENGTH,
    WORKLOADS,
    Method,
    Status,
)
from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

if TYPE_CHECKING:
    from attnbench.variants.base import Variant

__all__ = [
    "FLOOR_FACTOR",
    "MIN_POINTS",
    "MAX_CI_WIDTH",
    "TOLERANCE",
    "CLIP",  # CLIP, OUTLIER and BOOTSTRAP: FIT_RULE, which the report prints, quotes their values
    "OUTLIER",
    "BOOTSTRAP",
    "MODEL",
    "GROUP",
    "FitVerdict",
    "VERDICTS",
    "FIT_RULE",
    "SPLIT_TRUSTED",
    "ONE_LENGTH",
    "CROSSOVER_WORDS",
    "constant_cost",
    "fit_exponent",
    "fit_deterministic",
    "CostSplit",
    "cost_split",
    "verdict",
    "excludes_declared",
    "big_o",
    "decided_by",
    "plain_verdict",
    "too_few_points",
    "declared_exponent",
    "swept",
    "fit_table",
    "METRIC_LABELS",
    "tally",
    "TIME_NOT_FITTED",
    "time_not_fitted",
    "per_metric",
    "breakdown",
    "headline",
    "crossovers",
    "largest_length",
    "memory_model",
    "model_slope",
]

FLOOR_FACTOR = 2.0
MIN_POINTS = 4
CLIP = 2.5  # residuals beyond this many robust standard deviations are clipped for the interval
OUTLIER = 3.0  # ... and beyond this many, the point is listed as an outlier
MAX_CI_WIDTH = 0.5
BOOTSTRAP = 2000
_SEED = 20240601  # fixed: the bootstrap interval must not change between processes
TOLERANCE = 0.25
MODEL = Method.MODEL  # the method of predicted (not measured) values
GROUP = [
    *contract.case_columns(
        ("source", "machine", "commit", "device", "mode", "dtype", "mask", *contract.SHAPE),
        without=contract.LENGTHS,
    ),
    "metric",
    "method",
]
"""One fit per group: every shape setting but the swept length is held fixed (a sweep over head
dims, batches or key/value heads gives one fit per value, never one line through several shapes)."""


class FitVerdict(enum.StrEnum):
    """A fit against its declared exponent (:func:`verdict`; "" where nothing is declared)."""

    MATCHES = "matches"
    STEEPER = "steeper"  # a mismatch: big-O is an upper bound
    SHALLOWER = "shallower"  # a lower-order term still matters in the measured range
    INCONCLUSIVE = "inconclusive"


VERDICTS = tuple(FitVerdict)
# one query row over Lk keys: at most O(Lk) time and scratch, whatever the prefill exponent
_DECODE_CAP = 1.0

FIT_RULE = f"""How the exponent is fitted. At short lengths a constant per-call cost (interpreter,
dispatch, kernel launch) hides the asymptotic term, and on a shared machine single points can be far
off. The *overhead floor* is {FLOOR_FACTOR:g} times that constant cost, so at or above the floor the
constant is at most half of what was measured. The constant is the c0 of the cost split c0 + c1·L +
c2·L² where that split describes the series; else an upper bound of it: the shortest point less the
least its growing part can be, given how much it grows to the next length (a part growing as L² or
slower at most quadruples from L to 2L), and never more than the smallest value. So the shortest
point of a series that already grows is fitted; only points the constant could dominate are not.
Every point at or above the floor is fitted; the points below it are the constant. For a sampled
metric (time), the slope of log(value) on log(L) is the Theil-Sen estimate (the median of all
pairwise slopes), which one wild point cannot drag far.
Its 95% interval is the 2.5-97.5 percentile range of {BOOTSTRAP} Theil-Sen slopes refitted on
residual-bootstrap replicates, with a fixed seed (the same data give the same interval in every
process). The residuals resampled are each point's distance from the line through the *other*
points, clipped at {CLIP:g} robust standard deviations, so a lone outlier widens nothing while
general scatter does; points beyond {OUTLIER:g} robust standard deviations are listed. Exact
metrics (peak bytes, FLOPs, instruction counts) are not sampled, so they have no interval: their
slope is the least-squares slope over the longest run of points, from the longest length down, whose
*local slopes* (between neighbouring lengths) lie within {MAX_CI_WIDTH:g} of each other. One rule
decides which fits are *inconclusive*: a sampled fit on fewer than {MIN_POINTS} points or with an
interval wider than {MAX_CI_WIDTH:g}; an exact fit on fewer than {DETERMINISTIC_POINTS} points
(nothing to average out: two local slopes already show whether one power of L describes it) or
with local slopes spread wider than {MAX_CI_WIDTH:g}. An inconclusive fit is called neither a
match nor a mismatch; every other fit is judged against the variant's declared exponent.
A conclusive fit within {TOLERANCE:g} of the declared exponent *matches* it, whatever its interval
says (a verdict's tooltip names the rule that decided it). Beyond that tolerance the interval (an
exact fit's: its local slopes) decides: holding the declared value, the fit still matches; leaving
it out, the fit *grows faster* or *grows slower* than declared. Big-O is an upper bound, so only a
fit that grows faster is a mismatch; one that grows slower is reported as such (a lower-order
term, such as a fixed block buffer or a linear projection, still matters in the measured range).
Values the suite predicted rather than measured (method "model") are never fitted, nor are wrong or
failed cases; a noisy case's time is left out, its bytes and counts (exact, whatever the machine
did) are fitted.
"""
"""How :func:`fit_exponent` fits and :func:`verdict` judges, in words: the report's "How the
exponents are fitted" (rendered as it stands, the trailing newline included)."""


def _loo_residuals(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Each point's residual from the Theil-Sen line through all the *other* points.

    A point never pulls its own line toward it, so the residuals of ordinary points measure the
    noise honestly (a line through few points passes through some of them exactly), and a wild
    point stands out.
    """
    out = np.empty_like(y)
    for k in range(len(x)):
        rest = np.arange(len(x)) != k
        slope, intercept, _, _ = stats.theilslopes(y[rest], x[rest], method="joint")
        out[k] = y[k] - (intercept + slope * x[k])
    return out


def _robust_scale(resid: np.ndarray) -> float:
    """Scale of the residuals from their median absolute value (consistent for normal noise)."""
    return float(1.4826 * np.median(np.abs(resid)))


def _theil_sen_bootstrap(
    x: np.ndarray, y: np.ndarray, slope: float, intercept: float, n_boot: int, seed: int
) -> np.ndarray:
    """Theil-Sen slopes of ``n_boot`` residual-bootstrap replicates around the robust line.

    The residuals resampled are the leave-one-out ones (see :func:`_loo_residuals`), clipped at
    ``CLIP`` robust standard deviations (Huber's idea: one wild point moves neither the line nor
    its interval). General scatter keeps a large robust scale, hence a wide interval.
    """
    n = len(x)
    fitted = intercept + slope * x  # (n,)
    resid = _loo_residuals(x, y) if n > 2 else y - fitted
    scale = _robust_scale(resid)
    clipped = np.clip(resid, -CLIP * scale, CLIP * scale)
    clipped = clipped - np.median(clipped)
    rng = np.random.default_rng(seed)
    ys = fitted[None, :] + clipped[rng.integers(0, n, size=(n_boot, n))]  # (B, n)
    i, j = np.nonzero(x[None, :] > x[:, None])  # pairs with x_i < x_j
    slopes = (ys[:, j] - ys[:, i]) / (x[j] - x[i])  # (B, pairs)
    return np.median(slopes, axis=1)


SPLIT_TRUSTED = 0.25
"""The largest relative residual at which the cost split's c0 is taken as the per-call cost."""


def _growth_bound(lengths: np.ndarray, values: np.ndarray) -> float:
    """The most of the shortest point that can be a constant, given how the series grows from it.

    Under the cost split's terms c0 + c1·L + c2·L² (or a steeper power p, read from the series'
    longest step), the growing part g rises from the shortest length L0 to the next, r·L0, by at
    most (r^p - 1)·g(L0); so g(L0) >= (v1 - v0) / (r^p - 1) and c0 <= v0 - g(L0). A series that
    already grows at its shortest length thus keeps that point; a flat start bounds c0 by v0.
    """
    lengths, index = np.unique(lengths, return_inverse=True)
    values = np.array([np.median(values[index == i]) for i in range(len(lengths))])
    if len(lengths) < 2 or values[1] <= values[0]:
        return float(values[0])
    last = math.log(values[-1] / values[-2]) / math.log(lengths[-1] / lengths[-2])
    grows = (lengths[1] / lengths[0]) ** max(2.0, last) - 1
    return max(0.0, float(values[0] - (values[1] - values[0]) / grows))


def constant_cost(lengths: np.ndarray, values: np.ndarray) -> tuple[float, str]:
    """The per-call constant cost of a series (at most its smallest value) and its source.

    The smallest value bounds the constant from above, and so does the shortest point less the
    least its growing part can be (:func:`_growth_bound`): the shortest point of a series that
    already grows is mostly work, and is fitted. Where the cost split c0 + c1·L + c2·L² describes
    the series (every point within ``SPLIT_TRUSTED``), its c0 is the constant itself: a linear
    series whose shortest point is mostly work (``linear_elu``) then keeps the points the "2x the
    smallest" bound cut at random, as noise put them a hair above or below it.
    """
    smallest = float(values.min())
    split = cost_split(lengths, values) if len(np.unique(lengths)) >= MIN_POINTS else None
    if split is not None and split.max_residual <= SPLIT_TRUSTED and split.c0 < smallest:
        return split.c0, "the cost split's c0"
    bound = _growth_bound(lengths, values)
    if bound < smallest:
        return bound, "bounded by the growth from the shortest length"
    return smallest, "at most the smallest value"


def _sorted_series(lengths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """``lengths`` and ``values`` as floats in length order (ValueError: shapes differ)."""
    lengths, values = np.asarray(lengths, float), np.asarray(values, float)
    if lengths.shape != values.shape:
        raise ValueError(
            f"lengths and values must have the same shape, got {lengths.shape} and {values.shape}"
        )
    order = np.argsort(lengths)
    return lengths[order], values[order]


def _no_fit(**fields: float | int | str) -> dict[str, float | int | str]:
    """A fit without a slope: every key of :func:`fit_exponent`, in its order, ``fields`` set."""
    return {
        "exponent": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "r2": math.nan,
        "n": 0,
        "L_min": math.nan,
        "L_max": math.nan,
        "range": "no positive values",
        "conclusive": False,
        "note": "no points",
        "outliers": "",
        **fields,
    }


def _points(n: int) -> str:
    """``1 point``, ``3 points``."""
    return f"{n} point{'s' if n != 1 else ''}"


def _few_above_constant(n: int) -> str:
    """Why a series has no slope, in a reader's words: "only 1 length is clearly above the fixed
    per-call cost" (the overhead floor is a term the page never defines)."""
    if n == 0:
        return "no length is clearly above the fixed per-call cost"
    lengths = "1 length is" if n == 1 else f"{n} lengths are"
    return f"only {lengths} clearly above the fixed per-call cost"


def _line_fit(x: np.ndarray, y: np.ndarray, resid: np.ndarray) -> dict[str, float | int]:
    """The ``r2`` of a log-log line leaving ``resid``, and the lengths ``x`` spans."""
    total = float(((y - y.mean()) ** 2).sum())
    return {
        "r2": float(1 - (resid**2).sum() / total) if total > 0 else math.nan,
        "L_min": int(round(math.exp(x[0]))),
        "L_max": int(round(math.exp(x[-1]))),
    }


def _above_floor(lengths: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, str]:
    """The points at or above the overhead floor (those fitted), and the rule as applied."""
    constant, source = constant_cost(lengths, values)
    above = values >= FLOOR_FACTOR * constant
    if above.sum() < 2 <= len(lengths):
        # a flat series: fit what rises above the minimum, if anything
        above = values > values.min()
    rule = (
        f"value >= {FLOOR_FACTOR:g}x the constant ({constant:.3g}, {source}): "
        f"{int(above.sum())} of {len(lengths)} points"
    )
    return above, rule


def _theil_sen_fit(x: np.ndarray, y: np.ndarray) -> dict[str, float | int | str]:
    """The Theil-Sen slope of ``y`` on ``x`` with its bootstrap interval, r², span and the note
    saying why it is inconclusive (if it is)."""
    slope, intercept, _, _ = stats.theilslopes(y, x, method="joint")
    if len(np.unique(x)) == 2:  # one line through both: every replicate is it, "[2.00, 2.00]"
        lo = hi = math.nan
    else:
        boot = _theil_sen_bootstrap(x, y, slope, intercept, BOOTSTRAP, _SEED)
        lo, hi = np.percentile(boot, [2.5, 97.5])
    resid = y - (intercept + slope * x)
    scale = _robust_scale(_loo_residuals(x, y)) if len(x) > 2 else 0.0
    wild = [
        int(round(math.exp(v)))
        for v, r in zip(x, resid, strict=True)
        if abs(r) > OUTLIER * max(scale, 1e-3)
    ]
    # one reason, the first rule that fails: readers looked twice at a cell stacking two, and at
    # "3 points" beside a tight interval (the short cell shows none on too few points)
    if len(x) < MIN_POINTS:
        note = f"{len(x)} points, too few for a verdict ({MIN_POINTS} needed)"
    elif hi - lo > MAX_CI_WIDTH:
        note = f"its 95% interval is {hi - lo:.2f} wide, over the {MAX_CI_WIDTH:g} a verdict allows"
    else:
        note = ""
    return {
        "exponent": float(slope),
        "ci_low": float(lo),
        "ci_high": float(hi),
        **_line_fit(x, y, resid),
        "conclusive": not note,
        "note": note,
        "outliers": " ".join(f"L={n}" for n in wild),
    }


def fit_exponent(lengths: np.ndarray, values: np.ndarray) -> dict[str, float | int | str]:
    """Robust slope of log(value) on log(L) above the overhead floor (:data:`FIT_RULE`).

    Args:
        lengths: sequence lengths, one per point.
        values: the metric at those lengths (non-positive and non-finite values are ignored).

    Returns:
        ``exponent``, ``ci_low``/``ci_high`` (bootstrap 95%), ``r2`` (of the robust line), ``n``
        (points fitted), ``L_min``/``L_max``, ``range`` (the floor rule as applied), ``conclusive``
        (bool), ``note`` (why a fit is inconclusive, "" otherwise) and ``outliers``.
    """
    lengths, values = _sorted_series(lengths, values)
    keep = (values > 0) & np.isfinite(values) & np.isfinite(lengths) & (lengths > 0)
    lengths, values = lengths[keep], values[keep]
    if len(lengths) == 0:
        return _no_fit()
    above, rule = _above_floor(lengths, values)
    x, y = np.log(lengths[above]), np.log(values[above])
    out = _no_fit(n=int(len(x)), range=rule)
    if len(np.unique(x)) < 2:
        measured = len(np.unique(lengths))
        few = "only 1 length measured" if measured == 1 else _few_above_constant(len(np.unique(x)))
        return {**out, "note": few}
    return {**out, **_theil_sen_fit(x, y)}


def _local_slopes_fit(
    x: np.ndarray, y: np.ndarray, local: np.ndarray, dropped: int
) -> dict[str, float | int | str]:
    """The least-squares slope of ``y`` on ``x`` and the range of its ``local`` slopes.

    ``dropped``: how many of the shortest points were left out."""
    slope, intercept = np.polyfit(x, y, 1)
    resid = y - (intercept + slope * x)
    notes = []
    if len(x) < DETERMINISTIC_POINTS:
        notes.append(f"{len(x)} points" + (", one local slope" if len(local) == 1 else ""))
    low, high = (local.min(), local.max()) if len(local) > 1 else (math.nan, math.nan)
    if np.ptp(local) > MAX_CI_WIDTH:
        notes.append(f"local slopes {low:.2f} to {high:.2f}: no single power of L")
    return {
        "exponent": float(slope),
        "ci_low": float(low),
        "ci_high": float(high),
        "n": int(len(x)),
        **_line_fit(x, y, resid),
        "range": f"deterministic: {len(x)} of {len(x) + dropped} points, "
        + (f"local slopes {low:.2f} to {high:.2f}" if len(local) > 1 else "one local slope"),
        "conclusive": not notes,
        "note": ", ".join(notes),
        "max_residual": float(np.abs(np.expm1(resid)).max()),
    }


def fit_deterministic(lengths: np.ndarray, values: np.ndarray) -> dict[str, float | int | str]:
    """The slope of a metric without sampling noise (peak bytes, FLOPs, instruction counts) along L.

    Each value is exact, so the question is not noise but whether one power of L describes the
    series: lower-order terms (a fixed buffer, an O(L) projection) bend it at short lengths. The
    *local slopes* (between neighbouring lengths) say where: the fit takes the longest run of
    points from the longest length down whose local slopes lie within ``MAX_CI_WIDTH`` of each
    other (at least :data:`DETERMINISTIC_POINTS`), fits log(value) on log(L) by least squares
    there, and reports the local slopes' range as ``ci_low``/``ci_high`` (not a confidence
    interval: the range the slope takes over the fitted lengths) and the largest residual.

    Returns:
        the keys of :func:`fit_exponent`, plus ``max_residual`` (largest |value / fitted - 1|) and
        ``kind`` ("deterministic").

    Example:
        >>> fit = fit_deterministic(np.array([256, 512, 1024, 2048]),
        ...                         np.array([4.85e6, 1.9e7, 7.6e7, 3.0e8]))
        >>> round(fit["exponent"], 2), fit["conclusive"]
        (1.99, True)
    """
    lengths, values = _sorted_series(lengths, values)
    keep = (values > 0) & np.isfinite(values) & (lengths > 0)
    x, y = np.log(lengths[keep]), np.log(values[keep])
    out = _no_fit(
        n=int(len(x)),
        range="deterministic: no positive values",
        max_residual=math.nan,
        kind="deterministic",
    )
    if len(np.unique(x)) < 2:
        return {**out, "note": _points(len(x))}
    local = np.diff(y) / np.diff(x)  # slope between neighbouring lengths, shortest first
    start = 0  # drop the shortest points while the slope still bends and enough points remain
    while len(x) - start > DETERMINISTIC_POINTS and np.ptp(local[start:]) > MAX_CI_WIDTH:
        start += 1
    return {**out, **_local_slopes_fit(x[start:], y[start:], local[start:], start)}


@dataclass(frozen=True)
class CostSplit:
    """cost(L) = c0 + c1·L + c2·L², fitted with non-negative terms: which term dominates where.

    ``crossover`` is L* = c1 / c2, the length from which the L² term outweighs the L term (inf when
    there is no L² term, 0 when there is no L term); ``share`` is the L² term's share of the fitted
    cost at each measured length; ``max_residual`` the largest |value / fitted - 1|.
    """

    c0: float
    c1: float
    c2: float
    lengths: tuple[int, ...]
    share: tuple[float, ...]
    max_residual: float

    @property
    def crossover(self) -> float:
        if self.c2 <= 0:
            return math.inf
        return self.c1 / self.c2

    def share_at(self, length: float) -> float:
        total = self.c0 + self.c1 * length + self.c2 * length**2
        return self.c2 * length**2 / total if total > 0 else math.nan


def cost_split(lengths: np.ndarray, values: np.ndarray) -> CostSplit | None:
    """Fit c0 + c1·L + c2·L² >= 0 term by term, in relative error (None: fewer than 3 lengths).

    Relative error, because the values span orders of magnitude and a plain least squares would fit
    the longest length alone. Non-negative, because a cost has no negative term: a negative L term
    would "explain" curvature that a constant and an L² term explain. Solved by non-negative least
    squares on the rows divided by their values.

    Example:
        >>> lengths = np.array([128, 256, 512, 1024, 2048])
        >>> split = cost_split(lengths, 8 * 512.0 * lengths + 4 * lengths**2.0)
        >>> round(split.crossover)
        1024
    """
    lengths, values = np.asarray(lengths, float), np.asarray(values, float)
    keep = (values > 0) & np.isfinite(values) & (lengths > 0)
    lengths, values = lengths[keep], values[keep]
    if len(np.unique(lengths)) < 3:
        return None
    scale = lengths.max()  # columns of comparable size: L / L_max, (L / L_max)^2
    u = lengths / scale
    # (n, 3): each row relative to its value
    design = np.stack([np.ones_like(u), u, u**2], axis=1) / values[:, None]
    coef, _ = optimize.nnls(design, np.ones(len(u)))
    # rounding's leftovers of an absent term (terms compared at L_max)
    coef[coef < 1e-9 * coef.max()] = 0.0
    c0, c1, c2 = coef[0], coef[1] / scale, coef[2] / scale**2
    fitted = c0 + c1 * lengths + c2 * lengths**2
    share = c2 * lengths**2 / np.where(fitted > 0, fitted, np.nan)
    order = np.argsort(lengths)
    return CostSplit(
        c0=float(c0),
        c1=float(c1),
        c2=float(c2),
        lengths=tuple(int(n) for n in lengths[order]),
        share=tuple(float(v) for v in share[order]),
        max_residual=float(np.abs(values / fitted - 1).max()) if (fitted > 0).all() else math.inf,
    )


def verdict(fit: dict, declared: float) -> FitVerdict | str:
    """The fit's :class:`FitVerdict` against ``declared``, or "" when nothing is declared (NaN).

    A fit without ``conclusive`` (a plain dict of exponent and interval) is judged by its interval
    width; one with no slope at all (fewer than 2 points above the floor) is inconclusive.
    """
    slope = fit["exponent"]
    if math.isnan(declared):
        return ""
    if math.isnan(slope):
        return FitVerdict.INCONCLUSIVE
    conclusive = fit.get("conclusive", fit["ci_high"] - fit["ci_low"] <= MAX_CI_WIDTH)
    if not conclusive:
        return FitVerdict.INCONCLUSIVE
    inside = fit["ci_low"] <= declared <= fit["ci_high"]
    if slope > declared + TOLERANCE and not inside:
        return FitVerdict.STEEPER
    if slope < declared - TOLERANCE and not inside:
        return FitVerdict.SHALLOWER
    return FitVerdict.MATCHES


def excludes_declared(fit: dict) -> bool:
    """Whether a conclusive fit's interval leaves out its declared exponent (a near "matches")."""
    declared = fit.get("declared", math.nan)
    return (
        bool(fit.get("conclusive"))
        and not math.isnan(declared)
        and not fit["ci_low"] <= declared <= fit["ci_high"]
    )


_SUPERSCRIPTS = str.maketrans("0123456789.", "⁰¹²³⁴⁵⁶⁷⁸⁹·")


def big_o(exponent: float, length: str = "L") -> str:
    """``O(L²)``, ``O(L)``, ``O(1)``, ``O(L^1.5)``: a declared exponent as a reader writes it."""
    if exponent == 0:
        return "O(1)"
    if exponent == 1:
        return f"O({length})"
    if float(exponent).is_integer():
        return f"O({length}{str(int(exponent)).translate(_SUPERSCRIPTS)})"
    return f"O({length}^{exponent:g})"


def _why_shallower(fit: dict) -> str:
    """Why a conclusive fit grows slower than declared, from its cost split c0 + c1·L + c2·L²."""
    star, share = fit.get("crossover_L", math.nan), fit.get("l2_share", math.nan)
    longest = fit.get("L_max", math.nan)
    if fit["declared"] == 2 and math.isfinite(star) and star > 0 and math.isfinite(share):
        where = (
            f"below L ≈ {star:,.0f}"
            if not math.isfinite(longest) or star < longest
            else f"at every measured length (up to L ≈ {star:,.0f})"
        )
        return (
            f"its O(L) part outweighs the L² part {where}; at L={longest:.0f} the L² part is "
            f"{share:.0%} of it"
        )
    if fit["declared"] == 1:
        return "a fixed part (a buffer, a per-call cost) still matters at these lengths"
    return "a lower-order part (a fixed buffer, an O(L) projection) still matters at these lengths"


def _spread(fit: dict) -> str:
    """ "95% interval 1.90 to 1.96" (a sampled fit), "local slopes 1.74 to 1.92" (an exact one)."""
    kind = "local slopes" if fit.get("kind") == "deterministic" else "95% interval"
    return f"{kind} {fit['ci_low']:.2f} to {fit['ci_high']:.2f}"


def decided_by(fit: dict) -> str:
    """The rule that decided a conclusive fit's verdict, with its numbers (the page's tooltip).

    :func:`verdict` reads the tolerance first: within it, a fit matches whatever its interval says
    (that interval is then context, in brackets); beyond it, the interval decides (holding the
    declared exponent: a match; leaving it out: steeper or shallower). The sentence names the rule
    that applied, so "matches" never sits beside a bare "its interval excludes 2".
    """
    declared, slope = fit["declared"], fit["exponent"]
    tolerance = f"the {TOLERANCE:g} tolerance"
    if abs(slope - declared) <= TOLERANCE:
        return f"fitted {slope:.2f}, within {tolerance} of {declared:g} ({_spread(fit)})"
    side = "above" if slope > declared else "below"
    inside = fit["ci_low"] <= declared <= fit["ci_high"]
    return f"fitted {slope:.2f}, more than {tolerance} {side} {declared:g}, " + (
        f"but its {_spread(fit)} holds {declared:g}"
        if inside
        else f"and its {_spread(fit)} leaves {declared:g} out"
    )


def too_few_points(fit: dict | pd.Series) -> bool:
    """Whether a sampled fit has fewer points than a verdict needs (:data:`MIN_POINTS`): the page
    then shows its count, never its interval (a tight interval on 3 points read as a match)."""
    return bool(fit.get("kind") != "deterministic" and fit.get("n", MIN_POINTS) < MIN_POINTS)


def plain_verdict(fit: dict) -> tuple[str, str]:
    """A fit's verdict in plain words, and the rule that decided it (the page's tooltip).

    One rule for every fit on the page: "matches O(L²)"; "grows slower than declared (L^1.63 vs
    L²): why"; "grows faster than declared (L^2.40 vs L): a mismatch"; "inconclusive: 2 points";
    "predicted, not measured" for a model; "" where nothing is declared. The tooltip repeats the
    verdict and says which rule decided it (:func:`decided_by`): "matches O(L²): fitted 1.93,
    within the 0.25 tolerance of 2 (95% interval 1.90 to 1.96)".
    """
    declared, slope = fit.get("declared", math.nan), fit.get("exponent", math.nan)
    if fit.get("method") == MODEL:
        return "predicted, not measured", "values the suite predicted are never fitted"
    if math.isnan(declared):
        return "", ""
    judged = fit.get("verdict")
    if judged == FitVerdict.INCONCLUSIVE or not math.isfinite(slope):
        why = fit.get("note") or "too much scatter"
        fitted = f"; fitted L^{slope:.2f}" if math.isfinite(slope) else ""
        # no interval where the cell shows the count instead (a reader saw one in the tooltip only)
        if math.isfinite(slope) and math.isfinite(fit["ci_low"]) and not too_few_points(fit):
            fitted += f" ({_spread(fit)})"
        return f"inconclusive: {why}", f"inconclusive ({why}){fitted}, declared {big_o(declared)}"
    if judged == FitVerdict.MATCHES:
        phrase = f"matches {big_o(declared)}"
        return phrase, f"{phrase}: {decided_by(fit)}"
    growth = f"(L^{slope:.2f} vs {big_o(declared)[2:-1]})"
    if judged == FitVerdict.SHALLOWER:
        return (
            f"grows slower than declared {growth}: {_why_shallower(fit)}",
            f"grows slower than declared {big_o(declared)}: {decided_by(fit)}",
        )
    return (
        f"grows faster than declared {growth}: a mismatch",
        f"grows faster than declared {big_o(declared)}: {decided_by(fit)}",
    )


def declared_exponent(variant: str, metric: str, workload: str = "prefill") -> float:
    """The exponent ``variant`` declares for ``metric`` along ``workload``'s sweep (NaN: none).

    Prefill sweeps L = Lq = Lk and takes the variant's declared exponents. Decode sweeps the cache
    length Lk with one query row, so no variant does more than O(Lk) work or holds more than O(Lk)
    scratch: the declared decode exponent is ``min(prefill exponent, 1)`` (:data:`_DECODE_CAP`).
    That holds for the linear variants too: they recompute their key-value feature sums over the
    whole cache on every call instead of carrying a recurrent state from step to step, so a step is
    O(Lk), not the O(1) a recurrent implementation would reach.

    Args:
        variant: registered variant name.
        metric: a tidy metric; those of :data:`attnbench.contract.DECLARED` have a declared
            exponent.
        workload: "prefill" or "decode" (:data:`attnbench.contract.WORKLOADS`).
    """
    if metric not in DECLARED or variant not in variant_names():
        return math.nan
    declared = float(getattr(get_variant(variant), DECLARED[metric]))
    return min(declared, _DECODE_CAP) if workload == "decode" else declared


def _workloads(frame: pd.DataFrame) -> pd.Series:
    """Each row's workload; files older than the column (or rows without one) are prefill."""
    if "workload" not in frame:
        return pd.Series("prefill", index=frame.index)
    return frame["workload"].where(frame["workload"].isin(WORKLOADS), "prefill")


def swept(frame: pd.DataFrame) -> pd.DataFrame:
    """Rows on a workload's own sweep, ``workload`` filled and ``length`` the length it sweeps.

    Prefill rows count only when Lq = Lk (their ``length`` is L); decode rows sweep Lk
    (:data:`attnbench.contract.SWEPT_LENGTH`) and keep their Lq in the group key.
    """
    frame = frame.assign(workload=_workloads(frame))
    prefill = frame["workload"] == "prefill"
    frame = frame[~prefill | (frame["seq_len"] == frame["seq_len_k"])]
    length = pd.Series(0, index=frame.index, dtype="int64")
    for workload, column in SWEPT_LENGTH.items():
        rows = frame["workload"] == workload
        length[rows] = frame.loc[rows, column].astype("int64")
    return frame.assign(length=length)


def fit_table(frame: pd.DataFrame, metrics: Sequence[str] = FITTED) -> pd.DataFrame:
    """One fit per group of :data:`GROUP`: every shape setting but the swept length held fixed.

    Each workload is fitted along its own swept length (prefill: L; decode: the cache length Lk,
    per query count Lq), against the exponent declared for that workload
    (:func:`declared_exponent`). Only ``ok`` rows are fitted. Groups of predicted values (method
    "model") get a row that says so, with no exponent and no verdict: a model checked against itself
    proves nothing.
    """
    sel = swept(frame[(frame["status"] == Status.OK) & frame["metric"].isin(metrics)])
    sel = sel.assign(
        method=sel.get("method", ""),
        fixed=sel["seq_len"].where(sel["workload"] != "prefill", 0).astype("int64"),
    )
    rows = []
    for key, group in sel.groupby([*GROUP, "fixed"], dropna=False, sort=True):
        info = dict(zip(GROUP, key[:-1], strict=True))
        declared = declared_exponent(info["variant"], info["metric"], info["workload"])
        if info["method"] == MODEL:
            rows.append(
                {
                    **info,
                    **fit_exponent(np.array([]), np.array([])),
                    "n": int(group["length"].nunique()),
                    "range": "model values: not fitted",
                    "note": "model",
                    "declared": declared,
                    "verdict": "",
                }
            )
            continue
        by_len = group.groupby("length")["value"].median()
        lengths, values = by_len.index.to_numpy(float), by_len.to_numpy(float)
        deterministic = info["metric"] in METRICS and not METRICS[info["metric"]].timed
        fit = (
            fit_deterministic(lengths, values)
            if deterministic
            else {**fit_exponent(lengths, values), "kind": "sampled"}
        )
        rows.append(
            {
                **info,
                **fit,
                **_split_columns(cost_split(lengths, values)),
                "declared": declared,
                "verdict": verdict(fit, declared),
            }
        )
    return pd.DataFrame(rows)


def _split_columns(split: CostSplit | None) -> dict[str, float]:
    """The fit table's columns of a :class:`CostSplit`: L* and the L² share at the longest L."""
    if split is None:
        return {"crossover_L": math.nan, "l2_share": math.nan, "split_residual": math.nan}
    return {
        "crossover_L": split.crossover,
        "l2_share": split.share[-1],
        "split_residual": split.max_residual,
    }


@dataclass(frozen=True)
class _Tally:
    """The fits with a declared exponent, counted once: every sentence about them reads this."""

    judged: int  # fits with a verdict
    conclusive: int  # of them, conclusive
    matches: int  # of the conclusive ones, matching the declared exponent
    # matching only within TOLERANCE: the interval excludes the declared exponent (named)
    near: tuple[str, ...]
    steeper: tuple[str, ...]  # named: "variant metric (where)"
    shallower: tuple[str, ...]
    inconclusive: tuple[str, ...]  # named, with why: "batched time: 2 points (1 noisy), ..."

    @property
    def tone(self) -> str:
        if self.steeper:
            return "bad"
        settled = self.conclusive == self.judged  # an inconclusive fit leaves its claim open
        return (
            "good"
            if settled and self.conclusive and self.matches + len(self.shallower) == self.conclusive
            else "neutral"
        )


METRIC_LABELS = {"peak_tensor_bytes": "peak memory"}
"""How a verdict names its metric where the metric's name is not a reader's word: "peak memory
matches O(L)", never a bare "memory" that page faults (a metric of their own) seem to contradict."""


def tally(fits: pd.DataFrame) -> _Tally:
    """Count and name the verdicts of ``fits`` (rows without a declared exponent are not judged)."""
    judged = fits[fits["verdict"].isin(VERDICTS)] if len(fits) else fits
    several = {
        c: judged[c].nunique() > 1
        for c in ("source", "machine", "device", "mode", "dtype", "mask", "workload")
        if c in judged
    }

    def name(rec: dict) -> str:
        where = [str(rec[c]) for c, many in several.items() if many]
        label = METRIC_LABELS.get(rec["metric"], rec["metric"])
        return f"{rec['variant']} {label}" + (f" ({', '.join(where)})" if where else "")

    records = judged.to_dict("records")
    named = {v: tuple(name(r) for r in records if r["verdict"] == v) for v in FitVerdict}
    return _Tally(
        judged=len(records),
        conclusive=len(records) - len(named[FitVerdict.INCONCLUSIVE]),
        matches=len(named[FitVerdict.MATCHES]),
        near=tuple(
            name(r) for r in records if r["verdict"] == FitVerdict.MATCHES and excludes_declared(r)
        ),
        steeper=named[FitVerdict.STEEPER],
        shallower=named[FitVerdict.SHALLOWER],
        inconclusive=tuple(
            f"{name(r)}: {r['note']}" for r in records if r["verdict"] == FitVerdict.INCONCLUSIVE
        ),
    )


TIME_NOT_FITTED = "time not fitted (every case noisy or skipped)"
"""What the fit tallies say where time was measured but no time fit was attempted."""


def time_not_fitted(frame: pd.DataFrame, fits: pd.DataFrame) -> bool:
    """Whether ``frame`` measured time that no fit of ``fits`` judges (every case noisy or
    skipped): a tally of the other metrics must not read as if every claim had been checked."""
    timed = len(frame) > 0 and bool((frame["metric"] == "time").any())
    judged = len(fits) > 0 and bool(
        ((fits["metric"] == "time") & fits["verdict"].isin(VERDICTS)).any()
    )
    return timed and not judged


def _counted(t: _Tally, zeros: bool = True) -> str:
    """ "5 match, 1 grows slower, 0 grow faster, 5 inconclusive": a tally in the page's words
    (without ``zeros``: "5 match, 1 grows slower, 5 inconclusive")."""
    slower, faster = len(t.shallower), len(t.steeper)
    parts = (
        (t.matches, agree(t.matches, "matches", "match")),
        (slower, f"{agree(slower, 'grows', 'grow')} slower"),
        (faster, f"{agree(faster, 'grows', 'grow')} faster"),
        (len(t.inconclusive), "inconclusive"),
    )
    return ", ".join(f"{n} {words}" for n, words in parts if zeros or n)


def per_metric(fits: pd.DataFrame) -> str:
    """The judged fits counted per metric, time first, in :func:`breakdown`'s words, leaving out
    the zeros ("time: 1 matches, 5 inconclusive; memory: 4 match, 1 inconclusive"): "3 of 3 ...;
    3 are inconclusive" read as a contradiction when the 3 and the 3 were different metrics."""
    judged = fits[fits["verdict"].isin(VERDICTS)] if len(fits) else fits
    metrics = sorted(
        set(judged["metric"]) if len(judged) else set(), key=lambda m: (m != "time", m)
    )
    parts = []
    for m in metrics:
        label = METRIC_LABELS.get(m, m)
        parts.append(f"{label}: {_counted(tally(judged[judged['metric'] == m]), zeros=False)}")
    return "; ".join(parts)


def breakdown(fits: pd.DataFrame, time_unfitted: bool = False) -> str:
    """The one count of the judged fits that both the findings and the exponents section state, in
    the same words: "11 big-O claims checked: 5 match, 0 grow slower, 0 grow
    faster, 6 inconclusive (time: 1 matches, 5 inconclusive; memory: 4 match, 1 inconclusive)"
    (``time_unfitted``: "; time not fitted (...)" after it).

    The two summaries once counted differently (per metric, and conclusive ones only) and agreed
    only after adding up; every number here comes from one :func:`tally`.
    """
    t = tally(fits)
    text = f"{count(t.judged, 'big-O claim')} checked: {_counted(t)}"
    text += f" ({per_metric(fits)})" if t.judged else ""
    return text + (f"; {TIME_NOT_FITTED}" if time_unfitted else "")


def headline(fits: pd.DataFrame, time_unfitted: bool = False) -> tuple[str, str]:
    """One sentence about the fits and its tone: ``("good" | "bad" | "neutral", text)``.

    Opens with :func:`breakdown` and names the steeper fits (tone "bad") and the shallower ones
    (the inconclusive ones, with why, are the page's list); never claims anything when nothing was
    fitted.
    """
    t = tally(fits)
    if not t.judged:
        return "neutral", (
            "No fitted exponents: nothing measured at enough lengths to compare with a declared "
            "complexity."
        )
    parts = [breakdown(fits, time_unfitted)]
    if t.steeper:
        grows = agree(len(t.steeper), "grows", "grow")
        parts.append(f"{grows} faster than declared (a mismatch): {', '.join(t.steeper)}")
    if t.shallower:
        grows = agree(len(t.shallower), "grows", "grow")
        parts.append(f"{grows} slower than declared: {', '.join(t.shallower)}")
    tone = "neutral" if time_unfitted and t.tone == "good" else t.tone
    return tone, "; ".join(parts) + "."


_CROSSOVER_SETTING = ["source", "machine", "commit", "device", "mode", "dtype", "mask"]
"""The columns that hold one setting of :func:`crossovers`: variants are compared within it."""


ONE_LENGTH = "one length"
"""A crossover measured at a single shared length: neither "always" nor "never" (a newcomer read
"always 1.04x" and took it for a trend drawn from four lengths)."""
CROSSOVER_WORDS = (
    "<em>always</em>: at every length both ran; <em>never</em>: not even at the longest; "
    f"<em>{ONE_LENGTH}</em>: both ran at one length only, no trend"
)
"""What a crossover's words mean, for the figure's caption and the tables' note alike (HTML)."""


def _first_win(wins: np.ndarray, lengths: pd.Index) -> str:
    """The first length from which every longer one wins too ("always", "never", or
    :data:`ONE_LENGTH` where only one length was measured by both)."""
    if len(wins) == 1:
        return ONE_LENGTH
    for i in range(len(wins)):
        if wins[i:].all():
            return "always" if i == 0 else str(int(lengths[i]))
    return "never"


def _crossover_rows(
    table: pd.DataFrame, baselines: tuple[str, ...], setting: dict, metric: str
) -> list[dict]:
    """A row per (variant, baseline) of a variant x L ``table`` of medians: where it crosses."""
    rows = []
    for base in baselines:
        if base not in table:
            continue
        for variant in table.columns:
            if variant == base:
                continue
            both = table[[variant, base]].dropna()
            if both.empty:
                continue
            wins = (both[variant] < both[base]).to_numpy()
            rows.append(
                {
                    **setting,
                    "variant": variant,
                    "baseline": base,
                    "metric": metric,
                    "crossover_L": _first_win(wins, both.index),
                    "lengths": len(both),
                    "longest_L": int(both.index[-1]),
                    "ratio_at_longest": both[base].iloc[-1] / both[variant].iloc[-1],
                }
            )
    return rows


def crossovers(
    frame: pd.DataFrame, baselines: tuple[str, ...] = ("batched", "sdpa"), metric: str = "time"
) -> pd.DataFrame:
    """Length from which each variant stays below each baseline (faster, or smaller for memory).

    ``crossover`` is the smallest measured L such that the variant beats the baseline at L and at
    every longer length both were measured at; "never" / "always" describe the edge cases, and
    :data:`ONE_LENGTH` a pair measured together at a single length. Only
    ``ok`` measured rows take part (not ``wrong`` cases, nor predicted "model" values).
    """
    ok = frame[(frame["status"] == Status.OK) & (frame["metric"] == metric)]
    ok = swept(ok)
    # L = Lq = Lk: a decode step is compared in its own section
    ok = ok[ok["workload"] == "prefill"]
    if "method" in ok:
        ok = ok[ok["method"] != MODEL]  # measurements against measurements only
    rows = []
    for key, group in ok.groupby(_CROSSOVER_SETTING, dropna=False):
        table = group.pivot_table(
            index="seq_len", columns="variant", values="value", aggfunc="median"
        ).sort_index()
        rows += _crossover_rows(
            table, baselines, dict(zip(_CROSSOVER_SETTING, key, strict=True)), metric
        )
    columns = [
        *_CROSSOVER_SETTING,
        "variant",
        "baseline",
        "metric",
        "crossover_L",
        "lengths",
        "longest_L",
        "ratio_at_longest",
    ]
    return pd.DataFrame(rows, columns=columns)


def largest_length(frame: pd.DataFrame) -> pd.DataFrame:
    """Longest L each variant ran at, and why the next one did not (first reason it stopped).

    A ``noisy`` case ran to completion (the machine was busy, not the variant out of budget), so it
    counts as reached; it is still never fitted or ranked.
    """
    time_rows = swept(frame[frame["metric"] == "time"])
    rows = []
    reached = (Status.OK, Status.NOISY)
    for (device, mode, workload, variant), group in time_rows.groupby(
        ["device", "mode", "workload", "variant"], sort=False
    ):
        ok = group[group["status"].isin(reached)]
        longest = int(ok["length"].max()) if len(ok) else None
        beyond = group[
            ~group["status"].isin(reached) & (group["length"] > (longest or 0))
        ].sort_values("length")
        first = beyond.iloc[0] if len(beyond) else None
        rows.append(
            {
                "device": device,
                "mode": mode,
                "workload": workload,
                "variant": variant,
                "largest_ok_L": longest,
                "next_status": "" if first is None else first["status"],
                "next_reason": "" if first is None else (first["reason"] or first["status"]),
            }
        )
    return pd.DataFrame(rows)


_MODEL_AT = 1 << 16
"""The swept length at which the memory model's growth is read: long enough that every lower-order
part (a chunk not yet full, the output) has stopped bending it."""


def model_slope(impl: Variant, spec: AttnSpec, workload: str) -> float:
    """The memory model's exponent at ``spec``'s shape: log2 of its prediction at twice
    :data:`_MODEL_AT` over its prediction at :data:`_MODEL_AT` (prefill sweeps Lq and Lk, decode
    only Lk)."""
    if workload == "decode":
        here, there = (spec.replace(seq_len_k=n) for n in (_MODEL_AT, 2 * _MODEL_AT))
    else:
        here, there = (spec.replace(seq_len=n, seq_len_k=n) for n in (_MODEL_AT, 2 * _MODEL_AT))
    low, high = impl.predicted_peak_bytes(here), impl.predicted_peak_bytes(there)
    return math.log2(high / low) if low > 0 and high > 0 else math.nan


def _model_row(rec: dict) -> dict:
    """One measured case against the memory model, or, where the model grows faster than the
    variant declares (a plugin declaring O(L) over the default dense model), no model, said so."""
    spec = AttnSpec(
        batch=int(rec["batch"]),
        heads=int(rec["heads"]),
        seq_len=int(rec["seq_len"]),
        seq_len_k=int(rec["seq_len_k"]),
        head_dim=int(rec["head_dim"]),
        dtype=rec["dtype"],
        device=rec["device"],
        mode=rec["mode"],
        mask=rec["mask"],
    )
    impl, workload = get_variant(rec["variant"]), str(rec.get("workload") or "prefill")
    declared = declared_exponent(rec["variant"], "peak_tensor_bytes", workload)
    slope = model_slope(impl, spec, workload)
    predicted, note = float(impl.predicted_peak_bytes(spec)), ""
    if math.isfinite(slope) and slope > declared + TOLERANCE:
        predicted = math.nan
        note = (
            f"no model: the memory model grows as L^{slope:.2f}, but the variant declares "
            f"{big_o(declared)} (its scratch_elements does not describe it)"
        )
    return {
        "machine": rec["machine"],
        "device": rec["device"],
        "mode": rec["mode"],
        "variant": rec["variant"],
        "seq_len": int(rec["seq_len"]),
        "method": rec.get("method", ""),
        "predicted_MiB": predicted / 2**20,
        "measured_MiB": rec["value"] / 2**20,
        "measured/predicted": rec["value"] / predicted if predicted else math.nan,
        "note": note,
    }


def memory_model(frame: pd.DataFrame) -> pd.DataFrame:
    """Predicted vs measured peak tensor bytes per variant and length, with their ratio.

    Only measurements (method "profiler", "cuda", ...) are compared: a "model" row *is* the
    prediction, and comparing it with itself would always "match". A model that grows faster than
    the variant's declared memory exponent is no model of it: its row says so instead of a ratio.
    """
    mem = frame[(frame["metric"] == "peak_tensor_bytes") & (frame["status"] == Status.OK)]
    if "method" in mem:
        mem = mem[mem["method"] != MODEL]
    return pd.DataFrame(
        [_model_row(rec) for rec in mem.to_dict("records") if rec["variant"] in variant_names()]
    )
