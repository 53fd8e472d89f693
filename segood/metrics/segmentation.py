"""Semantic segmentation quality: confusion matrix and mean IoU over Cityscapes trainIds."""

import numpy as np

from segood.labels import IGNORE


def confusion_matrix(pred, target, num_classes):
    """Counts ``[target_class, predicted_class]`` over pixels whose target is a class (255 = unknown skipped).

    Args:
        pred, target: integer arrays of the same shape.

    Returns:
        (num_classes, num_classes) int64.
    """
    pred, target = np.asarray(pred).ravel(), np.asarray(target).ravel()
    if pred.shape != target.shape:
        raise ValueError(f"pred has {pred.size} pixels but target has {target.size}")
    keep = target != IGNORE
    if np.any(target[keep] >= num_classes) or np.any(pred[keep] >= num_classes):
        raise ValueError(f"class ids must be below num_classes={num_classes} (or 255 in the target)")
    flat = target[keep].astype(np.int64) * num_classes + pred[keep]
    return np.bincount(flat, minlength=num_classes**2).reshape(num_classes, num_classes)


def mean_iou(confusion):
    """(mIoU over classes present in the target or prediction, per-class IoU with NaN for absent classes)."""
    confusion = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(confusion)
    union = confusion.sum(0) + confusion.sum(1) - tp
    iou = np.divide(tp, union, out=np.full(tp.shape, np.nan), where=union > 0)
    return float(np.nanmean(iou)) if np.any(union > 0) else float("nan"), iou
