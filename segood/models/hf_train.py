"""Outlier exposure for a transformers mask-classification network (Mask2Former, EoMT), as RbA fine-tunes one
(Nayal, Yavuz, Henriques & Güney, "RbA: Segmenting Unknown Regions Rejected by All", ICCV 2023): the network's own
loss (transformers' Hungarian-matched class and mask losses) on each frame's ID classes, plus RbA's outlier
supervision (:func:`~segood.models.losses.rba_oe_loss`, weight 1, margins 0 and 5) on its semantic scores
Σ_q softmax(class_q)[k] σ(mask_q) (:func:`~segood.models.hf.mask_semantic_scores`), every parameter trained.

``segood train --init FOLDER --init-type hf --outlier-exposure SET --oe-loss rba`` runs it through
:func:`segood.models.train.train` (seeded, resumable from ``last.pt``: the network's weights and the optimiser,
tensors and plain values only) and writes the fine-tuned network as a transformers folder ``final/`` (the
parent's image processor settings copied, the OE record in ``segood.json``), which ``segood evaluate
--model-type hf --model OUT/final`` loads, flagging test sets whose objects share the OE set's source.

Deliberate differences from the authors' code: their fine-tuning updates only the class head and the mask
embedding while segood trains every parameter (the learning rate and epochs are the user's), and the pasted
objects come from ``segood convert paste``, not from COCO.
"""

import json
import shutil
from pathlib import Path

import torch

from segood.io import atomic_output
from segood.labels import NUM_CLASSES
from segood.models.adapters import class_indices, missing_cityscapes_classes, some_names
from segood.models.checkpoint import safe_load
from segood.models.hf import load_hf, mask_semantic_scores
from segood.models.losses import rba_oe_loss
from segood.models.network import preprocess

FORMAT = "segood-hf-finetune/1"
RECORD = "segood.json"  # the OE record beside the weights of a fine-tuned folder


def trainid_classes(network):
    """The network's class index of each Cityscapes trainId: by name, or 0..18 for a network of 19 unnamed (or
    otherwise named) classes; a ValueError for a network that cannot be trained on trainIds."""
    names, count = network.class_names, network.num_network_classes()
    try:
        return class_indices(names if names is not None else count, "cityscapes")
    except ValueError:
        if count == NUM_CLASSES:
            return tuple(range(NUM_CLASSES))  # 19 classes in trainId order
        raise ValueError(f"segood train --init-type hf fine-tunes on Cityscapes trainIds: the network needs the 19 "
                         "Cityscapes classes, by their names (its config.json's id2label) or as 19 classes in "
                         f"trainId order; it has {count} classes"
                         + (f" ({some_names(names)}) and no class named "
                            f"{', '.join(map(repr, missing_cityscapes_classes(names)))}" if names else "")
                         ) from None


class MaskLearner:
    """Fine-tuning a transformers mask-classification network from its folder (``config.init``)."""

    def __init__(self, config, device):
        self.config, self.device = config, device
        self.network = load_hf(config.init).to(device)
        if not self.network.mask_classification:
            raise ValueError(f"{config.init} is a {type(self.network.module).__name__}, not a mask-classification "
                             "network (Mask2Former, EoMT): RbA's outlier supervision scores queries")
        self.module = self.network.module
        self.classes = trainid_classes(self.network)
        self.network.class_indices = self.classes  # its outputs in trainId order (the validation's mIoU)
        crop = tuple(config.crop)
        fixed, multiple = self.network.fixed_size, self.network.multiple
        if fixed and crop != fixed or any(side % multiple for side in crop):
            raise ValueError(f"the training crop {crop[0]}x{crop[1]} does not fit the network: "
                             + (f"it sees {fixed[0]}x{fixed[1]} inputs only" if fixed else
                                f"its sides must be multiples of {multiple}") + " (--crop H W)")

    def loss(self, batch, record):
        x = self.network.network_input(preprocess(batch["image"]))
        masks, labels = self.targets(batch["semantic"], batch["ood_mask"])
        out = self.module(pixel_values=x, mask_labels=masks, class_labels=labels)
        scores = mask_semantic_scores(out.class_queries_logits.float(), out.masks_queries_logits.float(),
                                      x.shape[-2:])[:, list(self.classes)]
        weight, (m_in, m_out) = self.config.oe_settings
        return out.loss.float() + weight * rba_oe_loss(scores, batch["ood_mask"], m_in=m_in, m_out=m_out)

    def targets(self, semantic, ood_mask):
        """Per frame, the binary masks of its ID classes and their network classes (transformers' ``mask_labels``
        and ``class_labels``); OOD and void pixels belong to no mask."""
        masks, labels = [], []
        for frame, ood in zip(semantic, ood_mask):
            present = [int(t) for t in torch.unique(frame[(ood == 0) & (frame < NUM_CLASSES)])]
            masks.append(torch.stack([(frame == t) & (ood == 0) for t in present]).float() if present
                         else frame.new_zeros((0, *frame.shape), dtype=torch.float32))
            labels.append(torch.tensor([self.classes[t] for t in present], dtype=torch.long, device=frame.device))
        return masks, labels

    def read(self, path, device):
        state = safe_load(path, "fine-tuning checkpoint", device)
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"{path} is not a checkpoint of segood's transformers fine-tuning ({FORMAT})")
        return state

    def save(self, path, **extra):
        with atomic_output(path) as tmp:
            torch.save({"format": FORMAT, "model": self.module.state_dict(), **extra}, tmp)

    def finish(self, out, **extra):
        """The fine-tuned network as a transformers folder ``out/final`` (written beside, then renamed into place)."""
        final, tmp = out / "final", out / "final.partial"
        shutil.rmtree(tmp, ignore_errors=True)
        self.module.save_pretrained(tmp)
        processor = Path(self.config.init) / "preprocessor_config.json"
        if processor.is_file():
            shutil.copy(processor, tmp / processor.name)
        record = {k: extra[k] for k in ("outlier_exposure", "train_config", "log") if k in extra}
        (tmp / RECORD).write_text(json.dumps(record, indent=1))
        shutil.rmtree(final, ignore_errors=True)
        tmp.rename(final)

