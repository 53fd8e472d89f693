"""CalibrationAccumulator: pixel-level calibration of a segmentation network's softmax, in constant memory.

Expected calibration error (Guo et al., "On Calibration of Modern Neural Networks", ICML 2017) over 15
equal-width confidence bins, and the multi-class Brier score (Brier 1950), pooled over every pixel with a class.
The state is additive counts and sums (plain arrays), so shards, ranks and resumed runs merge like the OOD
accumulators. On the CPU one numba pass over the probabilities does what the torch operations do, with the same
counts and confidence sums bit for bit (the Brier sum in another order); on CUDA a Triton kernel reads them once
too, with the same counts and sums up to rounding (the torch operations where Triton cannot run).
"""


import numba
import numpy as np

from segood import _triton
from segood.labels import IGNORE
from segood.metrics._device import label_sums
from segood.metrics.state import Part

STATE_FORMAT = "segood.CalibrationAccumulator/1"
NUM_BINS = 15


class CalibrationAccumulator(Part):
    """Streaming ECE (``num_bins`` equal-width bins of the top-class confidence, bin k = (k/B, (k+1)/B], the
    first closed at 0) and Brier score over pixels whose target is a class (255 = no class, skipped).

    ECE = sum_k n_k / n |accuracy_k - mean confidence_k|, in [0, 1], lower is better. Brier = mean over pixels of
    sum_c (p_c - [c = target])^2, in [0, 2], lower is better. The predicted class is the first of equal maxima
    (as :func:`segood.models.predict.predicted_classes`).

    Example:
        >>> acc = CalibrationAccumulator()
        >>> acc.update(torch.softmax(logits, 1), semantic)   # (N, C, H, W) probabilities, (N, H, W) trainIds
        >>> acc.compute()["ece"]
    """

    STATE_NAME = "calibration state"
    reductions = {"count": "sum", "correct": "sum", "confidence": "sum", "brier": "sum"}

    def __init__(self, num_bins=NUM_BINS):
        if isinstance(num_bins, bool) or not isinstance(num_bins, (int, np.integer)) or num_bins < 1:
            raise ValueError(f"num_bins must be a positive int, got {num_bins!r}")
        self.num_bins = int(num_bins)
        self.reset()

    def reset(self):
        self.count = np.zeros(self.num_bins, np.int64)  # pixels per confidence bin
        self.correct = np.zeros(self.num_bins, np.int64)  # of which predicted right
        self.confidence = np.zeros(self.num_bins, np.float64)  # sum of their confidences
        self.brier = 0.0  # sum over pixels of the squared error of the probability vector
        return self

    def update(self, probs, target):
        """Add pixels.

        Args:
            probs: (N, C, H, W) class probabilities (a softmax), numpy or torch (CPU or CUDA).
            target: (N, H, W) integer classes 0..C-1, or 255 (no class, skipped).
        """
        import torch

        probs, target = torch.as_tensor(probs), torch.as_tensor(target)
        if probs.ndim != 4 or target.shape != (probs.shape[0], *probs.shape[2:]):
            raise ValueError(f"probs must be (N, C, H, W) and target (N, H, W), got {tuple(probs.shape)} and "
                             f"{tuple(target.shape)}")
        if probs.device.type == target.device.type == "cpu" and not target.is_floating_point():
            return self._update_host(probs.float(), target)
        if probs.is_cuda and _triton.available():
            totals = _triton.attempt(lambda: _kernel_totals(probs, target.to(probs.device), self.num_bins),
                                     "calibration kernel", "torch operations (the same counts)", probs.device)
            if totals is not None:
                return self._add(*totals, probs.shape[1])
        return self._update_torch(probs, target)

    def _update_host(self, probs, target):
        count, correct = np.zeros_like(self.count), np.zeros_like(self.correct)
        confidence = np.zeros_like(self.confidence)
        brier, problem = _host_update(probs.numpy(), target.numpy(), count, correct, confidence)
        return self._add(count, correct, confidence, brier, problem, probs.shape[1])

    def _add(self, count, correct, confidence, brier, problem, num_classes):
        """Add an update's counts and sums, or raise what it found wrong (``problem``) and leave the state as it
        was."""
        if problem:
            raise ValueError(PROBLEMS[problem].format(last=num_classes - 1))
        self.count += count
        self.correct += correct
        self.confidence += confidence
        self.brier += brier
        return self

    def _update_torch(self, probs, target):
        """The update in torch operations, where the tensors are (a device without Triton; the reference of the
        kernels' tests)."""
        import torch

        probs, target = probs.float(), target.to(probs.device).long()
        num_classes = probs.shape[1]
        keep = target != IGNORE
        if bool(((target < 0) | (target >= num_classes))[keep].any()):
            raise ValueError(PROBLEMS[BAD_TARGET].format(last=num_classes - 1))
        if not bool(torch.isfinite(probs).all()):
            raise ValueError(PROBLEMS[NOT_FINITE])
        confidence = probs.amax(dim=1)
        rank = torch.arange(num_classes, 0, -1, device=probs.device).view(1, -1, 1, 1)
        predicted = num_classes - ((probs == confidence[:, None]) * rank).amax(dim=1)  # the first maximum
        safe = torch.where(keep, target, 0)
        p_true = probs.gather(1, safe[:, None])[:, 0]
        brier = (probs.double() ** 2).sum(dim=1) - 2 * p_true.double() + 1  # sum_c (p_c - y_c)^2
        confidence, hit, brier = confidence[keep].double(), (predicted == target)[keep], brier[keep]
        bins = (torch.ceil(confidence * self.num_bins).long() - 1).clamp_(0, self.num_bins - 1)
        self.count += torch.bincount(bins, minlength=self.num_bins).cpu().numpy()
        self.correct += torch.bincount(bins[hit], minlength=self.num_bins).cpu().numpy()
        if confidence.is_cuda:  # (bincount with weights adds atomically there: the same bits from run to run instead)
            self.confidence += label_sums(bins, confidence, self.num_bins).cpu().numpy()
        else:
            self.confidence += torch.bincount(bins, weights=confidence, minlength=self.num_bins).cpu().numpy()
        self.brier += float(brier.sum())
        return self

    def _check_mergeable(self, other):
        if not isinstance(other, CalibrationAccumulator) or other.num_bins != self.num_bins:
            raise ValueError(f"can only merge a CalibrationAccumulator with {self.num_bins} bins, got {other!r}")

    def compute(self):
        """{"ece", "brier", "accuracy", "n_pixels", "bins": {"count", "accuracy", "confidence"} per bin}; NaN
        metrics when no pixel has a class."""
        n = int(self.count.sum())
        nan = float("nan")
        with np.errstate(invalid="ignore", divide="ignore"):
            accuracy = self.correct / self.count
            confidence = self.confidence / self.count
        gaps = np.where(self.count > 0, np.abs(accuracy - confidence), 0.0)
        return {"ece": float(np.dot(self.count, gaps) / n) if n else nan,
                "brier": self.brier / n if n else nan,
                "accuracy": float(self.correct.sum() / n) if n else nan,
                "n_pixels": n,
                "bins": {"count": self.count.tolist(), "accuracy": accuracy.tolist(), "confidence": confidence.tolist()}}

    def state_dict(self):
        """The state as plain numpy arrays (``numpy.savez``-able without pickle)."""
        return {"format": np.array(STATE_FORMAT), "count": self.count.copy(), "correct": self.correct.copy(),
                "confidence": self.confidence.copy(), "brier": np.array(self.brier)}

    @classmethod
    def from_state_dict(cls, state):
        """Rebuild from :meth:`state_dict`; every field is checked."""
        try:
            if str(np.asarray(state["format"])) != STATE_FORMAT:
                raise ValueError(f"unknown calibration state format {state['format']!r}; expected {STATE_FORMAT!r}")
            count, correct = (np.asarray(state[k]) for k in ("count", "correct"))
            confidence, brier = np.asarray(state["confidence"]), np.asarray(state["brier"])
        except KeyError as err:
            raise ValueError(f"calibration state lacks {err}") from None
        if count.ndim != 1 or not count.size or correct.shape != count.shape or confidence.shape != count.shape \
                or brier.shape != () or not all(np.issubdtype(a.dtype, np.integer) for a in (count, correct)) \
                or not all(np.issubdtype(a.dtype, np.floating) for a in (confidence, brier)):
            raise ValueError("calibration state: count and correct must be integers and confidence floats, one per "
                             "bin, and brier a float")
        if (count < 0).any() or (correct < 0).any() or (correct > count).any() or not np.isfinite(confidence).all() \
                or (confidence < 0).any() or (confidence > count + 1e-6 * count).any() \
                or not 0 <= float(brier) <= 2 * count.sum() + 1e-6:
            raise ValueError("calibration state: counts, confidence sums or the Brier sum are impossible")
        acc = cls(len(count))
        acc.count[...], acc.correct[...], acc.confidence[...] = count, correct, confidence
        acc.brier = float(brier)
        return acc

    def __repr__(self):
        return f"CalibrationAccumulator(num_bins={self.num_bins}, n_pixels={int(self.count.sum())})"


BAD_TARGET, NOT_FINITE = 1, 2  # what an update found wrong, and what it says
PROBLEMS = {BAD_TARGET: "target classes must be in 0..{last} or 255 (no class)",
            NOT_FINITE: "probs hold NaN or infinite values; pass a softmax of finite logits"}
BLOCK = 1024  # pixels per program of the Triton kernel


def _kernel_totals(probs, target, num_bins, kernel=None):
    """(count, correct, confidence, Brier sum, problem) of an update by the Triton kernel (``kernel``: its module,
    for tests in Triton's interpreter): a row of partial sums per block of pixels, the rows then summed, so the
    sums are the same from run to run and equal the CPU's up to rounding (another order of additions)."""
    import torch

    if kernel is None:
        from segood.metrics import _calibration_triton as kernel
    n, c = probs.shape[:2]
    pixels = probs[0, 0].numel() if n and c else 0
    blocks = -(-pixels // BLOCK)
    counts = torch.zeros(max(n * blocks, 1), 2 * num_bins + 2, dtype=torch.int64, device=probs.device)
    sums = torch.zeros(max(n * blocks, 1), num_bins + 1, dtype=torch.float64, device=probs.device)
    if n * blocks:
        target = target.long() if target.is_floating_point() else target
        kernel.block_calibration[(n * blocks,)](probs.contiguous(), target.contiguous(), counts, sums, pixels, blocks,
                                                 C=c, BINS=num_bins, BLOCK=BLOCK)
    counts, sums = counts.sum(dim=0).cpu().numpy(), sums.sum(dim=0).cpu().numpy()
    problem = BAD_TARGET if counts[2 * num_bins] else NOT_FINITE if counts[2 * num_bins + 1] else 0
    return counts[:num_bins], counts[num_bins : 2 * num_bins], sums[:num_bins], float(sums[num_bins]), problem


@numba.njit(nogil=True, cache=True)
def _host_update(probs, target, count, correct, confidence):
    """The update of float32 ``probs`` (N, C, H, W) and integer ``target`` (N, H, W) into ``count``, ``correct`` and
    ``confidence`` (per bin), pixels in order (so the confidence sums are those of a float64 ``bincount``), a row
    of pixels at a time over the classes; returns (the Brier sum, a problem: 0, BAD_TARGET or NOT_FINITE)."""
    n, c, h, w = probs.shape
    num_bins = count.size
    best = np.empty(w, np.float32)
    predicted = np.empty(w, np.int64)
    squares = np.empty(w, np.float64)
    finite = np.empty(w, np.bool_)
    brier = 0.0
    for i in range(n):
        for y in range(h):
            first = probs[i, 0, y]
            for x in range(w):
                p = first[x]
                best[x], predicted[x], squares[x] = p, 0, np.float64(p) * np.float64(p)
                finite[x] = np.isfinite(p)
            for k in range(1, c):
                row = probs[i, k, y]
                for x in range(w):
                    p, b = row[x], best[x]
                    larger = p > b
                    best[x] = p if larger else b
                    predicted[x] = k if larger else predicted[x]
                    squares[x] += np.float64(p) * np.float64(p)
                    finite[x] &= np.isfinite(p)
            for x in range(w):
                if not finite[x]:
                    return brier, NOT_FINITE
                t = target[i, y, x]
                if t == IGNORE:
                    continue
                if t < 0 or t >= c:
                    return brier, BAD_TARGET
                conf = np.float64(best[x])
                k = min(max(np.int64(np.ceil(conf * num_bins)) - 1, 0), num_bins - 1)
                count[k] += 1
                correct[k] += predicted[x] == t
                confidence[k] += conf
                brier += squares[x] - 2 * np.float64(probs[i, t, y, x]) + 1
    return brier, 0
