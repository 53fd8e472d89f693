"""The Triton kernel of :class:`segood.metrics.calibration.CalibrationAccumulator` on CUDA (imported on first use:
Triton is slow to import, and ``TRITON_INTERPRET=1``, read when a kernel is made, runs it on CPU tensors).

One program reads BLOCK pixels of one image, every class of each, and writes one row of partial sums: per bin the
pixels, the hits and the confidences, then the Brier sum and the pixels with a bad target or a non-finite
probability. Each sum is a reduction within the program, in an order fixed by the block's layout, so the rows'
sums are the same from run to run; no float64 or int64 copy of the (N, C, H, W) probabilities is made.
"""

import triton
import triton.language as tl

from segood.labels import IGNORE

LABEL_IGNORE = tl.constexpr(IGNORE)


@triton.jit
def block_calibration(probs, target, counts, sums, P, BLOCKS, C: tl.constexpr, BINS: tl.constexpr,
                      BLOCK: tl.constexpr):
    """counts[row] = (pixels per bin, hits per bin, bad targets, non-finite pixels) and sums[row] = (confidence per
    bin, Brier sum) of block ``row`` (image row // BLOCKS) of (N, C, P) ``probs`` and (N, P) ``target``."""
    row = tl.program_id(0)
    image = row // BLOCKS
    pixel = (row % BLOCKS) * BLOCK + tl.arange(0, BLOCK)
    inside = pixel < P
    base = probs + image.to(tl.int64) * C * P + pixel
    best = tl.load(base, mask=inside, other=0.0).to(tl.float32)
    predicted = tl.zeros([BLOCK], tl.int32)
    squares = best.to(tl.float64) * best.to(tl.float64)
    finite = (best == best) & (tl.abs(best) != float("inf"))
    for k in tl.static_range(1, C):
        p = tl.load(base + k * P, mask=inside, other=0.0).to(tl.float32)
        larger = p > best  # the first of equal maxima
        best = tl.where(larger, p, best)
        predicted = tl.where(larger, k, predicted)
        squares += p.to(tl.float64) * p.to(tl.float64)
        finite = finite & (p == p) & (tl.abs(p) != float("inf"))
    t = tl.load(target + image.to(tl.int64) * P + pixel, mask=inside, other=LABEL_IGNORE)  # (in its own dtype)
    keep = inside & (t != LABEL_IGNORE)
    bad = keep & ((t < 0) | (t >= C))
    keep = keep & ~bad
    p_true = tl.load(base + tl.where(keep, t, 0).to(tl.int64) * P, mask=keep, other=0.0).to(tl.float64)
    confidence = best.to(tl.float64)
    bins = tl.minimum(tl.maximum(tl.ceil(confidence * BINS).to(tl.int32) - 1, 0), BINS - 1)
    hit = keep & (predicted == t)
    out_counts = counts + row.to(tl.int64) * (2 * BINS + 2)
    out_sums = sums + row.to(tl.int64) * (BINS + 1)
    for b in tl.static_range(BINS):
        here = keep & (bins == b)
        tl.store(out_counts + b, tl.sum(here.to(tl.int64), axis=0))
        tl.store(out_counts + BINS + b, tl.sum((here & hit).to(tl.int64), axis=0))
        tl.store(out_sums + b, tl.sum(tl.where(here, confidence, 0.0), axis=0))
    tl.store(out_counts + 2 * BINS, tl.sum(bad.to(tl.int64), axis=0))
    tl.store(out_counts + 2 * BINS + 1, tl.sum((inside & ~finite).to(tl.int64), axis=0))
    tl.store(out_sums + BINS, tl.sum(tl.where(keep, squares - 2.0 * p_true + 1.0, 0.0), axis=0))
