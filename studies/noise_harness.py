"""A benchmark of the harness itself: the same small sweep on a quiet machine and beside a busy one.

Runs ``attnbench run`` twice over ``batched``, ``sdpa`` and ``linear_elu`` at L = 128..4096: once
alone, once while a neighbour process spins on one core. It prints the fitted time exponents and
verdicts of both runs side by side, and how many cases each run marked ``noisy``. A harness that
survives a noisy machine gives the same verdicts, or says "inconclusive"; it never turns a busy
neighbour into a confident wrong exponent.

L=128 is there for the fit's overhead floor: only points at least 2x the shortest length's time are
fitted, and linear_elu at 512 took 1.97x its time at 256, which left it 3 points from 256..4096 (and
an inconclusive fit on a quiet machine).

Both runs pass ``--time-budget 120`` (unless the extra arguments name one): at one thread, batched at
L=4096 takes about 2.6 s a call beside other work and twice that beside the spinning neighbour, so
its ten calls can exceed the default 60 s, and a fit without L=4096 has 4 points and a 95% interval
too wide to be conclusive.

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.noise_harness                  # both runs, about 5 minutes on 2 cores
    python -m studies.noise_harness --out reports/noise
    python -m studies.noise_harness -- --time-budget 60   # extra arguments for attnbench run

Not an asv benchmark: asv imports this module while discovering benchmarks, so importing it does
nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

VARIANTS = "batched,sdpa,linear_elu"
LENGTHS = "128,256,512,1024,2048,4096"
TIME_BUDGET = ["--time-budget", "120"]


@contextlib.contextmanager
def busy_neighbour(cores: int = 1) -> Iterator[None]:
    """``cores`` processes spinning in pure Python for the duration of the block."""
    spinners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(cores)]
    try:
        time.sleep(0.5)  # let the scheduler see them
        yield
    finally:
        for proc in spinners:
            proc.kill()
            proc.wait()


def sweep(out: Path, extra: list[str]) -> float:
    """One ``attnbench run`` into ``out``; returns its wall seconds."""
    budget = [] if any(a.startswith("--time-budget") for a in extra) else TIME_BUDGET
    cmd = [
        sys.executable,
        "-m",
        "attnbench.cli",
        "run",
        "--variants",
        VARIANTS,
        "--lengths",
        LENGTHS,
        "--out",
        str(out),
        "--no-report",
        "--quiet",
        *budget,
        *extra,
    ]
    t0 = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0


def verdicts(run_dir: Path):
    """Time-exponent fits of one run, plus how many of its cases were marked noisy."""
    import pandas as pd

    from attnbench.analysis import complexity
    from attnbench.analysis.rundir import load_run

    frame = load_run(run_dir).frame
    fits = complexity.fit_table(frame, metrics=("time",))
    noisy = (
        frame[(frame["metric"] == "time") & (frame["status"] == "noisy")].groupby("variant").size()
    )
    table = fits.set_index("variant")[["exponent", "ci_low", "ci_high", "n", "verdict"]].reindex(
        VARIANTS.split(",")
    )
    table["verdict"] = table["verdict"].fillna("inconclusive (no undisturbed points to fit)")
    table["noisy cases"] = noisy.reindex(table.index).fillna(0).astype(int)
    raw = pd.read_csv(
        run_dir / "measurements.csv"
    )  # the probe's figures, straight from the run's table
    table["skipped"] = (
        raw[raw["status"] == "skipped"]
        .groupby("variant")
        .size()
        .reindex(table.index)
        .fillna(0)
        .astype(int)
    )
    if "probe_slowdown" in raw:
        grouped = raw.groupby("variant")
        table["max probe slowdown"] = grouped["probe_slowdown"].max().reindex(table.index)
        table["retried"] = (
            grouped["attempts"].apply(lambda a: int((a > 1).sum())).reindex(table.index)
        )
    return table.astype({"noisy cases": int}) if isinstance(table, pd.DataFrame) else table


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="keep both run directories here (default: a temporary directory)",
    )
    parser.add_argument(
        "--neighbours",
        type=int,
        default=1,
        help="spinning processes in the busy run (default 1: one core)",
    )
    parser.add_argument("run_args", nargs="*", help="extra arguments for attnbench run (after --)")
    args = parser.parse_args(argv)

    import os

    import pandas as pd

    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        loads = [os.getloadavg()[0]]
        quiet_s = sweep(root / "quiet", args.run_args)
        loads.append(os.getloadavg()[0])
        with busy_neighbour(args.neighbours):
            busy_s = sweep(root / "busy", args.run_args)
        loads.append(os.getloadavg()[0])
        quiet, busy = verdicts(root / "quiet"), verdicts(root / "busy")
    side = pd.concat({"quiet": quiet, f"busy ({args.neighbours} spinning)": busy}, axis=1)
    with pd.option_context("display.width", 200, "display.float_format", "{:.2f}".format):
        print(side.to_string())
    print(
        f"\nquiet sweep {quiet_s:.0f} s, busy sweep {busy_s:.0f} s; 1-min load average "
        f"{loads[0]:.2f} before, {loads[1]:.2f} between, {loads[2]:.2f} after (other work on the machine counts too)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
