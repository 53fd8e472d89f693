"""Is the win real? Image-level bootstrap intervals and paired comparisons from compact per-image counts.

Each image's ID / OOD counts are kept on a coarse float-order grid (relative threshold spacing 2^-5, 32 bins per
binade: the float-order key of a bin's threshold shifted right by 52 - 5 bits), sparse (only occupied bins,
20 bytes each), beside the image's own metric values. A resample draws images with replacement (seeded),
pools their coarse counts and recomputes every metric with :func:`metrics_from_counts`; the percentile interval
is reported with its seed and number of resamples. Methods of one set are resampled with the same images, so
their differences are paired. Coarsening moves each resampled metric by at most the coarse grid's binning bound
(:func:`metric_bounds`), which is reported beside the intervals (``coarsening``); given the fine grid's values
of the whole set, every resampled value is shifted by (fine - coarse) of the whole set, which removes the
coarsening's systematic part (an FPR95 read on coarse bins is biased upwards), so intervals sit around the
reported values.
"""

from dataclasses import dataclass

import numba
import numpy as np

from segood.metrics.functional import METRICS, metric_bounds, metrics_from_counts
from segood.metrics.state import check_counts

COARSE_BITS = 5
RESAMPLES = 1000
CONFIDENCE = 0.95


def coarse_keys(thresholds, bits=COARSE_BITS):
    """The coarse float-order bin of each threshold: order-preserving int64 key >> (52 - bits)."""
    raw = (np.asarray(thresholds, np.float64) + 0.0).view(np.int64)  # + 0.0: -0.0 is +0.0
    return (raw ^ ((raw >> 63) & 0x7FFFFFFFFFFFFFFF)) >> (52 - bits)


@numba.njit(nogil=True, cache=True)
def coarse_counts(thresholds, hist, bits=COARSE_BITS):
    """(keys (b,) int64, counts (b, 2) int64): ``hist`` (2, B) at increasing ``thresholds`` summed per coarse bin
    (:func:`coarse_keys`), the bins that hold a pixel, in one pass."""
    raw = thresholds.view(np.int64)
    keys = np.empty(raw.size, np.int64)
    counts = np.zeros((raw.size, 2), np.int64)
    b = -1
    for i in range(raw.size):
        r = raw[i] if raw[i] != np.int64(-0x8000000000000000) else np.int64(0)  # -0.0 is +0.0
        key = (r ^ ((r >> 63) & np.int64(0x7FFFFFFFFFFFFFFF))) >> (52 - bits)
        if b < 0 or key != keys[b]:
            b += 1
            keys[b] = key
        counts[b, 0] += hist[0, i]
        counts[b, 1] += hist[1, i]
    occupied = (counts[: b + 1, 0] != 0) | (counts[: b + 1, 1] != 0)
    return keys[: b + 1][occupied], counts[: b + 1][occupied]


class ImageCounts:
    """Per image: its counts on the coarse grid (keys increasing, counts (b, 2) ID/OOD) and its metric values
    (NaN where undefined). Plain arrays in and out; states merge by concatenation (their reductions:
    :data:`segood.metrics.streaming.SHARED_REDUCTIONS`)."""

    def __init__(self, names):
        self.names = tuple(names)  # the metrics of the values' columns
        self.keys, self.counts, self.values = [], [], []

    def __len__(self):
        return len(self.keys)

    def add(self, thresholds, hist, values):
        """One image: ``hist`` (2, B) ID/OOD counts at increasing ``thresholds`` (B,); ``values`` its metrics."""
        keys, counts = coarse_counts(np.ascontiguousarray(thresholds, np.float64), np.asarray(hist))
        self.keys.append(keys.astype(np.int32))
        self.counts.append(counts)
        self.values.append(np.asarray(values, np.float64).reshape(len(self.names)))

    def arrays(self):
        sizes = [k.size for k in self.keys]
        return {"image_offsets": np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                "image_keys": np.concatenate(self.keys) if self.keys else np.zeros(0, np.int32),
                "image_counts": np.concatenate(self.counts) if self.counts else np.zeros((0, 2), np.int64),
                "image_values": np.array(self.values, np.float64).reshape(len(self.values), len(self.names))}

    @classmethod
    def from_arrays(cls, state, names):
        """Rebuild from :meth:`arrays`; every field checked (offsets, increasing keys, counts, value shapes)."""
        offsets, keys = np.asarray(state["image_offsets"]), np.asarray(state["image_keys"])
        counts, values = np.asarray(state["image_counts"]), np.asarray(state["image_values"])
        n = offsets.size - 1
        if offsets.ndim != 1 or n < 0 or offsets[0] != 0 or np.any(np.diff(offsets) < 0) or offsets[-1] != keys.size \
                or not np.issubdtype(offsets.dtype, np.integer):
            raise ValueError("accumulator state 'image_offsets' must rise from 0 to the number of image keys")
        if keys.ndim != 1 or not np.issubdtype(keys.dtype, np.integer) or counts.shape != (keys.size, 2) \
                or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError("accumulator state 'image_keys' / 'image_counts' must be integers of shapes (b,), (b, 2)")
        if values.shape != (n, len(names)) or not np.issubdtype(values.dtype, np.floating) or np.isinf(values).any():
            raise ValueError(f"accumulator state 'image_values' must be finite floats or NaN of shape ({n}, {len(names)})")
        check_counts(counts, "image_counts")
        images = cls(names)
        for k in range(n):
            part = slice(offsets[k], offsets[k + 1])
            if np.any(np.diff(keys[part]) <= 0):
                raise ValueError(f"accumulator state 'image_keys' of image {k} must increase")
            images.keys.append(keys[part].astype(np.int32))
            images.counts.append(counts[part].astype(np.int64))
            images.values.append(values[k].astype(np.float64))
        return images

    def totals(self):
        """(ID, OOD) pixels over all images."""
        return tuple(int(sum(int(c[:, j].sum()) for c in self.counts)) for j in (0, 1))

    def dense(self):
        """(union of keys (U,), counts (n_images, U, 2) as float64) for resampling by matrix products."""
        union = np.unique(np.concatenate(self.keys)) if self.keys else np.zeros(0, np.int32)
        out = np.zeros((len(self.keys), union.size, 2))
        for k, (keys, counts) in enumerate(zip(self.keys, self.counts)):
            out[k, np.searchsorted(union, keys)] = counts
        return union, out


@dataclass(frozen=True)
class Bootstrap:
    """The settings, reported with every interval."""

    resamples: int = RESAMPLES
    seed: int = 0
    confidence: float = CONFIDENCE

    def __post_init__(self):
        if isinstance(self.resamples, bool) or not isinstance(self.resamples, (int, np.integer)) or self.resamples < 1:
            raise ValueError(f"the bootstrap needs at least one resample, got {self.resamples!r} (--resamples 0 "
                             "turns the intervals off)")
        if not 0 < self.confidence < 1:
            raise ValueError(f"the intervals' confidence must lie strictly between 0 and 1, got {self.confidence!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, (int, np.integer)) or self.seed < 0:
            raise ValueError(f"the bootstrap's seed must be an integer of at least 0 (it is reported, so that the "
                             f"intervals can be repeated), got {self.seed!r}")

    def weights(self, n_images):
        """(resamples, n_images): how often each image is drawn in each resample."""
        rng = np.random.default_rng(self.seed)
        draws = rng.integers(0, n_images, (self.resamples, n_images))
        return np.stack([np.bincount(row, minlength=n_images) for row in draws]).astype(np.float64)

    def interval(self, samples):
        """The percentile interval of ``samples`` (NaN resamples, where a metric is undefined, left out)."""
        samples = np.asarray(samples, np.float64)
        samples = samples[~np.isnan(samples)]
        if not samples.size:
            return [None, None]
        tail = 50 * (1 - self.confidence)
        return [float(v) for v in np.percentile(samples, [tail, 100 - tail])]


def resampled_metrics(images, weights, names=None):
    """{metric: (resamples,) pooled values} of the coarse counts pooled with each row of ``weights``."""
    names = tuple(METRICS) if names is None else names  # (the registry as it is now: metrics may be added)
    keys, dense = images.dense()
    pooled = np.rint(weights @ dense.reshape(len(images), -1)).astype(np.int64).reshape(len(weights), keys.size, 2)
    tails = np.cumsum(pooled[:, ::-1], axis=1)[:, ::-1]  # (R, U, 2): pixels with score >= each coarse threshold
    thresholds = keys.astype(np.float64)  # the metrics need only the order of the thresholds
    out = {name: np.empty(len(weights)) for name in names}
    for r in range(len(weights)):
        fp, tp = tails[r, :, 0], tails[r, :, 1]
        values = metrics_from_counts(thresholds, tp, fp, int(tp[0]) if tp.size else 0, int(fp[0]) if fp.size else 0,
                                     warn=False)
        for name in names:
            out[name][r] = values[name]
    return out


def resampled_means(images, weights, names):
    """{metric: (resamples,) per-image means over the drawn images where the metric is defined}, for the metrics
    of ``names`` the images hold values of."""
    values = np.array(images.values).reshape(len(images), len(images.names))
    defined = ~np.isnan(values)
    sums, counts = weights @ np.where(defined, values, 0.0), weights @ defined
    with np.errstate(invalid="ignore", divide="ignore"):
        means = sums / counts
    return {name: means[:, k] for k, name in enumerate(images.names) if name in names}


def coarsening(images):
    """{metric: how far the coarse grid can move a value}: the widest side of its binning bound on all images."""
    keys, dense = images.dense()
    hist = dense.sum(axis=0).T.astype(np.int64)
    tails = np.cumsum(hist[:, ::-1], axis=1)[:, ::-1]
    if not keys.size or not (tails[0, 0] and tails[1, 0]):
        return {name: None for name in METRICS}
    values = metrics_from_counts(keys.astype(np.float64), tails[1], tails[0], int(tails[1, 0]), int(tails[0, 0]),
                                 warn=False)
    return {name: float(max(values[name] - lo, hi - values[name])) for name, (lo, hi) in metric_bounds(hist).items()}


def shifted_metrics(images, weights, names, fine=None):
    """:func:`resampled_metrics`, each metric shifted by (fine - coarse) of the whole set where ``fine`` (its value
    on the fine grid) is given, kept within the metric's range: the coarsening's systematic part removed."""
    everything = resampled_metrics(images, np.vstack([weights, np.ones((1, len(images)))]), names)  # + the whole set
    samples = {name: values[:-1] for name, values in everything.items()}
    for name, value in (fine or {}).items():
        if name in samples and value is not None:
            lo, hi = METRICS[name].range or (-np.inf, np.inf)
            samples[name] = np.clip(samples[name] + (value - everything[name][-1]), lo, hi)
    return samples


def compare(per_method, settings=Bootstrap(), metric_names=None, points=None):
    """Intervals and paired comparisons of the methods of one set.

    Args:
        per_method: {method: ImageCounts} over the same images in the same order.
        points: {method: {metric: value on the fine grid}} of the whole set, to shift the resamples by the
            coarsening's bias (None: no shift).

    Returns:
        {"intervals": {method: {metric: [lo, hi]}}, "per_image_intervals": {method: {metric: [lo, hi]}},
        "coarsening": {method: {metric: bound}}, "undefined_resamples": {method: {metric: how many resamples left
        it undefined (no OOD or no ID pixel drawn), where any did}}, "p_better": {metric: {a: {b: P(a beats b)}}},
        "significant": {metric: {a: {b: whether the interval of a - b excludes 0}}}}
    """
    metric_names = tuple(METRICS) if metric_names is None else metric_names
    sizes = {len(images) for images in per_method.values()}
    if len(sizes) != 1:
        raise ValueError(f"the methods of one set must hold the same images for paired resampling, got {sizes}")
    n = sizes.pop()
    if n == 0:
        raise ValueError("no per-image counts to resample: rerun the evaluation with this segood (runs before "
                         "per-image counts cannot be bootstrapped)")
    weights = settings.weights(n)
    samples = {m: shifted_metrics(images, weights, metric_names, (points or {}).get(m))
               for m, images in per_method.items()}
    means = {m: resampled_means(images, weights, metric_names) for m, images in per_method.items()}
    out = {"intervals": {m: {k: settings.interval(v) for k, v in s.items()} for m, s in samples.items()},
           "per_image_intervals": {m: {k: settings.interval(v) for k, v in s.items()} for m, s in means.items()},
           "coarsening": {m: coarsening(images) for m, images in per_method.items()},
           "undefined_resamples": {m: {k: int(np.isnan(v).sum()) for k, v in s.items() if np.isnan(v).any()}
                                   for m, s in samples.items()},
           "p_better": {}, "significant": {}}
    for name in metric_names:
        sign = 1.0 if METRICS[name].higher_is_better else -1.0
        out["p_better"][name], out["significant"][name] = {}, {}
        for a in per_method:
            out["p_better"][name][a], out["significant"][name][a] = {}, {}
            for b in per_method:
                if a == b:
                    continue
                diff = sign * (samples[a][name] - samples[b][name])
                diff = diff[~np.isnan(diff)]
                p = float(np.mean(diff > 0) + 0.5 * np.mean(diff == 0)) if diff.size else None
                lo, hi = settings.interval(diff)
                out["p_better"][name][a][b] = p
                out["significant"][name][a][b] = lo is not None and (lo > 0 or hi < 0)
    return out


def tied_ranks(values, significant, higher_is_better, compared=None):
    """{method: rank}: methods sorted by value; a method shares the rank of the best method of its group unless
    it is significantly worse than it (``significant[a][b]``), which starts a new group. ``compared``: the methods
    compared pairwise (default: all); any other takes its own position, and neither leads nor joins a group.
    Undefined values: None."""
    order = sorted((m for m in values if values[m] is not None), key=lambda m: -values[m] if higher_is_better else values[m])
    ranks, leader = {}, None
    for position, m in enumerate(order, 1):
        if compared is not None and m not in compared:
            ranks[m] = position
            continue
        if leader is None or significant[leader][m]:
            leader, rank = m, position
        ranks[m] = rank
    return {m: ranks.get(m) for m in values}
