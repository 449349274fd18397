"""The results contract: the names, metrics and grids the suite writes and everything else reads.

The asv suite (:mod:`attnbench.asv_bench`), ``attnbench run`` (:mod:`attnbench.runs`), the
regression gate (:mod:`attnbench.gate`), the loader (:mod:`attnbench.analysis.frame`) and the
report import these instead of spelling them, so a renamed benchmark, a new metric or a changed
grid cannot leave one of them reading something else:

* asv benchmark names (``TIME_BENCHMARK``, ...) and the metric table, :data:`METRICS`: one
  :class:`Metric` per tidy metric, which ``UNITS``, ``LABELS``, ``FITTED`` and ``ASV_METRICS``
  follow;
* closed sets, each a ``StrEnum`` whose members are the very strings the files hold:
  :class:`Status`, :class:`GateVerdict`, :class:`Method` and :class:`Source`;
* workloads (``WORKLOADS``, ``SWEPT_LENGTH``) and the grids (:data:`GRIDS`, ``BASE_SPEC``, and the
  ``ENV_*`` variables that select asv's tier, :func:`asv_tier`, and narrow it).
"""

from __future__ import annotations

import enum
import math
import os
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from attnbench.spec import AttnSpec

__all__ = [
    "Status",
    "GateVerdict",
    "Basis",
    "GATE_DECIDED",
    "GATE_JUDGED",
    "Method",
    "Source",
    "TIME_BENCHMARK",
    "PEAKMEM_BENCHMARK",
    "TENSOR_BYTES_BENCHMARK",
    "DECODE_TIME_BENCHMARK",
    "GQA_TIME_BENCHMARK",
    "PEAK_BENCHMARK",
    "INSTRUCTIONS_BENCHMARK",
    "TIME_FACTOR",
    "MEMORY_FACTOR",
    "INSTRUCTIONS_FACTOR",
    "FLOPS_FACTOR",
    "GATE_VERDICTS",
    "GATED_BENCHMARKS",
    "Metric",
    "METRICS",
    "UNITS",
    "LABELS",
    "FITTED",
    "DECLARED",
    "ASV_METRICS",
    "add_metric",
    "metric_value",
    "DETERMINISTIC_POINTS",
    "WORKLOADS",
    "SWEPT_LENGTH",
    "Grid",
    "GRIDS",
    "ASV_TIERS",
    "RUN_LENGTHS",
    "CUDA_RUN_LENGTHS",
    "BASE_SPEC",
    "CASE_DEFAULTS",
    "CASE_IDENTITY",
    "ASV_CASE",
    "LENGTHS",
    "SHAPE",
    "case_columns",
    "case_key",
    "ASV_MAX_CALL_SECONDS",
    "ENV_GRID",
    "ENV_VARIANTS",
    "ENV_LENGTHS",
    "ENV_DEVICES",
    "ENV_MODES",
    "ENV_MASKS",
    "ENV_MAX_CALL_S",
    "ENV_COUNT_BUDGET_S",
    "ENV_COUNT_PROCESSES",
    "ENV_BATCH",
    "ENV_DECODE_LENGTHS",
    "ENV_PROBE_LOG",
    "ENV_ENV_DIR",
    "GRID_ENV",
    "asv_tier",
    "grid_environment",
    "asv_case",
    "PROGRESSION",
    "FAMILIES",
    "REPRESENTATIVES",
    "OTHER_FAMILY",
    "family",
]


# ---- closed sets ---------------------------------------------------------------------------------
class Status(enum.StrEnum):
    """How a case went: the ``status`` of a measurement, a run's CSV row and a loaded asv row."""

    OK = "ok"
    WRONG = "wrong"  # the output failed the correctness gate
    # timed, but the machine was disturbed on every attempt (the reason names the signal)
    NOISY = "noisy"
    SKIPPED = "skipped"  # not run: unsupported, over budget, or asv had no value
    OOM = "oom"
    TIMEOUT = "timeout"
    ERROR = "error"
    CRASHED = "crashed"  # the process measuring the case died
    FAILED = "failed"  # asv rows only: no value recorded (the benchmark raised, or setup refused)
    # loaded rate rows only: above the roof its run measured (an accounting error, never a fact)
    ABOVE_ROOF = "above_roof"


class GateVerdict(enum.StrEnum):
    """The regression gate's word on one row of its BASE/HEAD table."""

    OK = "ok"
    REGRESSED = "regressed"
    UNDECIDED = "undecided"  # time only: noisy, or not significant either way
    SHOWN = "shown"  # a time row another metric decides; its figures stay in the table
    NOT_TIMED = "not timed"  # a time row the gate did not run (the counts decided it)
    NOT_APPLICABLE = "n/a"  # the case ran on neither side
    WRONG = "wrong"  # right on BASE, wrong on HEAD


class Basis(enum.StrEnum):
    """What a row of the gate's table stands on (its ``basis`` column)."""

    MEASURED = "measured"  # values measured at the row's length
    PREDICTED = "predicted"  # each side's cost split c0 + c1·L + c2·L² at the target length


GATE_DECIDED = (GateVerdict.OK, GateVerdict.REGRESSED, GateVerdict.WRONG)
"""The verdicts that decided a row: not ``undecided``, nor ``shown`` (the counts decided)."""
GATE_JUDGED = (*GATE_DECIDED, GateVerdict.UNDECIDED)
"""The verdicts of the rows the gate judged (not ``shown``, ``not timed`` or ``n/a``)."""


class Method(enum.StrEnum):
    """How a metric's value was obtained (the ``method`` column)."""

    WALL = "wall"  # perf_counter around blocks of calls
    CUDA_EVENTS = "cuda_events"
    PROFILER = "profiler"  # torch.profiler's memory events
    CUDA = "cuda"  # the CUDA caching allocator's peak
    MODEL = "model"  # the analytic prediction, not a measurement
    RSS = "rss"
    REFERENCE = "reference"  # against the float64 reference
    CALLGRIND = "callgrind"
    RUSAGE = "rusage"
    SCHEDSTAT = "schedstat"
    ASV = "asv"  # asv's own timing


class Source(enum.StrEnum):
    """Where a row of the tidy frame came from."""

    RUN = "run"  # an ``attnbench run`` directory
    ASV = "asv"  # an asv results directory


# ---- asv benchmark names (class.method, as asv stores them without the module prefix) --------
TIME_BENCHMARK = "Attention.time_attention"
PEAKMEM_BENCHMARK = "Attention.peakmem_attention"
TENSOR_BYTES_BENCHMARK = "AttentionMetrics.track_peak_tensor_bytes"
_FLOPS_BENCHMARK = "AttentionMetrics.track_flops"
_ERROR_RATIO_BENCHMARK = "AttentionAccuracy.track_error_ratio"
DECODE_TIME_BENCHMARK = "Decode.time_decode"
"""Decode: ``_ASV_DECODE_Q_LEN`` queries over a cache of ``seq_len_k`` keys (workload "decode")."""
_DECODE_GBPS_BENCHMARK = "Decode.track_decode_gbps"
GQA_TIME_BENCHMARK = "GroupedQuery.time_gqa"
"""Prefill with ``_ASV_GQA_KV_HEADS`` key/value heads for ``BASE_SPEC.heads`` query heads."""
_GQA_TENSOR_BYTES_BENCHMARK = "GroupedQuery.track_gqa_peak_tensor_bytes"
PEAK_BENCHMARK = "track_matmul_gflops"
"""The machine's matmul GFLOP/s (a module-level asv benchmark; matched by suffix)."""
_PAGE_FAULTS_BENCHMARK = "AttentionMetrics.track_page_faults"
INSTRUCTIONS_BENCHMARK = "Instructions.track_instructions"
"""Instructions per call under valgrind, counted in asv's setup_cache: one valgrind process per
commit and environment."""
TIME_FACTOR = 1.2
"""The regression gate's default allowed HEAD/BASE time ratio (``--time-factor``)."""
MEMORY_FACTOR = 1.1
"""The regression gate's default allowed HEAD/BASE peak tensor bytes ratio (``--memory-factor``)."""
INSTRUCTIONS_FACTOR = 1.002
"""The regression gate's allowed HEAD/BASE instruction count ratio (the A/A spread between valgrind
processes is far smaller: see the README)."""
FLOPS_FACTOR = 1.0 + 1e-9
"""The regression gate's allowed HEAD/BASE analytic FLOP ratio: no growth beyond rounding."""
GATE_VERDICTS = "attnbench-gate.csv"
"""The gate's verdict table, written beside the asv results it decided on (the report reads it)."""
GATED_BENCHMARKS = (
    TIME_BENCHMARK,
    TENSOR_BYTES_BENCHMARK,
    _FLOPS_BENCHMARK,
    _ERROR_RATIO_BENCHMARK,
)
"""What the regression gate runs on BASE and HEAD."""


# ---- the metric table ----------------------------------------------------------------------------
@dataclass(frozen=True)
class Metric:
    """One metric of the tidy frame: where a run reads it, how asv records it, how it is shown.

    Everything else derives from the table, :data:`METRICS`: ``Measurement.to_row`` (the CSV
    export), the loader's run and asv rows, :data:`UNITS`, plot labels, which metrics are fitted,
    and the asv suite's ``track_`` methods. A new metric is its measurement plus one row.
    """

    name: str  # the tidy frame's ``metric``
    unit: str  # the unit of ``value`` (the report's ``fmt`` knows "s" and "bytes")
    label: str  # axis label
    # Measurement attribute or property a run reads ("extra.KEY": a key of extra); None: asv only
    field: str | None = None
    spread: str | None = None  # Measurement attribute holding the value's spread (IQR), if any
    # how a run obtained it: a label, or "<ATTR" for the label a Measurement attribute holds
    method: str = ""
    column: str = ""  # its column in measurements.csv (default: ``field`` without "extra.")
    # asv benchmarks ("Class.method") that record it; their ``track_`` methods are generated
    asv: tuple[str, ...] = ()
    # the unit asv shows, when not ``unit`` (``asv_factor`` converts to ``unit``)
    asv_unit: str = ""
    asv_factor: float = 1.0
    # method label of asv rows; None: the runner's rule for peak tensor bytes
    asv_method: str | None = Method.ASV
    # the Variant attribute declaring its exponent in L (e.g. ``time_exponent``)
    declared: str | None = None
    fitted: bool = False  # complexity exponents are fitted to it
    timed: bool = False  # derived from wall time: a neighbour can disturb it

    @property
    def csv_column(self) -> str:
        return self.column or (self.field or "").removeprefix("extra.")

    @property
    def spread_column(self) -> str:
        """Its spread's column in measurements.csv: the attribute and the unit (``iqr_s``)."""
        return f"{self.spread}_{self.unit}" if self.spread else ""

    @property
    def tracked(self) -> tuple[str, ...]:
        """The ``track_`` benchmarks recording it (asv's ``time_`` and ``peakmem_`` are by hand)."""
        return tuple(b for b in self.asv if b.rsplit(".", 1)[-1].startswith("track_"))


_BUILTIN_METRICS: tuple[Metric, ...] = (
    Metric(
        "time",
        "s",
        "median time per call",
        field="median",
        spread="iqr",
        method="<timing_method",
        column="median_s",
        asv=(TIME_BENCHMARK, DECODE_TIME_BENCHMARK, GQA_TIME_BENCHMARK),
        declared="time_exponent",
        fitted=True,
        timed=True,
    ),
    Metric(
        "cuda_time",
        "s",
        "CUDA-event time per call",
        asv=("AttentionCuda.track_cuda_ms",),
        asv_unit="ms",
        asv_factor=1e-3,
        asv_method=Method.CUDA_EVENTS,
        timed=True,
    ),
    Metric(
        "compile_time",
        "s",
        "compile time (first call)",
        field="compile_seconds",
        method=Method.WALL,
        column="compile_s",
    ),
    Metric(
        "peak_tensor_bytes",
        "bytes",
        "peak tensor memory above inputs",
        field="peak_tensor_bytes",
        method="<memory_method",
        asv=(TENSOR_BYTES_BENCHMARK, _GQA_TENSOR_BYTES_BENCHMARK),
        asv_method=None,
        declared="memory_exponent",
        fitted=True,
    ),
    Metric(
        "peak_rss",
        "bytes",
        "process peak RSS",
        field="peak_rss_bytes",
        method=Method.RSS,
        asv=(PEAKMEM_BENCHMARK,),
    ),
    Metric(
        "gflops",
        "GFLOP/s",
        "achieved GFLOP/s",
        field="gflops_per_s",
        method="<timing_method",
        asv=("AttentionMetrics.track_gflops",),
        timed=True,
    ),
    Metric("flops", "FLOP", "executed FLOPs", asv=(_FLOPS_BENCHMARK,), asv_method=Method.MODEL),
    Metric(
        "max_error",
        "abs",
        "max error vs the float64 reference",
        field="max_error",
        method=Method.REFERENCE,
        asv=("AttentionAccuracy.track_max_error",),
        asv_unit="abs error",
        asv_method=Method.REFERENCE,
    ),
    Metric(
        "softmax_error",
        "abs",
        "max error vs exact softmax attention",
        field="softmax_error",
        method=Method.REFERENCE,
    ),
    Metric(
        "error_ratio",
        "x tolerance",
        "max error / tolerance",
        field="checked_error_ratio",
        method=Method.REFERENCE,
        column="error_ratio",
        asv=(_ERROR_RATIO_BENCHMARK,),
        asv_method=Method.REFERENCE,
    ),
    Metric(
        "bytes", "bytes", "bytes an ideal kernel moves", field="bytes_moved", method=Method.MODEL
    ),
    Metric(
        "gbps",
        "GB/s",
        "achieved GB/s",
        field="gbytes_per_s",
        method="<timing_method",
        asv=(_DECODE_GBPS_BENCHMARK,),
        timed=True,
    ),
    Metric(
        "instructions",
        "instructions",
        "instructions per call",
        field="instructions",
        method=Method.CALLGRIND,
        asv=(INSTRUCTIONS_BENCHMARK,),
        asv_method=Method.CALLGRIND,
        declared="time_exponent",
        fitted=True,
    ),
    Metric(
        "page_faults",
        "faults",
        "minor page faults per call",
        field="extra.page_faults",
        method=Method.RUSAGE,
        asv=(_PAGE_FAULTS_BENCHMARK,),
        asv_method=Method.RUSAGE,
        fitted=True,
    ),
    Metric(
        "waited_blocks",
        "share",
        "share of timed blocks that waited for a core",
        field="extra.waited_blocks",
        method=Method.SCHEDSTAT,
    ),
    Metric(
        "runqueue_share",
        "share",
        "run-queue wait per wall second (median block)",
        field="extra.runqueue_share",
        method=Method.SCHEDSTAT,
    ),
)
"""``bytes`` is :attr:`AttnSpec.bytes_moved` (method "model"); ``gbps`` is that over the measured
time. ``instructions``: per call of the timed closure, counted under valgrind
(:mod:`attnbench.measure.instructions`): deterministic, blind to cache misses, page faults,
bandwidth and waiting. ``page_faults``: minor faults of one call after the correctness gate, the
fresh pages it maps. On a CPU that is where a dense variant's O(L\u00b2) buffers cost time beside
its arithmetic. ``waited_blocks`` and ``runqueue_share``: how much a neighbour had the timing
thread's core while a case was timed (the share of its timed blocks that waited for a core over
``schedstat.WAIT_LIMIT`` of their time, each dropped and timed again, and the median block's wait
per wall second; :mod:`attnbench.measure.schedstat`). Facts about the machine, not the
variant: never fitted, and not ``timed``, so a ``noisy`` case keeps them as measured."""
METRICS: dict[str, Metric] = {}
"""The metric table: name -> row, in the order rows were added (:func:`add_metric`)."""
UNITS: dict[str, str] = {}
LABELS: dict[str, str] = {}
FITTED: list[str] = []
DECLARED: dict[str, str] = {}
ASV_METRICS: dict[str, tuple[str, float, str | None]] = {}
"""asv method name -> (tidy metric, factor to the metric's unit, method label); a label of None
means the runner's rule."""


def add_metric(metric: Metric) -> None:
    """Add a row to the table; the derived lookups above (objects every reader shares) follow it.

    The built-in rows are added this way at import; a plugin may add its own (the runner must then
    record the value its ``field`` names, e.g. in ``Measurement.extra``).

    Raises:
        ValueError: a metric of that name, or an asv benchmark another row records, exists already.
    """
    if metric.name in METRICS:
        raise ValueError(f"metric {metric.name!r} is already in the table")
    taken = [b for b in metric.asv if b.rsplit(".", 1)[-1] in ASV_METRICS]
    if taken:
        raise ValueError(f"asv benchmark(s) {', '.join(taken)} already record another metric")
    METRICS[metric.name] = metric
    UNITS[metric.name] = metric.unit
    LABELS[metric.name] = metric.label
    if metric.fitted:
        FITTED.append(metric.name)
    if metric.declared:
        DECLARED[metric.name] = metric.declared
    for benchmark in metric.asv:
        ASV_METRICS[benchmark.rsplit(".", 1)[-1]] = (
            metric.name,
            metric.asv_factor,
            metric.asv_method,
        )


for _metric in _BUILTIN_METRICS:
    add_metric(_metric)


def metric_value(measurement: Any, field: str) -> Any:
    """What a :class:`Metric`'s ``field`` names on a Measurement ("extra.KEY": NaN if absent)."""
    if field.startswith("extra."):
        return measurement.extra.get(field.removeprefix("extra."), math.nan)
    return getattr(measurement, field)


DETERMINISTIC_POINTS = 3
"""Lengths a fit of a metric without sampling noise needs (bytes, FLOPs, counts): with exact values,
three points show whether one power of L holds; a sampled metric (time) needs more
(``analysis.complexity.MIN_POINTS``)."""


# ---- workloads ---------------------------------------------------------------------------------
WORKLOADS: tuple[str, ...] = ("prefill", "decode")
"""``prefill``: every query of a sequence at once (Lq = Lk, compute-bound at long L); ``decode``: a
few queries (Lq = 1 per generated token, more for speculative decoding) over a long key/value cache
(memory-bound: O(Lk) work per token)."""
SWEPT_LENGTH: dict[str, str] = {"prefill": "seq_len", "decode": "seq_len_k"}
"""The tidy frame's column a workload's sweep varies, against which exponents are fitted: prefill
sweeps L = Lq = Lk (``seq_len``), decode the cache length Lk (``seq_len_k``) at a fixed Lq."""


# ---- the grids --------------------------------------------------------------------------------
@dataclass(frozen=True)
class Grid:
    """A named profile of cases: variants x lengths x modes x masks (the caller gives the shape)."""

    # the swept length: L = Lq = Lk (prefill) or the cache length Lk (decode)
    lengths: tuple[int, ...]
    # None: every variant in the default sweep (registry.default_variants)
    variants: tuple[str, ...] | None = None
    modes: tuple[str, ...] = ("forward",)
    masks: tuple[str, ...] = ("none",)
    # None: the caller's (``attnbench run --device``; asv: cpu, and cuda if present)
    devices: tuple[str, ...] | None = None
    workload: str = "prefill"
    # asv's Instructions class: predicted valgrind seconds it may spend (None: all)
    count_budget_s: float | None = None
    # asv's Instructions class: valgrind processes counting at once (at most one per usable core)
    count_processes: int = 1


_ASV_COUNT_BUDGET_S = 85.0
"""Predicted seconds under valgrind that the default asv tier's ``Instructions`` class counts,
cheapest cases first (the rest are n/a with the reason), after torch's start under valgrind (half a
minute to three minutes). 85 s buys the same 63 of the 128 CPU cases with one counted call per case
as 100 s did with two (2026-11-29, on this project's machine: the prediction reads its roof): the
time a second call took is saved, not spent on more cases."""
GRIDS: dict[str, Grid] = {
    "run": Grid(lengths=(64, 128, 256, 512, 1024, 2048, 4096)),
    "run-decode": Grid(lengths=tuple(2**p for p in range(10, 18)), workload="decode"),
    # on CUDA, calls below L=4096 are launch-bound (an H100: sdpa 23-26 us at L=1024-2048): the
    # lengths reach L=65536, where the L² term dominates (the guard skips what does not fit)
    "run-cuda": Grid(lengths=tuple(2**p for p in range(10, 17)), devices=("cuda",)),
    "asv": Grid(
        lengths=(128, 256, 512, 1024),
        variants=(
            "loop",
            "vectorized",
            "batched",
            "torch_mha",
            "sdpa",
            "chunked",
            "linear_elu",
            "bilinear",
        ),
        modes=("forward", "backward"),
        masks=("none", "causal"),
        count_budget_s=_ASV_COUNT_BUDGET_S,
        count_processes=2,
    ),
    "asv-full": Grid(
        lengths=(64, 128, 256, 512, 1024, 2048, 4096, 8192),
        modes=("forward", "backward"),
        masks=("none", "causal"),
        count_budget_s=1800.0,
        count_processes=2,
    ),
    "asv-decode": Grid(lengths=(4096, 16384), variants=("sdpa", "batched"), workload="decode"),
    "asv-gqa": Grid(lengths=(1024,), variants=("sdpa", "batched")),
    "ci": Grid(
        lengths=(256, 512, 1024),
        variants=("batched", "chunked", "sdpa", "local", "linear_elu"),
        devices=("cpu",),
    ),
}
"""``run``: ``attnbench run``'s default sweep; ``run-decode``: its decode workload (1K..128K keys;
the guard skips what does not fit). ``asv``: the asv suite's default tier (``Attention*`` classes):
the teaching progression (:data:`PROGRESSION`) and one representative of each other family
(``chunked`` blockwise, ``linear_elu`` linear, ``additive`` scoring; the compiled family recompiles
per shape and stays opt-in) at L = 128..2048, both passes, no mask and causal, sized so that
``asv run --quick`` takes minutes on 2 cores. ``asv-full``: every default-sweep variant at
L = 64..8192 (``ATTNBENCH_ASV_GRID=full``). ``asv-decode``: the ``Decode`` class (fused vs
materialised scores over a long cache); ``asv-gqa``: the ``GroupedQuery`` class (both the same in
either tier). ``ci``: the regression gate's subset, a few representative variants at short lengths
(minutes on 2 cores).

``count_budget_s``: the ``Instructions`` class counts the grid's CPU cases cheapest first (predicted
valgrind seconds, :func:`attnbench.measure.instructions.predicted_seconds`) while their sum stays
within it; None counts every case (each within the counter's own per-case budget).
``count_processes``: how many valgrind processes count them at once (torch's start is paid once
per process, half a minute): the tiers take both cores of a 2-core machine while nothing else
runs; the ``ci`` grid keeps one, because the gate counts BASE and HEAD at once already."""
ASV_TIERS: dict[str, str] = {"default": "asv", "full": "asv-full"}
"""``ATTNBENCH_ASV_GRID`` value -> the grid of :data:`GRIDS` the asv suite's main classes run."""
RUN_LENGTHS: dict[str, tuple[int, ...]] = {
    "prefill": GRIDS["run"].lengths,
    "decode": GRIDS["run-decode"].lengths,
}
"""``attnbench run``'s default lengths per workload."""
CUDA_RUN_LENGTHS: tuple[int, ...] = GRIDS["run-cuda"].lengths
"""``attnbench run --device cuda``'s default prefill lengths: 1K .. 64K."""
BASE_SPEC = AttnSpec(batch=1, heads=8, head_dim=64, dtype="float32")
"""The asv suite's fixed shape (B, H, D, dtype); the grid varies variant, L, device and mode."""
_ASV_DECODE_Q_LEN = 1

# ---- a case's identity ---------------------------------------------------------------------------
CASE_DEFAULTS: dict[str, object] = {
    "machine": "",
    "device": "cpu",
    "workload": "prefill",
    "variant": "",
    "seq_len": 0,
    "seq_len_k": 0,  # read as seq_len (self-attention) where a row lacks it
    "dtype": BASE_SPEC.dtype,
    "batch": BASE_SPEC.batch,
    "heads": BASE_SPEC.heads,
    "kv_heads": 0,  # read as heads (no GQA) where a row lacks it
    "head_dim": BASE_SPEC.head_dim,
    "mask": "none",
    "mode": "forward",
}
"""The tidy columns that name one case, each with the value a row lacking it is read as (older
results had no mask, no key/value heads, no workload). Rows that differ in any of them are
different cases: never pooled, never exported under one name."""
CASE_IDENTITY: tuple[str, ...] = tuple(CASE_DEFAULTS)
"""The columns of :data:`CASE_DEFAULTS`, in order: what :func:`case_key` is made of."""
LENGTHS: tuple[str, ...] = ("seq_len", "seq_len_k")
"""A case's lengths (queries, keys): what a fit runs along; the rest of a case holds one series."""
SHAPE: tuple[str, ...] = ("batch", "heads", "kv_heads", "head_dim")
"""A case's shape beside its lengths: rows that differ in any of them are never pooled."""
ASV_CASE: tuple[str, ...] = ("variant", *LENGTHS, "device", "mode", "mask")
"""The parameters of an asv benchmark's case; its class fixes the rest of :data:`CASE_IDENTITY`."""


def case_columns(lead: Sequence[str] = (), *, without: Collection[str] = ()) -> tuple[str, ...]:
    """The columns that tell one table's cases apart: ``lead``, then the rest of the identity.

    ``lead`` is the table's own order (where the table shows its columns, the order a user reads),
    and may start with columns beside the identity (``source``, ``commit``: whose run); every column
    of :data:`CASE_IDENTITY` it does not name follows in that order, less ``without`` (the ones the
    table varies along or fixes by construction). So a column added to the identity reaches every
    table's keys, and no table merges two cases that differ in it.

    Raises:
        ValueError: ``without`` names a column outside the identity, or one ``lead`` names.
    """
    unknown = sorted(set(without) - set(CASE_IDENTITY))
    both = sorted(set(without) & set(lead))
    if unknown or both:
        raise ValueError(
            f"without: expected columns of the case identity not in lead, got {unknown or both}"
        )
    return (*lead, *(c for c in CASE_IDENTITY if c not in lead and c not in without))


def _missing(value: object) -> bool:
    """None, "", NaN or pandas' NA (which is not equal to itself, and has no truth value)."""
    if value is None or (isinstance(value, str) and not value):
        return True
    try:
        return bool(value != value)
    except TypeError:
        return True


def case_key(rec: Mapping[str, Any]) -> tuple:
    """A row's case as a hashable tuple over :data:`CASE_IDENTITY` (equal: the same case).

    Missing values (absent, None, NaN, pandas' NA, "") are read as :data:`CASE_DEFAULTS` gives, an
    absent ``seq_len_k`` as ``seq_len`` and absent ``kv_heads`` as ``heads``, and whole numbers as
    ints, so a row of an older file and a row of a newer one of the same case have one key.
    """
    values: dict[str, object] = {}
    for col, default in CASE_DEFAULTS.items():
        value = rec.get(col)
        if _missing(value):
            value = {"seq_len_k": values.get("seq_len"), "kv_heads": values.get("heads")}.get(
                col, default
            )
        elif isinstance(default, int) and not isinstance(value, bool):
            value = int(value)  # type: ignore[call-overload]
        else:
            value = str(value)
        values[col] = value
    return tuple(values.values())


_ASV_GQA_KV_HEADS = BASE_SPEC.heads // 4
"""Key/value heads of the GQA benchmark: 4 query heads per key/value head."""
ASV_MAX_CALL_SECONDS = 1.0
"""Predicted seconds per call above which an asv case is n/a."""

# the environment variables that select and narrow the asv grid (comma-separated lists)
ENV_GRID = "ATTNBENCH_ASV_GRID"
"""The asv tier: ``default`` (unset) or ``full`` (:data:`ASV_TIERS`); ENV_* below narrow it."""
ENV_VARIANTS = "ATTNBENCH_ASV_VARIANTS"
ENV_LENGTHS = "ATTNBENCH_ASV_LENGTHS"
ENV_DEVICES = "ATTNBENCH_ASV_DEVICES"
ENV_MODES = "ATTNBENCH_ASV_MODES"
ENV_MASKS = "ATTNBENCH_ASV_MASKS"
ENV_MAX_CALL_S = "ATTNBENCH_ASV_MAX_CALL_S"
ENV_COUNT_BUDGET_S = "ATTNBENCH_ASV_COUNT_BUDGET_S"
"""The ``Instructions`` class's budget (seconds, or ``none``), in place of ``count_budget_s``."""
ENV_COUNT_PROCESSES = "ATTNBENCH_ASV_COUNT_PROCESSES"
"""The ``Instructions`` class's valgrind processes, in place of ``count_processes``."""
ENV_BATCH = "ATTNBENCH_ASV_BATCH"
"""For tests of the gate only: results taken with it are not labelled with it."""
ENV_DECODE_LENGTHS = "ATTNBENCH_ASV_DECODE_LENGTHS"
"""Decode's cache lengths (ENV_LENGTHS narrows the others' lengths, ENV_VARIANTS every class's)."""
ENV_PROBE_LOG = "ATTNBENCH_PROBE_LOG"
"""A file the time benchmarks append a line to per sample: the calibration probe timed before it,
its wall time and run-queue share (the regression gate sets it)."""
ENV_ENV_DIR = "ATTNBENCH_ASV_ENV_DIR"
"""Where the regression gate's asv keeps its environments (default: the checkout's ``.asv/env``):
one directory shared by several clones, or restored from a CI cache, saves building asv's pinned
virtualenv again."""
GRID_ENV = (
    ENV_GRID,
    ENV_VARIANTS,
    ENV_LENGTHS,
    ENV_DEVICES,
    ENV_MODES,
    ENV_MASKS,
    ENV_MAX_CALL_S,
    ENV_COUNT_BUDGET_S,
    ENV_COUNT_PROCESSES,
    ENV_BATCH,
    ENV_DECODE_LENGTHS,
)


def asv_tier(environ: Mapping[str, str] | None = None) -> tuple[str, Grid]:
    """The asv tier ``ATTNBENCH_ASV_GRID`` selects, ``(name in GRIDS, grid)`` (unset: ``default``).

    Raises:
        ValueError: an unknown value (the message names the variable and the valid values).
    """
    raw = (os.environ if environ is None else environ).get(
        ENV_GRID, ""
    ).strip().lower() or "default"
    if raw not in ASV_TIERS:
        raise ValueError(
            f"{ENV_GRID} must be one of {', '.join(ASV_TIERS)} (unset: default), got {raw!r}"
        )
    return ASV_TIERS[raw], GRIDS[ASV_TIERS[raw]]


def grid_environment(grid: Grid) -> dict[str, str]:
    """The ``ENV_*`` variables that narrow asv's grid to ``grid`` (the regression gate's CI subset).

    The count budget and processes travel with it: a grid without a budget (``ci``) is counted
    whole, in one process, in either tier.
    """
    env = {
        ENV_LENGTHS: ",".join(map(str, grid.lengths)),
        ENV_MODES: ",".join(grid.modes),
        ENV_MASKS: ",".join(grid.masks),
        ENV_COUNT_BUDGET_S: "none" if grid.count_budget_s is None else f"{grid.count_budget_s:g}",
        ENV_COUNT_PROCESSES: str(grid.count_processes),
    }
    if grid.variants is not None:
        env[ENV_VARIANTS] = ",".join(grid.variants)
    else:  # every default-sweep variant: the full tier's list (the default tier names its own)
        env[ENV_GRID] = "full"
    if grid.devices is not None:
        env[ENV_DEVICES] = ",".join(grid.devices)
    return env


def asv_case(benchmark: str, case: dict, base: AttnSpec = BASE_SPEC) -> tuple[AttnSpec, str]:
    """The case and workload an asv parameter set names: the one rule the suite and loader share.

    Args:
        benchmark: the asv benchmark name (``Class.method``, with or without a module prefix).
        case: parameter name -> value (``variant`` is not read here).
        base: the fixed shape (the suite may change its batch for tests).

    Raises:
        ValueError, TypeError: a parameter the spec rejects (e.g. a length that is not an int >= 1).
    """
    cls = benchmark.split(".")[-2] if "." in benchmark else ""
    device = case.get("device", "cpu")
    if cls == DECODE_TIME_BENCHMARK.split(".")[0]:
        spec = base.replace(
            seq_len=_ASV_DECODE_Q_LEN, seq_len_k=case.get("seq_len_k", 0), device=device
        )
        return spec, "decode"
    kv_heads = _ASV_GQA_KV_HEADS if cls == GQA_TIME_BENCHMARK.split(".")[0] else None
    # older suites had no mask parameter (unmasked) and, before that, no mode (forward)
    spec = base.replace(
        seq_len=case.get("seq_len", 0),
        device=device,
        mode=case.get("mode", "forward"),
        mask=case.get("mask", "none"),
        kv_heads=kv_heads,
    )
    return spec, "prefill"


# ---- the teaching progression (the report's headline figure) -------------------------------------
PROGRESSION: tuple[str, ...] = ("loop", "vectorized", "batched", "torch_mha", "sdpa")
"""From the Python loop to fused SDPA, the order in which the lecture notes build attention up."""
FAMILIES: dict[str, tuple[str, ...]] = {
    "dense": ("loop", "vectorized", "batched", "multihead", "torch_mha", "sdpa_math"),
    "fused": ("sdpa", "sdpa_flash", "sdpa_efficient", "sdpa_cudnn"),
    "blockwise": ("chunked", "local", "block_sparse"),
    "linear": ("linear_elu", "performer"),
    "scoring": ("dot", "scaled_dot", "bilinear", "additive"),
    "compiled": ("compiled_batched", "compiled_chunked", "flex"),
}
"""Families of variants, each member list in the order the report shades it (lighter first)."""
REPRESENTATIVES: dict[str, str] = {
    "dense": "batched",
    "fused": "sdpa",
    "blockwise": "chunked",
    "linear": "linear_elu",
    "scoring": "scaled_dot",
}
"""One variant per family that ``attnbench run`` counts instructions for by default beside
:data:`PROGRESSION` (not the compiled family: it compiles per shape on its first call, too slow
under valgrind)."""
OTHER_FAMILY = "other"
"""The family of a variant no family lists (plugins)."""


def family(variant: str) -> str:
    """The family a variant belongs to (:data:`OTHER_FAMILY` for variants no family lists)."""
    # a series label ("sdpa Hkv=2 (model)") belongs to its variant's family
    base = variant.split(" ")[0]
    return next((name for name, members in FAMILIES.items() if base in members), OTHER_FAMILY)
