"""Committed thresholds: a threshold chosen on a tuning set by a named rule, then applied unchanged to test sets.

A deployed detector commits to one threshold; threshold-free metrics cannot say how it behaves there. A rule
picks a threshold on a tuning set's pooled curve; on any set binned on the same grid, "predicted OOD iff
score >= t" is then counted exactly (t is a bin edge of that grid), giving TPR, FPR, precision, balanced
accuracy, F1 and IoU at it. The same rule applied to a test set itself is an *oracle* and is named so.
"""

import numpy as np

RULES = {
    "tpr95": "the highest threshold with TPR >= 0.95 (the operating point of FPR95)",
    "balanced_accuracy": "the threshold of best balanced accuracy (TPR + TNR) / 2",
    "f1": "the threshold of best pixel F1 = 2 TP / (2 TP + FP + FN)",
    "iou": "the threshold of best OOD IoU = TP / (TP + FP + FN)",
}


def _rates(tp, fp, n_ood, n_id):
    tp, fp = np.asarray(tp, np.float64), np.asarray(fp, np.float64)
    fn = n_ood - tp
    with np.errstate(invalid="ignore", divide="ignore"):
        return {"tpr": tp / n_ood, "fpr": fp / n_id,
                "precision": np.where(tp + fp > 0, tp / (tp + fp), np.nan),
                "balanced_accuracy": (tp / n_ood + 1 - fp / n_id) / 2,
                "f1": np.where(2 * tp + fp + fn > 0, 2 * tp / (2 * tp + fp + fn), 0.0),
                "iou": np.where(tp + fp + fn > 0, tp / (tp + fp + fn), 0.0)}


def commit(result, rule):
    """The threshold ``rule`` picks on a set, from an accumulator's ``compute()`` (thresholds, tp, fp, n_ood,
    n_id); ties go to the lowest threshold. A ValueError for an unknown rule or a set without ID or OOD pixels."""
    if rule not in RULES:
        raise ValueError(f"unknown threshold rule {rule!r}; choose one of {', '.join(RULES)}")
    if not (result["n_ood"] and result["n_id"]):
        raise ValueError(f"a threshold needs ID and OOD pixels on the tuning set ({result['n_id']} ID, "
                         f"{result['n_ood']} OOD)")
    thresholds = np.asarray(result["thresholds"])
    rates = _rates(result["tp"], result["fp"], result["n_ood"], result["n_id"])
    if rule == "tpr95":  # TPR falls as the threshold rises: the last threshold still at TPR >= 0.95
        return float(thresholds[np.flatnonzero(rates["tpr"] >= 0.95)[-1]])
    return float(thresholds[int(np.argmax(rates[rule]))])


def at_threshold(result, threshold):
    """{tpr, fpr, precision, balanced_accuracy, f1, iou} of a set's ``compute()`` at a committed threshold
    (predicted OOD iff score >= threshold; exact when the threshold is a bin edge of the set's grid, as every
    threshold of the same grid is). Precision is NaN where nothing is predicted OOD."""
    thresholds = np.asarray(result["thresholds"])
    k = int(np.searchsorted(thresholds, threshold, side="left"))  # first bin whose pixels all have score >= t
    tp = int(result["tp"][k]) if k < thresholds.size else 0
    fp = int(result["fp"][k]) if k < thresholds.size else 0
    return {name: float(v) for name, v in _rates(tp, fp, result["n_ood"], result["n_id"]).items()}
