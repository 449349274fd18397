"""The gate's decision: a BASE/HEAD table of asv results and a verdict per row, nothing measured.

Gives each row a :class:`contract.GateVerdict` on its ratio HEAD / BASE (:func:`compare`): time on
the samples of every round (significant beyond the allowance, speed-corrected and as measured
agreeing, never on disturbed rounds; else undecided, after a confirmation round), bytes beyond
``memory_factor``, FLOPs beyond 1, counts beyond ``instructions_factor``, a case failing on HEAD
only; ``wrong`` where HEAD fails the correctness gate. Full rules: docs/regression.md.
Beside the measured ratios, each case's exact metrics are fitted along the measured lengths on both
sides (:mod:`attnbench.analysis.growth`): a ratio predicted at ``--at-length`` beyond the metric's
factor, or an exponent grown beyond the A/A-justified threshold, regresses too.

Pure: nothing here starts a process (asv and git are :mod:`attnbench.gate.session`'s), so the
decision can be taken, and tested, on recorded results alone.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, replace
from pathlib import Path
from typing import NamedTuple

import pandas as pd

from attnbench import contract
from attnbench.analysis import growth, significance
from attnbench.contract import GateVerdict, Status
from attnbench.measure import probe, schedstat

__all__ = [
    "CASE_KEYS",
    "CASE_KEY_DEFAULTS",
    "DISAGREE_TIME",
    "GATE_METRICS",
    "NOISY_SHARE",
    "NOT_TIMED",
    "GateOptions",
    "Outcome",
    "SampleKey",
    "check_at_length",
    "check_metric",
    "compare",
    "descheduled",
    "disagreements",
    "disturbance",
    "mark_not_timed",
]

CASE_KEY_DEFAULTS = {k: contract.CASE_DEFAULTS[k] for k in contract.ASV_CASE if k != "seq_len_k"}
"""The gate's case parameters (the asv main grid fixes the rest of :data:`contract.CASE_IDENTITY`,
and is self-attention: its key length is its length), each with the value a result lacking it is
read as (old ones: no mask)."""
CASE_KEYS = tuple(CASE_KEY_DEFAULTS)


class SampleKey(NamedTuple):
    """One case of one commit: the key of a gate run's samples, probes and run-queue shares."""

    commit: str
    variant: str
    seq_len: int
    device: str
    mode: str
    mask: str


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


GATE_METRICS = ("time", "instructions", "both")
"""What decides: wall time (samples and probes), instruction counts (valgrind), or both."""
DISAGREE_TIME = 1.5
"""A time regression this large beside flat counts is worth a note (the gate never forgives it)."""
NOISY_SHARE = 0.1


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
class GateOptions:
    """The ratios HEAD / BASE each metric may reach before it regresses (the gate's factors).

    The defaults are the gate's (:data:`contract.TIME_FACTOR`, :data:`contract.MEMORY_FACTOR`,
    :data:`contract.INSTRUCTIONS_FACTOR`, :data:`contract.FLOPS_FACTOR`).
    """

    time_factor: float = contract.TIME_FACTOR
    # peak tensor bytes, and every exact metric without a factor of its own
    memory_factor: float = contract.MEMORY_FACTOR
    instructions_factor: float = contract.INSTRUCTIONS_FACTOR
    flops_factor: float = contract.FLOPS_FACTOR

    def checked(self) -> GateOptions:
        """These options with each factor a float; ValueError for one that is nan, inf or <= 1.

        Checked in the order their usage errors come: time, memory, instructions (the FLOPs factor
        is the contract's, never given).
        """
        return replace(
            self,
            time_factor=significance.check_factor("time_factor", self.time_factor),
            memory_factor=significance.check_factor("memory_factor", self.memory_factor),
            instructions_factor=significance.check_factor(
                "instructions_factor", self.instructions_factor
            ),
        )

    def of(self, metric: str) -> float:
        """The factor of an exact (not timed) ``metric``."""
        return {"instructions": self.instructions_factor, "flops": self.flops_factor}.get(
            metric, self.memory_factor
        )


@dataclass(frozen=True)
class _Comparison:
    """What :func:`compare` decides the rows of its BASE/HEAD table with."""

    base: str
    head: str
    options: GateOptions
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
            timed = _time_verdict(
                rec, self.base, self.head, self.options.time_factor, self.evidence
            )
            return timed if math.isfinite(timed.ratio) else replace(timed, ratio=ratio)
        if metric == "error_ratio":  # an error ratio within tolerance is ok (above it: "wrong")
            return _RowDecision(GateVerdict.OK, ratio)
        factor = self.options.of(metric)
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
            swapped = _time_verdict(
                rec, self.head, self.base, self.options.time_factor, self.evidence
            )
            return swapped.verdict == GateVerdict.REGRESSED
        return decision.ratio < 1 / self.options.of(rec["metric"])


def check_metric(metric: str) -> None:
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
    time_factor: float = contract.TIME_FACTOR,
    memory_factor: float = contract.MEMORY_FACTOR,
    samples: dict[SampleKey, list[float]] | None = None,
    probes: dict[SampleKey, list[float]] | None = None,
    *,
    metric: str = "time",
    instructions_factor: float = contract.INSTRUCTIONS_FACTOR,
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
    check_metric(metric)
    check_at_length(at_length)
    table = _side_by_side(frame, base, head)
    wrong_cases = _wrong_cases(table)
    options = GateOptions(time_factor, memory_factor, instructions_factor).checked()
    evidence = _TimeEvidence.of(samples, probes, runqueue_shares, corrected)
    comparison = _Comparison(base, head, options, evidence, wrong_cases)
    records = table.to_dict("records")
    decisions = [comparison.decide(rec) for rec in records]
    table["ratio"] = [d.ratio for d in decisions]
    table["verdict"] = [d.verdict for d in decisions]
    table["reason"] = [d.reason for d in decisions]
    table["improved"] = [
        comparison.improved(rec, d) for rec, d in zip(records, decisions, strict=True)
    ]
    table["note"] = disagreements(table)
    table, predicted = growth.growth_rows(table, options.of, at_length, exponent_threshold)
    if len(predicted):
        table = pd.concat([table, predicted], ignore_index=True)
    return _decided_by(table, metric)


def check_at_length(at_length: int | None) -> None:
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


NOT_TIMED = GateVerdict.NOT_TIMED
"""The verdict of a time row the gate did not time (counts decided its case at a length where time
tells nothing more; see :func:`attnbench.gate.session.time_selection`)."""


def mark_not_timed(table: pd.DataFrame, timed_length: int | None) -> pd.DataFrame:
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
