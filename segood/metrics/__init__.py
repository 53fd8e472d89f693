"""Pixel-level OOD metrics: streaming accumulators on three threshold grids (the float-order grid, the default,
for any real score; the paper's linear grid; the exact grid, every distinct score a threshold), exact mode, and
the table of metrics (:data:`METRICS`) that reports, the CLI and the leaderboard read."""

from segood.metrics.accumulator import PixelOODAccumulator
from segood.metrics.exact import ExactAccumulator
from segood.metrics.float_order import FloatOrderAccumulator
from segood.metrics.functional import (
    METRIC_NAMES,
    METRICS,
    Curve,
    Metric,
    UndefinedMetricWarning,
    exact_curve,
    exact_metrics,
    get_metric,
    metric_bounds,
    metrics_from_counts,
)
from segood.metrics.grids import (accumulator_from_state, describe_grid, grid_of, grid_spec, load_accumulator,
                                  make_accumulator)

__all__ = [
    "METRICS",
    "METRIC_NAMES",
    "Curve",
    "ExactAccumulator",
    "FloatOrderAccumulator",
    "Metric",
    "PixelOODAccumulator",
    "UndefinedMetricWarning",
    "accumulator_from_state",
    "describe_grid",
    "exact_curve",
    "exact_metrics",
    "get_metric",
    "grid_of",
    "grid_spec",
    "load_accumulator",
    "make_accumulator",
    "metric_bounds",
    "metrics_from_counts",
]
