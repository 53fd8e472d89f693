"""Private histogram kernels: plain arrays in, counts out. The public wrappers validate and convert.

The linear grid's kernels come first, the float-order grid's after them.

Both kernels put every counted pixel in bin ``j`` = (number of thresholds ``t`` with ``float64(score) >= t``)
- 1, so the pixel is predicted OOD at thresholds ``0..j`` and the per-threshold counts are reverse cumulative
sums of the histogram. The numba kernel uses the arithmetic guess ``floor((s - lo) * scale)`` where it is
proven right: for every score of the input's dtype when ``exact_guess`` says so (float32 scores on the usual
ranges), else only far from a bin edge (see ``guess_margin``) or exactly on the first or last threshold; it
compares with the very threshold array otherwise. The torch kernel always compares. So scores on a threshold
or one ulp beside it land where the literal comparison puts them.
"""

import contextlib
import functools
import signal
import threading
from _signal import signal as _set_handler  # what signal.signal wraps in enum conversions, 10x slower (11 us a pair)

import numba
import numpy as np

from segood._threads import run_chunks
from segood.labels import IGNORE, OOD

# Slots of the ``problems`` counters the kernels return next to the histogram.
N_IGNORED, N_BAD_LABEL, N_BAD_SCORE = 0, 1, 2
_BLOCK = 1024  # pixels per vectorised step; their slots stay in L1
_TAKE = 1 << 15  # the fewest pixels in a chunk the threads of a float-order call take in turn
_LARGEST = 1 << 24  # the most: bounds the temporaries of binning a chunk's careful pixels (_careful)
_COUNTER_LIMIT = (1 << 31) - 1  # pixels a thread's int32 table may count before it is drained


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


@numba.njit(inline="always")
def _add_runs(table, idx, n, step):
    """``table[idx[k]] += step`` for k < n (n >= 1). Where an eighth of the slots or more repeat the one before, each
    run of equal slots is added at once: pixels of one bin in a row (the saturated scores of a confident network)
    would otherwise each wait for the store of the one before."""
    repeats = np.uint32(0)
    for k in range(1, n):  # (vectorised)
        repeats += np.uint32(idx[k] == idx[k - 1])
    if repeats * 8 < n:
        for k in range(n):
            table[idx[k]] += step
        return
    current, run = idx[0], 0
    for k in range(n):
        if idx[k] == current:
            run += 1
        else:
            table[current] += run * step
            current, run = idx[k], 1
    table[current] += run * step


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
        _add_runs(hist, uslot, block_scores.size, 1)
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


def histogram_numpy(scores, labels, thresholds, clip, threads):
    """Run the numba kernel on ``threads`` chunks in parallel; returns (hist (2, T) int64, problems (3,) int64)."""
    chunks = max(threads, -(-scores.size // (1 << 30)))  # int32 bins: under 2**31 pixels a chunk
    num_t = thresholds.size
    hist = np.zeros((chunks, 2 * num_t + 2), dtype=np.int32)
    problems = np.zeros((chunks, 3), dtype=np.int64)
    exact = exact_guess(float(thresholds[0]), float(thresholds[-1]), num_t, scores.dtype.str)
    margin = guess_margin(thresholds)
    bounds = [scores.size * c // chunks for c in range(chunks + 1)]

    def work(taken):
        for c in taken:
            part = slice(bounds[c], bounds[c + 1])
            _histogram_kernel(scores[part], labels[part], thresholds, clip, exact, margin, hist[c], problems[c])

    run_chunks(work, chunks, threads)
    return hist[:, : 2 * num_t].sum(axis=0, dtype=np.int64).reshape(2, num_t), problems.sum(axis=0)


def _torch_problems(lab, counted, nan):
    """(3,) int64 device tensor: ignored pixels, pixels of no known label, counted pixels with a NaN score."""
    import torch

    ignored = (lab == IGNORE).sum()  # reductions: a bincount of two labels serialises on the device's atomics
    return torch.stack([ignored, (~counted).sum() - ignored, (counted & nan).sum()])


def histogram_torch(scores, labels, thresholds, clip, chunk_pixels=1 << 24):
    """The same histogram with torch ops on the tensors' own device (no copy of the scores to the host).

    A pixel that is not counted goes to one extra bin that is dropped at the end, so no step compacts the
    arrays (which would wait for the device) and the device does a fixed number of passes.

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
    hist = torch.zeros(2 * num_t + 1, dtype=torch.int64, device=device)
    problems = torch.zeros(3, dtype=torch.int64, device=device)
    for start in range(0, scores.numel(), chunk_pixels):
        s = scores[start : start + chunk_pixels].to(torch.float64)
        lab = labels[start : start + chunk_pixels]
        counted = lab <= OOD
        if clip:
            nan = torch.isnan(s)
            s = s.clamp(lo, hi)  # in float64, so a clamped score equals t_0 / t_{T-1} exactly
        else:
            nan = ~((s >= lo) & (s <= hi))  # out of range (NaN included) is a bad score here
        problems += _torch_problems(lab, counted, nan)
        # bucketize(right=True) = number of thresholds <= s; minus one is the bin.
        j = torch.bucketize(s, t, right=True) - 1 + lab.to(torch.int64) * num_t
        hist += torch.bincount(torch.where(counted & ~nan, j, 2 * num_t), minlength=2 * num_t + 1)
    out = torch.cat([hist[:-1], problems]).cpu().numpy()
    return out[: 2 * num_t].reshape(2, num_t), out[2 * num_t :]


# -- float-order grid ------------------------------------------------------------------------------------------
# A pixel's bin is the top bits of the order-preserving key of its float64 value (docs/metric_engine.md):
# bin = key >> (52 - m), split into its binade (key >> 52: sign and exponent, 4096 of them) and m low bits.
# Counts are kept per occupied binade: a table maps a binade to a slot of 2 x 2^m counters (ID, OOD).

SIGN = np.uint64(1 << 63)
BINADES = 4096


@numba.njit(nogil=True, cache=True)
def _float_order_kernel(scores, labels, m, hist, slot_of, n_slots, problems):
    """Float-order histogram of 1-D float32/64 ``scores`` by uint8 ``labels``, added into ``hist``.

    ``hist``: (slots x 2 x 2^m + 2,) int32, counts of slot s, label l, low bits b at (2 s + l) 2^m + b, then an
    ignored and a careful scratch slot. ``slot_of``: (4096,) int32, the slot of each binade or -1. Returns
    (hist, n_slots): ``hist`` is reallocated (twice as many slots) when a new binade finds it full. Fewer than
    2**31 pixels per call. Adds to ``problems`` as the linear kernel does (NaN is the only bad score).

    Per block of _BLOCK pixels: float64 values (-0.0 made +0.0 by adding 0.0), their bits as uint64, the key
    (sign bit flipped for x >= 0, every bit for x < 0), then a branch-free slot per pixel: its counter if the
    label is counted and its binade has a slot, else a scratch slot. A tight loop increments; only a block
    that sent a pixel to the careful slot is scanned again (new binade, NaN, bad label).
    """
    shift = np.uint64(52 - m)
    low_mask = np.uint64((1 << m) - 1)
    width = np.int64(1) << m
    values = np.empty(_BLOCK, np.float64)
    bits = values.view(np.uint64)
    slot = np.empty(_BLOCK, np.int64)
    uslot = slot.view(np.uint64)  # unsigned indexing: no negative-index wraparound code, so loops vectorise
    capacity = (hist.size - 2) // (2 * width)
    ignored_slot = hist.size - 2
    careful_slot = hist.size - 1
    bad_label = bad_score = 0
    careful_seen = hist[careful_slot]
    for start in range(0, scores.size, _BLOCK):
        block_scores = scores[start : start + _BLOCK]
        block_labels = labels[start : start + _BLOCK]
        n = block_scores.size
        for k in range(n):
            values[k] = np.float64(block_scores[k]) + 0.0
        for k in range(n):  # branch-free, so it vectorises
            u = bits[k]
            key = u ^ ((np.uint64(0) - (u >> np.uint64(63))) | SIGN)
            s = slot_of[key >> np.uint64(52)]
            label = block_labels[k]
            counted = (label <= OOD) & (s >= 0) & (values[k] == values[k])
            index = ((2 * s + label) << m) | np.int64((key >> shift) & low_mask)
            fallback = ignored_slot if label == IGNORE else careful_slot
            slot[k] = index if counted else fallback
        for k in range(n):
            hist[uslot[k]] += 1
        if hist[careful_slot] == careful_seen:
            continue
        careful_seen = hist[careful_slot]
        block_careful = careful_slot  # the careful slot of this block's indices (a grown table moves it)
        for k in range(n):
            if slot[k] != block_careful:
                continue
            label = block_labels[k]
            if label > OOD:
                bad_label += 1
                continue
            if values[k] != values[k]:
                bad_score += 1
                continue
            u = bits[k]
            key = u ^ ((np.uint64(0) - (u >> np.uint64(63))) | SIGN)
            binade = np.int64(key >> np.uint64(52))
            if slot_of[binade] < 0:
                if n_slots == capacity:  # grow: twice the slots, scratch counters moved to the new end
                    grown = np.zeros(2 * capacity * 2 * width + 2, hist.dtype)
                    grown[: capacity * 2 * width] = hist[: capacity * 2 * width]
                    grown[grown.size - 2] = hist[ignored_slot]
                    grown[grown.size - 1] = hist[careful_slot]
                    hist = grown
                    capacity *= 2
                    ignored_slot = hist.size - 2
                    careful_slot = hist.size - 1
                slot_of[binade] = n_slots
                n_slots += 1
            hist[((2 * slot_of[binade] + label) << m) | np.int64((key >> shift) & low_mask)] += 1
    problems[N_IGNORED] += hist[ignored_slot]
    problems[N_BAD_LABEL] += bad_label
    problems[N_BAD_SCORE] += bad_score
    hist[ignored_slot] = hist[careful_slot] = 0
    return hist, n_slots


@numba.njit(nogil=True, cache=True)
def _scratch_counts(table, problems):
    """A fast kernel's end: its ignored pixels (the table's second-to-last slot) added to ``problems``, both scratch
    slots cleared; returns the careful pixels (the last slot)."""
    problems[N_IGNORED] += table[-2]
    careful = table[-1]
    table[-2] = table[-1] = 0
    return careful


@numba.njit(nogil=True, cache=True)
def _float32_kernel(bits, labels, m, table, occupied, problems, step):
    """The float-order histogram of float32 scores (as their uint32 ``bits``), in 32-bit lanes and without a
    table lookup: rows are (sign, float32 exponent), 512 of them, each 2 x 2^m counters (ID, OOD) of the top m
    mantissa bits, in ``table`` ((512 x 2 x 2^m + 2,) int32, then the ignored and the careful scratch).
    A float32 normal number's float64 key has the same mantissa bits and a binade fixed by (sign, exponent),
    so the rows map to float64 bins afterwards (:func:`drain`). Zeros (either sign) go to
    row 0. Subnormals, infinities, NaN and bad labels go to the careful slot: the wrapper bins them the slow way.
    Marks in ``occupied`` (512 bytes) the zero row and, per block, every row between those of its lowest and its
    highest score bits, a superset of the rows counted in (a normal number's row is its top 9 bits; the lowest
    of every pixel's bits but zeros', the highest of its normal numbers', from two reductions in the vectorised
    loop: a mark per pixel cost a fifth of the kernel's time, masking the uncounted pixels out 4%), so that the
    caller reads and clears only those.
    A block of both signs would so mark every row between its positive and its negative scores (up to nearly
    every row) for each drain to read: its rows are marked per sign instead, from a second pass over the block
    (:func:`_mark_signs`).
    Each pixel adds ``step`` to its counter (1; -1 takes a call's counts out again: :meth:`Kept.undo`). Returns
    the number of careful pixels.
    """
    # numba computes integer arithmetic in 64 bits: every result is cast back to 32, so that the loop vectorises
    # in 32-bit lanes, twice as many (14% faster). The width 2^m is read from the table's size, not computed as
    # 1 << m: the compiler would turn a multiplication by that into a shift by m, which stays 64-bit.
    u = np.uint32
    width = u((table.size - 2) >> 10)
    idx = np.empty(_BLOCK, np.uint32)
    ignored_index = u(table.size - 2)
    careful_index = u(table.size - 1)
    for start in range(0, bits.size, _BLOCK):
        block_bits = bits[start : start + _BLOCK]
        block_labels = labels[start : start + _BLOCK]
        n = block_bits.size
        zeros, lowest, highest = u(0), u(0xFFFFFFFF), u(0)
        for k in range(n):  # branch-free, so it vectorises
            b = block_bits[k]
            label = u(block_labels[k])
            magnitude = u(b & u(0x7FFFFFFF))
            exponent = u(magnitude >> u(23))
            zero = magnitude == u(0)
            normal = u(exponent - u(1)) < u(254)
            row = u(0) if zero else u(b >> u(23))  # (sign, exponent)
            ok = (label <= u(OOD)) & (normal | zero)
            top = u(u(u(magnitude & u(0x7FFFFF)) >> u(9)) * width) >> u(14)  # the top m mantissa bits (m <= 14)
            index = u(u(u(u(row << u(1)) | label) * width) | top)
            idx[k] = index if ok else (ignored_index if label == u(IGNORE) else careful_index)
            zeros |= u(zero)  # zero apart, so that zeros among values near 1 mark two rows, not 127:
            lowest = min(lowest, u(b - u(1)))  # its bits minus one wrap around to the top
            highest = max(highest, b if normal else u(0))  # (zeros: the zero row; infinities, NaN: careful)
        _add_runs(table, idx, n, step)
        occupied[0] |= zeros
        if lowest < u(0x7FFFFFFF) and highest > u(0x80000000):  # a positive score and a negative one
            _mark_signs(block_bits, occupied)
        else:
            _mark_rows(occupied, lowest, highest)
    return _scratch_counts(table, problems)


@numba.njit(inline="always")
def _mark_rows(occupied, lowest, highest):
    """Mark the rows from that of ``lowest`` + 1 to that of ``highest`` (top 9 bits; none where ``lowest`` is
    2^32 - 1, the top its wrap-around leaves: computed in 64 bits, so + 1 does not wrap back to 0)."""
    for row in range((lowest + np.uint32(1)) >> np.uint32(23), (highest >> np.uint32(23)) + np.uint32(1)):
        occupied[row] = 1


@numba.njit(inline="always")
def _mark_signs(bits, occupied):
    """Mark the rows of a block of float32 ``bits`` per sign: for each, the rows between its lowest and its highest
    normal magnitude (zeros, infinities and NaN aside), as the float32 kernel marks a block of one sign."""
    u = np.uint32
    low_positive, high_positive, low_negative, high_negative = u(0xFFFFFFFF), u(0), u(0xFFFFFFFF), u(0)
    for k in range(bits.size):  # (vectorised)
        b = bits[k]
        magnitude = u(b & u(0x7FFFFFFF))
        normal = u(u(magnitude >> u(23)) - u(1)) < u(254)
        below = u(magnitude - u(1)) if normal else u(0xFFFFFFFF)
        above = magnitude if normal else u(0)
        negative = b > u(0x7FFFFFFF)
        low_positive = min(low_positive, u(0xFFFFFFFF) if negative else below)
        high_positive = max(high_positive, u(0) if negative else above)
        low_negative = min(low_negative, below if negative else u(0xFFFFFFFF))
        high_negative = max(high_negative, above if negative else u(0))
    _mark_rows(occupied, low_positive, high_positive)
    _mark_rows(occupied[256:], low_negative, high_negative)


@numba.njit(nogil=True, cache=True)
def _float64_kernel(scores, labels, m, table, occupied, problems, step):
    """The float-order histogram of float64 ``scores`` with every binade a row of ``table`` ((4096 x 2 x 2^m + 2,)
    int32: ID, OOD counts of the m low bits per binade, then the ignored and the careful scratch), so that no
    lookup stands between a pixel and its counter and the loop vectorises as the float32 kernel's does. The table
    is large (32 MiB at m = 10) but only the rows in use are ever touched, so only they take memory.
    Marks in ``occupied`` (4096 bytes) every row between the lowest and the highest row each block counted in, per
    sign (scores of both signs would otherwise mark every row between). NaN scores and bad labels go to the
    careful slot: the wrapper counts them. Each pixel adds ``step`` (as the float32 kernel's). Returns the number
    of careful pixels.
    """
    u = np.uint32  # (the key in 64 bits, the rest cast back to 32: vectorises in 32-bit lanes, as _float32_kernel's)
    shift = np.uint64(52 - m)
    low_mask = u((1 << m) - 1)
    width = u((table.size - 2) >> 13)  # 2^m: 4096 x 2 rows of it
    half = u(BINADES // 2)
    values = np.empty(_BLOCK, np.float64)
    bits = values.view(np.uint64)
    idx = np.empty(_BLOCK, np.uint32)
    ignored_index = u(table.size - 2)
    careful_index = u(table.size - 1)
    for start in range(0, scores.size, _BLOCK):
        block_scores = scores[start : start + _BLOCK]
        block_labels = labels[start : start + _BLOCK]
        n = block_scores.size
        for k in range(n):
            values[k] = block_scores[k] + 0.0  # -0.0 becomes +0.0
        low_negative, high_negative = u(half - u(1)), u(0)
        low_positive, high_positive = u(BINADES - 1), half
        for k in range(n):  # branch-free, so it vectorises
            b = bits[k]
            key = b ^ ((np.uint64(0) - (b >> np.uint64(63))) | SIGN)
            row = u(key >> np.uint64(52))
            label = u(block_labels[k])
            ok = (label <= u(OOD)) & (values[k] == values[k])
            index = u(u(u(u(row << u(1)) | label) * width) | u(u(key >> shift) & low_mask))
            idx[k] = index if ok else (ignored_index if label == u(IGNORE) else careful_index)
            positive = row >= half
            low_positive = min(low_positive, row if ok & positive else u(BINADES - 1))
            high_positive = max(high_positive, row if ok & positive else half)
            low_negative = min(low_negative, row if ok & ~positive else u(half - u(1)))
            high_negative = max(high_negative, row if ok & ~positive else u(0))
        _add_runs(table, idx, n, step)
        for row in range(low_negative, high_negative + 1):
            occupied[row] = 1
        for row in range(low_positive, high_positive + 1):
            occupied[row] = 1
    return _scratch_counts(table, problems)


@numba.njit(nogil=True, cache=True)
def _float16_kernel(halves, labels, m, patterns, marked, problems, step):
    """The float16 scores' (as their uint16 ``halves``) counts by bit pattern, without converting a pixel, in
    ``patterns`` ((64 x 2 x 1024 + 2,) int32: per sign and exponent a row of ID and OOD counts of the 10 mantissa
    bits, then the ignored and the careful scratch), rows marked in ``marked`` (64 bytes) as the float32 kernel
    marks its own; ``m`` is not used here (:func:`_replay_halves` bins the patterns). Infinities, NaN and bad
    labels go to the careful slot (:func:`_careful` bins them from their values). Each pixel adds ``step`` (as the
    float32 kernel's). Returns the number of careful pixels."""
    idx = np.empty(_BLOCK, np.uint32)
    ignored_index = np.uint32(patterns.size - 2)
    careful_index = np.uint32(patterns.size - 1)
    for start in range(0, halves.size, _BLOCK):
        block_halves = halves[start : start + _BLOCK]
        block_labels = labels[start : start + _BLOCK]
        n = block_halves.size
        lowest, highest = np.uint32(63), np.uint32(0)
        for k in range(n):  # branch-free, so it vectorises
            h = np.uint32(block_halves[k])
            label = np.uint32(block_labels[k])
            row = h >> np.uint32(10)
            ok = (label <= np.uint32(OOD)) & ((row & np.uint32(31)) != np.uint32(31))  # (exponent 31: inf, NaN)
            index = (((row << np.uint32(1)) | label) << np.uint32(10)) | (h & np.uint32(0x3FF))
            idx[k] = index if ok else (ignored_index if label == np.uint32(IGNORE) else careful_index)
            lowest = min(lowest, row if ok else np.uint32(63))
            highest = max(highest, row if ok else np.uint32(0))
        _add_runs(patterns, idx, n, step)
        for row in range(lowest, highest + 1):
            marked[row] = 1
    return _scratch_counts(patterns, problems)


@numba.njit(nogil=True, cache=True)
def _replay_halves(patterns, marked, m, table, occupied):
    """Add each float16 pattern count of the marked rows of ``patterns`` where the float32 kernel counts its value
    (every float16 is a float32: a normal one keeps its top mantissa bits, a subnormal one, mantissa x 2^-24, is
    the float32 of its mantissa, 24 binades down), in its ``table`` and row marks at resolution m; clears what it
    read."""
    shift = np.uint32(23 - m)
    for row in range(64):
        if not marked[row]:
            continue
        marked[row] = 0
        sign, exponent = np.uint32(row >> 5) << np.uint32(31), np.uint32(row & 31)
        for label in range(2):
            base = ((row << 1) | label) << 10
            for mantissa in range(1024):
                count = patterns[base + mantissa]
                if count == 0:
                    continue
                patterns[base + mantissa] = 0
                if exponent != 0:
                    b = sign | ((exponent + np.uint32(112)) << np.uint32(23)) | (np.uint32(mantissa) << np.uint32(13))
                elif mantissa != 0:
                    b = sign | (np.float32(mantissa).view(np.uint32) - np.uint32(24 << 23))
                else:
                    b = sign
                magnitude = b & np.uint32(0x7FFFFFFF)
                row32 = np.uint32(0) if magnitude == 0 else (b >> np.uint32(31)) * np.uint32(256) + (
                    magnitude >> np.uint32(23))
                table[(((row32 << np.uint32(1)) | np.uint32(label)) << np.uint32(m))
                      | ((magnitude & np.uint32(0x7FFFFF)) >> shift)] += count
                occupied[row32] = 1


def _rows(binades, reversed_rows):
    return binades.astype(np.int64), reversed_rows, np.argsort(binades, kind="stable")


def _float32_rows():
    """Row 0 is zero (binade 2048), a positive row e binade 2048 + 896 + e, a negative one (256 + e) binade
    2047 - 896 - e with its low bits reversed (a negative key is the float64 bits inverted)."""
    rows = np.arange(512)
    sign, exponent = rows // 256, rows % 256
    return _rows(np.where(rows == 0, 2048, np.where(sign == 0, 2048 + 896 + exponent, 2047 - 896 - exponent)),
                 sign == 1)


#: Per fast kernel, for each table row: its binade, whether its low bits run backwards, and the rows in
#: increasing binade order (float64 rows are the binades themselves).
ROW_BINADES = {np.dtype(np.float32): _float32_rows(),
               np.dtype(np.float64): _rows(np.arange(BINADES), np.zeros(BINADES, bool))}


@numba.njit(nogil=True, cache=True)
def drain(tables, marks, m, row_binades, reversed_rows, order):
    """The counts of the fast kernels' ``tables`` (a tuple: one per thread) summed over their marked rows that hold
    a pixel, in float64 terms: (binades (k,) int64 increasing, counts (k, 2, 2^m) int64), with each row's binade
    and direction from :data:`ROW_BINADES`. Clears the rows it read and the ``marks``."""
    width = 1 << m
    n_rows = marks[0].size
    filled = np.zeros(n_rows, np.bool_)
    for t in range(len(tables)):
        rows = tables[t][: n_rows * 2 * width].reshape(n_rows, 2, width)
        for row in range(n_rows):
            if marks[t][row] and not filled[row]:
                for b in range(width):
                    if rows[row, 0, b] != 0 or rows[row, 1, b] != 0:
                        filled[row] = True
                        break
    binades = np.empty(int(filled.sum()), np.int64)
    counts = np.zeros((binades.size, 2, width), np.int64)
    i = 0
    for row in order:
        if filled[row]:
            binades[i] = row_binades[row]
            for t in range(len(tables)):
                if marks[t][row]:
                    rows = tables[t][: n_rows * 2 * width].reshape(n_rows, 2, width)
                    for label in range(2):
                        for b in range(width):
                            counts[i, label, b] += rows[row, label, width - 1 - b if reversed_rows[row] else b]
                    rows[row] = 0  # (a marked row that holds nothing is zero already: not touched, not paged in)
            i += 1
    for t in range(len(tables)):
        marks[t][:] = 0
    return binades, counts


def _general(scores, labels, m, problems, initial_slots=8):
    """(binades, counts) of the general kernel (any float64 or float32 scores); adds to ``problems``."""
    hist = np.zeros(initial_slots * (2 << m) + 2, np.int32)
    slot_of = np.full(BINADES, -1, np.int32)
    hist, n_slots = _float_order_kernel(scores, labels, m, hist, slot_of, 0, problems)
    counts = hist[: n_slots * (2 << m)].reshape(n_slots, 2, 1 << m)
    return np.flatnonzero(slot_of >= 0), counts[slot_of[slot_of >= 0]]


_FAST = {np.dtype(np.float16): 14, np.dtype(np.float32): 14,  # the largest m of each (float64: 32 MiB of table)
         np.dtype(np.float64): 10}
_FREE = {}  # (dtype, bits per row) -> [(table, row marks)]: clear tables of the fast kernels, not in use
_FREE_LOCK = threading.Lock()


def _table(dtype, m):
    """A clear table of the fast kernel for ``dtype`` at resolution m (float16: its pattern counts, whatever m) and
    its row marks, the caller's until :func:`_drained` gives it back; the pages of rows never used are never
    touched."""
    key = _table_key(dtype, m)
    with _FREE_LOCK:
        if _FREE.get(key):
            return _FREE[key].pop()
    rows = 64 if dtype == np.float16 else ROW_BINADES[key[0]][0].size
    return np.zeros(rows * (2 << key[1]) + 2, np.int32), np.zeros(rows, np.uint8)


def _drained(dtype, m, tables, marks, *, keep=False):
    """(binades, counts) of the fast kernels' ``tables`` and row ``marks`` (tuples: one per thread; float16 patterns
    binned in a float32 table first), summed (:func:`drain`); every table cleared and given back (``keep``: kept,
    to count on)."""
    try:
        if dtype == np.float16:  # each thread's patterns binned and drained alone: together they may pass 2^31
            table, occupied = _table(np.float32, m)
            try:
                parts = []
                for patterns, marked in zip(tables, marks):
                    _replay_halves(patterns, marked, m, table, occupied)
                    parts.append(drain((table,), (occupied,), m, *ROW_BINADES[np.dtype(np.float32)]))
                return merge_binades(parts, owned=True)
            finally:
                _give_back(np.float32, m, table, occupied)
        return drain(tables, marks, m, *ROW_BINADES[np.dtype(dtype)])
    finally:
        for table, occupied in zip(tables, marks):
            if keep:
                _clear(table, occupied)
            else:
                _give_back(dtype, m, table, occupied)


def _clear(table, occupied):
    """Clear what a call left in ``table`` (the drain clears the rows it read; an interrupt may leave more)."""
    if occupied.any():
        table[:] = 0
        occupied[:] = 0
    table[-2:] = 0


def _give_back(dtype, m, table, occupied):
    """Clear ``table`` and put it back among the free tables."""
    _clear(table, occupied)
    with _FREE_LOCK:
        _FREE.setdefault(_table_key(dtype, m), []).append((table, occupied))


def _table_key(dtype, m):
    return np.dtype(dtype), 10 if dtype == np.float16 else m  # (float16 patterns: 10 bits a row, whatever m)


def _careful(scores, labels, m, problems):
    """The pixels a fast kernel leaves to its careful slot, binned by the general kernel: for float32 subnormals,
    infinities, NaN and bad labels; for float16 infinities, NaN and bad labels; for float64 NaN and bad labels."""
    if scores.dtype == np.float32:
        magnitude = scores.view(np.uint32) & np.uint32(0x7FFFFFFF)
        exponent = magnitude >> np.uint32(23)
        odd = ((exponent == 0) & (magnitude != 0)) | (exponent == 255)
    elif scores.dtype == np.float16:  # (its subnormals are float32 normals: counted by the kernel)
        odd = (scores.view(np.uint16) & np.uint16(0x7C00)) == np.uint16(0x7C00)
    else:
        odd = np.isnan(scores)
    careful = (labels != IGNORE) & (odd | (labels > OOD))
    values = scores[careful]
    return _general(values.astype(np.float32) if values.dtype == np.float16 else values, labels[careful], m,
                    problems)


def float_histogram_numpy(scores, labels, m, threads, initial_slots=8, *, kept=None):
    """Run the float-order kernels on ``threads`` chunks in parallel: the fast kernel of the scores' dtype (float32
    up to m = 14, float64 up to m = 10), else the general one (a binade lookup per pixel).

    ``kept``: a :class:`Kept` whose tables the fast kernels count into and leave undrained where it is
    :meth:`~Kept.ready` for the call (the call then to be committed or undone by the caller), or None: tables of
    this call alone, drained before it returns.

    Returns (binades (k,) int64 sorted, counts (k, 2, 2^m) int64, problems (3,) int64): the counts of every
    binade some pixel fell in, but those left in ``kept``.
    """
    fast = m <= _FAST.get(scores.dtype, -1)
    keep = fast and kept is not None and kept.ready(scores.dtype, m, scores.size)
    if keep:
        kept.start(scores.dtype, m, scores.size)
    pieces = max(threads, -(-scores.size // _COUNTER_LIMIT))  # (the general kernel's table is int32 too)
    bounds = _guided_bounds(scores.size, threads) if fast else [scores.size * c // pieces for c in range(pieces + 1)]
    chunks = len(bounds) - 1
    parts, tables = [], []  # [(binades, counts)]; [(table, row marks)] of this call's threads that ran a fast kernel
    problems = np.zeros((chunks, 3), dtype=np.int64)
    kernel, view = {np.dtype(np.float16): (_float16_kernel, np.uint16),  # each with the view of the scores it reads
                    np.dtype(np.float32): (_float32_kernel, np.uint32)}.get(scores.dtype, (_float64_kernel, np.float64))

    chunk = [slice(bounds[c], bounds[c + 1]) for c in range(chunks)]

    def work(taken):
        if not fast:
            for c in taken:
                parts.append(_general(scores[chunk[c]], labels[chunk[c]], m, problems[c], initial_slots))
            return
        if keep:
            table, occupied = kept.table()
        else:
            table, occupied = _table(scores.dtype, m)
            tables.append((table, occupied))  # drained with the others' once every thread is done
        counted = 0
        for c in taken:  # (a table of this call drained early before one of its int32 counters could fill)
            if not keep and counted + scores[chunk[c]].size > _COUNTER_LIMIT:
                parts.append(_drained(scores.dtype, m, (table,), (occupied,), keep=True))
                counted = 0
            args = (scores[chunk[c]].view(view), labels[chunk[c]], m, table, occupied)
            careful = kernel(*args, problems[c], 1)
            if keep:
                kept.done.append((kernel, *args))
            if careful:
                parts.append(_careful(scores[chunk[c]], labels[chunk[c]], m, problems[c]))
            counted += scores[chunk[c]].size

    try:
        with _uninterrupted() if keep else contextlib.nullcontext():  # (so that kept.done is every chunk counted)
            run_chunks(work, chunks, threads)
    except BaseException:
        if keep:
            kept.undo()
        raise
    finally:  # (also after an error or an interrupt: every table of this call left clear for the next call)
        if tables:
            parts.append(_drained(scores.dtype, m, *zip(*tables)))
    return merge_binades(parts, owned=True) + (problems.sum(axis=0),)


class Kept:
    """The fast kernels' tables one accumulator counts into across calls, drained only when its counts are read
    (:meth:`drain`), so that a call per frame does not pay each time for reading, summing and clearing every
    thread's table and adding the sums to the state. A table per thread (by thread, so that each stays in its
    thread's cache); the tables hold at most 2^31 - 1 pixels together (int32 counters).

    A call's counts stay only once the caller has checked it (:meth:`commit`); :meth:`undo` takes them out again
    (each chunk counted again into its table with step -1), so the tables only ever hold whole, valid calls.
    """

    def __init__(self):
        self.key = None  # (dtype, m) of the tables
        self.tables = {}  # thread id -> (table, row marks)
        self.counted = 0  # pixels counted into the tables (at most)
        self.done = []  # the chunks of the last call, until it is committed: (kernel, scores, labels, m, table, marks)

    def ready(self, dtype, m, size):
        """Whether a call of ``size`` pixels at (``dtype``, m) can count into the tables: they are of that dtype and
        resolution (or none yet), and their counters cannot fill. Else the caller drains them first."""
        return self.key in (None, (np.dtype(dtype), m)) and self.counted + size <= _COUNTER_LIMIT

    def start(self, dtype, m, size):
        """A call of ``size`` pixels at (``dtype``, m) begins."""
        self.key, self.counted, self.done = (np.dtype(dtype), m), self.counted + size, []

    def table(self):
        """The calling thread's table (and row marks)."""
        ident = threading.get_ident()
        if ident not in self.tables:
            self.tables[ident] = _table(*self.key)
        return self.tables[ident]

    def commit(self):
        """Keep the last call's counts."""
        self.done = []

    def undo(self):
        """Take the last call's counts out of the tables."""
        scratch = np.zeros(3, np.int64)
        for kernel, scores, labels, m, table, marks in self.done:
            kernel(scores, labels, m, table, marks, scratch, -1)
        self.counted -= sum(scores.size for _, scores, *_ in self.done)
        self.done = []

    def drain(self):
        """[(binades, counts)] of the counts in the tables ([] when none); the tables go back to the free ones."""
        if not self.tables:
            return []
        (dtype, m), tables = self.key, list(self.tables.values())
        self.key, self.tables, self.counted = None, {}, 0
        return [_drained(dtype, m, *zip(*tables))]


@contextlib.contextmanager
def _uninterrupted():
    """Within: a Ctrl-C (SIGINT) waits until the block ends, where the handler it met runs (Python's raises
    KeyboardInterrupt there, so the caller sees it at a known point). Only the main thread runs signal handlers:
    elsewhere, nothing to do."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []
    previous = _set_handler(signal.SIGINT, lambda *args: received.append(args))
    try:
        yield
    finally:
        _set_handler(signal.SIGINT, previous)
        if received and callable(previous):
            previous(*received[0])
        elif received and previous != signal.SIG_IGN:  # (the default action, or a handler not set from Python)
            signal.raise_signal(signal.SIGINT)


def _guided_bounds(size, threads):
    """Chunk bounds for ``threads`` threads taking chunks in turn: each chunk a 2 x ``threads``-th of what remains,
    no smaller than :data:`_TAKE` pixels (nor larger than :data:`_LARGEST`, nor than an int32 counter holds), so
    that few chunks are taken and the threads end together; one thread takes what remains at once (up to that)."""
    bounds = [0]
    while bounds[-1] < size:
        remaining = size - bounds[-1]
        take = min(_COUNTER_LIMIT, _LARGEST, remaining if threads == 1 else max(_TAKE, remaining // (2 * threads)))
        bounds.append(min(size, bounds[-1] + take))
    return bounds if size else [0, 0]


@numba.njit(nogil=True, cache=True)
def add_rows(into, rows, counts):
    """``into[rows[i]] += counts[i]`` for each i ((k, 2, 2^m) int64 tables), in place: numpy's fancy indexing would
    copy the rows out and back, into fresh memory each time (a state's add of 40 rows at m = 10: 0.11 -> 0.07 ms)."""
    for i in range(rows.size):
        row, source = into[rows[i]], counts[i]
        for label in range(row.shape[0]):
            for b in range(row.shape[1]):
                row[label, b] += source[label, b]


def merge_binades(parts, *, owned=False):
    """Sum [(binades (k,), counts (k, 2, 2^m))] into (sorted union of binades, int64 counts): new arrays, or with
    ``owned`` (parts the caller made and drops) the first part's own where every part has its binades."""
    parts = [(b, c) for b, c in parts if b.size] or parts[:1]
    if not parts:
        return np.zeros(0, np.int64), np.zeros((0, 2, 0), np.int64)
    if all(np.array_equal(b, parts[0][0]) for b, _ in parts[1:]):  # the usual case: one pass per part
        counts = parts[0][1].astype(np.int64, copy=not owned)
        for _, c in parts[1:]:
            counts += c
        return parts[0][0].astype(np.int64), counts
    binades = np.unique(np.concatenate([b for b, _ in parts]))
    counts = np.zeros((binades.size, *parts[0][1].shape[1:]), np.int64)
    for b, c in parts:
        add_rows(counts, np.searchsorted(binades, b), c.astype(np.int64, copy=False))
    return binades.astype(np.int64), counts


@numba.njit(nogil=True, cache=True)
def float_order_curve(binades, counts, m):
    """The occupied bins of (binades (k,), counts (k, 2, 2^m)) in increasing order: (thresholds (B,), each the
    smallest float64 of its bin, -inf for the bin of -inf; hist (2, B) int64 ID and OOD counts; fp, tp (B,) int64
    reverse cumulative sums)."""
    width = counts.shape[2]
    size = 0
    for r in range(counts.shape[0]):
        for b in range(width):
            size += (counts[r, 0, b] != 0) | (counts[r, 1, b] != 0)
    bits = np.empty(size, np.uint64)
    hist = np.empty((2, size), np.int64)
    i = 0
    for r in range(counts.shape[0]):
        top = np.uint64(binades[r]) << np.uint64(52)
        for b in range(width):
            if counts[r, 0, b] != 0 or counts[r, 1, b] != 0:
                key = top | (np.uint64(b) << np.uint64(52 - m))  # the bin's first key, to float64 bits:
                bits[i] = key ^ SIGN if key >= SIGN else ~key
                hist[0, i], hist[1, i] = counts[r, 0, b], counts[r, 1, b]
                i += 1
    thresholds = bits.view(np.float64)
    for i in range(min(size, 1)):  # only the lowest bin can be the one of -inf, whose first key is a NaN
        if np.isnan(thresholds[i]):
            thresholds[i] = -np.inf
    fp = np.empty(size, np.int64)
    tp = np.empty(size, np.int64)
    id_total = ood_total = 0
    for i in range(size - 1, -1, -1):
        id_total += hist[0, i]
        ood_total += hist[1, i]
        fp[i], tp[i] = id_total, ood_total
    return thresholds, hist, fp, tp


# -- the built-in metrics and their bounds ---------------------------------------------------------------------
# The same numbers as functional.py's definitions (the metrics of a curve, and of the two refined curves for the
# bounds, built as arrays), in one pass over the bins without building anything: compute() pays this per call.

@numba.njit(cache=True, inline="always")
def _psi_series(inv):
    """psi(x) - ln x for x >= 20, from inv = 1 / x: the asymptotic series, exact to float64 there."""
    inv2 = inv * inv
    return -0.5 * inv - inv2 * (1 / 12 - inv2 * (1 / 120 - inv2 * (1 / 252 - inv2 * (1 / 240 - inv2 / 132))))


@numba.njit(nogil=True, cache=True)
def _psi_minus_log(x):
    result = 0.0
    if x < 20.0:  # psi(x) - ln x = [psi(x + J) - ln(x + J)] + ln((x + J) / x) - sum_{j<J} 1 / (x + j)
        shift = np.ceil(20.0 - x)
        result = np.log1p(shift / x)
        for j in range(int(shift)):
            result -= 1.0 / (x + j)
        x += shift
    return result + _psi_series(1.0 / x)


@numba.njit(cache=True, inline="always")
def _harmonic_gap(c, n):
    """sum_{i=1..n} 1 / (c + i) = psi(c + n + 1) - psi(c + 1) = ln(b / a) + [psi(b) - ln b] - [psi(a) - ln a], with
    a = c + 1, b = c + n + 1 (as functional._harmonic_gap); two divisions and a log1p when a >= 20."""
    a = c + 1.0
    if a < 20.0:
        return np.log1p(n / a) + _psi_minus_log(a + n) - _psi_minus_log(a)
    inv_a = 1.0 / a
    return np.log1p(n * inv_a) + _psi_series(1.0 / (a + n)) - _psi_series(inv_a)


@numba.njit(cache=True, inline="always")
def _plus(total, error, x):
    """Neumaier's compensated sum: (total + x, the rounding errors so far), to be added at the end."""
    t = total + x
    error += (total - t) + x if abs(total) >= abs(x) else (x - t) + total
    return t, error


@numba.njit(nogil=True, cache=True)
def builtin_metrics(tp, fp, n_ood, n_id, bounds):
    """(13,) float64: AUROC, AUPRC, FPR95, MaxIoU, the index of the lowest threshold attaining MaxIoU, then with
    ``bounds`` the (lo, hi) of each of the four between the worst and the best order of the pixels sharing a bin
    (else NaN), from ``tp``, ``fp`` (B,) at increasing thresholds (pixels >= t_k; non-increasing: the reverse
    cumulative sums of a histogram), P = ``n_ood`` > 0 and N = ``n_id`` > 0. The metrics' sums are compensated
    (Neumaier; the ROC area's only where its integer terms could sum beyond 2^53); the bounds' are plain (their
    rounding, under B eps relative, is far below the bin widths they bound), and each interval holds the metric's
    value.

    Each value is its definition in functional.py: the trapezoid ROC area from (0, 0) to (1, 1), the AUPRC step
    sum, the smallest FPR with 20 TP >= 19 P, the largest TP / (P + FP). The bounds are those of the refined
    curves (bin k's ID pixels above its OOD pixels, worst, or below them, best), in closed form per bin:
    AUROC ± sum_k id_k ood_k / 2NP; AUPRC best with precision TP_k / (TP_k + FP_{k+1}) for bin k's OOD pixels, worst
    with each OOD pixel a distinct value (functional.auprc_distinct_worst); FPR95 best the smallest FP_{k+1} of a
    qualifying bin; MaxIoU best the largest TP_k / (P + FP_{k+1}); the worst FPR95 and MaxIoU are the binned ones.
    """
    size = tp.size
    p, n = float(n_ood), float(n_id)
    roc = roc_error = pr = pr_error = 0.0  # 2NP x the ROC area, P x AUPRC: compensated sums
    tie = pr_best = pr_worst = 0.0  # 2NP x the within-bin triangles; P x the best AUPRC; P x the worst's deficit
    fpr95_count = fpr95_best_count = np.int64(-1)
    iou = iou_best = -np.inf
    iou_index = 0
    whole = 2 * n * p < 2.0 ** 53  # every partial sum of 2NP x the ROC area an exact integer: no compensation
    for k in range(size):
        t, f = tp[k], fp[k]
        t_next = tp[k + 1] if k + 1 < size else 0
        f_next = fp[k + 1] if k + 1 < size else 0
        ood, id_ = t - t_next, f - f_next
        if whole:
            roc += float(id_) * float(t + t_next)
        else:
            roc, roc_error = _plus(roc, roc_error, float(id_) * float(t + t_next))
        if n_ood - t <= n_ood // 20:  # 20 TP >= 19 P, without the products (no int64 overflow)
            fpr95_count = f if fpr95_count < 0 else min(fpr95_count, f)
            fpr95_best_count = f_next if fpr95_best_count < 0 else min(fpr95_best_count, f_next)
        value = t / float(n_ood + f)
        if value > iou:
            iou, iou_index = value, k
        if ood:  # (adding 0 changes no bit of a sum: skipped)
            pr, pr_error = _plus(pr, pr_error, ood * (t / float(max(t + f, 1))))
        if bounds:
            tie += float(id_) * float(ood)
            iou_best = max(iou_best, t / float(n_ood + f_next))
            if ood:
                pr_best += ood * (t / float(max(t + f_next, 1)))
            if ood and f:  # the i-th OOD pixel below the bin's f ID pixels has precision (a + i) / (c + i), c - a = f
                pr_worst += f * _harmonic_gap(float(t_next + f), float(ood))
    if size:  # the last segment, from the lowest threshold's point to (1, 1)
        roc, roc_error = _plus(roc, roc_error, float(n_id - fp[0]) * float(n_ood + tp[0]))
    out = np.full(13, np.nan)
    out[0] = (roc + roc_error) / (2 * n * p)
    out[1] = (pr + pr_error) / p
    out[2] = fpr95_count / n if fpr95_count >= 0 else np.nan
    out[3] = iou
    out[4] = iou_index
    if bounds:
        triangles = tie / (2 * n * p)
        worst = (out[0] - triangles, (tp[0] - pr_worst) / p, out[2], out[3])
        best = (out[0] + triangles, pr_best / p,
                fpr95_best_count / n if fpr95_best_count >= 0 else np.nan, max(iou, iou_best))
        for q in range(4):  # the value itself too: a plain sum's last bits must not leave it outside
            out[5 + 2 * q] = min(worst[q], best[q], out[q])
            out[6 + 2 * q] = max(worst[q], best[q], out[q])
    return out
