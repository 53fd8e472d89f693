"""Pure per-pixel OOD score formulas on class probabilities. Output: (N, H, W) in [0, 1], higher = more OOD."""

import math

import torch


def max_softmax(probs: torch.Tensor) -> torch.Tensor:
    """1 - max_c p_c (Hendrycks & Gimpel 2017, "A baseline for detecting misclassified and OOD examples").

    Args:
        probs: (N, C, H, W) softmax probabilities.
    """
    return 1.0 - probs.amax(dim=1)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Shannon entropy of the softmax divided by its bound log C (Mukhoti & Gal 2018), in [0, 1].

    Args:
        probs: (N, C, H, W) softmax probabilities; 0 log 0 is taken as 0.
    """
    h = -(probs * torch.log(probs.clamp_min(torch.finfo(probs.dtype).tiny))).sum(dim=1)
    return (h / math.log(probs.shape[1])).clamp(0.0, 1.0)
