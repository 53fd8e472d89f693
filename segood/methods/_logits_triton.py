"""The Triton kernel of :func:`segood.methods.functional.logit_scores` (imported on first use: Triton is slow to
import, and ``TRITON_INTERPRET=1``, read when a kernel is made, runs it on CPU tensors).

One program handles BLOCK pixels of one image of (N, C, P) float32 logits (pixel i of class c of image n at
(n C + c) P + i) and writes five float32 statistics per pixel into (5, N, P): with u_c = z_c - max z and t = T,

    max z,  S = Σ_c exp(u_c),  W = Σ_c exp(u_c) u_c,  S_T - 1,  C - S_T    (S_T = Σ_c exp(u_c / T))

in two reads of the pixel's logits (the maximum, then the sums). S_T - 1 and C - S_T are summed as
:func:`~segood.methods.functional.odin_spread` sums them (every term but the maxima plus one per extra maximum;
-Σ expm1), each term of one sign, so both keep full relative precision at any T.
"""

import triton
import triton.language as tl


@triton.jit
def _expm1(x):
    """exp(x) - 1 to a few ulp for any x (Kahan's form: (e - 1) x / log e, with e = exp(x))."""
    e = tl.exp(x)
    ratio = x / tl.log(e)
    return tl.where(e == 1.0, x, tl.where(e - 1.0 == -1.0, -1.0, (e - 1.0) * tl.where(x == 0.0, 1.0, ratio)))


@triton.jit
def stats(logits, out, N, C, P, temperature, BLOCK: tl.constexpr):
    pid = tl.program_id(0)
    blocks = tl.cdiv(P, BLOCK)
    image = (pid // blocks).to(tl.int64)
    offsets = (pid % blocks) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < P
    base = logits + image * C * P + offsets
    top = tl.full((BLOCK,), float("-inf"), tl.float32)
    for c in range(C):
        z = tl.load(base + c * P, mask=inside, other=0.0).to(tl.float32)
        top = tl.maximum(top, z, propagate_nan=tl.PropagateNan.ALL)  # a NaN logit makes every statistic NaN
    total = tl.zeros((BLOCK,), tl.float32)
    weighted = tl.zeros((BLOCK,), tl.float32)
    below = tl.zeros((BLOCK,), tl.float32)  # S_T less its maxima: summed apart from them, to keep its digits
    maxima = tl.zeros((BLOCK,), tl.float32)
    to_uniform = tl.zeros((BLOCK,), tl.float32)
    for c in range(C):
        u = tl.load(base + c * P, mask=inside, other=0.0).to(tl.float32) - top
        e = tl.exp(u)
        total += e
        weighted += e * tl.maximum(u, -3.4028234663852886e38)  # a -inf logit adds 0, not 0 x -inf
        scaled = u / temperature
        below += tl.where(u == 0.0, 0.0, tl.exp(scaled))
        maxima += tl.where(u == 0.0, 1.0, 0.0)
        to_uniform -= _expm1(scaled)
    where = out + image * P + offsets
    step = N * P
    tl.store(where, top, mask=inside)
    tl.store(where + step, total, mask=inside)
    tl.store(where + 2 * step, weighted, mask=inside)
    tl.store(where + 3 * step, below + (maxima - 1.0), mask=inside)
    tl.store(where + 4 * step, to_uniform, mask=inside)
