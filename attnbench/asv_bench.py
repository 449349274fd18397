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
import math
import os
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from attnbench import contract
from attnbench.measure import gate, guard, regime, runner
from attnbench.measure.peak import matmul_peak, measure_matmul_peak
from attnbench.measure.timer import TimerConfig, time_call
from attnbench.plugins import load_plugins
from attnbench.registry import get_variant, variant_names
from attnbench.spec import AttnSpec

REGIME = regime.Regime(threads=int(os.environ.get("ATTNBENCH_THREADS", "") or regime.DEFAULT_THREADS))
"""The regime every asv benchmark process measures in (applied at import, before any case is built)."""
regime.apply(REGIME)
load_plugins()  # variants registered by modules named in ATTNBENCH_PLUGINS join the grid


def _env_list(name: str, default: list, kind: type = str) -> list:
    """A comma-separated override from the environment (e.g. the CI subset), else ``default``."""
    raw = os.environ.get(name, "").strip()
    return [kind(x) for x in raw.split(",") if x.strip()] if raw else default


CUDA = torch.cuda.is_available()
BASE = contract.BASE_SPEC.replace(batch=int(os.environ.get(contract.ENV_BATCH, "1")))
"""The suite's fixed shape. ``ATTNBENCH_ASV_BATCH`` exists for tests of the gate (a batch-swapping
fault is the identity at B=1); results taken with it are not labelled with it, so leave it unset
for results you keep."""
LENGTHS = _env_list(contract.ENV_LENGTHS, list(contract.ASV_LENGTHS), int)
DEVICES = _env_list(contract.ENV_DEVICES, ["cpu", "cuda"] if CUDA else ["cpu"])
MODES = _env_list(contract.ENV_MODES, list(contract.ASV_MODES))
MASKS = _env_list(contract.ENV_MASKS, list(contract.ASV_MASKS))
"""Mask kinds of the grid: no mask and causal, the one production models run (the CI subset keeps ``none``)."""
# Default-sweep variants that run on at least one of the devices (CUDA-only SDPA backends drop out on
# CPU boxes; compiled variants, which recompile for every parameter set, are opt-in by name).
VARIANTS = _env_list(
    contract.ENV_VARIANTS,
    [
        n for n in variant_names()
        if get_variant(n).IN_DEFAULT_SWEEP and any(not get_variant(n).not_supported_reasons(BASE.replace(device=d)) for d in DEVICES)
    ],
)
MAX_CALL_SECONDS = float(os.environ.get(contract.ENV_MAX_CALL_S, str(contract.ASV_MAX_CALL_SECONDS)))
"""Predicted seconds per call above which a case is n/a (keeps `asv run` within its budget)."""

PARAMS: dict[str, list] = {"variant": VARIANTS, "seq_len": LENGTHS, "device": DEVICES, "mode": MODES, "mask": MASKS}
SMALL_VARIANTS = _env_list(contract.ENV_VARIANTS, list(contract.ASV_SMALL_VARIANTS))
DECODE_PARAMS: dict[str, list] = {
    "variant": SMALL_VARIANTS,
    "seq_len_k": _env_list(contract.ENV_DECODE_LENGTHS, list(contract.ASV_DECODE_LENGTHS), int),
    "device": DEVICES,
}
"""The ``Decode`` class's grid: variant x cache length Lk x device (one query, forward)."""
GQA_PARAMS: dict[str, list] = {
    "variant": SMALL_VARIANTS,
    "seq_len": _env_list(contract.ENV_LENGTHS, list(contract.ASV_GQA_LENGTHS), int),
    "device": DEVICES,
}
"""The ``GroupedQuery`` class's grid: variant x L x device (H/4 key/value heads, forward)."""


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
    call, inputs, mask = runner.make_call(impl, spec, seed=GATE_CONFIG.seed)
    result, _ = impl.warm_up(call)  # compiles (if anything does) outside asv's timed calls
    checked = runner.run_gate(impl, spec, result, inputs, mask, plan, GATE_CONFIG.seed)
    return Prepared(call=call, spec=spec, checked=checked, note=plan.note)


def case(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> tuple[Callable[[], object], AttnSpec]:
    """The prepared call for one parameter set, gated.

    Raises:
        NotImplementedError: n/a (see :func:`prepare`).
        WrongResult: the closure's result failed the correctness gate (asv: failed, never a time).
    """
    return _gated(variant, spec_for(variant, seq_len, device, mode, mask))


def _gated(variant: str, spec: AttnSpec) -> tuple[Callable[[], object], AttnSpec]:
    prepared = prepare_spec(variant, spec)
    if prepared.checked is not None and not prepared.checked.passed:
        raise WrongResult(f"{variant} {prepared.spec.label}: {prepared.checked.reason()}")
    return prepared.call, prepared.spec


def decode_case(variant: str, seq_len_k: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``Decode`` parameter set (raises as :func:`case` does)."""
    spec, _ = contract.asv_case(contract.DECODE_TIME_BENCHMARK, {"seq_len_k": seq_len_k, "device": device}, BASE)
    return _gated(variant, spec)


def decode_gbps(variant: str, seq_len_k: int, device: str) -> float:
    """Achieved GB/s of a decode step: ``AttnSpec.bytes_moved`` (k, v and q read, output written) / median time."""
    call, spec = decode_case(variant, seq_len_k, device)
    samples, _ = time_call(call, spec.device, TimerConfig(min_runs=5, min_time=0.1, max_time=2.0))
    return spec.bytes_moved / statistics.median(samples) / 1e9


def gqa_case(variant: str, seq_len: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``GroupedQuery`` parameter set (raises as :func:`case` does)."""
    spec, _ = contract.asv_case(contract.GQA_TIME_BENCHMARK, {"seq_len": seq_len, "device": device}, BASE)
    return _gated(variant, spec)


def gqa_peak_tensor_bytes(variant: str, seq_len: int, device: str) -> float:
    """Peak tensor bytes above the inputs of a GQA case (the runner's method, as :func:`peak_tensor_bytes`)."""
    call, spec = gqa_case(variant, seq_len, device)
    call()  # warm caches outside the measured call
    return runner.peak_tensor_bytes(get_variant(variant), spec, call)[0]


def peak_tensor_bytes(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Peak tensor bytes above the inputs (the runner's method: profiler, CUDA stats or analytic)."""
    call, spec = case(variant, seq_len, device, mode, mask)
    call()  # warm caches (parameters, kernels) outside the measured call
    return runner.peak_tensor_bytes(get_variant(variant), spec, call)[0]


def gflops(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Achieved GFLOP/s (executed FLOPs / median of a short timing)."""
    call, spec = case(variant, seq_len, device, mode, mask)
    samples, _ = time_call(call, spec.device, TimerConfig(min_runs=3, min_time=0.1, max_time=2.0))
    return get_variant(variant).flops(spec).executed / statistics.median(samples) / 1e9


def flops(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Analytic executed FLOPs of the case: deterministic, so the regression gate is strict on it."""
    _, spec = case(variant, seq_len, device, mode, mask)
    return float(get_variant(variant).flops(spec).executed)


def cuda_event_ms(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Median CUDA-event milliseconds per call (the class's setup makes non-CUDA cases n/a)."""
    call, spec = case(variant, seq_len, device, mode, mask)
    samples, _ = time_call(call, spec.device, TimerConfig(min_runs=10, min_time=0.2, max_time=2.0))
    return statistics.median(samples) * 1e3


def setup_accuracy(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> None:
    """n/a rules for the accuracy benchmarks: the case's own, plus the float64 reference's budget.

    A wrong result does not raise here: the accuracy benchmarks report how wrong it is.
    """
    prepared = prepare(variant, seq_len, device, mode, mask)
    if prepared.checked is None:
        raise NotImplementedError(prepared.note or "accuracy not checked")


def error(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Max |out - float64 reference| of the timed closure's output over the checked (batch, head) slices."""
    checked = prepare(variant, seq_len, device, mode, mask).checked
    return math.nan if checked is None else checked.max_error


def error_ratio(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> float:
    """Worst error / tolerance over the output and (backward) dq, dk, dv: above 1 means wrong."""
    checked = prepare(variant, seq_len, device, mode, mask).checked
    return math.nan if checked is None else checked.error_ratio


def matmul_gflops() -> float:
    """This machine's fp32 matmul GFLOP/s (freshly measured): the roof for % of peak."""
    return measure_matmul_peak("cpu", "float32") / 1e9
