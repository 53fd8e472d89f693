"""The constraints that keep the attack's content OOD: the search space is a zero-inlier space (the
adversarial-distributions paper's T = T_g ∩ T_h).

1. **No ID class of the label map** (T_g): the outlines come only from objects the label map calls OOD
   (:func:`ood_only`); a found sample whose object the label map does not call OOD is refused
   (:func:`check_content`).
2. **The zero-inlier filter** (T_h): the network's own classes must not explain the pasted region as well as its
   weakest inlier. The *confidence* of a set of pixels is their mean max-softmax; the **weakest inlier** is the
   lowest per-frame confidence over the ID pixels of the clean ID frames (:func:`weakest_inlier`: one number per
   network, the paper's "zero-inlier threshold", the smallest h(x) over the inliers). A candidate whose pasted
   region has a confidence at or above it is rejected (:func:`passes_filter`).
"""

import numpy as np
import torch

from segood.labels import OOD


def ood_only(objects, label_map):
    """The objects of a paste bank that ``label_map`` calls OOD (their names map to OOD)."""
    return [o for o in objects if o.role == "ood" and label_map.values(o.name)[0] == OOD]


def check_content(name, label_map):
    """Refuse (ValueError) an object name that the label map does not call OOD: it could be an ID class."""
    value, train_id = label_map.values(name)
    if value != OOD:
        raise ValueError(f"object {name!r} is not OOD under the label map (value {value}, trainId {train_id}): "
                         "the attack pastes only objects the label map calls OOD")


def confidence_map(logits):
    """Max-softmax per pixel: logits (N, C, H, W) -> (N, H, W) float32 in [1/C, 1]."""
    return torch.softmax(logits.float(), dim=1).amax(dim=1)


def region_confidence(logits, region):
    """Mean max-softmax over ``region`` ((H, W) bool) of one frame's logits (1, C, H, W)."""
    region = torch.as_tensor(np.asarray(region, bool), device=logits.device)
    return float(confidence_map(logits)[0][region].mean())


def weakest_inlier(confidences):
    """The zero-inlier threshold: the lowest of the per-frame ID confidences (None for a frame without ID
    pixels), as :func:`segood.attack.search.calibrate` measures them on the clean frames."""
    values = [c for c in confidences if c is not None]
    if not values:
        raise ValueError("no clean frame holds ID pixels: the weakest inlier is undefined")
    return min(values)


def passes_filter(confidence, threshold):
    """True when the network explains the pasted region less well than its weakest inlier."""
    return confidence < threshold
