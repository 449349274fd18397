"""The regression gate's time statistic: false-positive and detection rates by simulation."""

from __future__ import annotations

import math

import numpy as np
import pytest

from attnbench.analysis import significance as sig


def _lognormal_sigma(iqr_fraction: float) -> float:
    """sigma of a lognormal whose IQR is ``iqr_fraction`` of its median: 2 sinh(0.6745 sigma) = f."""
    return math.asinh(iqr_fraction / 2) / 0.6745


def _rates(iqr_fraction: float, slowdown: float, n: int, trials: int = 300) -> dict[str, float]:
    rng = np.random.default_rng(7)
    sigma = _lognormal_sigma(iqr_fraction)
    counts = {"ok": 0, "regressed": 0, "undecided": 0}
    for t in range(trials):
        base = rng.lognormal(0.0, sigma, n)
        head = slowdown * rng.lognormal(0.0, sigma, n)
        counts[sig.decide(base, head, 1.2, seed=t).verdict] += 1
    return {k: v / trials for k, v in counts.items()}


@pytest.mark.parametrize(
    "iqr,n,false_positives", [(0.05, 10, 0.0), (0.15, 10, 0.0), (0.30, 10, 0.01), (0.30, 20, 0.0)]
)
def test_unchanged_code_is_not_flagged(iqr, n, false_positives):
    rates = _rates(iqr, 1.0, n=n)
    assert rates["regressed"] <= false_positives, rates
    assert rates["ok"] >= 0.9, rates  # the rest is undecided: more samples settle it


@pytest.mark.parametrize(
    "iqr,n,caught", [(0.05, 20, 0.99), (0.15, 20, 0.99), (0.30, 20, 0.9), (0.30, 40, 0.98)]
)
def test_a_1_5x_slowdown_is_caught_when_base_iqr_is_at_most_30_percent(iqr, n, caught):
    """20 samples a side is what two interleaved asv rounds record; 40 after a confirmation round."""
    rates = _rates(iqr, 1.5, n=n)
    assert rates["regressed"] >= caught, rates
    assert rates["ok"] <= 0.03, (
        rates
    )  # a pass must exclude 1.5x: the misses are "undecided", not silent


def test_allowance_is_capped():
    noisy_base = [1.0, 1.5, 0.7, 1.2, 0.8, 1.6]  # IQR far beyond 30%
    assert sig.allowance(1.2, noisy_base) == sig.CAP
    assert sig.allowance(1.2, [1.0, 1.0, 1.0]) == pytest.approx(1.2)


def test_too_few_samples_cannot_decide():
    assert sig.decide([1.0, 1.1], [3.0, 3.1, 3.2]).verdict == "undecided"


def test_large_but_insignificant_ratio_is_undecided():
    decision = sig.decide([1.0, 1.0, 3.0, 1.0, 1.0], [1.6, 1.7, 1.5, 1.6, 1.6])
    assert decision.verdict == "undecided" and "not significant" in decision.reason


@pytest.mark.parametrize(
    "m,n,floor", [(3, 3, 1 / 20), (4, 4, 1 / 70), (3, 6, 1 / 84), (4, 5, 1 / 126), (5, 5, 1 / 252)]
)
def test_the_smallest_p_value_is_exact(m, n, floor):
    """Every HEAD sample above every BASE sample gives the exact test's smallest p: 1 / C(m + n, m)."""
    from scipy import stats

    assert sig.smallest_p(m, n) == pytest.approx(floor)
    head, base = np.arange(n) + 100.0, np.arange(m) + 1.0
    assert stats.mannwhitneyu(
        head, base, alternative="greater", method="exact"
    ).pvalue == pytest.approx(floor)


@pytest.mark.parametrize("m,n", [(4, 4), (3, 6)])
def test_sample_sizes_that_cannot_reach_alpha_are_refused_whatever_the_data(m, n):
    """4 a side, HEAD 3x slower in every sample: no test at these sizes can say p < 0.01, so no verdict, not even ok."""
    decision = sig.decide(np.linspace(1.0, 1.1, m), np.linspace(3.0, 3.1, n))
    assert decision.verdict == "undecided" and "never below 0.01" in decision.reason, decision
    alike = sig.decide(np.linspace(1.0, 1.1, m), np.linspace(1.0, 1.1, n))
    assert alike.verdict == "undecided" and "never below 0.01" in alike.reason, alike
    assert (
        sig.decide(np.linspace(1.0, 1.1, 5), np.linspace(3.0, 3.1, 5)).verdict == "regressed"
    )  # 5 a side can


@pytest.mark.parametrize("bad", [math.nan, math.inf, 1.0, 0.5, -2, True, "1.5"])
def test_factor_usage_errors(bad):
    with pytest.raises(ValueError, match="time_factor must be a finite number > 1"):
        sig.decide([1.0] * 5, [1.0] * 5, bad)


def test_bad_samples_are_named():
    with pytest.raises(ValueError, match="HEAD samples"):
        sig.decide([1.0] * 5, [1.0, math.nan, 1.0])
