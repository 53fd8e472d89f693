"""The Triton kernels of :mod:`segood.metrics._device` (imported on first use: Triton is slow to import, and
``TRITON_INTERPRET=1``, read when a kernel is made, runs them on CPU tensors).

One program handles BLOCK pixels of one image, the images taking turns (program k: image k % N, block k // N), so
that the programs running at once add into every image's counters, not all into one image's few hot ones. Pixel
i of image n is at n * P + i of the (N, P) scores and labels.
"""

import triton
import triton.language as tl

from segood.labels import IGNORE, OOD
from segood.metrics import _kernels

BINADES = tl.constexpr(_kernels.BINADES)
LABEL_OOD = tl.constexpr(OOD)
LABEL_IGNORE = tl.constexpr(IGNORE)
N_IGNORED = tl.constexpr(_kernels.N_IGNORED)
N_BAD_LABEL = tl.constexpr(_kernels.N_BAD_LABEL)
N_BAD_SCORE = tl.constexpr(_kernels.N_BAD_SCORE)
N_MISSED = tl.constexpr(_kernels.N_BAD_SCORE + 1)  # after the problems: the pixels of binades not in the slots


@triton.jit
def _or(a, b):
    return a | b


@triton.jit
def _pixels(scores, labels, base, offsets, inside, M: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr):
    """(binade, low bits, label, counted, NaN) of a block's pixels: the top 12 and the next M bits of the key of
    each score's exact float64 value (as _device._torch_key)."""
    label = tl.load(labels + base + offsets, mask=inside, other=0).to(tl.int32)
    x = tl.load(scores + base + offsets, mask=inside, other=0)
    if WIDE:
        bits = x.to(tl.float64).to(tl.int64, bitcast=True)
        magnitude = bits & 0x7FFFFFFFFFFFFFFF
        exponent64 = (magnitude >> 52).to(tl.int32)
        top = ((magnitude >> (52 - M)) & ((1 << M) - 1)).to(tl.int32)
        nan = magnitude > 0x7FF0000000000000
    else:  # float32 bits (float16, bfloat16 and small integers convert exactly) to float64 fields
        if BF16:  # a bfloat16 is the top half of its float32
            bits = x.to(tl.int16, bitcast=True).to(tl.int32) << 16
        else:
            bits = x.to(tl.float32).to(tl.int32, bitcast=True)
        magnitude = bits & 0x7FFFFFFF
        exponent = magnitude >> 23
        mantissa = magnitude & 0x7FFFFF
        subnormal = (exponent == 0) & (mantissa != 0)
        # a subnormal is mantissa x 2^-149: the exact float32 of the mantissa gives its exponent and normal bits
        normalised = mantissa.to(tl.float32).to(tl.int32, bitcast=True)
        exponent64 = tl.where(exponent == 255, 2047, tl.where(magnitude == 0, 0, exponent + 896))
        exponent64 = tl.where(subnormal, (normalised >> 23) + 747, exponent64)
        top = tl.where(subnormal, normalised & 0x7FFFFF, mantissa) >> (23 - M)
        nan = magnitude > 0x7F800000
    negative = (bits < 0) & (magnitude != 0)  # -0.0 is +0.0
    # the key is the float64 bits with the sign flipped (x >= 0) or every bit flipped (x < 0)
    binade = tl.where(negative, 2047 - exponent64, 2048 + exponent64)
    low = tl.where(negative, top ^ ((1 << M) - 1), top)
    counted = inside & (label <= LABEL_OOD) & ~nan
    return binade, low, label, counted, nan


@triton.jit
def _problems(problems, inside, label, nan):
    """problems += the block's ignored pixels, bad labels and NaN scores at counted pixels."""
    known = inside & (label <= LABEL_OOD)
    ignored = inside & (label == LABEL_IGNORE)
    tl.atomic_add(problems + N_IGNORED, tl.sum(ignored.to(tl.int64), 0), sem="relaxed")
    tl.atomic_add(problems + N_BAD_LABEL, tl.sum((inside & ~known & ~ignored).to(tl.int64), 0), sem="relaxed")
    tl.atomic_add(problems + N_BAD_SCORE, tl.sum((known & nan).to(tl.int64), 0), sem="relaxed")


@triton.jit
def _block(N, P, BLOCK: tl.constexpr):
    """(image, pixel offsets, which are inside the image, the image's first pixel) of this program's block."""
    image = tl.program_id(0) % N
    offsets = (tl.program_id(0) // N) * BLOCK + tl.arange(0, BLOCK)
    return image, offsets, offsets < P, image.to(tl.int64) * P


@triton.jit(do_not_specialize=["N"])  # the batch size changes at a set's end: one build, not one per value
def presence(scores, labels, flags, problems, N, P, M: tl.constexpr, WIDE: tl.constexpr, BF16: tl.constexpr,
             BLOCK: tl.constexpr):
    """flags[image, binade] = 1 for each binade that holds a counted pixel; problems += the block's."""
    image, offsets, inside, base = _block(N, P, BLOCK)
    binade, low, label, counted, nan = _pixels(scores, labels, base, offsets, inside, M, WIDE, BF16)
    _problems(problems, inside, label, nan)
    # A block's binades mostly lie within 32 of its lowest or of its highest one (zeros among values near 1 use
    # both): a bit word each, written as a few flags. Only pixels outside both windows store their own flag, so
    # a typical block writes a handful of flags, not one per pixel to the same few addresses.
    lowest = tl.min(tl.where(counted, binade, BINADES), 0)
    highest = tl.max(tl.where(counted, binade, -1), 0)
    in_low = counted & (binade - lowest < 32)
    in_high = counted & ~in_low & (highest - binade < 32)
    word_low = tl.reduce(tl.where(in_low, 1 << ((binade - lowest) & 31), 0), 0, _or)
    word_high = tl.reduce(tl.where(in_high, 1 << ((highest - binade) & 31), 0), 0, _or)
    row = flags + image.to(tl.int64) * BINADES
    j = tl.arange(0, 32)
    tl.store(row + lowest + j, 1, mask=((word_low >> j) & 1) != 0)
    tl.store(row + highest - j, 1, mask=((word_high >> j) & 1) != 0)
    tl.store(row + binade, 1, mask=counted & ~in_low & ~in_high)


@triton.jit
def _later(a, b):
    return tl.maximum(a, b)


@triton.jit
def _add_runs(table, index, counted, BLOCK: tl.constexpr, RUN: tl.constexpr):
    """table[index] += 1 for the counted pixels, RUN at a time sorted by their counter: each run of one counter
    added by one atomic addition, so a group adds as many times as it holds distinct counters, not pixels."""
    GROUPS: tl.constexpr = BLOCK // RUN
    key = tl.reshape(tl.where(counted, index, 2147483647), (GROUPS, RUN))  # (the uncounted last, left out)
    key = tl.sort(key)
    j = tl.broadcast_to(tl.arange(0, RUN)[None, :], (GROUPS, RUN))
    first = (j == 0) | (key != tl.gather(key, tl.maximum(j - 1, 0), 1))
    last = (j == RUN - 1) | (key != tl.gather(key, tl.minimum(j + 1, RUN - 1), 1))
    start = tl.associative_scan(tl.where(first, j, 0), 1, _later)  # each pixel's run begins there
    n = (j - start + 1).to(table.dtype.element_ty)
    tl.atomic_add(table + key, n, mask=last & (key != 2147483647), sem="relaxed")


@triton.jit(do_not_specialize=["N", "SLOTS"])  # SLOTS, the binades in use, changes from batch to batch
def count(scores, labels, slot_of, table, problems, N, P, SLOTS, M: tl.constexpr, WIDE: tl.constexpr,
          BF16: tl.constexpr, BLOCK: tl.constexpr, ENDS: tl.constexpr, KNOWN: tl.constexpr, RUN: tl.constexpr):
    """table[image, slot_of[binade], label, low] += 1 for every counted pixel. ``ENDS``: the pixels of the block's
    lowest and highest bin, per label, added by one atomic addition each (the saturated scores of a confident
    network fill the end bins: one counter that every pixel's own addition would wait for), the others one by one.
    ``RUN`` (a power of two dividing BLOCK, or 0): the pixels sorted by their counter RUN at a time and each run of
    one counter added at once (:func:`_add_runs`; the table's counters are below 2^31).
    ``KNOWN``: the slots are those of binades known beforehand (-1 for the others), and this pass also counts the
    problems and, at problems[N_MISSED], the counted pixels of the other binades, which it leaves out."""
    image, offsets, inside, base = _block(N, P, BLOCK)
    binade, low, label, counted, nan = _pixels(scores, labels, base, offsets, inside, M, WIDE, BF16)
    slot = tl.load(slot_of + binade, mask=counted, other=0).to(tl.int64)
    if KNOWN:
        _problems(problems, inside, label, nan)
        missed = counted & (slot < 0)
        tl.atomic_add(problems + N_MISSED, tl.sum(missed.to(tl.int64), 0), sem="relaxed")
        counted = counted & ~missed
    row = image.to(tl.int64) * SLOTS + slot
    if ENDS:
        key = row * (1 << M) + low  # (the bin without its label: the ends are those of the scores)
        for end in tl.static_range(2):
            if end == 0:
                edge = tl.min(tl.where(counted, key, 1 << 62), 0)
            else:
                edge = tl.max(tl.where(counted, key, -1), 0)
            there = counted & (key == edge)
            for kind in tl.static_range(2):
                n = tl.sum((there & (label == kind)).to(tl.int32), 0)
                at = ((edge >> M) * 2 + kind) * (1 << M) + (edge & ((1 << M) - 1))
                tl.atomic_add(table + at, n.to(table.dtype.element_ty), mask=n > 0, sem="relaxed")
            counted = counted & ~there
    index = (row * 2 + label) * (1 << M) + low
    if RUN:
        _add_runs(table, index.to(tl.int32), counted, BLOCK, RUN)
    else:
        tl.atomic_add(table + index, 1, mask=counted, sem="relaxed")
