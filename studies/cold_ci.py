"""CI from cold: ``.ci/run`` in a fresh clone, with every cache the test suite fills emptied first.

A CI runner and a newcomer start with none of the caches a development machine has filled, so this is the
measurement the README's test figure is taken with. It:

1. clones the repository at a commit (default ``HEAD``) into a new folder (``--work``, default a temporary one);
2. points every cache the suite fills at a new, empty folder inside it: torch Inductor's compiled kernels
   (``TORCHINDUCTOR_CACHE_DIR``), attnbench's roof measurements (``ATTNBENCH_CACHE``), everything under
   ``XDG_CACHE_HOME`` (torch's own, attnbench's default), matplotlib's font list (``MPLCONFIGDIR``); the
   tests' temporary folders are new in every pytest session (``TMPDIR`` is left alone: a longer one made
   the fork server's socket path too long for AF_UNIX). pip's download cache is kept
   (``PIP_CACHE_DIR`` stays where it was): a CI runner has one too;
3. drops the kernel's page cache where this machine allows it (``sync; echo 3 > /proc/sys/vm/drop_caches``, as
   root or through ``sudo -n``; otherwise it says so and goes on: the figure is then page-warm);
4. runs ``.ci/run`` under ``/usr/bin/time -v`` (where installed), with ``PYTEST_ADDOPTS`` adding pytest's
   per-test durations and the per-test CPU seconds plugin (``tests/cpu_seconds.py``);
5. writes into the work folder ``ci.log`` (the whole output), ``cpu.jsonl`` (one line per test: wall, CPU of the
   worker, CPU of the subprocesses it waited for) and ``summary.md`` (the total wall and CPU seconds, CPU per
   module, the 25 dearest tests), and prints the summary.

It takes 10 to 25 minutes of both cores on this project's 2-core machine: run it on a machine nothing else uses.

Usage (from the repository root, in the project's virtualenv)::

    python -m studies.cold_ci                         # HEAD, in a temporary folder (kept; its path is printed)
    python -m studies.cold_ci --commit 5758d35 --work /tmp/cold
    python -m studies.cold_ci --summarize /tmp/cold   # the summary of a finished run again

Not an asv benchmark: asv imports this module while discovering benchmarks, so importing it does nothing; the work
happens under ``__main__``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

__all__ = ["cold_environment", "drop_page_cache", "summarize", "main"]

ROOT = Path(__file__).resolve().parents[1]
CACHES = {
    "TORCHINDUCTOR_CACHE_DIR": "inductor",
    "ATTNBENCH_CACHE": "attnbench",
    "XDG_CACHE_HOME": "xdg-cache",
    "MPLCONFIGDIR": "matplotlib",
}
"""Each variable the cold run sets, and the empty folder (under the work folder's ``caches/``) it points at."""


def _pip_cache_dir() -> str | None:
    """Where pip keeps its downloads now (None: pip does not say)."""
    out = subprocess.run(
        [sys.executable, "-m", "pip", "cache", "dir"], capture_output=True, text=True
    )
    return out.stdout.strip() or None if out.returncode == 0 else None


def cold_environment(work: Path, environ: dict[str, str] | None = None) -> dict[str, str]:
    """This environment with every cache of :data:`CACHES` pointed at a new, empty folder under ``work/caches``.

    pip's download cache stays where it is (``PIP_CACHE_DIR``), although ``XDG_CACHE_HOME`` moves.

    Raises:
        ValueError: ``work/caches`` exists already and holds something (a cache is never reused by mistake).
    """
    env = dict(os.environ if environ is None else environ)
    root = work / "caches"
    if root.exists() and any(root.iterdir()):
        raise ValueError(f"work: {root} is not empty; give a new --work folder")
    pip = env.get("PIP_CACHE_DIR") or _pip_cache_dir()
    for name, folder in CACHES.items():
        (root / folder).mkdir(parents=True, exist_ok=True)
        env[name] = str(root / folder)
    if pip:
        env["PIP_CACHE_DIR"] = pip
    return env


def drop_page_cache() -> str:
    """Ask the kernel to drop its page cache: what happened, in words (it is never an error not to be allowed)."""
    os.sync()
    try:
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
        return "page cache dropped"
    except OSError:
        pass
    if shutil.which("sudo"):
        out = subprocess.run(
            ["sudo", "-n", "sh", "-c", "sync; echo 3 > /proc/sys/vm/drop_caches"],
            capture_output=True,
        )
        if out.returncode == 0:
            return "page cache dropped (sudo)"
    return "page cache NOT dropped (not allowed here): the run reads files the page cache may hold"


def _clone(commit: str, into: Path) -> str:
    """A fresh clone of this repository at ``commit`` in ``into``; the full hash."""
    subprocess.run(["git", "clone", "--quiet", "--no-local", str(ROOT), str(into)], check=True)
    # a branch, as CI's clone of main has: the tests clone this clone with --branch HEAD, which a
    # detached HEAD refuses
    subprocess.run(["git", "checkout", "--quiet", "-B", "main", commit], cwd=into, check=True)
    out = subprocess.run(["git", "rev-parse", "HEAD"], cwd=into, capture_output=True, text=True)
    return out.stdout.strip()


def _run_ci(clone: Path, env: dict[str, str], work: Path) -> tuple[int, float]:
    """``.ci/run`` in ``clone`` under ``/usr/bin/time -v`` where installed: its exit status and wall seconds."""
    env = {
        **env,
        "ATTNBENCH_TEST_CPU_LOG": str(work / "cpu.jsonl"),
        "PYTEST_ADDOPTS": " ".join(
            filter(None, [env.get("PYTEST_ADDOPTS", ""), "-p tests.cpu_seconds --durations=40"])
        ),
    }
    timer = ["/usr/bin/time", "-v"] if Path("/usr/bin/time").exists() else []
    start = time.perf_counter()
    with open(work / "ci.log", "wb") as log:
        code = subprocess.run(
            [*timer, str(clone / ".ci" / "run")], cwd=clone, env=env, stdout=log, stderr=log
        ).returncode
    return code, time.perf_counter() - start


def summarize(work: Path, top: int = 25) -> str:
    """``summary.md`` of a finished run in ``work``: totals, CPU per module, the dearest tests (Markdown)."""
    lines = [json.loads(x) for x in (work / "cpu.jsonl").read_text().splitlines() if x.strip()]
    meta = json.loads((work / "meta.json").read_text()) if (work / "meta.json").exists() else {}
    per_module: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    for r in lines:
        m = per_module[r["test"].split("::")[0]]
        m[0] += r["cpu_s"] + r["children_cpu_s"]
        m[1] += r["wall_s"]
        m[2] += 1
    cpu = sum(r["cpu_s"] + r["children_cpu_s"] for r in lines)
    out = [
        f"# .ci/run from cold at {meta.get('commit', '?')[:10]}",
        "",
        f"- {meta.get('date', '?')}, exit {meta.get('exit', '?')}, "
        f"{meta.get('wall_s', float('nan')):.0f} s wall in all; {meta.get('page_cache', '')}",
        f"- {len(lines)} tests, {cpu:.0f} CPU seconds in the tests and the subprocesses they waited for",
        "",
        "| module | tests | CPU s | wall s (summed over workers) |",
        "|---|---:|---:|---:|",
        *(
            f"| {name} | {n} | {c:.0f} | {w:.0f} |"
            for name, (c, w, n) in sorted(per_module.items(), key=lambda kv: -kv[1][0])
        ),
        "",
        f"The {top} dearest tests (CPU s: own + subprocesses', wall s):",
        "",
        *(
            f"- {r['cpu_s'] + r['children_cpu_s']:.1f} ({r['cpu_s']:.1f} + {r['children_cpu_s']:.1f}), "
            f"{r['wall_s']:.1f} s: {r['test']}"
            for r in sorted(lines, key=lambda r: -(r["cpu_s"] + r["children_cpu_s"]))[:top]
        ),
        "",
        "The whole process tree's user and system seconds are at the end of ci.log (`/usr/bin/time -v`).",
    ]
    text = "\n".join(out) + "\n"
    (work / "summary.md").write_text(text)
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--commit", default="HEAD", help="the commit to clone (default HEAD)")
    parser.add_argument("--work", type=Path, help="a new folder for the clone, caches and logs")
    parser.add_argument("--summarize", type=Path, metavar="WORK", help="summarize a finished run")
    args = parser.parse_args(argv)
    if args.summarize:
        print(summarize(args.summarize))
        return 0
    work = (args.work or Path(tempfile.mkdtemp(prefix="attnbench-cold-"))).resolve()
    work.mkdir(parents=True, exist_ok=True)
    commit = _clone(
        subprocess.run(
            ["git", "rev-parse", args.commit], cwd=ROOT, capture_output=True, text=True, check=True
        ).stdout.strip(),
        work / "clone",
    )
    env = cold_environment(work)
    page_cache = drop_page_cache()
    print(f"cold CI of {commit[:10]} in {work}: {page_cache}", flush=True)
    code, wall = _run_ci(work / "clone", env, work)
    meta = {
        "commit": commit,
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "exit": code,
        "wall_s": wall,
        "page_cache": page_cache,
    }
    (work / "meta.json").write_text(json.dumps(meta))
    print(summarize(work))
    return code


if __name__ == "__main__":
    sys.exit(main())
