"""Regression gate: benchmark BASE and HEAD with asv, read the results, decide.

asv's exit codes do not say whether something regressed (``asv continuous`` exits 1 for usage
errors too, ``asv compare`` always 0), so the gate runs ``asv run`` on both commits (interleaved
rounds, the regime of :mod:`attnbench.measure.regime`, the CI grid), reads the result files and
gives each row a :class:`contract.GateVerdict` on its ratio HEAD / BASE (:func:`compare`): time on
the samples of every round (significant beyond the allowance, speed-corrected and as measured
agreeing, never on disturbed rounds; else undecided, after a confirmation round), bytes beyond
``memory_factor``, FLOPs beyond 1, counts beyond ``instructions_factor``, a case failing on HEAD
only; ``wrong`` where HEAD fails the correctness gate. Full rules: docs/regression.md.
Beside the measured ratios, each case's exact metrics are fitted along the measured lengths on both
sides (:mod:`attnbench.analysis.growth`): a ratio predicted at ``--at-length`` beyond the metric's
factor, or an exponent grown beyond the A/A-justified threshold, regresses too.

Exit codes of ``attnbench regress``: 0 nothing regressed (every case decided), 1 something
regressed or is wrong, 2 usage error (bad revision, BASE == HEAD, a factor that is nan, inf or
<= 1), 3 the benchmarks could not be measured, 4 no regression but a time case stayed undecided.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from attnbench import contract
from attnbench.analysis import growth, significance
from attnbench.analysis.frame import decode_param, load_asv
from attnbench.contract import GateVerdict, Status
from attnbench.errors import CouldNotMeasure
from attnbench.io import atomic_write, check_writable_dir, output_tail
from attnbench.measure import probe, regime, schedstat
from attnbench.measure.instructions import missing_message, valgrind_version

CI_SUBSET = contract.grid_environment(contract.GRIDS["ci"])
"""The ``ci`` grid (short lengths, a few representative variants) as asv's grid variables."""
TIME_BENCHMARK = contract.TIME_BENCHMARK
GATED = "|".join(contract.GATED_BENCHMARKS)
INSTRUCTIONS = contract.INSTRUCTIONS_BENCHMARK
REGIME = regime.Regime(threads=regime.DEFAULT_THREADS)
"""The regime asv's processes start in (threads, allocator thresholds), as ``attnbench run``'s."""
_CASE_DEFAULTS = {
    k: contract.CASE_DEFAULTS[k] for k in ("variant", "seq_len", "device", "mode", "mask")
}
"""The gate's case parameters (the asv main grid fixes the rest of :data:`contract.CASE_IDENTITY`),
each with the value a result lacking it is read as (old ones: no mask)."""
CASE_KEYS = tuple(_CASE_DEFAULTS)
PROBES = "probes.jsonl"
"""The calibration probes of the gate's time rounds, in its work directory."""


class SampleKey(NamedTuple):
    """One case of one commit: the key of a gate run's samples, probes and run-queue shares."""

    commit: str
    variant: str
    seq_len: int
    device: str
    mode: str
    mask: str


class RegressError(RuntimeError, CouldNotMeasure):
    """The comparison could not be made (exit code 3)."""


@dataclass(frozen=True)
class Outcome:
    """The gate's decision and the table behind it."""

    table: pd.DataFrame  # a row per compared case: metric, case, base, head, ratio, verdict
    regressions: pd.DataFrame  # the rows with verdict "regressed" or "wrong"
    undecided: pd.DataFrame  # time rows still undecided after the confirmation round
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


HEARTBEAT_S = 30.0
"""A long asv step says where it is at least this often (asv's own output goes to the log)."""
_PROGRESS = re.compile(r"^(?:\[\s*(\d+(?:\.\d+)?)%\]\s+)?[·.]+\s+(.*)$")
"""asv's progress lines: ``[ 33.33%] ··· bench_attention.Attention.time_attention  ok``, or
``·· Creating virtualenv ...``."""


def _asv(
    args: list[str],
    *,
    cwd: Path,
    env: dict[str, str],
    log,
    progress: Callable[[str], None] | None = None,
    heartbeat_s: float = HEARTBEAT_S,
) -> subprocess.CompletedProcess:
    """Run asv, its output (stdout and stderr) kept for the log and the caller.

    With ``progress``, asv's latest ``[ N%] ...`` line is reported every ``heartbeat_s`` seconds
    while it runs (a gate run is minutes of asv).
    """
    cmd = [sys.executable, "-m", "asv", *args]
    if progress is None:
        out = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    else:
        out = _streamed(cmd, cwd, {**env, "PYTHONUNBUFFERED": "1"}, progress, heartbeat_s)
    if log is not None:
        log.write(f"$ {' '.join(cmd)}\n{out.stdout}\n{out.stderr}\n")
        log.flush()
    return out


def _streamed(
    cmd: list[str],
    cwd: Path,
    env: dict[str, str],
    progress: Callable[[str], None],
    heartbeat_s: float,
) -> subprocess.CompletedProcess:
    """``subprocess.run`` that reports asv's latest progress line every ``heartbeat_s`` seconds."""
    import threading

    lines: list[str] = []
    latest = [""]
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        errors="replace",
    )
    errors: list[str] = []

    def read_out() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            # where the step's time goes, in the log
            lines.append(f"[{time.monotonic() - start:6.1f} s] {line}")
            found = _PROGRESS.match(line.strip())
            # a step of asv's, not a row of its result table
            if found and found.group(2)[:1].isalpha() and not found.group(2).startswith("Running"):
                share = f"{float(found.group(1)):.0f}% " if found.group(1) else ""
                latest[0] = f"{share}{' '.join(found.group(2).split())[:110]}"

    def read_err() -> None:
        errors.extend(proc.stderr)  # type: ignore[arg-type]

    readers = [
        threading.Thread(target=read_out, daemon=True),
        threading.Thread(target=read_err, daemon=True),
    ]
    for reader in readers:
        reader.start()
    while True:
        try:
            proc.wait(timeout=heartbeat_s)
            break
        except subprocess.TimeoutExpired:
            progress(
                f"  ... asv at {latest[0] or 'its start'} "
                f"({time.monotonic() - start:.0f} s into this step)"
            )
    for reader in readers:
        reader.join()
    return subprocess.CompletedProcess(cmd, proc.returncode, "".join(lines), "".join(errors))


def _config(repo: Path, work: Path) -> Path:
    """The repository's asv.conf.json with results, envs and html redirected under ``work``."""
    from asv import util

    conf = util.load_json(str(repo / "asv.conf.json"), js_comments=True)
    conf.update(  # joining an absolute path keeps it as it is
        repo=str(repo),
        benchmark_dir=str(repo / conf.get("benchmark_dir", "benchmarks")),
        results_dir=str(work / "results"),
        html_dir=str(work / "html"),
        # envs are reused across gate runs (and across clones, with ATTNBENCH_ASV_ENV_DIR)
        env_dir=str(
            Path(
                os.environ.get(contract.ENV_ENV_DIR) or repo / conf.get("env_dir", ".asv/env")
            ).resolve()
        ),
    )
    path = work / "asv.conf.json"
    path.write_text(json.dumps(conf, indent=1))
    return path


def read_time_samples(results_dir: str | Path, machine: str) -> dict[SampleKey, list[float]]:
    """Recorded timing samples of ``time_attention`` per (commit, variant, seq_len, device, mode).

    Read with :meth:`asv.results.Results.get_result_samples` (asv keeps them with
    ``--record-samples``; ``--append-samples`` adds a later round's to the same list). Parameter
    sets without samples are absent.
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
                    key = SampleKey(
                        res.commit_hash, *(case.get(c, d) for c, d in _CASE_DEFAULTS.items())
                    )
                    out.setdefault(key, []).extend(float(x) for x in got if x is not None)
    return out


GATE_METRICS = ("time", "instructions", "both")
"""What decides: wall time (samples and probes), instruction counts (valgrind), or both."""
INSTRUCTIONS_FACTOR = contract.INSTRUCTIONS_FACTOR
DISAGREE_TIME = 1.5
"""A time regression this large beside flat counts is worth a note (the gate never forgives it)."""
NOISY_SHARE = 0.1
"""A side with more than this share of its probes (or samples) beyond their limit is disturbed."""


def _log_lines(path: str | Path) -> Iterator[tuple[SampleKey, dict]]:
    """The lines of the gate's probe log with their case; garbled ones (a killed writer) skipped."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError:
        return
    for line in lines:
        try:
            rec = json.loads(line)
            yield SampleKey(*(rec[name] for name in SampleKey._fields)), rec
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
    """The calibration probes the time benchmarks recorded, per case (or another ``field``).

    The log is :func:`attnbench.asv_bench.timed_teardown`'s; ``field="runqueue_share"`` gives the
    samples' run-queue shares. A garbled line or a missing value is skipped; a missing file gives
    none.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        if not math.isnan(value := _value(rec, field)):
            out.setdefault(key, []).append(value)
    return out


def read_corrected(path: str | Path) -> dict[SampleKey, list[float]]:
    """Per case, each time sample divided by the probe timed just before it: ``sample_s / probe_s``.

    The lines are :func:`attnbench.asv_bench.timed_teardown`'s; each quotient is the sample at the
    machine's speed of that moment.
    A shared machine's speed can step for seconds to minutes at a time (a host neighbour: every
    probe and sample of those moments move together, and nothing waits in the run queue), so rounds
    of BASE and HEAD measured in different moments differ with nothing changed. Divided by its probe
    a compute-bound sample does not; a memory-bound one follows the probe less, so a verdict needs
    these and the samples as measured to agree. Lines without a sample (a commit that logged probes
    only) are skipped.
    """
    out: dict[SampleKey, list[float]] = {}
    for key, rec in _log_lines(path):
        sample, probe_s = _value(rec, "sample_s"), _value(rec, "probe_s")
        if sample > 0 and probe_s > 0:
            out.setdefault(key, []).append(sample / probe_s)
    return out


def disturbance(probes: list[float], typical: float) -> str:
    """Why a side's rounds are not to be decided on ("" when undisturbed): the probes' rule.

    ``typical`` is the median probe of the whole gate run (both commits, interleaved: the same
    machine state they were meant to share). A side is disturbed when more than :data:`NOISY_SHARE`
    of its probes deviate more than ``probe.SLOWDOWN_LIMIT`` x from it, either way.
    """
    if not probes or not typical > 0:
        return ""
    ratios = [p / typical for p in probes if p > 0]
    off = [r for r in ratios if max(r, 1 / r) > probe.SLOWDOWN_LIMIT]
    if len(off) <= NOISY_SHARE * len(ratios):
        return ""
    worst = max(off, key=lambda r: max(r, 1 / r))
    way = f"{worst:.2f}x slower" if worst > 1 else f"{1 / worst:.2f}x faster"
    return (
        f"{len(off)} of {len(ratios)} calibration probes beyond {probe.SLOWDOWN_LIMIT}x of typical "
        f"(up to {way})"
    )


def descheduled(shares: list[float]) -> str:
    """Why a side's rounds are not to be decided on ("" when undisturbed): the run-queue rule.

    ``shares`` are the run-queue seconds per wall second of each sample's timed calls
    (:class:`attnbench.asv_bench.WaitWatch`). A side is disturbed when more than :data:`NOISY_SHARE`
    of its samples waited for a core more than :data:`attnbench.measure.schedstat.WAIT_LIMIT` of
    their wall time (the runner's blocks' limit): another process had it.
    """
    off = [s for s in shares if s > schedstat.WAIT_LIMIT]
    if not shares or len(off) <= NOISY_SHARE * len(shares):
        return ""
    return (
        f"{len(off)} of {len(shares)} samples waited for a core "
        f"over {schedstat.WAIT_LIMIT:.0%} of their wall time (up to {max(off):.0%})"
    )


def _typical_probes(probes: dict[SampleKey, list[float]]) -> dict[str, float]:
    """Per device: the median probe of the whole gate run (both commits, interleaved)."""
    pooled: dict[str, list[float]] = {}
    for key, values in probes.items():
        pooled.setdefault(key[3], []).extend(values)  # its device (a caller may pass plain tuples)
    return {device: statistics.median(values) for device, values in pooled.items()}


@dataclass(frozen=True)
class _TimeEvidence:
    """What a gate run's time rounds recorded, per :class:`SampleKey` (see :func:`compare`)."""

    samples: dict[SampleKey, list[float]]  # asv's recorded samples (read_time_samples)
    probes: dict[SampleKey, list[float]]  # the calibration probe of each sample (read_probes)
    runqueue_shares: dict[SampleKey, list[float]]  # each sample's run-queue seconds per wall second
    corrected: dict[SampleKey, list[float]]  # each sample in units of its probe (read_corrected)
    typical: dict[str, float]  # per device: the median probe of the whole run

    @classmethod
    def of(
        cls,
        samples: dict | None,
        probes: dict | None,
        runqueue_shares: dict | None,
        corrected: dict | None,
    ) -> _TimeEvidence:
        """The evidence as given (None: none), with the typical probe per device."""
        probes = probes or {}
        return cls(
            samples or {}, probes, runqueue_shares or {}, corrected or {}, _typical_probes(probes)
        )

    def noise(self, key: SampleKey, speed_corrected: bool) -> str:
        """Why ``key``'s rounds are not to be decided on ("" when undisturbed).

        Its samples waited for a core (:func:`descheduled`), or, where they are not speed-corrected,
        its probes strayed from typical (:func:`disturbance`).
        """
        typical = self.typical.get(key.device, math.nan)
        strayed = "" if speed_corrected else disturbance(self.probes.get(key, []), typical)
        return "; ".join(filter(None, (strayed, descheduled(self.runqueue_shares.get(key, [])))))


@dataclass(frozen=True)
class _RowDecision:
    """The gate's word on a row of its table: its verdict, the ratio HEAD / BASE, and why."""

    verdict: GateVerdict
    ratio: float
    reason: str = ""


def _time_verdict(
    rec: dict, base: str, head: str, time_factor: float, evidence: _TimeEvidence
) -> _RowDecision:
    """One time row both sides ran, decided on ``evidence``: disturbed rounds never are.

    Where both sides logged their samples with the probe beside each (:func:`read_corrected`), the
    samples as measured and the speed-corrected ones must agree: a step of the machine's speed moves
    a compute-bound case with the probe and a memory-bound one less, so the truth lies between the
    two. Only a neighbour in this machine's run queue makes such a side noisy. Otherwise asv's
    samples decide, and a side whose probes strayed from typical is noisy too.
    """
    case = tuple(rec[k] for k in CASE_KEYS)
    base_key, head_key = SampleKey(base, *case), SampleKey(head, *case)
    samples, corrected = evidence.samples, evidence.corrected
    measured = significance.decide(
        samples.get(base_key, []), samples.get(head_key, []), time_factor
    )
    base_corrected, head_corrected = corrected.get(base_key, []), corrected.get(head_key, [])
    speed_corrected = min(len(base_corrected), len(head_corrected)) >= significance.MIN_SAMPLES
    noisy = "; ".join(
        f"{side}: {reason}"
        for side, key in (("BASE", base_key), ("HEAD", head_key))
        if (reason := evidence.noise(key, speed_corrected))
    )
    if noisy:
        return _RowDecision(
            GateVerdict.UNDECIDED,
            measured.ratio,
            f"noisy: {noisy} (measured x{measured.ratio:.2f})",
        )
    if not speed_corrected:
        return _RowDecision(measured.verdict, measured.ratio, measured.reason)
    fixed = significance.decide(base_corrected, head_corrected, time_factor)
    if fixed.verdict == measured.verdict:
        return _RowDecision(
            fixed.verdict,
            fixed.ratio,
            f"speed-corrected {fixed.reason}; as measured x{measured.ratio:.2f}",
        )
    return _RowDecision(
        GateVerdict.UNDECIDED,
        fixed.ratio,
        f"speed-corrected {fixed.verdict} ({fixed.reason}) but {measured.verdict} as measured "
        f"({measured.reason}): the machine's speed moved",
    )


@dataclass(frozen=True)
class _Factors:
    """The ratios HEAD / BASE each metric may reach before it regresses."""

    time: float
    memory: float  # peak tensor bytes, and every exact metric without a factor of its own
    instructions: float

    def of(self, metric: str) -> float:
        """The factor of an exact (not timed) ``metric``."""
        return {"instructions": self.instructions, "flops": contract.FLOPS_FACTOR}.get(
            metric, self.memory
        )


@dataclass(frozen=True)
class _Comparison:
    """What :func:`compare` decides the rows of its BASE/HEAD table with."""

    base: str
    head: str
    factors: _Factors
    evidence: _TimeEvidence
    wrong_cases: set[tuple]  # the cases HEAD's result fails the correctness gate in

    def decide(self, rec: dict) -> _RowDecision:
        """The verdict on one row of the table (see :func:`compare`)."""
        b_ok, h_ok = rec["base_status"] == Status.OK, rec["head_status"] == Status.OK
        ratio = (
            rec["head_value"] / rec["base_value"]
            if b_ok and h_ok and rec["base_value"]
            else math.nan
        )
        if b_ok and tuple(rec[k] for k in CASE_KEYS) in self.wrong_cases:
            # right on BASE, wrong on HEAD: the gate fails whatever the speed
            return _RowDecision(GateVerdict.WRONG, ratio)
        if b_ok and not h_ok:
            return _RowDecision(GateVerdict.REGRESSED, ratio)  # ran on BASE, does not on HEAD
        if not (b_ok and h_ok):
            return _RowDecision(GateVerdict.NOT_APPLICABLE, ratio)
        metric = rec["metric"]
        if metric == "time":
            timed = _time_verdict(rec, self.base, self.head, self.factors.time, self.evidence)
            return timed if math.isfinite(timed.ratio) else replace(timed, ratio=ratio)
        if metric == "error_ratio":  # an error ratio within tolerance is ok (above it: "wrong")
            return _RowDecision(GateVerdict.OK, ratio)
        factor = self.factors.of(metric)
        verdict = GateVerdict.REGRESSED if ratio > factor else GateVerdict.OK
        if metric != "instructions":
            return _RowDecision(verdict, ratio)
        beyond = "beyond" if verdict == GateVerdict.REGRESSED else "within"
        return _RowDecision(verdict, ratio, f"counts x{ratio:.4f} ({beyond} x{factor:g})")

    def improved(self, rec: dict, decision: _RowDecision) -> bool:
        """Whether an ``ok`` row moved the other way beyond the same rule."""
        if (
            decision.verdict != GateVerdict.OK
            or not math.isfinite(decision.ratio)
            or rec["metric"] == "error_ratio"
        ):
            return False
        # the gate's own rule, BASE and HEAD swapped: HEAD faster beyond the allowance
        if rec["metric"] == "time":
            swapped = _time_verdict(rec, self.head, self.base, self.factors.time, self.evidence)
            return swapped.verdict == GateVerdict.REGRESSED
        return decision.ratio < 1 / self.factors.of(rec["metric"])


def _check_metric(metric: str) -> None:
    if metric not in GATE_METRICS:
        raise ValueError(f"metric must be one of {GATE_METRICS}, got {metric!r}")


def _side_by_side(frame: pd.DataFrame, base: str, head: str) -> pd.DataFrame:
    """A row per benchmark, case and metric: BASE's and HEAD's value, status, spread, interval."""
    if "mask" not in frame.columns:  # results from before the asv grid had a mask parameter
        frame = frame.assign(mask="none")
    keys = ["benchmark", *CASE_KEYS, "metric"]
    sides = []
    for name, commit in (("base", base), ("head", head)):
        side = frame[frame["commit"] == commit].drop_duplicates(keys, keep="last").set_index(keys)
        sides.append(
            side[["value", "status", "spread", "ci_low", "ci_high"]].add_prefix(f"{name}_")
        )
    return sides[0].join(sides[1], how="outer").reset_index()


def _wrong_cases(table: pd.DataFrame) -> set[tuple]:
    """The cases whose HEAD result fails the correctness gate (marked wrong, error ratio > 1)."""
    head_rows = table[table["head_status"].notna()]
    error_above = (
        (head_rows["metric"] == "error_ratio")
        & (head_rows["head_status"] == Status.OK)
        & (head_rows["head_value"] > 1.0)
    )
    failed = (head_rows["head_status"] == Status.WRONG) | error_above
    return {tuple(r) for r in head_rows.loc[failed, list(CASE_KEYS)].itertuples(index=False)}


def compare(
    frame: pd.DataFrame,
    base: str,
    head: str,
    time_factor: float = 1.2,
    memory_factor: float = 1.1,
    samples: dict[SampleKey, list[float]] | None = None,
    probes: dict[SampleKey, list[float]] | None = None,
    *,
    metric: str = "time",
    instructions_factor: float = INSTRUCTIONS_FACTOR,
    runqueue_shares: dict[SampleKey, list[float]] | None = None,
    corrected: dict[SampleKey, list[float]] | None = None,
    at_length: int | None = None,
    exponent_threshold: float = growth.EXPONENT_THRESHOLD,
) -> pd.DataFrame:
    """Side-by-side BASE/HEAD table of ``frame`` with a :class:`contract.GateVerdict` per row.

    ``samples`` (:func:`read_time_samples`) decide the time rows, judged with the same keys'
    ``probes`` and ``runqueue_shares`` (:func:`read_probes`) and ``corrected`` samples
    (:func:`read_corrected`): a time row without samples on both sides, disturbed, or whose
    speed-corrected and measured samples disagree is ``undecided``. ``metric``
    (:data:`GATE_METRICS`) says what decides the time-like rows; the rows it does not decide read
    ``shown``. Columns added: ``ratio``, ``verdict``, ``reason``, ``improved`` (an ``ok`` row beyond
    the same rule the other way) and ``note`` (:func:`disagreements`). The rules:
    docs/regression.md.

    How cost grows (:func:`attnbench.analysis.growth.growth_rows`): every exact metric of a case
    measured at three lengths or more on both sides is fitted per side; its rows get the exponents
    and the ratio predicted at ``at_length`` (default: the workload's
    :data:`~attnbench.analysis.growth.AT_LENGTH`), and a row of ``basis`` "predicted" at that length
    regresses where the predicted ratio exceeds the metric's factor or the exponent grows by more
    than ``exponent_threshold``, even with every measured ratio within its factor.
    """
    _check_metric(metric)
    _check_at_length(at_length)
    table = _side_by_side(frame, base, head)
    wrong_cases = _wrong_cases(table)
    factors = _Factors(
        time=significance.check_factor("time_factor", time_factor),
        memory=significance.check_factor("memory_factor", memory_factor),
        instructions=significance.check_factor("instructions_factor", instructions_factor),
    )
    evidence = _TimeEvidence.of(samples, probes, runqueue_shares, corrected)
    comparison = _Comparison(base, head, factors, evidence, wrong_cases)
    records = table.to_dict("records")
    decisions = [comparison.decide(rec) for rec in records]
    table["ratio"] = [d.ratio for d in decisions]
    table["verdict"] = [d.verdict for d in decisions]
    table["reason"] = [d.reason for d in decisions]
    table["improved"] = [
        comparison.improved(rec, d) for rec, d in zip(records, decisions, strict=True)
    ]
    table["note"] = disagreements(table)
    table, predicted = growth.growth_rows(table, factors.of, at_length, exponent_threshold)
    if len(predicted):
        table = pd.concat([table, predicted], ignore_index=True)
    return _decided_by(table, metric)


def _check_at_length(at_length: int | None) -> None:
    """A usage error unless ``at_length`` is None or a positive integer."""
    if at_length is not None and (
        isinstance(at_length, bool) or not isinstance(at_length, int) or at_length < 1
    ):
        raise ValueError(
            f"at_length must be a positive integer (a sequence length), got {at_length!r}"
        )


def disagreements(table: pd.DataFrame) -> list[str]:
    """Per row, where a case's instruction count and its time disagree ("" elsewhere).

    Each side speaks through its own verdict, so a disturbed time (``undecided``, "noisy") never
    makes a note. Counts within the gate's factor and time regressed by at least
    :data:`DISAGREE_TIME`: a change counts cannot see (cache misses, page faults, memory bandwidth,
    waiting) or a neighbour the noise checks missed; counts regressed and time ``ok``: more work the
    machine absorbed.
    """
    case = [*CASE_KEYS]
    rows = table[table["ratio"].notna()].set_index(case)
    counts, times = rows[rows["metric"] == "instructions"], rows[rows["metric"] == "time"]
    notes = {}
    for key in counts.index.intersection(times.index):
        (c, c_verdict), (t, t_verdict) = (
            counts.loc[key, ["ratio", "verdict"]],
            times.loc[key, ["ratio", "verdict"]],
        )
        if (
            c_verdict == GateVerdict.OK
            and t_verdict == GateVerdict.REGRESSED
            and t >= DISAGREE_TIME
        ):
            notes[key] = (
                f"time x{t:.2f} with counts flat (x{c:.4f}): a change the counter cannot see "
                "(cache misses, page faults, bandwidth, waiting), "
                "or a neighbour the noise checks missed"
            )
        elif c_verdict == GateVerdict.REGRESSED and t_verdict == GateVerdict.OK:
            notes[key] = (
                f"counts x{c:.4f} with time within its allowance (x{t:.2f}): "
                "more work the machine absorbed"
            )
    return [
        notes.get(tuple(r), "") if m in ("time", "instructions") else ""
        for r, m in zip(table[case].itertuples(index=False), table["metric"], strict=True)
    ]


def _decided_by(table: pd.DataFrame, metric: str) -> pd.DataFrame:
    """Time rows the chosen ``metric`` does not decide become ``shown`` (their figures stay)."""
    counted = table[
        (table["metric"] == "instructions")
        & table["verdict"].isin((GateVerdict.OK, GateVerdict.REGRESSED))
    ]
    decided = {tuple(r) for r in counted[list(CASE_KEYS)].itertuples(index=False)}
    is_time = table["metric"] == "time"
    # decided by the samples (not a failed case)
    timing = table["verdict"].isin((GateVerdict.OK, GateVerdict.REGRESSED, GateVerdict.UNDECIDED))
    if metric == "instructions":
        hide = is_time & timing
    elif metric == "both":
        case = pd.Series(
            [tuple(r) in decided for r in table[list(CASE_KEYS)].itertuples(index=False)],
            index=table.index,
        )
        hide = is_time & (table["verdict"] == GateVerdict.UNDECIDED) & case
    else:
        return table
    table = table.copy()
    table.loc[hide, "reason"] = (
        "shown, not deciding (instruction counts decide): " + table.loc[hide, "reason"]
    ).str.rstrip(": ")
    table.loc[hide, "verdict"] = GateVerdict.SHOWN
    return table


def regress(base: str, head: str, **options) -> Outcome:
    """Benchmark ``base`` and ``head`` with asv and compare them: :func:`regress_many` of one HEAD.

    Takes the keyword arguments of :func:`regress_many`.
    """
    (outcome,) = regress_many(base, [head], **options).values()
    write_verdicts(outcome)
    return outcome


def write_verdicts(outcome: Outcome) -> Path:
    """Write the gate's table beside asv's results (:data:`contract.GATE_VERDICTS`).

    A report of the same results then knows what the gate knew: a time case it could not decide
    (noisy, waiting for a core, the machine's speed moved) is drawn hollow and never compared there.
    Not a ``.json``: asv reads those as results.
    """
    path = Path(outcome.results_dir) / contract.GATE_VERDICTS
    table = outcome.table.assign(base=outcome.base, head=outcome.head)
    atomic_write(path, lambda tmp: table.to_csv(tmp, index=False))
    return path


def _commits(repo: Path, base: str, heads: list[str]) -> tuple[str, dict[str, str]]:
    """BASE's full hash and each HEAD's (keyed as given); ValueError where they cannot compare."""
    if not heads:
        raise ValueError("heads must name at least one revision")
    if not (repo / "asv.conf.json").exists():
        raise ValueError(f"repo must be an attnbench checkout with asv.conf.json, got {repo}")
    base_hash = _git(repo, "rev-parse", "--verify", f"{base}^{{commit}}")
    head_hashes = {
        head: _git(repo, "rev-parse", "--verify", f"{head}^{{commit}}") for head in heads
    }
    for head, head_hash in head_hashes.items():
        if head_hash == base_hash:
            raise ValueError(
                f"BASE {base!r} and HEAD {head!r} are the same commit ({base_hash[:12]}): "
                "nothing to compare"
            )
    if len(set(head_hashes.values())) < len(heads):
        raise ValueError(f"heads must be different commits, got {heads}")
    return base_hash, head_hashes


TIME_CASES = ("longest", "all")
"""Which time cases the gate times where instruction counts decide (``--metric both`` or
``instructions``): ``longest``, the longest length of each variant in the grid, or ``all`` of them
(with ``--metric time``: always all)."""
NOT_TIMED = GateVerdict.NOT_TIMED
"""The verdict of a time row the gate did not time (counts decided its case at a length where time
tells nothing more; see :func:`time_selection`)."""


def time_selection(subset: dict[str, str]) -> tuple[str, int]:
    """``(asv --bench pattern, length)``: the time benchmark at ``subset``'s longest length only.

    Where instruction counts decide, time tells what counts cannot see: cache misses, page faults,
    memory bandwidth and waiting. They weigh most where the working set is largest and least where
    it fits in the caches: at the grid's shorter lengths (the CI grid's 256 and 512: scores of 2 and
    8 MiB) a call's time follows its instructions, which the counts already judge exactly. asv
    selects parameter sets by a regular expression on ``name('variant', length, ...)``.
    """
    lengths = [int(x) for x in subset.get(contract.ENV_LENGTHS, "").split(",") if x.strip()]
    longest = max(lengths) if lengths else max(contract.GRIDS["ci"].lengths)
    return rf"{re.escape(TIME_BENCHMARK)}\('[^']*', {longest}, ", longest


MACHINE_FILE_RETRIES = 4
_MACHINE_FILE_RACE = re.compile(r"Error parsing JSON in file '[^']*\.asv-machine\.json'")
TWIN_SUFFIX = "-twin"
"""Names a second copy of asv's environment directory, for a second asv process at the same time."""


def twin_environments(env_dir: Path) -> Path:
    """``<env_dir>-twin``: every environment of ``env_dir`` again, for a second asv process.

    The second process installs another commit while the first measures its own (an environment
    holds one commit at a time). The interpreter's libraries (``lib/``: torch and the pinned
    packages, over a gigabyte, never written by asv) are hard links, made in seconds (a copy where
    links cannot be made); everything asv writes per commit (the project checkout it builds from,
    its wheel cache, its install record, ``bin/``) is copied, so neither process touches the other's
    files. pip replaces a package's files by new ones (it never writes into an installed file), so
    the commit installed in one copy is never seen in the other. A twin whose ``asv-env-info.json``
    (the pins) differs from its original's is made again.
    """
    import shutil

    twin_dir = env_dir.with_name(env_dir.name + TWIN_SUFFIX)
    for env in (
        sorted(p for p in env_dir.iterdir() if (p / "asv-env-info.json").is_file())
        if env_dir.is_dir()
        else []
    ):
        twin = twin_dir / env.name
        info = (env / "asv-env-info.json").read_text()
        if (twin / "asv-env-info.json").is_file() and (
            twin / "asv-env-info.json"
        ).read_text() == info:
            continue
        shutil.rmtree(twin, ignore_errors=True)
        twin.mkdir(parents=True)
        for part in env.iterdir():
            target = twin / part.name
            if part.is_symlink() or not part.is_dir():
                shutil.copy2(part, target, follow_symlinks=False)
            elif part.name in ("lib", "lib64", "include", "share"):
                shutil.copytree(part, target, symlinks=True, copy_function=_link_or_copy)
            else:
                shutil.copytree(part, target, symlinks=True)
    return twin_dir


def _link_or_copy(src: str, dst: str) -> None:
    try:
        os.link(src, dst)
    except OSError:  # another filesystem, or links not allowed: a copy
        import shutil

        shutil.copy2(src, dst)


@dataclass
class AsvSession:
    """One asv configuration, machine and environment for a series of ``asv run`` calls on commits.

    The gate's (:func:`regress_many`) and the bisection's (:mod:`attnbench.bisect`). The environment
    is built by the first run (minutes) in ``ATTNBENCH_ASV_ENV_DIR`` or the checkout's ``.asv/env``
    and reused by every later one; each run installs its commits into it (seconds each).
    """

    repo: Path
    work: Path
    conf: Path
    env: dict[str, str]
    machine: str
    log_file: Path
    say: Callable[[str], None]

    @classmethod
    def open(
        cls,
        repo: Path,
        work_dir: str | Path | None,
        subset: dict[str, str] | None,
        machine: str,
        log_path: str | Path | None,
        say: Callable[[str], None] | None = None,
        fresh: bool = True,
    ) -> AsvSession:
        """A session: its configuration written under the work directory, asv's machine registered.

        RegressError where asv cannot register the machine.
        ``fresh``: start from an empty results directory. A verdict is taken on this session's
        measurements only: a work directory kept from an earlier run (the CLI's ``.asv/regress``)
        still held, say, BASE's counts of that run where this one took none of HEAD's, and compare()
        read "ran on BASE, not on HEAD": regressed.
        """
        # Relative to where the caller stands, resolved now: asv runs with cwd=work, where a
        # relative path would be taken a second time (".asv/regress/.asv/regress").
        repo = Path(repo).resolve()
        work = (
            check_writable_dir(work_dir, "work_dir", create=True).resolve()
            if work_dir
            else Path(tempfile.mkdtemp(prefix="attnbench-regress-"))
        )
        conf = _config(repo, work)
        if fresh:
            shutil_rmtree(work / "results")
        if subset is None:  # the grid variables the caller set (e.g. ATTNBENCH_ASV_VARIANTS)
            subset = {k: os.environ[k] for k in contract.GRID_ENV if os.environ.get(k, "").strip()}
        # whatever they leave unset stays the CI grid's (not asv's whole grid)
        subset = {**CI_SUBSET, **subset}
        env = {
            **os.environ,
            **subset,
            **regime.child_env(REGIME),
            contract.ENV_PROBE_LOG: str(work / PROBES),
        }
        session = cls(
            repo=repo,
            work=work,
            conf=conf,
            env=env,
            machine=machine,
            log_file=Path(log_path or work / "asv.log"),
            say=say or (lambda line: None),
        )
        session._register_machine()
        return session

    def _register_machine(self) -> None:
        """Register asv's machine in this session's configuration (RegressError where it fails)."""
        out = self.asv(
            ["machine", "--yes", "--machine", self.machine, "--config", str(self.conf)], quiet=True
        )
        if out.returncode != 0:
            raise RegressError(
                f"asv machine failed (exit {out.returncode}):\n{output_tail(out)}\n"
                f"full log: {self.log_file}"
            )

    @property
    def subset(self) -> dict[str, str]:
        return {k: self.env[k] for k in contract.GRID_ENV if k in self.env}

    @property
    def env_dir(self) -> Path:
        return Path(json.loads(self.conf.read_text())["env_dir"])

    def twin(self) -> AsvSession:
        """A second session beside this one, for a second asv process at the same time.

        The same repository, grid and machine, its own environments (:func:`twin_environments`, made
        from this session's once they exist) and its own results directory (``<work>/twin/results``:
        two asv processes must not write one ``benchmarks.json``). Its results join this session's
        with :meth:`adopt`.
        """
        # this session's environments must exist first (asv setup's exit code is its return value, a
        # list: unused); on a first run it builds asv's pinned virtualenv (minutes), so it reports
        # its progress like a run
        out = self.asv(["setup", "--config", str(self.conf)])
        if not any(self.env_dir.glob("*/asv-env-info.json")):
            raise RegressError(
                f"asv setup made no environment in {self.env_dir}:\n{output_tail(out)}\n"
                f"full log: {self.log_file}"
            )
        work = self.work / "twin"
        work.mkdir(exist_ok=True)
        conf = json.loads(self.conf.read_text())
        conf.update(
            env_dir=str(twin_environments(self.env_dir)),
            results_dir=str(work / "results"),
            html_dir=str(work / "html"),
        )
        (work / "asv.conf.json").write_text(json.dumps(conf, indent=1))
        twin = AsvSession(
            repo=self.repo,
            work=work,
            conf=work / "asv.conf.json",
            env=self.env,
            machine=self.machine,
            log_file=work / "asv.log",
            say=self.say,
        )
        twin._register_machine()
        return twin

    def adopt(self, other: AsvSession, commits: list[str]) -> None:
        """Move ``other``'s results of ``commits`` and its log into this session's.

        Its results replace what this session held of those commits: they were measured again.
        """
        from attnbench.shards import merge_results

        mine, theirs = self.work / "results", other.work / "results"
        if (theirs / "benchmarks.json").is_file():  # else asv wrote nothing (see its log)
            for commit in commits:
                for path in (mine / self.machine).glob(f"{commit[:8]}-*.json"):
                    path.unlink()
            merge_results([theirs], mine)
        shutil_rmtree(theirs)
        if other.log_file.exists():
            with open(self.log_file, "a", encoding="utf-8") as log:
                log.write(other.log_file.read_text(encoding="utf-8", errors="replace"))
            other.log_file.unlink()

    def asv(self, args: list[str], quiet: bool = False) -> subprocess.CompletedProcess:
        """Run asv; again where it died reading ``~/.asv-machine.json`` as another asv rewrote it.

        asv keeps its machines in one file in the home directory and rewrites it in place
        (``asv machine --yes``), so an asv process started at that moment reads it empty and stops
        ("Error parsing JSON"): where the home directory is shared with other asv runs, a BASE whose
        every result is missing.
        """
        for attempt in range(MACHINE_FILE_RETRIES + 1):
            with open(self.log_file, "a", encoding="utf-8") as log:
                out = _asv(
                    args,
                    cwd=self.work,
                    env=self.env,
                    log=log,
                    **({} if quiet else {"progress": self.say}),
                )
            if out.returncode == 0 or not _MACHINE_FILE_RACE.search(f"{out.stdout}\n{out.stderr}"):
                return out
            if attempt < MACHINE_FILE_RETRIES:
                self.say(
                    "asv read ~/.asv-machine.json while it was being rewritten: "
                    f"again ({attempt + 1})"
                )
                time.sleep(1.0 + attempt)
        return out

    def run(
        self,
        commits: list[str],
        bench: str,
        *,
        rounds: int | None = None,
        samples: bool = False,
        append: bool = False,
    ) -> subprocess.CompletedProcess:
        """``asv run`` of ``bench`` on ``commits`` (full hashes); ``rounds``: interleaved rounds.

        ``--attribute rounds`` applies to every benchmark of the call, so deterministic ones run in
        calls of their own, once. Exit codes are deliberately unused: the result files are the truth
        (:meth:`load`).
        """
        hashes = self.work / "hashes.txt"
        hashes.write_text("".join(f"{h}\n" for h in commits))
        args = [
            "run",
            f"HASHFILE:{hashes}",
            "--config",
            str(self.conf),
            "--machine",
            self.machine,
            "--show-stderr",
            "--bench",
            bench,
        ]
        if rounds is not None:
            args += ["--interleave-rounds", "--attribute", f"rounds={rounds}"]
        if samples:
            args.append("--record-samples")
        if append:
            args.append("--append-samples")
        return self.asv(args)

    def load(self, commits: list[str]) -> tuple[pd.DataFrame, dict]:
        """``(frame, samples)`` of the results, for :func:`compare`; each commit must have some."""
        return _load_results(self.work, self.machine, commits, self.log_file)


def shutil_rmtree(path: Path) -> None:
    import shutil

    shutil.rmtree(path, ignore_errors=True)


def in_parallel(jobs: list[Callable[[], object]]) -> list[object]:
    """Run ``jobs`` at once (each waits on its asv process): their results in order, or an error."""
    import threading

    results: list[object] = [None] * len(jobs)
    errors: list[BaseException] = []

    def run(i: int) -> None:
        try:
            results[i] = jobs[i]()
        except BaseException as exc:  # noqa: BLE001 - raised below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    return results


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
    time_cases: str = "longest",
    deterministic: bool = True,
    parallel: bool = True,
    at_length: int | None = None,
) -> dict[str, Outcome]:
    """Benchmark ``base`` and each of ``heads`` in one asv session; compare each HEAD with BASE.

    BASE is measured once for all HEADs and the time rounds interleave every commit, so several
    candidates cost one BASE and one set of rounds that share the machine's moments. Where counts
    decide, time is taken at each variant's longest length only (``time_cases="longest"``:
    :func:`time_selection`). The steps: the README's "What a gate run does, in order".

    Args:
        base, heads: git revisions of ``repo``; the outcomes are keyed by ``heads`` as given.
        time_factor, memory_factor, instructions_factor: allowed HEAD/BASE ratios (:func:`compare`).
        rounds: asv rounds of the time benchmark, interleaved across the commits.
        subset: grid variables narrowing :data:`CI_SUBSET` (default: those of ``GRID_ENV`` set).
        work_dir, log_path, machine: where results and asv's output go (default: a temporary
            directory, its ``asv.log``), and the asv machine they are recorded under.
        metric: what decides (:data:`GATE_METRICS`); time_cases: :data:`TIME_CASES`.
        progress: told each step, and asv's progress at least every :data:`HEARTBEAT_S` seconds.
        deterministic: also measure bytes, FLOPs and the error ratio (bisect's time probes do not).
        parallel: the deterministic measures of BASE and of the HEADs in two asv processes at once.
        at_length: the length the exact metrics' growth is predicted at (:func:`compare`).

    Raises:
        ValueError: bad arguments (unknown revision, a HEAD that is BASE, repeated HEADs, ...).
        RegressError: asv gave no results for a commit, or counts were asked for without valgrind.
    """
    say = progress or (lambda line: None)
    factors = _checked_options(
        metric, time_cases, rounds, time_factor, memory_factor, instructions_factor, at_length
    )
    repo = Path(repo).resolve()
    base_hash, head_hashes = _commits(repo, base, heads)
    session = AsvSession.open(repo, work_dir, subset, machine, log_path, say)
    (session.work / PROBES).unlink(missing_ok=True)  # this gate run's rounds only
    timed = _timed_rounds(metric, time_cases, session.subset)
    gate = _GateRun(session, base_hash, head_hashes, metric, factors, *timed, at_length)
    say(
        f"measuring {gate.described} on the CI subset "
        f"(the first run builds asv's pinned virtualenv: minutes; log {session.log_file})"
    )
    gate.measure_exact(deterministic, parallel)
    return gate.time_and_decide(rounds)


def _timed_rounds(metric: str, time_cases: str, subset: dict[str, str]) -> tuple[str, int | None]:
    """``(asv --bench pattern, length)`` of the time rounds (None: every length, see
    :func:`time_selection`)."""
    if metric != "time" and time_cases == "longest":
        return time_selection(subset)
    return TIME_BENCHMARK, None


def _checked_options(
    metric: str,
    time_cases: str,
    rounds: int,
    time_factor: float,
    memory_factor: float,
    instructions_factor: float,
    at_length: int | None = None,
) -> _Factors:
    """The gate's factors, checked with its other options in the order their usage errors come."""
    _check_metric(metric)
    _check_at_length(at_length)
    if time_cases not in TIME_CASES:
        raise ValueError(f"time_cases must be one of {TIME_CASES}, got {time_cases!r}")
    instructions_factor = significance.check_factor("instructions_factor", instructions_factor)
    if metric != "time" and valgrind_version() is None:
        raise RegressError(missing_message())
    # nan, inf and <= 1: usage errors
    factors = _Factors(
        time=significance.check_factor("time_factor", time_factor),
        memory=significance.check_factor("memory_factor", memory_factor),
        instructions=instructions_factor,
    )
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    return factors


@dataclass(frozen=True)
class _GateRun:
    """One run of :func:`regress_many`: its asv session, commits and rules, and its steps."""

    session: AsvSession
    base: str  # full hash
    heads: dict[str, str]  # each HEAD's full hash, keyed by the revision as given
    metric: str  # GATE_METRICS
    factors: _Factors
    timed_bench: str  # asv's --bench pattern of the time rounds
    timed_length: int | None  # where counts decide: the one length timed (None: every length)
    at_length: int | None = None  # where growth is predicted (None: the workload's default)

    @property
    def commits(self) -> list[str]:
        return [self.base, *self.heads.values()]

    @property
    def described(self) -> str:
        return f"BASE {self.base[:10]} and " + ", ".join(
            f"HEAD {h[:10]}" for h in self.heads.values()
        )

    def measure_exact(self, deterministic: bool, parallel: bool) -> None:
        """The deterministic measures, once per commit, before the time rounds.

        Peak tensor bytes, FLOPs and the error ratio (``deterministic``), then, where counts decide,
        the instruction counts (one valgrind process per commit).
        """
        counts_decide = self.metric != "time"
        exact = (
            [b for b in contract.GATED_BENCHMARKS if b != TIME_BENCHMARK] if deterministic else []
        )
        exact += [INSTRUCTIONS] if counts_decide else []
        if exact:
            what = ", ".join(
                filter(
                    None,
                    (
                        "peak tensor bytes, FLOPs and the correctness gate"
                        if deterministic
                        else "",
                        "instruction counts under valgrind (torch starts in about half a minute)"
                        if counts_decide
                        else "",
                    ),
                )
            )
            _measure_exact(self.session, self.commits, exact, what, parallel)

    def time_and_decide(self, rounds: int) -> dict[str, Outcome]:
        """Each HEAD's outcome, from time rounds interleaved across the commits.

        What the rounds leave undecided gets a confirmation round, of every commit.
        """
        where = (
            f"at L={self.timed_length} only (counts decide the shorter lengths; "
            "time sees what they cannot where the working set is largest)"
            if self.timed_length
            else "of every case"
        )
        self.session.say(f"timing: {rounds} interleaved asv round(s) {where}")
        self.session.run(self.commits, self.timed_bench, rounds=rounds, samples=True)
        tables = self.decide()
        undecided = sum(int((t["verdict"] == GateVerdict.UNDECIDED).sum()) for t in tables.values())
        confirmed = 0
        if undecided:  # cannot tell yet: more samples of every commit, decided on all of them
            self.session.say(f"{undecided} time case(s) undecided: a confirmation round")
            self.session.run(
                self.commits, self.timed_bench, rounds=rounds, samples=True, append=True
            )
            tables = self.decide()
            confirmed = 1
        return {head: self.outcome(head, table, confirmed) for head, table in tables.items()}

    def decide(self) -> dict[str, pd.DataFrame]:
        """Each HEAD's table (:func:`compare`) on every result, sample and probe so far."""
        frame, samples = self.session.load(self.commits)
        log = self.session.work / PROBES
        probes, shares, corrected = (
            read_probes(log),
            read_probes(log, "runqueue_share"),
            read_corrected(log),
        )
        tables = {
            head: compare(
                frame,
                self.base,
                head_hash,
                self.factors.time,
                self.factors.memory,
                samples=samples,
                probes=probes,
                metric=self.metric,
                instructions_factor=self.factors.instructions,
                runqueue_shares=shares,
                corrected=corrected,
                at_length=self.at_length,
            )
            for head, head_hash in self.heads.items()
        }
        return {head: _not_timed(table, self.timed_length) for head, table in tables.items()}

    def outcome(self, head: str, table: pd.DataFrame, confirmed: int) -> Outcome:
        table["confirmation_runs"] = confirmed
        return Outcome(
            table=table,
            regressions=table[table["verdict"].isin([GateVerdict.REGRESSED, GateVerdict.WRONG])],
            undecided=table[table["verdict"] == GateVerdict.UNDECIDED],
            base=self.base,
            head=self.heads[head],
            results_dir=self.session.work / "results",
        )


def _measure_exact(
    session: AsvSession, commits: list[str], benchmarks: list[str], what: str, parallel: bool
) -> None:
    """The deterministic benchmarks of ``commits``, one asv call per benchmark group.

    With ``parallel`` (and more than one commit), the commits are split between ``session`` and its
    twin, measured at once.
    """
    counts = [b for b in benchmarks if b == INSTRUCTIONS]
    others = "|".join(b for b in benchmarks if b != INSTRUCTIONS)

    def measure(target: AsvSession, mine: list[str]) -> None:
        if others:
            target.run(mine, others)
        if counts:
            target.run(mine, counts[0])

    if not parallel or len(commits) < 2:
        session.say(f"{what}: once per commit")
        measure(session, commits)
        return
    say = session.say
    twin = session.twin()
    first, second = commits[0::2], commits[1::2]
    say(
        f"{what}: once per commit, two asv processes at once "
        "(the second in a twin of the environment)"
    )

    def label(mine: list[str]) -> str:
        return mine[0][:8] + (f" and {len(mine) - 1} more" if len(mine) > 1 else "")

    session.say = lambda line: say(f"[{label(first)}] {line.strip()}")
    twin.say = lambda line: say(f"[{label(second)}] {line.strip()}")
    try:
        in_parallel([lambda: measure(session, first), lambda: measure(twin, second)])
    finally:
        session.say = say
        session.adopt(twin, second)


def _not_timed(table: pd.DataFrame, timed_length: int | None) -> pd.DataFrame:
    """Time rows the gate left untimed (not at ``timed_length``) read ``not timed``, not ``n/a``."""
    if timed_length is None:
        return table
    untimed = (
        (table["metric"] == "time")
        & (table["seq_len"] != timed_length)
        & (table["verdict"] == GateVerdict.NOT_APPLICABLE)
    )
    table = table.copy()
    table.loc[untimed, "verdict"] = NOT_TIMED
    table.loc[untimed, "reason"] = (
        f"counts decide this length; time is taken at L={timed_length} only"
    )
    return table


def _load_results(
    work: Path, machine: str, commits: list[str], log: Path
) -> tuple[pd.DataFrame, ...]:
    """``(frame, samples)`` of this gate run, for :func:`compare`; each commit must have some."""
    frame = load_asv(work / "results")
    frame = frame[frame["machine"] == machine]
    missing = [c for c in commits if c not in set(frame["commit"])]
    if missing:
        try:
            tail = "\n".join(
                f"  {line}"
                for line in log.read_text(encoding="utf-8", errors="replace").splitlines()[-25:]
            )
        except OSError:
            tail = "  (log unreadable)"
        raise RegressError(
            f"asv produced no results for {', '.join(m[:10] for m in missing)}; "
            f"the end of {log}:\n{tail}"
        )
    return frame, read_time_samples(work / "results", machine)
