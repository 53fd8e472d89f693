"""Component-level metrics as SegmentMeIfYouCan defines them (Chan et al. 2021), streamed frame by frame.

For a binary prediction (score >= threshold) of one frame, in the official code's order:
1. ignore pixels are removed from the prediction;
2. predicted components: 8-connected components of what remains; those smaller than ``min_pred`` are dropped, their
   sizes counted with only the ignore pixels removed;
3. ground-truth components: 8-connected components of the OOD pixels; those smaller than ``min_gt`` pixels become
   ignore (in the truth and the prediction alike);
4. only then are sIoU and PPV measured, on the pixels not ignored. A predicted blob joined only through a small
   ground-truth component therefore stays one component (its pixels there no longer count); a predicted
   component left with no pixel is no component.
Presets: ``anomaly`` (min_pred 500, min_gt 100) and ``obstacle`` (50, 10).
- sIoU of a ground-truth component k: with K the union of the predicted components that touch k and A(k) the
  pixels of K in other ground-truth components, sIoU(k) = |k ∩ K| / |(k ∪ K) \\ A(k)| (0 when none touches k);
- PPV of a predicted component c: |c ∩ OOD| / |c|;
- for tau in 0.25, 0.30, ..., 0.75: TP = ground-truth components with sIoU >= tau, FN = the others, FP = predicted
  components with PPV < tau, summed over the set; F1_tau = 2 TP / (2 TP + FN + FP); F1* = their mean.

Memory is constant: per tau three counts, and the sums behind the mean sIoU and mean PPV. One frame's work is two
``cv2.connectedComponentsWithStats`` calls and one contingency table between the two labelings. SMIYC's own
computation where it differs (``score > threshold``, its tau values) is :mod:`segood.metrics.official`.
"""

import numbers

import cv2
import numpy as np

from segood.labels import IGNORE, OOD
from segood.metrics.state import Part

PRESETS = {"anomaly": {"min_pred": 500, "min_gt": 100}, "obstacle": {"min_pred": 50, "min_gt": 10}}
TAUS = tuple(round(0.25 + 0.05 * k, 2) for k in range(11))


def frame_components(prediction, ood_mask, *, min_pred, min_gt):
    """(sIoU per ground-truth component, PPV per predicted component) of one frame, in the order of the module
    docstring (SegmentMeIfYouCan's).

    Args:
        prediction: (H, W) bool, predicted OOD. ood_mask: (H, W) uint8, 0 ID / 1 OOD / 255 ignore.
    """
    ood_mask = np.asarray(ood_mask)
    valid = ood_mask != IGNORE
    # (1) + (2): predicted components with only the ignore pixels removed, the small ones dropped
    predicted = (np.asarray(prediction, bool) & valid).view(np.uint8)
    n_pred, pred_labels, pred_stats, _ = cv2.connectedComponentsWithStats(predicted, connectivity=8)
    big = pred_stats[:, cv2.CC_STAT_AREA] >= min_pred
    big[0] = False
    # (3): small ground-truth components become ignore, in the truth and the prediction
    n_gt, gt_labels, gt_stats, _ = cv2.connectedComponentsWithStats((ood_mask == OOD).view(np.uint8), connectivity=8)
    small = gt_stats[:, cv2.CC_STAT_AREA] < min_gt
    small[0] = False  # the background is no ground-truth component
    counted = valid & ~small[gt_labels]
    keep_gt = np.flatnonzero(~small)
    renumber = np.zeros(n_gt, np.int64)
    renumber[keep_gt] = np.arange(keep_gt.size)
    gt_labels, n_gt = np.where(counted, renumber[gt_labels], 0), keep_gt.size
    # (4): on the counted pixels only; a predicted component with none left is dropped
    pred_labels = np.where(counted & big[pred_labels], pred_labels, 0)
    area_left = np.bincount(pred_labels.ravel(), minlength=n_pred)
    kept = np.flatnonzero(area_left[1:] > 0) + 1
    renumber = np.zeros(n_pred, np.int64)
    renumber[kept] = np.arange(1, kept.size + 1)
    pred_labels = renumber[pred_labels]
    # contingency[k, c]: counted pixels of ground-truth component k (0: none) in predicted component c (0: none)
    contingency = np.bincount((gt_labels * (kept.size + 1) + pred_labels).ravel(),
                              minlength=n_gt * (kept.size + 1)).reshape(n_gt, kept.size + 1)[:, 1:]
    area_pred = contingency.sum(axis=0)
    in_truth = contingency[1:]  # (ground-truth components, predicted components)
    touches = in_truth > 0
    inter = in_truth.sum(axis=1)  # |k ∩ K|: k's pixels in the predicted components touching it
    union_area = touches @ area_pred  # |K|
    other = touches @ in_truth.sum(axis=0) - inter  # |A(k)|: K's pixels in other ground-truth components
    area_gt = np.bincount(gt_labels.ravel(), minlength=n_gt)[1:]
    denominator = area_gt + union_area - inter - other
    siou = np.divide(inter, denominator, out=np.zeros(n_gt - 1), where=denominator > 0)
    ppv = np.divide(in_truth.sum(axis=0), area_pred, out=np.zeros(kept.size), where=area_pred > 0)
    return siou, ppv


class ComponentAccumulator(Part):
    """Streaming component-level metrics at one score ``threshold`` (a pixel is predicted OOD iff its score
    >= threshold), for a ``preset`` (``anomaly`` or ``obstacle``) or explicit ``min_pred`` / ``min_gt``.

    ``threshold_source`` says where the threshold came from, and travels with the results: ``"committed"`` (chosen
    on a tuning set, the default and the honest choice) or ``"oracle"`` (the best on the test set itself, as
    SMIYC's own evaluation does; always reported as such).
    """

    taus = TAUS  #: the sIoU / PPV thresholds tau
    format = "segood.ComponentAccumulator/1"
    reductions = {"taus": "sum", "sums": "sum", "counts": "sum"}  # (the settings: the same in states that merge)
    strict = False  #: predicted OOD iff score > threshold (SMIYC's code) instead of score >= threshold

    def __init__(self, threshold, preset="anomaly", *, min_pred=None, min_gt=None, threshold_source="committed"):
        if preset not in PRESETS:
            raise ValueError(f"unknown preset {preset!r}; choose one of {sorted(PRESETS)}")
        if threshold_source not in ("committed", "oracle"):
            raise ValueError(f"threshold_source must be 'committed' or 'oracle', got {threshold_source!r}")
        if isinstance(threshold, (bool, np.bool_)) or not isinstance(threshold, numbers.Real) or threshold != threshold:
            raise ValueError(f"a component threshold must be a number (scores >= it are flagged), got {threshold!r}")
        self.threshold = float(threshold)
        self.min_pred = PRESETS[preset]["min_pred"] if min_pred is None else int(min_pred)
        self.min_gt = PRESETS[preset]["min_gt"] if min_gt is None else int(min_gt)
        self.threshold_source = threshold_source
        self.tp = np.zeros(len(self.taus), np.int64)
        self.fn = np.zeros(len(self.taus), np.int64)
        self.fp = np.zeros(len(self.taus), np.int64)
        self.siou_sum = self.ppv_sum = 0.0
        self.n_gt = self.n_pred = self.n_frames = 0

    def update(self, scores, labels):
        """Add frames: ``scores`` (H, W) or (N, H, W) real numbers (numpy or torch), ``labels`` the OOD masks."""
        scores, labels = (x.detach().cpu().numpy() if hasattr(x, "detach") else np.asarray(x) for x in (scores, labels))
        if scores.shape != labels.shape or scores.ndim not in (2, 3):
            raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be (H, W) or (N, H, W) alike")
        for score, label in zip(*((scores, labels) if scores.ndim == 3 else ([scores], [labels]))):
            score = np.asarray(score, np.float64)  # compared in float64, as the pixel metrics compare
            predicted = score > self.threshold if self.strict else score >= self.threshold
            siou, ppv = frame_components(predicted, label, min_pred=self.min_pred, min_gt=self.min_gt)
            taus = np.array(self.taus)[:, None]
            self.tp += (siou[None] >= taus).sum(axis=1)
            self.fn += (siou[None] < taus).sum(axis=1)
            self.fp += (ppv[None] < taus).sum(axis=1)
            self.siou_sum += float(siou.sum())
            self.ppv_sum += float(ppv.sum())
            self.n_gt += siou.size
            self.n_pred += ppv.size
            self.n_frames += 1
        return self

    def _check_mergeable(self, other):
        if type(other) is not type(self) or \
                (self.threshold, self.min_pred, self.min_gt) != (other.threshold, other.min_pred, other.min_gt):
            raise ValueError("cannot merge component accumulators with different thresholds or size filters")

    def state_dict(self):
        """The state as plain arrays: the settings (threshold, its source, the size filters), then the counts:
        (3, 11) int64 TP / FN / FP per tau, the two sums, the three counts."""
        return {"format": np.array(self.format), "threshold": np.array(self.threshold),
                "threshold_source": np.array(self.threshold_source),
                "sizes": np.array([self.min_pred, self.min_gt], np.int64),
                "taus": np.stack([self.tp, self.fn, self.fp]), "sums": np.array([self.siou_sum, self.ppv_sum]),
                "counts": np.array([self.n_gt, self.n_pred, self.n_frames], np.int64)}

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict`; every field is checked."""
        try:
            if str(np.asarray(state["format"])) != cls.format:
                raise ValueError(f"unknown state format {state['format']!r}; expected {cls.format!r}")
            sizes = np.asarray(state["sizes"])
            if sizes.shape != (2,) or not np.issubdtype(sizes.dtype, np.integer) or (sizes < 0).any():
                raise ValueError("'sizes' must be (min_pred, min_gt), non-negative integers")
            acc = cls(float(np.asarray(state["threshold"])), min_pred=int(sizes[0]), min_gt=int(sizes[1]),
                      threshold_source=str(np.asarray(state["threshold_source"])))
            return acc.load_state_dict(state)
        except KeyError as err:
            raise ValueError(f"{cls.__name__} state lacks {err}") from None

    def load_state_dict(self, arrays):
        """Restore :meth:`state_dict` output, checked (shapes, non-negative integer counts, finite sums)."""
        taus, sums, counts = (np.asarray(arrays[k]) for k in ("taus", "sums", "counts"))
        if taus.shape != (3, len(self.taus)) or counts.shape != (3,) or sums.shape != (2,) \
                or not (np.issubdtype(taus.dtype, np.integer) and np.issubdtype(counts.dtype, np.integer)) \
                or (taus < 0).any() or (counts < 0).any() or not np.isfinite(sums).all():
            raise ValueError("a component state must hold (3, 11) and (3,) non-negative counts and 2 finite sums")
        self.tp, self.fn, self.fp = (taus[k].astype(np.int64) for k in range(3))
        self.siou_sum, self.ppv_sum = (float(v) for v in sums)
        self.n_gt, self.n_pred, self.n_frames = (int(v) for v in counts)
        return self

    def compute(self):
        """mean sIoU, mean PPV, F1 at 0.25 / 0.50 / 0.75, F1* (NaN where undefined), the counts per tau, the
        threshold and where it came from."""
        denominator = 2 * self.tp + self.fn + self.fp
        f1 = np.divide(2 * self.tp, denominator, out=np.full(len(self.taus), np.nan), where=denominator > 0)
        return {"siou": self.siou_sum / self.n_gt if self.n_gt else float("nan"),
                "ppv": self.ppv_sum / self.n_pred if self.n_pred else float("nan"),
                "f1_25": float(f1[0]), "f1_50": float(f1[5]), "f1_75": float(f1[10]), "f1_star": float(np.mean(f1)),
                "taus": list(self.taus), "tp": self.tp.tolist(), "fn": self.fn.tolist(), "fp": self.fp.tolist(),
                "n_gt_components": self.n_gt, "n_pred_components": self.n_pred, "n_frames": self.n_frames,
                "threshold": self.threshold, "threshold_source": self.threshold_source,
                "min_pred": self.min_pred, "min_gt": self.min_gt}


def best_f1_threshold(result):
    """The pixel threshold of best pixel F1 = 2 TP / (2 TP + FP + FN) from a pixel accumulator's ``compute()``
    (the lowest of equals): SMIYC's choice on its test set; on a tuning set, a committed threshold."""
    tp, fp, fn = (np.asarray(result[k], np.float64) for k in ("tp", "fp", "fn"))
    f1 = np.divide(2 * tp, 2 * tp + fp + fn, out=np.zeros_like(tp), where=(2 * tp + fp + fn) > 0)
    return float(np.asarray(result["thresholds"])[int(np.argmax(f1))])
