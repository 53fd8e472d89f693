"""Training losses."""

import torch
import torch.nn.functional as F

from segood.labels import IGNORE


def confidence_loss(logits, confidence, target, *, lam=0.5, hints=None, ignore_index=IGNORE, eps=1e-12):
    """Learned confidence loss of DeVries & Taylor (2018) per pixel, as the seed paper's Appendix A.5, eq. 13-18.

    b ~ Bernoulli(0.5); c' = c b + (1 - b); p' = c' p + (1 - c') y; loss = mean(-log p'_y) + lam mean(-log c),
    both means over the pixels whose target is not ``ignore_index``.

    Args:
        logits: (N, C, H, W). confidence: (N, 1, H, W) in (0, 1). target: (N, H, W) class ids or 255.
        hints: (N, 1, H, W) of 0/1 to use as b (tests); drawn from Bernoulli(0.5) when None.
    """
    valid = target != ignore_index
    if not valid.any():
        return logits.sum() * 0.0
    probs = logits.softmax(dim=1)
    onehot = F.one_hot(target.clamp(max=logits.shape[1] - 1).long(), logits.shape[1]).permute(0, 3, 1, 2)
    c = confidence.clamp(eps, 1.0)
    b = torch.bernoulli(torch.full_like(c, 0.5)) if hints is None else hints.to(c.dtype)
    c_hint = c * b + (1 - b)
    p_hint = c_hint * probs + (1 - c_hint) * onehot
    nll = -torch.log((p_hint * onehot).sum(dim=1).clamp_min(eps))
    return nll[valid].mean() + lam * (-torch.log(c[:, 0][valid])).mean()
