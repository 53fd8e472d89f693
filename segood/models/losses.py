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


def entropy_oe_loss(logits, target, ood_mask, *, lam=0.9, reduction="sets", ignore_index=IGNORE):
    """Meta-OOD's entropy maximisation (Chan, Rottmann & Gottschalk, ICCV 2021, eq. 4).

    L = (1 - λ) mean_ID[-log p_y] + λ mean_OOD[-(1/K) Σ_k log p_k]: cross-entropy to the labels on ID pixels and to
    the uniform distribution on OOD pixels (minimal where the softmax is uniform, i.e. its entropy maximal).

    Args:
        logits: (N, K, H, W). target: (N, H, W) class ids, ``ignore_index`` where no class (OOD and void pixels).
        ood_mask: (N, H, W) 1 on OOD pixels (pasted objects), 0 on ID, 255 ignore.
        lam: the OOD term's weight λ (their default 0.9).
        reduction: "sets" (the paper: each term is a mean over its own pixels) or "pixels" (the authors' code:
            both terms summed over their pixels and divided by all ID and OOD pixels together, which weights each
            term by its share of pixels; their code also divides by K and counts void pixels, constant factors
            dropped here).

    A term without pixels in the batch contributes 0. Returns a scalar.
    """
    if reduction not in ("sets", "pixels"):
        raise ValueError(f"reduction must be 'sets' or 'pixels', got {reduction!r}")
    log_p = logits.log_softmax(dim=1)
    ood = ood_mask == 1
    labelled = (target != ignore_index) & ~ood
    nll = -log_p.gather(1, target.clamp(max=logits.shape[1] - 1).long()[:, None])[:, 0]
    uniform = -log_p.mean(dim=1)
    id_sum, ood_sum = nll[labelled].sum(), uniform[ood].sum()
    n_id, n_ood = labelled.sum(), ood.sum()
    if reduction == "pixels":
        return ((1 - lam) * id_sum + lam * ood_sum) / (n_id + n_ood).clamp_min(1)
    return (1 - lam) * id_sum / n_id.clamp_min(1) + lam * ood_sum / n_ood.clamp_min(1)


def energy(logits, *, temperature=1.0):
    """The free energy E = -T log Σ_k exp(l_k / T) of (N, K, H, W) logits, (N, H, W): lower on ID pixels."""
    return -temperature * torch.logsumexp(logits / temperature, dim=1)


def energy_oe_loss(logits, target, ood_mask, *, weight=0.1, m_in=-25.0, m_out=-7.0, ignore_index=IGNORE):
    """Energy-bounded outlier exposure (Liu, Wang, Owens & Li, "Energy-based Out-of-distribution Detection",
    NeurIPS 2020, eq. 7-8), per pixel.

    L = CE_ID + weight (mean_ID[max(0, E - m_in)²] + mean_OOD[max(0, m_out - E)²]), E the free energy
    (:func:`energy`, T = 1): ID pixels are pushed below the margin m_in, OOD pixels above m_out. Their defaults:
    weight 0.1, m_in = -25, m_out = -7 (CIFAR-10 classifiers: margins suit the network's logit scale).

    Args:
        logits: (N, K, H, W). target: (N, H, W) class ids, ``ignore_index`` on OOD and void pixels.
        ood_mask: (N, H, W) 1 OOD, 0 ID, 255 ignore. The ID pixels of the hinge are those with a class label.

    A term without pixels contributes 0. Returns a scalar.
    """
    ood = ood_mask == 1
    labelled = (target != ignore_index) & ~ood
    e = energy(logits)
    ce = F.cross_entropy(logits, torch.where(labelled, target.long(), ignore_index), ignore_index=ignore_index,
                         reduction="sum") / labelled.sum().clamp_min(1)
    hinge_in = (F.relu(e - m_in) ** 2)[labelled].sum() / labelled.sum().clamp_min(1)
    hinge_out = (F.relu(m_out - e) ** 2)[ood].sum() / ood.sum().clamp_min(1)
    return ce + weight * (hinge_in + hinge_out)


def rba_oe_loss(scores, ood_mask, *, m_in=0.0, m_out=5.0):
    """RbA's outlier supervision (Nayal, Yavuz, Henriques & Güney, "RbA: Segmenting Unknown Regions Rejected by
    All", ICCV 2023, eq. 6): squared hinges on the RbA score R = -Σ_k tanh(s_k).

    L = mean_ID[max(0, R - m_in)²] + mean_OOD[max(0, m_out - R)²], halved when the batch has OOD pixels (as in
    the authors' criterion, whose defaults are m_in = 0 and m_out = 5): ID pixels are pushed to be claimed by some
    class (R ≤ 0 needs Σ tanh ≥ 0), OOD pixels to be rejected by all (R ≥ 5).

    Args:
        scores: (N, K, H, W) per-class scores s_k: a mask-classification network's Σ_q softmax(class_q)[k]
            σ(mask_q) (:func:`segood.models.hf.mask_semantic_scores`); for a per-pixel network, its logits.
        ood_mask: (N, H, W) 1 OOD, 0 ID, 255 ignore, at the scores' size.

    Returns a scalar. In training it is added to the network's own segmentation loss (weight 1 in the authors'
    configuration).
    """
    r = -scores.tanh().sum(dim=1)
    ood, inlier = ood_mask == 1, ood_mask == 0
    loss = (F.relu(r - m_in) ** 2)[inlier].sum() / inlier.sum().clamp_min(1)
    if ood.any():
        loss = 0.5 * (loss + (F.relu(m_out - r) ** 2)[ood].sum() / ood.sum())
    return loss
