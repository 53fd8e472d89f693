"""Private histogram kernels: plain arrays in, counts out. The public wrapper validates and converts.

Both kernels put every counted pixel in bin ``j`` = (number of thresholds ``t`` with ``float64(score) >= t``)
- 1, so the pixel is predicted OOD at thresholds ``0..j`` and the per-threshold counts are reverse cumulative
sums of the histogram. The numba kernel uses the arithmetic guess ``floor((s - lo) * scale)`` where it is
proven right: for every score of the input's dtype when ``exact_guess`` says so (float32 scores on the usual
ranges), else only far from a bin edge (see ``guess_margin``) or exactly on the first or last threshold; it
compares with the very threshold array otherwise. The torch kernel always compares. So scores on a threshold
or one ulp beside it land where the literal comparison puts them.
"""

import functools
from concurrent.futures import ThreadPoolExecutor

import numba
import numpy as np

from segood.labels import IGNORE, OOD

# Slots of the ``problems`` counters the kernels return next to the histogram.
N_IGNORED, N_BAD_LABEL, N_BAD_SCORE = 0, 1, 2
_BLOCK = 1024  # pixels per vectorised step; their slots stay in L1


def guess_margin(thresholds):
    """How close (in bins) to a bin edge the arithmetic guess ``floor((s - lo) * scale)`` may be wrong.

    ``numpy.linspace`` and the guess each err by a few float64 ulps; in bin units both stay below
    ``8 eps (T - 1) (1 + (|lo| + |hi|) / (hi - lo))``. The kernel trusts the guess only at least 8 times that
    far from an edge and compares with the thresholds otherwise. 1.0 (never trust) for absurd ranges.
    """
    lo, hi = float(thresholds[0]), float(thresholds[-1])
    bound = 8 * np.finfo(np.float64).eps * (thresholds.size - 1) * (1 + (abs(lo) + abs(hi)) / (hi - lo))
    return min(8 * bound, 1.0)


@functools.lru_cache(maxsize=64)
def exact_guess(lo, hi, num_thresholds, dtype):
    """Whether the kernel's guess is the literal bin for every score of ``dtype`` in [lo, hi] (thresholds
    ``numpy.linspace(lo, hi, num_thresholds)``).

    The guess ``floor(clamp((float64(s) - lo) * scale, 0, T - 1))`` and the literal bin (number of thresholds
    ``<= float64(s)``, minus one) are both non-decreasing step functions of ``s``: rounding, a positive factor
    and floor keep order. So they agree on every value between two points where they agree with the same bin.
    The literal bin steps at ``c_k``, the first ``dtype`` value at or above ``t_k``; checking both at each
    ``c_k``, at the value just below it and at the last value in range brackets every score in the range.
    lo and hi themselves are checked too: by monotonicity and the clamp, a clipped score below lo or above hi
    gets their guess. Typically true for float32 scores and false for float64 ones (whose values sit on the
    thresholds).
    """
    dtype = np.dtype(dtype)
    thresholds = np.linspace(lo, hi, num_thresholds)
    first = thresholds.astype(dtype)
    below = first.astype(np.float64) < thresholds
    first[below] = np.nextafter(first[below], dtype.type(np.inf))
    last = dtype.type(hi)
    if float(last) > hi:
        last = np.nextafter(last, dtype.type(-np.inf))
    points = np.concatenate([first, np.nextafter(first, dtype.type(-np.inf)), [last]]).astype(np.float64)
    points = np.append(points, [lo, hi])
    points = points[(points >= lo) & (points <= hi)]
    literal = np.searchsorted(thresholds, points, side="right") - 1
    guess = np.floor(np.clip((points - lo) * ((num_thresholds - 1) / (hi - lo)), 0, num_thresholds - 1))
    return bool(np.array_equal(guess, literal))


@numba.njit(inline="always")
def _exact_bin(thresholds, j, s):
    """The literal bin: the largest k with thresholds[k] <= s, searched from the guess j."""
    last = thresholds.size - 1
    j = min(max(j, 0), last)
    while j > 0 and thresholds[j] > s:
        j -= 1
    while j < last and thresholds[j + 1] <= s:
        j += 1
    return j


@numba.njit(inline="always")
def _position(s, lo, scale, top):
    """(s - lo) * scale clamped to [0, T - 1] (NaN -> 0): the guess is its floor."""
    g = (s - lo) * scale
    g = g if g >= 0.0 else 0.0
    return g if g <= top else top


@numba.njit(nogil=True, cache=True)
def _histogram_kernel(scores, labels, thresholds, clip, exact, margin, hist, problems):
    """Histogram of 1-D ``scores`` (float32/64) by 1-D uint8 ``labels``, added into ``hist`` (2 T + 2,) int32.

    Row-major bins: ``label * T + bin``; the two slots after them are scratch (left zero). Fewer than 2**31
    pixels per call. Adds to ``problems`` (3,) int64: ignored pixels, labels outside {0, 1, 255}, scores NaN or
    outside [t_0, t_{T-1}] (with ``clip``, only NaN). Problem pixels are not binned. Serial and GIL-free: the
    wrapper runs chunks on threads.

    Per block of ``_BLOCK`` pixels, a branch-free (vectorised) loop computes every pixel's slot: its bin if
    the pixel is counted and its guess is trusted, else one of the two scratch slots (ignored / careful). With
    ``exact`` (see ``exact_guess``) every counted score in range is trusted; otherwise a score at least
    ``margin`` from a bin edge or exactly on the first or last threshold. A tight loop then increments the
    slots. Only a block that sent a pixel to the careful slot is scanned again, comparing those pixels with
    the thresholds. Slots are computed in float64 lanes (exact for these integers): no 64-bit integer shuffles.
    """
    num_t = thresholds.size
    lo = thresholds[0]
    hi = thresholds[num_t - 1]
    scale = (num_t - 1) / (hi - lo)
    top = num_t - 1.0
    row = np.float64(num_t)
    # Exact mode: the guess is monotone and clamped, so a score below lo or above hi gets the guess of lo or hi,
    # which exact_guess checks too; with ``clip`` only NaN (which fails both comparisons) is careful.
    lo_in = -np.inf if clip else lo
    hi_in = np.inf if clip else hi
    # Margin mode: with a sane margin the thresholds are distinct, so lo and hi lie in the first and last bin.
    half = 0.5 - margin
    lo_exact = lo if margin < 0.5 else np.nan
    hi_exact = hi if margin < 0.5 else np.nan
    ignored_slot = np.uint32(2 * num_t)
    careful_slot = np.uint32(2 * num_t + 1)
    slot = np.empty(_BLOCK, np.int32)
    uslot = slot.view(np.uint32)  # unsigned indexing: no negative-index wraparound in the scatter loop
    bad_label = bad_score = 0
    careful_seen = hist[careful_slot]
    for start in range(0, scores.size, _BLOCK):
        block_scores = scores[start : start + _BLOCK]
        block_labels = labels[start : start + _BLOCK]
        if exact:
            for k in range(block_scores.size):  # branch-free, so it vectorises
                label = block_labels[k]
                s = np.float64(block_scores[k])
                trusted = (label <= OOD) & (s >= lo_in) & (s <= hi_in)
                j = np.floor(_position(s, lo, scale, top))
                fallback = ignored_slot if label == IGNORE else careful_slot
                slot[k] = np.int32(label * row + j if trusted else fallback)
        else:
            for k in range(block_scores.size):
                label = block_labels[k]
                s = np.float64(block_scores[k])
                g = _position(s, lo, scale, top)
                j = np.floor(g)
                # Out of range or NaN: clamped onto an edge (g - j = 0), never trusted by the margin.
                at_lo = s == lo_exact
                at_hi = s == hi_exact
                trusted = (label <= OOD) & ((abs(g - j - 0.5) <= half) | at_lo | at_hi)
                fallback = ignored_slot if label == IGNORE else careful_slot
                slot[k] = np.int32(label * row + (top if at_hi else j) if trusted else fallback)
        for k in range(block_scores.size):
            hist[uslot[k]] += 1
        if hist[careful_slot] == careful_seen:
            continue
        careful_seen = hist[careful_slot]
        for k in range(block_scores.size):
            if uslot[k] != careful_slot:
                continue
            label = block_labels[k]
            s = np.float64(block_scores[k])
            if label > OOD:
                bad_label += 1
            elif (s >= lo and s <= hi) or (clip and s == s):
                s = min(max(s, lo), hi)
                hist[label * num_t + _exact_bin(thresholds, np.int64((s - lo) * scale), s)] += 1
            else:
                bad_score += 1
    problems[N_IGNORED] += hist[ignored_slot]
    problems[N_BAD_LABEL] += bad_label
    problems[N_BAD_SCORE] += bad_score
    hist[ignored_slot] = hist[careful_slot] = 0


@functools.lru_cache(maxsize=None)
def _pool(threads):
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="segood-histogram")


def histogram_numpy(scores, labels, thresholds, clip, threads):
    """Run the numba kernel on ``threads`` chunks in parallel; returns (hist (2, T) int64, problems (3,) int64)."""
    chunks = max(threads, -(-scores.size // (1 << 30)))  # int32 bins: under 2**31 pixels a chunk
    num_t = thresholds.size
    hist = np.zeros((chunks, 2 * num_t + 2), dtype=np.int32)
    problems = np.zeros((chunks, 3), dtype=np.int64)
    exact = exact_guess(float(thresholds[0]), float(thresholds[-1]), num_t, scores.dtype.str)
    margin = guess_margin(thresholds)
    bounds = [scores.size * c // chunks for c in range(chunks + 1)]

    def work(c):
        part = slice(bounds[c], bounds[c + 1])
        _histogram_kernel(scores[part], labels[part], thresholds, clip, exact, margin, hist[c], problems[c])

    if chunks == 1:
        work(0)
    else:
        list(_pool(threads).map(work, range(chunks)))
    return hist[:, : 2 * num_t].sum(axis=0, dtype=np.int64).reshape(2, num_t), problems.sum(axis=0)


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
