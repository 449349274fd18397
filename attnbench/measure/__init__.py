"""The measurement engine: timing, memory, environment and the runner that ties them together."""

from attnbench.measure.config import MeasureConfig
from attnbench.measure.record import STATUSES, Environment, Measurement
from attnbench.measure.runner import measure
from attnbench.measure.sweep import sweep

__all__ = ["STATUSES", "Environment", "MeasureConfig", "Measurement", "measure", "sweep"]
