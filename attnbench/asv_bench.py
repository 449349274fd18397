"""Everything the asv benchmark modules need, so that ``benchmarks/*.py`` stay declarations.

asv calls ``setup`` before every timed call, in a fresh process per benchmark: inputs come from
an ``lru_cache`` getter so repeated setups are free, and an impossible combination (CUDA without a
GPU, a variant that does not support the case, a case predicted to take more than
``MAX_CALL_SECONDS`` or more memory than the budget) raises ``NotImplementedError``, which asv
shows as n/a. Preparing a case makes the first call of the timed closure and puts its result
through the correctness gate (:mod:`attnbench.measure.gate`): a case that fails it raises
:class:`WrongResult` in the setup of the timing and metric benchmarks, so asv records it as failed,
never as a time; ``AttentionAccuracy.track_error_ratio`` reports error / tolerance (above 1: wrong).

Measurement regime: importing this module applies :func:`attnbench.measure.regime.apply` with
``ATTNBENCH_THREADS`` threads (default :data:`~attnbench.measure.regime.DEFAULT_THREADS`), the
regime ``attnbench run`` and ``attnbench regress`` measure in. asv starts its benchmark processes
with its own ``os.environ`` (plus the config's matrix variables), so a plain ``asv run`` does not
carry ``MALLOC_*_`` variables; the allocator thresholds are therefore pinned here, through mallopt,
which holds for every allocation after import: every case is set up and timed after it.
``benchmarks/bench_regime.py`` records the regime in the results (its parameter is ``describe()``).

The grid can be narrowed without editing code (the CI subset does this):
``ATTNBENCH_ASV_VARIANTS``, ``ATTNBENCH_ASV_LENGTHS``, ``ATTNBENCH_ASV_DEVICES``,
``ATTNBENCH_ASV_MODES``, ``ATTNBENCH_ASV_MASKS`` (comma-separated) and ``ATTNBENCH_ASV_MAX_CALL_S``; ``ATTNBENCH_ASV_BATCH``
is for tests only (see :data:`BASE`).

Two small classes sit beside the main grid: ``Decode`` (one query over a cache of 4K and 16K keys,
time and achieved GB/s; ``ATTNBENCH_ASV_DECODE_LENGTHS`` narrows it) and ``GroupedQuery`` (prefill
with H/4 key/value heads: time and peak tensor bytes), each for sdpa and batched unless
``ATTNBENCH_ASV_VARIANTS`` names others. Their cases come from :func:`attnbench.contract.asv_case`,
the rule the loader reads them back with.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench import contract, environ
from attnbench.io import append_line
from attnbench.measure import gate, guard, memory, probe, regime, runner, schedstat
from attnbench.measure.peak import matmul_peak, measure_matmul_peak
from attnbench.measure.timer import TimerConfig, time_call
from attnbench.plugins import load_plugins
from attnbench.registry import default_variants, get_variant
from attnbench.spec import AttnSpec

load_plugins()  # variants registered by modules named in ATTNBENCH_PLUGINS join the grid (and may be named below)
REGIME = regime.Regime(threads=int(environ.read_number(environ.THREADS, regime.DEFAULT_THREADS)))
"""The regime every asv benchmark process measures in (applied at import, before any case is built)."""
regime.apply(REGIME)


CUDA = torch.cuda.is_available()
BASE = contract.BASE_SPEC.replace(batch=int(environ.read_number(contract.ENV_BATCH, 1)))
"""The suite's fixed shape. ``ATTNBENCH_ASV_BATCH`` exists for tests of the gate (a batch-swapping
fault is the identity at B=1); results taken with it are not labelled with it, so leave it unset
for results you keep."""
GRID, DECODE_GRID, GQA_GRID = contract.GRIDS["asv"], contract.GRIDS["asv-decode"], contract.GRIDS["asv-gqa"]
LENGTHS = environ.read_list(contract.ENV_LENGTHS, list(GRID.lengths))
DEVICES = environ.read_list(contract.ENV_DEVICES, ["cpu", "cuda"] if CUDA else ["cpu"])
MODES = environ.read_list(contract.ENV_MODES, list(GRID.modes))
MASKS = environ.read_list(contract.ENV_MASKS, list(GRID.masks))
"""Mask kinds of the grid: no mask and causal, the one production models run (the CI subset keeps ``none``)."""
# Default-sweep variants that run on at least one of the devices (CUDA-only SDPA backends drop out on
# CPU boxes; compiled variants, which recompile for every parameter set, are opt-in by name).
VARIANTS = environ.read_list(
    contract.ENV_VARIANTS,
    [n for n in default_variants() if any(not get_variant(n).not_supported_reasons(BASE.replace(device=d)) for d in DEVICES)],
)
MAX_CALL_SECONDS = environ.read_number(contract.ENV_MAX_CALL_S, contract.ASV_MAX_CALL_SECONDS)
"""Predicted seconds per call above which a case is n/a (keeps `asv run` within its budget)."""

PARAMS: dict[str, list] = {"variant": VARIANTS, "seq_len": LENGTHS, "device": DEVICES, "mode": MODES, "mask": MASKS}
DECODE_PARAMS: dict[str, list] = {
    "variant": environ.read_list(contract.ENV_VARIANTS, list(DECODE_GRID.variants or ())),
    "seq_len_k": environ.read_list(contract.ENV_DECODE_LENGTHS, list(DECODE_GRID.lengths)),
    "device": DEVICES,
}
"""The ``Decode`` class's grid: variant x cache length Lk x device (one query, forward)."""
GQA_PARAMS: dict[str, list] = {
    "variant": environ.read_list(contract.ENV_VARIANTS, list(GQA_GRID.variants or ())),
    "seq_len": environ.read_list(contract.ENV_LENGTHS, list(GQA_GRID.lengths)),
    "device": DEVICES,
}
"""The ``GroupedQuery`` class's grid: variant x L x device (H/4 key/value heads, forward)."""
CI_GRID = contract.GRIDS["ci"]
INSTRUCTION_PARAMS: dict[str, list] = {
    "variant": environ.read_list(contract.ENV_VARIANTS, list(CI_GRID.variants or ())),
    "seq_len": environ.read_list(contract.ENV_LENGTHS, list(CI_GRID.lengths)),
    "device": ["cpu"],
    "mode": environ.read_list(contract.ENV_MODES, list(CI_GRID.modes)),
    "mask": environ.read_list(contract.ENV_MASKS, list(CI_GRID.masks)),
}
"""The ``Instructions`` class's grid: the regression gate's CI grid (counting under valgrind is slow), CPU only."""


def params(*names: str, table: dict[str, list] | None = None) -> tuple[list[list], list[str]]:
    """``(params, param_names)`` for an asv class, generated from one table so they cannot drift.

    Args:
        names: a subset of the table's keys, in order (default: all of them).
        table: ``PARAMS`` (default), ``DECODE_PARAMS`` or ``GQA_PARAMS``.
    """
    table = PARAMS if table is None else table
    names = names or tuple(table)
    return [list(table[n]) for n in names], list(names)


def spec_for(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> AttnSpec:
    """The case one parameter set names (the mask is the last parameter)."""
    case = {"seq_len": seq_len, "device": device, "mode": mode, "mask": mask}
    return contract.asv_case(contract.TIME_BENCHMARK, case, BASE)[0]


GATE_CONFIG = runner.MeasureConfig()
"""The correctness gate's policy in asv (reference budget, seed): the runner's defaults."""


class WrongResult(AssertionError):
    """The case's result failed the correctness gate: asv records the benchmark as failed, never as a number."""


@dataclass(frozen=True)
class Prepared:
    """One parameter set, ready to time: the closure, its case, and the gate's verdict on its first call."""

    variant: str  # registry name
    call: Callable[[], object]  # the closure asv times (the runner's make_call)
    spec: AttnSpec  # the case
    checked: gate.GateResult | None  # the gate on the closure's first result; None when not checked
    note: str  # why the case is not checked ("" when it is)


def prepare(variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none") -> Prepared:
    """Guard, inputs, the first (warm-up) call of the timed closure and the gate on its result.

    Raises:
        NotImplementedError: the case is n/a here (unsupported, or over the time or memory budget).
    """
    return prepare_spec(variant, spec_for(variant, seq_len, device, mode, mask))


@functools.lru_cache(maxsize=8)
def prepare_spec(variant: str, spec: AttnSpec) -> Prepared:
    """:func:`prepare` for any case (the decode and GQA classes name theirs through ``contract.asv_case``)."""
    device = spec.device
    impl = get_variant(variant)
    reasons = impl.not_supported_reasons(spec)
    plan = runner.check_plan(impl, spec, GATE_CONFIG)
    if not reasons:
        peak = matmul_peak(device, "float32")
        seconds = guard.predicted_seconds(impl, spec, peak)
        if seconds > MAX_CALL_SECONDS:
            reasons.append(f"predicted {seconds:.2f} s per call > {MAX_CALL_SECONDS:g} s")
        need = guard.predicted_bytes(impl, spec, plan.reference_bytes)
        if need > 0.5 * guard.free_bytes(device):
            reasons.append(f"predicted {need / 2**20:,.0f} MiB exceeds half the free memory")
    if reasons:
        raise NotImplementedError("; ".join(reasons))
    gated = runner.GatedCall(impl, spec, plan, GATE_CONFIG.seed)  # the first call compiles outside asv's timed calls
    checked = gated.first
    if checked is not None and checked.passed:  # later calls show state kept between calls, or an intermittent fault
        later, _ = gated.check_later()
        checked = checked if later.passed else later
    return Prepared(variant=variant, call=gated.call, spec=spec, checked=checked, note=plan.note)


def case(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> tuple[Callable[[], object], AttnSpec]:
    """The prepared call for one parameter set, gated.

    Raises:
        NotImplementedError: n/a (see :func:`prepare`).
        WrongResult: the closure's result failed the correctness gate (asv: failed, never a time).
    """
    prepared = _main_grid(variant, seq_len, device, mode, mask)
    return prepared.call, prepared.spec


SCHEDSTAT = schedstat.SCHEDSTAT
"""Where the timer reads the timing thread's run-queue wait (:mod:`attnbench.measure.schedstat`, shared with the runner)."""


class WaitWatch:
    """asv's ``timer`` for the time benchmark: the wall clock asv would use anyway (``time.perf_counter``), with
    the timing thread's run-queue wait read beside each reading (outside the interval it returns).

    asv reads a timer in pairs around the timed calls; :meth:`take` gives their wall time and the share of it
    the thread spent runnable but without a core, i.e. taken by another process. The calibration probe is blind to
    a steady neighbour (a 1 ms probe slips between the scheduler's 4 ms slices, an 8 ms call does not: beside two
    spinning processes calls took 1x or 2x while every probe stayed typical). Time a call spends sleeping or
    blocked is not waiting for a core: a slowdown of that kind stays a slowdown.
    """

    def __init__(self) -> None:
        self._start: tuple[float, float | None] | None = None
        self._wall, self._wait = 0.0, 0.0
        self._known = True

    def __call__(self) -> float:
        if self._start is None:  # the interval opens: the wait is read before the clock
            wait = schedstat.runqueue_seconds()
            self._start = (time.perf_counter(), wait)
            return self._start[0]
        wall = time.perf_counter()  # the interval closes: the clock is read before the wait
        wait, (wall0, wait0) = schedstat.runqueue_seconds(), self._start
        self._wall += wall - wall0
        if wait is None or wait0 is None:
            self._known = False
        else:
            self._wait += wait - wait0
        self._start = None
        return wall

    def take(self) -> tuple[float, float | None]:
        """``(wall seconds, run-queue share)`` of the calls timed since the last take; the share is run-queue seconds
        per wall second (None: nothing timed, or the kernel did not say)."""
        wall, wait, known = self._wall, self._wait, self._known
        self._start, self._wall, self._wait, self._known = None, 0.0, 0.0, True
        return wall, (wait / wall if wall > 0 and known else None)


TIMER = WaitWatch()
"""The time benchmark's timer (one per benchmark process); :func:`timed_teardown` logs what it timed."""
_pending: dict | None = None  # the probe line of the sample under way (set up, not yet torn down)


def timed_case(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> tuple[Callable[[], object], AttnSpec]:
    """:func:`case` for the time benchmark's ``setup``, which asv runs before every sample (outside its timer).

    With ``ATTNBENCH_PROBE_LOG`` set (the regression gate sets it), a calibration probe
    (:func:`attnbench.measure.probe.probe_seconds`) is timed here, just before the sample; :func:`timed_teardown`
    appends it to that file with the sample it preceded.
    """
    global _pending
    call, spec = case(variant, seq_len, device, mode, mask)
    TIMER.take()  # the sample starts afresh
    _pending = None
    if os.environ.get(contract.ENV_PROBE_LOG):
        _pending = {"commit": os.environ.get("ASV_COMMIT", ""), "variant": variant, "seq_len": seq_len,
                    "device": device, "mode": mode, "mask": mask, "probe_s": probe.probe_seconds(spec.device)}
    return call, spec


def timed_teardown() -> None:
    """The time benchmark's ``teardown`` (after every sample): one line per sample in ``ATTNBENCH_PROBE_LOG``.

    The line holds the probe timed just before the sample (``probe_s``), the sample's wall time (``sample_s``: asv
    re-runs setup and teardown around every timed call of a benchmark with a ``setup``, so it is one call) and
    the share of it the timing thread spent waiting for a core (``runqueue_share``, ``null`` where not known).
    The gate reads ``sample_s / probe_s`` (the sample in units of the machine's speed at that moment) beside
    ``sample_s`` and refuses samples a neighbour descheduled.
    """
    global _pending
    wall, share = TIMER.take()
    path, line, _pending = os.environ.get(contract.ENV_PROBE_LOG), _pending, None
    if path and line is not None and wall > 0:  # peakmem's samples use no timer: nothing to log
        append_line(path, json.dumps({**line, "sample_s": wall, "runqueue_share": share}))


def _main_grid(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> Prepared:
    return _gated_prepared(variant, spec_for(variant, seq_len, device, mode, mask))


def _gated(variant: str, spec: AttnSpec) -> tuple[Callable[[], object], AttnSpec]:
    prepared = _gated_prepared(variant, spec)
    return prepared.call, prepared.spec


def _gated_prepared(variant: str, spec: AttnSpec) -> Prepared:
    prepared = prepare_spec(variant, spec)
    if prepared.checked is not None and not prepared.checked.passed:
        raise WrongResult(f"{variant} {prepared.spec.label}: {prepared.checked.reason()}")
    return prepared


def decode_case(variant: str, seq_len_k: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``Decode`` parameter set (raises as :func:`case` does)."""
    return _gated(variant, _decode_spec(seq_len_k, device))


def _decode_spec(seq_len_k: int, device: str) -> AttnSpec:
    return contract.asv_case(contract.DECODE_TIME_BENCHMARK, {"seq_len_k": seq_len_k, "device": device}, BASE)[0]


def gqa_case(variant: str, seq_len: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``GroupedQuery`` parameter set (raises as :func:`case` does)."""
    return _gated(variant, _gqa_spec(seq_len, device))


def _gqa_spec(seq_len: int, device: str) -> AttnSpec:
    return contract.asv_case(contract.GQA_TIME_BENCHMARK, {"seq_len": seq_len, "device": device}, BASE)[0]


def setup_accuracy(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> None:
    """n/a rules for the accuracy benchmarks: the case's own, plus the float64 reference's budget.

    A wrong result does not raise here: the accuracy benchmarks report how wrong it is.
    """
    prepared = prepare(variant, seq_len, device, mode, mask)
    if prepared.checked is None:
        raise NotImplementedError(prepared.note or "accuracy not checked")


# ---- the table's tracked metrics: one generated ``track_`` method per (class, metric) --------------
PREPARED: dict[str, Callable[..., Prepared]] = {
    "AttentionMetrics": _main_grid,
    "AttentionCuda": _main_grid,
    "AttentionAccuracy": prepare,  # a wrong result is what these benchmarks report, not a failure
    "Decode": lambda v, n, d: _gated_prepared(v, _decode_spec(n, d)),
    "GroupedQuery": lambda v, n, d: _gated_prepared(v, _gqa_spec(n, d)),
}
"""How each asv class turns its parameters into a prepared case (its ``setup`` makes the same call)."""


def _median_seconds(prepared: Prepared, timer: TimerConfig) -> float:
    samples, _ = time_call(prepared.call, prepared.spec.device, timer)
    return statistics.median(samples)


def _peak_tensor_bytes(prepared: Prepared) -> float:
    prepared.call()  # warm caches (parameters, kernels) outside the measured call
    return runner.peak_tensor_bytes(get_variant(prepared.variant), prepared.spec, prepared.call)[0]


def _page_faults(prepared: Prepared) -> float:
    prepared.call()  # the same state as the runner's count: after the warm-up call and the gate's
    return float(memory.page_faults(prepared.call))


MEASURES: dict[str, Callable[[Prepared], float]] = {
    "peak_tensor_bytes": _peak_tensor_bytes,
    "gflops": lambda p: get_variant(p.variant).flops(p.spec).executed / _median_seconds(
        p, TimerConfig(min_runs=3, min_time=0.1, max_time=2.0)) / 1e9,
    "flops": lambda p: float(get_variant(p.variant).flops(p.spec).executed),  # deterministic: the gate is strict on it
    "cuda_time": lambda p: _median_seconds(p, TimerConfig(min_runs=10, min_time=0.2, max_time=2.0)),
    "gbps": lambda p: p.spec.bytes_moved / _median_seconds(p, TimerConfig(min_runs=5, min_time=0.1, max_time=2.0)) / 1e9,
    "max_error": lambda p: math.nan if p.checked is None else p.checked.max_error,
    "error_ratio": lambda p: math.nan if p.checked is None else p.checked.error_ratio,
    "page_faults": _page_faults,
}
"""How asv measures a tracked metric on a prepared case, in the metric's unit. A metric of the table without
an entry here is read from a full :func:`attnbench.measure.runner.measure` of the case (slower, but the
same number ``attnbench run`` records)."""


def _runner_value(metric: contract.Metric, prepared: Prepared) -> float:
    if metric.field is None:
        raise NotImplementedError(f"metric {metric.name!r} names no Measurement field and has no asv measure")
    measured = runner.measure(prepared.variant, prepared.spec, GATE_CONFIG)
    return float(contract.metric_value(measured, metric.field))


def track(metric: str, owner: str, *params: object) -> float:
    """The value of a tracked ``metric`` for one parameter set of the asv class ``owner``, in asv's unit.

    Raises:
        NotImplementedError: n/a (see :func:`prepare`); WrongResult: a wrong result (gated classes).
    """
    row = contract.METRICS[metric]
    prepared = PREPARED[owner](*params)
    measure = MEASURES.get(metric)
    value = measure(prepared) if measure is not None else _runner_value(row, prepared)
    return value / row.asv_factor


# ---- instruction counts: one valgrind process per commit and environment (asv's setup_cache) -------
INSTRUCTION_SETUP_TIMEOUT = 3 * 3600
"""Seconds asv allows the Instructions class's setup_cache (torch starts under valgrind in minutes; then every case)."""


def instruction_counts() -> dict:
    """``setup_cache`` of the ``Instructions`` class: every CPU parameter set of the main grid, counted in ONE valgrind
    process (:func:`attnbench.measure.instructions.count_instructions`), keyed by its parameters.

    asv runs it once per commit and environment and hands the (pickled) result to every ``setup`` and ``track_``
    call, so no case starts a valgrind of its own. Without valgrind the cache says why (each case is then n/a).
    """
    from attnbench.measure.instructions import CountConfig, count_instructions, missing_message, valgrind_version

    if valgrind_version() is None:
        return {"missing": missing_message()}
    grid, names = params(table=INSTRUCTION_PARAMS)
    combos = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid)]
    cpu = [c for c in combos if c["device"] == "cpu"]
    counts = count_instructions([(c["variant"], spec_for(**c)) for c in cpu], CountConfig(seed=GATE_CONFIG.seed))
    return {tuple(c.values()): (count.status, count.instructions, count.reason, count.valgrind) for c, count in zip(cpu, counts, strict=True)}


def instruction_case(counts: dict, *params: object) -> float:
    """The count of one parameter set from :func:`instruction_counts`' cache.

    Raises:
        NotImplementedError: no count (valgrind missing, not on CPU, unsupported, over budget): n/a.
        WrongResult: the counted closure's result failed the correctness gate.
        RuntimeError: the count failed (its reason).
    """
    if "missing" in counts:
        raise NotImplementedError(counts["missing"])
    status, value, reason, _ = counts.get(tuple(params), ("skipped", math.nan, "not on CPU", ""))
    if status == "wrong":
        raise WrongResult(f"{params[0]}: {reason}")
    if status == "error":
        raise RuntimeError(reason)
    if status != "ok":
        raise NotImplementedError(reason)
    return value


CACHED: dict[str, Callable[..., float]] = {"instructions": instruction_case}
"""Tracked metrics whose asv class measures every case at once in ``setup_cache``: metric -> (cache, *params) -> value."""


def _track_method(metric: contract.Metric, owner: str, method: str, cached: bool = False) -> Callable[..., float]:
    if cached:
        def track_metric(self: object, cache: object, *params: object) -> float:
            return CACHED[metric.name](cache, *params) / metric.asv_factor
    else:
        def track_metric(self: object, *params: object) -> float:
            return track(metric.name, owner, *params)

    track_metric.__name__, track_metric.__qualname__ = method, f"{owner}.{method}"
    track_metric.unit = metric.asv_unit or metric.unit  # type: ignore[attr-defined]
    return track_metric


def tracked(cls: type) -> type:
    """Class decorator: add the ``track_`` methods :data:`contract.METRICS` assigns to this asv class.

    A metric row naming ``"AttentionMetrics.track_x"`` in its ``asv`` gets ``AttentionMetrics.track_x``,
    with the row's unit, measured by :func:`track`; in a class with ``setup_cache`` (which measured every case
    at once), read from the cache by :data:`CACHED`.
    """
    for metric in contract.METRICS.values():
        for benchmark in metric.tracked:
            owner, method = benchmark.split(".")
            if owner == cls.__name__:
                setattr(cls, method, _track_method(metric, owner, method, cached=hasattr(cls, "setup_cache")))
    return cls


def matmul_gflops() -> float:
    """This machine's fp32 matmul GFLOP/s (freshly measured): the roof for % of peak."""
    return measure_matmul_peak("cpu", "float32") / 1e9
