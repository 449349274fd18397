"""``Measurement``: one frozen row per (variant, spec); identity separate from samples.

Statistics (median, IQR) are derived from the raw samples, never stored twice; noise is flagged
when the IQR exceeds 10% of the median (the rule torch.utils.benchmark uses). A ``Count`` is one
case's instruction count (:mod:`attnbench.measure.instructions` takes it under valgrind), and
``attach`` puts it on the case's measurement.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from attnbench.contract import METRICS, WORKLOADS, Status, metric_value
from attnbench.spec import AttnSpec

__all__ = ["STATUSES", "Environment", "Measurement", "Count", "attach"]

STATUSES = tuple(s for s in Status if s not in (Status.FAILED, Status.ABOVE_ROOF))
"""The statuses a measurement can have: every :class:`attnbench.contract.Status` but ``failed``,
which only asv rows hold (a run records why its case did not finish)."""
_NOISY_IQR_FRACTION = 0.1


@dataclass(frozen=True)
class Environment:
    """Hardware and software identity of the machine that produced a measurement."""

    hostname: str  # machine name
    python: str  # Python version
    torch: str  # torch.__version__
    threads: int  # torch intra-op threads used for the measurement
    cpu_model: str  # CPU model name
    cpu_count: int  # logical CPUs visible to the process
    device_name: str  # what ran the kernels: the GPU's name on CUDA, else the CPU model
    gpu_name: str = ""  # CUDA device name, "" on CPU
    gpu_memory_gb: str = ""  # CUDA device memory in GiB
    gpu_driver: str = ""  # NVIDIA driver version as nvidia-smi reports it
    gpu_clocks: str = ""  # SM and memory clocks as read when the measurement started
    cuda: str = ""  # CUDA version torch was built with
    commit: str = ""  # attnbench checkout's git commit, "" when not in a checkout
    # transparent huge pages: kernel mode and torch's THP_MEM_ALLOC_ENABLE (page-fault cost)
    thp: str = ""
    # the measurement regime of the measuring process (threads, allocator, THP): regime.describe()
    regime: str = ""


@dataclass(frozen=True)
class Measurement:
    """One benchmark case: what ran (variant, spec), how it went, and what was measured."""

    variant: str  # registry name
    spec: AttnSpec  # the case's shape, dtype, device, mask and mode
    status: Status  # a plain string is taken as its member
    reason: str = ""  # why a case is not "ok" (or a note on an ok one)
    samples: tuple[float, ...] = ()  # seconds per call, one entry per timed block
    runs: int = 0  # calls timed in total (sum over blocks)
    # "wall" (perf_counter around blocks) or "cuda_events"; "" when not timed
    timing_method: str = ""
    peak_tensor_bytes: float = math.nan  # peak tensor memory above the inputs during one call
    # "profiler" or "cuda" (measured), or "model" (the analytic prediction, not a measurement)
    memory_method: str = ""
    # the variant's analytic prediction for the same quantity
    predicted_peak_bytes: float = math.nan
    peak_rss_bytes: float = math.nan  # process resident set size at its highest during one call
    flops_useful: int = 0  # analytic FLOPs on pairs the mask allows
    flops_executed: int = 0  # analytic FLOPs the implementation performs
    # max |out - float64 reference of what the variant claims| (NaN: not checked)
    max_error: float = math.nan
    tolerance: float = math.nan  # the correctness gate's allowed max error (NaN: not checked)
    # backward: max |grad - float64 reference grad| of the worst of dq, dk, dv
    grad_error: float = math.nan
    grad_tolerance: float = math.nan  # backward: the gate's allowed max error for that gradient
    # worst error / tolerance over output, gradients, declared bound (> 1: wrong)
    error_ratio: float = math.nan
    softmax_error: float = math.nan  # approximate variants: max |out - exact softmax attention|
    compile_seconds: float = math.nan  # one-off preparation time outside the timed region
    # calibration probe / sweep's typical, the ratio furthest from 1 (NaN: not probed)
    probe_slowdown: float = math.nan
    # timing attempts made (1 + re-measurements of disturbed attempts); 0 when not timed
    attempts: int = 0
    # instructions per call of the timed closure, counted under valgrind (NaN: not counted)
    instructions: float = math.nan
    env: Environment | None = None  # where it ran
    extra: dict[str, Any] = field(default_factory=dict, compare=False)  # variant-specific facts
    workload: str = "prefill"  # one of contract.WORKLOADS: which sweep the case belongs to

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(
                f"status must be one of {tuple(map(str, STATUSES))}, got {self.status!r}"
            )
        object.__setattr__(self, "status", Status(self.status))
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")

    @property
    def median(self) -> float:
        return statistics.median(self.samples) if self.samples else math.nan

    @property
    def iqr(self) -> float:
        if len(self.samples) < 2:
            return math.nan
        q = statistics.quantiles(self.samples, n=4, method="inclusive")
        return q[2] - q[0]

    @property
    def noisy(self) -> bool:
        return bool(self.samples) and self.iqr > _NOISY_IQR_FRACTION * self.median

    @property
    def gflops_per_s(self) -> float:
        """Achieved rate on executed FLOPs (what the hardware did); NaN when those are unknown.

        ``extra["flops_unknown"]`` holds why the executed FLOPs are only an upper bound (a kernel
        skipping tiles of unknown size): such a rate is never reported.
        """
        med = self.median
        if self.extra.get("flops_unknown"):
            return math.nan
        return self.flops_executed / med / 1e9 if med and med == med else math.nan

    @property
    def checked_error_ratio(self) -> float:
        """:attr:`error_ratio`; for an older record without one, max error / tolerance."""
        if not math.isnan(self.error_ratio) or not (self.tolerance > 0):
            return self.error_ratio  # inf: a non-finite or uncomparable result
        return self.max_error / self.tolerance

    @property
    def bytes_moved(self) -> int:
        """:attr:`AttnSpec.bytes_moved`: what an ideal kernel reads and writes (from the shape)."""
        return self.spec.bytes_moved

    @property
    def gbytes_per_s(self) -> float:
        """Achieved rate on :attr:`AttnSpec.bytes_moved`: an ideal kernel's traffic / the time."""
        med = self.median
        return self.spec.bytes_moved / med / 1e9 if med and med == med else math.nan

    def to_row(self) -> dict[str, Any]:
        """One CSV row: identity, every run metric of :data:`contract.METRICS` and spread, the rest.

        The export people read (``measurements.csv``); the loader reads the typed case log instead.
        """
        spec = dataclasses.asdict(self.spec)
        env = dataclasses.asdict(self.env) if self.env else {}
        metrics: dict[str, Any] = {}
        for metric in METRICS.values():
            if metric.field is not None:
                metrics[metric.csv_column] = metric_value(self, metric.field)
                if metric.spread:
                    metrics[metric.spread_column] = getattr(self, metric.spread)
        exported = {
            m.field.removeprefix("extra.")
            for m in METRICS.values()
            if m.field and m.field.startswith("extra.")
        }
        return {
            "variant": self.variant,
            "workload": self.workload,
            **{f"spec_{k}": v for k, v in spec.items()},
            "seq_len_k_eff": self.spec.lk,
            "status": self.status,
            "reason": self.reason,
            "noisy": self.noisy,
            "runs": self.runs,
            "timing_method": self.timing_method,
            "samples_s": " ".join(f"{s:.6g}" for s in self.samples),
            "memory_method": self.memory_method,
            "predicted_peak_bytes": self.predicted_peak_bytes,
            "flops_useful": self.flops_useful,
            "flops_executed": self.flops_executed,
            "tolerance": self.tolerance,
            "grad_error": self.grad_error,
            "grad_tolerance": self.grad_tolerance,
            "probe_slowdown": self.probe_slowdown,
            "attempts": self.attempts,
            **metrics,
            **{f"env_{k}": v for k, v in env.items()},
            **{f"extra_{k}": v for k, v in self.extra.items() if k not in exported},
        }


@dataclass(frozen=True)
class Count:
    """One case's count: instructions per call, or why there is none."""

    variant: str
    spec: AttnSpec
    # ok, skipped (unsupported, over budget, not on CPU), wrong (failed the gate), error
    status: Status
    instructions: float = math.nan  # per call
    calls: int = 0  # calls counted
    reason: str = ""
    valgrind: str = ""  # valgrind's version


def attach(measurement: Measurement, count: Count | None) -> Measurement:
    """``measurement`` with ``count``'s instructions per call, or the reason there is none.

    Valgrind's version goes in ``extra``; without an ok count, the reason there is none goes in
    ``extra["instructions_note"]``.
    """
    if count is None:
        return measurement
    if count.status == Status.OK:
        return dataclasses.replace(
            measurement,
            instructions=count.instructions,
            extra={**measurement.extra, "valgrind": count.valgrind},
        )
    return dataclasses.replace(
        measurement,
        extra={**measurement.extra, "instructions_note": f"{count.status}: {count.reason}"},
    )
