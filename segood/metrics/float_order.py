"""FloatOrderAccumulator: pixel-level OOD metrics for any real-valued score, on the float-order grid.

Thresholds live on the floating-point number line itself, as HdrHistogram's buckets do: a pixel's bin is the
top bits of the order-preserving key of its float64 value, so "predicted OOD iff score >= t_b" holds by
construction, with no score range and a relative threshold spacing of 2^-m at every magnitude (the metric
contract, "Float-order binning"). Unbounded scores (distances, max logit, energy) need no squashing, and
crowded scores (1e-6 next to 1e-5) are resolved as finely as scores near 1.
"""

import functools

import numba
import numpy as np

from segood.metrics import _device, _kernels
from segood.metrics.functional import METRICS, as_numpy_inputs, metrics_from_counts, raise_bad_labels
from segood.metrics.state import check_counts
from segood.metrics.streaming import (SHARED_REDUCTIONS, Streaming, device_tensors, host, is_cuda, load_per_image,
                                      matching_inputs, read_count, read_flag, settled_fields)

STATE_FORMAT = "segood.FloatOrderAccumulator/1"
DEFAULT_MANTISSA_BITS = 10  # float16 and 8-bit scores exact; measured fastest (docs/metric_engine.md)
MAX_MANTISSA_BITS = 14  # counts are dense per occupied binade: 2 x 2^14 int64 = 256 KiB each
_MIN_CHUNK = 1 << 16


@functools.lru_cache(maxsize=None)  # (str of a numpy dtype is slow: once per dtype, not per update)
def _exact_bits(dtype):
    """The smallest m at which every value of ``dtype`` falls alone in its bin (None: no such m up to 20)."""
    name = str(dtype).replace("torch.", "")
    if name == "bool":
        return 0
    if name in ("float16", "bfloat16"):
        return {"float16": 10, "bfloat16": 7}[name]
    if name.startswith(("int", "uint")):
        info = np.iinfo(np.dtype(name))
        return max(0, (max(-int(info.min), int(info.max)) - 1).bit_length() - 1)  # |n| <= 2^(m+1)
    return None  # float32 would need m = 23, float64 m = 52


def bin_thresholds(binades, low, m):
    """t_b of bins (binade, low bits): the smallest non-NaN float64 whose bin is b (-inf for the bin of -inf)."""
    key = (np.asarray(binades, np.uint64) << np.uint64(52)) | (np.asarray(low, np.uint64) << np.uint64(52 - m))
    positive = key >= _kernels.SIGN
    bits = np.where(positive, key ^ _kernels.SIGN, ~key)
    values = bits.view(np.float64)
    return np.where(np.isnan(values), -np.inf, values)


class FloatOrderAccumulator(Streaming):
    """Streaming ID / OOD counts per float-order bin, for scores of any real value (the default grid).

    A pixel is predicted OOD at threshold ``t_b`` iff ``float64(score) >= t_b``, exactly, for every bin b of
    the float64 number line at m mantissa bits (``mantissa_bits``): thresholds 2^-m apart relatively, at every
    magnitude; ±inf in the end bins. Bins are stored only for the binades (sign and exponent) that occur, so a
    score spanning 40 binades takes 40 x 2 x 2^m counts. States add, merge when their binades differ,
    all-reduce, save as plain arrays and resume exactly. Without ``per_image``, host updates leave their pixels in
    the counting threads' tables (the rows in use: 8 KiB a binade at m = 10) until the counts are next read.

    Args:
        mantissa_bits: m in [1, 14] (default 10: every float16 and 8-bit value falls alone in its bin, so such
            scores give exactly the exact-mode curve; float32 scores are resolved to 2^-10 relatively).
        per_image: also track the per-image mean of each metric (inputs of 3 or more dimensions are batches).
        score_range: optionally (lo, hi), the range the scores are declared to lie in: a check, not a grid.

    Example:
        >>> acc = FloatOrderAccumulator()
        >>> acc.update(distances, ood_mask)   # any real scores, higher = more OOD
        >>> acc.compute()["auroc"]
    """

    # the occupied binades differ between states: (binades, counts) merge as one table, and all-reduce by gathering
    reductions = {**SHARED_REDUCTIONS, "exact": "min",
                  ("binades", "counts"): lambda b1, c1, b2, c2: _kernels.merge_binades([(b1, c1), (b2, c2)])}

    def __init__(self, mantissa_bits=DEFAULT_MANTISSA_BITS, *, per_image=False, score_range=None):
        if isinstance(mantissa_bits, bool) or not isinstance(mantissa_bits, (int, np.integer)):
            raise TypeError(f"mantissa_bits must be an int, got {mantissa_bits!r}")
        if not 1 <= mantissa_bits <= MAX_MANTISSA_BITS:
            raise ValueError(f"mantissa_bits must be in [1, {MAX_MANTISSA_BITS}], got {mantissa_bits}")
        self.mantissa_bits = int(mantissa_bits)
        self._setup(per_image=per_image, score_range=score_range)

    # The counts, read through properties: a host update without per-image counts leaves its pixels in the fast
    # kernels' tables (:class:`~segood.metrics._kernels.Kept`), added to them by :meth:`settle`.
    binades, counts = settled_fields("binades", "counts")

    def reset(self):
        """Forget every count."""
        self._kept = _kernels.Kept()  # counts not yet in binades and counts
        self.binades = np.zeros(0, np.int64)  # occupied binades, increasing
        self.counts = np.zeros((0, 2, 1 << self.mantissa_bits), np.int64)  # per binade: ID, OOD per low bits
        self.exact = True  # every bin holds one distinct value, from the dtypes seen so far
        self._reset_shared()
        return self

    def update(self, scores, labels, *, clip=False):
        """Add pixels; the state is unchanged when this raises.

        Args:
            scores: real numbers (numpy or torch, CPU or CUDA, any float or integer dtype), any shape, higher =
                more OOD; ±inf allowed, NaN at a counted pixel is an error.
            labels: same shape: 0 (ID), 1 (OOD), 255 (ignore).
            clip: has no meaning on this grid (there is no range to clip to); True is an error.
        """
        return self.begin_update(scores, labels, clip=clip)()

    def begin_update(self, scores, labels, *, clip=False):
        """:meth:`update` in two steps: the device's work for CUDA tensors is started, and the function returned
        (no arguments) completes the update, returning self; see :meth:`Streaming.begin_update`."""
        if clip:
            raise ValueError("clip has no meaning on the float-order grid: every real score has a bin. Drop "
                             "clip=True (--clip), or use the linear grid: num_thresholds / score_range "
                             "(--num-thresholds / --score-range)")
        if _on_device(scores, labels):  # the whole batch in one call: a fixed number of waits for the device
            counted = self._start_device_histograms(*matching_inputs(scores, labels))
            return lambda: self._complete(counted(), on_device=True)
        return lambda: self._complete([self._histogram(s, lab) for s, lab in self._split_images(scores, labels)])

    def _complete(self, results, *, on_device=False):
        """Add the validated [(binades, counts, n_ignored, exact)] of an update's images to the state."""
        self._add(*[(binades, counts) for binades, counts, _, _ in results])  # all validated before any change
        for binades, counts, n_ignored, exact in results:
            self.n_ignored += n_ignored
            self.exact &= exact
            if self.per_image:  # (from the device: the host's bookkeeping queued, to overlap the next batch)
                self._queue_image(_kernels.float_order_curve, binades, counts, self.mantissa_bits)
        if self.per_image and not on_device:  # (the host's bookkeeping done at once: nothing to overlap)
            self.settle()
        return self

    def curve_counts(self):
        """(thresholds (B,), hist (2, B) int64) of the occupied bins in increasing order."""
        return self._curve_counts(self.binades, self.counts)

    def compute(self):
        """Metrics over every pixel seen so far (pooled counts), as :meth:`LinearGridAccumulator.compute`, with
        the curves at the occupied bins' thresholds and ``bounds`` {metric: (lo, hi)}: where exact mode's
        value lies, from the counts alone (the value itself when every bin holds one distinct value)."""
        thresholds, hist, fp, tp = _kernels.float_order_curve(self.binades, self.counts, self.mantissa_bits)
        n_id, n_ood = (int(v[0]) if v.size else 0 for v in (fp, tp))
        if n_id + n_ood + self.n_ignored == 0:
            raise ValueError("the accumulator is empty: call update(scores, labels) before compute()")
        exact = self.exact or not hist.size
        result = metrics_from_counts(thresholds, tp, fp, n_ood, n_id, bounds=not exact)
        if exact:
            result["bounds"] = {k: (result[k], result[k]) for k in METRICS}
        result.update(n_id=n_id, n_ood=n_ood, n_ignored=int(self.n_ignored), thresholds=thresholds, tp=tp, fp=fp,
                      fn=n_ood - tp, tn=n_id - fp, exact=bool(self.exact))
        if self.per_image:
            result["per_image_mean"] = self._per_image_mean()
        return result

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle)."""
        lo, hi = self.score_range or (np.nan, np.nan)
        return {
            "format": np.array(STATE_FORMAT),
            "mantissa_bits": np.array(self.mantissa_bits, dtype=np.int64),
            "per_image": np.array(self.per_image),
            "score_range": np.array([lo, hi], dtype=np.float64),
            "exact": np.array(self.exact),
            "binades": self.binades.copy(),
            "counts": self.counts.copy(),
            **self._shared_state(),
        }

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict` output; every field is checked before anything is built from it."""
        cls._check_keys_and_format(state, cls(), STATE_FORMAT)
        m = read_count(state, "mantissa_bits")
        if not 1 <= m <= MAX_MANTISSA_BITS:
            raise ValueError(f"accumulator state 'mantissa_bits' must be in [1, {MAX_MANTISSA_BITS}], got {m}")
        score_range = np.asarray(state["score_range"])
        if score_range.shape != (2,) or not np.issubdtype(score_range.dtype, np.floating):
            raise ValueError("accumulator state 'score_range' must be two floats (NaN, NaN when undeclared)")
        binades, counts = np.asarray(state["binades"]), np.asarray(state["counts"])
        if binades.ndim != 1 or not np.issubdtype(binades.dtype, np.integer) or binades.size > _kernels.BINADES \
                or (binades.size and (binades.min() < 0 or binades.max() >= _kernels.BINADES
                                      or np.any(np.diff(binades) <= 0))):
            raise ValueError("accumulator state 'binades' must be increasing integers in [0, 4096)")
        if counts.shape != (binades.size, 2, 1 << m) or not np.issubdtype(counts.dtype, np.integer):
            raise ValueError(f"accumulator state 'counts' must be integers of shape ({binades.size}, 2, {1 << m}), "
                             f"got {counts.dtype} of shape {counts.shape}")
        check_counts(counts, "counts")
        nan_bins = np.zeros(counts.shape[0::2], bool)  # bins whose keys are NaN patterns hold nothing
        nan_bins[binades == 0, :-1] = True
        nan_bins[binades == _kernels.BINADES - 1, 1:] = True
        if counts.any(axis=1)[nan_bins].any():
            raise ValueError("accumulator state 'counts' holds pixels in bins of NaN keys, where no score can fall")
        acc = cls(m, per_image=read_flag(state, "per_image"),
                  score_range=None if np.isnan(score_range).all() else tuple(score_range))
        acc.binades, acc.counts = binades.astype(np.int64), counts.astype(np.int64)
        acc.exact = read_flag(state, "exact")
        acc.n_ignored = read_count(state, "n_ignored")
        load_per_image(acc, state)
        return acc

    def __repr__(self):
        n_id, n_ood = (int(v) for v in self.counts.sum(axis=(0, 2))) if self.counts.size else (0, 0)
        return (f"FloatOrderAccumulator(mantissa_bits={self.mantissa_bits}, binades={self.binades.size}, "
                f"n_id={n_id}, n_ood={n_ood}, n_ignored={self.n_ignored})")

    # -- internals ---------------------------------------------------------------------------------

    def _histogram(self, scores, labels):
        """(binades, counts, n_ignored, exact) of one input on the host, validated."""
        m = self.mantissa_bits
        scores_dtype = scores.dtype
        scores, labels = as_numpy_inputs(scores, labels, keep_float32_exact=True, keep_float16=True)
        threads = max(1, min(numba.get_num_threads(), scores.size // _MIN_CHUNK))
        kept = None if self.per_image else self._kept  # (an image's own counts are needed at once)
        if kept is not None and not kept.ready(scores.dtype, m, scores.size):
            self._add(*kept.drain())  # (the counts of the updates before: into the state, before this one can fail)
        binades, counts, problems = _kernels.float_histogram_numpy(scores, labels, m, threads, kept=kept)
        try:
            self._check(scores, labels, problems)
        except BaseException:
            if kept is not None:
                kept.undo()
            raise
        if kept is not None:
            kept.commit()
        return binades, counts, int(problems[_kernels.N_IGNORED]), self._exact(scores_dtype)

    def _start_device_histograms(self, scores, labels):
        """The device's work for torch tensors started; returns the function giving [(binades, counts, n_ignored,
        exact)], validated: one per image with ``per_image`` (the ignored pixels all with the first)."""
        scores, labels = device_tensors(scores, labels)
        n = self._image_count(scores)
        # (the state's binades: after the first batches, those of every batch, counted in one pass)
        counted = _device.start_histograms(scores.reshape(n, -1), labels.reshape(n, -1), self.mantissa_bits,
                                           known=self._binades)

        def results():
            images, problems = counted()
            self._check(scores, labels, problems)
            exact = self._exact(scores.dtype)
            ignored = [int(problems[_kernels.N_IGNORED])] + [0] * (n - 1)
            return [(binades, counts, n_ignored, exact) for (binades, counts), n_ignored in zip(images, ignored)]
        return results

    def _exact(self, dtype):
        """Whether every bin holds one distinct value of ``dtype`` at this resolution."""
        exact_bits = _exact_bits(dtype)
        return exact_bits is not None and self.mantissa_bits >= exact_bits

    def _check(self, scores, labels, problems):
        """Raise on the problems a kernel counted, and on scores outside a declared range."""
        if problems[_kernels.N_BAD_LABEL]:
            raise_bad_labels(host(labels))
        if problems[_kernels.N_BAD_SCORE]:
            raise ValueError(f"{int(problems[_kernels.N_BAD_SCORE])} counted pixels have NaN scores; every other real "
                             "value, ±inf included, has a bin on the float-order grid")
        if self.score_range is not None:
            lo, hi = self.score_range
            low, high, outside = _counted_extent(scores, labels, lo, hi)
            if outside:
                raise ValueError(f"{outside} counted pixels have scores outside the declared score_range [{lo:g}, "
                                 f"{hi:g}] (min {low:.9g}, max {high:.9g}); declare the range the scores really have, "
                                 "or none: the float-order grid needs no range")

    def settle(self):
        """Do the work still pending: the per-image bookkeeping queued, and the counts the kernels' tables keep
        added to the state; every read of the state does it first. Returns self."""
        self._add(*self._kept.drain())
        return super().settle()

    def _pending(self):
        return bool(self._kept.tables) or super()._pending()

    def _add(self, *parts):
        """Add [(binades, counts)] to the state: in place where it holds their binades already (after the first
        frames, the usual case), else into a new table of the union of binades."""
        parts = [(binades, counts) for binades, counts in parts if binades.size]
        rows = [np.searchsorted(self._binades, binades) for binades, _ in parts]
        if all(r[-1] < self._binades.size and np.array_equal(self._binades[r], b) for r, (b, _) in zip(rows, parts)):
            for r, (_, counts) in zip(rows, parts):
                _kernels.add_rows(self._counts, r, counts)
        else:
            self._binades, self._counts = _kernels.merge_binades([(self._binades, self._counts), *parts])

    def _curve_counts(self, binades, counts):
        thresholds, hist, _, _ = _kernels.float_order_curve(binades, counts, self.mantissa_bits)
        return thresholds, hist


def _on_device(scores, labels):
    """Whether an input goes to the device kernels: CUDA tensors (host arrays and CPU tensors take the numba
    kernel, faster on the CPU than the torch path)."""
    return is_cuda(scores) or is_cuda(labels)


def _counted_extent(scores, labels, lo, hi):
    """(min, max, how many outside [lo, hi]) of the counted pixels' scores, in float64, where the scores are
    (no copy of a device tensor to the host)."""
    counted = scores[labels <= 1]
    if type(counted).__module__.startswith("torch"):
        counted = counted.double()
        if not counted.numel():
            return 0.0, 0.0, 0
        return counted.min().item(), counted.max().item(), int(((counted < lo) | (counted > hi)).sum())
    counted = counted.astype(np.float64, copy=False)
    if not counted.size:
        return 0.0, 0.0, 0
    return float(counted.min()), float(counted.max()), int(np.count_nonzero((counted < lo) | (counted > hi)))
