"""Pixel-level OOD metrics: streaming accumulators on three threshold grids (the float-order grid, the default,
for any real score; the paper's linear grid; the exact grid, every distinct score a threshold), exact mode, the
table of metrics (:data:`METRICS`) that reports, the CLI and the leaderboard read, and array-in, float-out
functions for a notebook (``auroc(scores, labels)``, ``auprc``, ``fpr_at_tpr``, ``max_iou``:
:mod:`segood.metrics.arrays`)."""

from segood.metrics.accumulator import LinearGridAccumulator, PixelOODAccumulator
from segood.metrics.arrays import auprc, auroc, curve, fpr_at_tpr, max_iou
from segood.metrics.exact import ExactAccumulator
from segood.metrics.float_order import FloatOrderAccumulator
from segood.metrics.functional import (
    METRIC_NAMES,
    METRICS,
    Curve,
    Metric,
    UndefinedMetricWarning,
    distinct_score_counts,
    exact_metrics,
    get_metric,
    list_metrics,
    metric_bounds,
    metrics_from_counts,
    register_metric,
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
    "LinearGridAccumulator",
    "PixelOODAccumulator",
    "UndefinedMetricWarning",
    "accumulator_from_state",
    "auprc",
    "auroc",
    "curve",
    "describe_grid",
    "distinct_score_counts",
    "exact_metrics",
    "fpr_at_tpr",
    "get_metric",
    "grid_of",
    "list_metrics",
    "grid_spec",
    "load_accumulator",
    "make_accumulator",
    "max_iou",
    "metric_bounds",
    "metrics_from_counts",
    "register_metric",
]
