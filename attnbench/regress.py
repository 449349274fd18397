"""Regression gate: benchmark BASE and HEAD with asv, read the results, decide.

``asv continuous`` exits 1 for a regression *and* for usage errors, and ``asv compare`` always exits
0, so this gate never trusts asv's exit code for the verdict: it runs ``asv run`` on both commits
(interleaved rounds, fixed threads, a small CI subset of the grid), loads the result files with
:func:`attnbench.analysis.frame.load_asv` and compares them itself.

Verdict per (benchmark, parameters), with ratio = HEAD / BASE:
  * time (``time_attention``): regression when ratio > ``time_factor`` x (1 + IQR/median of BASE)
    *and* HEAD's 99% interval lies above BASE's (asv records ``ci_99``). The IQR term scales the
    factor by the benchmark's own process-to-process noise: asv's interval is for the median and
    narrows with more samples even when separate processes disagree by 25-35% (``local`` here),
    while stable benchmarks (3-9% IQR) keep close to the nominal 1.2.
    Whenever any time ratio exceeds the factor, flagged or not, the time benchmark runs again on
    both commits (``--append-samples``: more interleaved process rounds) and the verdict is taken
    on the combined samples. Two rounds on a shared machine can put non-overlapping intervals around
    the same code (seen here: x1.39 on an unchanged commit) and, under heavy load, overlapping
    intervals around a real 2x slowdown; more samples settle both;
  * deterministic metrics (peak tensor bytes, analytic FLOPs): regression when
    ratio > ``memory_factor`` (default 1.1) for bytes and ratio > 1 for FLOPs: no noise to forgive;
  * a case that ran on BASE but failed on HEAD is a regression; n/a on both is ignored;
  * correctness (``AttentionAccuracy.track_error_ratio``, error / tolerance of the timed closure's
    result): a case that was right on BASE and is wrong on HEAD (ratio above 1, or a loader status
    ``wrong``) fails the gate with verdict ``wrong`` on every row of that case. asv's timing setup
    refuses a wrong result, so its time row is missing on HEAD, not a fast number.

Exit codes of ``attnbench regress``: 0 nothing regressed, 1 something regressed (a table names it),
2 usage error, 3 the benchmarks could not be measured (asv failed to build or run a commit).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis.frame import load_asv

CI_SUBSET = {
    contract.ENV_VARIANTS: "batched,chunked,sdpa,local,linear_elu",
    contract.ENV_LENGTHS: "256,512,1024",
    contract.ENV_MODES: "forward",
    contract.ENV_DEVICES: "cpu",
}
"""Short lengths and a few representative variants: finishes in minutes on 2 cores."""
TIME_BENCHMARK = contract.TIME_BENCHMARK
GATED = "|".join(contract.GATED_BENCHMARKS)
THREADS = "1"  # one intra-op thread: the least noisy choice on a shared 2-core machine
MMAP_THRESHOLD = str(128 * 1024)
"""glibc's mmap threshold, pinned: by default glibc raises it after freeing a large block, so whether a
process page-faults fresh memory on every call depends on its history. Identical code then timed 2x
apart between processes (batched, L=256: 1.8 vs 3.7 ms); pinned, every process allocates alike."""


class RegressError(RuntimeError):
    """The comparison could not be made (exit code 3)."""


@dataclass(frozen=True)
class Outcome:
    """The gate's decision and the table behind it."""

    table: pd.DataFrame  # one row per compared case: metric, variant, params, base, head, ratio, verdict
    regressions: pd.DataFrame  # the rows with verdict "regressed" or "wrong"
    base: str  # full commit hash
    head: str  # full commit hash
    results_dir: Path  # where asv wrote its results

    @property
    def passed(self) -> bool:
        return self.regressions.empty


def _git(repo: Path, *args: str) -> str:
    out = subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True)
    if out.returncode != 0:
        raise ValueError(f"git {' '.join(args)} failed in {repo}: {out.stderr.strip()}")
    return out.stdout.strip()


def _asv(args: list[str], *, cwd: Path, env: dict[str, str], log) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "asv", *args]
    out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{out.stdout}\n{out.stderr}\n")
    return out


def output_tail(out: subprocess.CompletedProcess, lines: int = 25) -> str:
    """The last ``lines`` whole lines of a process's stdout and stderr (for error messages)."""
    text = "\n".join(part.strip("\n") for part in (out.stdout or "", out.stderr or "") if part and part.strip())
    tail = text.splitlines()[-lines:]
    return "\n".join(f"  {line}" for line in tail) if tail else "  (no output)"


def _config(repo: Path, work: Path) -> Path:
    """The repository's asv.conf.json with results, envs and html redirected under ``work``."""
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    conf.update(  # joining an absolute path keeps it as it is
        repo=str(repo), benchmark_dir=str(repo / conf.get("benchmark_dir", "benchmarks")),
        results_dir=str(work / "results"), html_dir=str(work / "html"),
        env_dir=str(repo / conf.get("env_dir", ".asv/env")),  # envs are reused across gate runs
    )
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def compare(frame: pd.DataFrame, base: str, head: str, time_factor: float = 1.2, memory_factor: float = 1.1) -> pd.DataFrame:
    """Side-by-side BASE/HEAD table with a verdict per case (see the module docstring).

    Verdicts: ``ok``, ``regressed``, ``n/a``, and ``wrong``: the case ran on BASE and HEAD's result
    fails the correctness gate (an ``error_ratio`` above 1, or a row the loader marked ``wrong``).
    Every row of such a case reads ``wrong`` where it would otherwise be ``regressed`` or ``ok``
    (HEAD's timings of a wrong result are not comparable), so the failure names its cause.
    """
    keys = ["benchmark", "variant", "seq_len", "device", "mode", "metric"]
    case_keys = ["variant", "seq_len", "device", "mode"]
    sides = {}
    for name, commit in (("base", base), ("head", head)):
        side = frame[frame["commit"] == commit].drop_duplicates(keys, keep="last").set_index(keys)
        sides[name] = side[["value", "status", "spread", "ci_low", "ci_high"]].add_prefix(f"{name}_")
    table = sides["base"].join(sides["head"], how="outer").reset_index()
    head_rows = table[table["head_status"].notna()]
    gate_failed = (head_rows["head_status"] == "wrong") | (
        (head_rows["metric"] == "error_ratio") & (head_rows["head_status"] == "ok") & (head_rows["head_value"] > 1.0))
    wrong_cases = {tuple(r) for r in head_rows.loc[gate_failed, case_keys].itertuples(index=False)}
    verdicts, ratios = [], []
    for rec in table.to_dict("records"):
        b_ok, h_ok = rec["base_status"] == "ok", rec["head_status"] == "ok"
        ratio = rec["head_value"] / rec["base_value"] if b_ok and h_ok and rec["base_value"] else math.nan
        ratios.append(ratio)
        if b_ok and tuple(rec[k] for k in case_keys) in wrong_cases:
            verdicts.append("wrong")  # right on BASE, wrong on HEAD: the gate fails whatever the speed
        elif b_ok and not h_ok:
            verdicts.append("regressed")  # ran on BASE, does not on HEAD
        elif not (b_ok and h_ok):
            verdicts.append("n/a")
        elif rec["metric"] == "error_ratio":
            verdicts.append("ok")  # within tolerance on HEAD (above it is "wrong" above)
        elif rec["metric"] == "time":
            overlap = rec["head_ci_low"] <= rec["base_ci_high"]  # False when either bound is unknown
            noise = rec["base_spread"] / rec["base_value"] if not pd.isna(rec["base_spread"]) else 0.0
            verdicts.append("regressed" if ratio > time_factor * (1.0 + noise) and not overlap else "ok")
        elif rec["metric"] == "flops":
            verdicts.append("regressed" if ratio > 1.0 + 1e-9 else "ok")
        else:
            verdicts.append("regressed" if ratio > memory_factor else "ok")
    table["ratio"] = ratios
    table["verdict"] = verdicts
    return table


def regress(
    base: str,
    head: str,
    *,
    repo: str | Path = ".",
    time_factor: float = 1.2,
    memory_factor: float = 1.1,
    rounds: int = 2,
    subset: dict[str, str] | None = None,
    work_dir: str | Path | None = None,
    machine: str = "attnbench-ci",
    log_path: str | Path | None = None,
) -> Outcome:
    """Benchmark ``base`` and ``head`` of ``repo`` with asv and compare them.

    Args:
        base, head: any git revisions (branch, tag, hash, ``HEAD~1``).
        repo: the attnbench checkout (its asv.conf.json and benchmarks/ are used).
        time_factor: allowed HEAD/BASE time ratio.
        memory_factor: allowed HEAD/BASE peak tensor bytes ratio.
        rounds: asv rounds, interleaved across the two commits.
        subset: grid environment (default :data:`CI_SUBSET`).
        work_dir: where results and the asv log go (default: a new temporary directory); a relative path is
            taken from the current directory.
        machine: asv machine name to record results under.
        log_path: file receiving asv's full output (default ``<work_dir>/asv.log``).

    Raises:
        ValueError: bad arguments (unknown revision, BASE and HEAD the same commit, bad factors).
        RegressError: asv could not produce results for both commits.
    """
    if time_factor <= 1 or memory_factor <= 1:
        raise ValueError(f"time_factor and memory_factor must be > 1, got {time_factor}, {memory_factor}")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    repo = Path(repo).resolve()
    if not (repo / "asv.conf.json").exists():
        raise ValueError(f"repo must be an attnbench checkout with asv.conf.json, got {repo}")
    base_hash = _git(repo, "rev-parse", "--verify", f"{base}^{{commit}}")
    head_hash = _git(repo, "rev-parse", "--verify", f"{head}^{{commit}}")
    if base_hash == head_hash:
        raise ValueError(f"BASE {base!r} and HEAD {head!r} are the same commit ({base_hash[:12]}): nothing to compare")
    # Relative to where the caller stands, resolved now: asv runs with cwd=work, where a relative path
    # would be taken a second time (".asv/regress/.asv/regress").
    work = Path(work_dir).resolve() if work_dir else Path(tempfile.mkdtemp(prefix="attnbench-regress-"))
    work.mkdir(parents=True, exist_ok=True)
    conf = _config(repo, work)
    (work / "hashes.txt").write_text(f"{base_hash}\n{head_hash}\n")
    env = {**os.environ, **(subset or CI_SUBSET), "OMP_NUM_THREADS": THREADS, "MKL_NUM_THREADS": THREADS,
           "MALLOC_MMAP_THRESHOLD_": MMAP_THRESHOLD}
    run = ["run", f"HASHFILE:{work / 'hashes.txt'}", "--config", str(conf), "--machine", machine,
           "--interleave-rounds", "--attribute", f"rounds={rounds}", "--record-samples", "--show-stderr"]
    log_file = Path(log_path or work / "asv.log")
    with open(log_file, "a", encoding="utf-8") as log:
        machine_out = _asv(["machine", "--yes", "--machine", machine, "--config", str(conf)], cwd=work, env=env, log=log)
        if machine_out.returncode != 0:
            raise RegressError(f"asv machine failed (exit {machine_out.returncode}):\n{output_tail(machine_out)}\nfull log: {log_file}")
        # Exit codes are deliberately unused: the result files are the truth.
        _asv([*run, "--bench", GATED], cwd=work, env=env, log=log)
        table = _compare_results(work, machine, base_hash, head_hash, time_factor, memory_factor, log_file)
        confirmed = 0
        if ((table["metric"] == "time") & (table["ratio"] > time_factor)).any():  # suspicious: gather more samples
            _asv([*run, "--bench", TIME_BENCHMARK, "--append-samples"], cwd=work, env=env, log=log)
            table = _compare_results(work, machine, base_hash, head_hash, time_factor, memory_factor, log_file)
            confirmed = 1
    table["confirmation_runs"] = confirmed
    return Outcome(table=table, regressions=table[table["verdict"].isin(["regressed", "wrong"])], base=base_hash, head=head_hash, results_dir=work / "results")


def _compare_results(work: Path, machine: str, base: str, head: str, time_factor: float, memory_factor: float, log: Path) -> pd.DataFrame:
    frame = load_asv(work / "results")
    frame = frame[frame["machine"] == machine]
    missing = [c for c in (base, head) if c not in set(frame["commit"])]
    if missing:
        try:
            tail = "\n".join(f"  {line}" for line in log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        except OSError:
            tail = "  (log unreadable)"
        raise RegressError(f"asv produced no results for {', '.join(m[:10] for m in missing)}; the end of {log}:\n{tail}")
    return compare(frame, base, head, time_factor, memory_factor)
