"""The Triton kernel of :func:`segood.metrics._device.label_sums` (imported on first use: Triton is slow to import,
and ``TRITON_INTERPRET=1``, read when a kernel is made, runs it on CPU tensors).

One program sums the values of BLOCK elements per label into its own row of partial sums: each label's sum is a
reduction within the program, in an order fixed by the block's layout, so the sums are the same from run to run
(atomic additions, in no fixed order, are not). Values are read in their own dtype and widened to float64 there.
"""

import triton
import triton.language as tl


@triton.jit
def block_sums(labels, scores, partial, P, C: tl.constexpr, BLOCK: tl.constexpr):
    """partial[block, c] = the sum of the finite values ``scores`` of the block's elements labelled c (labels
    outside 0..C-1: none; the lanes past P add 0)."""
    block = tl.program_id(0)
    offsets = block.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < P
    label = tl.load(labels + offsets, mask=inside, other=0).to(tl.int64)
    score = tl.load(scores + offsets, mask=inside, other=0).to(tl.float64)
    score = tl.where((score == score) & (tl.abs(score) != float("inf")), score, 0.0)  # NaN, ±inf count as 0
    row = partial + block.to(tl.int64) * C
    for c in tl.static_range(C):
        tl.store(row + c, tl.sum(tl.where(label == c, score, 0.0), axis=0))
