"""Per-class sums of a score map over its pixels' labelled classes (the paper's Figure 2: mean score per class).

Pixels of no class (labels >= ``num_classes``: void, ignore) are left out, as are non-finite scores (added as 0).
Sums are float64, added pixel by pixel in order (as ``torch.bincount`` with float64 weights adds them on the CPU,
so both paths give the same bits); on CUDA the sums are made on the device, where they can stay until they are
needed (no wait for the device per frame), in two steps: each block of :data:`BLOCK` pixels into its own row of
partial sums, then the rows summed. Adding every pixel into one row would make all the device's threads wait on
the same ~20 counters (atomic additions to one address run one after another: 13 ms a 1024x2048 frame on an
H100, more than the network's forward pass).
"""

import numba
import numpy as np
import torch


def class_counts(semantic, num_classes):
    """(num_classes,) int64 counts of each class's pixels in ``semantic`` (a uint8 tensor of any shape), where it
    is: a numpy array on the CPU, a tensor on a device."""
    if semantic.device.type == "cpu":
        labels = semantic.numpy().reshape(-1)
        return (_counts(labels) if labels.dtype == np.uint8 else np.bincount(labels, minlength=256))[:num_classes]
    ones = torch.ones(1, dtype=torch.int64, device=semantic.device).expand(semantic.numel())
    return _blockwise_sums(semantic, ones, num_classes)


def class_sums(semantic, scores, num_classes):
    """(num_classes,) float64 tensor where ``scores`` are: their sum over the pixels of each class of ``semantic``
    (a uint8 tensor of the same shape on the same device)."""
    if scores.device.type == "cpu":
        values = scores.numpy().reshape(-1)
        if values.dtype not in (np.float32, np.float64):
            values = values.astype(np.float64)  # exact for every float16 and integer score
        return torch.from_numpy(_sums(semantic.numpy().reshape(-1), values, num_classes))
    weights = scores.flatten().to(torch.float64, copy=True).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return _blockwise_sums(semantic, weights, num_classes)


BLOCK = 1024  # pixels per row of partial sums on a device


def _blockwise_sums(semantic, weights, num_classes):
    """(num_classes,) sums of ``weights`` (P,) per class of ``semantic`` on a device: pixel p adds to bin
    (p // BLOCK, class) of a table of partial sums (pixels of no class to an extra column), whose rows are then
    summed; no wait for the device (``bincount`` would wait for its maximum)."""
    bins = num_classes + 1
    index = torch.where(semantic < num_classes, semantic, num_classes).flatten().long()
    rows = torch.arange(index.numel(), device=index.device).div_(BLOCK, rounding_mode="floor")
    index.add_(rows.mul_(bins))
    table = torch.zeros(-(-index.numel() // BLOCK) * bins, dtype=weights.dtype, device=weights.device)
    return table.index_add_(0, index, weights).view(-1, bins).sum(dim=0)[:num_classes]


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
    sums = np.zeros(num_classes, np.float64)
    for i in range(labels.size):
        c = labels[i]
        if c < num_classes:
            value = np.float64(scores[i])
            if np.isfinite(value):
                sums[c] += value
    return sums
