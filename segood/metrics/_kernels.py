"""Private histogram kernels: plain arrays in, counts out. The public wrapper validates and converts.

Both kernels put every counted pixel in bin ``j`` = (number of thresholds ``t`` with ``float64(score) >= t``)
- 1, so the pixel is predicted OOD at thresholds ``0..j`` and the per-threshold counts are reverse cumulative
sums of the histogram. Bins are found by comparing with the very threshold array, never by arithmetic
alone, so scores on a threshold or one ulp beside it land where the literal comparison puts them.
"""

import numba
import numpy as np

from segood.labels import IGNORE, OOD

# Slots of the ``problems`` counters the kernels return next to the histogram.
N_IGNORED, N_BAD_LABEL, N_BAD_SCORE = 0, 1, 2


@numba.njit(parallel=True, nogil=True, cache=True)
def _histogram_kernel(scores, labels, thresholds, clip, hist):
    """Histogram of 1-D ``scores`` (float32/64) by 1-D uint8 ``labels`` into ``hist`` (chunks, 2, T) int64.

    Returns (chunks, 3) int64 counters: ignored pixels, labels outside {0, 1, 255}, scores that are NaN or
    outside [t_0, t_{T-1}] (with ``clip``, only NaN). Pixels counted as problems are not binned.
    """
    n = scores.size
    num_t = thresholds.size
    chunks = hist.shape[0]
    lo = thresholds[0]
    hi = thresholds[num_t - 1]
    scale = (num_t - 1) / (hi - lo)
    problems = np.zeros((chunks, 3), dtype=np.int64)
    for c in numba.prange(chunks):
        local = hist[c]
        for i in range(c * n // chunks, (c + 1) * n // chunks):
            label = labels[i]
            if label > OOD:
                if label == IGNORE:
                    problems[c, N_IGNORED] += 1
                else:
                    problems[c, N_BAD_LABEL] += 1
                continue
            s = np.float64(scores[i])
            if not (s >= lo and s <= hi):  # also true for NaN
                if clip and s == s:
                    s = lo if s < lo else hi
                else:
                    problems[c, N_BAD_SCORE] += 1
                    continue
            j = min(int((s - lo) * scale), num_t - 1)  # a guess, off by at most one step
            while j > 0 and thresholds[j] > s:
                j -= 1
            while j < num_t - 1 and thresholds[j + 1] <= s:
                j += 1
            local[label, j] += 1
    return problems


def histogram_numpy(scores, labels, thresholds, clip, chunks):
    """Run the numba kernel; returns (hist (2, T) int64, problems (3,) int64)."""
    hist = np.zeros((chunks, 2, thresholds.size), dtype=np.int64)
    problems = _histogram_kernel(scores, labels, thresholds, clip, hist)
    return hist.sum(axis=0), problems.sum(axis=0)


def histogram_torch(scores, labels, thresholds, clip, chunk_pixels=1 << 24):
    """The same histogram with torch ops on the tensors' own device (no copy of the scores to the host).

    Args:
        scores: 1-D float tensor. labels: 1-D uint8 tensor on the same device.
        thresholds: float64 numpy array of shape (T,).

    Returns (hist (2, T) int64 numpy, problems (3,) int64 numpy), after a single device-to-host copy.
    """
    import torch

    device = scores.device
    num_t = thresholds.size
    t = torch.as_tensor(thresholds, dtype=torch.float64, device=device)
    lo, hi = float(thresholds[0]), float(thresholds[-1])
    hist = torch.zeros(2 * num_t, dtype=torch.int64, device=device)
    problems = torch.zeros(3, dtype=torch.int64, device=device)
    for start in range(0, scores.numel(), chunk_pixels):
        s = scores[start : start + chunk_pixels].to(torch.float64)
        lab = labels[start : start + chunk_pixels]
        ignored = lab == IGNORE
        counted = lab <= OOD
        problems[N_IGNORED] += ignored.sum()
        problems[N_BAD_LABEL] += (~(ignored | counted)).sum()
        if clip:
            bad = counted & torch.isnan(s)
            s = s.clamp(lo, hi)  # in float64, so a clamped score equals t_0 / t_{T-1} exactly
        else:
            bad = counted & ~((s >= lo) & (s <= hi))
        problems[N_BAD_SCORE] += bad.sum()
        keep = counted & ~bad
        # bucketize(right=True) = number of thresholds <= s; minus one is the bin.
        j = torch.bucketize(s[keep], t, right=True) - 1
        hist += torch.bincount(lab[keep].to(torch.int64) * num_t + j, minlength=2 * num_t)
    out = torch.cat([hist, problems]).cpu().numpy()
    return out[: 2 * num_t].reshape(2, num_t), out[2 * num_t :]
