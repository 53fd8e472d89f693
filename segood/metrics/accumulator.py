"""LinearGridAccumulator: binned pixel-level OOD metrics over a whole set in constant memory."""


import numba
import numpy as np

from segood.metrics import _kernels
from segood.metrics.bootstrap import ImageCounts
from segood.metrics.functional import (
    METRICS,
    as_numpy_inputs,
    metrics_from_counts,
    raise_bad_labels,
    raise_bad_scores,
)
from segood.metrics.state import StateFile, check_counts

STATE_FORMAT = "segood.PixelOODAccumulator/1"  # (the class's first name; every state since carries it)
# state arrays that older states lack: the names of the per-image metrics, the per-image counts (bootstrap)
OPTIONAL_STATE = ("per_image_metrics", "image_offsets", "image_keys", "image_counts", "image_values")
MAX_THRESHOLDS = 1 << 24  # 256 MiB of counts: beyond that a "state" is a mistake, not a configuration
_MIN_CHUNK = 1 << 16  # pixels per thread; below this, threads cost more than they save


class _Streaming(StateFile):
    """What the accumulators share: adding, copying, saving, per-image splitting and per-image bookkeeping."""

    STATE_NAME = "accumulator state"

    def __add__(self, other):
        return self.copy().merge(other)

    @staticmethod
    def _check_keys_and_format(state, empty, state_format):
        """The first checks of ``from_state_dict``: every key of an ``empty`` accumulator's state present (but the
        optional ones), and the format ``state_format``."""
        missing = [k for k in empty.state_dict() if k not in state and k not in OPTIONAL_STATE]
        if missing:
            raise ValueError(f"accumulator state lacks {missing}; was it written by state_dict()?")
        if str(np.asarray(state["format"])) != state_format:
            raise ValueError(f"unknown accumulator state format {state['format']!r}; expected {state_format!r}")

    def _setup(self, *, per_image, score_range):
        """The settings every grid's accumulator takes beside its own, checked; then an empty state."""
        self.per_image = bool(per_image)
        self.score_range = self._declared_range(score_range)
        self.metric_names = tuple(METRICS)  # the per-image sums follow the metric table of the accumulator's making
        self.reset()

    def _reset_shared(self):
        """Forget what every accumulator keeps beside its counts: ignored pixels and the per-image bookkeeping."""
        self.n_ignored = 0
        self.n_images = 0
        self.per_image_sum = np.zeros(len(self.metric_names))
        self.per_image_defined = 0  # images where the per-image metrics are defined
        self.images = ImageCounts(self.metric_names)  # per image: coarse counts and metrics (bootstrap)

    @staticmethod
    def _declared_range(score_range):
        """A declared score range as (lo, hi) floats with lo < hi, or None."""
        if score_range is None:
            return None
        lo, hi = (float(v) for v in score_range)
        if not lo < hi:
            raise ValueError(f"score_range must have lo < hi, got {score_range!r}")
        return lo, hi

    def _shared_state(self):
        """The state entries both accumulators have: ignored pixels and the per-image bookkeeping."""
        return {
            "n_ignored": np.array(self.n_ignored, dtype=np.int64),
            "n_images": np.array(self.n_images, dtype=np.int64),
            "per_image_sum": self.per_image_sum.copy(),
            "per_image_defined": np.array(self.per_image_defined, dtype=np.int64),
            "per_image_metrics": np.array(self.metric_names, dtype=str),
            **self.images.arrays(),
        }

    def _per_image_mean(self):
        """{metric: mean over the images where it is defined, ``n_images``: those images, ``n_images_total``}."""
        defined = self.per_image_defined
        means = self.per_image_sum / defined if defined else np.full(len(self.metric_names), np.nan)
        return {**{name: float(v) for name, v in zip(self.metric_names, means)}, "n_images": int(defined),
                "n_images_total": int(self.n_images)}

    def _check_mergeable(self, other, fields):
        """Refuse to merge another kind of accumulator, or one whose ``fields`` (its grid), per-image setting or
        metrics differ."""
        if not isinstance(other, type(self)):
            raise TypeError(f"can only merge a {type(self).__name__}, got {type(other).__name__}")
        fields = (*fields, "per_image", "metric_names")
        mine, theirs = (tuple(getattr(acc, f) for f in fields) for acc in (self, other))
        if mine != theirs:
            raise ValueError(f"cannot merge accumulators with different configurations: ({', '.join(fields)}) = "
                             f"{mine} vs {theirs}")

    def _add_image(self, thresholds, hist):
        """Per-image bookkeeping for one image's counts: its metrics, where it has ID and OOD pixels."""
        self.n_images += 1
        fp, tp = _reverse_cumsum(hist)
        values = np.full(len(self.metric_names), np.nan)
        if hist.size and fp[0] and tp[0]:
            metrics = metrics_from_counts(thresholds, tp, fp, int(tp[0]), int(fp[0]), warn=False)
            values = np.array([metrics[name] for name in self.metric_names])
            self.per_image_sum += values
            self.per_image_defined += 1
        self.images.add(thresholds, hist, values)

    def _merge_per_image(self, other):
        self.n_ignored += other.n_ignored
        self.n_images += other.n_images
        self.per_image_sum += other.per_image_sum
        self.per_image_defined += other.per_image_defined
        self.images.extend(other.images)
        return self

    def _gather_images(self):
        """Every rank's per-image counts, in rank order, on every rank (torch.distributed, between our own
        processes: the objects are plain arrays)."""
        import torch.distributed as dist

        parts = [None] * dist.get_world_size()
        dist.all_gather_object(parts, self.images.arrays())
        images = ImageCounts(self.metric_names)
        for arrays in parts:
            images.extend(ImageCounts.from_arrays(arrays, self.metric_names))
        self.images = images

    def _split_images(self, scores, labels):
        """[(scores, labels)] per image with ``per_image``, else the whole input as one piece."""
        scores, labels = _matching(scores, labels)
        if self.per_image and len(scores.shape) >= 3:
            return list(zip(scores, labels))
        return [(scores, labels)]

    def _images(self, scores):
        """How many images an input of this shape holds: its first axis with ``per_image`` and 3+ dimensions."""
        return scores.shape[0] if self.per_image and len(scores.shape) >= 3 else 1


class LinearGridAccumulator(_Streaming):
    """Streaming TP/FP/FN/TN counts at ``numpy.linspace(lo, hi, num_thresholds)`` (the paper's §4).

    A pixel is predicted OOD at threshold ``t_k`` iff ``float64(score) >= t_k``; the counts equal that
    literal comparison for every pixel. Memory is O(num_thresholds) whatever the number of images, and
    states add, so shards, processes and resumed runs merge to the counts of one uninterrupted run.

    Args:
        num_thresholds: T >= 2. Large T is cheap (one histogram bin per threshold): 65536 is near-exact.
        score_range: (lo, hi), the first and last threshold; scores outside it are an error.
        per_image: also track the per-image mean of each metric (over images where it is defined). Then
            ``update`` treats inputs of 3 or more dimensions as batches along the first axis.

    Example:
        >>> acc = LinearGridAccumulator(num_thresholds=400)
        >>> acc.update(scores, ood_mask)   # scores: float (N, H, W), higher = more OOD
        >>> acc.compute()["auroc"]
    """

    def __init__(self, num_thresholds=400, score_range=(0.0, 1.0), *, per_image=False):
        if isinstance(num_thresholds, bool) or not isinstance(num_thresholds, (int, np.integer)):
            raise TypeError(f"num_thresholds must be an int, got {num_thresholds!r}")
        if num_thresholds < 2:
            raise ValueError(f"num_thresholds must be at least 2, got {num_thresholds}")
        if num_thresholds > MAX_THRESHOLDS:
            raise ValueError(f"num_thresholds must be at most {MAX_THRESHOLDS} (2^24), got {num_thresholds}")
        lo, hi = (float(v) for v in score_range)
        if not (np.isfinite(lo) and np.isfinite(hi) and lo < hi):
            raise ValueError(f"score_range must be finite with lo < hi, got {score_range!r}")
        self.num_thresholds = int(num_thresholds)
        self.score_range = (lo, hi)
        self.metric_names = tuple(METRICS)  # the per-image sums follow the metric table of the accumulator's making
        self.per_image = bool(per_image)
        with np.errstate(over="ignore", invalid="ignore"):  # refused just below, with a clear message
            self.thresholds = np.linspace(lo, hi, self.num_thresholds)
        if not (np.isfinite(hi - lo) and np.all(np.diff(self.thresholds) >= 0)):
            raise ValueError(f"score_range {score_range!r} gives thresholds that overflow or are out of order in "
                             "float64 (a range wider than the float64 maximum, or of subnormal numbers): rescale "
                             "the scores to a moderate range such as (0, 1)")
        self.reset()

    def reset(self):
        """Forget every count."""
        self.hist = np.zeros((2, self.num_thresholds), dtype=np.int64)  # rows: ID, OOD; column = bin
        self._reset_shared()
        return self

    def update(self, scores, labels, *, clip=False):
        """Add pixels. The state is unchanged when this raises.

        Args:
            scores: float array or tensor (numpy, torch CPU or CUDA), any shape, higher = more OOD,
                within ``score_range`` at every counted pixel (scores at ignored pixels are never read).
            labels: same shape: 0 (ID), 1 (OOD), 255 (ignore).
            clip: clip out-of-range scores (infinities included; never NaN) into ``score_range`` instead of
                raising.

        Raises:
            ValueError: shape mismatch, labels outside {0, 1, 255}, NaN or out-of-range scores.
        """
        images = self._split_images(scores, labels)
        results = [self._histogram(s, lab, clip) for s, lab in images]  # validate all before changing state
        for hist, n_ignored in results:
            self.hist += hist
            self.n_ignored += n_ignored
            if self.per_image:
                self._add_image(self.thresholds, hist)
        return self

    def merge(self, other):
        """Add the counts of another accumulator with the same thresholds (in place); returns self."""
        self._check_mergeable(other, ("num_thresholds", "score_range"))
        self.hist += other.hist
        return self._merge_per_image(other)

    def curve_counts(self):
        """(thresholds (T,), hist (2, T) int64): the ID and OOD pixels of each bin, increasing thresholds."""
        return self.thresholds.copy(), self.hist.copy()

    def compute(self):
        """Metrics over every pixel seen so far (pooled counts).

        Returns:
            dict: ``auroc``, ``auprc``, ``fpr95``, ``max_iou``, ``max_iou_threshold``, ``n_id``,
            ``n_ood``, ``n_ignored``; the curves ``thresholds``, ``tp``, ``fp``, ``fn``, ``tn`` (arrays of
            shape (T,)); ``bounds`` {metric: (lo, hi)}: where exact mode's value lies, from the counts alone;
            ``exact``: whether every bin is known to hold one distinct value (False on this grid); with
            ``per_image``, ``per_image_mean`` = {metric: mean, ``n_images``: images averaged, ``n_images_total``}.
            Every grid's accumulator returns these keys.

        Raises:
            ValueError: nothing has been accumulated.
        """
        n_id, n_ood = (int(v) for v in self.hist.sum(axis=1))
        if n_id + n_ood + self.n_ignored == 0:
            raise ValueError("the accumulator is empty: call update(scores, labels) before compute()")
        fp, tp = _reverse_cumsum(self.hist)
        result = metrics_from_counts(self.thresholds, tp, fp, n_ood, n_id, bounds=True)
        result.update(
            n_id=n_id,
            n_ood=n_ood,
            n_ignored=int(self.n_ignored),
            thresholds=self.thresholds.copy(),
            tp=tp,
            fp=fp,
            fn=n_ood - tp,
            tn=n_id - fp,
            exact=False,
        )
        if self.per_image:
            result["per_image_mean"] = self._per_image_mean()
        return result

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle)."""
        return {
            "format": np.array(STATE_FORMAT),
            "num_thresholds": np.array(self.num_thresholds, dtype=np.int64),
            "score_range": np.array(self.score_range, dtype=np.float64),
            "per_image": np.array(self.per_image),
            "hist": self.hist.copy(),
            **self._shared_state(),
        }

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict` output (or an ``np.load``-ed npz). Every field is checked for its
        type, shape and range before anything is allocated from it; counts must add up without overflow."""
        cls._check_keys_and_format(state, cls(2), STATE_FORMAT)
        num_thresholds = _count(state, "num_thresholds")
        score_range = np.asarray(state["score_range"])
        if score_range.shape != (2,) or not np.issubdtype(score_range.dtype, np.number) \
                or np.iscomplexobj(score_range):
            raise ValueError(f"accumulator state 'score_range' must be two real numbers (lo, hi), got "
                             f"{score_range.dtype} of shape {score_range.shape}")
        hist = np.asarray(state["hist"])
        if hist.shape != (2, num_thresholds) or not np.issubdtype(hist.dtype, np.integer):
            raise ValueError(f"accumulator state 'hist' must be integers of shape (2, {num_thresholds}) "
                             f"(num_thresholds), got {hist.dtype} of shape {hist.shape}")
        check_counts(hist, "hist")
        acc = cls(num_thresholds, tuple(float(v) for v in score_range), per_image=_flag(state, "per_image"))
        acc.hist[...] = hist
        acc.n_ignored = _count(state, "n_ignored")
        load_per_image(acc, state)
        return acc

    def all_reduce(self):
        """Sum the counts over all ``torch.distributed`` ranks (in place); a no-op without a process group.

        Call it once, after the last update: every rank then holds the counts of the whole set.
        """
        import torch
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return self
        device = torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else "cpu"
        counts = np.concatenate([self.hist.ravel(), [self.n_ignored, self.n_images, self.per_image_defined]])
        counts = torch.from_numpy(counts).to(device)
        sums = torch.from_numpy(self.per_image_sum.copy()).to(device)
        dist.all_reduce(counts)
        dist.all_reduce(sums)
        self._gather_images()
        counts = counts.cpu().numpy()
        self.hist[...] = counts[: self.hist.size].reshape(self.hist.shape)
        self.n_ignored, self.n_images, self.per_image_defined = (int(v) for v in counts[self.hist.size :])
        self.per_image_sum[...] = sums.cpu().numpy()
        return self

    def __repr__(self):
        lo, hi = self.score_range
        n_id, n_ood = self.hist.sum(axis=1)
        return (
            f"LinearGridAccumulator(num_thresholds={self.num_thresholds}, score_range=({lo:g}, {hi:g}), "
            f"n_id={n_id}, n_ood={n_ood}, n_ignored={self.n_ignored})"
        )

    # -- internals ---------------------------------------------------------------------------------

    def _histogram(self, scores, labels, clip):
        """Validated histogram of one input: ((2, T) int64, number of ignored pixels)."""
        lo, hi = self.score_range
        if _is_cuda(scores) or _is_cuda(labels):
            scores, labels = _flat_cuda(scores, labels)
            hist, problems = _kernels.histogram_torch(scores, labels, self.thresholds, clip)
        else:
            scores, labels = as_numpy_inputs(scores, labels)
            threads = max(1, min(numba.get_num_threads(), scores.size // _MIN_CHUNK))
            hist, problems = _kernels.histogram_numpy(scores, labels, self.thresholds, clip, threads)
        if problems[_kernels.N_BAD_LABEL]:
            raise_bad_labels(_host(labels))
        if problems[_kernels.N_BAD_SCORE]:
            raise_bad_scores(_host(scores), _host(labels), lo, hi, clip)
        return hist, int(problems[_kernels.N_IGNORED])


PixelOODAccumulator = LinearGridAccumulator  # its first name, kept for code written against it


def _reverse_cumsum(hist):
    """Per-threshold counts (pixels with score >= t_k) from per-bin counts, for each row."""
    return np.cumsum(hist[..., ::-1], axis=-1)[..., ::-1]


def load_per_image(acc, state):
    """Validate and set the per-image fields of a state (either accumulator): counts, and sums that the
    metrics' ranges allow; a state names the metrics of its sums (states before that: the built-in four)."""
    from segood.metrics.functional import METRIC_NAMES

    acc.n_images = _count(state, "n_images")
    acc.per_image_defined = _count(state, "per_image_defined")
    if acc.per_image_defined > acc.n_images:
        raise ValueError(f"accumulator state: per_image_defined ({acc.per_image_defined}) exceeds n_images "
                         f"({acc.n_images})")
    names = state.get("per_image_metrics")
    names = tuple(str(n) for n in np.asarray(names).ravel()) if names is not None else METRIC_NAMES
    sums = np.asarray(state["per_image_sum"])
    if sums.shape != (len(names),) or not np.issubdtype(sums.dtype, np.floating) or not np.isfinite(sums).all():
        raise ValueError(f"accumulator state 'per_image_sum' must be {len(names)} finite floats (one per metric: "
                         f"{', '.join(names)}), got {sums.dtype} of shape {sums.shape}")
    n = acc.per_image_defined
    for name, value in zip(names, sums):
        lo, hi = (METRICS[name].range or (-np.inf, np.inf)) if name in METRICS else (-np.inf, np.inf)
        if not (value == 0 if n == 0 else lo * n - 1e-9 <= value <= hi * n + 1e-9):
            raise ValueError(f"accumulator state 'per_image_sum' of {name} is {value}: impossible for "
                             f"{acc.per_image_defined} images with values in [{lo}, {hi}]")
    acc.metric_names, acc.per_image_sum = names, sums.astype(np.float64)
    acc.images = ImageCounts(names)
    if "image_offsets" in state:  # states before per-image counts have none: they cannot be bootstrapped
        acc.images = ImageCounts.from_arrays(state, names)
        if len(acc.images) not in (0, acc.n_images):
            raise ValueError(f"accumulator state holds counts of {len(acc.images)} images but n_images is {acc.n_images}")
        pooled = tuple(int(v) for v in acc.curve_counts()[1].sum(axis=1))
        if len(acc.images) and acc.images.totals() != pooled:
            raise ValueError(f"accumulator state: the per-image counts sum to {acc.images.totals()} (ID, OOD) "
                             f"pixels, the pooled counts to {pooled}")


def _flag(state, key):
    value = np.asarray(state[key])
    if value.shape != () or value.dtype != bool:
        raise ValueError(f"accumulator state {key!r} must be a boolean, got {value.dtype} of shape {value.shape}")
    return bool(value)


def _count(state, key):
    """A non-negative integer scalar of the state (an int64 value; never a float such as 400.7)."""
    value = np.asarray(state[key])
    if value.shape != () or not np.issubdtype(value.dtype, np.integer):
        raise ValueError(f"accumulator state {key!r} must be an integer, got {value.dtype} of shape {value.shape}")
    if not 0 <= int(value) <= _INT64_MAX:
        raise ValueError(f"accumulator state {key!r} must be a non-negative int64, got {int(value)}")
    return int(value)


_INT64_MAX = int(np.iinfo(np.int64).max)


def _is_cuda(x):
    return type(x).__module__.startswith("torch") and x.is_cuda


def _matching(scores, labels):
    """scores and labels as arrays or tensors, checked to have the same shape."""
    scores, labels = (x if hasattr(x, "shape") else np.asarray(x) for x in (scores, labels))
    if tuple(scores.shape) != tuple(labels.shape):
        raise ValueError(
            f"scores have shape {tuple(scores.shape)} but labels have shape {tuple(labels.shape)}; "
            "they must match pixel for pixel"
        )
    return scores, labels


def _flat_cuda(scores, labels):
    scores, labels = _device_tensors(scores, labels)
    return scores.reshape(-1), labels.reshape(-1)


def _device_tensors(scores, labels):
    """Torch scores and uint8 labels on one device, checked (shapes kept)."""
    import torch

    if not all(type(x).__module__.startswith("torch") for x in (scores, labels)) or scores.device != labels.device:
        raise ValueError(f"scores and labels must be on the same device, got {getattr(scores, 'device', 'numpy')} "
                         f"and {getattr(labels, 'device', 'numpy')}")
    if scores.dtype.is_complex:
        raise TypeError(f"scores must be real numbers (float or integer), got dtype {scores.dtype}: take the real "
                        "part or the magnitude first")
    if labels.dtype == torch.bool:
        labels = labels.to(torch.uint8)
    if labels.dtype.is_floating_point:
        raise TypeError(f"labels must be an integer OOD mask (0 ID, 1 OOD, 255 ignore), got {labels.dtype}")
    if labels.dtype != torch.uint8:
        if labels.numel() and (labels.min() < 0 or labels.max() > 255):
            raise_bad_labels(labels.cpu().numpy())
        labels = labels.to(torch.uint8)
    return scores.detach(), labels


def _host(x):
    """numpy copy of a possibly-CUDA tensor; only used to word an error message."""
    return x.detach().cpu().numpy() if type(x).__module__.startswith("torch") else np.asarray(x)
