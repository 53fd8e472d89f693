"""The metrics of score and label arrays, as a notebook uses them: arrays or tensors in, a float out.

    >>> from segood import metrics
    >>> metrics.auroc(scores, labels), metrics.fpr_at_tpr(scores, labels, 0.95)

``scores``: real numbers of any shape, higher = more OOD; ``labels``: the same shape, 0 (ID), 1 (OOD), 255
(ignore). Exact by default: every distinct score is a threshold (equal to scikit-learn's ``roc_auc_score`` and
``average_precision_score``; O(n log n), the pixels sorted in memory). ``grid=`` bins them instead, as the
accumulators do: ``"float"`` (the float-order grid at 10 mantissa bits), ``"linear"`` (the paper's 400
thresholds on [0, 1]), ``"exact"`` (the exact grid's accumulator: the same numbers as the default) or a
:func:`~segood.metrics.grid_spec` dict. A metric without OOD or without ID pixels is
NaN, with an :class:`~segood.metrics.UndefinedMetricWarning`.
"""

from __future__ import annotations

import math
import warnings
from fractions import Fraction
from typing import TYPE_CHECKING

import numpy as np

from segood.metrics import functional as fn
from segood.metrics.grids import grid_spec, make_accumulator

if TYPE_CHECKING:  # scores and labels: numpy arrays or torch tensors of any shape
    import torch

    ArrayLike = np.ndarray | torch.Tensor

__all__ = ["auprc", "auroc", "curve", "fpr_at_tpr", "max_iou"]


def curve(scores: ArrayLike, labels: ArrayLike, *, grid: str | dict | None = None) -> fn.Curve:
    """The :class:`~segood.metrics.Curve` (TP and FP at increasing thresholds) every metric here is read from."""
    if grid is None:
        return fn.exact_curve(scores, labels)[0]
    acc = make_accumulator(grid_spec(kind=grid))  # a name ("float", "linear", "exact") or a whole grid
    acc.update(scores, labels)
    thresholds, hist = acc.curve_counts()
    fp, tp = (np.cumsum(row[::-1])[::-1].astype(np.int64) for row in hist)
    return fn.Curve(thresholds, tp, fp, int(hist[1].sum()), int(hist[0].sum()))


def auroc(scores: ArrayLike, labels: ArrayLike, *, grid: str | dict | None = None) -> float:
    """Area under the ROC curve (trapezoids), higher is better; the metric contract's AUROC."""
    return _defined(curve(scores, labels, grid=grid), fn.auroc)


def auprc(scores: ArrayLike, labels: ArrayLike, *, grid: str | dict | None = None) -> float:
    """Average precision (a step sum over recall), higher is better; the metric contract's AUPRC."""
    return _defined(curve(scores, labels, grid=grid), fn.auprc)


def max_iou(scores: ArrayLike, labels: ArrayLike, *, grid: str | dict | None = None) -> float:
    """The largest TP / (TP + FP + FN) over the thresholds (Angus et al. 2019), higher is better."""
    return _defined(curve(scores, labels, grid=grid), fn.max_iou)


def fpr_at_tpr(scores: ArrayLike, labels: ArrayLike, tpr: float = 0.95, *,
               grid: str | dict | None = None) -> float:
    """The smallest FPR among the thresholds with TPR >= ``tpr`` (no interpolation), lower is better; ``tpr`` is
    read as the decimal it prints as (0.95 is 19/20), so TPR is compared in integers and no rounding decides
    which thresholds qualify. ``fpr_at_tpr(s, l)`` is the contract's FPR95."""
    if not 0 < tpr <= 1:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    target = Fraction(str(tpr))

    def fpr(c):
        needed = math.ceil(target * c.n_ood)  # TP >= tpr * P, in integers
        return float(c.fpr[c.tp >= needed].min())

    return _defined(curve(scores, labels, grid=grid), fpr)


def _defined(c, metric):
    if c.n_ood == 0 or c.n_id == 0:
        missing = "OOD (label 1)" if c.n_ood == 0 else "ID (label 0)"
        warnings.warn(f"the metric is undefined (NaN): the data hold no {missing} pixels ({c.n_ood} OOD, {c.n_id} "
                      "ID counted)", fn.UndefinedMetricWarning, stacklevel=3)
        return float("nan")
    return float(metric(c))
