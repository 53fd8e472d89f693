"""Mask-level OOD methods: scores of a mask-classification network (Mask2Former, EoMT) read from its per-query
outputs (:class:`~segood.models.network.QueryOutput`) or its mask-aggregated semantic scores, as their authors
compute them at inference.

Each declares the head it needs: ``queries`` (the per-query class and mask logits, served by a mask-classification
adapter in ``whole`` or ``resize`` inference) or ``mask_scores`` (semantic scores that are mask-aggregated class
probabilities, served in every inference mode). A network that does not serve it is refused with a ValueError
that says which networks do. The formulas are the pure functions below; the method classes call them.

Where segood deviates from the authors' evaluation scripts: it scores one forward pass (Mask2Anomaly averages it
with a left-right flipped pass; a flip is a test-time augmentation that any method could use), and resizes
per-query masks to the frame in one bilinear step (detectron2 resizes them to the padded input, then the
cropped input to the original size).
"""

import torch
import torch.nn.functional as F

from segood.labels import NUM_CLASSES
from segood.methods.methods import Method, register_method, served_heads

#: the heads a mask-classification adapter serves (:class:`segood.models.adapters.LibraryModel`)
MASK_HEADS = ("queries", "mask_scores")

#: Cityscapes trainIds of the classes whose confident masks Mask2Anomaly's refinement trusts (building .. sky)
MASK2ANOMALY_REFINE_CLASSES = tuple(range(2, 11))


def rba(semantic_scores):
    """RbA: -Σ_k tanh(s_k) of (N, K, H, W) mask-aggregated class scores s_k = Σ_q p_qk σ(m_q) (N, H, W).

    In (-K, 0]: a pixel that no class claims (every s_k near 0) scores near 0, the most OOD."""
    return -semantic_scores.tanh().sum(dim=1)


def mask_max_softmax(semantic_scores, class_probs, mask_probs, *, inlier_count, refine=True, min_score=0.95,
                     refine_classes=MASK2ANOMALY_REFINE_CLASSES):
    """Mask2Anomaly's mask-based maximum softmax with its mask refinement, for one image.

    Args:
        semantic_scores: (K, H, W) Σ_q p_qk σ(m_q), the classes the evaluation uses.
        class_probs: (Q, K + 1) softmax over every class of the network and "no object" (the last).
        mask_probs: (Q, H, W) σ of the mask logits at the frame's size.
        inlier_count: K + 1's K, the index of "no object".
        refine_classes: the class indices (of ``class_probs``) whose confident masks the refinement trusts.

    The queries kept are those whose top class (over all K + 1) is not "no object", has probability above
    ``min_score`` and is one of ``refine_classes``; their masks weighted by that probability join the K semantic
    channels, and the score is 1 - the maximum over all of them. With more than one kept mask and ``refine``,
    pixels where some kept mask is at least 0.5 score 0 (the authors' refinement). Returns (H, W) in [1 - Q, 1].
    """
    top, labels = class_probs.max(dim=-1)
    allowed = torch.zeros_like(labels, dtype=torch.bool)
    for c in refine_classes:
        allowed |= labels == c
    keep = (labels != inlier_count) & (top > min_score) & allowed
    kept = top[keep].view(-1, 1, 1) * mask_probs[keep]
    score = 1 - torch.cat([semantic_scores, kept]).amax(dim=0)
    if refine and kept.shape[0] > 1:
        score = score * (kept.amax(dim=0) < 0.5)
    return score


def eam(class_probs, mask_probs):
    """EAM, the ensemble over masks: 1 - Σ_q max_k p_qk σ(m_q) (N, H, W) of inlier class probabilities
    ``class_probs`` (N, Q, K) (the softmax over K + 1, "no object" dropped after it) and ``mask_probs``
    (N, Q, H, W). In [1 - Q, 1]; a pixel that no confident inlier mask covers scores near 1."""
    return 1 - torch.einsum("nq,nqhw->nhw", class_probs.amax(dim=-1), mask_probs)


class MaskLevel(Method):
    """Base of the mask-level methods: refuse a network without the head they need, saying which networks have it."""

    head = "queries"
    score_range = None

    def check(self, model):
        if self.head in served_heads(model):
            return
        what = ("per-query class and mask logits" if self.head == "queries"
                else "semantic scores aggregated from masks")
        sliding = self.head == "queries" and "mask_scores" in served_heads(model)
        raise ValueError(f"{self.name} needs a mask-classification network's {what} (head {self.head!r}); this "
                         f"network serves {sorted(map(str, served_heads(model)))}. "
                         + ("Sliding-window inference averages each window's scores and keeps no queries: use "
                            "inference 'whole' or 'resize'" if sliding else
                            "Load a Mask2Former or EoMT network (--model-type hf), or choose a pixel-level method "
                            "(max_softmax, entropy, max_logit, energy, sml)"))

    def _queries(self, output):
        if output.queries is None:
            raise ValueError(f"{self.name} scores a mask-classification network's query outputs; this forward pass "
                             "has none (a per-pixel network, or sliding-window inference)")
        return output.queries


@register_method
class RbA(MaskLevel):
    """RbA, Rejected by All (Nayal et al., "RbA: Segmenting Unknown Regions Rejected by All", ICCV 2023):
    -Σ_k tanh(s_k) over the mask-aggregated class scores s_k = Σ_q softmax(c_q)_k σ(m_q) ("no object" dropped),
    a mask-classification network's own semantic scores. Higher = more OOD; in (-K, 0] (unbounded for the grid).
    Needs semantic scores aggregated from masks (any inference mode). With a class mapping, the sum runs over the
    mapped classes."""

    name = "rba"
    head = "mask_scores"

    def from_output(self, output):
        return rba(output.logits)


@register_method
class MaskMaxSoftmax(MaskLevel):
    """Mask-based maximum softmax (Rai et al., "Unmasking Anomalies in Road-Scene Segmentation" (Mask2Anomaly),
    ICCV 2023), as its inference code computes it: 1 - the maximum over the semantic scores and the masks of
    confident queries of Cityscapes' stuff classes (building .. sky), those masks then zeroing the score where
    they are at least 0.5 (:func:`mask_max_softmax`). Higher = more OOD; in [1 - Q, 1] (unbounded for the grid).
    Needs query outputs.

    As in the authors' code: the maximum runs over the kept masks too (their class slice falls on the batch
    axis), and the refinement needs more than one kept mask. ``refine_classes`` are target classes (Cityscapes
    trainIds by default), mapped to the network's classes through its class mapping; ``refine=False`` gives
    the plain mask-based maximum; the flipped second pass is not run (module docstring)."""

    name = "mask_max_softmax"

    def __init__(self, refine=True, min_score=0.95, refine_classes=MASK2ANOMALY_REFINE_CLASSES, **params):
        super().__init__(refine=bool(refine), min_score=float(min_score),
                         refine_classes=tuple(int(c) for c in refine_classes), **params)

    def from_output(self, output):
        queries = self._queries(output)
        size = output.logits.shape[-2:]
        probs = queries.class_logits.softmax(dim=-1)
        inliers = probs.shape[-1] - 1
        mapped = queries.class_indices
        default = self.params["refine_classes"] == MASK2ANOMALY_REFINE_CLASSES
        if mapped is None and inliers != NUM_CLASSES and self.params["refine"] and default:
            raise ValueError(f"mask_max_softmax refines with Cityscapes' stuff classes (trainIds "
                             f"{', '.join(map(str, MASK2ANOMALY_REFINE_CLASSES))}), and this network predicts "
                             f"{inliers} classes of its own: map them to Cityscapes' (--class-map, classes=), name "
                             "its own classes to refine with (refine_classes=) or pass refine=False")
        refine = tuple(mapped[c] if mapped is not None else c for c in self.params["refine_classes"]
                       if mapped is None or c < len(mapped))
        out = []
        for n in range(probs.shape[0]):
            masks = F.interpolate(queries.mask_logits[n:n + 1], size=size, mode="bilinear",
                                  align_corners=False)[0].sigmoid()
            out.append(mask_max_softmax(output.logits[n], probs[n], masks, inlier_count=inliers,
                                        refine=self.params["refine"], min_score=self.params["min_score"],
                                        refine_classes=refine))
        return torch.stack(out)


@register_method
class EnsembleOverMasks(MaskLevel):
    """EAM, ensemble over anomalous masks (Grcić, Šarić & Šegvić, "On Advantages of Mask-level Recognition for
    Outlier-aware Segmentation", CVPR Workshops 2023): 1 - Σ_q max_k p_qk σ(m_q), p_q the softmax over the
    classes and "no object", the inlier classes kept (:func:`eam`). Higher = more OOD; in [1 - Q, 1] (unbounded
    for the grid). Needs query outputs.

    EAM's outlier class is mask classification's "no object" class, into which its fine-tuning on pasted
    negatives pushes outlier masks: a network without one (no per-query class logits) is refused. With a class
    mapping, the maximum runs over the mapped classes only, so a network class left out of it (an explicit
    outlier or void class of the network) counts as outlier evidence too."""

    name = "eam"

    def from_output(self, output):
        queries = self._queries(output)
        return eam(queries.class_probabilities(), queries.mask_probabilities(output.logits.shape[-2:]))
