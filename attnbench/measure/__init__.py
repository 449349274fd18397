"""The measurement engine: timing, memory, environment and the runner that ties them together."""

from attnbench.measure.record import STATUSES, Environment, Measurement
from attnbench.measure.runner import MeasureConfig, measure
from attnbench.measure.sweep import sweep

__all__ = ["STATUSES", "Environment", "MeasureConfig", "Measurement", "measure", "sweep"]
