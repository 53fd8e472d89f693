"""Per-class sums of a score map over its pixels' labelled classes (the paper's Figure 2: mean score per class).

Pixels of no class (labels >= ``num_classes``: void, ignore) are left out, as are non-finite scores (added as 0).
On the CPU, sums are float64, added pixel by pixel in order (as ``torch.bincount`` with float64 weights adds them,
so both give the same bits). On CUDA the sums are made on the device, where they can stay until they are needed
(no wait for the device per frame), in two steps: each block of :data:`BLOCK` pixels summed per class into its own
row of partial sums, then the rows summed. A Triton kernel (``_sums_triton``) sums each block in an order fixed by
its layout, reading the scores in their own dtype, so the sums are the same from run to run (up to rounding, the
CPU's). Without Triton the blocks' rows take atomic additions (``index_add_``), whose order varies, so their last
bits may too. Adding every pixel into one row would make all the device's threads wait on the same ~20 counters
(atomic additions to one address run one after another: 13 ms a 1024x2048 frame on an H100, more than the
network's forward pass).
"""

import numba
import numpy as np
import torch

from segood import _triton


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
        values = (scores.float() if scores.dtype == torch.bfloat16 else scores).numpy().reshape(-1)  # (exact)
        if values.dtype not in (np.float32, np.float64):
            values = values.astype(np.float64)  # exact for every float16 and integer score
        return torch.from_numpy(_sums(semantic.numpy().reshape(-1), values, num_classes))
    if scores.is_cuda and scores.dtype in _KERNEL_DTYPES and _triton.available():
        try:
            return _kernel_sums(semantic, scores, num_classes)
        except torch.cuda.OutOfMemoryError:
            raise
        except Exception as err:  # noqa: BLE001 - a Triton that cannot build or launch its kernel on this machine
            _triton.failed(err, "class-sums kernel", "per-class sums by atomic additions (last bits may vary)")
    weights = scores.flatten().to(torch.float64, copy=True).nan_to_num_(nan=0.0, posinf=0.0, neginf=0.0)
    return _blockwise_sums(semantic, weights, num_classes)


BLOCK = 1024  # pixels per row of partial sums on a device
_KERNEL_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def _kernel_sums(semantic, scores, num_classes, *, kernel=None):
    """:func:`class_sums` on a device by the Triton kernel (``kernel``: its module, for tests in Triton's
    interpreter): each block of pixels summed per class in a fixed order, then the blocks' rows summed."""
    if kernel is None:
        from segood.evaluation import _sums_triton as kernel
    labels, values = semantic.contiguous().view(-1), scores.contiguous().view(-1)
    blocks = -(-values.numel() // BLOCK)
    partial = torch.zeros(max(blocks, 1), num_classes, dtype=torch.float64, device=values.device)
    if blocks:
        kernel.block_sums[(blocks,)](labels, values, partial, values.numel(), C=num_classes, BLOCK=BLOCK)
    return partial.sum(dim=0)


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
