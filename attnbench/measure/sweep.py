"""A sweep: many cases in order, in one measurement regime, each in this process or in a worker of its own.

The sweep keeps what no single case can know: the calibration probe's typical time over the sweep so far
(:func:`attnbench.measure.runner.typical_speed`, passed into every case), and each case's time at the
previous length, from which the time guard extrapolates the next one
(:func:`attnbench.measure.guard.extrapolated_seconds`). Isolated cases run in forked workers
(:mod:`attnbench.measure.worker`): a hang, a native crash or an OOM kill ends only that case.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterable

import torch

from attnbench.measure import guard, regime
from attnbench.measure.env import environment
from attnbench.measure.peak import matmul_peak
from attnbench.measure.record import Measurement
from attnbench.measure.runner import MeasureConfig, baseline_probes, measure, typical_speed
from attnbench.measure.worker import CAP_ALLOWANCE_BYTES, CaseJob, WorkerPool
from attnbench.registry import get_variant
from attnbench.spec import AttnSpec

ProgressCallback = Callable[[int, int, str, AttnSpec], None]
ResultCallback = Callable[[int, Measurement], None]


def sweep(
    cases: Iterable[tuple[str, AttnSpec]],
    config: MeasureConfig | None = None,
    *,
    progress: ProgressCallback | None = None,
    on_result: ResultCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    isolate: bool = False,
    workers: WorkerPool | None = None,
    case_timeout_s: float | None = None,
    memory_cap: bool = True,
) -> list[Measurement]:
    """Measure every ``(variant, spec)`` case in order, with fixed threads and one environment.

    Args:
        cases: ``(variant name, spec)`` pairs; names are validated before anything runs.
        config: measurement policy (``threads`` is applied for the sweep, as a :class:`~.regime.Regime`,
            and the thread count restored after; the calibration probe's baseline is measured here first,
            then kept at the median of that and each case's median probe: :func:`typical_speed`).
        progress: called as ``progress(index, total, variant, spec)`` before each case.
        on_result: called as ``on_result(index, measurement)`` after each case (e.g. to log it durably).
        should_stop: checked before each case; when it returns True the sweep returns what it has.
        isolate: measure each case in a fresh worker process (see :mod:`attnbench.measure.worker`):
            a hang is killed (``timeout``), a native crash or an OOM kill ends only that case
            (``crashed`` / ``oom``). False measures in this process (variants registered
            interactively are visible; a crash ends the caller).
        workers: the pool to use when isolating (default: a new one with no extra environment).
        case_timeout_s: hard limit for one isolated case (default ``2 * time_budget_s + 60``, or the time budget
            plus a larger check budget plus 60).
        memory_cap: isolated CPU cases get ``RLIMIT_DATA`` = current use + memory budget + 1 GiB.

    Raises:
        ValueError: an unknown variant name or a non-positive ``case_timeout_s``, before anything runs.
    """
    config = config or MeasureConfig()
    cases = list(cases)
    for name, _ in cases:
        get_variant(name)  # unknown names fail here, before any measurement
    if case_timeout_s is not None and not (case_timeout_s > 0 and math.isfinite(case_timeout_s)):
        raise ValueError(f"case_timeout_s must be a finite number > 0, got {case_timeout_s}")
    timeout = case_timeout_s or config.time_budget_s + max(config.time_budget_s, config.check_seconds) + 60
    if isolate and workers is None:
        workers = WorkerPool()
    saved_threads = torch.get_num_threads()
    if config.threads is not None:
        regime.apply(regime.Regime(threads=config.threads))  # the parent probes and measures the peak in it too
    try:
        devices = sorted({spec.device for _, spec in cases})
        envs = {d: environment(d) for d in devices}
        peaks = {d: matmul_peak(d, "float32") for d in devices if not d.startswith("cuda") or torch.cuda.is_available()}
        seen: dict[str, list[float]] = {}  # probe times: the sweep's start (one figure), then each case's median
        baselines: dict[str, float] = {}
        if config.probe:
            for d in peaks:
                seen[d] = [typical_speed(baseline_probes(d))]
                baselines[d] = seen[d][0]
        results: list[Measurement] = []
        # The same case's last measured (length, seconds per call): the time guard's extrapolation.
        measured: dict[tuple, tuple[int, float]] = {}
        for i, (name, spec) in enumerate(cases):
            if should_stop is not None and should_stop():
                break
            if progress is not None:
                progress(i, len(cases), name, spec)
            peak, env = peaks.get(spec.device, 1e12), envs[spec.device]
            case_config = config
            if spec.device in baselines:
                case_config = dataclasses.replace(config, probe_baseline_s=baselines[spec.device])
            shape = (name, *(getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "seq_len"))
            expected = None
            if shape in measured:
                expected = guard.extrapolated_seconds(get_variant(name), spec, *measured[shape])
            if isolate:
                cap = None
                if memory_cap and spec.device_type == "cpu":
                    cap = int(config.memory_budget(spec.device)) + CAP_ALLOWANCE_BYTES
                job = CaseJob(name, spec, case_config, peak, env, sys_path=list(sys.path), memory_cap_bytes=cap,
                              environ=dict(os.environ), expected_call_s=expected)
                result = workers.run(job, timeout)
            else:
                result = measure(name, spec, case_config, peak_flops=peak, env=env, expected_call_s=expected)
            if result.samples and math.isfinite(result.median) and result.median > 0:
                measured[shape] = (spec.seq_len, float(result.median))
            probed = result.extra.get("probe_median_s", math.nan)
            if spec.device in baselines and isinstance(probed, float) and probed > 0:
                seen[spec.device].append(probed)
                baselines[spec.device] = typical_speed(seen[spec.device])
            results.append(result)
            if on_result is not None:
                on_result(i, result)
        return results
    finally:
        torch.set_num_threads(saved_threads)
