"""Regression gate: benchmark BASE and HEAD with asv, read the results, decide.

``asv continuous`` exits 1 for a regression *and* for usage errors, and ``asv compare`` always exits
0, so this gate never trusts asv's exit code for the verdict: it runs ``asv run`` on both commits
(interleaved rounds, fixed threads, a small CI subset of the grid), loads the result files with
:func:`attnbench.analysis.frame.load_asv` and compares them itself.

Verdict per (benchmark, parameters), with ratio = HEAD / BASE (medians):
  * time (``time_attention``): decided by :func:`attnbench.analysis.significance.decide` on the
    samples of every process round (as measured and speed-corrected, below; asv's ``--record-samples``
    alone where a commit logs none): ``regressed`` when the ratio is beyond the allowance
    (``time_factor`` x (1 + IQR/median of BASE), capped at 1.3) and significant (one-sided
    Mann-Whitney U, bootstrap interval of the ratio above 1); ``ok`` when it is within the allowance
    and the interval excludes a 1.5x slowdown; otherwise ``undecided``. Any undecided time case first
    gets a confirmation round: both commits run again with ``--append-samples`` (more interleaved
    process rounds) and the decision is taken on the combined samples. Every time round also carries
    the calibration probe of ``attnbench run`` (timed just before each sample and logged with it by
    :func:`attnbench.asv_bench.timed_teardown`), and a verdict needs the samples in units of their
    probe (:func:`read_corrected`: the machine's speed steps, and probe and a compute-bound sample step
    together) to agree with the samples as measured. A case whose samples a neighbour descheduled on
    either side (the run-queue wait, :func:`descheduled`), or, without corrected samples, whose probes
    strayed from typical (:func:`disturbance`), is ``undecided`` ("noisy: ..."), never ``regressed``
    or ``ok``, whatever its p-value (the samples of a round are not independent when a neighbour comes
    and goes). A case still undecided (or without recorded samples) is reported as such, with its own
    exit code: never a silent pass;
  * deterministic metrics (peak tensor bytes, analytic FLOPs): regression when
    ratio > ``memory_factor`` (default 1.1) for bytes and ratio > 1 for FLOPs: no noise to forgive;
  * a case that ran on BASE but failed on HEAD is a regression; n/a on both is ignored;
  * correctness (``AttentionAccuracy.track_error_ratio``, error / tolerance of the timed closure's
    result): a case that was right on BASE and is wrong on HEAD (ratio above 1, or a loader status
    ``wrong``) fails the gate with verdict ``wrong`` on every row of that case. asv's timing setup
    refuses a wrong result, so its time row is missing on HEAD, not a fast number.

Every asv process runs in the measurement regime of :mod:`attnbench.measure.regime` (its
``child_env``: threads and allocator thresholds from interpreter start; ``attnbench.asv_bench``
applies it again at import).

Exit codes of ``attnbench regress``: 0 nothing regressed (every case decided), 1 something regressed
or is wrong (a table names it), 2 usage error (bad revision, BASE == HEAD, a factor that is nan, inf
or <= 1), 3 the benchmarks could not be measured (asv failed to build or run a commit), 4 could not
decide: no regression found, but some time case stayed undecided after the confirmation round.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from attnbench import contract
from attnbench.analysis import significance
from attnbench.analysis.frame import decode_param, load_asv
from attnbench.io import check_writable_dir, output_tail
from attnbench.measure import probe, regime, schedstat
from attnbench.measure.instructions import missing_message, valgrind_version

CI_SUBSET = contract.grid_environment(contract.GRIDS["ci"])
"""The ``ci`` grid (short lengths, a few representative variants: minutes on 2 cores) as asv's grid variables."""
TIME_BENCHMARK = contract.TIME_BENCHMARK
GATED = "|".join(contract.GATED_BENCHMARKS)
INSTRUCTIONS = contract.INSTRUCTIONS_BENCHMARK
REGIME = regime.Regime(threads=regime.DEFAULT_THREADS)
"""The regime asv's processes start in (threads, pinned allocator thresholds), as for ``attnbench run``."""
CASE_KEYS = ("variant", "seq_len", "device", "mode", "mask")
PROBES = "probes.jsonl"
"""The calibration probes of the gate's time rounds, in its work directory."""
SampleKey = tuple  # (commit, variant, seq_len, device, mode, mask)


class RegressError(RuntimeError):
    """The comparison could not be made (exit code 3)."""


@dataclass(frozen=True)
class Outcome:
    """The gate's decision and the table behind it."""

    table: pd.DataFrame  # one row per compared case: metric, variant, params, base, head, ratio, verdict
    regressions: pd.DataFrame  # the rows with verdict "regressed" or "wrong"
    undecided: pd.DataFrame  # time rows the gate could not decide, even after the confirmation round
    base: str  # full commit hash
    head: str  # full commit hash
    results_dir: Path  # where asv wrote its results

    @property
    def passed(self) -> bool:
        """Nothing regressed and every time case was decided."""
        return self.regressions.empty and self.undecided.empty


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


def _config(repo: Path, work: Path) -> Path:
    """The repository's asv.conf.json with results, envs and html redirected under ``work``."""
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    conf.update(  # joining an absolute path keeps it as it is
        repo=str(repo), benchmark_dir=str(repo / conf.get("benchmark_dir", "benchmarks")),
        results_dir=str(work / "results"), html_dir=str(work / "html"),
        # envs are reused across gate runs (and across clones, with ATTNBENCH_ASV_ENV_DIR)
        env_dir=str(Path(os.environ.get(contract.ENV_ENV_DIR) or repo / conf.get("env_dir", ".asv/env")).resolve()),
    )
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def read_time_samples(results_dir: str | Path, machine: str) -> dict[SampleKey, list[float]]:
    """Recorded timing samples of ``time_attention`` per (commit, variant, seq_len, device, mode).

    Read with :meth:`asv.results.Results.get_result_samples` (asv keeps them with ``--record-samples``;
    ``--append-samples`` adds a later round's to the same list). Parameter sets without samples are absent.
    """
    from asv import util
    from asv.results import Results

    results_dir = Path(results_dir)
    benchmarks = util.load_json(str(results_dir / "benchmarks.json"), api_version=2)
    out: dict[SampleKey, list[float]] = {}
    for path in sorted((results_dir / machine).glob("*.json")):
        if path.name == "machine.json":
            continue
        res = Results.load(str(path))
        for key in res.get_result_keys(benchmarks):
            if not key.endswith(TIME_BENCHMARK):
                continue
            names = benchmarks[key].get("param_names", [])
            params = res.get_result_params(key)
            samples = res.get_result_samples(key, params)
            for combo, got in zip(itertools.product(*params), samples, strict=True):
                case = dict(zip(names, (decode_param(p) for p in combo), strict=True))
                if got:
                    k = (res.commit_hash, *(case.get(c, d) for c, d in zip(CASE_KEYS, ("", 0, "cpu", "forward", "none"), strict=True)))
                    out.setdefault(k, []).extend(float(x) for x in got if x is not None)
    return out


GATE_METRICS = ("time", "instructions", "both")
"""What decides: wall time (samples and probes), instruction counts (valgrind), or both."""
INSTRUCTIONS_FACTOR = contract.INSTRUCTIONS_FACTOR
DISAGREE_TIME = 1.5
"""A time regression this large beside flat counts is a disagreement worth a note (the gate's never-forgiven slowdown)."""
DESCHEDULED_LIMIT = schedstat.WAIT_LIMIT
"""A time sample that waited for a core more than this share of its wall time was descheduled by a neighbour (the
runner's blocks are judged by the same limit)."""
NOISY_SHARE = 0.1
"""A side whose rounds had more than this share of probes beyond ``probe.SLOWDOWN_LIMIT`` of typical is disturbed."""


def _log_lines(path: str | Path) -> Iterator[tuple[SampleKey, dict]]:
    """The lines of the gate's probe log with their case; a garbled line (a killed writer) is skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            rec = json.loads(line)
            yield (rec["commit"], rec["variant"], rec["seq_len"], rec["device"], rec["mode"], rec["mask"]), rec
        except (ValueError, KeyError, TypeError):
            continue


def _value(rec: dict, field: str) -> float:
    """``rec[field]`` as a finite number >= 0, else NaN."""
    try:
        value = float(rec[field])
    except (KeyError, TypeError, ValueError):
        return math.nan
    return value if value >= 0 and math.isfinite(value) else math.nan


def read_probes(path: str | Path, field: str = "probe_s") -> dict[SampleKey, list[float]]:
    """The calibration probes the time benchmarks recorded (:func:`attnbench.asv_bench.timed_teardown`), per case;
    ``field="runqueue_share"``: their samples' run-queue shares instead.

    A garbled line or a missing value is skipped; a missing file gives none.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        if not math.isnan(value := _value(rec, field)):
            out.setdefault(key, []).append(value)
    return out


def read_corrected(path: str | Path) -> dict[SampleKey, list[float]]:
    """Per case, each time sample in units of the probe timed just before it (``sample_s / probe_s``, lines of
    :func:`attnbench.asv_bench.timed_teardown`): the sample at the machine's speed of that moment.

    This shared machine's speed steps by 1.3-1.5x for seconds to minutes at a time (a host neighbour: every probe
    and every sample of those moments move together, and nothing waits in this machine's run queue); rounds of
    BASE and HEAD measured in different moments differ by that much with nothing changed. Divided by the probe
    timed beside them a compute-bound case does not; a memory-bound one follows the probe less, so a verdict needs
    these and the samples as measured to agree. Lines without a sample (a commit that logged probes only) are
    skipped.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        sample, probe_s = _value(rec, "sample_s"), _value(rec, "probe_s")
        if sample > 0 and probe_s > 0:
            out.setdefault(key, []).append(sample / probe_s)
    return out


def disturbance(probes: list[float], typical: float) -> str:
    """Why a side's rounds are not to be decided on ("" when undisturbed): the runner's probe rule, per round.

    ``typical`` is the median probe of the whole gate run (both commits, interleaved: the same machine state
    they were meant to share). A side is disturbed when more than :data:`NOISY_SHARE` of its probes
    deviate more than ``probe.SLOWDOWN_LIMIT`` x from it, either way.
    """
    if not probes or not typical > 0:
        return ""
    ratios = [p / typical for p in probes if p > 0]
    off = [r for r in ratios if max(r, 1 / r) > probe.SLOWDOWN_LIMIT]
    if len(off) <= NOISY_SHARE * len(ratios):
        return ""
    worst = max(off, key=lambda r: max(r, 1 / r))
    way = f"{worst:.2f}x slower" if worst > 1 else f"{1 / worst:.2f}x faster"
    return f"{len(off)} of {len(ratios)} calibration probes beyond {probe.SLOWDOWN_LIMIT}x of typical (up to {way})"


def descheduled(shares: list[float]) -> str:
    """Why a side's rounds are not to be decided on ("" when undisturbed): the run-queue rule, per sample.

    ``shares`` are the run-queue seconds per wall second of each sample's timed calls (:class:`attnbench.asv_bench.
    WaitWatch`). A side is disturbed when more than :data:`NOISY_SHARE` of its samples waited for a core more than
    :data:`DESCHEDULED_LIMIT` of their wall time: another process had it.
    """
    off = [s for s in shares if s > DESCHEDULED_LIMIT]
    if not shares or len(off) <= NOISY_SHARE * len(shares):
        return ""
    return (f"{len(off)} of {len(shares)} samples waited for a core over {DESCHEDULED_LIMIT:.0%} of their wall time "
            f"(up to {max(off):.0%})")


def _typical_probes(probes: dict[SampleKey, list[float]]) -> dict[str, float]:
    """Per device: the median probe of the whole gate run (both commits, interleaved)."""
    pooled: dict[str, list[float]] = {}
    for key, values in probes.items():
        pooled.setdefault(key[3], []).extend(values)
    return {device: statistics.median(values) for device, values in pooled.items()}


def _time_verdict(rec: dict, base: str, head: str, time_factor: float, samples: dict, probes: dict,
                  typical: dict[str, float], runqueue_shares: dict, corrected: dict) -> tuple[str, float, str]:
    """``(verdict, ratio, reason)`` of one time row both sides ran: disturbed rounds are never decided.

    Where both sides logged their samples with the probe beside each (:func:`read_corrected`), the samples as
    measured and the speed-corrected ones must agree: a step of the machine's speed moves a compute-bound case with
    the probe and a memory-bound one less, so the truth lies between the two. Only a neighbour in this machine's run
    queue makes such a side noisy. Otherwise asv's samples decide, and a side whose probes strayed from typical is
    noisy too.
    """
    case = tuple(rec[k] for k in CASE_KEYS)
    decision = significance.decide(samples.get((base, *case), []), samples.get((head, *case), []), time_factor)
    base_corrected, head_corrected = corrected.get((base, *case), []), corrected.get((head, *case), [])
    speed_corrected = min(len(base_corrected), len(head_corrected)) >= significance.MIN_SAMPLES

    def why(commit: str) -> str:
        key = (commit, *case)
        strayed = "" if speed_corrected else disturbance(probes.get(key, []), typical.get(rec["device"], math.nan))
        return "; ".join(filter(None, (strayed, descheduled(runqueue_shares.get(key, [])))))

    noisy = "; ".join(f"{side}: {reason}" for side, commit in (("BASE", base), ("HEAD", head)) if (reason := why(commit)))
    if noisy:
        return "undecided", decision.ratio, f"noisy: {noisy} (measured x{decision.ratio:.2f})"
    if not speed_corrected:
        return decision.verdict, decision.ratio, decision.reason
    fixed = significance.decide(base_corrected, head_corrected, time_factor)
    if fixed.verdict == decision.verdict:
        return fixed.verdict, fixed.ratio, f"speed-corrected {fixed.reason}; as measured x{decision.ratio:.2f}"
    return "undecided", fixed.ratio, (f"speed-corrected {fixed.verdict} ({fixed.reason}) but {decision.verdict} as measured "
                                      f"({decision.reason}): the machine's speed moved")


def compare(
    frame: pd.DataFrame, base: str, head: str, time_factor: float = 1.2, memory_factor: float = 1.1,
    samples: dict[SampleKey, list[float]] | None = None, probes: dict[SampleKey, list[float]] | None = None,
    *, metric: str = "time", instructions_factor: float = INSTRUCTIONS_FACTOR,
    runqueue_shares: dict[SampleKey, list[float]] | None = None, corrected: dict[SampleKey, list[float]] | None = None,
) -> pd.DataFrame:
    """Side-by-side BASE/HEAD table with a verdict per case (see the module docstring).

    ``samples`` maps ``(commit, variant, seq_len, device, mode, mask)`` to recorded time samples
    (:func:`read_time_samples`); a time row without samples on both sides is ``undecided``. ``probes``
    maps the same keys to the calibration probes of its rounds (:func:`read_probes`): a time case whose
    rounds were disturbed on either side (:func:`disturbance`) is ``undecided`` with the reason "noisy: ...",
    never ``regressed`` or ``ok``. ``runqueue_shares`` (``read_probes(path, "runqueue_share")``) hold the same
    keys' run-queue shares of their samples: a side whose samples often waited for a core (:func:`descheduled`) is
    noisy too. ``corrected`` (:func:`read_corrected`) holds the same keys' samples in units of the probe timed
    before each: where both sides have them, a time case is decided only where they and the samples as measured
    agree, and the probes' straying from typical is no longer a disturbance (the correction takes it out). A side
    without them (a commit older than them) is decided as before.
    Instruction counts regress beyond ``instructions_factor``, with no confirmation and no ``undecided``.

    ``metric`` says what decides the time-like rows: ``"time"`` the timings, ``"instructions"`` the counts
    (time rows are ``shown``, for the disagreement notes), ``"both"`` both (a time row left ``undecided``
    is ``shown`` when its case's count was decided).

    Verdicts: ``ok``, ``regressed``, ``undecided`` (time only), ``shown``, ``n/a``, and ``wrong``: the case ran on
    BASE and HEAD's result fails the correctness gate (an ``error_ratio`` above 1, or a row the loader marked
    ``wrong``). Every row of such a case reads ``wrong`` where it would otherwise be ``regressed`` or ``ok``
    (HEAD's timings of a wrong result are not comparable), so the failure names its cause. ``note`` says where
    counts and time disagree (:func:`disagreements`).
    """
    if metric not in GATE_METRICS:
        raise ValueError(f"metric must be one of {GATE_METRICS}, got {metric!r}")
    if "mask" not in frame.columns:  # results from before the asv grid had a mask parameter
        frame = frame.assign(mask="none")
    keys = ["benchmark", "variant", "seq_len", "device", "mode", "mask", "metric"]
    case_keys = list(CASE_KEYS)
    sides = {}
    for name, commit in (("base", base), ("head", head)):
        side = frame[frame["commit"] == commit].drop_duplicates(keys, keep="last").set_index(keys)
        sides[name] = side[["value", "status", "spread", "ci_low", "ci_high"]].add_prefix(f"{name}_")
    table = sides["base"].join(sides["head"], how="outer").reset_index()
    head_rows = table[table["head_status"].notna()]
    gate_failed = (head_rows["head_status"] == "wrong") | (
        (head_rows["metric"] == "error_ratio") & (head_rows["head_status"] == "ok") & (head_rows["head_value"] > 1.0))
    wrong_cases = {tuple(r) for r in head_rows.loc[gate_failed, case_keys].itertuples(index=False)}
    time_factor = significance.check_factor("time_factor", time_factor)
    memory_factor = significance.check_factor("memory_factor", memory_factor)
    instructions_factor = significance.check_factor("instructions_factor", instructions_factor)
    samples, probes = samples or {}, probes or {}
    typical = _typical_probes(probes)
    verdicts, ratios, reasons = [], [], []
    for rec in table.to_dict("records"):
        b_ok, h_ok = rec["base_status"] == "ok", rec["head_status"] == "ok"
        ratio = rec["head_value"] / rec["base_value"] if b_ok and h_ok and rec["base_value"] else math.nan
        verdict, reason = "ok", ""
        if b_ok and tuple(rec[k] for k in case_keys) in wrong_cases:
            verdict = "wrong"  # right on BASE, wrong on HEAD: the gate fails whatever the speed
        elif b_ok and not h_ok:
            verdict = "regressed"  # ran on BASE, does not on HEAD
        elif not (b_ok and h_ok):
            verdict = "n/a"
        elif rec["metric"] == "time":
            verdict, decided_ratio, reason = _time_verdict(rec, base, head, time_factor, samples, probes, typical,
                                                           runqueue_shares or {}, corrected or {})
            ratio = decided_ratio if math.isfinite(decided_ratio) else ratio
        elif rec["metric"] == "instructions":
            verdict = "regressed" if ratio > instructions_factor else "ok"
            reason = f"counts x{ratio:.4f} ({'beyond' if verdict == 'regressed' else 'within'} x{instructions_factor:g})"
        elif rec["metric"] == "flops":
            verdict = "regressed" if ratio > 1.0 + 1e-9 else "ok"
        elif rec["metric"] != "error_ratio":  # an error ratio within tolerance is ok (above it: "wrong")
            verdict = "regressed" if ratio > memory_factor else "ok"
        verdicts.append(verdict)
        ratios.append(ratio)
        reasons.append(reason)
    table["ratio"] = ratios
    table["verdict"] = verdicts
    table["reason"] = reasons
    table["note"] = disagreements(table)
    return _decided_by(table, metric)


def disagreements(table: pd.DataFrame) -> list[str]:
    """Per row, where a case's instruction count and its time disagree ("" elsewhere).

    Each side speaks through its own verdict, so a disturbed time (``undecided``, "noisy") never makes a note.
    Counts within the gate's factor and time regressed by at least :data:`DISAGREE_TIME`: a change counts cannot
    see (cache misses, page faults, memory bandwidth, waiting) or a neighbour the noise checks missed; counts regressed
    and time ``ok``: more work the machine absorbed.
    """
    case = [*CASE_KEYS]
    rows = table[table["ratio"].notna()].set_index(case)
    counts, times = rows[rows["metric"] == "instructions"], rows[rows["metric"] == "time"]
    notes = {}
    for key in counts.index.intersection(times.index):
        (c, c_verdict), (t, t_verdict) = counts.loc[key, ["ratio", "verdict"]], times.loc[key, ["ratio", "verdict"]]
        if c_verdict == "ok" and t_verdict == "regressed" and t >= DISAGREE_TIME:
            notes[key] = (f"time x{t:.2f} with counts flat (x{c:.4f}): a change the counter cannot see "
                          "(cache misses, page faults, bandwidth, waiting), or a neighbour the noise checks missed")
        elif c_verdict == "regressed" and t_verdict == "ok":
            notes[key] = f"counts x{c:.4f} with time within its allowance (x{t:.2f}): more work the machine absorbed"
    return [notes.get(tuple(r), "") if m in ("time", "instructions") else ""
            for r, m in zip(table[case].itertuples(index=False), table["metric"], strict=True)]


def _decided_by(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Time rows the chosen ``metric`` does not decide become ``shown`` (their figures stay in the table)."""
    counted = table[(table["metric"] == "instructions") & table["verdict"].isin(("ok", "regressed"))]
    decided = {tuple(r) for r in counted[list(CASE_KEYS)].itertuples(index=False)}
    is_time = table["metric"] == "time"
    timing = table["verdict"].isin(("ok", "regressed", "undecided"))  # decided by the samples (not a failed case)
    if metric == "instructions":
        hide = is_time & timing
    elif metric == "both":
        case = pd.Series([tuple(r) in decided for r in table[list(CASE_KEYS)].itertuples(index=False)], index=table.index)
        hide = is_time & (table["verdict"] == "undecided") & case
    else:
        return table
    table = table.copy()
    table.loc[hide, "reason"] = ("shown, not deciding (instruction counts decide): " + table.loc[hide, "reason"]).str.rstrip(": ")
    table.loc[hide, "verdict"] = "shown"
    return table


def regress(base: str, head: str, **options) -> Outcome:
    """Benchmark ``base`` and ``head`` of ``repo`` with asv and compare them: :func:`regress_many` with one HEAD.

    Takes the keyword arguments of :func:`regress_many`.
    """
    (outcome,) = regress_many(base, [head], **options).values()
    return outcome


def _commits(repo: Path, base: str, heads: list[str]) -> tuple[str, dict[str, str]]:
    """BASE's full hash and each HEAD's (keyed as given); ValueError for anything that cannot be compared."""
    if not heads:
        raise ValueError("heads must name at least one revision")
    if not (repo / "asv.conf.json").exists():
        raise ValueError(f"repo must be an attnbench checkout with asv.conf.json, got {repo}")
    base_hash = _git(repo, "rev-parse", "--verify", f"{base}^{{commit}}")
    head_hashes = {head: _git(repo, "rev-parse", "--verify", f"{head}^{{commit}}") for head in heads}
    for head, head_hash in head_hashes.items():
        if head_hash == base_hash:
            raise ValueError(f"BASE {base!r} and HEAD {head!r} are the same commit ({base_hash[:12]}): nothing to compare")
    if len(set(head_hashes.values())) < len(heads):
        raise ValueError(f"heads must be different commits, got {heads}")
    return base_hash, head_hashes


def regress_many(
    base: str,
    heads: list[str],
    *,
    repo: str | Path = ".",
    time_factor: float = 1.2,
    memory_factor: float = 1.1,
    rounds: int = 2,
    subset: dict[str, str] | None = None,
    work_dir: str | Path | None = None,
    machine: str = "attnbench-ci",
    log_path: str | Path | None = None,
    metric: str = "time",
    instructions_factor: float = INSTRUCTIONS_FACTOR,
    progress: Callable[[str], None] | None = None,
) -> dict[str, Outcome]:
    """Benchmark ``base`` and every one of ``heads`` in one asv run (rounds interleaved over all of them), then
    compare each HEAD with BASE: the outcomes, keyed by the revisions as given.

    BASE is measured once for all of them, so judging several candidate commits costs one BASE, one environment
    and one set of rounds in which all of them share the machine's moments.

    Args:
        base, heads: any git revisions (branch, tag, hash, ``HEAD~1``).
        repo: the attnbench checkout (its asv.conf.json and benchmarks/ are used).
        time_factor: allowed HEAD/BASE time ratio.
        memory_factor: allowed HEAD/BASE peak tensor bytes ratio.
        rounds: asv rounds, interleaved across the commits.
        subset: grid variables narrowing :data:`CI_SUBSET` (a variable it does not set keeps the CI grid's value:
            ``{"ATTNBENCH_ASV_VARIANTS": "batched"}`` is batched on the CI grid's lengths, modes and masks); default:
            the ones of :data:`contract.GRID_ENV` set in the environment.
        work_dir: where results and the asv log go (default: a new temporary directory); a relative path is
            taken from the current directory.
        machine: asv machine name to record results under.
        log_path: file receiving asv's full output (default ``<work_dir>/asv.log``).
        metric: what decides (:data:`GATE_METRICS`): ``"time"``, ``"instructions"`` (valgrind's counts: one
            valgrind process per commit; time is measured and shown beside them, not deciding) or ``"both"``.
        instructions_factor: allowed HEAD/BASE instruction count ratio.
        progress: called with a line as each step starts (the CLI prints it): asv's steps take minutes.

    Raises:
        ValueError: bad arguments (unknown revision, a HEAD that is BASE, repeated HEADs, bad factors, an unknown
            metric).
        RegressError: asv could not produce results for every commit, or counts were asked for without valgrind.
    """
    say = progress or (lambda line: None)
    if metric not in GATE_METRICS:
        raise ValueError(f"metric must be one of {GATE_METRICS}, got {metric!r}")
    instructions_factor = significance.check_factor("instructions_factor", instructions_factor)
    if metric != "time" and valgrind_version() is None:
        raise RegressError(missing_message())
    time_factor = significance.check_factor("time_factor", time_factor)  # nan, inf and <= 1: usage errors
    memory_factor = significance.check_factor("memory_factor", memory_factor)
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    repo = Path(repo).resolve()
    base_hash, head_hashes = _commits(repo, base, heads)
    # Relative to where the caller stands, resolved now: asv runs with cwd=work, where a relative path
    # would be taken a second time (".asv/regress/.asv/regress").
    work = (check_writable_dir(work_dir, "work_dir", create=True).resolve() if work_dir
            else Path(tempfile.mkdtemp(prefix="attnbench-regress-")))
    conf = _config(repo, work)
    (work / "hashes.txt").write_text("".join(f"{h}\n" for h in (base_hash, *head_hashes.values())))
    (work / PROBES).unlink(missing_ok=True)  # this gate run's rounds only
    if subset is None:  # the grid variables the caller set (e.g. ATTNBENCH_ASV_VARIANTS)
        subset = {k: os.environ[k] for k in contract.GRID_ENV if os.environ.get(k, "").strip()}
    subset = {**CI_SUBSET, **subset}  # whatever they leave unset stays the CI grid's (not asv's whole grid)
    env = {**os.environ, **subset, **regime.child_env(REGIME), contract.ENV_PROBE_LOG: str(work / PROBES)}
    commits = f"BASE {base_hash[:10]} and " + ", ".join(f"HEAD {h[:10]}" for h in head_hashes.values())
    run = ["run", f"HASHFILE:{work / 'hashes.txt'}", "--config", str(conf), "--machine", machine, "--show-stderr"]
    timed = [*run, "--interleave-rounds", "--attribute", f"rounds={rounds}", "--record-samples"]
    log_file = Path(log_path or work / "asv.log")
    with open(log_file, "a", encoding="utf-8") as log:
        machine_out = _asv(["machine", "--yes", "--machine", machine, "--config", str(conf)], cwd=work, env=env, log=log)
        if machine_out.returncode != 0:
            raise RegressError(f"asv machine failed (exit {machine_out.returncode}):\n{output_tail(machine_out)}\nfull log: {log_file}")
        # Exit codes are deliberately unused: the result files are the truth.
        say(f"timing {commits}: {rounds} interleaved asv round(s) of the CI subset "
            f"(the first run builds asv's pinned virtualenv: minutes; log {log_file})")
        _asv([*timed, "--bench", GATED], cwd=work, env=env, log=log)
        if metric != "time":  # one round: counts are deterministic (and each commit's setup_cache is one valgrind process)
            say("counting instructions under valgrind: one process per commit (torch starts in about half a minute)")
            _asv([*run, "--bench", INSTRUCTIONS], cwd=work, env=env, log=log)

        def decide() -> dict[str, pd.DataFrame]:
            frame, samples = _load_results(work, machine, [base_hash, *head_hashes.values()], log_file)
            probes, shares = read_probes(work / PROBES), read_probes(work / PROBES, "runqueue_share")
            corrected = read_corrected(work / PROBES)
            return {head: compare(frame, base_hash, head_hash, time_factor, memory_factor, samples=samples, probes=probes,
                                  metric=metric, instructions_factor=instructions_factor, runqueue_shares=shares,
                                  corrected=corrected)
                    for head, head_hash in head_hashes.items()}

        tables = decide()
        undecided = sum(int((t["verdict"] == "undecided").sum()) for t in tables.values())
        confirmed = 0
        if undecided:  # cannot tell yet: gather more samples for every commit, decide on all of them
            say(f"{undecided} time case(s) undecided: a confirmation round")
            _asv([*timed, "--bench", TIME_BENCHMARK, "--append-samples"], cwd=work, env=env, log=log)
            tables = decide()
            confirmed = 1
    outcomes = {}
    for head, table in tables.items():
        table["confirmation_runs"] = confirmed
        outcomes[head] = Outcome(table=table, regressions=table[table["verdict"].isin(["regressed", "wrong"])],
                                 undecided=table[table["verdict"] == "undecided"], base=base_hash,
                                 head=head_hashes[head], results_dir=work / "results")
    return outcomes


def _load_results(work: Path, machine: str, commits: list[str], log: Path) -> tuple[pd.DataFrame, ...]:
    """``(frame, samples)`` of this gate run, for :func:`compare`; every commit must have results."""
    frame = load_asv(work / "results")
    frame = frame[frame["machine"] == machine]
    missing = [c for c in commits if c not in set(frame["commit"])]
    if missing:
        try:
            tail = "\n".join(f"  {line}" for line in log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:])
        except OSError:
            tail = "  (log unreadable)"
        raise RegressError(f"asv produced no results for {', '.join(m[:10] for m in missing)}; the end of {log}:\n{tail}")
    return frame, read_time_samples(work / "results", machine)
