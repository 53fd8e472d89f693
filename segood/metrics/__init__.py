"""Pixel-level OOD metrics (contract: shared/METRICS.md): a streaming binned accumulator, exact mode, and the
table of metrics (:data:`METRICS`) that reports, the CLI and the leaderboard read."""

from segood.metrics.accumulator import PixelOODAccumulator
from segood.metrics.functional import (
    METRIC_NAMES,
    METRICS,
    Curve,
    Metric,
    UndefinedMetricWarning,
    exact_metrics,
    get_metric,
    metrics_from_counts,
)

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "Curve",
    "Metric",
    "PixelOODAccumulator",
    "UndefinedMetricWarning",
    "exact_metrics",
    "get_metric",
    "metrics_from_counts",
]
