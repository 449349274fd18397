"""The regression gate's false-positive and detection rates, on samples asv recorded on this machine.

One real ``asv run --python=same --record-samples`` of the gate's CI subset gives every time case a
set of samples. From them, per case and per trial (seeded):

* unchanged commit: BASE and HEAD are two independent resamples (with replacement, same size) of the
  recorded samples, and :func:`attnbench.analysis.significance.decide` judges them;
* planted 1.5x slowdown: the same, with HEAD's resample multiplied by 1.5.

When a trial is undecided, a confirmation round is simulated as the gate runs it: both sides get a
second resample of the same size appended, and the decision is taken again.
Printed: the counts of ok / regressed / undecided for both, over ``--trials`` trials per case.

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.gate_rates                         # runs asv once (a few minutes), then simulates
    python -m studies.gate_rates --results DIR --machine NAME   # reuse recorded results

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def record(work: Path) -> tuple[Path, str]:
    """One asv run of the CI subset with samples recorded; returns (results dir, machine)."""
    from asv import util

    from attnbench.gate.session import CI_SUBSET
    from attnbench.measure import regime

    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update(
        repo=str(ROOT),
        benchmark_dir=str(ROOT / "benchmarks"),
        results_dir=str(work / "results"),
        html_dir=str(work / "html"),
        env_dir=str(work / "env"),
    )
    conf_path = work / "asv.conf.json"
    conf_path.write_text(json.dumps(conf))
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = {
        **os.environ,
        "PYTHONPATH": path,
        "ASV_PYTHONPATH": path,
        **CI_SUBSET,
        **regime.child_env(regime.Regime(threads=regime.DEFAULT_THREADS)),
    }
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "asv",
            "machine",
            "--yes",
            "--machine",
            "rates",
            "--config",
            str(conf_path),
        ],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
    )
    subprocess.run(
        [
            sys.executable,
            "-m",
            "asv",
            "run",
            "--python=same",
            f"--set-commit-hash={commit}",
            "--machine",
            "rates",
            "--config",
            str(conf_path),
            "--bench",
            "Attention.time_attention",
            "--record-samples",
        ],
        cwd=work,
        env=env,
        check=True,
        capture_output=True,
    )
    return work / "results", "rates"


def simulate(
    samples: dict, trials: int, slowdown: float, time_factor: float, seed: int = 0
) -> Counter:
    from attnbench.analysis.significance import decide

    rng = np.random.default_rng(seed)
    counts: Counter = Counter()
    for key in sorted(samples, key=str):
        values = np.asarray(samples[key], dtype=float)
        for _ in range(trials):
            base = rng.choice(values, values.size)
            head = slowdown * rng.choice(values, values.size)
            verdict = decide(base, head, time_factor).verdict
            if verdict == "undecided":  # the gate's confirmation round: more samples on both sides
                base = np.concatenate([base, rng.choice(values, values.size)])
                head = np.concatenate([head, slowdown * rng.choice(values, values.size)])
                verdict = decide(base, head, time_factor).verdict
            counts[verdict] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--results", type=Path, default=None, help="asv results directory with recorded samples"
    )
    parser.add_argument("--machine", default="rates")
    parser.add_argument("--trials", type=int, default=10, help="simulated comparisons per case")
    parser.add_argument("--time-factor", type=float, default=1.2)
    args = parser.parse_args(argv)

    from attnbench.gate.results import read_time_samples

    with tempfile.TemporaryDirectory() as tmp:
        results, machine = (args.results, args.machine) if args.results else record(Path(tmp))
        recorded = read_time_samples(results, machine)
    samples = {k[1:]: v for k, v in recorded.items()}
    sizes = sorted(len(v) for v in samples.values())
    iqr = sorted(
        float(np.subtract(*np.percentile(v, [75, 25])) / np.median(v)) for v in samples.values()
    )
    print(
        f"{len(samples)} time cases, {sizes[0]}-{sizes[-1]} samples each, IQR/median {iqr[0]:.1%}-{iqr[-1]:.1%}"
    )
    for label, slowdown in (("unchanged commit", 1.0), (f"planted {1.5}x slowdown", 1.5)):
        counts = simulate(samples, args.trials, slowdown, args.time_factor)
        total = sum(counts.values())
        print(
            f"{label}: {total} comparisons: "
            + ", ".join(
                f"{v} {counts[v]} ({counts[v] / total:.1%})"
                for v in ("ok", "regressed", "undecided")
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
