"""segood's float-order accumulator as a torchmetrics ``Metric``, so a Lightning validation loop logs the pooled
pixel metrics of every frame it sees, reduced over DDP processes (needs the optional ``torchmetrics``).

    >>> from segood.metrics.torchmetrics import BinaryOODMetrics
    >>> metric = BinaryOODMetrics()
    >>> metric.update(anomaly_scores, ood_mask)      # in validation_step: (N, H, W) scores, 0 / 1 / 255 labels
    >>> self.log_dict(metric.compute())              # auroc, auprc, fpr95, max_iou of all pixels, all processes

The counts are those of :class:`~segood.metrics.FloatOrderAccumulator` bit for bit, so the numbers equal
``segood evaluate``'s on the same scores.
"""

import numpy as np
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

from segood.metrics.float_order import DEFAULT_MANTISSA_BITS, FloatOrderAccumulator

REPORTED = ("auroc", "auprc", "fpr95", "max_iou")


class BinaryOODMetrics(Metric):
    """AUROC, AUPRC, FPR95 and MaxIoU (higher score = more OOD) over every counted pixel of every update.

    Args:
        mantissa_bits: the float-order grid's resolution (default 10; see :class:`FloatOrderAccumulator`).
        **kwargs: torchmetrics' ``Metric`` options (``process_group``, ``dist_sync_on_step``, ...).

    States (reduced over processes): ``bins`` (n,) int64, the float-order bin (binade << m | low bits) of each
    occupied bin of an update, and ``counts`` (n, 2) int64, its ID and OOD pixels, concatenated ("cat") and
    summed per bin in :meth:`compute`; ``n_ignored`` (summed) and ``exact`` (every bin one distinct value;
    reduced by min).
    """

    is_differentiable = False
    higher_is_better = None
    full_state_update = False

    def __init__(self, mantissa_bits: int = DEFAULT_MANTISSA_BITS, **kwargs):
        super().__init__(**kwargs)
        FloatOrderAccumulator(mantissa_bits)  # checks mantissa_bits
        self.mantissa_bits = int(mantissa_bits)
        self.add_state("bins", default=[], dist_reduce_fx="cat")
        self.add_state("counts", default=[], dist_reduce_fx="cat")
        self.add_state("n_ignored", default=torch.tensor(0, dtype=torch.int64), dist_reduce_fx="sum")
        self.add_state("exact", default=torch.tensor(1, dtype=torch.int64), dist_reduce_fx="min")

    def update(self, scores: torch.Tensor, labels: torch.Tensor) -> None:
        """Add pixels: ``scores`` any real numbers (any shape, CPU or CUDA), ``labels`` the same shape, 0 (ID),
        1 (OOD), 255 (ignore)."""
        state = FloatOrderAccumulator(self.mantissa_bits).update(scores, labels).state_dict()
        counts = state["counts"]
        which, low = np.nonzero(counts.any(axis=1))  # the occupied bins only
        self.bins.append(torch.from_numpy((state["binades"][which] << self.mantissa_bits) | low).to(self.device))
        self.counts.append(torch.from_numpy(np.ascontiguousarray(counts[which, :, low])).to(self.device))
        self.n_ignored += int(state["n_ignored"])
        self.exact &= int(bool(state["exact"]))

    def accumulator(self) -> FloatOrderAccumulator:
        """The accumulated counts as a :class:`FloatOrderAccumulator` (pooled, no per-image counts)."""
        if len(self.bins) == 0:  # (a list before a reduction, one tensor after it)
            raise ValueError("BinaryOODMetrics is empty: call update(scores, labels) before compute()")
        bins = dim_zero_cat(self.bins).cpu().numpy()
        counts = dim_zero_cat(self.counts).cpu().numpy()
        keys, where = np.unique(bins, return_inverse=True)
        summed = np.zeros((keys.size, 2), np.int64)
        np.add.at(summed, where, counts)
        binades, row = np.unique(keys >> self.mantissa_bits, return_inverse=True)
        dense = np.zeros((binades.size, 2, 1 << self.mantissa_bits), np.int64)
        dense[row, :, keys & ((1 << self.mantissa_bits) - 1)] = summed
        state = FloatOrderAccumulator(self.mantissa_bits).state_dict()
        state.update(binades=binades, counts=dense, exact=np.array(bool(int(self.exact))),
                     n_ignored=np.array(int(self.n_ignored), np.int64))
        return FloatOrderAccumulator.from_state_dict(state)

    def compute(self) -> dict:
        """{auroc, auprc, fpr95, max_iou}: float64 tensors (NaN where undefined: no OOD or no ID pixel)."""
        result = self.accumulator().compute()
        return {name: torch.tensor(result[name], dtype=torch.float64) for name in REPORTED}
