"""What decides how a case is measured: :class:`MeasureConfig`, the runner's one argument beside
the case (its budgets, checks, repeat policy and interference detection), checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from attnbench._checks import check_bool, check_int, check_number, check_seed
from attnbench.contract import WORKLOADS
from attnbench.measure import guard, regime
from attnbench.measure.timer import TimerConfig

__all__ = ["MeasureConfig"]

_INSTRUCTION_MODES = ("off", "default", "all")
"""Which cases ``attnbench run`` counts instructions for (:func:`attnbench.runs.counted_cases`)."""


@dataclass(frozen=True)
class MeasureConfig:
    """Everything that decides how a case is measured (recorded nowhere else)."""

    timer: TimerConfig = field(default_factory=TimerConfig)  # repeat policy
    # torch intra-op threads while measuring; None keeps the process's
    threads: int | None = regime.DEFAULT_THREADS
    # skip cases predicted to need more than this share of free memory
    memory_budget_fraction: float = 0.5
    memory_budget_bytes: float | None = None  # explicit budget; overrides the fraction when set
    # skip (predicted) or stop (measured) cases whose measurement calls take longer
    time_budget_s: float = 60.0
    check_accuracy: bool = True  # gate the timed closure's result against the float64 reference
    # seconds the check may take (reference, checked calls); None: time_budget_s
    check_budget_s: float | None = None
    # float64 reference: all (batch, head) slices up to this, else a sample
    reference_budget_bytes: float = 512 * 2**20
    measure_memory: bool = True  # peak tensor bytes (profiler on CPU, allocator stats on CUDA)
    measure_rss: bool = True  # peak process RSS during one call
    seed: int = 0  # input seed
    # CUDA: also time CUDA-graph replay (launch overhead removed), in extra
    cuda_graphs: bool = False
    # interference detection: the probe around every attempt, descheduled blocks re-timed
    probe: bool = True
    retries: int = 2  # re-measurements of a disturbed attempt before the case is recorded as noisy
    # re-timed blocks and further attempts stop once a case's timing took this long
    retry_budget_s: float = 2.0
    # the sweep's typical probe time (set by sweep); None: measured first
    probe_baseline_s: float | None = None
    # contract.WORKLOADS: the sweep every measured case belongs to (recorded in each row)
    workload: str = "prefill"
    # instruction counts under valgrind beside the sweep: "off", "default" or "all" cases
    instructions: str = "off"

    def __post_init__(self) -> None:
        if not isinstance(self.timer, TimerConfig):
            raise TypeError(f"timer must be a TimerConfig, got {type(self.timer).__name__}")
        check_number("memory_budget_fraction", self.memory_budget_fraction, 0.0, 1.0)
        check_number("time_budget_s", self.time_budget_s, 0.0)
        check_number("reference_budget_bytes", self.reference_budget_bytes, 0.0, low_open=False)
        check_number("retry_budget_s", self.retry_budget_s, 0.0, low_open=False)
        for name in ("memory_budget_bytes", "probe_baseline_s", "check_budget_s"):
            if getattr(self, name) is not None:
                check_number(name, getattr(self, name), 0.0)
        if self.threads is not None:
            check_int("threads", self.threads, 1)
        check_int("retries", self.retries, 0)
        check_seed(self.seed)
        for name in ("check_accuracy", "measure_memory", "measure_rss", "cuda_graphs", "probe"):
            check_bool(name, getattr(self, name))
        if self.workload not in WORKLOADS:
            raise ValueError(f"workload must be one of {WORKLOADS}, got {self.workload!r}")
        if self.instructions not in _INSTRUCTION_MODES:
            raise ValueError(
                f"instructions must be one of {_INSTRUCTION_MODES}, got {self.instructions!r}"
            )

    @property
    def check_seconds(self) -> float:
        """The correctness check's time budget: ``check_budget_s``, else the time budget."""
        return self.time_budget_s if self.check_budget_s is None else self.check_budget_s

    def memory_budget(self, device: str) -> float:
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        return guard.free_bytes(device) * self.memory_budget_fraction
