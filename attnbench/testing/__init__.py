"""Check an attention kernel from your own tests: its answer, and how its cost grows.

A thin layer over the engine: the variant contract (:func:`wrap` adapts a plain function), the
correctness gate and its float64 reference (:func:`check_answer`), the runner's memory measurement,
FlopCounterMode and valgrind's counts (:func:`measure_cost`), and the regression gate's
deterministic growth fit and judgement (:func:`assert_growth`, :func:`assert_within`). A check that
cannot decide is a pytest skip with the reason (:class:`Undecided` outside pytest). The page
docs/testing.md walks through a whole example.
"""

from attnbench.testing.answer import AnswerReport, CaseResult, answer_shapes, check_answer
from attnbench.testing.cost import (
    METRICS,
    TARGET_LENGTH,
    Comparison,
    GrowthCheck,
    assert_growth,
    assert_within,
    measure_cost,
)
from attnbench.testing.kernel import CALLS, DEFAULT_LENGTHS, LAYOUTS, Kernel, wrap
from attnbench.testing.outcome import Record, Undecided, records

__all__ = [
    "CALLS",
    "DEFAULT_LENGTHS",
    "LAYOUTS",
    "METRICS",
    "TARGET_LENGTH",
    "AnswerReport",
    "CaseResult",
    "Comparison",
    "GrowthCheck",
    "Kernel",
    "Record",
    "Undecided",
    "answer_shapes",
    "assert_growth",
    "assert_within",
    "check_answer",
    "measure_cost",
    "records",
    "wrap",
]
