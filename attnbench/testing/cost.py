"""How does the kernel's cost grow? Exact metrics along L, the gate's fit, bounds and baselines.

The metrics are the engine's exact ones: peak tensor bytes (the runner's
:func:`~attnbench.measure.runner.peak_tensor_bytes`: the profiler's memory timeline on CPU, the
allocator on CUDA), FLOPs (``FlopCounterMode`` on the runner's call for a wrapped function; a
built-in variant's declared count, which the project's tests hold to the counter) and instruction
counts (valgrind, :func:`~attnbench.measure.instructions.count_instructions`). Each series is fitted
as the regression gate fits it (:func:`attnbench.analysis.growth.fit_side`: the deterministic
exponent with its local slopes, and the cost split c0 + c1·L + c2·L² that predicts the cost at a
long length), and a comparison with a baseline is judged by the gate's own
:func:`~attnbench.analysis.growth.judge`. Time is compared with the gate's noise rules
(:func:`attnbench.analysis.significance.decide`); a verdict they leave undecided is a skip.
"""

from __future__ import annotations

import contextlib
import math
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import FlopCounterMode

from attnbench.analysis import text
from attnbench.analysis.growth import AT_LENGTH, exponent_text, fit_side, judge
from attnbench.analysis.significance import check_factor, decide
from attnbench.contract import BASE_SPEC, TIME_FACTOR, GateVerdict, Method, Status
from attnbench.measure import instructions
from attnbench.measure.config import MeasureConfig
from attnbench.measure.regime import DEFAULT_THREADS
from attnbench.measure.runner import (
    baseline_probes,
    make_call,
    peak_tensor_bytes,
    timed_attempts,
    typical_speed,
)
from attnbench.measure.timer import TimerConfig, time_once
from attnbench.plugins import PLUGINS_ENV, plugin_names
from attnbench.registry import variant_names
from attnbench.spec import AttnSpec
from attnbench.testing.kernel import ENV_DEVICE, Kernel, as_variant, default_lengths
from attnbench.testing.outcome import Record, note, undecided, verdict
from attnbench.variants.base import Variant

__all__ = [
    "METRICS",
    "TARGET_LENGTH",
    "measure_cost",
    "GrowthCheck",
    "assert_growth",
    "Comparison",
    "assert_within",
]

METRICS: tuple[str, ...] = ("peak_tensor_bytes", "flops", "instructions")
"""The exact metrics a growth is fitted on (``"time"`` is for :func:`assert_within` only)."""
TARGET_LENGTH: int = AT_LENGTH["prefill"]
"""The length costs are predicted at by default: the regression gate's (128K tokens)."""
_UNITS = {"peak_tensor_bytes": "bytes", "flops": "FLOP", "instructions": "instructions"}


def _fmt(value: float, metric: str) -> str:
    """``58.7 MB``, ``3.44e+10 FLOP``, ``1.2e+09 instructions``."""
    unit = _UNITS[metric]
    return text.fmt(value, unit) if unit == "bytes" else f"{value:.3g} {unit}"


def _specs(variant: Variant, lengths: Sequence[int], spec: AttnSpec | None, device: str | None):
    """One prefill case (Lq = Lk = L) per length, of ``spec``'s shape (default B1 H8 D64)."""
    base = BASE_SPEC if spec is None else spec
    if not isinstance(base, AttnSpec):
        raise TypeError(f"spec must be an AttnSpec or None, got {type(base).__name__}")
    # the argument, else the pytest option's variable, else the spec's own
    base = base.replace(device=device or os.environ.get(ENV_DEVICE, "").strip() or base.device)
    specs = [base.replace(seq_len=n, seq_len_k=None) for n in lengths]
    for s in specs:
        reasons = variant.not_supported_reasons(s)
        if reasons:
            raise ValueError(f"spec: {variant.name} cannot run {s.label}: " + "; ".join(reasons))
    return specs


def _shape(spec: AttnSpec) -> str:
    """A series' case without its length: ``B1 H8 D64 float32 cpu mask=causal forward``."""
    return " ".join(w for w in spec.label.split() if not w.startswith(("L", "Lq", "Lk")))


def measure_cost(
    kernel: Variant | str,
    metric: str,
    lengths: Iterable[int] | None = None,
    *,
    spec: AttnSpec | None = None,
    device: str | None = None,
    seed: int = 0,
) -> tuple[float, ...]:
    """The kernel's ``metric`` at each length (one forward or forward + backward call each).

    Args:
        kernel: a wrapped function, a variant or a registered name.
        metric: one of :data:`METRICS`.
        lengths: L = Lq = Lk (default: ``ATTNBENCH_TEST_LENGTHS``, else 512..4096); three or more.
        spec: the case's shape, mask and mode (its lengths are replaced; default B1 H8 D64).
        device: where (default: ``ATTNBENCH_TEST_DEVICE``, else the spec's or cpu).
        seed: the inputs' seed.

    Raises:
        ValueError: an unknown metric, too few lengths, a case the kernel does not support.
    """
    if metric not in METRICS:
        raise ValueError(f"metric must be one of {METRICS}, got {metric!r}")
    variant = as_variant(kernel)
    specs = _specs(variant, default_lengths(lengths), spec, device)
    if metric == "instructions":
        return _instructions(variant, specs, seed)
    with _engine_threads():
        return tuple(_one_value(variant, s, metric, seed) for s in specs)


@contextlib.contextmanager
def _engine_threads() -> Iterator[None]:
    """The engine's thread count while measuring (one: no spinning helper thread's work)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(DEFAULT_THREADS)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def _one_value(variant: Variant, spec: AttnSpec, metric: str, seed: int) -> float:
    call, _, _ = make_call(variant, spec, seed)
    if metric == "flops":
        if not isinstance(variant, Kernel):
            return float(variant.flops(spec).executed)  # the engine's figure for a built-in
        with FlopCounterMode(display=False) as counter:
            call()
        counted = float(counter.get_total_flops())
        if counted <= 0:
            undecided(
                f"flops of {variant.name} at {spec.label}: FlopCounterMode counted none (the "
                "work runs in a kernel it has no formula for, such as CPU flash SDPA)"
            )
        return counted
    variant.warm_up(call)  # what a first call prepares is not the call's cost
    peak, method = peak_tensor_bytes(variant, spec, call)
    if method == Method.MODEL:
        undecided(
            f"peak_tensor_bytes of {variant.name} at {spec.label}: the profiler could not measure "
            "it here (only the cost model's prediction, which is not a measurement)"
        )
    return peak


def _instructions(variant: Variant, specs: Sequence[AttnSpec], seed: int) -> tuple[float, ...]:
    """Counts under valgrind, whose process knows the kernel by its registered name only."""
    environ = dict(os.environ)
    if instructions.valgrind_version(environ) is None:
        undecided(instructions.missing_message())
    if variant.name not in variant_names():
        raise ValueError(
            f"instructions: {variant.name} is counted in a valgrind process, which knows it by "
            "its registered name only: wrap(..., register=True) in a module it can import"
        )
    module = getattr(getattr(variant, "fn", None), "__module__", "")
    if module and module != "__main__":
        environ[PLUGINS_ENV] = ",".join(dict.fromkeys([*plugin_names(), module]))
    config = instructions.CountConfig(seed=seed, check_accuracy=False)
    try:
        counts = instructions.count_instructions(
            [(variant.name, s) for s in specs], config, environ=environ
        )
    except instructions.CountError as exc:
        undecided(f"instructions of {variant.name}: {exc}")
    for c in counts:
        if c.status != Status.OK:
            undecided(f"instructions of {variant.name} at {c.spec.label}: {c.status}: {c.reason}")
    return tuple(float(c.instructions) for c in counts)


def _times(ratio: float) -> str:
    """``x265``, ``x4,940``, ``x0.562``: a ratio as a reader says it."""
    return f"x{ratio:,.0f}" if ratio >= 1000 else f"x{ratio:.3g}"


@dataclass(frozen=True)
class GrowthCheck:
    """One kernel's metric along L: the values, the gate's fit, the prediction and the bounds."""

    kernel: str
    metric: str
    shape: str  # the case without its length
    lengths: tuple[int, ...]
    values: tuple[float, ...]
    exponent: float  # the deterministic fit's exponent over its longest consistent lengths
    low: float  # the least local slope (between neighbouring lengths) over the fitted lengths
    high: float  # the largest
    at_length: int
    predicted: float  # the cost split's value at ``at_length``
    max_exponent: float | None
    max_at_length: float | None

    @property
    def failures(self) -> list[str]:
        out = []
        if self.max_exponent is not None and not self.exponent <= self.max_exponent:
            out.append(f"exponent {self.exponent:.2f} > bound {self.max_exponent:g}")
        if self.max_at_length is not None and not self.predicted <= self.max_at_length:
            out.append(
                f"predicted {self._fmt(self.predicted)} at L={self.at_length} > bound "
                f"{self._fmt(self.max_at_length)}"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures

    def _fmt(self, value: float) -> str:
        return _fmt(value, self.metric)

    def summary(self) -> str:
        """``peak_tensor_bytes L^1.00 (local 0.99..1.00), 1.07 GB at L=131072``."""
        return (
            f"{self.metric} {exponent_text(self.exponent)} (local {self.low:.2f}..{self.high:.2f})"
            f", {self._fmt(self.predicted)} at L={self.at_length}"
        )

    def message(self) -> str:
        """Each length's value, the fitted exponent with its local slopes, the prediction."""
        longest = self.values[-1]
        return "\n".join(
            [
                f"{self.metric} of {self.kernel} ({self.shape}): " + "; ".join(self.failures),
                "  "
                + ", ".join(
                    f"L={n}: {self._fmt(v)}" for n, v in zip(self.lengths, self.values, strict=True)
                ),
                f"  fitted {exponent_text(self.exponent)} (local slopes {self.low:.2f} .. "
                f"{self.high:.2f})",
                f"  predicted {self._fmt(self.predicted)} at L={self.at_length} "
                f"({_times(self.predicted / longest)} the value at L={self.lengths[-1]})",
            ]
        )


def _fitted(variant, metric, lengths, spec, device, seed):
    """The series and the gate's fit of it (undecided where it has no fit)."""
    specs = _specs(variant, default_lengths(lengths), spec, device)
    values = measure_cost(variant, metric, [s.lq for s in specs], spec=specs[0], seed=seed)
    fit = fit_side([s.lq for s in specs], values)
    if fit is None:
        undecided(
            f"{metric} of {variant.name}: no fit (fewer than three positive values: {values})"
        )
    return specs[0], fit


def assert_growth(
    kernel: Variant | str,
    metric: str = "peak_tensor_bytes",
    lengths: Iterable[int] | None = None,
    *,
    max_exponent: float | None = None,
    max_at_length: float | None = None,
    at_length: int = TARGET_LENGTH,
    spec: AttnSpec | None = None,
    device: str | None = None,
    seed: int = 0,
) -> GrowthCheck:
    """Assert how the kernel's ``metric`` grows with L: a bound on its exponent, its cost, or both.

    Args:
        kernel, metric, lengths, spec, device, seed: as :func:`measure_cost`.
        max_exponent: the largest exponent allowed (the gate's deterministic fit).
        max_at_length: the largest cost allowed at ``at_length``, predicted by the fitted cost
            split (bytes, FLOPs or instructions).
        at_length: the length costs are predicted at (default 131072, the gate's).

    Returns:
        the check (when it passed): values, exponent, local slopes, prediction.

    Raises:
        AssertionError: a bound is exceeded; the message gives each length's value, the fitted
            exponent with its local slopes and the predicted cost at ``at_length``.
        ValueError: no bound given, or a bad argument (see :func:`measure_cost`).
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's
    if max_exponent is None and max_at_length is None:
        raise ValueError("give max_exponent, max_at_length or both: a check needs a bound")
    for name, bound in (("max_exponent", max_exponent), ("max_at_length", max_at_length)):
        if bound is not None and not (isinstance(bound, (int, float)) and bound > 0):
            raise ValueError(f"{name} must be a number > 0 or None, got {bound!r}")
    _check_length(at_length)
    variant = as_variant(kernel)
    first, fit = _fitted(variant, metric, lengths, spec, device, seed)
    check = GrowthCheck(
        variant.name,
        metric,
        _shape(first),
        fit.lengths,
        fit.values,
        fit.exponent,
        fit.low,
        fit.high,
        at_length,
        fit.at(at_length),
        max_exponent,
        max_at_length,
    )
    note(Record(variant.name, "growth", metric, verdict(check.passed), check.summary()))
    if not check.passed:
        raise AssertionError(check.message())
    return check


def _check_length(at_length: object) -> None:
    if isinstance(at_length, bool) or not isinstance(at_length, int) or at_length < 1:
        raise ValueError(f"at_length must be an int >= 1, got {at_length!r}")


@dataclass(frozen=True)
class Comparison:
    """A kernel's metric against a baseline's at each length, and the gate's verdict on growth."""

    kernel: str
    baseline: str
    metric: str
    factor: float
    lengths: tuple[int, ...]
    ratios: tuple[float, ...]  # kernel / baseline at each length
    reason: str  # the gate's growth reason, or the time decisions
    passed: bool

    def summary(self) -> str:
        worst = max(self.ratios) if self.ratios else math.nan
        return f"{self.metric} vs {self.baseline}: worst x{worst:.3g} (allowed x{self.factor:g})"


def assert_within(
    kernel: Variant | str,
    baseline: Variant | str,
    metric: str,
    lengths: Iterable[int] | None = None,
    *,
    factor: float | None = None,
    at_length: int = TARGET_LENGTH,
    spec: AttnSpec | None = None,
    device: str | None = None,
    seed: int = 0,
    seconds: float = 1.0,
) -> Comparison:
    """Assert the kernel costs at most ``factor`` times the baseline, measured in this process.

    Exact metrics: at every length, and at ``at_length`` as the gate predicts it (its
    :func:`~attnbench.analysis.growth.judge`: the predicted ratio, and an exponent grown beyond
    its threshold). ``"time"``: at every length by the gate's noise rules
    (:func:`~attnbench.analysis.significance.decide` on ``seconds`` of samples a side, disturbed
    attempts refused); a length they cannot decide makes the check undecided (a pytest skip with
    the reason), never a pass.

    Args:
        baseline: a wrapped function, a variant or a registered name (``"sdpa"``, ``"batched"``).
        metric: one of :data:`METRICS`, or ``"time"``.
        factor: the ratio allowed (default 1.0: no more than the baseline; time: the gate's
            ``TIME_FACTOR``, and it must be > 1).
        seconds: time only: how long each side is timed per length.

    Raises:
        AssertionError: beyond the factor; the message gives both series and the gate's reason.
    """
    __tracebackhide__ = True
    kernel_v, base_v = as_variant(kernel), as_variant(baseline)
    if metric == "time":
        return _within_time(kernel_v, base_v, lengths, factor, spec, device, seed, seconds)
    factor = 1.0 if factor is None else factor
    if not (isinstance(factor, (int, float)) and math.isfinite(factor) and factor >= 1):
        raise ValueError(f"factor must be a finite number >= 1, got {factor!r}")
    _check_length(at_length)
    first, head = _fitted(kernel_v, metric, lengths, spec, device, seed)
    _, base = _fitted(base_v, metric, head.lengths, first, None, seed)
    least = 1 + 1e-9  # the gate's "no growth" factor (judge needs one above 1)
    growth = judge(base, head, metric=metric, factor=max(factor, least), at_length=at_length)
    ratios = tuple(h / b for h, b in zip(head.values, base.values, strict=True))
    over = [n for n, r in zip(head.lengths, ratios, strict=True) if r > factor]
    passed = not over and growth.verdict == GateVerdict.OK
    reason = growth.reason.replace(f"x{least:.10g}", "x1")
    result = Comparison(
        kernel_v.name, base_v.name, metric, factor, head.lengths, ratios, reason, passed
    )
    note(Record(kernel_v.name, "within", metric, verdict(passed), result.summary()))
    if not passed:
        raise AssertionError(_within_message(result, head, base, first, over))
    return result


def _within_message(result: Comparison, head, base, first: AttnSpec, over: list[int]) -> str:
    """Both series at each length, and the gate's reason on their growth."""
    metric = result.metric
    rows = ", ".join(
        f"L={n}: {_fmt(h, metric)} vs {_fmt(b, metric)} (x{h / b:.3g})"
        for n, h, b in zip(head.lengths, head.values, base.values, strict=True)
    )
    where = f" at L={', '.join(map(str, over))}" if over else ""
    return (
        f"{metric} of {result.kernel} beyond x{result.factor:g} of {result.baseline} "
        f"({_shape(first)}){where}:\n  {rows}\n  {result.baseline} -> {result.kernel}: "
        f"{result.reason}"
    )


def _time_samples(
    variant: Variant, spec: AttnSpec, seconds: float, typical: float, seed: int
) -> tuple[list[float], str]:
    """Per-call seconds of the kernel's blocks, and what disturbed them ("" when nothing did)."""
    call, _, _ = make_call(variant, spec, seed)
    variant.warm_up(call)
    first = time_once(call, spec.device)
    timer = TimerConfig(min_time=seconds / 2, max_time=seconds)
    config = MeasureConfig(timer=timer, probe_baseline_s=typical, retry_budget_s=seconds)
    timed = timed_attempts(call, spec.device, config, first)
    if timed.disturbance.disturbed:
        return timed.samples, f"{variant.name} at L={spec.lq}: {timed.disturbance.describe()}"
    return timed.samples, ""


def _within_time(kernel, base, lengths, factor, spec, device, seed, seconds) -> Comparison:
    __tracebackhide__ = True
    factor = check_factor("factor", TIME_FACTOR if factor is None else factor)
    if not (isinstance(seconds, (int, float)) and 0 < seconds <= 60):
        raise ValueError(f"seconds must be a number in (0, 60], got {seconds!r}")
    specs = _specs(kernel, default_lengths(lengths), spec, device)
    decisions, disturbed = [], []
    with _engine_threads():  # the sweep's regime: one thread
        typical = typical_speed(baseline_probes(specs[0].device))
        for s in specs:
            (before, why_b), (after, why_k) = (
                _time_samples(v, s, seconds, typical, seed) for v in (base, kernel)
            )
            decisions.append(decide(before, after, factor))
            disturbed += [w for w in (why_b, why_k) if w]
    reason = "; ".join(f"L={s.lq}: {d.reason}" for s, d in zip(specs, decisions, strict=True))
    verdicts = {d.verdict for d in decisions}
    if disturbed:  # a disturbed attempt decides nothing, whatever its samples say
        verdicts = {GateVerdict.UNDECIDED}
        reason = "disturbed: " + "; ".join(disturbed) + f" ({reason})"
    lengths_ = tuple(s.lq for s in specs)
    result = Comparison(
        kernel.name,
        base.name,
        "time",
        factor,
        lengths_,
        tuple(d.ratio for d in decisions),
        reason,
        verdicts == {GateVerdict.OK},
    )
    what = f"time of {kernel.name} against {base.name} ({_shape(specs[0])})"
    line = f"time vs {base.name} at L={','.join(map(str, lengths_))}"
    if GateVerdict.REGRESSED in verdicts:
        note(Record(kernel.name, "time", "time", "failed", line))
        raise AssertionError(f"{what} beyond x{factor:g}: {reason}")
    if not result.passed:
        note(Record(kernel.name, "time", "time", "undecided", line))
        undecided(f"{what} undecided: {reason}")
    note(Record(kernel.name, "time", "time", "passed", line))
    return result
