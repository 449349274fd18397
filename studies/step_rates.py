"""How often ``attnbench history`` names a time step or drift, and how often it names noise, on simulated histories.

Per-commit medians of a time benchmark are simulated (lognormal noise, seeded) in three settings:

* noise only (5% spread): anything named is a false alarm;
* a ramp: five commits in a row each 5% slower (1.28x in all), under 3% noise: named when a regression is named
  within one commit of the ramp;
* a 1.3x step under 5% noise: named when a step is named at its commit.

Each setting is judged twice: with the levels of :func:`attnbench.gate.steps.time_levels` (asv's Potts solver,
the penalty from the series' noise) and with those of asv's ``detect_steps`` (its own penalty, which models the
noise as correlated), each point weighted as asv weighs it (its interval grows with its value), both followed by the history's step and drift rules at the time factor (1.2). The figures
``attnbench.gate.steps`` quotes come from ``--trials 200``.

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.step_rates [--trials 200] [--lengths 16,50,200]

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse

import numpy as np


def asv_levels(y: np.ndarray, w: np.ndarray | None = None) -> np.ndarray:
    """Levels from ``asv.step_detect.detect_steps`` as it stands (its own penalty)."""
    from asv.step_detect import detect_steps

    out = np.empty(len(y))
    for left, right, value, _, _ in detect_steps(list(y), None if w is None else list(w)):
        out[left:right] = value
    return out


def weighted(levels):
    """Levels of a series whose points carry asv's weight (2 / their 99% interval, which grows with the value)."""
    return lambda y: levels(y, 1 / np.asarray(y))


def rates(n: int, trials: int, levels, seed: int = 2) -> dict[str, float]:
    """Share of trials in which something is named (noise), the ramp is named, the step is named."""
    from attnbench.contract import TIME_FACTOR
    from attnbench.gate.steps import exact_changes

    rng = np.random.default_rng(seed)
    named = {"noise": 0, "ramp": 0, "step": 0}
    start = n // 2
    for _ in range(trials):
        flat = np.exp(rng.normal(0, 0.05, n))
        named["noise"] += bool(exact_changes(levels(flat), TIME_FACTOR))
        ramp = np.exp(rng.normal(0, 0.03, n))
        for i in range(start, start + 5):
            ramp[i:] *= 1.05
        named["ramp"] += any(
            c.direction == "regression" and c.first >= start - 1 and c.last <= start + 5
            for c in exact_changes(levels(ramp), TIME_FACTOR)
        )
        step = np.exp(rng.normal(0, 0.05, n))
        step[start:] *= 1.3
        named["step"] += any(
            c.kind == "step" and c.first == start for c in exact_changes(levels(step), TIME_FACTOR)
        )
    return {k: v / trials for k, v in named.items()}


def main() -> None:
    from attnbench.gate.steps import time_levels

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--lengths", default="16,50,200", help="commits per simulated history")
    args = parser.parse_args()
    print(
        f"{'levels':<22} {'commits':>7} {'noise named':>12} {'ramp named':>11} {'1.3x step named':>16}"
    )
    for n in (int(x) for x in args.lengths.split(",")):
        for name, levels in (
            ("attnbench history", weighted(time_levels)),
            ("asv detect_steps", weighted(asv_levels)),
        ):
            r = rates(n, args.trials, levels)
            print(f"{name:<22} {n:>7} {r['noise']:>12.1%} {r['ramp']:>11.1%} {r['step']:>16.1%}")


if __name__ == "__main__":
    main()
