"""Everything the asv benchmark modules need, so that ``benchmarks/*.py`` stay declarations.

asv (0.6.6) runs every benchmark method in a process of its own per parameter set and round, and
shares between processes only what ``setup_cache`` returns (once per run and environment, pickled).
So the correctness gate runs there: :func:`grid_verdicts` judges every case of a grid once, and in
each benchmark process its :class:`Verdict` makes an n/a case raise ``NotImplementedError`` (asv:
n/a) and a wrong one :class:`WrongResult` (asv: failed), and gives the accuracy, FLOP and tensor
byte benchmarks their values without building the case. A benchmark that times a call builds the
case in its own process (:func:`prepare_spec`, once: asv calls ``setup`` before every sample).

Importing this module applies the measurement regime (:data:`REGIME`): asv starts its processes
without ``MALLOC_*_`` variables, so the allocator thresholds are pinned through mallopt before any
case is built. The grid is the tier :func:`attnbench.contract.asv_tier` selects, narrowed by the
``ATTNBENCH_ASV_*`` variables; an unknown tier fails the import.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import enum
import functools
import gc
import importlib
import itertools
import json
import math
import multiprocessing
import os
import statistics
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from attnbench import contract, environ
from attnbench._checks import cuda_present
from attnbench.io import append_line
from attnbench.measure import gate, guard, memory, probe, regime, runner, schedstat
from attnbench.measure.config import MeasureConfig
from attnbench.measure.peak import matmul_peak, measure_matmul_peak
from attnbench.measure.timer import TimerConfig, time_call
from attnbench.plugins import load_plugins
from attnbench.registry import BUILTINS, default_variants, get_variant
from attnbench.spec import AttnSpec
from attnbench.variants.sdpa import hand_table_only

__all__ = [
    "REGIME",
    "CUDA",
    "BASE",
    "LENGTHS",
    "DEVICES",
    "MODES",
    "COUNT_BUDGET_S",
    "COUNT_PROCESSES",
    "PARAMS",
    "DECODE_PARAMS",
    "GQA_PARAMS",
    "INSTRUCTION_PARAMS",
    "params",
    "spec_for",
    "WrongResult",
    "VerdictStatus",
    "Verdict",
    "use",
    "judge",
    "prepare_spec",
    "grid_verdicts",
    "GRID_SETUP_TIMEOUT",
    "JUDGE_PROCESSES",
    "case",
    "WaitWatch",
    "TIMER",
    "timed_case",
    "timed_teardown",
    "check",
    "decode_case",
    "gqa_case",
    "decode_verdicts",
    "gqa_verdicts",
    "setup_accuracy",
    "track",
    "INSTRUCTION_SETUP_TIMEOUT",
    "instruction_counts",
    "instruction_case",
    "tracked",
    "matmul_gflops",
]

if "asv_runner" in sys.modules:
    # asv's forkserver imports this suite, then forks every benchmark process: a process forked
    # after torch.cuda.is_available() asked the CUDA runtime cannot use CUDA. With this set, torch
    # asks NVML instead, so a plugin (or anything else imported here) that asks leaves the forks
    # able to use the card; the suite itself asks through cuda_present().
    os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")
# variants registered by modules named in ATTNBENCH_PLUGINS join the grid (and may be named below)
load_plugins()
REGIME = regime.Regime(threads=int(environ.read_number(environ.THREADS, regime.DEFAULT_THREADS)))
"""The regime every asv benchmark process measures in (applied at import, before any case)."""
regime.apply(REGIME)


CUDA = cuda_present()
"""A CUDA device is present, asked without initialising CUDA: asv's forkserver imports this module
once and forks every benchmark process from it, and a process forked after ``is_available()``
cannot use CUDA (:func:`attnbench._checks.cuda_present`)."""
BASE = contract.BASE_SPEC.replace(batch=int(environ.read_number(contract.ENV_BATCH, 1)))
"""The suite's fixed shape. ``ATTNBENCH_ASV_BATCH`` exists for tests of the gate (a batch-swapping
fault is the identity at B=1); results taken with it are not labelled with it, so leave it unset
for results you keep."""
# ValueError for an unknown ATTNBENCH_ASV_GRID: the suite does not import
_TIER, _GRID = contract.asv_tier()
_DECODE_GRID, _GQA_GRID = contract.GRIDS["asv-decode"], contract.GRIDS["asv-gqa"]
LENGTHS = environ.read_list(contract.ENV_LENGTHS, list(_GRID.lengths))
DEVICES = environ.read_list(
    contract.ENV_DEVICES, list(_GRID.devices or (["cpu", "cuda"] if CUDA else ["cpu"]))
)
MODES = environ.read_list(contract.ENV_MODES, list(_GRID.modes))
_MASKS = environ.read_list(contract.ENV_MASKS, list(_GRID.masks))
"""Mask kinds of the grid: none and causal, the one models run (the CI subset keeps ``none``)."""


def _tier_variants(grid: contract.Grid) -> list[str]:
    """The tier's variants: those it names, else every default-sweep variant that runs here.

    A tier that names variants also gets plugins' variants, which join any default sweep.
    Otherwise it gets every default-sweep variant that runs on one of the devices (CUDA-only SDPA
    backends drop out on CPU boxes; compiled variants, which recompile for every parameter set, are
    opt-in by name).
    """
    with hand_table_only():  # asking torch would initialise CUDA in asv's forkserver
        runs = [
            n
            for n in default_variants()
            if any(
                not get_variant(n).not_supported_reasons(BASE.replace(device=d)) for d in DEVICES
            )
        ]
    if grid.variants is None:
        return runs
    builtin = {name for name, _, _ in BUILTINS}
    return [*grid.variants, *(n for n in runs if n not in builtin and n not in grid.variants)]


_VARIANTS = environ.read_list(contract.ENV_VARIANTS, _tier_variants(_GRID))
_MAX_CALL_SECONDS = environ.read_number(contract.ENV_MAX_CALL_S, contract.ASV_MAX_CALL_SECONDS)
"""Predicted seconds per call above which a case is n/a (keeps `asv run` within its budget)."""
COUNT_BUDGET_S: float | None = environ.read_budget(
    contract.ENV_COUNT_BUDGET_S, _GRID.count_budget_s
)
"""Predicted valgrind seconds the ``Instructions`` class may spend (cheapest first; None: all)."""
COUNT_PROCESSES = min(
    int(environ.read_number(contract.ENV_COUNT_PROCESSES, _GRID.count_processes)),
    len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1,
)
"""valgrind processes the ``Instructions`` class counts in at once (the tier's, at most one per
core this process may use): asv runs nothing else meanwhile."""

PARAMS: dict[str, list] = {
    "variant": _VARIANTS,
    "seq_len": LENGTHS,
    "device": DEVICES,
    "mode": MODES,
    "mask": _MASKS,
}
DECODE_PARAMS: dict[str, list] = {
    "variant": environ.read_list(contract.ENV_VARIANTS, list(_DECODE_GRID.variants or ())),
    "seq_len_k": environ.read_list(contract.ENV_DECODE_LENGTHS, list(_DECODE_GRID.lengths)),
    "device": DEVICES,
}
"""The ``Decode`` class's grid: variant x cache length Lk x device (one query, forward)."""
GQA_PARAMS: dict[str, list] = {
    "variant": environ.read_list(contract.ENV_VARIANTS, list(_GQA_GRID.variants or ())),
    "seq_len": environ.read_list(contract.ENV_LENGTHS, list(_GQA_GRID.lengths)),
    "device": DEVICES,
}
"""The ``GroupedQuery`` class's grid: variant x L x device (H/4 key/value heads, forward)."""
INSTRUCTION_PARAMS: dict[str, list] = {**PARAMS, "device": ["cpu"]}
"""The ``Instructions`` grid: the main grid's CPU cases (n/a over :data:`COUNT_BUDGET_S`)."""


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


_GATE_CONFIG = MeasureConfig()
"""The correctness gate's policy in asv (reference budget, seed): the runner's defaults."""


class WrongResult(AssertionError):
    """The case's result failed the correctness gate: asv records a failure, never a number."""


class VerdictStatus(enum.StrEnum):
    """How setting one case up went: :attr:`Verdict.status`."""

    OK = "ok"  # the gate passed, or the case is not checked
    WRONG = "wrong"  # the result failed the correctness gate (asv: failed)
    NOT_APPLICABLE = "n/a"  # unsupported, or predicted over a budget (asv: n/a)
    ERROR = "error"  # setting the case up raised (its benchmarks fail with the reason)


@dataclass(frozen=True)
class Verdict:
    """What setting one case up found, without its tensors or closure.

    Small and picklable, so asv's ``setup_cache`` can hand it to every benchmark process of the
    case.
    """

    status: VerdictStatus  # a plain string is taken as its member
    reason: str = ""  # n/a, wrong, error: why
    # the gate on the closure's first and later results (the worst)
    checked: gate.GateResult | None = None
    note: str = ""  # why the case is not checked ("" when it is)
    # metrics measured once with the case set up (:data:`_ONCE`)
    values: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "status", VerdictStatus(self.status))


@dataclass(frozen=True)
class _Prepared:
    """One parameter set, ready to time: the closure, its case, the gate on its first call."""

    variant: str  # registry name
    call: Callable[[], object]  # the closure asv times (the runner's make_call)
    spec: AttnSpec  # the case
    checked: gate.GateResult | None  # the gate on the closure's first result; None when not checked
    note: str  # why the case is not checked ("" when it is)


_VERDICTS: dict[tuple[str, AttnSpec], Verdict] = {}
"""The verdicts asv's ``setup_cache`` handed this process (:func:`use`); empty outside asv."""


def use(verdicts: dict | None) -> None:
    """Take the verdicts of a ``setup_cache`` (:func:`grid_verdicts`) for this process's cases.

    Each ``setup`` calls it: asv hands the cache to every call, and a process runs one benchmark.
    """
    if verdicts is not None and verdicts is not _VERDICTS:
        _VERDICTS.update(verdicts)


def _prepare(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> _Prepared:
    """Guard, inputs, the first (warm-up) call of the timed closure and the gate on its result.

    Raises:
        NotImplementedError: the case is n/a here (unsupported, or over the time or memory budget).
    """
    return prepare_spec(variant, spec_for(variant, seq_len, device, mode, mask))


def _na_reasons(variant: str, spec: AttnSpec) -> list[str]:
    """Why a case is n/a here: unsupported, or predicted over a budget ([] when it runs)."""
    impl = get_variant(variant)
    reasons = impl.not_supported_reasons(spec)
    if not reasons:
        plan = runner.check_plan(impl, spec, _GATE_CONFIG)
        seconds = guard.predicted_seconds(impl, spec, _roof(spec.device))
        if seconds > _MAX_CALL_SECONDS:
            reasons.append(f"predicted {seconds:.2f} s per call > {_MAX_CALL_SECONDS:g} s")
        need = guard.predicted_bytes(impl, spec, plan.reference_bytes)
        if need > 0.5 * guard.free_bytes(spec.device):
            reasons.append(f"predicted {need / 2**20:,.0f} MiB exceeds half the free memory")
    return reasons


@functools.cache
def _roof(device: str) -> float:
    """The float32 matmul roof the time guard predicts with, read once per process.

    :func:`matmul_peak` takes a fresh sample (seconds) whenever its cache's rule asks for one; asked
    once per case, a ``setup_cache`` on a fresh or busy machine sampled for most of its cases (72 of
    153 s on 32 cases at load 6). Read once, every n/a decision of a grid uses the same roof.
    """
    return matmul_peak(device, "float32")


def _build(variant: str, spec: AttnSpec) -> Callable[[], object]:
    """The timed closure of a case already judged, after its first (warm-up, compiling) call."""
    impl = get_variant(variant)
    call, _, _ = runner.make_call(impl, spec, seed=_GATE_CONFIG.seed)
    impl.warm_up(call)  # outside asv's timed calls
    return call


def judge(variant: str, spec: AttnSpec) -> _Prepared:
    """Set a case up and put it through the gate (:class:`attnbench.measure.runner.GatedCall`).

    Guard, inputs, the warm-up call, then the gate on its result and on later calls' (state kept
    between calls, an intermittent fault, shows there), against one float64 reference of the case.

    Raises:
        NotImplementedError: the case is n/a here.
    """
    reasons = _na_reasons(variant, spec)
    if reasons:
        raise NotImplementedError("; ".join(reasons))
    impl = get_variant(variant)
    plan = runner.check_plan(impl, spec, _GATE_CONFIG)
    # the first call compiles outside asv's timed calls
    gated = runner.GatedCall(impl, spec, plan, _GATE_CONFIG.seed)
    checked = gated.first
    # later calls show state kept between calls, or an intermittent fault
    if checked is not None and checked.passed:
        later, _ = gated.check_later()
        checked = checked if later.passed else later
    return _Prepared(variant=variant, call=gated.call, spec=spec, checked=checked, note=plan.note)


def _verdict_of(prepared: _Prepared) -> Verdict:
    checked = prepared.checked
    if checked is not None and not checked.passed:
        return Verdict(
            VerdictStatus.WRONG,
            f"{prepared.variant} {prepared.spec.label}: {checked.reason()}",
            checked,
            prepared.note,
        )
    return Verdict(VerdictStatus.OK, "", checked, prepared.note)


def _verdict(variant: str, spec: AttnSpec) -> Verdict:
    """The case's verdict: from asv's ``setup_cache``, else judged here (once per process)."""
    known = _VERDICTS.get((variant, spec))
    if known is not None:
        return known
    try:
        return _verdict_of(prepare_spec(variant, spec))
    except NotImplementedError as exc:
        return Verdict(VerdictStatus.NOT_APPLICABLE, str(exc))


@functools.lru_cache(maxsize=8)
def prepare_spec(variant: str, spec: AttnSpec) -> _Prepared:
    """:func:`_prepare` for any case, once per process: asv calls ``setup`` before every sample.

    The decode and GQA classes name their case through ``contract.asv_case``. Every call after the
    first is free.

    With a verdict from asv's ``setup_cache`` the case is only built and warmed up (no guard, no
    gate: the verdict holds both); without one it is judged here (:func:`judge`).

    Raises:
        NotImplementedError: the case is n/a here.
        RuntimeError: setting it up failed in ``setup_cache``.
    """
    known = _VERDICTS.get((variant, spec))
    if known is None:
        return judge(variant, spec)
    _raise_unless_runs(known, gated=False)
    call = _build(variant, spec)
    return _Prepared(variant=variant, call=call, spec=spec, checked=known.checked, note=known.note)


def _raise_unless_runs(known: Verdict, gated: bool = True) -> None:
    """n/a: NotImplementedError; error: RuntimeError; wrong (``gated``): :class:`WrongResult`."""
    if known.status == VerdictStatus.NOT_APPLICABLE:
        raise NotImplementedError(known.reason)
    if known.status == VerdictStatus.ERROR:
        raise RuntimeError(known.reason)
    if gated and known.status == VerdictStatus.WRONG:
        raise WrongResult(known.reason)


_MAIN_ONCE = ("gflops", "cuda_time", "peak_tensor_bytes")
"""What the main grid's ``setup_cache`` measures on each case it judged (:data:`_ONCE`)."""
_TIMED = frozenset({"gflops", "gbps", "cuda_time"})
"""Metrics of :data:`_ONCE` that time calls: taken after the gate, with nothing else running."""


def grid_verdicts(
    table: dict[str, list] | None = None,
    spec_of: Callable[..., AttnSpec] | None = None,
    measure: Sequence[str] = _MAIN_ONCE,
) -> dict:
    """``setup_cache`` of a class family: every case of its grid judged once (:func:`judge`).

    The verdicts are :class:`Verdict` s keyed by ``(variant, spec)``, for asv to hand to every
    benchmark process of the family.

    The gate and the untimed measures (peak tensor bytes) of the CPU cases run in
    :data:`JUDGE_PROCESSES` forked processes at once (:func:`_judge_all`): asv runs nothing else
    meanwhile, and nothing there is timed. The timed measures (:data:`_TIMED`) follow, one case
    at a time in this process, on the case built and warmed up again.

    Prints one line per case to asv's log (case i of n, its verdict, the seconds elapsed):
    ``asv run -v`` shows them as they come, and each restarts asv's ``setup_cache`` timeout (a limit
    on silence). A case whose setup raises is an "error" verdict (its benchmarks fail with the
    reason; the others run).

    Args:
        table: the class's parameter table (default :data:`PARAMS`); its first key is the variant.
        spec_of: the rest of a parameter set -> its case (default :func:`_spec_for_params`).
        measure: metrics of :data:`_ONCE` the family records, measured on each case that passed
            (each where it applies: CUDA-event time on CUDA only).
    """
    table = PARAMS if table is None else table
    spec_of = _spec_for_params if spec_of is None else spec_of
    cases = [(variant, spec_of(*rest)) for variant, *rest in itertools.product(*table.values())]
    start = time.perf_counter()
    print(
        f"attnbench: the correctness gate on {len(cases)} cases, "
        "once for every benchmark of this grid",
        flush=True,
    )
    untimed = [m for m in measure if m not in _TIMED]
    verdicts: dict[tuple[str, AttnSpec], Verdict] = {}
    for i, found in enumerate(_judge_all(cases, untimed), 1):
        variant, spec = cases[i - 1]
        verdicts[(variant, spec)] = found
        # why a case is n/a (torch's own words where it refused), wrong or failed: asv records an
        # n/a without its reason, so this log line is where the reason is kept
        why = f" ({found.reason})" if found.reason else ""
        print(
            f"attnbench: case {i} of {len(cases)}, {variant} {spec.label}: {found.status}{why} "
            f"({time.perf_counter() - start:.0f} s elapsed)",
            flush=True,
        )
    timed = [m for m in measure if m in _TIMED]
    passed = [key for key, found in verdicts.items() if found.status == VerdictStatus.OK]
    for i, key in enumerate(passed if timed else [], 1):
        verdicts[key] = _timed(key, verdicts[key], timed)
        print(
            f"attnbench: timed {i} of {len(passed)}, {key[0]} {key[1].label} "
            f"({time.perf_counter() - start:.0f} s elapsed)",
            flush=True,
        )
    return verdicts


JUDGE_PROCESSES = min(
    4, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
)
"""Processes a verdicts ``setup_cache`` judges its CPU cases in at once (the usable cores, at most
4): the float64 reference and the profiler are most of its work (about 100 of 139 CPU-s for the
default tier), and time nothing."""


def _judge_all(cases: list[tuple[str, AttnSpec]], untimed: Sequence[str]) -> Iterator[Verdict]:
    """The verdict of every case, in order (with the ``untimed`` measures of those that passed).

    The CPU cases are judged in :data:`JUDGE_PROCESSES` processes forked from this one (it has
    sampled the time guard's roof first, so every process predicts with the same one); the CUDA
    cases here (a process forked after CUDA started cannot use it). Should a process die, the
    cases it left are judged here.
    """
    cpu = [i for i, (_, spec) in enumerate(cases) if spec.device_type == "cpu"]
    if JUDGE_PROCESSES < 2 or len(cpu) < 2:
        yield from (_judged(*case, untimed) for case in cases)
        return
    _roof("cpu")
    if "peak_tensor_bytes" in untimed:  # imported once here, not once per forked process
        for name in memory.PROFILER_IMPORTS:
            importlib.import_module(name)
    context = multiprocessing.get_context("fork")
    with concurrent.futures.ProcessPoolExecutor(JUDGE_PROCESSES, mp_context=context) as pool:
        futures = {i: pool.submit(_judged, *cases[i], untimed) for i in cpu}
        for i, case in enumerate(cases):
            if i not in futures:
                yield _judged(*case, untimed)
                continue
            try:
                yield futures[i].result()
            except concurrent.futures.process.BrokenProcessPool:
                yield _judged(*case, untimed)


def _judged(variant: str, spec: AttnSpec, untimed: Sequence[str]) -> Verdict:
    """One case's verdict (:func:`judge`), with the ``untimed`` measures when it passed."""
    try:
        prepared = judge(variant, spec)
        found = _verdict_of(prepared)
        if found.status == VerdictStatus.OK:
            found = dataclasses.replace(found, values=_measured_once(prepared, untimed))
        return found
    except NotImplementedError as exc:
        return Verdict(VerdictStatus.NOT_APPLICABLE, str(exc))
    except Exception as exc:  # noqa: BLE001
        # one case's failure is its own benchmarks' failure, not the grid's
        return Verdict(
            VerdictStatus.ERROR,
            f"setting {variant} {spec.label} up failed: {type(exc).__name__}: {exc}",
        )


def _timed(key: tuple[str, AttnSpec], found: Verdict, timed: Sequence[str]) -> Verdict:
    """``found`` with the ``timed`` measures of its case added (taken here, one case at a time).

    The case is built and warmed up again (:func:`_build`; the timer warms up too); a case whose
    build or timing fails now gets an "error" verdict saying so.
    """
    variant, spec = key
    try:
        prepared = _Prepared(variant, _build(variant, spec), spec, found.checked, found.note)
        values = _measured_once(prepared, timed)
    except Exception as exc:  # noqa: BLE001
        reason = f"timing {variant} {spec.label} failed: {type(exc).__name__}: {exc}"
        return Verdict(VerdictStatus.ERROR, reason)
    return dataclasses.replace(found, values=(*found.values, *values))


def _measured_once(prepared: _Prepared, measure: Sequence[str]) -> tuple[tuple[str, float], ...]:
    """The :data:`_ONCE` metrics ``measure`` names that apply to the case, measured in order."""
    cuda = prepared.spec.device_type == "cuda"
    return tuple((m, _ONCE[m](prepared)) for m in measure if m not in _CUDA_ONLY or cuda)


GRID_SETUP_TIMEOUT = 600
"""Seconds of silence asv allows a verdicts ``setup_cache`` (each printed line restarts it)."""


def _spec_for_params(seq_len: int, device: str, mode: str, mask: str = "none") -> AttnSpec:
    """The main grid's case of a parameter set without its variant (the case does not need it)."""
    return spec_for("", seq_len, device, mode, mask)


def case(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> tuple[Callable[[], object], AttnSpec]:
    """The prepared call for one parameter set, gated.

    Raises:
        NotImplementedError: n/a (see :func:`_prepare`).
        WrongResult: the closure's result failed the correctness gate (asv: failed, never a time).
    """
    prepared = _main_grid(variant, seq_len, device, mode, mask)
    return prepared.call, prepared.spec


class WaitWatch:
    """asv's ``timer`` for the time benchmark: the wall clock, with the run-queue wait beside it.

    The clock is the one asv would use anyway (``time.perf_counter``); the timing thread's run-queue
    wait is read beside each reading (outside the interval it returns).

    asv reads a timer in pairs around the timed calls; :meth:`take` gives their wall time and the
    share of it the thread spent runnable but without a core, i.e. taken by another process. The
    calibration probe is blind to a steady neighbour (a 1 ms probe slips between the scheduler's
    slices, a longer call does not). Time a call spends sleeping or blocked is not waiting for a
    core: a slowdown of that kind stays a slowdown.
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
        """``(wall seconds, run-queue share)`` of the calls timed since the last take.

        The share is run-queue seconds per wall second (None: nothing timed, or the kernel did not
        say).
        """
        wall, wait, known = self._wall, self._wait, self._known
        self._start, self._wall, self._wait, self._known = None, 0.0, 0.0, True
        return wall, (wait / wall if wall > 0 and known else None)


TIMER = WaitWatch()
"""The time benchmark's timer (one per process); :func:`timed_teardown` logs what it timed."""
_pending: dict | None = None  # the probe line of the sample under way (set up, not yet torn down)


def timed_case(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> tuple[Callable[[], object], AttnSpec]:
    """:func:`case` for the time benchmark's ``setup`` (asv runs it before every sample, untimed).

    With ``ATTNBENCH_PROBE_LOG`` set (the regression gate sets it), a calibration probe
    (:func:`attnbench.measure.probe.probe_seconds`) is timed here, just before the sample;
    :func:`timed_teardown` appends it to that file with the sample it preceded.
    """
    global _pending
    call, spec = case(variant, seq_len, device, mode, mask)
    TIMER.take()  # the sample starts afresh
    _pending = None
    if os.environ.get(contract.ENV_PROBE_LOG):
        _pending = {
            "commit": os.environ.get("ASV_COMMIT", ""),
            "variant": variant,
            "seq_len": seq_len,
            "device": device,
            "mode": mode,
            "mask": mask,
            "probe_s": probe.probe_seconds(spec.device),
        }
    return call, spec


def timed_teardown() -> None:
    """The time benchmark's ``teardown``: one line per sample in ``ATTNBENCH_PROBE_LOG``.

    The line holds the probe timed just before the sample (``probe_s``), the sample's wall time
    (``sample_s``: asv re-runs setup and teardown around every timed call of a benchmark with a
    ``setup``, so it is one call) and the share of it the timing thread spent waiting for a core
    (``runqueue_share``, ``null`` where not known). The gate reads ``sample_s / probe_s`` (the
    sample in units of the machine's speed at that moment) beside ``sample_s`` and refuses samples a
    neighbour descheduled.
    """
    global _pending
    wall, share = TIMER.take()
    path, line, _pending = os.environ.get(contract.ENV_PROBE_LOG), _pending, None
    if path and line is not None and wall > 0:  # peakmem's samples use no timer: nothing to log
        append_line(path, json.dumps({**line, "sample_s": wall, "runqueue_share": share}))


def _main_grid(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> _Prepared:
    return _gated_prepared(variant, spec_for(variant, seq_len, device, mode, mask))


def _gated(variant: str, spec: AttnSpec) -> tuple[Callable[[], object], AttnSpec]:
    prepared = _gated_prepared(variant, spec)
    return prepared.call, prepared.spec


def _gated_prepared(variant: str, spec: AttnSpec) -> _Prepared:
    # n/a, wrong or failed: raised before anything is built
    _raise_unless_runs(_verdict(variant, spec))
    return prepare_spec(variant, spec)


def check(
    variant: str, seq_len: int, device: str, mode: str = "forward", mask: str = "none"
) -> None:
    """``setup`` of a class whose methods build the case only if they need it: the verdict decides.

    Raises:
        NotImplementedError: n/a.
        WrongResult: the case failed the correctness gate.
        RuntimeError: its setup failed.
    """
    _raise_unless_runs(_verdict(variant, spec_for(variant, seq_len, device, mode, mask)))


def decode_case(variant: str, seq_len_k: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``Decode`` parameter set (raises as :func:`case` does)."""
    return _gated(variant, _decode_spec(seq_len_k, device))


def _decode_spec(seq_len_k: int, device: str) -> AttnSpec:
    return contract.asv_case(
        contract.DECODE_TIME_BENCHMARK, {"seq_len_k": seq_len_k, "device": device}, BASE
    )[0]


def gqa_case(variant: str, seq_len: int, device: str) -> tuple[Callable[[], object], AttnSpec]:
    """The gated call of one ``GroupedQuery`` parameter set (raises as :func:`case` does)."""
    return _gated(variant, _gqa_spec(seq_len, device))


def _gqa_spec(seq_len: int, device: str) -> AttnSpec:
    return contract.asv_case(
        contract.GQA_TIME_BENCHMARK, {"seq_len": seq_len, "device": device}, BASE
    )[0]


def decode_verdicts() -> dict:
    """``setup_cache`` of the ``Decode`` class: :func:`grid_verdicts`, GB/s measured there."""
    return grid_verdicts(DECODE_PARAMS, _decode_spec, measure=("gbps",))


def gqa_verdicts() -> dict:
    """``setup_cache`` of the ``GroupedQuery`` class (:func:`grid_verdicts` on its grid)."""
    return grid_verdicts(GQA_PARAMS, _gqa_spec, measure=("peak_tensor_bytes",))


def setup_accuracy(variant: str, seq_len: int, device: str, mode: str, mask: str = "none") -> None:
    """n/a rules for the accuracy benchmarks: the case's own, plus the float64 reference's budget.

    A wrong result does not raise here: the accuracy benchmarks report how wrong it is.
    """
    found = _verdict(variant, spec_for(variant, seq_len, device, mode, mask))
    _raise_unless_runs(found, gated=False)
    if found.checked is None:
        raise NotImplementedError(found.note or "accuracy not checked")


# ---- the table's tracked metrics: one generated ``track_`` method per (class, metric) ------------
_CASES: dict[str, Callable[..., tuple[str, AttnSpec]]] = {
    "AttentionMetrics": lambda v, *p: (v, spec_for(v, *p)),
    "AttentionCuda": lambda v, *p: (v, spec_for(v, *p)),
    "AttentionAccuracy": lambda v, *p: (v, spec_for(v, *p)),
    "Decode": lambda v, n, d: (v, _decode_spec(n, d)),
    "GroupedQuery": lambda v, n, d: (v, _gqa_spec(n, d)),
}
"""How each asv class turns its parameters into ``(variant, case)``."""
_UNGATED = frozenset({"AttentionAccuracy"})
"""Classes whose metrics are read from a wrong result too: how wrong it is is what they report."""


def _median_seconds(prepared: _Prepared, timer: TimerConfig) -> float:
    samples, _ = time_call(prepared.call, prepared.spec.device, timer)
    return statistics.median(samples)


def _peak_tensor_bytes(prepared: _Prepared) -> float:
    prepared.call()  # warm caches (parameters, kernels) outside the measured call
    return runner.peak_tensor_bytes(get_variant(prepared.variant), prepared.spec, prepared.call)[0]


def _page_faults(prepared: _Prepared) -> float:
    prepared.call()  # the same state as the runner's count: after the warm-up call and the gate's
    return float(memory.page_faults(prepared.call))


_MEASURES: dict[str, Callable[[_Prepared], float]] = {
    "peak_tensor_bytes": _peak_tensor_bytes,
    "gflops": lambda p: (
        get_variant(p.variant).flops(p.spec).executed
        / _median_seconds(p, TimerConfig(min_runs=3, min_time=0.1, max_time=2.0))
        / 1e9
    ),
    "cuda_time": lambda p: _median_seconds(p, TimerConfig(min_runs=10, min_time=0.2, max_time=2.0)),
    "gbps": lambda p: (
        p.spec.bytes_moved
        / _median_seconds(p, TimerConfig(min_runs=5, min_time=0.1, max_time=2.0))
        / 1e9
    ),
    "page_faults": _page_faults,
}
"""How asv measures a tracked metric on a prepared (built, warmed-up) case, in the metric's unit. A
metric of the table without an entry here or in :data:`_FROM_VERDICT` is read from a full
:func:`attnbench.measure.runner.measure` of the case (slower, but the same number ``attnbench run``
records)."""
_ONCE: dict[str, Callable[[_Prepared], float]] = {
    "peak_tensor_bytes": _peak_tensor_bytes,
    "gflops": _MEASURES["gflops"],
    "gbps": _MEASURES["gbps"],
    "cuda_time": _MEASURES["cuda_time"],
}
"""Measures taken once per case where the case is judged (:func:`grid_verdicts`, in asv's
``setup_cache``) and read from its verdict, so their benchmark processes build and call nothing.
Peak tensor bytes are the sizes of the tensors one call allocates (the profiler's memory timeline,
or the CUDA allocator's statistics), whatever ran before it in the process: in a process of its own
each case paid the profiler's start (seconds) for one call; it is measured right after the gate, in
the process that judged the case. The rates (GFLOP/s, GB/s, CUDA-event time, :data:`_TIMED`) are
timed once every case is judged, one case at a time with nothing else running: in a process of its
own each case was built and warmed up as well, and its first backward call imported sympy (0.65 s
of a core, in each of 64 processes). Page faults are not here: they count the fresh pages one call
maps, which depend on what the process did before (at L=128 a grown heap gave 0.8 to 65 times a
fresh process's count, the same at L=1024), so each is counted in a process of its own, as the
runner counts them in a fresh worker."""
_CUDA_ONLY = frozenset({"cuda_time"})
"""Metrics of :data:`_ONCE` measured on CUDA cases only (the others' benchmarks are n/a)."""
_FROM_VERDICT: dict[str, Callable[[str, AttnSpec, Verdict], float]] = {
    # deterministic: the gate is strict on it
    "flops": lambda v, spec, _: float(get_variant(v).flops(spec).executed),
    "max_error": lambda v, spec, found: (
        math.nan if found.checked is None else found.checked.max_error
    ),
    "error_ratio": lambda v, spec, found: (
        math.nan if found.checked is None else found.checked.error_ratio
    ),
}
"""Metrics read from the case's :class:`Verdict` alone: their processes build and call nothing."""


def _runner_value(metric: contract.Metric, prepared: _Prepared) -> float:
    if metric.field is None:
        raise NotImplementedError(
            f"metric {metric.name!r} names no Measurement field and has no asv measure"
        )
    measured = runner.measure(prepared.variant, prepared.spec, _GATE_CONFIG)
    return float(contract.metric_value(measured, metric.field))


def track(metric: str, owner: str, *params: object) -> float:
    """A tracked ``metric``'s value for one parameter set of the asv class ``owner``, in asv's unit.

    Raises:
        NotImplementedError: n/a (see :func:`_prepare`); WrongResult: a wrong result (gated
            classes).
    """
    row = contract.METRICS[metric]
    variant, spec = _CASES[owner](*params)
    found = _verdict(variant, spec)
    _raise_unless_runs(found, gated=owner not in _UNGATED)
    once = dict(found.values)
    if metric in once:
        value = once[metric]
    elif metric in _FROM_VERDICT:
        value = _FROM_VERDICT[metric](variant, spec, found)
    else:
        prepared = prepare_spec(variant, spec)
        measure = _MEASURES.get(metric)
        value = measure(prepared) if measure is not None else _runner_value(row, prepared)
    return value / row.asv_factor


# ---- instruction counts: valgrind once per commit and environment (asv's setup_cache) ------------
INSTRUCTION_SETUP_TIMEOUT = 3 * 3600
"""Seconds asv allows the Instructions class's setup_cache (torch's start, then every case)."""


def instruction_counts() -> dict:
    """``setup_cache`` of the ``Instructions`` class: CPU cases counted in one valgrind run.

    The main grid's CPU cases within :data:`COUNT_BUDGET_S` are counted, in
    :data:`COUNT_PROCESSES` valgrind processes at once, each variant in one of them
    (:func:`attnbench.measure.instructions.count_in_processes`), keyed by their parameters.

    asv runs it once per commit and environment and hands the (pickled) result to every ``setup``
    and ``track_`` call, so no case starts a valgrind of its own. The cases the budget leaves out
    (the dearest first) are n/a with the reason, as are those the counter skips (unsupported,
    compiled, over its per-case budget). Prints its plan and one line per counted case (case i of n,
    the seconds elapsed) to asv's log (``asv run -v``). Without valgrind the cache says why (each
    case is then n/a).
    """
    from attnbench.measure.instructions import (
        CountConfig,
        count_in_processes,
        missing_message,
        valgrind_version,
        within_budget,
    )

    if valgrind_version() is None:
        return {"missing": missing_message()}
    grid, names = params(table=INSTRUCTION_PARAMS)
    combos = [dict(zip(names, combo, strict=True)) for combo in itertools.product(*grid)]
    cases = [(c["variant"], spec_for(**c)) for c in combos]
    config = CountConfig(seed=_GATE_CONFIG.seed)
    left_out = within_budget(cases, COUNT_BUDGET_S, config)
    todo = [i for i in range(len(cases)) if i not in left_out]
    _print_count_plan(len(todo), len(cases), len(left_out))
    start = time.perf_counter()

    def progress(done: int, total: int, count) -> None:
        print(
            f"attnbench: case {done} of {total}, {count.variant} {count.spec.label}: "
            f"{count.status} ({time.perf_counter() - start:.0f} s elapsed)",
            flush=True,
        )

    counts = dict(
        zip(
            todo,
            count_in_processes(
                [cases[i] for i in todo], config, COUNT_PROCESSES, progress=progress
            ),
            strict=True,
        )
    )
    out = {}
    for i, c in enumerate(combos):
        count = counts.get(i)
        out[tuple(c.values())] = (
            (contract.Status.SKIPPED, math.nan, left_out[i], "")
            if count is None
            else (count.status, count.instructions, count.reason, count.valgrind)
        )
    return out


def _print_count_plan(todo: int, cases: int, left_out: int) -> None:
    """Say to asv's log how many cases go to the counter, and why the others do not."""
    budget = (
        "no budget: every case"
        if COUNT_BUDGET_S is None
        else f"{left_out} beyond a budget of {COUNT_BUDGET_S:g} s predicted under valgrind"
    )
    print(
        f"attnbench: instruction counts: {todo} of {cases} CPU cases go to the counter "
        f"({budget}); {COUNT_PROCESSES} valgrind process(es) at once, in each of which torch "
        "takes half a minute to three to start",
        flush=True,
    )


def instruction_case(counts: dict, *params: object) -> float:
    """The count of one parameter set from :func:`instruction_counts`' cache.

    Raises:
        NotImplementedError: no count (valgrind missing, not on CPU, unsupported, over budget): n/a.
        WrongResult: the counted closure's result failed the correctness gate.
        RuntimeError: the count failed (its reason).
    """
    if "missing" in counts:
        raise NotImplementedError(counts["missing"])
    status, value, reason, _ = counts.get(
        tuple(params), (contract.Status.SKIPPED, math.nan, "not on CPU", "")
    )
    if status == contract.Status.WRONG:
        raise WrongResult(f"{params[0]}: {reason}")
    if status == contract.Status.ERROR:
        raise RuntimeError(reason)
    if status != contract.Status.OK:
        raise NotImplementedError(reason)
    return value


_CACHED: dict[str, Callable[..., float]] = {"instructions": instruction_case}
"""Tracked metrics whose asv class measures every case at once in ``setup_cache``:
metric -> (cache, *params) -> value."""


def _track_method(
    metric: contract.Metric, owner: str, method: str, cls: type
) -> Callable[..., float]:
    # measured for every case at once in setup_cache
    if metric.name in _CACHED and hasattr(cls, "setup_cache"):

        def track_metric(self: object, cache: object, *params: object) -> float:
            return _CACHED[metric.name](cache, *params) / metric.asv_factor
    elif hasattr(cls, "setup_cache"):  # the cache holds the grid's verdicts (grid_verdicts)

        def track_metric(self: object, verdicts: dict, *params: object) -> float:
            use(verdicts)
            return track(metric.name, owner, *params)
    else:

        def track_metric(self: object, *params: object) -> float:
            return track(metric.name, owner, *params)

    track_metric.__name__, track_metric.__qualname__ = method, f"{owner}.{method}"
    track_metric.unit = metric.asv_unit or metric.unit  # type: ignore[attr-defined]
    return track_metric


def tracked(cls: type) -> type:
    """Class decorator: add the ``track_`` methods :data:`contract.METRICS` gives this asv class.

    A metric row naming ``"AttentionMetrics.track_x"`` in its ``asv`` gets
    ``AttentionMetrics.track_x``, with the row's unit, measured by :func:`track`; in a class with
    ``setup_cache`` the cache comes first: the grid's verdicts (:func:`grid_verdicts`, taken with
    :func:`use`), or for a metric of :data:`_CACHED` the values themselves (every case measured at
    once).
    """
    for metric in contract.METRICS.values():
        for benchmark in metric.tracked:
            owner, method = benchmark.split(".")
            if owner == cls.__name__:
                setattr(cls, method, _track_method(metric, owner, method, cls))
    return cls


def matmul_gflops() -> float:
    """This machine's fp32 matmul GFLOP/s (freshly measured): the roof for % of peak."""
    return measure_matmul_peak("cpu", "float32") / 1e9


# asv's forkserver imports the suite once and forks a process per benchmark, parameter set and
# round. Python's cyclic garbage collector, at its first full collection in such a child, walks
# every object the import made (torch's: about a million) and so writes to every page they sit on:
# the child copies the parent's heap page by page. Unpickling ``setup_cache``'s verdicts triggered
# that collection, in each of the thousand-odd processes of a quick run of the default tier (the
# README gives the cost). Objects that exist once the suite is imported live as long as the process:
# they are collected here once and frozen out of every later collection (``gc.freeze``), in the
# server and in each child it forks. Only under asv (its runner imports the suite): elsewhere the
# importing process's objects are its own business.
#
# The first backward call of a process imports torch.fx.experimental.symbolic_shapes (autograd's
# _make_grads does, for the grad_outputs it is handed), and with it sympy: 0.4 to 0.65 s of a core
# and 33 MiB, in every backward benchmark process of a run (64 a quick run of the default tier,
# per benchmark method). The server imports it once instead. Every process then starts with those
# 33 MiB mapped: peakmem_attention's forward cases read them too (their backward cases always did),
# so both passes share one baseline.
if "asv_runner" in sys.modules:
    import torch.fx.experimental.symbolic_shapes  # noqa: F401

    gc.collect()
    gc.freeze()
