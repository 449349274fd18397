"""Is the kernel's answer right? The correctness gate's own check, over a stated set of shapes.

Each case goes through the runner's gated call (:class:`attnbench.measure.runner.GatedCall`): the
inputs the sweep would make, the kernel's first call, and the gate's verdict on its result against
the float64 reference of every (batch, head) slice, with the gate's tolerance (``FACTOR`` times the
plain same-precision implementation's error plus a floor), its call contract (shape, dtype, device)
and its check that the inputs were not written. Backward cases check dq, dk and dv too.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from attnbench.io import error_line
from attnbench.masks import MASK_KINDS
from attnbench.measure.config import MeasureConfig
from attnbench.measure.runner import GatedCall, check_plan
from attnbench.spec import AttnSpec
from attnbench.testing.kernel import as_variant, default_device, spec_text
from attnbench.testing.outcome import Record, note, verdict
from attnbench.variants.base import Variant

__all__ = ["answer_shapes", "CaseResult", "AnswerReport", "check_answer"]

_BASE = AttnSpec(batch=2, heads=2, seq_len=67, head_dim=32)
"""The checks' shape: two sequences (per-sequence masks differ), a length no block size divides,
a narrow window (the ``sliding_window`` kind then cuts rows), small enough for milliseconds."""


def answer_shapes(kernel: Variant | str, device: str | None = None) -> list[AttnSpec]:
    """The cases :func:`check_answer` runs by default: every declared feature, at small sizes.

    Every mask kind the kernel declares; then, with its most demanding mask (causal where declared):
    grouped-query attention (H = 4 query heads over Hkv = 2, and over 1: multi-query), Lq != Lk
    both ways and one query over many keys, odd head dims (D = 33, and Dv = 24 != D), batch 3, and
    the backward pass of the plain and the grouped case. Cases the kernel does not support are left
    out. The shape (B2 H2 L67 D32) is one no block size divides, small enough for milliseconds.
    """
    variant = as_variant(kernel)
    base = _BASE.replace(device=default_device(device))
    declared = [m for m in MASK_KINDS if m in variant.SUPPORTED_MASKS]
    mask = "causal" if "causal" in declared else (declared[0] if declared else "none")
    # the sliding window narrow enough to cut rows at this length
    cases = [base.replace(mask=m, window=8 if m == "sliding_window" else 128) for m in declared]
    masked = base.replace(mask=mask)
    cases += [
        masked.replace(heads=4, kv_heads=2),
        masked.replace(heads=4, kv_heads=1),
        masked.replace(seq_len=40, seq_len_k=91),
        masked.replace(seq_len=91, seq_len_k=40),
        masked.replace(seq_len=1, seq_len_k=91),
        masked.replace(head_dim=33),
        masked.replace(head_dim_v=24),
        masked.replace(batch=3, heads=2),
        masked.replace(mode="backward"),
        masked.replace(mode="backward", heads=4, kv_heads=2),
    ]
    return [spec for spec in cases if not variant.not_supported_reasons(spec)]


@dataclass(frozen=True)
class CaseResult:
    """One case of the answer check."""

    spec: AttnSpec
    error_ratio: float  # worst error / tolerance over output and gradients (inf: non-finite)
    reason: str  # the gate's reason, or the exception the kernel raised ("" when right)

    @property
    def passed(self) -> bool:
        return not self.reason and self.error_ratio <= 1.0


@dataclass(frozen=True)
class AnswerReport:
    """Every case of one answer check, and the message that names the worst."""

    kernel: str
    repro: str  # the kernel as built (its repr)
    cases: tuple[CaseResult, ...]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.cases)

    @property
    def worst(self) -> CaseResult:
        """The case with the largest error / tolerance (a kernel that raised counts as inf)."""
        return max(
            self.cases, key=lambda c: math.inf if math.isnan(c.error_ratio) else c.error_ratio
        )

    def message(self) -> str:
        """What a failing test prints: how many cases were wrong, the worst one, a repro line."""
        wrong = [c for c in self.cases if not c.passed]
        worst = self.worst
        lines = [
            f"answer check of {self.kernel}: {len(wrong)} of {len(self.cases)} cases wrong "
            "against the float64 reference",
            f"  worst: {worst.spec.label}",
            f"  error/tolerance {worst.error_ratio:.3g}: {worst.reason}",
            f"  repro: attnbench.testing.check_answer(kernel, [attnbench.{spec_text(worst.spec)}])",
            f"  kernel: {self.repro}",
        ]
        others = [c for c in wrong if c is not worst]
        if others:
            lines.append(
                "  also wrong: "
                + "; ".join(f"{c.spec.label} ({c.error_ratio:.3g})" for c in others[:3])
                + (f"; and {len(others) - 3} more" if len(others) > 3 else "")
            )
        return "\n".join(lines)


def _one_case(variant: Variant, spec: AttnSpec, seed: int) -> CaseResult:
    """The gate on the kernel's first call of ``spec``: every slice checked."""
    config = MeasureConfig(seed=seed, reference_budget_bytes=2**40)
    try:
        checked = GatedCall(variant, spec, check_plan(variant, spec, config), seed).first
    except Exception as exc:  # noqa: BLE001 - a kernel that raises is a wrong case, named
        return CaseResult(spec, math.inf, f"the kernel raised {error_line(exc)}")
    if checked is None:  # no slice was planned: never on an unlimited budget
        return CaseResult(spec, math.nan, "the gate checked no slice")
    return CaseResult(spec, checked.error_ratio, checked.reason())


def check_answer(
    kernel: Variant | str,
    shapes: Iterable[AttnSpec] | None = None,
    *,
    seed: int = 0,
    device: str | None = None,
) -> AnswerReport:
    """Assert the kernel's answer agrees with the float64 reference on every case.

    Args:
        kernel: a wrapped function (:func:`~attnbench.testing.wrap`), a variant or a registered
            name.
        shapes: the cases (default :func:`answer_shapes`); each must be one the kernel declares
            it supports.
        seed: the inputs' seed.
        device: where the default cases run (default: ``ATTNBENCH_TEST_DEVICE``, else cpu).

    Returns:
        the report of every case (when all passed).

    Raises:
        AssertionError: a case is wrong; the message names the worst case, its error against the
            tolerance and a one-line repro.
        TypeError, ValueError: a case the kernel does not support (its reasons), or no case.
    """
    __tracebackhide__ = True  # pytest shows the caller's line, not this function's
    variant = as_variant(kernel)
    specs = _checked_specs(variant, answer_shapes(variant, device) if shapes is None else shapes)
    report = AnswerReport(
        variant.name, repr(variant), tuple(_one_case(variant, s, seed) for s in specs)
    )
    worst = report.worst.error_ratio
    note(
        Record(
            variant.name,
            "answer",
            "",
            verdict(report.passed),
            f"answer: {_cases(len(specs))}, worst error/tolerance {worst:.3g}",
        )
    )
    if not report.passed:
        raise AssertionError(report.message())
    return report


def _cases(n: int) -> str:
    return f"{n} case" if n == 1 else f"{n} cases"


def _checked_specs(variant: Variant, shapes: Iterable[AttnSpec]) -> Sequence[AttnSpec]:
    specs = list(shapes)
    if not specs:
        raise ValueError(f"shapes: {variant.name} declares support for none of the cases")
    for spec in specs:
        if not isinstance(spec, AttnSpec):
            raise TypeError(f"shapes must hold AttnSpec values, got {type(spec).__name__}")
        reasons = variant.not_supported_reasons(spec)
        if reasons:
            raise ValueError(f"shapes: {spec.label}: " + "; ".join(reasons))
    return specs
