"""Each benchmark's own computation of its numbers (the official mode), beside segood's exact definitions.

SegmentMeIfYouCan (Chan et al., "SegmentMeIfYouCan: A Benchmark for Anomaly Segmentation", NeurIPS 2021 Datasets
and Benchmarks; code: road-anomaly-benchmark, metrics ``PixBinaryClass`` and ``SegEval-*``) and Fishyscapes (Blum
et al., "The Fishyscapes Benchmark", IJCV 2021; code: bdl-benchmark, ``calculate_metrics_perpixAP``) compute their
leaderboard numbers in ways that differ slightly from the metric contract. This module follows their definitions,
step for step where it matters, so a run can report both. OOD is the positive class; higher score = more OOD.

SMIYC pixel metrics (``PixBinaryClass``):
- each frame is binned on its own: over the frame's counted pixels (label != 255), edges are the frame's minimum
  minus eps and maximum plus eps (eps = max(1% of the frame's range, 0.01)), and ``numpy.quantile`` (linear) of
  the OOD scores and of the ID scores at ``linspace(0, 1, min(384, pixels of the class))``, sorted, duplicates
  removed; a bin [e_i, e_i+1) (the last one closed) holds its pixels, and its threshold is its lower edge e_i;
- the set's curve runs over every frame's thresholds from high to low with cumulative counts, one point per
  distinct threshold (the counts of all frames at that threshold), preceded by (0, 0);
- AP = sum_k (recall_k - recall_k-1) * precision_k over that curve (precision 1 where nothing is predicted);
  FPR95 = the FPR at the first point whose TPR (a float quotient) is >= 0.95; also the threshold there and the
  threshold of best pixel F1 (the first of equals), which SMIYC uses to binarise for its component metrics.
SMIYC component metrics (``SegEval-*``): :func:`segood.metrics.components.frame_components` (its order is the
official one), with a pixel predicted OOD iff ``score > threshold`` and tau from ``np.linspace(0.25, 0.75, 11)``
(its seventh value is 0.6000000000000001; the other ten equal segood's).

Fishyscapes pixel metrics (``calculate_metrics_perpixAP``): scores are rounded to float32, every distinct float32
value of the counted pixels (labels 0 and 1) is a threshold; AP is the step sum up to the first threshold of full
recall (sklearn's old ``average_precision_score``); FPR95 = the FPR at the first threshold, from high to low and
after a (0, 0) point, whose TPR (a float quotient) is >= 0.95.

CAOS (Hendrycks et al., "Scaling Out-of-Distribution Detection for Real-World Settings", ICML 2022; code:
anomaly-seg, ``eval_ood.py`` and ``anom_utils.py``; StreetHazards and BDD-Anomaly) scores each frame on its own
and averages: per frame with OOD and ID pixels, scikit-learn's ``roc_auc_score`` (the trapezoidal ROC area over
the frame's distinct scores) and ``average_precision_score`` (AP = sum_k (recall_k - recall_k-1) * precision_k from
the highest score down), and its own ``fpr_and_fdr_at_recall``: over the distinct scores from the first of full
recall up, the first whose recall (a float quotient) is closest to 0.95 (so possibly below it), and its FPR; each
metric then the plain mean over those frames (frames with no OOD or no ID pixel are skipped).

Deliberate differences from the official code (each changes nothing on ordinary data, or the official result
there is an accident of implementation):
- SMIYC: where several frames share the highest threshold, the official curve keeps, besides the point with all
  of them, a partial point holding only the frame that ``np.argsort``'s unstable sort happens to put first (its
  index 0 survives the removal of repeated thresholds); that order is an implementation detail of numpy (and of
  the CPU's sort kernel), so segood keeps only the complete point. Below the top, repeated thresholds are
  collapsed exactly as there.
- SMIYC: scores are taken as float64 before binning (the official code bins in the score map's dtype, float16 for
  its files, so its quantiles and edges are rounded to that dtype); the component threshold is compared in
  float64 too (the official comparison rounds the threshold to the map's dtype).
- SMIYC: a frame without counted pixels is skipped and counted in ``n_skipped_frames`` (the official code raises
  on it); NaN or infinite scores at counted pixels are an error naming them (the official code cannot bin them).
- SMIYC components: the official ground-truth size filter loop also reaches label 0 (the background) and would
  make the whole background ignore on a frame whose background is smaller than ``min_gt``; segood follows the
  stated definition (only OOD components are filtered). The run's component threshold (committed, given, or
  tuned on the test set) is used; SMIYC's own is the ``best_f1_threshold`` of its pixel curve, reported with the
  official pixel metrics so it can be given (``--component-thresholds``).
- Fishyscapes: equal infinite scores are one tie group (the official ``np.diff`` of inf and inf is NaN, which
  splits them pixel by pixel in input order); NaN scores at counted pixels are an error.
- CAOS: its code has no ignore label (it counts every pixel that is not OOD as ID, void included); segood leaves
  pixels labelled ignore (255) out of their frame. The original protocols of StreetHazards and BDD-Anomaly
  (``--protocol original``) ignore none, as CAOS counts them. Infinite scores are ranked as the extremes they are
  (scikit-learn refuses them); NaN scores at counted pixels are an error. The means are exactly rounded sums
  (``math.fsum``), the same in any order of the frames (runs sharded over processes included).
- All: a metric is NaN (with the reason) where the set has no OOD or no ID pixel; the official code divides by
  zero there. Sums are taken in another order than the official code's, so values agree to about 1e-15.

The accumulators keep, per distinct threshold, the ID and OOD pixels (SMIYC: of the frames' bins, at most 768 a
frame; Fishyscapes: per distinct float32 score, at most 2^32), or (CAOS) the three metrics of each frame: states
add (merge, resume, shards) and save as plain arrays.
"""

import math

import numpy as np

from segood.labels import IGNORE, OOD
from segood.metrics.components import ComponentAccumulator
from segood.metrics.functional import _to_numpy, raise_bad_labels
from segood.metrics.state import Part, check_counts

BENCHMARKS = ("smiyc", "fishyscapes", "caos")
#: How each benchmark's numbers are named in reports: "AUPRC (SMIYC official)".
LABELS = {"smiyc": "SMIYC official", "fishyscapes": "Fishyscapes official", "caos": "CAOS official"}
#: The benchmarks that average their metrics over frames (compared with segood's per-image means, not the pooled).
PER_IMAGE = ("caos",)
CAOS_METRICS = ("auroc", "auprc", "fpr95")
SMIYC_NUM_BINS = 768  # road-anomaly-benchmark's PixBinaryClass: 768 "percentiles" bins per frame
SMIYC_TAUS = tuple(float(t) for t in np.linspace(0.25, 0.75, 11))
_MIN_CONSOLIDATE = 1 << 16


def check_benchmark(official):
    """``official`` checked: None or one of :data:`BENCHMARKS`; a ValueError naming the choices."""
    if official is not None and official not in BENCHMARKS:
        raise ValueError(f"unknown official mode {official!r}; choose one of {', '.join(BENCHMARKS)} (or None)")
    return official


# ---- the maths, as pure functions ----------------------------------------------------------------------------------

def _counted(scores, labels):
    """(float64 scores, bool OOD) of the counted pixels (label 0 or 1); labels outside {0, 1, 255} are an error."""
    scores, labels = (_host(x) for x in (scores, labels))
    if scores.shape != labels.shape:
        raise ValueError(f"scores have shape {scores.shape} but labels have shape {labels.shape}; they must match "
                         "pixel for pixel")
    if labels.size and ((labels != 0) & (labels != OOD) & (labels != IGNORE)).any():
        raise_bad_labels(labels)
    counted = labels != IGNORE
    return scores[counted], labels[counted] == OOD


def _host(x):
    """A numpy array of ``x`` (numpy, or a torch tensor on any device; dtypes numpy lacks become float32)."""
    return _to_numpy(x.detach().cpu()) if hasattr(x, "detach") else np.asarray(x)


def smiyc_frame_bins(scores, labels, *, num_bins=SMIYC_NUM_BINS):
    """One frame binned as SMIYC's ``PixBinaryClass`` bins it (its own "percentiles" edges).

    Args:
        scores: (H, W) real scores of one frame, higher = more OOD. labels: (H, W) 0 (ID), 1 (OOD), 255 (ignore).

    Returns:
        (thresholds, id_counts, ood_counts): the lower edge of each bin and its ID and OOD pixels (int64), bins
        with no pixel left out; empty arrays for a frame without counted pixels.
    """
    values, ood = _counted(scores, labels)
    if not values.size:
        return np.zeros(0), np.zeros(0, np.int64), np.zeros(0, np.int64)
    if np.issubdtype(values.dtype, np.floating) and not np.isfinite(values).all():
        bad = int(np.count_nonzero(~np.isfinite(values)))
        raise ValueError(f"{bad} counted pixels have NaN or infinite scores: SMIYC's per-frame bins need finite "
                         "scores (its own code cannot bin them either)")
    # each class sorted once (in its own dtype: the cast to float64 keeps the order), then as float64
    groups = [np.sort(values[mask]).astype(np.float64) for mask in (ood, ~ood)]
    lo, hi = min(g[0] for g in groups if g.size), max(g[-1] for g in groups if g.size)
    eps = max((hi - lo) * 1e-2, 1e-2)  # keeps the outer edges apart from the extremes
    parts = [np.array([lo - eps, hi + eps])]
    for group in groups:
        if group.size:
            parts.append(np.quantile(group, np.linspace(0, 1, min(num_bins // 2, group.size))))
    edges = np.unique(np.concatenate(parts))
    # np.histogram's bins [e_i, e_i+1), the last one closed, counted on the sorted classes
    ood_counts, id_counts = (np.diff(np.r_[np.searchsorted(g, edges[:-1], "left"),
                                           np.searchsorted(g, edges[-1:], "right")]) for g in groups)
    occupied = (id_counts + ood_counts) > 0
    return edges[:-1][occupied], id_counts[occupied].astype(np.int64), ood_counts[occupied].astype(np.int64)


def smiyc_pixel_metrics(thresholds, id_counts, ood_counts):
    """SMIYC's AP and FPR95 from the bins of a set's frames (:func:`smiyc_frame_bins`, concatenated or summed).

    Args:
        thresholds: (K,) float lower bin edges, in any order, repeats allowed (the bins of several frames).
        id_counts, ood_counts: (K,) the ID and OOD pixels of each bin.

    Returns:
        dict: ``auprc`` (↑, SMIYC's average precision), ``fpr95`` (↓), ``tpr95_threshold``, ``best_f1`` and
        ``best_f1_threshold`` (SMIYC's component threshold), ``n_id``, ``n_ood``, ``n_points`` (curve points);
        metrics NaN where the set has no OOD or no ID pixel.
    """
    keys, inverse = np.unique(np.asarray(thresholds, np.float64), return_inverse=True)
    fp_rel, tp_rel = (np.bincount(inverse, weights=np.asarray(c, np.float64), minlength=keys.size)
                      for c in (id_counts, ood_counts))
    n_id, n_ood = int(round(fp_rel.sum())), int(round(tp_rel.sum()))
    nan = float("nan")
    if n_id == 0 or n_ood == 0:
        return {"auprc": nan, "fpr95": nan, "tpr95_threshold": nan, "best_f1": nan, "best_f1_threshold": nan,
                "n_id": n_id, "n_ood": n_ood, "n_points": 0}
    keys, tp, fp = keys[::-1], np.cumsum(tp_rel[::-1]), np.cumsum(fp_rel[::-1])  # from high to low thresholds
    if tp[0] != 0 or fp[0] != 0:  # the curve starts at (0, 0), above the highest threshold
        keys, tp, fp = np.r_[keys[0] + 1, keys], np.r_[0.0, tp], np.r_[0.0, fp]
    if tp[-1] != n_ood or fp[-1] != n_id:  # and ends with every pixel predicted (always so when all are binned)
        keys, tp, fp = np.r_[keys, keys.max() - 1], np.r_[tp, n_ood], np.r_[fp, n_id]
    fn, tn = n_ood - tp, n_id - fp
    tpr, fpr = tp / (tp + fn), fp / (fp + tn)
    predicted = tp + fp
    precision = np.ones(tp.size)
    precision[predicted > 0] = tp[predicted > 0] / predicted[predicted > 0]
    f1 = 2 * tp / (2 * tp + fp + fn)
    at95 = int(np.searchsorted(tpr, 0.95))  # the first point with TPR >= 0.95 (float comparison, as SMIYC)
    fpr95, tpr95_threshold = (float(fpr[at95]), float(keys[at95])) if at95 < tpr.size else (1.0, 0.0)
    best = int(np.nanargmax(f1))
    return {"auprc": float(np.sum(np.diff(tpr) * precision[1:])), "fpr95": fpr95, "tpr95_threshold": tpr95_threshold,
            "best_f1": float(f1[best]), "best_f1_threshold": float(keys[best]), "n_id": n_id, "n_ood": n_ood,
            "n_points": int(tp.size)}


def fishyscapes_values(scores, labels):
    """(distinct float32 scores as float64, increasing; their ID pixels; their OOD pixels) of the counted pixels,
    as Fishyscapes ranks them (scores rounded to float32)."""
    values, ood = _counted(scores, labels)
    with np.errstate(over="ignore"):  # beyond the float32 range: ±inf, as the official cast gives
        return _distinct_counts(values.astype(np.float32), ood, "Fishyscapes'")


def _distinct_counts(values, ood, benchmark):
    """(distinct ``values``, increasing, as float64; their ID pixels; their OOD pixels): each class sorted and the
    two merged in the values' own dtype (integers beyond 2^53 stay apart). NaN values are an error naming
    ``benchmark``."""
    if values.dtype.kind == "f" and np.isnan(values).any():
        raise ValueError(f"{int(np.count_nonzero(np.isnan(values)))} counted pixels have NaN scores; {benchmark} "
                         "ranking of them is undefined")
    pieces = [_distinct(np.sort(values[~ood])), _distinct(np.sort(values[ood]))]
    zeros = [np.zeros(k.size, np.int64) for k, _ in pieces]
    keys, id_counts, ood_counts = _merge_sorted([pieces[0][0], pieces[1][0]], [np.stack([pieces[0][1], zeros[0]]),
                                                                             np.stack([zeros[1], pieces[1][1]])])
    return keys.astype(np.float64), id_counts, ood_counts


def fishyscapes_metrics(values, id_counts, ood_counts):
    """Fishyscapes' AP and FPR95 (bdl-benchmark ``calculate_metrics_perpixAP``) from the pixels per distinct
    float32 score.

    Args:
        values: (K,) distinct scores, increasing. id_counts, ood_counts: (K,) ID and OOD pixels of each.

    Returns:
        dict: ``auprc`` (↑, its average precision), ``fpr95`` (↓), ``n_id``, ``n_ood``, ``n_thresholds``; metrics
        NaN where the set has no OOD or no ID pixel.
    """
    values = np.asarray(values, np.float64)
    if values.size > 1 and not (np.diff(values) > 0).all():
        raise ValueError("values must be distinct and increasing (fishyscapes_values gives them so)")
    tps = np.cumsum(np.asarray(ood_counts, np.int64)[::-1]).astype(np.float64)  # from high to low thresholds
    fps = np.cumsum(np.asarray(id_counts, np.int64)[::-1]).astype(np.float64)
    n_ood, n_id = (int(v[-1]) if v.size else 0 for v in (tps, fps))
    if n_id == 0 or n_ood == 0:
        return {"auprc": float("nan"), "fpr95": float("nan"), "n_id": n_id, "n_ood": n_ood,
                "n_thresholds": int(values.size)}
    precision, recall = tps / (tps + fps), tps / n_ood
    full = int(np.searchsorted(tps, n_ood))  # the first threshold of full recall: the curve stops there
    precision, recall = np.r_[precision[full::-1], 1.0], np.r_[recall[full::-1], 0.0]
    auprc = -np.sum(np.diff(recall) * precision[:-1])
    tpr, fpr = np.r_[0.0, tps] / n_ood, np.r_[0.0, fps] / n_id  # from (0, 0)
    return {"auprc": float(auprc), "fpr95": float(fpr[np.searchsorted(tpr, 0.95)]), "n_id": n_id, "n_ood": n_ood,
            "n_thresholds": int(values.size)}


def caos_frame_metrics(scores, labels):
    """One frame's AUROC, AP and FPR95 as CAOS computes them (see the module docstring).

    Args:
        scores: real scores of one frame, any shape, higher = more OOD. labels: alike, 0 (ID), 1 (OOD), 255
            (ignore: left out).

    Returns:
        (auroc, auprc, fpr95) floats, or None where the frame has no OOD or no ID counted pixel (CAOS skips it).
    """
    values, ood = _counted(scores, labels)
    _, id_counts, ood_counts = _distinct_counts(values, ood, "CAOS'")
    n_ood = int(ood_counts.sum())
    n_id = ood.size - n_ood
    if not n_ood or not n_id:
        return None
    tps, fps = np.cumsum(ood_counts[::-1]), np.cumsum(id_counts[::-1])  # at or above each distinct score, high to low
    tpr, fpr = np.r_[0, tps] / n_ood, np.r_[0, fps] / n_id
    auroc = np.sum(np.diff(fpr) * (tpr[1:] + tpr[:-1])) / 2
    auprc = np.sum(np.diff(tpr) * (tps / (tps + fps)))
    full = int(np.searchsorted(tps, n_ood))  # the first score of full recall; CAOS looks from there up
    distance = np.abs(tps[: full + 1] / n_ood - 0.95)
    cutoff = full - int(np.argmin(distance[::-1]))  # the first closest in that order: the lower score of a tie
    return float(auroc), float(auprc), float(fps[cutoff] / n_id)


def _distinct(ordered):
    """(distinct values in their own dtype, how many times each) of a sorted array."""
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]]) if ordered.size else np.zeros(0, np.int64)
    return ordered[starts], np.diff(np.r_[starts, ordered.size]).astype(np.int64)


def _merge_sorted(keys, counts):
    """(keys, ID counts, OOD counts) of sorted key arrays ``keys`` (of one dtype) with their (2, K) ``counts``: one
    table, the counts of equal keys added (a stable sort merges the sorted runs in linear time per run)."""
    keys = np.concatenate([np.asarray(k) for k in keys])
    counts = np.concatenate(counts, axis=1) if counts else np.zeros((2, 0), np.int64)
    if not keys.size:
        return keys, np.zeros(0, np.int64), np.zeros(0, np.int64)
    order = np.argsort(keys, kind="stable")
    keys, counts = keys[order], counts[:, order]
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    merged = np.add.reduceat(counts, starts, axis=1)
    return keys[starts], merged[0], merged[1]


def _table(keys, counts):
    """(keys, (2, K) counts) of :func:`_merge_sorted`."""
    keys, id_counts, ood_counts = _merge_sorted([np.asarray(k, np.float64) for k in keys], counts)
    return keys, np.stack([id_counts, ood_counts])


# ---- streaming accumulators ----------------------------------------------------------------------------------------

class _CountsByKey:
    """Pixel counts (ID, OOD) per distinct float64 key, kept sorted; additions are buffered and consolidated when
    they outgrow the table (amortised O(n log n))."""

    def __init__(self):
        self.keys = np.zeros(0)
        self.counts = np.zeros((2, 0), np.int64)
        self._pending, self._pending_size = [], 0

    def add(self, keys, id_counts, ood_counts):
        if len(keys):
            self._pending.append((np.asarray(keys, np.float64), np.stack([id_counts, ood_counts]).astype(np.int64)))
            self._pending_size += len(keys)
            if self._pending_size > max(self.keys.size, _MIN_CONSOLIDATE):
                self.consolidate()

    def consolidate(self):
        if self._pending:
            self.keys, self.counts = _table([self.keys, *(k for k, _ in self._pending)],
                                            [self.counts, *(c for _, c in self._pending)])
            self._pending, self._pending_size = [], 0
        return self

    def arrays(self):
        self.consolidate()
        return {"keys": self.keys.copy(), "counts": self.counts.copy()}

    def load(self, keys, counts, *, finite):
        keys, counts = np.asarray(keys), np.asarray(counts)
        if keys.ndim != 1 or counts.shape != (2, keys.size) or not np.issubdtype(keys.dtype, np.floating) \
                or not np.issubdtype(counts.dtype, np.integer) or (counts < 0).any() or np.isnan(keys).any() \
                or (finite and not np.isfinite(keys).all()) or (keys.size > 1 and not (np.diff(keys) > 0).all()):
            raise ValueError("the thresholds must be increasing distinct floats" + (" (finite)" if finite else "")
                             + " with (2, thresholds) non-negative integer counts")
        self.keys, self.counts = keys.astype(np.float64), counts.astype(np.int64)
        self._pending, self._pending_size = [], 0
        return self


class _OfficialPixels(Part):
    """What the two pixel accumulators share: the counts per key, the protocol around them."""

    format = None
    finite_keys = True
    # the distinct keys differ between states: (thresholds, counts) merge as one table, and all-reduce by gathering
    reductions = {"frames": "sum", ("thresholds", "counts"): lambda k1, c1, k2, c2: _table([k1, k2], [c1, c2])}

    def reset(self):
        """Forget every count."""
        self.table = _CountsByKey()
        self.n_frames = self.n_skipped_frames = 0
        return self

    def settings(self):
        return {}

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle)."""
        arrays = self.table.arrays()
        return {"format": np.array(self.format), "thresholds": arrays["keys"], "counts": arrays["counts"],
                "frames": np.array([self.n_frames, self.n_skipped_frames], np.int64),
                **{k: np.array(v) for k, v in self.settings().items()}}

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict`; every field is checked."""
        try:
            if str(np.asarray(state["format"])) != cls.format:
                raise ValueError(f"unknown state format {state['format']!r}; expected {cls.format!r}")
            acc = cls(**{k: int(np.asarray(state[k])) for k in cls().settings()})
            acc.table.load(state["thresholds"], state["counts"], finite=cls.finite_keys)
            frames = np.asarray(state["frames"])
        except KeyError as err:
            raise ValueError(f"{cls.__name__} state lacks {err}") from None
        if frames.shape != (2,) or not np.issubdtype(frames.dtype, np.integer) or (frames < 0).any():
            raise ValueError(f"{cls.__name__} state: 'frames' must be two non-negative counts")
        acc.n_frames, acc.n_skipped_frames = (int(v) for v in frames)
        return acc


class SMIYCPixelAccumulator(_OfficialPixels):
    """SMIYC's pixel AP (↑) and FPR95 (↓), both in [0, 1] (Chan et al. 2021; ``PixBinaryClass``: per-frame binned
    curves), streamed frame by frame; see the module docstring for the definition and its deliberate differences.

    Example:
        >>> acc = SMIYCPixelAccumulator()
        >>> acc.update(scores, ood_mask)   # (H, W) or (N, H, W), higher = more OOD
        >>> acc.compute()["auprc"]
    """

    format = "segood.SMIYCPixelAccumulator/1"

    def __init__(self, num_bins=SMIYC_NUM_BINS):
        if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 2:
            raise ValueError(f"num_bins must be an int >= 2 (SMIYC's is {SMIYC_NUM_BINS}), got {num_bins!r}")
        self.num_bins = int(num_bins)
        self.reset()

    def settings(self):
        return {"num_bins": self.num_bins}

    def update(self, scores, labels):
        """Add frames: ``scores`` (H, W) or (N, H, W) real numbers (numpy or torch), ``labels`` the OOD masks alike.
        The state is unchanged when this raises."""
        scores, labels = (_host(x) for x in (scores, labels))
        if scores.shape != labels.shape or scores.ndim not in (2, 3):
            raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be (H, W) or (N, H, W) alike")
        frames = [smiyc_frame_bins(s, lab, num_bins=self.num_bins)
                  for s, lab in zip(*((scores, labels) if scores.ndim == 3 else ([scores], [labels])))]
        for keys, id_counts, ood_counts in frames:
            self.table.add(keys, id_counts, ood_counts)
            self.n_frames += 1
            self.n_skipped_frames += int(not keys.size)
        return self

    def compute(self):
        """:func:`smiyc_pixel_metrics` of the frames seen, with ``n_frames`` and ``n_skipped_frames``."""
        arrays = self.table.arrays()
        return {**smiyc_pixel_metrics(arrays["keys"], *arrays["counts"]), "n_frames": self.n_frames,
                "n_skipped_frames": self.n_skipped_frames}

    def __repr__(self):
        return f"SMIYCPixelAccumulator(num_bins={self.num_bins}, n_frames={self.n_frames})"


class FishyscapesPixelAccumulator(_OfficialPixels):
    """Fishyscapes' pixel AP (↑) and FPR95 (↓), both in [0, 1] (Blum et al. 2021; bdl-benchmark: every distinct
    float32 score a threshold), streamed; see the module docstring.

    Example:
        >>> acc = FishyscapesPixelAccumulator()
        >>> acc.update(scores, ood_mask)   # any shape, higher = more OOD
        >>> acc.compute()["fpr95"]
    """

    format = "segood.FishyscapesPixelAccumulator/1"
    finite_keys = False

    def __init__(self):
        self.reset()

    def update(self, scores, labels):
        """Add pixels (any shape; 3 or more dimensions count as frames along the first axis). The state is
        unchanged when this raises."""
        keys, id_counts, ood_counts = fishyscapes_values(scores, labels)
        self.table.add(keys, id_counts, ood_counts)
        shape = tuple(scores.shape) if hasattr(scores, "shape") else np.shape(scores)
        self.n_frames += int(shape[0]) if len(shape) >= 3 else 1
        return self

    def compute(self):
        """:func:`fishyscapes_metrics` of the pixels seen, with ``n_frames``."""
        arrays = self.table.arrays()
        return {**fishyscapes_metrics(arrays["keys"], *arrays["counts"]), "n_frames": self.n_frames}

    def __repr__(self):
        return f"FishyscapesPixelAccumulator(n_frames={self.n_frames})"


class CAOSPixelAccumulator(Part):
    """CAOS' AUROC (↑), AP (↑) and FPR95 (↓), each in [0, 1] (Hendrycks et al. 2022; anomaly-seg's
    ``eval_ood.py``: per frame, then averaged over the frames with OOD and ID pixels), streamed; see the module
    docstring.

    Example:
        >>> acc = CAOSPixelAccumulator()
        >>> acc.update(scores, ood_mask)   # (H, W) or (N, H, W), higher = more OOD
        >>> acc.compute()["auroc"]
    """

    format = "segood.CAOSPixelAccumulator/1"
    reductions = {"frames": "sum", "pixels": "sum", "values": "cat"}

    def __init__(self):
        self.reset()

    def reset(self):
        """Forget every frame."""
        self.values = np.zeros((0, len(CAOS_METRICS)))  # per frame averaged: AUROC, AP, FPR95
        self.n_frames = self.n_skipped_frames = self.n_id = self.n_ood = 0
        return self

    def update(self, scores, labels):
        """Add frames: ``scores`` (H, W) or (N, H, W) real numbers (numpy or torch), ``labels`` the OOD masks alike.
        The state is unchanged when this raises."""
        scores, labels = (_host(x) for x in (scores, labels))
        if scores.shape != labels.shape or scores.ndim not in (2, 3):
            raise ValueError(f"scores {scores.shape} and labels {labels.shape} must be (H, W) or (N, H, W) alike")
        if scores.ndim == 2:
            scores, labels = scores[None], labels[None]
        frames = [caos_frame_metrics(s, lab) for s, lab in zip(scores, labels)]
        rows = [f for f in frames if f is not None]
        if rows:
            self.values = np.concatenate([self.values, np.array(rows)])
        self.n_frames += len(frames)
        self.n_skipped_frames += len(frames) - len(rows)
        self.n_id += int(np.count_nonzero(labels == 0))
        self.n_ood += int(np.count_nonzero(labels == OOD))
        return self

    def compute(self):
        """The mean of each metric over the frames averaged (NaN where there is none), with ``n_frames``,
        ``n_averaged_frames``, ``n_skipped_frames`` and the counted pixels ``n_id``, ``n_ood``."""
        n = len(self.values)
        means = [math.fsum(column) / n if n else float("nan") for column in self.values.T]
        return {**dict(zip(CAOS_METRICS, means)), "n_id": self.n_id, "n_ood": self.n_ood, "n_frames": self.n_frames,
                "n_averaged_frames": n, "n_skipped_frames": self.n_skipped_frames}

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle)."""
        return {"format": np.array(self.format), "values": self.values.copy(),
                "frames": np.array([self.n_frames, self.n_skipped_frames], np.int64),
                "pixels": np.array([self.n_id, self.n_ood], np.int64)}

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict`; every field is checked."""
        try:
            if str(np.asarray(state["format"])) != cls.format:
                raise ValueError(f"unknown state format {state['format']!r}; expected {cls.format!r}")
            values, frames, pixels = (np.asarray(state[k]) for k in ("values", "frames", "pixels"))
        except KeyError as err:
            raise ValueError(f"{cls.__name__} state lacks {err}") from None
        for key, counts in (("frames", frames), ("pixels", pixels)):
            if counts.shape != (2,) or not np.issubdtype(counts.dtype, np.integer):
                raise ValueError(f"{cls.__name__} state: {key!r} must be two non-negative counts")
            check_counts(counts, key)
        n_frames, n_skipped = (int(v) for v in frames)  # (Python ints: unsigned counts cannot wrap around)
        if values.ndim != 2 or values.shape[1] != len(CAOS_METRICS) or not np.issubdtype(values.dtype, np.floating) \
                or not ((values >= -1e-12) & (values <= 1 + 1e-12)).all() or len(values) != n_frames - n_skipped:
            raise ValueError(f"{cls.__name__} state: 'values' must be (frames averaged, 3) floats in [0, 1], one row "
                             "per frame not skipped")
        acc = cls()
        acc.values = values.astype(np.float64)
        acc.n_frames, acc.n_skipped_frames = n_frames, n_skipped
        acc.n_id, acc.n_ood = (int(v) for v in pixels)
        return acc

    def __repr__(self):
        return f"CAOSPixelAccumulator(n_frames={self.n_frames})"


class SMIYCComponentAccumulator(ComponentAccumulator):
    """SMIYC's component metrics (Chan et al. 2021; ``SegEval-*``): :class:`ComponentAccumulator` (sIoU, PPV, F1*,
    all ↑ in [0, 1]) with a pixel predicted OOD iff ``score > threshold`` and tau from ``np.linspace(0.25, 0.75,
    11)``."""

    taus = SMIYC_TAUS
    strict = True
    format = "segood.SMIYCComponentAccumulator/1"


PIXEL_ACCUMULATORS = {"smiyc": SMIYCPixelAccumulator, "fishyscapes": FishyscapesPixelAccumulator,
                      "caos": CAOSPixelAccumulator}


def pixel_accumulator(official):
    """An empty official pixel accumulator for ``official`` (one of :data:`BENCHMARKS`)."""
    return PIXEL_ACCUMULATORS[check_benchmark(official)]()


def pixel_accumulator_from_state(state):
    """An official pixel accumulator from its ``state_dict`` (the format entry says which)."""
    form = str(np.asarray(state.get("format", "")))
    for cls in PIXEL_ACCUMULATORS.values():
        if form == cls.format:
            return cls.from_state_dict(state)
    raise ValueError(f"unknown official accumulator state format {form!r}; expected one of "
                     f"{[c.format for c in PIXEL_ACCUMULATORS.values()]}")
