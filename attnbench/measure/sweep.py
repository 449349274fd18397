"""A sweep: many cases in order, in one measurement regime, each here or in a worker of its own.

The sweep keeps what no single case can know: the calibration probe's typical time over the sweep so
far (:func:`attnbench.measure.runner.typical_speed`, passed into every case), and each case's time
at the previous length, from which the time guard extrapolates the next one
(:func:`attnbench.measure.guard.extrapolated_seconds`). Isolated cases run in forked workers
(:mod:`attnbench.measure.worker`): a hang, a native crash or an OOM kill ends only that case.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import sys
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field

import torch

from attnbench.measure import guard, regime
from attnbench.measure.config import MeasureConfig
from attnbench.measure.env import environment
from attnbench.measure.peak import matmul_peak
from attnbench.measure.record import Environment, Measurement
from attnbench.measure.runner import baseline_probes, measure, typical_speed
from attnbench.measure.worker import CAP_ALLOWANCE_BYTES, CaseJob, WorkerPool
from attnbench.registry import get_variant
from attnbench.spec import AttnSpec

__all__ = ["sweep"]

_ProgressCallback = Callable[[int, int, str, AttnSpec], None]
_ResultCallback = Callable[[int, Measurement], None]


def sweep(
    cases: Iterable[tuple[str, AttnSpec]],
    config: MeasureConfig | None = None,
    *,
    progress: _ProgressCallback | None = None,
    on_result: _ResultCallback | None = None,
    should_stop: Callable[[], bool] | None = None,
    isolate: bool = False,
    workers: WorkerPool | None = None,
    case_timeout_s: float | None = None,
    memory_cap: bool = True,
) -> list[Measurement]:
    """Measure every ``(variant, spec)`` case in order, with fixed threads and one environment.

    Args:
        cases: ``(variant name, spec)`` pairs; names are validated before anything runs.
        config: measurement policy (``threads`` is applied for the sweep as a
            :class:`~.regime.Regime` and restored after; the probe's baseline is measured here, then
            kept at the median of that and each case's median probe: :func:`typical_speed`).
        progress: called as ``progress(index, total, variant, spec)`` before each case.
        on_result: called as ``on_result(index, measurement)`` after each case (e.g. to log it
            durably).
        should_stop: checked before each case; when it returns True the sweep returns what it has.
        isolate: measure each case in a fresh worker (:mod:`attnbench.measure.worker`): a hang is
            killed (``timeout``), a crash or an OOM kill ends only that case (``crashed``, ``oom``).
            False: in this process (interactive variants are seen; a crash ends the caller).
        workers: the pool to use when isolating (default: a new one with no extra environment).
        case_timeout_s: hard limit for one isolated case (default ``2 * time_budget_s + 60``, or
            the time budget plus a larger check budget plus 60).
        memory_cap: isolated CPU cases get ``RLIMIT_DATA`` = current use + memory budget + 1 GiB.

    Raises:
        ValueError: an unknown variant name or a non-positive ``case_timeout_s``, before anything
            runs.
    """
    config = config or MeasureConfig()
    cases = list(cases)
    for name, _ in cases:
        get_variant(name)  # unknown names fail here, before any measurement
    timeout = _case_timeout(config, case_timeout_s)
    if isolate and workers is None:
        workers = WorkerPool()
    with _threads_restored(config.threads):
        state = _SweepState.start(sorted({spec.device for _, spec in cases}), config.probe)
        results: list[Measurement] = []
        for i, (name, spec) in enumerate(cases):
            if should_stop is not None and should_stop():
                break
            if progress is not None:
                progress(i, len(cases), name, spec)
            result = state.measure(
                name, spec, config, workers if isolate else None, timeout, memory_cap
            )
            results.append(result)
            if on_result is not None:
                on_result(i, result)
        return results


@contextlib.contextmanager
def _threads_restored(threads: int | None) -> Iterator[None]:
    """The sweep's regime with ``threads`` (None: the process's) in the block, restored after."""
    saved_threads = torch.get_num_threads()
    if threads is not None:
        # the parent probes and measures the peak in it too
        regime.apply(regime.Regime(threads=threads))
    try:
        yield
    finally:
        torch.set_num_threads(saved_threads)


def _case_timeout(config: MeasureConfig, case_timeout_s: float | None) -> float:
    """The hard limit of one isolated case: ``case_timeout_s``, else a sum of budgets.

    The sum is of the time budget, the larger of it and the check budget, and a minute.

    Raises:
        ValueError: ``case_timeout_s`` is not a finite number > 0.
    """
    if case_timeout_s is not None and not (case_timeout_s > 0 and math.isfinite(case_timeout_s)):
        raise ValueError(f"case_timeout_s must be a finite number > 0, got {case_timeout_s}")
    return (
        case_timeout_s
        or config.time_budget_s + max(config.time_budget_s, config.check_seconds) + 60
    )


def _shape(name: str, spec: AttnSpec) -> tuple:
    """The case without its length: the cases of one sweep line share it."""
    return (name, *(getattr(spec, f.name) for f in dataclasses.fields(spec) if f.name != "seq_len"))


@dataclass
class _SweepState:
    """What the sweep knows that no single case can.

    Per device its environment, matmul peak and typical probe time, and per sweep line the last
    measured time.
    """

    envs: dict[str, Environment]
    peaks: dict[str, float]  # devices this process can measure on
    # probe times: the start (one figure), each case's median
    seen: dict[str, list[float]] = field(default_factory=dict)
    # the typical probe time of what was seen
    baselines: dict[str, float] = field(default_factory=dict)
    # _shape -> last (length, seconds per call)
    measured: dict[tuple, tuple[int, float]] = field(default_factory=dict)

    @classmethod
    def start(cls, devices: list[str], probe: bool) -> _SweepState:
        """Environments and matmul peaks of ``devices``; with ``probe``, each one's baseline."""
        envs = {d: environment(d) for d in devices}
        peaks = {
            d: matmul_peak(d, "float32")
            for d in devices
            if not d.startswith("cuda") or torch.cuda.is_available()
        }
        state = cls(envs, peaks)
        if probe:
            for d in peaks:
                state.seen[d] = [typical_speed(baseline_probes(d))]
                state.baselines[d] = state.seen[d][0]
        return state

    def peak(self, spec: AttnSpec) -> float:
        return self.peaks.get(spec.device, 1e12)

    def case_config(self, config: MeasureConfig, spec: AttnSpec) -> MeasureConfig:
        """``config`` with the typical probe time of the case's device so far."""
        if spec.device in self.baselines:
            return dataclasses.replace(config, probe_baseline_s=self.baselines[spec.device])
        return config

    def expected_call_s(self, name: str, spec: AttnSpec) -> float | None:
        """One call's seconds extrapolated from the case's last measured length (None: none yet)."""
        measured = self.measured.get(_shape(name, spec))
        return (
            None
            if measured is None
            else guard.extrapolated_seconds(get_variant(name), spec, *measured)
        )

    def job(self, name: str, spec: AttnSpec, config: MeasureConfig, memory_cap: bool) -> CaseJob:
        """The worker's job for one case.

        CPU cases are capped at the memory budget + :data:`CAP_ALLOWANCE_BYTES`.
        """
        cap = None
        if memory_cap and spec.device_type == "cpu":
            cap = int(config.memory_budget(spec.device)) + CAP_ALLOWANCE_BYTES
        return CaseJob(
            name,
            spec,
            self.case_config(config, spec),
            self.peak(spec),
            self.envs[spec.device],
            sys_path=list(sys.path),
            memory_cap_bytes=cap,
            environ=dict(os.environ),
            expected_call_s=self.expected_call_s(name, spec),
        )

    def measure(
        self,
        name: str,
        spec: AttnSpec,
        config: MeasureConfig,
        workers: WorkerPool | None,
        timeout: float,
        memory_cap: bool,
    ) -> Measurement:
        """Measure one case (in a worker of ``workers``, else in this process) and learn from it."""
        if workers is not None:
            result = workers.run(self.job(name, spec, config, memory_cap), timeout)
        else:
            result = measure(
                name,
                spec,
                self.case_config(config, spec),
                peak_flops=self.peak(spec),
                env=self.envs[spec.device],
                expected_call_s=self.expected_call_s(name, spec),
            )
        self.learn(name, spec, result)
        return result

    def learn(self, name: str, spec: AttnSpec, result: Measurement) -> None:
        """Keep the case's time for the next length, and its median probe for the typical one."""
        if result.samples and math.isfinite(result.median) and result.median > 0:
            self.measured[_shape(name, spec)] = (spec.seq_len, float(result.median))
        probed = result.extra.get("probe_median_s", math.nan)
        if spec.device in self.baselines and isinstance(probed, float) and probed > 0:
            self.seen[spec.device].append(probed)
            self.baselines[spec.device] = typical_speed(self.seen[spec.device])
