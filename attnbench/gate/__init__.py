"""The regression gate: benchmark BASE and HEAD with asv, read the results, decide.

:mod:`~attnbench.gate.session` drives asv and git, :mod:`~attnbench.gate.results` reads what they
wrote, :mod:`~attnbench.gate.decision` decides (pure: no process); beside them the bisection
(:mod:`~attnbench.gate.bisect`), the history's steps (:mod:`~attnbench.gate.steps`), the Markdown
summaries (:mod:`~attnbench.gate.markdown`) and the dashboards' export
(:mod:`~attnbench.gate.export`). This module only gathers the gate's entry points.
"""

from attnbench.gate.decision import GATE_METRICS, GateOptions, Outcome, SampleKey, compare
from attnbench.gate.results import (
    RegressError,
    read_corrected,
    read_probes,
    read_time_samples,
    write_verdicts,
)
from attnbench.gate.session import AsvSession, regress, regress_many

__all__ = [
    "GATE_METRICS",
    "AsvSession",
    "GateOptions",
    "Outcome",
    "RegressError",
    "SampleKey",
    "compare",
    "read_corrected",
    "read_probes",
    "read_time_samples",
    "regress",
    "regress_many",
    "write_verdicts",
]
