"""Per-class sums of a score map over its pixels' labelled classes (the paper's Figure 2: mean score per class).

Pixels of no class (labels >= ``num_classes``: void, ignore) are left out, as are non-finite scores (added as 0).
On the CPU, sums are float64, added pixel by pixel in order (as ``torch.bincount`` with float64 weights adds them,
so both give the same bits). On CUDA the sums are made on the device, where they can stay until they are needed
(no wait for the device per frame), in two steps (:func:`segood.metrics._device.label_sums`): each block of 1024
pixels summed per class into its own row of partial sums, then the rows summed. A Triton kernel sums each block in
an order fixed by its layout, reading the scores in their own dtype, so the sums are the same from run to run (up
to rounding, the CPU's). Without Triton the blocks' rows take atomic additions (``index_add_``), whose order
varies, so their last bits may too. Adding every pixel into one row would make all the device's threads wait on
the same ~20 counters (atomic additions to one address run one after another: 13 ms a 1024x2048 frame on an
H100, more than the network's forward pass).
"""

import numba
import numpy as np
import torch

from segood.metrics._device import blockwise_sums, label_sums


def class_counts(semantic, num_classes):
    """(num_classes,) int64 counts of each class's pixels in ``semantic`` (a uint8 tensor of any shape), where it
    is: a numpy array on the CPU, a tensor on a device."""
    if semantic.device.type == "cpu":
        labels = semantic.numpy().reshape(-1)
        return (_counts(labels) if labels.dtype == np.uint8 else np.bincount(labels, minlength=256))[:num_classes]
    ones = torch.ones(1, dtype=torch.int64, device=semantic.device).expand(semantic.numel())
    return blockwise_sums(semantic, ones, num_classes)


def class_sums(semantic, scores, num_classes):
    """(num_classes,) float64 tensor where ``scores`` are: their sum over the pixels of each class of ``semantic``
    (a uint8 tensor of the same shape on the same device)."""
    if scores.device.type == "cpu":
        values = (scores.float() if scores.dtype == torch.bfloat16 else scores).numpy().reshape(-1)  # (exact)
        if values.dtype not in (np.float32, np.float64):
            values = values.astype(np.float64)  # exact for every float16 and integer score
        return torch.from_numpy(_sums(semantic.numpy().reshape(-1), values, num_classes))
    return label_sums(semantic, scores, num_classes)


@numba.njit(cache=True, nogil=True)
def _counts(labels):
    """(256,) int64 counts of each value of uint8 ``labels``: numpy's ``bincount`` would first copy them to intp
    (3x slower on a 512x1024 frame)."""
    counts = np.zeros(256, np.int64)
    for value in labels:
        counts[value] += 1
    return counts


@numba.njit(cache=True, nogil=True)
def _sums(labels, scores, num_classes):
    """The finite ``scores`` summed per class of ``labels`` (uint8) in pixel order. The sum of the class of the
    current run of pixels is kept in a register, not in memory between pixels: the same additions in the same
    order, 2.4x faster on a frame's labels, whose classes come in runs."""
    sums = np.zeros(num_classes + 1, np.float64)  # the last: pixels of no class
    current, total = num_classes, 0.0
    for i in range(labels.size):
        c = min(labels[i], num_classes)
        if c != current:
            sums[current] = total
            current, total = c, sums[c]
        value = np.float64(scores[i])
        if np.isfinite(value):
            total += value
    sums[current] = total
    return sums[:num_classes].copy()
