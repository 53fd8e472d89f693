"""Pixel-level OOD metrics (contract: shared/METRICS.md): a streaming binned accumulator and exact mode."""

from segood.metrics.accumulator import PixelOODAccumulator
from segood.metrics.functional import (
    HIGHER_IS_BETTER,
    METRIC_NAMES,
    UndefinedMetricWarning,
    exact_metrics,
    metrics_from_counts,
)

__all__ = [
    "HIGHER_IS_BETTER",
    "METRIC_NAMES",
    "PixelOODAccumulator",
    "UndefinedMetricWarning",
    "exact_metrics",
    "metrics_from_counts",
]
