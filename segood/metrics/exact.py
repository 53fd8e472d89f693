"""ExactAccumulator: pixel-level OOD metrics with every distinct score a threshold (the metric contract's exact
mode), streamed over a set.

It keeps the score of every counted pixel, split by label, and sorts once in :meth:`~ExactAccumulator.compute`
(:func:`segood.metrics.functional.distinct_score_counts`): the values equal scikit-learn's ``roc_auc_score`` and
``average_precision_score`` and their bounds have zero width. Memory grows with the set (4 bytes per counted pixel
of float32 scores, 8 of float64, and about 50 bytes per distinct score while :meth:`~ExactAccumulator.compute`
builds the curves), so it is capped (``max_pixels``); above the cap the float-order grid, whose memory is constant
and whose bounds say how far it can be from these values, is the tool.
"""

import numpy as np

from segood.metrics.streaming import (SHARED_REDUCTIONS, Streaming, flat_cuda, host, is_cuda, load_per_image,
                                      read_count, read_flag, reverse_cumsum)
from segood.metrics.functional import (METRICS, as_numpy_inputs, distinct_score_counts, metrics_from_counts,
                                       raise_bad_labels)

STATE_FORMAT = "segood.ExactAccumulator/1"
DEFAULT_MAX_PIXELS = 1 << 28  # 268 million counted pixels: 1 GiB of float32 scores (2 GiB of float64)


class ExactAccumulator(Streaming):
    """Every counted pixel's score, kept apart by label; metrics with every distinct score a threshold.

    A pixel is predicted OOD at threshold t iff ``float64(score) >= t``, for every distinct score t of the set:
    the curves of :meth:`compute` are the exact ones (scikit-learn's), ``bounds`` are each value itself. ±inf are
    scores like any other; NaN at a counted pixel is an error. States merge and all-reduce by concatenation,
    save as plain arrays and resume exactly.

    Args:
        max_pixels: the most counted pixels it holds (default 2^28); an update or merge beyond it is an error
            that names the float-order grid (constant memory, bounds around these values).
        per_image: also track the per-image mean of each metric and the per-image counts the bootstrap resamples
            (inputs of 3 or more dimensions are batches).
        score_range: optionally (lo, hi), the range the scores are declared to lie in: a check, not a grid.

    Example:
        >>> acc = ExactAccumulator()
        >>> acc.update(scores, ood_mask)   # any real scores, higher = more OOD
        >>> acc.compute()["auroc"]         # == sklearn.metrics.roc_auc_score
    """

    reductions = {**SHARED_REDUCTIONS, "id_scores": "cat", "ood_scores": "cat"}  # all-reduced by gathering

    def __init__(self, *, max_pixels=DEFAULT_MAX_PIXELS, per_image=False, score_range=None):
        if isinstance(max_pixels, bool) or not isinstance(max_pixels, (int, np.integer)):
            raise TypeError(f"max_pixels must be an int, got {max_pixels!r}")
        if max_pixels < 1:
            raise ValueError(f"max_pixels must be positive, got {max_pixels}")
        self.max_pixels = int(max_pixels)
        self._setup(per_image=per_image, score_range=score_range)

    def reset(self):
        """Forget every score."""
        self._parts = [[], []]  # the ID and the OOD scores, one array per update (joined when read)
        self._curve = None  # (thresholds, hist) of the scores held, kept until they change
        self.n_stored = 0
        self._reset_shared()
        return self

    @property
    def scores(self):
        """(ID scores, OOD scores): 1-D float32 arrays where every input was exact in float32, else float64."""
        for row, parts in enumerate(self._parts):
            if len(parts) != 1:
                self._parts[row] = [np.concatenate(parts) if parts else np.zeros(0, np.float32)]
        return self._parts[0][0], self._parts[1][0]

    def update(self, scores, labels, *, clip=False):
        """Add pixels; the state is unchanged when this raises.

        Args:
            scores: real numbers (numpy or torch, CPU or CUDA, any float or integer dtype), any shape, higher =
                more OOD; ±inf allowed, NaN at a counted pixel is an error.
            labels: same shape: 0 (ID), 1 (OOD), 255 (ignore).
            clip: has no meaning here (there is no range); True is an error.
        """
        if clip:
            raise ValueError("clip has no meaning on the exact grid: every real score is a threshold. Drop clip=True "
                             "(--clip), or use the linear grid: num_thresholds / score_range (--num-thresholds / "
                             "--score-range)")
        pieces = [self._split(s, lab) for s, lab in self._split_images(scores, labels)]  # validate all first
        self._check_room(sum(i.size + o.size for i, o, _ in pieces), "this update")
        for id_scores, ood_scores, n_ignored in pieces:
            self._store(id_scores, ood_scores)
            self.n_ignored += n_ignored
            if self.per_image:
                self._add_image(*distinct_score_counts(id_scores, ood_scores))
        return self

    def _check_mergeable(self, other):
        super()._check_mergeable(other)
        self._check_room(other.n_stored, "this merge")

    def curve_counts(self):
        """(thresholds (D,), hist (2, D) int64): every distinct score, increasing, and its ID and OOD pixels
        (sorted once, then kept until the scores change: reports ask more than once)."""
        if self._curve is None:
            self._curve = distinct_score_counts(*self.scores)
        return tuple(a.copy() for a in self._curve)

    def compute(self):
        """Metrics over every pixel seen so far, every distinct score a threshold: the keys of
        :meth:`FloatOrderAccumulator.compute`, ``bounds`` each value itself and ``exact`` True."""
        if self._curve is None:
            self._curve = distinct_score_counts(*self.scores)
        thresholds, hist = self._curve
        n_id, n_ood = (int(v) for v in hist.sum(axis=1))
        if n_id + n_ood + self.n_ignored == 0:
            raise ValueError("the accumulator is empty: call update(scores, labels) before compute()")
        fp, tp = reverse_cumsum(hist)
        result = metrics_from_counts(thresholds, tp, fp, n_ood, n_id)
        result["bounds"] = {k: (result[k], result[k]) for k in METRICS}
        result.update(n_id=n_id, n_ood=n_ood, n_ignored=int(self.n_ignored), thresholds=thresholds.copy(), tp=tp,
                      fp=fp, fn=n_ood - tp, tn=n_id - fp, exact=True)
        if self.per_image:
            result["per_image_mean"] = self._per_image_mean()
        return result

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle): the scores themselves."""
        id_scores, ood_scores = self.scores
        lo, hi = self.score_range or (np.nan, np.nan)
        return {
            "format": np.array(STATE_FORMAT),
            "max_pixels": np.array(self.max_pixels, dtype=np.int64),
            "per_image": np.array(self.per_image),
            "score_range": np.array([lo, hi], dtype=np.float64),
            "id_scores": id_scores.copy(),
            "ood_scores": ood_scores.copy(),
            **self._shared_state(),
        }

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict` output; every field is checked before anything is built from it."""
        cls._check_keys_and_format(state, cls(), STATE_FORMAT)
        max_pixels = read_count(state, "max_pixels")
        if max_pixels < 1:
            raise ValueError("accumulator state 'max_pixels' must be positive")
        score_range = np.asarray(state["score_range"])
        if score_range.shape != (2,) or score_range.dtype != np.float64:
            raise ValueError("accumulator state 'score_range' must be two float64 (NaN, NaN when undeclared)")
        rows = [np.asarray(state[k]) for k in ("id_scores", "ood_scores")]
        for key, row in zip(("id_scores", "ood_scores"), rows):
            if row.ndim != 1 or row.dtype not in (np.float32, np.float64):
                raise ValueError(f"accumulator state {key!r} must be a 1-D float32 or float64 array, got {row.dtype} "
                                 f"of shape {row.shape}")
            if np.isnan(row).any():
                raise ValueError(f"accumulator state {key!r} holds NaN, which no counted pixel can score")
        if rows[0].size + rows[1].size > max_pixels:
            raise ValueError(f"accumulator state holds {rows[0].size + rows[1].size} scores, more than its "
                             f"max_pixels ({max_pixels})")
        acc = cls(max_pixels=max_pixels, per_image=read_flag(state, "per_image"),
                  score_range=None if np.isnan(score_range).all() else tuple(score_range))
        acc._store(rows[0].copy(), rows[1].copy())
        acc.n_ignored = read_count(state, "n_ignored")
        load_per_image(acc, state)
        return acc

    def __repr__(self):
        n_id, n_ood = (sum(p.size for p in parts) for parts in self._parts)
        return (f"ExactAccumulator(max_pixels={self.max_pixels}, n_id={n_id}, n_ood={n_ood}, "
                f"n_ignored={self.n_ignored})")

    # -- internals ---------------------------------------------------------------------------------

    def _split(self, scores, labels):
        """(ID scores, OOD scores, number of ignored pixels) of one input, validated; on a CUDA device only the
        counted pixels' scores are copied to the host."""
        if is_cuda(scores) or is_cuda(labels):
            scores, labels = flat_cuda(scores, labels)
            counted = labels <= 1
            if bool(((labels != 255) & ~counted).any()):
                raise_bad_labels(host(labels))
            n_nan = int(scores[counted].isnan().sum()) if scores.dtype.is_floating_point else 0
            parts = [_host_scores(scores[labels == v]) for v in (0, 1)]
            n_ignored = int(labels.numel() - counted.sum())
        else:
            scores, labels = as_numpy_inputs(scores, labels, keep_float32_exact=True)
            is_id, is_ood = labels == 0, labels == 1
            n_counted = int(np.count_nonzero(is_id)) + int(np.count_nonzero(is_ood))
            n_ignored = int(np.count_nonzero(labels == 255))
            if n_counted + n_ignored != labels.size:
                raise_bad_labels(labels)
            parts = [scores[is_id], scores[is_ood]]
            n_nan = sum(int(np.count_nonzero(np.isnan(p))) for p in parts)
        if n_nan:
            raise ValueError(f"{n_nan} counted pixels have NaN scores; every other real value, ±inf included, is a "
                             "threshold of the exact grid")
        if self.score_range is not None:
            lo, hi = self.score_range
            counted = np.concatenate(parts).astype(np.float64)
            outside = int(np.count_nonzero((counted < lo) | (counted > hi)))
            if outside:
                raise ValueError(f"{outside} counted pixels have scores outside the declared score_range [{lo:g}, "
                                 f"{hi:g}] (min {counted.min():.9g}, max {counted.max():.9g}); declare the range the "
                                 "scores really have, or none: the exact grid needs no range")
        return parts[0], parts[1], n_ignored

    def _check_room(self, adding, what):
        if self.n_stored + adding > self.max_pixels:
            raise ValueError(
                f"the exact grid keeps every counted pixel's score: {what} brings it to {self.n_stored + adding} "
                f"pixels, above its cap of {self.max_pixels} (max_pixels; it holds 4 bytes a pixel for float32 scores, "
                "8 for float64, and compute() takes about 50 more while it runs). Use the float-order grid (the "
                "default; --grid float), whose "
                "memory is constant and whose bounds say how far it can be from exact (more --mantissa-bits narrows "
                "them), or raise max_pixels (--max-pixels) where the memory allows")

    def _store(self, id_scores, ood_scores):
        self._curve = None
        for row, part in enumerate((id_scores, ood_scores)):
            if part.size:
                self._parts[row].append(part)
        self.n_stored += id_scores.size + ood_scores.size


def _host_scores(x):
    """A device tensor of scores as a host numpy array: float32 where that is exact (float16, bfloat16, 8- and
    16-bit integers, bool), float64 otherwise, as :func:`as_numpy_inputs` does on the host."""
    import torch

    if x.dtype in (torch.float32, torch.float64):
        return x.cpu().numpy()
    small = x.dtype in (torch.float16, torch.bfloat16, torch.bool, torch.int8, torch.uint8, torch.int16)
    return x.to(torch.float32 if small else torch.float64).cpu().numpy()
