"""LinearGridAccumulator: binned pixel-level OOD metrics over a whole set in constant memory."""


import numba
import numpy as np

from segood.metrics import _kernels
from segood.metrics.functional import METRICS, as_numpy_inputs, metrics_from_counts, raise_bad_labels, raise_bad_scores
from segood.metrics.state import check_counts
from segood.metrics.streaming import (SHARED_REDUCTIONS, Streaming, flat_cuda, host, is_cuda, load_per_image,
                                      read_count, read_flag, reverse_cumsum)

STATE_FORMAT = "segood.PixelOODAccumulator/1"  # (the class's first name; every state since carries it)
MAX_THRESHOLDS = 1 << 24  # 256 MiB of counts: beyond that a "state" is a mistake, not a configuration
_MIN_CHUNK = 1 << 16  # pixels per thread; below this, threads cost more than they save


class LinearGridAccumulator(Streaming):
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

    reductions = {**SHARED_REDUCTIONS, "hist": "sum"}

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
        fp, tp = reverse_cumsum(self.hist)
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
        num_thresholds = read_count(state, "num_thresholds")
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
        acc = cls(num_thresholds, tuple(float(v) for v in score_range), per_image=read_flag(state, "per_image"))
        acc.hist[...] = hist
        acc.n_ignored = read_count(state, "n_ignored")
        load_per_image(acc, state)
        return acc

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
        if is_cuda(scores) or is_cuda(labels):
            scores, labels = flat_cuda(scores, labels)
            hist, problems = _kernels.histogram_torch(scores, labels, self.thresholds, clip)
        else:
            scores, labels = as_numpy_inputs(scores, labels)
            threads = max(1, min(numba.get_num_threads(), scores.size // _MIN_CHUNK))
            hist, problems = _kernels.histogram_numpy(scores, labels, self.thresholds, clip, threads)
        if problems[_kernels.N_BAD_LABEL]:
            raise_bad_labels(host(labels))
        if problems[_kernels.N_BAD_SCORE]:
            raise_bad_scores(host(scores), host(labels), lo, hi, clip)
        return hist, int(problems[_kernels.N_IGNORED])


PixelOODAccumulator = LinearGridAccumulator  # its first name, kept for code written against it


