"""Private float-order histogram kernels for tensors on a device: a fused Triton kernel for CUDA, torch ops
elsewhere. Both give, per image of a batch, the counts of :func:`segood.metrics._kernels.float_histogram_numpy`
bit for bit; the public wrapper is ``FloatOrderAccumulator.update``. At the end, sums per label on a device
(:func:`label_sums`: per-class score sums, the calibration's confidence sums).

Two passes over the scores, two waits for the device per batch whatever its size:
1. per image the binades (sign and exponent of the float64 value, 4096 of them) that hold a counted pixel, and
   the problem counters; the host reads these flags (N x 4096);
2. every counted pixel adds one to its bin in a compact (N, K, 2, 2^m) table, K the binades occupied anywhere in
   the batch, through a 4096-entry binade -> slot lookup; the host reads the table.
Where the binades are known beforehand (``known``: an accumulator's, once its first batches have been counted),
one pass and one wait: pass 2 on the known binades' slots, counting the problems too and the pixels of any other
binade; only where there are such pixels is the batch counted again by the two passes. The counting pass (pass 2)
can instead run a CUDA kernel that counts in shared memory (``kernel="cuda"``, :mod:`segood.metrics._device_cuda`).

The key of a float16 / bfloat16 / float32 score is computed from its own bits in 32-bit integers: the float64
exponent and the top m mantissa bits of its exact float64 value (a subnormal is normalised through the exact
float32 conversion of its mantissa), so no float64 copy of the map is made. Float64 and integer scores go
through float64 (integers round as numpy's astype does).
"""

import functools

import numpy as np

from segood import _triton
from segood.labels import IGNORE, OOD
from segood.metrics import _device_cuda
from segood.metrics._kernels import BINADES, N_BAD_LABEL, N_BAD_SCORE, N_IGNORED

_NARROW = ("float16", "bfloat16", "float32", "int8", "uint8", "int16", "bool")  # exact in float32
_TABLE_LIMIT = 1 << 28  # counters per pass-2 table (1 GiB of int32); larger batches run in groups of images
_KNOWN_LIMIT = 1 << 22  # counters of a one-pass table (16 MiB of int32, all sent to the host): beyond, two passes,
# whose table holds only the batch's own binades
_CHUNK = 1 << 22  # pixels per step of the torch path: its int64 temporaries stay near 100 MiB
BLOCK = 2048  # pixels per Triton program
COUNTING = "triton"  # the default kernel of the counting pass (pass 2, or the one pass) on CUDA: "triton" or
# "cuda" (the GPU check's pipeline rows set it to compare them end to end)


def float_histograms(scores, labels, m, *, kernel=None, block=BLOCK, ends=False, runs=0, known=None):
    """Float-order counts of each image of a batch, on the tensors' own device.

    Args:
        scores: (N, P) tensor of any real dtype (float16, bfloat16, float32, float64, integer, bool).
        labels: (N, P) uint8 tensor on the same device: 0 (ID), 1 (OOD), 255 (ignore), anything else a problem.
        m: mantissa bits, 1 to 14.
        kernel: "triton" or "torch"; default Triton for CUDA tensors when it imports and builds its kernels here
            (where it cannot, a warning says why and the torch path, which counts alike, is used from then on).
            "cuda": the counting pass by :mod:`segood.metrics._device_cuda`'s kernel, which counts in shared memory
            (float32, float16 and bfloat16 scores whose binades' table fits there: ``_device_cuda.usable``; Triton
            elsewhere, and for the first of two passes; not the default until the device check has timed it).
        block: pixels per Triton program (a power of two).
        ends: each Triton program adds the pixels of its lowest and highest bin with one atomic addition per label
            (the same counts; on an H200 within 1%, 19-22% faster on saturated scores; off until the
            device check has compared its counts: ``benchmarks/gpu_check.py --only accumulator_counts``).
        runs: each Triton program sorts its pixels' counters this many at a time (a power of two up to ``block``)
            and adds each run of one counter with one atomic addition, not one per pixel (the same counts; 0: off,
            until the device check has timed it).
        known: the binades the scores most likely occupy, increasing (an accumulator's own): counted in one pass
            where they hold every counted pixel (the same counts).

    Returns:
        ([(binades (k,) int64 increasing, counts (k, 2, 2^m) int64)] per image, problems (3,) int64), numpy.
    """
    return start_histograms(scores, labels, m, kernel=kernel, block=block, ends=ends, runs=runs, known=known)()


def start_histograms(scores, labels, m, *, kernel=None, block=BLOCK, ends=False, runs=0, known=None):
    """:func:`float_histograms` in two steps: the device's work is started, and the function returned gives the
    counts. Where ``known`` holds the batch's binades, its one pass is started and the counts sent on their way to
    pinned host memory, and the function waits for them: several batches started before any is read wait for the
    device once. Elsewhere the two passes run at once (waiting twice), and the function returns their counts."""
    if runs and (runs & (runs - 1) or not 0 < runs <= block):
        raise ValueError(f"runs must be 0 or a power of two up to block ({block}), got {runs}")
    kernel_options = {"BLOCK": block, "ENDS": ends, "RUN": runs}
    if kernel is not None:
        return _start(scores, labels, m, kernel, kernel_options, known)
    if scores.is_cuda and _triton.available():
        started = _triton.attempt(lambda: _start(scores, labels, m, COUNTING, kernel_options, known),
                                  "histogram kernel", "counting with torch operations (the same counts, slower)",
                                  scores.device)
        if started is not None:
            return started
    return _start(scores, labels, m, "torch", kernel_options, known)


def _start(scores, labels, m, kernel, options, known):
    import torch

    n, p = scores.shape
    if scores.dtype == torch.bool:
        scores = scores.view(torch.uint8)
    narrow = str(scores.dtype).replace("torch.", "") in _NARROW
    bf16 = scores.dtype == torch.bfloat16
    if not narrow and scores.dtype not in (torch.float64, torch.int32, torch.int64):
        scores = scores.to(torch.float64)  # uint16/32/64: rare, converted as numpy converts them
    scores, labels = scores.contiguous(), labels.contiguous()
    if kernel not in ("triton", "torch", "cuda"):
        raise ValueError(f"kernel must be 'triton', 'torch' or 'cuda', got {kernel!r}")
    if kernel == "cuda" and not scores.is_cuda:
        raise ValueError(f"kernel 'cuda' counts CUDA tensors, got scores on {scores.device}")
    if kernel in ("triton", "cuda"):
        from segood.metrics import _device_triton as kernels  # made on first use: importing Triton is slow
    else:
        kernels = None
    steps = (scores, labels, m, narrow, bf16, kernels, options, kernel == "cuda")
    known = None if known is None else np.asarray(known, np.int64)
    if known is None or not known.size or not scores.numel() or n * known.size * 2 << m > _KNOWN_LIMIT:
        counted = _two_passes(*steps)  # (at once: a kernel that cannot build fails inside start_histograms' attempt)
        return lambda: counted
    slot_of = _slot_table(known.tobytes(), str(scores.device))
    if slot_of.is_cuda:  # (cached, and read on this stream: its memory is not reused while this pass may read it)
        slot_of.record_stream(torch.cuda.current_stream(scores.device))
    counters = torch.zeros(4, dtype=torch.int64, device=scores.device)  # problems, then the pixels missed
    table = torch.zeros((n * known.size * 2 << m) + 1, dtype=torch.int32 if p < 1 << 31 else torch.int64,
                        device=scores.device)  # (the last: a dump)
    _count(steps, slot_of, table, known.size, counters)
    return functools.partial(_known_counts, steps, known, _to_host(table, counters))


def _count(steps, slot_of, table, slots, counters=None):
    """Pass 2 of ``steps``: each counted pixel added to ``table`` ((N x slots x 2 x 2^m) + 1 counters, the last a
    dump) through ``slot_of``, by the CUDA kernel where asked and usable, else Triton's or torch's. ``counters``: the
    one pass over known binades, which adds the problems and then the counted pixels without a slot to them; None:
    after pass 1, which counted the problems."""
    import torch

    scores, labels, m, narrow, bf16, kernels, options, cuda = steps
    known = counters is not None
    if not known:
        counters = torch.zeros(4, dtype=torch.int64, device=scores.device)  # (what pass 1 counted already)
    if cuda and _device_cuda.usable(scores, labels, table, slots, m) and _device_cuda.count(
            scores, labels, slot_of, table, counters, slots, m):
        return  # counted in shared memory
    if kernels is not None:
        n, p = scores.shape
        kernels.count[(n * triton_cdiv(p, options["BLOCK"]),)](scores, labels, slot_of, table, counters, n, p, slots,
                                                               M=m, WIDE=not narrow, BF16=bf16, KNOWN=known, **options)
    else:
        _torch_count(scores, labels, slot_of, table, slots, m, narrow, counters if known else None)


def _known_counts(steps, known, copies):
    """The counts of :func:`float_histograms` from the one pass over ``known`` binades' slots (``copies``: its table
    and counters on their way to the host), or from the two passes where a counted pixel lies in another binade."""
    table, counters = copies()
    if counters[3]:
        return _counted_twice(steps)
    n, m = steps[0].shape[0], steps[2]
    table = table[:-1].reshape(n, known.size, 2, 1 << m)
    images = [(known[rows], counts[rows].astype(np.int64)) for rows, counts in zip(table.any(axis=(2, 3)), table)]
    return images, counters[:3].copy()


def _counted_twice(steps):
    """:func:`_two_passes` of ``steps``; where its Triton kernels cannot build or launch here, the torch path's."""
    if steps[5] is None:
        return _two_passes(*steps)
    counted = _triton.attempt(lambda: _two_passes(*steps), "histogram kernel",
                              "counting with torch operations (the same counts, slower)", steps[0].device)
    return _two_passes(*steps[:5], None, steps[6]) if counted is None else counted  # (cuda off: the torch path)


def _to_host(*tensors):
    """A function giving the numpy copies of ``tensors`` (on one device), which are on their way to pinned host
    memory (CUDA: it waits for them) or are themselves on the host."""
    import torch

    if not tensors[0].is_cuda:
        return lambda: [t.numpy() for t in tensors]
    copies = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True) for t in tensors]
    done = torch.cuda.Event()
    done.record(torch.cuda.current_stream(tensors[0].device))  # (the copies' stream: that of their device)

    def wait():
        done.synchronize()
        return [c.numpy() for c in copies]
    return wait


@functools.lru_cache(maxsize=64)  # (a few accumulators' binades on a few devices: one upload each)
def _slot_table(known, device):
    """The (4096,) int32 binade -> slot lookup of the binades ``known`` (int64 bytes) on ``device``, -1 elsewhere."""
    import torch

    slots = np.full(BINADES, -1, np.int32)
    binades = np.frombuffer(known, np.int64)
    slots[binades] = np.arange(binades.size, dtype=np.int32)
    return torch.from_numpy(slots).to(device)


def _two_passes(scores, labels, m, narrow, bf16, kernels, options, cuda=False):
    """The counts of :func:`float_histograms`: the occupied binades, then the counts in their slots (``cuda``: by the
    CUDA kernel that counts in shared memory, where :func:`_device_cuda.usable`)."""
    import torch

    n, p = scores.shape
    device = scores.device
    flags = torch.zeros(n * BINADES + 3, dtype=torch.int64, device=device)  # presence, then problems: one read
    presence, problems = flags[: n * BINADES].view(n, BINADES), flags[n * BINADES :]
    kernel = "torch" if kernels is None else "triton"
    block = options["BLOCK"]
    if not scores.numel():
        pass  # nothing to launch
    elif kernel == "triton":
        kernels.presence[(n * triton_cdiv(p, block),)](scores, labels, presence, problems, n, p, M=m,
                                                         WIDE=not narrow, BF16=bf16, BLOCK=block)
    else:
        _torch_presence(scores, labels, presence, problems, m, narrow)
    host = flags.cpu().numpy()
    present = host[: n * BINADES].reshape(n, BINADES) != 0
    union = np.flatnonzero(present.any(axis=0))
    width = 1 << m
    images = [(np.zeros(0, np.int64), np.zeros((0, 2, width), np.int64)) for _ in range(n)]
    if union.size:
        slot_of = torch.cumsum(presence.amax(dim=0) > 0, 0, dtype=torch.int32) - 1  # on the device: no upload
        group = max(1, _TABLE_LIMIT // (union.size * 2 * width))  # one group unless the table would be huge
        counts_dtype = torch.int32 if p < 1 << 31 else torch.int64
        for start in range(0, n, group):
            stop = min(n, start + group)
            table = torch.zeros((stop - start) * union.size * 2 * width + 1, dtype=counts_dtype, device=device)
            _count((scores[start:stop], labels[start:stop], m, narrow, bf16, kernels, options, cuda), slot_of, table,
                   union.size)
            table = table.cpu().numpy()[:-1].reshape(stop - start, union.size, 2, width)  # the last: a dump
            for i in range(start, stop):
                rows = present[i, union]
                images[i] = (union[rows].astype(np.int64), table[i - start, rows].astype(np.int64))
    return images, host[n * BINADES :].copy()


def triton_cdiv(a, b):
    return -(-a // b)


# -- torch path ------------------------------------------------------------------------------------------------

def _torch_key(scores, m, narrow):
    """(binade, low bits) and a NaN mask of flat ``scores``, as the Triton kernel computes them (int32 from a
    narrow dtype's float32 bits, int64 from float64)."""
    import torch

    mask = (1 << m) - 1
    if narrow:
        bits = scores.to(torch.float32).view(torch.int32)  # exact: every value is a float32
        magnitude = bits & 0x7FFFFFFF
        exponent, mantissa = magnitude >> 23, magnitude & 0x7FFFFF
        subnormal = (exponent == 0) & (mantissa != 0)
        # a subnormal is mantissa x 2^-149: the exact float32 of the mantissa gives its exponent and normal bits
        normalised = mantissa.to(torch.float32).view(torch.int32)
        exponent64 = torch.where(subnormal, (normalised >> 23) + 747, exponent + 896)
        exponent64.masked_fill_(exponent == 255, 2047).masked_fill_(magnitude == 0, 0)
        top = torch.where(subnormal, normalised, mantissa).bitwise_and_(0x7FFFFF).bitwise_right_shift_(23 - m)
        nan = magnitude > 0x7F800000
    else:
        bits = scores.to(torch.float64).view(torch.int64)
        magnitude = bits & 0x7FFFFFFFFFFFFFFF
        exponent64, top = magnitude >> 52, (magnitude >> (52 - m)).bitwise_and_(mask)
        nan = magnitude > 0x7FF0000000000000
    # The key is the bits with the sign flipped (x >= 0) or every bit flipped (x < 0; -0.0 is +0.0): for x < 0
    # the binade is 2047 - e = 2048 + ~e and the low bits are flipped, an XOR with all ones either way.
    flip = -((bits < 0) & (magnitude != 0)).to(bits.dtype)
    return (exponent64 ^ flip).add_(2048), top.bitwise_xor_(flip & mask), nan


def _torch_steps(scores, labels):
    """(image, slice) steps of at most _CHUNK pixels over (N, P) inputs."""
    n, p = scores.shape
    for i in range(n):
        for start in range(0, p, _CHUNK):
            yield i, slice(start, start + _CHUNK)


def _torch_problems(label, nan, problems):
    """problems += the ignored pixels, bad labels and NaN scores at counted pixels; returns which are counted."""
    known = label <= OOD
    ignored = (label == IGNORE).sum()
    problems[N_IGNORED] += ignored
    problems[N_BAD_LABEL] += label.numel() - known.sum() - ignored
    problems[N_BAD_SCORE] += (known & nan).sum()
    return known & ~nan


def _torch_presence(scores, labels, presence, problems, m, narrow):
    import torch

    dump = torch.zeros(BINADES + 1, dtype=presence.dtype, device=presence.device)
    for i, part in _torch_steps(scores, labels):
        binade, _, nan = _torch_key(scores[i, part], m, narrow)
        counted = _torch_problems(labels[i, part], nan, problems)
        dump.zero_()
        # uncounted pixels flag a dump entry: no compaction, so no wait for the device
        dump.index_fill_(0, binade.masked_fill_(~counted, BINADES).long(), 1)
        presence[i] |= dump[:BINADES]


def _torch_count(scores, labels, slot_of, table, slots, m, narrow, counters=None):
    """Adds each counted pixel to ``table`` ((n x slots x 2 x 2^m) + 1 counters, the last one the dump). With
    ``counters``, the problems and then the counted pixels whose binade has no slot (-1), which are left out, are
    added to them."""
    import torch

    index_dtype = torch.int32 if table.numel() < 1 << 31 else torch.int64
    one = torch.ones(1, dtype=table.dtype, device=table.device)
    for i, part in _torch_steps(scores, labels):
        binade, low, nan = _torch_key(scores[i, part], m, narrow)
        label = labels[i, part]
        slot = slot_of[binade.long()].to(index_dtype)
        if counters is None:
            counted = (label <= OOD) & ~nan
        else:
            counted = _torch_problems(label, nan, counters)
            missed = counted & (slot < 0)
            counters[3] += missed.sum()
            counted &= ~missed
        index = slot.add_(i * slots).mul_(2).add_(label).bitwise_left_shift_(m).add_(low.to(index_dtype))
        index.masked_fill_(~counted, table.numel() - 1)
        table.index_add_(0, index, one.expand(index.numel()))


# -- sums per label ----------------------------------------------------------------------------------------------

SUM_BLOCK = 1024  # elements per row of partial sums


def label_sums(labels, values, n, *, kernel=None):
    """(n,) float64 sums of ``values`` per label of ``labels`` (tensors of one shape on a device; labels outside
    0..n-1 left out, NaN and ±inf adding 0), where they are: no wait for the device. By the Triton kernel on CUDA
    (``kernel``: its module, for tests in Triton's interpreter): each block of :data:`SUM_BLOCK` elements summed per
    label in an order fixed by its layout, then the blocks' rows, so the sums are the same from run to run; else
    by :func:`blockwise_sums` (on CUDA, atomic additions: the last bits may vary)."""
    import torch

    if kernel is not None:
        return _kernel_label_sums(labels, values, n, kernel)
    if values.is_cuda and values.dtype.is_floating_point and _triton.available():
        sums = _triton.attempt(lambda: _kernel_label_sums(labels, values, n, None), "sums kernel",
                               "sums by atomic additions (their last bits may vary)", values.device)
        if sums is not None:
            return sums
    weights = values.flatten().to(torch.float64, copy=True).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return blockwise_sums(labels, weights, n)


def _kernel_label_sums(labels, values, n, kernel):
    import torch

    if kernel is None:
        from segood.metrics import _sums_triton as kernel
    labels, values = labels.contiguous().view(-1), values.contiguous().view(-1)
    blocks = triton_cdiv(values.numel(), SUM_BLOCK)
    partial = torch.zeros(max(blocks, 1), n, dtype=torch.float64, device=values.device)
    if blocks:
        kernel.block_sums[(blocks,)](labels, values, partial, values.numel(), C=n, BLOCK=SUM_BLOCK)
    return partial.sum(dim=0)


def blockwise_sums(labels, weights, n):
    """(n,) sums of ``weights`` (P,) per label of ``labels`` (P elements) on a device: element p adds to bin
    (p // SUM_BLOCK, label) of a table of partial sums (labels outside 0..n-1 to an extra column), whose rows are then
    summed; no wait for the device (``bincount`` would wait for its maximum). Atomic additions: exact for integer
    weights, in no fixed order for float ones."""
    import torch

    index = labels.flatten().long()
    index = torch.where((index >= 0) & (index < n), index, n)
    rows = torch.arange(index.numel(), device=index.device).div_(SUM_BLOCK, rounding_mode="floor")
    index.add_(rows.mul_(n + 1))
    table = torch.zeros(triton_cdiv(index.numel(), SUM_BLOCK) * (n + 1), dtype=weights.dtype, device=weights.device)
    return table.index_add_(0, index, weights).view(-1, n + 1).sum(dim=0)[:n]
