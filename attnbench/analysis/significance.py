"""Is HEAD slower than BASE? A decision on timing samples that knows when it cannot decide.

The allowance is ``time_factor x (1 + IQR/median of BASE)``: a benchmark is forgiven its own
process-to-process noise, but never more than ``CAP``. Three outcomes:

* ``regressed``: the ratio of medians is beyond the allowance *and* significant (one-sided
  Mann-Whitney U, HEAD's samples larger, p < ``_ALPHA``; bootstrap 95% interval above 1);
* ``ok``: the ratio is within the allowance *and* the interval excludes a ``_DETECT`` slowdown, so a
  pass says something;
* ``undecided``: anything else, and every pair of sample sizes at which the test cannot reach
  ``_ALPHA`` whatever the data (:func:`smallest_p`): the gate gathers more samples, and says so with
  its own exit code if it still cannot tell, instead of passing silently.

tests/test_significance.py simulates the false-alarm and detection rates these constants give.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

from attnbench.contract import TIME_FACTOR, GateVerdict

__all__ = ["CAP", "MIN_SAMPLES", "check_factor", "allowance", "smallest_p", "decide"]

CAP = 1.3  # largest allowance, whatever BASE's noise: 1.5x stays well beyond it
_DETECT = 1.5  # the slowdown a pass must exclude: "ok" needs the ratio's interval below it
_ALPHA = 0.01  # one-sided significance level of the Mann-Whitney U test
MIN_SAMPLES = 3  # fewer samples on either side cannot support a decision
_BOOTSTRAP = 2000  # resamples for the interval of the ratio of medians


@dataclass(frozen=True)
class _TimeDecision:
    """The gate's decision on one timed benchmark."""

    verdict: GateVerdict  # ok, regressed or undecided
    ratio: float  # median(HEAD) / median(BASE)
    ci_low: float  # bootstrap 95% interval of the ratio
    ci_high: float
    p_value: float  # one-sided Mann-Whitney U: HEAD slower than BASE
    allowance: float  # the ratio HEAD may reach before it counts
    reason: str  # one line, for the gate's table


def check_factor(name: str, value: float) -> float:
    """A usable factor: a finite number > 1 (nan, inf and <= 1 are usage errors)."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 1
    ):
        raise ValueError(f"{name} must be a finite number > 1, got {value!r}")
    return float(value)


def _clean(name: str, samples: Sequence[float]) -> np.ndarray:
    values = np.asarray([s for s in samples if s is not None], dtype=float)
    if values.size and not (np.isfinite(values).all() and (values > 0).all()):
        raise ValueError(
            f"{name} samples must be finite positive seconds, got {values.tolist()[:5]}..."
        )
    return values


def allowance(time_factor: float, base: Sequence[float]) -> float:
    """``time_factor x (1 + IQR/median of BASE)``, capped at :data:`CAP`."""
    values = np.asarray(base, dtype=float)
    q25, median, q75 = np.percentile(values, [25, 50, 75])
    return min(time_factor * (1.0 + (q75 - q25) / median), CAP)


def _ratio_interval(base: np.ndarray, head: np.ndarray, seed: int = 0) -> tuple[float, float]:
    """Bootstrap 95% interval of median(head) / median(base) (seeded, so stable across runs)."""
    rng = np.random.default_rng(seed)
    b = np.median(rng.choice(base, size=(_BOOTSTRAP, base.size)), axis=1)
    h = np.median(rng.choice(head, size=(_BOOTSTRAP, head.size)), axis=1)
    low, high = np.percentile(h / b, [2.5, 97.5])
    return float(low), float(high)


def smallest_p(m: int, n: int) -> float:
    """The smallest one-sided p-value the exact Mann-Whitney U test can give with m and n samples.

    It is reached when every sample of one side exceeds every sample of the other: 1 / C(m + n, m).
    Where it is not below ``_ALPHA`` no data can be significant, so :func:`decide` refuses before it
    tests (3 a side: 0.05; 4 a side: 0.014; 5 a side: 0.004).
    """
    return 1.0 / math.comb(m + n, m)


def _refusal(m: int, n: int) -> str:
    """Why ``m`` BASE and ``n`` HEAD samples cannot decide anything, or "" when they can."""
    if m < MIN_SAMPLES or n < MIN_SAMPLES:
        return f"too few samples to decide (BASE {m}, HEAD {n}; need {MIN_SAMPLES} each)"
    floor = smallest_p(m, n)
    if floor >= _ALPHA:
        return (
            f"too few samples to decide (BASE {m}, HEAD {n}): the one-sided test's smallest "
            f"p-value is {floor:.2g}, never below {_ALPHA:g}"
        )
    return ""


def decide(
    base: Sequence[float], head: Sequence[float], time_factor: float = TIME_FACTOR, seed: int = 0
) -> _TimeDecision:
    """Decide whether HEAD's timing samples regressed from BASE's (see the module docstring).

    Example:
        >>> str(decide([1.0, 1.1, 0.9, 1.0, 1.05], [2.0, 2.1, 1.9, 2.05, 2.0]).verdict)
        'regressed'
        >>> str(decide([1.0, 1.1, 0.9, 1.0, 1.05], [1.0, 1.02, 0.95, 1.08, 1.01]).verdict)
        'ok'
    """
    time_factor = check_factor("time_factor", time_factor)
    b, h = _clean("BASE", base), _clean("HEAD", head)
    if refused := _refusal(b.size, h.size):
        return _TimeDecision(
            GateVerdict.UNDECIDED, math.nan, math.nan, math.nan, math.nan, math.nan, refused
        )
    ratio = float(np.median(h) / np.median(b))
    allowed = allowance(time_factor, b)
    low, high = _ratio_interval(b, h, seed)
    p = float(stats.mannwhitneyu(h, b, alternative="greater").pvalue)
    interval = f"[{low:.2f}, {high:.2f}]"
    if ratio > allowed and p < _ALPHA and low > 1.0:
        verdict, reason = (
            GateVerdict.REGRESSED,
            f"x{ratio:.2f} {interval} beyond x{allowed:.2f}, p={p:.2g}",
        )
    elif ratio <= allowed and high <= _DETECT:
        verdict, reason = GateVerdict.OK, f"x{ratio:.2f} {interval} within x{allowed:.2f}"
    else:
        why = "not significant" if ratio > allowed else f"interval reaches x{_DETECT:g}"
        verdict, reason = (
            GateVerdict.UNDECIDED,
            f"x{ratio:.2f} {interval}, allowance x{allowed:.2f}: {why} (p={p:.2g})",
        )
    return _TimeDecision(verdict, ratio, low, high, p, allowed, reason)
