"""The maths of the metric contract (docs/metric_engine.md) as pure functions.

OOD is the positive class and a higher score means "more OOD". Everything here works on per-threshold
counts, so the binned accumulator and the exact (sort-based) reference share one implementation.
"""

import warnings
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from segood.labels import ID, IGNORE, OOD
from segood.metrics._kernels import builtin_metrics
from segood.registry import Registry


class UndefinedMetricWarning(UserWarning):
    """A metric is NaN because the set has no OOD or no ID pixels."""


@dataclass(frozen=True)
class Curve:
    """Counts at increasing thresholds: what every metric is computed from.

    thresholds: (T,) strictly increasing. tp, fp: (T,) int64, OOD / ID pixels with ``score >= thresholds[k]``.
    n_ood, n_id: P and N (both > 0 when a metric is computed).
    """

    thresholds: np.ndarray
    tp: np.ndarray
    fp: np.ndarray
    n_ood: int
    n_id: int

    @property
    def tpr(self):
        return self.tp / self.n_ood

    @property
    def fpr(self):
        return self.fp / self.n_id


@dataclass(frozen=True)
class Metric:
    """A metric of the threshold curve, declared once: reports, CLI choices and the leaderboard read this.

    name: key in results and ``--rank-by``. label: title in tables. higher_is_better: its direction.
    from_curve: :class:`Curve` -> float. range: (lo, hi) of its values, None when unbounded (a claimed value
    outside is refused). worst_case: the metric of the worst arrangement of pixels sharing a bin, when it is not
    ``from_curve`` of the worst refined curve (AUPRC: OOD pixels as distinct values); see :func:`metric_bounds`.
    """

    name: str
    label: str
    higher_is_better: bool
    from_curve: Callable
    range: tuple | None = (0.0, 1.0)
    worst_case: Callable | None = None

    def arrow(self):
        return "↑" if self.higher_is_better else "↓"

    def in_range(self, value):
        """Whether ``value`` is a finite number this metric can take."""
        lo, hi = self.range or (-np.inf, np.inf)
        return bool(np.isfinite(value)) and lo <= value <= hi


def auroc(curve):
    """Area under the ROC: (0, 0) -> points in order of increasing FPR (decreasing threshold) -> (1, 1),
    trapezoids."""
    x = np.concatenate(([0.0], curve.fpr[::-1], [1.0]))
    y = np.concatenate(([0.0], curve.tpr[::-1], [1.0]))
    return float(np.sum(np.diff(x) * (y[1:] + y[:-1])) / 2)


def auprc(curve):
    """Average precision as a step sum over recall."""
    tpr = curve.tpr
    predicted = curve.tp + curve.fp
    precision = np.divide(curve.tp, predicted, out=np.ones(curve.tp.shape), where=predicted > 0)
    return float(np.sum((tpr - np.append(tpr[1:], 0.0)) * precision))


def fpr_at_tpr95(curve):
    """The smallest FPR with TPR >= 0.95, no interpolation; TPR compared in integers (20 TP >= 19 P), so no
    rounding decides which thresholds qualify."""
    return float(curve.fpr[20 * curve.tp >= 19 * curve.n_ood].min())


def iou_curve(curve):
    """TP / (TP + FP + FN) at every threshold (TP + FN = P)."""
    return curve.tp / (curve.n_ood + curve.fp)


def max_iou(curve):
    return float(np.max(iou_curve(curve)))


def auprc_distinct_worst(refined):
    """AUPRC of the worst arrangement with each OOD pixel a distinct value: in bin k (ID above OOD), the i-th OOD
    pixel has precision (a + i) / (c + i), a = TP above it, c = all pixels above it; summed in closed form
    sum_{i=1..n} (a + i) / (c + i) = n - (c - a) (psi(c + n + 1) - psi(c + 1))."""
    tp, fp = refined.tp, refined.fp
    a = np.append(tp[1:], 0).astype(np.float64)  # the refined curve alternates OOD groups and ID groups
    c = a + np.append(fp[1:], 0)
    n = (tp - np.append(tp[1:], 0)).astype(np.float64)
    spread = (n > 0) & (c > a)  # a group with no ID pixel above it has precision 1 throughout
    a, c, n_spread = a[spread], c[spread], n[spread]
    total = n[n > 0].sum() - np.sum((c - a) * _harmonic_gap(c, n_spread))
    return float(total / refined.n_ood)


#: Every metric segood reports, by name; ``register_metric(Metric(...))`` adds one (``docs/extending.md``). The
#: other values of a result (``n_id``, ``thresholds``, ...) are no metric's name.
METRICS = Registry("metric", reserved=("n_id", "n_ood", "n_ignored", "n_images", "n_images_total", "thresholds", "tp",
                                      "fp", "fn", "tn", "bounds", "exact", "max_iou_threshold", "per_image",
                                      "per_image_mean", "method", "set", "aggregation", "same_source_tuning",
                                      "same_source_oe"))
register_metric = METRICS.register
for _metric in (Metric("auroc", "AUROC", True, auroc),
                Metric("auprc", "AUPRC", True, auprc, worst_case=auprc_distinct_worst),
                Metric("fpr95", "FPR95", False, fpr_at_tpr95),
                Metric("max_iou", "MaxIoU", True, max_iou)):
    register_metric(_metric)
METRIC_NAMES = tuple(METRICS)  #: the built-in metrics (the paper's §4); what is registered now: ``METRICS``
_BUILTIN = dict(METRICS)


def get_metric(name: str) -> Metric:
    """The metric registered as ``name``; KeyError listing the valid names."""
    return METRICS[name]


def list_metrics(*, higher_is_better: bool | None = None) -> list[str]:
    """The names of the registered metrics, in registration order; ``higher_is_better`` filters by direction."""
    return [name for name, m in METRICS.items() if higher_is_better is None or m.higher_is_better == higher_is_better]


def refined_curves(hist):
    """(worst, best) :class:`Curve` of the two extreme orders of the pixels sharing a bin: every bin of ``hist``
    ((2, B): ID and OOD counts per bin, increasing thresholds) split in two sub-bins, its ID pixels above its OOD
    pixels (worst) or below them (best). The thresholds of the refined curves are their sub-bin indices.

    With TP_k, FP_k the counts at bin k's threshold, a bin's lower sub-bin has the point (FP_k, TP_k) either way
    and its upper one (FP_k, TP_{k+1}) when its ID pixels sit above (worst) or (FP_{k+1}, TP_k) when its OOD
    pixels do (best)."""
    hist = np.asarray(hist, dtype=np.int64)
    n_id, n_ood = (int(v) for v in hist.sum(axis=1))
    fp, tp = (np.cumsum(row[::-1])[::-1] for row in hist)
    fp_next, tp_next = np.append(fp[1:], 0), np.append(tp[1:], 0)
    steps = np.arange(2 * tp.size, dtype=np.float64)

    def interleave(lower, upper):
        return np.stack([lower, upper], axis=1).ravel()

    worst = Curve(steps, interleave(tp, tp_next), interleave(fp, fp), n_ood, n_id)
    best = Curve(steps, interleave(tp, tp), interleave(fp, fp_next), n_ood, n_id)
    return worst, best


def metric_bounds(hist):
    """{metric: (lo, hi)}: where the exact-mode value lies given only the binned counts ``hist`` (2, B) — between
    the metric of the worst and of the best order of the pixels sharing a bin (the metric contract, "Error bounds
    of binned metrics"); NaN where undefined."""
    hist = np.asarray(hist, dtype=np.int64)
    if not hist.size:
        return {name: (float("nan"), float("nan")) for name in METRICS}
    fp, tp = (np.cumsum(row[::-1])[::-1] for row in hist)
    steps = np.arange(tp.size, dtype=np.float64)
    return metrics_from_counts(steps, tp, fp, tp[0], fp[0], warn=False, bounds=True)["bounds"]


def refined_bounds(hist, metrics=None):
    """:func:`metric_bounds` the generic way, for ``metrics`` (default: every registered one): each metric of the
    two refined curves, built as arrays (the reference the built-ins' one-pass kernel is tested against)."""
    worst, best = refined_curves(hist)
    bounds = {}
    for name, metric in (METRICS if metrics is None else metrics).items():
        low_side = (metric.worst_case or metric.from_curve)(worst)
        high_side = metric.from_curve(best)
        bounds[name] = (min(low_side, high_side), max(low_side, high_side))
    return bounds


def _harmonic_gap(c, n):
    """sum_{i=1..n} 1 / (c + i) for arrays c >= 0, n >= 1: psi(c + n + 1) - psi(c + 1), as log1p and the
    asymptotic series of psi(x) - ln(x) (after shifting x up to 20 with psi(x) = psi(x + 1) - 1 / x)."""
    a, b = np.asarray(c, np.float64) + 1.0, np.asarray(c, np.float64) + np.asarray(n, np.float64) + 1.0
    return np.log1p((b - a) / a) + _psi_minus_log(b) - _psi_minus_log(a)


def _psi_minus_log(x):
    x = np.array(x, dtype=np.float64)
    result = np.zeros_like(x)
    small = np.flatnonzero(x < 20.0)  # shifted up to 20 first: psi(x) - ln x = [psi(x + J) - ln(x + J)]
    if small.size:  # + ln((x + J) / x) - sum_{j<J} 1 / (x + j)
        xs = x[small]
        shift = np.ceil(20.0 - xs)
        terms = np.arange(20.0)[None, :]
        result[small] = np.log1p(shift / xs) - np.where(terms < shift[:, None], 1.0 / (xs[:, None] + terms), 0.0).sum(1)
        x[small] += shift
    inv2 = 1.0 / (x * x)
    return result - 0.5 / x - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))


def metrics_from_counts(thresholds, tp, fp, n_ood, n_id, *, warn=True, bounds=False):
    """Every registered metric (:data:`METRICS`) from counts at increasing thresholds (the paper's §4).

    Args:
        thresholds: float array of shape (T,), strictly increasing.
        tp, fp: int arrays of shape (T,): OOD / ID pixels with ``score >= thresholds[k]``.
        n_ood, n_id: P and N, the numbers of OOD and ID pixels.
        warn: emit an :class:`UndefinedMetricWarning` when the metrics are undefined.
        bounds: also return ``bounds`` = {metric: (lo, hi)}, as :func:`metric_bounds` of the histogram whose
            reverse cumulative sums ``tp`` and ``fp`` are.

    The built-in four are computed in one numba pass (:func:`_kernels.builtin_metrics`, tested equal to their
    definitions here), any other registered metric by its definition.

    Returns:
        dict with ``auroc`` (↑), ``auprc`` (↑, average precision as a step sum), ``fpr95`` (↓, smallest FPR
        with TPR >= 0.95, no interpolation), ``max_iou`` (↑), any other registered metric, and
        ``max_iou_threshold`` (the lowest threshold attaining the MaxIoU); all NaN when ``n_ood == 0`` or
        ``n_id == 0``.
    """
    n_ood, n_id = int(n_ood), int(n_id)
    if n_ood == 0 or n_id == 0:
        if warn:
            missing = "OOD (label 1)" if n_ood == 0 else "ID (label 0)"
            warnings.warn(
                f"metrics are undefined (NaN): the data hold no {missing} pixels "
                f"({n_ood} OOD, {n_id} ID counted)",
                UndefinedMetricWarning,
                stacklevel=3,
            )
        result = {name: float("nan") for name in (*METRICS, "max_iou_threshold")}
        if bounds:
            result["bounds"] = {name: (float("nan"), float("nan")) for name in METRICS}
        return result
    thresholds, tp, fp = np.asarray(thresholds), np.asarray(tp, dtype=np.int64), np.asarray(fp, dtype=np.int64)
    values = builtin_metrics(tp, fp, n_ood, n_id, bounds)  # the built-in four in one numba pass
    fast = {name: q for q, name in enumerate(METRIC_NAMES) if METRICS.get(name) is _BUILTIN[name]}
    curve = Curve(thresholds, tp, fp, n_ood, n_id)
    result = {name: float(values[fast[name]]) if name in fast else metric.from_curve(curve)
              for name, metric in METRICS.items()}
    result["max_iou_threshold"] = float(thresholds[int(values[4])])
    if bounds:
        others = {name: metric for name, metric in METRICS.items() if name not in fast}
        slow = refined_bounds(np.stack([fp - np.append(fp[1:], 0), tp - np.append(tp[1:], 0)]), others) if others else {}
        result["bounds"] = {name: (float(values[5 + 2 * fast[name]]), float(values[6 + 2 * fast[name]]))
                            if name in fast else (min(slow[name][0], result[name]), max(slow[name][1], result[name]))
                            for name in METRICS}  # the value itself too, as the kernel's intervals hold it
    return result


def as_numpy_inputs(scores, labels, *, keep_float32_exact=False, keep_float16=False):
    """Validate shapes and dtypes and return flat numpy views: (float32/float64 scores, uint8 labels).

    Other score dtypes become float64 (exact for float16 and integers up to 2**53), or float32 with
    ``keep_float32_exact`` where that is exact too (float16, 8- and 16-bit integers, bool); float16 scores stay
    float16 with ``keep_float16`` (for kernels that read their bits).

    Raises:
        ValueError: on a shape mismatch. TypeError: on non-integer labels.
    """
    scores, labels = _to_numpy(scores), _to_numpy(labels)
    if scores.shape != labels.shape:
        raise ValueError(
            f"scores have shape {scores.shape} but labels have shape {labels.shape}; "
            "they must match pixel for pixel"
        )
    if scores.dtype not in (np.float32, np.float64) and not (keep_float16 and scores.dtype == np.float16):
        if not (np.issubdtype(scores.dtype, np.floating) or np.issubdtype(scores.dtype, np.integer)
                or scores.dtype == bool):
            raise TypeError(f"scores must be real numbers (float or integer), got dtype {scores.dtype}"
                            + (": take the real part or the magnitude first" if np.iscomplexobj(scores) else ""))
        small = scores.dtype.itemsize <= 2 or scores.dtype == bool  # float16, (u)int8/16, bool: exact in float32
        scores = scores.astype(np.float32 if keep_float32_exact and small else np.float64)
    if labels.dtype != np.uint8:
        if labels.dtype == bool:
            labels = labels.astype(np.uint8)
        elif not np.issubdtype(labels.dtype, np.integer):
            raise TypeError(
                f"labels must be an integer OOD mask (0 ID, 1 OOD, 255 ignore), got dtype {labels.dtype}"
            )
        else:
            if labels.size and (labels.min() < 0 or labels.max() > IGNORE):
                raise_bad_labels(labels)
            labels = labels.astype(np.uint8)
    return np.ravel(scores), np.ravel(labels)


def raise_bad_labels(labels):
    """Raise the ValueError that names the label values outside {0, 1, 255}."""
    values = np.unique(np.asarray(labels))
    bad = [int(v) for v in values if v not in (ID, OOD, IGNORE)]
    shown = ", ".join(map(str, bad[:10])) + (", ..." if len(bad) > 10 else "")
    raise ValueError(
        f"labels contain values {{{shown}}}; expected 0 (ID), 1 (OOD), 255 (ignore) — "
        "did you pass Cityscapes labelIds or trainIds instead of an OOD mask?"
    )


def raise_bad_scores(scores, labels, lo, hi, clip):
    """Raise the ValueError that counts the NaN / out-of-range scores among counted pixels."""
    s = np.asarray(scores, dtype=np.float64)[np.asarray(labels) <= OOD]
    nan = np.isnan(s)
    finite = s[~nan]
    outside = int(np.count_nonzero((finite < lo) | (finite > hi)))
    # shortest round-trip text: a score of 1.0000001 must not read as "max 1" beside a range of [0, 1]
    seen = f"min {float(finite.min())!r}, max {float(finite.max())!r}" if finite.size else "no finite score"
    if clip:
        raise ValueError(f"{int(nan.sum())} of {s.size} counted pixels have NaN scores; clipping (clip=True, "
                         "--clip) cannot fix NaN")
    raise ValueError(
        f"{outside + int(nan.sum())} of {s.size} counted pixels have scores outside [{lo:g}, {hi:g}] or NaN "
        f"({outside} out of range, {int(nan.sum())} NaN; {seen}). Rescale the scores, set "
        "score_range=(lo, hi) (--score-range LO HI) to match them, or pass clip=True (--clip) to clip finite scores "
        "into the range."
    )


def exact_metrics(scores, labels):
    """Exact metrics: every distinct score is a threshold (sort-based, O(n log n) time, O(n) memory).

    The reference for small data and for tests; equals scikit-learn's ``roc_auc_score`` and
    ``average_precision_score``. Direction: higher score = more OOD.

    Args:
        scores: real array, any shape (±inf allowed, NaN refused). labels: same shape, 0 (ID), 1 (OOD), 255 (ignore).

    Returns:
        dict: auroc, auprc, fpr95, max_iou, max_iou_threshold, n_id, n_ood, n_ignored.
    """
    curve, n_ignored = exact_curve(scores, labels)
    result = metrics_from_counts(curve.thresholds, curve.tp, curve.fp, curve.n_ood, curve.n_id)
    result.update(n_id=curve.n_id, n_ood=curve.n_ood, n_ignored=n_ignored)
    return result


def exact_curve(scores, labels):
    """(:class:`Curve` with every distinct score of a counted pixel as a threshold, number of ignored pixels):
    the sort behind :func:`exact_metrics`. Arguments as there."""
    scores, labels = as_numpy_inputs(scores, labels)
    counted = labels <= OOD
    if np.any(labels[~counted] != IGNORE):
        raise_bad_labels(labels)
    s = scores[counted].astype(np.float64)
    if np.isnan(s).any():
        raise ValueError(f"{int(np.count_nonzero(np.isnan(s)))} counted pixels have NaN scores; every other real "
                         "value, ±inf included, is a threshold")
    is_ood = labels[counted] == OOD
    thresholds, hist = distinct_score_counts(s[~is_ood], s[is_ood])
    fp, tp = (np.cumsum(row[::-1])[::-1] for row in hist)
    n_ood = int(is_ood.sum())
    return Curve(thresholds, tp, fp, n_ood, s.size - n_ood), int(labels.size - s.size)


def distinct_score_counts(id_scores, ood_scores):
    """Every distinct score a threshold: (thresholds (D,) float64, the distinct values increasing; hist (2, D)
    int64, the ID and OOD pixels scoring exactly each value). O(n log n): each class sorted once (in its own
    dtype), then the two runs of distinct values merged.

    Args:
        id_scores, ood_scores: 1-D real arrays (no NaN; ±inf are values like any other), the scores of the ID
            and of the OOD pixels. Values are compared as float64 (-0.0 equals +0.0).
    """
    values, counts = [], []
    for part in (id_scores, ood_scores):
        part = np.sort(np.ravel(part))  # float32 stays float32: its order and ties are float64's
        starts = np.flatnonzero(part[1:] != part[:-1]) + 1 if part.size else np.zeros(0, np.intp)
        starts = np.concatenate([[0], starts]) if part.size else starts
        values.append(part[starts].astype(np.float64))
        counts.append(np.diff(np.append(starts, part.size)))
        del part
    merged = np.sort(np.concatenate(values), kind="stable")  # two sorted runs: a merge
    thresholds = merged[np.append(True, merged[1:] != merged[:-1])] if merged.size else merged
    del merged
    hist = np.zeros((2, thresholds.size), np.int64)
    for row, (v, c) in enumerate(zip(values, counts)):
        hist[row, np.searchsorted(thresholds, v)] = c
    return thresholds, hist


def _to_numpy(x):
    """numpy view of a numpy array or CPU torch tensor (copies only dtypes numpy lacks, e.g. bfloat16)."""
    if type(x).__module__.startswith("torch"):
        x = x.detach()
        if x.device.type != "cpu":
            raise ValueError(f"expected a CPU tensor here, got one on {x.device}")
        if x.dtype.is_floating_point and x.dtype not in (_torch().float32, _torch().float64):
            x = x.float()
        return x.numpy()
    return np.asarray(x)


def _torch():
    import torch

    return torch
