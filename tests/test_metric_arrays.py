"""Array-in, float-out metrics (segood.metrics.auroc & co.) against scikit-learn, the accumulators and a literal
loop over thresholds."""

import numpy as np
import pytest
import torch
from sklearn.metrics import average_precision_score, roc_auc_score

from segood import metrics
from segood.metrics import UndefinedMetricWarning, exact_metrics, make_accumulator


def data(seed, n=2000, decimals=2):
    rng = np.random.default_rng(seed)
    labels = rng.choice(np.array([0, 1, 255], np.uint8), n, p=[0.6, 0.3, 0.1])
    scores = (rng.random(n) + 0.3 * (labels == 1)).round(decimals)  # ties
    return scores, labels


def fpr_at_tpr_by_loop(scores, labels, tpr):
    """The definition, threshold by threshold: the smallest FPR among thresholds whose TPR reaches ``tpr``."""
    s, y = scores[labels != 255], labels[labels != 255]
    best = 1.0
    for t in np.unique(s):
        tp, fp = np.sum((s >= t) & (y == 1)), np.sum((s >= t) & (y == 0))
        if tp / np.sum(y == 1) >= tpr - 1e-12:
            best = min(best, fp / np.sum(y == 0))
    return best


@pytest.mark.parametrize("seed", range(4))
def test_exact_by_default_equal_to_scikit_learn_and_the_definitions(seed):
    scores, labels = data(seed)
    counted = labels != 255
    assert metrics.auroc(scores, labels) == pytest.approx(roc_auc_score(labels[counted], scores[counted]), abs=1e-12)
    assert metrics.auprc(scores, labels) == pytest.approx(
        average_precision_score(labels[counted], scores[counted]), abs=1e-12)
    exact = exact_metrics(scores, labels)
    assert metrics.fpr_at_tpr(scores, labels) == exact["fpr95"]
    assert metrics.max_iou(scores, labels) == exact["max_iou"]
    for tpr in (0.5, 0.8, 0.9, 1.0):
        assert metrics.fpr_at_tpr(scores, labels, tpr) == pytest.approx(fpr_at_tpr_by_loop(scores, labels, tpr),
                                                                       abs=1e-15)


def test_tensors_any_shape_and_grids_as_the_accumulators():
    scores, labels = data(7, n=4096)
    scores = scores / scores.max()  # in [0, 1], the linear grid's default range
    as_tensors = torch.from_numpy(scores.reshape(4, 32, 32)), torch.from_numpy(labels.reshape(4, 32, 32))
    assert metrics.auroc(*as_tensors) == metrics.auroc(scores, labels)
    for grid, spec in (("float", {"kind": "float", "mantissa_bits": 10}),
                       ("linear", {"kind": "linear", "num_thresholds": 400, "score_range": [0.0, 1.0]}),
                       ({"kind": "linear", "num_thresholds": 7, "score_range": [0.0, 2.0]}, None)):
        acc = make_accumulator(spec or grid)
        acc.update(scores, labels)
        want = acc.compute()
        for name in ("auroc", "auprc", "max_iou"):
            assert getattr(metrics, name)(scores, labels, grid=grid) == pytest.approx(want[name], abs=1e-12), name
        assert metrics.fpr_at_tpr(scores, labels, grid=grid) == pytest.approx(want["fpr95"], abs=1e-15)


def test_undefined_is_nan_with_a_warning_and_bad_input_is_named():
    with pytest.warns(UndefinedMetricWarning, match="no OOD"):
        assert np.isnan(metrics.auroc(np.array([0.1, 0.2]), np.array([0, 0], np.uint8)))
    with pytest.raises(ValueError, match="tpr must be in"):
        metrics.fpr_at_tpr(np.array([0.1, 0.2]), np.array([0, 1], np.uint8), 0)
    assert metrics.auroc(np.array([0.1, 0.2, 0.2]), np.array([0, 1, 0], np.uint8), grid="exact") == 0.75
    with pytest.raises(ValueError, match="unknown grid kind 'log'"):
        metrics.auroc(np.array([0.1, 0.2]), np.array([0, 1], np.uint8), grid="log")
    with pytest.raises(ValueError, match="labels"):
        metrics.auroc(np.array([0.1, 0.2]), np.array([0, 3], np.uint8))
