"""The official mode against each benchmark's definitions followed step by step here (plain numpy loops written
from the definitions of road-anomaly-benchmark's PixBinaryClass / SegEval, bdl-benchmark's
calculate_metrics_perpixAP and anomaly-seg's eval_ood.py), on literal frames with ties and scores on thresholds,
and against the values each benchmark's own code gave on such frames; and segood's own numbers unchanged by it."""

import json

import numpy as np
import pytest
from scipy import ndimage

from segood.labels import IGNORE, OOD
from segood.metrics import exact_metrics
from segood.metrics.components import ComponentAccumulator
from segood.metrics.official import (CAOS_METRICS, SMIYC_TAUS, CAOSPixelAccumulator, FishyscapesPixelAccumulator,
                                     SMIYCComponentAccumulator, SMIYCPixelAccumulator, caos_frame_metrics,
                                     fishyscapes_metrics, fishyscapes_values, pixel_accumulator,
                                     pixel_accumulator_from_state, smiyc_frame_bins, smiyc_pixel_metrics)

X = IGNORE
# three 6 x 8 frames: scores on a few values (ties), many exactly 0.5 (the component threshold below)
LABELS = np.array([
    [[0, 0, 0, 0, 0, 0, 0, 0],
     [0, 1, 1, 0, 0, 0, X, X],
     [0, 1, 1, 0, 0, 0, X, X],
     [0, 0, 0, 0, 1, 0, 0, 0],
     [0, 0, 0, 0, 0, 0, 0, 0],
     [0, 0, 0, 1, 1, 1, 0, 0]],
    [[1, 1, 0, 0, 0, 0, 0, 0],
     [1, 1, 0, 0, 0, 1, 1, 1],
     [0, 0, 0, 0, 0, 1, 1, 1],
     [0, 0, X, X, 0, 0, 0, 0],
     [0, 0, X, X, 0, 0, 0, 0],
     [0, 0, 0, 0, 0, 0, 0, 1]],
    [[0, 0, 0, 0, 0, 0, 0, 0],
     [0, 0, 0, 0, 0, 0, 0, 0],
     [0, 0, 1, 1, 1, 0, 0, 0],
     [0, 0, 1, 1, 1, 0, 0, 0],
     [0, 0, 0, 0, 0, 0, X, 0],
     [0, 0, 0, 0, 0, 0, 0, 0]],
], np.uint8)
SCORES = np.array([
    [[.10, .10, .25, .10, .00, .00, .50, .50],
     [.10, .90, .75, .50, .10, .00, 1.0, 1.0],
     [.25, 1.0, .50, .50, .10, .00, 1.0, .90],
     [.00, .10, .25, .10, .50, .10, .00, .00],
     [.00, .00, .10, .50, .50, .10, .00, .00],
     [.00, .00, .50, .90, .75, .50, .00, .00]],
    [[.75, .75, .50, .10, .00, .00, .00, .25],
     [.50, .90, .50, .00, .50, .75, .75, .50],
     [.25, .50, .25, .00, .50, .90, .95, .50],
     [.00, .00, .95, .95, .00, .25, .50, .10],
     [.00, .10, .95, .95, .00, .00, .10, .50],
     [.10, .00, .00, .00, .00, .00, .50, .50]],
    [[.00, .00, .10, .10, .10, .00, .00, .00],
     [.00, .50, .50, .50, .50, .50, .00, .00],
     [.00, .50, .75, .90, .50, .50, .00, .00],
     [.00, .50, .50, .75, .50, .10, .00, .00],
     [.00, .00, .10, .10, .00, .00, .85, .00],
     [.00, .00, .00, .00, .00, .00, .00, .00]],
])
# the frames' highest counted scores, SMIYC's highest thresholds, differ: 1.0, 0.95 (its 0.95 block is ignore but
# for one pixel) and 0.9 (its 0.85 is ignore)


# ---- SMIYC's PixBinaryClass, step by step ---------------------------------------------------------------------------

def smiyc_reference(scores, labels, *, num_bins=768, keep_partial_top=True):
    """AP, FPR95 and the best-F1 threshold the way PixBinaryClass computes them: per frame, edges at the extremes
    -/+ eps and at the quantiles of each class, np.histogram's bins [e_i, e_i+1) (the last closed) counted one by
    one, each bin's threshold its lower edge; the bins of all frames sorted from high to low threshold, cumulated;
    of each run of equal thresholds the last entry kept, and the very first entry (``keep_partial_top``); the
    end points; AP = sum of recall steps times precision."""
    thresholds, tp_rel, fp_rel, n_pos, n_neg = [], [], [], 0, 0
    for frame_scores, frame_labels in zip(scores, labels):
        roi = frame_labels < 255
        p = frame_scores[roi].astype(np.float64)
        gt = frame_labels[roi].astype(bool)
        vmin, vmax = p.min(), p.max()
        eps = max((vmax - vmin) * 1e-2, 1e-2)
        edges = [vmin - eps, vmax + eps]
        for group in (p[gt], p[~gt]):
            if group.size:
                edges += list(np.quantile(group, np.linspace(0, 1, min(num_bins // 2, group.size))))
        edges = sorted(set(edges))
        for i in range(len(edges) - 1):
            upper_ok = p <= edges[i + 1] if i == len(edges) - 2 else p < edges[i + 1]
            inside = (p >= edges[i]) & upper_ok
            thresholds.append(edges[i])
            tp_rel.append(int(np.sum(inside & gt)))
            fp_rel.append(int(np.sum(inside & ~gt)))
        n_pos += int(gt.sum())
        n_neg += int((~gt).sum())
    order = np.argsort(thresholds, kind="stable")[::-1]
    t = np.array(thresholds)[order]
    tp = np.cumsum(np.array(tp_rel)[order]).astype(np.float64)
    fp = np.cumsum(np.array(fp_rel)[order]).astype(np.float64)
    keep = [0] + [i for i in range(len(t) - 1) if t[i] != t[i + 1]] + [len(t) - 1]
    if not keep_partial_top:
        keep = keep[1:]  # index 0 stays where it is the last of its run (then it is listed again)
    t, tp, fp = t[keep], tp[keep], fp[keep]
    if tp[0] != 0 or fp[0] != 0:
        t, tp, fp = np.r_[t.max() + 1, t], np.r_[0, tp], np.r_[0, fp]
    if tp[-1] != n_pos or fp[-1] != n_neg:
        t, tp, fp = np.r_[t, t.max() - 1], np.r_[tp, n_pos], np.r_[fp, n_neg]
    fn, tn = n_pos - tp, n_neg - fp
    tpr = [tp[k] / (tp[k] + fn[k]) for k in range(len(tp))]
    fpr = [fp[k] / (fp[k] + tn[k]) for k in range(len(tp))]
    precision = [tp[k] / (tp[k] + fp[k]) if tp[k] + fp[k] > 0 else 1.0 for k in range(len(tp))]
    ap = sum((tpr[k] - tpr[k - 1]) * precision[k] for k in range(1, len(tp)))
    at95 = next(k for k in range(len(tp)) if tpr[k] >= 0.95)
    f1 = [2 * tp[k] / (2 * tp[k] + fp[k] + fn[k]) for k in range(len(tp))]
    best = max(range(len(tp)), key=lambda k: (f1[k], -k))  # the first of equal maxima
    return {"auprc": ap, "fpr95": fpr[at95], "tpr95_threshold": t[at95], "best_f1_threshold": t[best],
            "best_f1": f1[best]}


def smiyc_official(scores, labels, frames_at_once=False):
    acc = SMIYCPixelAccumulator()
    if frames_at_once:
        return acc.update(scores, labels).compute()
    for s, lab in zip(scores, labels):
        acc.update(s, lab)
    return acc.compute()


def assert_close(got, want, keys):
    for key in keys:
        assert got[key] == pytest.approx(want[key], abs=1e-9, rel=0), key


def random_frames(seed, n=4, shape=(30, 40), decimals=2):
    """Larger frames (quantiles between pixels, more than 384 pixels a class) with scores rounded to ``decimals``
    (ties everywhere)."""
    rng = np.random.default_rng(seed)
    labels = (rng.random((n, *shape)) < 0.3).astype(np.uint8)
    labels[rng.random(labels.shape) < 0.05] = IGNORE
    scores = np.round(rng.random(labels.shape) * 0.7 + 0.3 * (labels == OOD), decimals)
    return scores, labels


PIXEL_KEYS = ("auprc", "fpr95", "tpr95_threshold", "best_f1_threshold", "best_f1")


@pytest.mark.parametrize("case", ["literal", "random", "float16", "one_pixel_class"])
def test_smiyc_pixel_metrics_equal_the_official_definition(case):
    scores, labels = {"literal": (SCORES, LABELS), "random": random_frames(0),
                      "float16": random_frames(1, decimals=3),
                      "one_pixel_class": (SCORES, np.where(LABELS == OOD, 0, LABELS))}[case]
    if case == "float16":
        scores = scores.astype(np.float16)
    if case == "one_pixel_class":  # one OOD pixel in one frame: a quantile list of one value
        labels = labels.copy()
        labels[1, 5, 7] = OOD
    want = smiyc_reference(scores, labels)
    assert_close(smiyc_official(scores, labels), want, PIXEL_KEYS)
    assert_close(smiyc_official(scores, labels, frames_at_once=True), want, PIXEL_KEYS)


def test_a_shared_top_threshold_keeps_only_the_complete_point():
    """Where two frames share the highest threshold, the official curve also holds a partial point at it, of
    whichever frame np.argsort puts first; segood keeps the complete point only."""
    scores = SCORES.copy()
    scores[2, 2, 3] = scores[2, 4, 7] = 1.0  # frame 2's top: an OOD and an ID pixel at 1.0, frame 0's: one OOD pixel
    # the partial point is (1 OOD, 0 ID) or (1 OOD, 1 ID), the complete one (2 OOD, 1 ID): either moves the AP
    want = smiyc_reference(scores, LABELS, keep_partial_top=False)
    got = smiyc_official(scores, LABELS)
    assert_close(got, want, PIXEL_KEYS)
    literal = smiyc_reference(scores, LABELS)
    assert literal["auprc"] != pytest.approx(got["auprc"], abs=1e-9)  # the partial point moves the AP here


def test_smiyc_pixel_metrics_differ_from_the_exact_ones_and_merge_and_resume_exactly():
    scores, labels = random_frames(2, n=6, decimals=12)  # over 384 pixels a class: quantiles between pixels
    exact = exact_metrics(scores, labels)
    official = smiyc_official(scores, labels)
    assert official["auprc"] != pytest.approx(exact["auprc"], abs=1e-6)  # per-frame bins are not exact
    assert abs(official["auprc"] - exact["auprc"]) < 0.02
    a = SMIYCPixelAccumulator().update(scores[:2], labels[:2])
    b = SMIYCPixelAccumulator().update(scores[2:], labels[2:])
    merged = pixel_accumulator_from_state(a.state_dict()).merge(b)
    assert merged.compute() == official
    bins = [smiyc_frame_bins(s, lab) for s, lab in zip(scores, labels)]  # the pure function on the frames' bins
    assert_close(smiyc_pixel_metrics(*(np.concatenate(parts) for parts in zip(*bins))), official, PIXEL_KEYS)
    with pytest.raises(ValueError, match="finite scores"):
        SMIYCPixelAccumulator().update(np.full((2, 2), np.inf), np.zeros((2, 2), np.uint8))
    skipped = SMIYCPixelAccumulator().update(np.zeros((2, 2)), np.full((2, 2), IGNORE, np.uint8)).compute()
    assert skipped["n_skipped_frames"] == 1 and np.isnan(skipped["auprc"])
    with pytest.raises(ValueError, match="thresholds must be increasing"):
        state = a.state_dict()
        SMIYCPixelAccumulator.from_state_dict({**state, "thresholds": state["thresholds"][::-1].copy()})


# ---- Fishyscapes' calculate_metrics_perpixAP, step by step ---------------------------------------------------------

def fishyscapes_reference(scores, labels):
    """AP and FPR95 the way bdl-benchmark computes them: scores to float32; from the highest distinct value down,
    TP and FP at each; precision and recall; AP as the recall steps times precision up to the first point of full
    recall; FPR95 at the first point (after a (0, 0) one) with TPR >= 0.95."""
    valid = (labels == 0) | (labels == 1)
    s = scores[valid].astype(np.float32)
    gt = labels[valid] == 1
    tps, fps = [], []
    for v in sorted(set(s.tolist()), reverse=True):
        tps.append(int(np.sum(gt & (s >= v))))
        fps.append(int(np.sum(~gt & (s >= v))))
    n_pos, n_neg = tps[-1], fps[-1]
    precision = [tp / (tp + fp) for tp, fp in zip(tps, fps)]
    recall = [tp / n_pos for tp in tps]
    full = next(k for k in range(len(tps)) if tps[k] == n_pos)
    ap = sum((recall[k] - (recall[k - 1] if k else 0.0)) * precision[k] for k in range(full + 1))
    tpr = [0.0] + [tp / n_pos for tp in tps]
    fpr = [0.0] + [fp / n_neg for fp in fps]
    return {"auprc": ap, "fpr95": fpr[next(k for k in range(len(tpr)) if tpr[k] >= 0.95)]}


@pytest.mark.parametrize("case", ["literal", "random", "float64_beyond_float32"])
def test_fishyscapes_pixel_metrics_equal_the_official_definition(case):
    scores, labels = {"literal": (SCORES, LABELS), "random": random_frames(3),
                      "float64_beyond_float32": random_frames(4, decimals=12)}[case]
    if case == "float64_beyond_float32":  # float64 scores a float32 step apart become ties
        scores = scores + np.where(labels == OOD, 1e-9, 0.0)
    want = fishyscapes_reference(scores, labels)
    acc = FishyscapesPixelAccumulator()
    for s, lab in zip(scores, labels):
        acc.update(s, lab)
    assert_close(acc.compute(), want, ("auprc", "fpr95"))
    assert_close(fishyscapes_metrics(*fishyscapes_values(scores, labels)), want, ("auprc", "fpr95"))
    if case == "literal":  # float32-exact scores: the exact AP (sklearn's), the exact FPR95 (segood's definition)
        exact = exact_metrics(scores.astype(np.float32), labels)
        assert_close(acc.compute(), exact, ("auprc", "fpr95"))


def test_fishyscapes_state_resumes_and_merges_to_one_run():
    scores, labels = random_frames(5, n=5, decimals=3)
    whole = FishyscapesPixelAccumulator().update(scores, labels)
    parts = [FishyscapesPixelAccumulator().update(scores[k], labels[k]) for k in range(5)]
    restored = FishyscapesPixelAccumulator.from_state_dict(parts[0].state_dict())
    for part in parts[1:]:
        restored.merge(part)
    assert restored.compute() == whole.compute()
    assert np.isnan(FishyscapesPixelAccumulator().update(scores, np.zeros_like(labels)).compute()["auprc"])
    with pytest.raises(ValueError, match="NaN"):
        FishyscapesPixelAccumulator().update(np.full((2, 2), np.nan), np.zeros((2, 2), np.uint8))


# ---- CAOS' eval_ood.py, step by step --------------------------------------------------------------------------------

def caos_reference(scores, labels):
    """CAOS' per-frame metrics and their means: per frame with OOD and ID counted pixels, TP and FP at every
    distinct score from high to low; the ROC area by trapezoids from (0, 0); AP as recall steps times precision;
    FPR95 at the first distinct score, from the first of full recall up, whose recall is closest to 0.95."""
    rows = []
    for frame_scores, frame_labels in zip(scores, labels):
        keep = frame_labels != IGNORE
        s, gt = frame_scores[keep].astype(np.float64), frame_labels[keep] == OOD
        n_pos, n_neg = int(gt.sum()), int((~gt).sum())
        if not n_pos or not n_neg:
            continue
        tps, fps = [], []
        for v in sorted(set(s.tolist()), reverse=True):
            tps.append(int(np.sum(gt & (s >= v))))
            fps.append(int(np.sum(~gt & (s >= v))))
        tpr = [0.0] + [tp / n_pos for tp in tps]
        fpr = [0.0] + [fp / n_neg for fp in fps]
        auroc = sum((fpr[k] - fpr[k - 1]) * (tpr[k] + tpr[k - 1]) / 2 for k in range(1, len(tpr)))
        ap = sum((tpr[k] - tpr[k - 1]) * tps[k - 1] / (tps[k - 1] + fps[k - 1]) for k in range(1, len(tpr)))
        full = next(k for k in range(len(tps)) if tps[k] == n_pos)
        cutoff = min(range(full, -1, -1), key=lambda k: abs(tps[k] / n_pos - 0.95))  # (min: the first of equals)
        rows.append((auroc, ap, fps[cutoff] / n_neg))
    return dict(zip(CAOS_METRICS, np.mean(rows, axis=0)))


# What anomaly-seg's own functions (anom_utils.get_and_print_results, as eval_ood.py calls it, with the ignore
# pixels left out) return on the three literal frames: (AUROC, AP, FPR95) each.
CAOS_LITERAL_FRAMES = [(0.9635416666666666, 0.825, 0.19444444444444445),
                       (0.9559228650137741, 0.84688995215311, 0.24242424242424243),
                       (0.9512195121951219, 0.7142857142857143, 0.1951219512195122)]
# A frame where recall 0.9 lies closer to 0.95 than recall 1.0 does: CAOS takes its FPR at recall 0.9 (the lowest
# score of that recall), segood at the first threshold of TPR >= 0.95. anomaly-seg's code: (0.965,
# 0.9614285714285713, 0.1); segood's FPR95 0.4.
BELOW_SCORES = np.array([[.9, .9, .8, .8, .7, .7, .6, .6, .5, .2],
                         [.55, .2, .2, .2, .1, .1, .1, .05, .0, .0]], np.float32)
BELOW_LABELS = np.array([[1] * 10, [0] * 10], np.uint8)
CAOS_KEYS = (*CAOS_METRICS, "n_frames", "n_averaged_frames", "n_skipped_frames")


def test_caos_frame_metrics_equal_anomaly_segs_own_values():
    for frame_scores, frame_labels, want in zip(SCORES, LABELS, CAOS_LITERAL_FRAMES):
        assert caos_frame_metrics(frame_scores, frame_labels) == pytest.approx(want, abs=1e-15, rel=0)
    got = caos_frame_metrics(BELOW_SCORES, BELOW_LABELS)
    assert got == pytest.approx((0.965, 0.9614285714285713, 0.1), abs=1e-15, rel=0)
    assert exact_metrics(BELOW_SCORES, BELOW_LABELS)["fpr95"] == pytest.approx(0.4)
    # with ID scores between the last two OOD ones, recall 0.9 holds at four scores: CAOS takes the lowest (FPR
    # 0.5, not 0.1); anomaly-seg's code: (0.94, 0.9566666666666666, 0.5)
    spread = BELOW_SCORES.copy()
    spread[1, 1:5] = [.4, .3, .3, .25]
    assert caos_frame_metrics(spread, BELOW_LABELS) == pytest.approx((0.94, 0.9566666666666666, 0.5), abs=1e-15, rel=0)
    # integers a float64 cannot tell apart stay apart, as in anomaly-seg's sort: (0.75, 0.8333333333333333, 0.5)
    big = np.array([[2**62, 2**62 + 1], [0, 1]], np.int64)
    assert caos_frame_metrics(big, np.array([[0, 1], [0, 1]], np.uint8)) == pytest.approx(
        (0.75, 0.8333333333333333, 0.5), abs=1e-15, rel=0)
    acc = CAOSPixelAccumulator().update(SCORES, LABELS)
    assert_close(acc.compute(), dict(zip(CAOS_METRICS, np.mean(CAOS_LITERAL_FRAMES, axis=0))), CAOS_METRICS)


@pytest.mark.parametrize("case", ["literal", "random", "float32"])
def test_caos_pixel_metrics_equal_the_official_definition(case):
    from sklearn.metrics import average_precision_score, roc_auc_score

    scores, labels = {"literal": (SCORES, LABELS), "random": random_frames(7, n=5),
                      "float32": random_frames(8, n=5, decimals=12)}[case]
    if case == "float32":
        scores = scores.astype(np.float32)
    labels = labels.copy()
    labels[-1][labels[-1] == OOD] = 0  # a frame without OOD pixels: skipped, as CAOS skips it
    acc = CAOSPixelAccumulator()
    for s, lab in zip(scores, labels):
        acc.update(s, lab)
    got = acc.compute()
    assert_close(got, caos_reference(scores, labels), CAOS_METRICS)
    assert (got["n_frames"], got["n_averaged_frames"], got["n_skipped_frames"]) == (len(scores), len(scores) - 1, 1)
    for s, lab in zip(scores[:-1], labels[:-1]):  # scikit-learn's AUROC and AP, as CAOS calls them
        keep = lab != IGNORE
        auroc, ap, _ = caos_frame_metrics(s, lab)
        assert auroc == pytest.approx(roc_auc_score(lab[keep] == OOD, s[keep]), abs=1e-12)
        assert ap == pytest.approx(average_precision_score(lab[keep] == OOD, s[keep]), abs=1e-12)


def test_caos_state_resumes_merges_and_refuses_what_it_cannot_hold():
    scores, labels = random_frames(9, n=5, decimals=3)
    whole = CAOSPixelAccumulator().update(scores, labels).compute()
    parts = [CAOSPixelAccumulator().update(scores[k], labels[k]) for k in (4, 2, 0, 3, 1)]  # in another order
    restored = pixel_accumulator_from_state(parts[0].state_dict())
    for part in parts[1:]:
        restored.merge(part)
    assert restored.compute() == whole  # the means are exactly rounded sums: the frames' order does not matter
    empty = CAOSPixelAccumulator().update(scores, np.zeros_like(labels)).compute()
    assert np.isnan(empty["auroc"]) and empty["n_skipped_frames"] == 5
    nan = scores.copy()
    nan[0, 0, 0] = np.nan
    labels[0, 0, 0] = 0
    with pytest.raises(ValueError, match="1 counted pixels have NaN scores"):
        CAOSPixelAccumulator().update(nan, labels)
    state = restored.state_dict()
    with pytest.raises(ValueError, match="one row per frame not skipped"):
        CAOSPixelAccumulator.from_state_dict({**state, "values": state["values"][1:]})
    with pytest.raises(ValueError, match="one row per frame not skipped"):
        CAOSPixelAccumulator.from_state_dict({**state, "values": state["values"] + 2})
    with pytest.raises(ValueError, match="lacks 'pixels'"):
        CAOSPixelAccumulator.from_state_dict({k: v for k, v in state.items() if k != "pixels"})
    with pytest.raises(ValueError, match="'frames' must hold non-negative counts below 2"):  # (as uint64, 0 minus
        CAOSPixelAccumulator.from_state_dict({**state, "frames": np.array(  # them would wrap around to the rows)
            [0, 2**64 - len(state["values"])], np.uint64)})
    with pytest.raises(ValueError, match="one row per frame not skipped"):
        CAOSPixelAccumulator.from_state_dict({**state, "frames": np.array([0, 2], np.int64)})
    with pytest.raises(ValueError, match="'pixels' must hold non-negative counts below 2"):
        CAOSPixelAccumulator.from_state_dict({**state, "pixels": np.array([2**63 - 1] * 2, np.int64)})


# ---- SMIYC's SegEval, step by step ----------------------------------------------------------------------------------

def smiyc_components_reference(scores, labels, threshold, min_pred, min_gt):
    """SegEval: binarise with score > threshold, ignore pixels out of the prediction, 8-connected components of
    prediction and truth, predicted components under min_pred dropped, ground-truth components under min_gt to
    ignore (the OOD components only: the stated definition), then per ground-truth component its sIoU and per
    predicted component its precision on the pixels not ignored; TP / FN / FP per tau of np.linspace(0.25, 0.75,
    11), summed over frames."""
    eight = np.ones((3, 3), int)
    taus = np.linspace(0.25, 0.75, 11)
    tp, fn, fp = np.zeros(11, int), np.zeros(11, int), np.zeros(11, int)
    siou_all, ppv_all = [], []
    for frame_scores, frame_labels in zip(scores, labels):
        prediction = (frame_scores > threshold) & (frame_labels != 255)
        pred, n_pred = ndimage.label(prediction, eight)
        for c in range(1, n_pred + 1):
            if np.sum(pred == c) < min_pred:
                pred[pred == c] = 0
        truth, n_truth = ndimage.label(frame_labels == 1, eight)
        roi_labels = frame_labels.copy()
        for k in range(1, n_truth + 1):
            if np.sum(truth == k) < min_gt:
                roi_labels[truth == k] = 255
        roi = roi_labels != 255
        g, p = truth[roi], pred[roi]
        siou, ppv = [], []
        for k in np.unique(g[g > 0]):
            touching = np.unique(p[(g == k) & (p > 0)])
            in_touching = np.isin(p, touching)
            intersection = np.sum((g == k) & in_touching)
            adjustment = np.sum(in_touching & (g != 0) & (g != k))
            union = np.sum(in_touching) + np.sum(g == k) - intersection - adjustment
            siou.append(intersection / union)
        for c in np.unique(p[p > 0]):
            ppv.append(np.sum((p == c) & (g > 0)) / np.sum(p == c))
        for i, t in enumerate(taus):
            tp[i] += sum(v >= t for v in siou)
            fn[i] += sum(v < t for v in siou)
            fp[i] += sum(v < t for v in ppv)
        siou_all += siou
        ppv_all += ppv
    f1 = [2 * a / (2 * a + b + c) for a, b, c in zip(tp, fn, fp)]
    return {"siou": np.mean(siou_all), "ppv": np.mean(ppv_all), "f1_25": f1[0], "f1_50": f1[5], "f1_75": f1[10],
            "f1_star": np.mean(f1), "tp": tp.tolist(), "fn": fn.tolist(), "fp": fp.tolist()}


COMPONENT_KEYS = ("siou", "ppv", "f1_25", "f1_50", "f1_75", "f1_star")


@pytest.mark.parametrize("threshold, min_pred, min_gt", [(0.5, 3, 2), (0.5, 1, 1), (0.25, 4, 3), (0.9, 1, 2)])
def test_smiyc_component_metrics_equal_the_official_definition(threshold, min_pred, min_gt):
    acc = SMIYCComponentAccumulator(threshold, min_pred=min_pred, min_gt=min_gt)
    for s, lab in zip(SCORES, LABELS):
        acc.update(s, lab)
    got, want = acc.compute(), smiyc_components_reference(SCORES, LABELS, threshold, min_pred, min_gt)
    assert_close(got, want, COMPONENT_KEYS)
    assert (got["tp"], got["fn"], got["fp"]) == (want["tp"], want["fn"], want["fp"])
    assert got["taus"][7] == 0.6000000000000001 == SMIYC_TAUS[7]
    restored = SMIYCComponentAccumulator.from_state_dict(acc.state_dict())
    assert restored.compute() == got


def test_smiyc_components_differ_from_segoods_by_the_strict_comparison_only():
    """At threshold 0.5, where many scores sit: segood (>=) predicts them, SMIYC (>) does not; SMIYC's strict
    comparison at the next float below 0.5 predicts exactly what segood's does at 0.5."""
    ours = ComponentAccumulator(0.5, min_pred=3, min_gt=2)
    theirs = SMIYCComponentAccumulator(0.5, min_pred=3, min_gt=2)
    below = SMIYCComponentAccumulator(float(np.nextafter(0.5, 0.0)), min_pred=3, min_gt=2)
    for acc in (ours, theirs, below):
        acc.update(SCORES, LABELS)
    assert ours.compute()["fp"] != theirs.compute()["fp"]
    assert_close(below.compute(), ours.compute(), COMPONENT_KEYS)


def test_the_example_numbers_of_the_docs():
    """docs/official.md quotes these: six random 30 x 40 frames, segood's exact values and each official one."""
    scores, labels = random_frames(0, n=6, decimals=12)
    exact = exact_metrics(scores, labels)
    smiyc = smiyc_official(scores, labels)
    fishy = FishyscapesPixelAccumulator().update(scores, labels).compute()
    assert [round(r["auprc"], 4) for r in (exact, smiyc, fishy)] == [0.7637, 0.7642, 0.7637]
    assert [round(r["fpr95"], 4) for r in (exact, smiyc, fishy)] == [0.5199, 0.5186, 0.5199]
    # on the literal frames every bin holds one distinct value: SMIYC's curve is the exact one there
    assert_close(smiyc_official(SCORES, LABELS), exact_metrics(SCORES, LABELS), ("auprc", "fpr95"))


# What the official code itself returned on these frames (road-anomaly-benchmark: binary_confusion_matrix with
# 768 "percentiles" bins a frame, aggregate_dynamic_bins, curves_from_cmats; bdl-benchmark:
# calculate_metrics_perpixAP): SMIYC's values of PIXEL_KEYS, Fishyscapes' AP and FPR95.
OFFICIAL_CODE_VALUES = {
    "literal": ((0.8083333333333333, 0.20909090909090908, 0.5, 0.75, 0.75),
                (0.8083333333333333, 0.20909090909090908)),
    "random": ((0.7641733676269722, 0.5186348408710217, 0.339367054412, 0.5566682642739998, 0.6224677716390423),
               (0.7636993503798247, 0.519891122278057)),
    "random float16": ((0.7639605900940077, 0.5188442211055276, 0.33935546875, 0.5566406249999999,
                        0.6224677716390423), (0.7635323154493407, 0.519891122278057)),
}


@pytest.mark.parametrize("case", list(OFFICIAL_CODE_VALUES))
def test_official_modes_equal_the_official_codes_own_values(case):
    scores, labels = (SCORES, LABELS) if case == "literal" else random_frames(0, n=6, decimals=12)
    if case == "random float16":  # (as SMIYC's own files store maps)
        scores = scores.astype(np.float16)
    smiyc, fishy = OFFICIAL_CODE_VALUES[case]
    got = smiyc_official(scores, labels)
    assert [got[k] for k in PIXEL_KEYS] == pytest.approx(smiyc, abs=1e-15, rel=0)
    got = FishyscapesPixelAccumulator().update(scores, labels).compute()
    assert (got["auprc"], got["fpr95"]) == pytest.approx(fishy, abs=1e-15, rel=0)


def test_tau_of_six_tenths_is_the_official_linspaces():
    """sIoU = PPV = 3 / 5 = 0.6 exactly: at segood's tau 0.6 a true positive and no false positive; at SMIYC's
    0.6000000000000001 a false negative and a false positive."""
    labels = np.zeros((5, 8), np.uint8)
    labels[2, 1:4] = OOD  # 3 px
    scores = np.zeros(labels.shape)
    scores[2, 1:6] = 1.0  # 5 px: the 3 OOD ones and 2 ID ones; sIoU = 3 / (3 + 5 - 3), PPV = 3 / 5
    ours = ComponentAccumulator(0.5, min_pred=1, min_gt=1).update(scores, labels).compute()
    theirs = SMIYCComponentAccumulator(0.5, min_pred=1, min_gt=1).update(scores, labels).compute()
    assert (ours["tp"][7], ours["fn"][7], ours["fp"][7]) == (1, 0, 0)
    assert (theirs["tp"][7], theirs["fn"][7], theirs["fp"][7]) == (0, 1, 1)
    want = smiyc_components_reference(scores[None], labels[None], 0.5, 1, 1)
    assert (theirs["tp"], theirs["fn"], theirs["fp"]) == (want["tp"], want["fn"], want["fp"])
    assert_close(theirs, want, COMPONENT_KEYS)


# ---- in an evaluation: beside segood's numbers, which stay unchanged ------------------------------------------------

@pytest.fixture(scope="module")
def perlin(noise_sets):
    from networks import tiny_network

    sets = noise_sets(kinds=("perlin",), seed=2, side=64)
    return tiny_network(), sets / "perlin_mixed.h5"


def batch_scores(model, data, method, batch_size):
    """(scores, OOD masks) of a method on a set's frames, batch by batch as a run scores them (the network's floats
    depend on the batch)."""
    import torch

    from segood.data.h5 import H5SegmentationDataset
    from segood.methods import get_method
    from segood.models import preprocess

    items = list(H5SegmentationDataset(data))
    for start in range(0, len(items), batch_size):
        batch = {k: torch.stack([it[k] for it in items[start : start + batch_size]]) for k in ("image", "ood_mask")}
        yield get_method(method).score(model, preprocess(batch["image"]))[0], batch["ood_mask"]


def test_official_mode_in_an_evaluation_leaves_segoods_numbers_unchanged(perlin, tmp_path):
    from segood.evaluation import Evaluation, evaluate

    model, data = perlin
    options = {"components": {"preset": "obstacle", "thresholds": {"entropy": 0.001, "max_softmax": 0.9}},
               "batch_size": 2, "progress": False, "figures": False, "bootstrap": None}
    plain = evaluate(model, [data], ["entropy", "max_softmax"], tmp_path / "plain", **options)
    official = evaluate(model, [data], ["entropy", "max_softmax"], tmp_path / "smiyc", official="smiyc", **options)
    for m in ("entropy", "max_softmax"):
        mine, theirs = plain["results"][m]["perlin_mixed"], official["results"][m]["perlin_mixed"]
        assert "official" not in mine
        assert {k: v for k, v in theirs.items() if k != "official"} == mine  # segood's own numbers unchanged
        pixels, components = SMIYCPixelAccumulator(), SMIYCComponentAccumulator(
            options["components"]["thresholds"][m], "obstacle")
        for score, ood_mask in batch_scores(model, data, m, 2):
            pixels.update(score, ood_mask)
            components.update(score, ood_mask)
        want = pixels.compute()
        got = theirs["official"]
        assert got["label"] == "SMIYC official" and got["n_frames"] == want["n_frames"] == 4
        assert_close(got, want, PIXEL_KEYS)
        assert got["components"]["tp"] == components.compute()["tp"]
        assert got["components"]["taus"][7] == 0.6000000000000001
    text = (tmp_path / "smiyc" / "results.md").read_text()
    assert "| AUPRC (SMIYC official) |" in text and "sIoU / PPV / F1* (SMIYC official)" in text
    assert "SMIYC official" in (tmp_path / "smiyc" / "results.csv").read_text()
    restored = Evaluation.load(tmp_path / "smiyc" / "state.npz")
    assert restored.official == "smiyc"
    assert_close(restored.official_acc[("max_softmax", "perlin_mixed")].compute(),
                 official["results"]["max_softmax"]["perlin_mixed"]["official"], PIXEL_KEYS)
    with pytest.raises(ValueError, match="different run"):  # a folder of a run without the official mode
        evaluate(model, [data], ["entropy", "max_softmax"], tmp_path / "plain", official="smiyc", **options)
    with pytest.raises(ValueError, match="unknown official mode 'kitti'; choose one of smiyc, fishyscapes"):
        evaluate(model, [data], ["entropy"], tmp_path / "bad", official="kitti", **options)


def rectangle_set(path, frames=4):
    """A converted set whose every frame has ID and OOD pixels: a noise rectangle on a smooth scene."""
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    rng = np.random.default_rng(0)
    writer = SetWriter(path, (48, 96), {"source": "test", "split": "val"})
    for k in range(frames):
        image = np.repeat(np.linspace(0, 255, 96, dtype=np.uint8)[None, :, None], 48, 0).repeat(3, 2)
        ood = np.zeros((48, 96), np.uint8)
        ood[10 + k : 30, 20 : 50 + 5 * k] = OOD
        image[ood == OOD] = rng.integers(0, 256, (int(ood.sum()), 3), np.uint8)
        writer.append(Sample(image, ood, np.zeros_like(ood), f"scene/{k}"))
    writer.commit()
    return path


def test_caos_official_mode_reports_beside_segoods_per_image_means(perlin, tmp_path):
    from segood.evaluation import evaluate

    model, data = perlin[0], rectangle_set(tmp_path / "scenes.h5")
    doc = evaluate(model, [data], ["entropy"], tmp_path / "caos", official="caos", batch_size=2, progress=False,
                   figures=False, bootstrap=None)
    want = CAOSPixelAccumulator()
    for score, ood_mask in batch_scores(model, data, "entropy", 2):
        want.update(score, ood_mask)
    result = doc["results"]["entropy"]["scenes"]
    got = result["official"]
    assert got["label"] == "CAOS official" and got["n_averaged_frames"] == 4
    assert_close(got, want.compute(), CAOS_KEYS)
    text = (tmp_path / "caos" / "results.md").read_text()
    mine = result["per_image_mean"]
    assert "## CAOS official beside segood" in text and "segood's per-image means and the same metrics" in text
    assert (f"| entropy | scenes | {mine['auroc']:.4f} | {got['auroc']:.4f} | {mine['auprc']:.4f} | "
            f"{got['auprc']:.4f} | {mine['fpr95']:.4f} | {got['fpr95']:.4f} |") in text


def test_official_fishyscapes_from_the_command_line(perlin, tmp_path, capsys):
    from segood.cli import main
    from segood.evaluation import Evaluation
    from segood.models import save_checkpoint

    model, data = perlin
    save_checkpoint(tmp_path / "m.pt", model)
    args = ["evaluate", "--checkpoint", str(tmp_path / "m.pt"), "--sets", str(data), "--methods", "max_softmax",
            "-v", "--resamples", "0", "--out", str(tmp_path / "run"), "--official", "fishyscapes"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "## Fishyscapes official beside segood" in out and "| AUPRC (Fishyscapes official) |" in out
    ev = Evaluation.load(tmp_path / "run" / "state.npz")
    acc = ev.official_acc[("max_softmax", "perlin_mixed")]
    assert isinstance(acc, FishyscapesPixelAccumulator) and acc.n_frames == 4 and not ev.official_comp
    assert main([*args[:-1], "smiyc", "--resume"]) == 2  # the folder holds the Fishyscapes run
    assert "different run" in capsys.readouterr().err


def smiyc_maps(model, folder):
    """The entropy maps of :func:`rectangle_set`'s frames in SMIYC's layout under ``folder``: (the set, the maps'
    folder, [(the map as stored, float16; the frame's mask)])."""
    import h5py

    from segood.data.h5 import ood_masks
    from segood.evaluation.exchange import export_scores
    from segood.methods import get_method

    data = rectangle_set(folder / "scenes.h5")
    export_scores(model, {"scenes": data}, [get_method("entropy")], folder / "maps", layout="smiyc", progress=False)
    maps = folder / "maps" / "anomaly_p" / "entropy" / "scenes"
    frames = []
    for frame_id, mask in ood_masks(data):
        with h5py.File(maps / f"{frame_id.rsplit('/', 1)[-1]}.hdf5") as f:
            frames.append((f["value"][()], mask))
    return data, maps, frames


@pytest.mark.parametrize("official", ["smiyc", "caos"])
def test_official_numbers_of_score_maps_from_elsewhere(perlin, tmp_path, capsys, official):
    """segood score --official: the benchmark's own numbers of score maps in its layout, from the maps as stored
    (SMIYC's: float16)."""
    from segood.cli import main

    data, folder, frames = smiyc_maps(perlin[0], tmp_path)
    want = pixel_accumulator(official)
    for score, mask in frames:
        want.update(score, mask)
    assert main(["score", "--scores", str(folder), "--data", str(data), "--out", str(tmp_path / "run"), "--name",
                 "entropy", "--official", official]) == 0
    label = {"smiyc": "SMIYC official", "caos": "CAOS official"}[official]
    assert f"## {label} beside segood" in (tmp_path / "run" / "results.md").read_text()
    got = json.loads((tmp_path / "run" / "results.json").read_text())["results"]["entropy"]["scenes"]["official"]
    keys = CAOS_KEYS if official == "caos" else (*PIXEL_KEYS, "n_frames")
    assert_close(got, want.compute(), keys)
    assert main(["score", "--scores", str(folder), "--data", str(data), "--out", str(tmp_path / "run"), "--name",
                 "entropy"]) == 2  # the folder holds the run with the official mode
    assert "holds a different run" in capsys.readouterr().err


def test_component_metrics_of_score_maps_from_elsewhere(perlin, tmp_path, capsys):
    """segood score --components with thresholds tuned on the set (oracle, a second read of the maps): segood's and
    SMIYC's component metrics at the set's best pixel-F1 threshold, as computed here from the same maps."""
    from segood.cli import main
    from segood.evaluation import evaluate_score_maps
    from segood.metrics import make_accumulator
    from segood.metrics.thresholds import commit

    data, folder, frames = smiyc_maps(perlin[0], tmp_path)
    pixels = make_accumulator()
    for score, mask in frames:
        pixels.update(score, mask)
    threshold = commit(pixels.compute(), "f1")
    ours, theirs = ComponentAccumulator(threshold, "obstacle"), SMIYCComponentAccumulator(threshold, "obstacle")
    for score, mask in frames:
        ours.update(score, mask)
        theirs.update(score, mask)
    args = ["score", "--scores", str(folder), "--data", str(data), "--out", str(tmp_path / "run"), "--name",
            "entropy", "--official", "smiyc", "--components", "obstacle"]
    assert main(args) == 2 and "segood score evaluates one set" in capsys.readouterr().err
    with pytest.raises(ValueError, match="segood score evaluates one set"):  # committing on the set itself, in Python
        evaluate_score_maps(folder, data, tmp_path / "py", components={"preset": "obstacle", "commit_on": "scenes"})
    assert main([*args, "--component-thresholds", "oracle"]) == 0
    result = json.loads((tmp_path / "run" / "results.json").read_text())["results"]["entropy"]["scenes"]
    assert result["components"]["threshold"] == threshold and result["components"]["n_frames"] == 4
    assert_close(result["components"], ours.compute(), COMPONENT_KEYS)
    assert_close(result["official"]["components"], theirs.compute(), COMPONENT_KEYS)
    assert result["official"]["components"]["threshold_source"] == "oracle"


def test_a_killed_run_resumes_to_the_same_official_numbers(perlin, tmp_path, monkeypatch):
    from rawtrees import killed_after
    from segood.evaluation import evaluate

    model, data = perlin
    options = {"batch_size": 1, "progress": False, "figures": False, "bootstrap": None, "official": "smiyc",
               "components": {"preset": "obstacle", "thresholds": {"entropy": 0.001}}}
    whole = evaluate(model, [data], ["entropy"], tmp_path / "whole", **options)
    original = model.forward
    monkeypatch.setattr(model, "forward", killed_after(model, 2))
    with pytest.raises(KeyboardInterrupt):
        evaluate(model, [data], ["entropy"], tmp_path / "killed", save_every=1, **options)
    monkeypatch.setattr(model, "forward", original)
    resumed = evaluate(model, [data], ["entropy"], tmp_path / "killed", resume=True, **options)
    assert resumed["results"] == whole["results"]
    assert resumed["results"]["entropy"]["perlin_mixed"]["official"]["n_frames"] == 4


def _gather_worker(rank, world, out_dir):
    scores, labels = random_frames(6, n=5, decimals=3)
    for kind in (SMIYCPixelAccumulator, FishyscapesPixelAccumulator, CAOSPixelAccumulator):
        acc = kind()
        for k in range(rank, 5, world):  # rank 1 holds two frames, rank 0 three
            acc.update(scores[k], labels[k])
        acc.all_reduce().save(f"{out_dir}/{kind.__name__}_{rank}.npz")


def test_two_process_gloo_all_reduce_gives_every_rank_the_whole_set(tmp_path):
    from gloo import run_in_group

    run_in_group(_gather_worker, str(tmp_path))
    scores, labels = random_frames(6, n=5, decimals=3)
    for kind in (SMIYCPixelAccumulator, FishyscapesPixelAccumulator, CAOSPixelAccumulator):
        whole = kind()
        for k in range(5):
            whole.update(scores[k], labels[k])
        for rank in range(2):
            assert kind.load(tmp_path / f"{kind.__name__}_{rank}.npz").compute() == whole.compute()
