"""Do ``attnbench run``, a fresh process per case and asv time the same cases alike?

Five cases (``batched``, ``sdpa``, ``chunked``, ``linear_elu``, ``local`` at L=1024, B=1, H=8,
D=64, float32, forward, CPU) are timed by three entry points, in interleaved rounds (the order of
the three rotates every round):

* ``run``: ``attnbench run`` (forkserver workers, the regime, the probe);
* ``fresh``: one new interpreter per case that applies the regime and calls ``measure``;
* ``asv``: ``asv run --python=same`` on ``Attention.time_attention`` narrowed to these cases
  (``ASV_PYTHONPATH`` points asv at this checkout: asv drops ``PYTHONPATH`` for its processes).

Printed per case: each entry point's median over rounds, and the median over rounds of the
per-round ratios run/fresh and asv/fresh (the figure the issue asks for: within 10%).

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.entry_agreement --rounds 5      # about 13 minutes on 2 cores

What decides agreement: the three entry points measure in one process state (the regime line,
:func:`attnbench.measure.regime.describe`, is equal for a worker, a fresh process and asv's process;
``tests/test_regime.py``), and a timed call maps the same pages whatever ran before it (the
allocator is pinned by ``measure`` itself). Measured with ``resource.getrusage`` in each entry point
(sdpa and batched at L=1024, load average 4-5): per-call CPU time within 5% and page faults equal
(658 and 16,899 a call) in all three, while the wall time per call was 1.0-2.2x the CPU time,
depending on the moment. On a machine busy with other work the figures compare shares of a core
as much as code: read the ratios with the load average printed under them.

Importing this module does nothing; the work happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

VARIANTS = ["batched", "sdpa", "chunked", "linear_elu", "local"]
LENGTH = 1024
ROOT = Path(__file__).resolve().parents[1]
FRESH = """
import json, sys
from attnbench.measure import regime
regime.apply(regime.Regime(threads=1))
from attnbench.measure.runner import measure
from attnbench.spec import AttnSpec
m = measure(sys.argv[1], AttnSpec(seq_len=int(sys.argv[2]), heads=8))
print(json.dumps({"status": m.status, "median": m.median}))
"""


def _env() -> dict[str, str]:
    from attnbench.measure import regime

    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return {
        **os.environ,
        "PYTHONPATH": path,
        "ASV_PYTHONPATH": path,
        **regime.child_env(regime.Regime(threads=regime.DEFAULT_THREADS)),
    }


def by_run(work: Path) -> dict[str, float]:
    import pandas as pd

    out = work / "run"
    subprocess.run(
        [
            sys.executable,
            "-m",
            "attnbench.cli",
            "run",
            "--variants",
            ",".join(VARIANTS),
            "--lengths",
            str(LENGTH),
            "--out",
            str(out),
            "--force",
            "--no-report",
            "--quiet",
        ],
        check=True,
        stdout=subprocess.DEVNULL,
        env=_env(),
    )
    rows = pd.read_csv(
        out / "measurements.csv"
    )  # noisy cases too: their samples are what run measured
    return {r["variant"]: r["median_s"] for r in rows.to_dict("records")}


def by_fresh(work: Path) -> dict[str, float]:
    out = {}
    for name in VARIANTS:
        text = subprocess.run(
            [sys.executable, "-c", FRESH, name, str(LENGTH)],
            check=True,
            capture_output=True,
            text=True,
            env=_env(),
        ).stdout
        out[name] = json.loads(text.strip().splitlines()[-1])["median"]
    return out


def by_asv(work: Path) -> dict[str, float]:
    from asv import util

    from attnbench.analysis.frame import load_asv

    conf = util.load_json(str(ROOT / "asv.conf.json"), js_comments=True)
    conf.update(
        repo=str(ROOT),
        benchmark_dir=str(ROOT / "benchmarks"),
        results_dir=str(work / "asv" / "results"),
        html_dir=str(work / "asv" / "html"),
        env_dir=str(work / "asv" / "env"),
    )
    (work / "asv").mkdir(parents=True, exist_ok=True)
    (work / "asv" / "asv.conf.json").write_text(json.dumps(conf))
    env = {
        **_env(),
        "ATTNBENCH_ASV_VARIANTS": ",".join(VARIANTS),
        "ATTNBENCH_ASV_LENGTHS": str(LENGTH),
        "ATTNBENCH_ASV_MODES": "forward",
        "ATTNBENCH_ASV_DEVICES": "cpu",
        "ATTNBENCH_ASV_MASKS": "none",
    }  # the grid's causal rows would overwrite these (linear_elu: n/a, NaN)
    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    conf_path = str(work / "asv" / "asv.conf.json")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "asv",
            "machine",
            "--yes",
            "--machine",
            "agree",
            "--config",
            conf_path,
        ],
        cwd=work / "asv",
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
            "agree",
            "--config",
            conf_path,
            "--bench",
            "Attention.time_attention",
        ],
        cwd=work / "asv",
        env=env,
        check=True,
        capture_output=True,
    )
    frame = load_asv(work / "asv" / "results").frame
    frame = frame[frame["metric"] == "time"]
    return {r["variant"]: r["value"] for r in frame.to_dict("records")}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)

    import pandas as pd

    methods = {"run": by_run, "fresh": by_fresh, "asv": by_asv}
    names = list(methods)
    got: dict[str, list[dict[str, float]]] = {n: [] for n in names}
    load_before = os.getloadavg()[0]
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = names[r % 3 :] + names[: r % 3]
            for name in order:
                work = Path(tmp) / f"{name}{r}"
                work.mkdir()
                got[name].append(methods[name](work))
    load_after = os.getloadavg()[0]
    rows = []
    for v in VARIANTS:
        row = {"case": f"{v} L={LENGTH}"}
        for name in names:
            row[f"{name} ms"] = 1e3 * statistics.median(g[v] for g in got[name])
        for name in ("run", "asv"):
            row[f"{name}/fresh"] = statistics.median(
                a[v] / b[v] for a, b in zip(got[name], got["fresh"], strict=True)
            )
        rows.append(row)
    with pd.option_context("display.width", 200, "display.float_format", "{:.3f}".format):
        print(pd.DataFrame(rows).to_string(index=False))
    print(
        f"\n{args.rounds} interleaved rounds; 1-min load average {load_before:.2f} before, {load_after:.2f} after"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
