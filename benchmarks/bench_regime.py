"""The measurement regime, recorded in asv's results next to the timings it applies to.

asv keeps parameter values in every result file, so the regime line (threads, allocator
thresholds, transparent huge pages; :func:`attnbench.measure.regime.describe`) is this benchmark's
one parameter, and the tracks give its numbers.
"""

from __future__ import annotations

import torch

from attnbench import asv_bench
from attnbench.measure import regime


class MeasurementRegime:
    """Threads and allocator thresholds in force in asv's benchmark processes."""

    params = [[regime.describe()]]
    param_names = ["regime"]
    unit = "count"

    def track_threads(self, regime_line: str) -> int:
        return torch.get_num_threads()

    def track_mmap_threshold(self, regime_line: str) -> int:
        return asv_bench.REGIME.mmap_threshold if regime.current() is not None else 0

    track_threads.unit = "threads"
    track_mmap_threshold.unit = "bytes"
