"""Hugging Face transformers networks: ``SegformerForSemanticSegmentation`` (per-pixel logits) and the
mask-classification ``Mask2FormerForUniversalSegmentation`` and ``EomtForUniversalSegmentation`` (per-query class
and mask logits), read from a local folder (``save_pretrained``'s: ``config.json``, the weights and, where present,
``preprocessor_config.json``, whose mean, std, rescale factor and size the adapter honours).

A mask-classification network's semantic scores per pixel are its authors' (Cheng et al. 2022, detectron2's
``semantic_inference``; transformers' ``post_process_semantic_segmentation``): the mask logits resized bilinearly
to the network's input, then Σ_q softmax(class logits_q)[:K] · sigmoid(mask logits_q), the "no object" class
dropped after the softmax. Those scores are probabilities summed over queries, not logits: max logit and energy
read them as they are, and the mask-level methods read the queries themselves.
"""

import json
from pathlib import Path

import torch
import torch.nn.functional as F

from segood.models.adapters import LibraryModel, check_folder, register_model_type
from segood.models.checkpoint import check_outlier_exposure
from segood.models.network import QueryOutput, SegOutput

#: model_type in a transformers config -> (its semantic segmentation class, its image processor class)
HF_CLASSES = {
    "segformer": ("SegformerForSemanticSegmentation", "SegformerImageProcessor"),
    "mask2former": ("Mask2FormerForUniversalSegmentation", "Mask2FormerImageProcessor"),
    "eomt": ("EomtForUniversalSegmentation", "EomtImageProcessor"),
}


def _transformers():
    try:
        import transformers
    except ImportError:
        raise ImportError("Hugging Face networks need transformers: pip install 'segood[hf]'") from None
    return transformers


def mask_semantic_scores(class_logits, mask_logits, size):
    """(N, K, H, W) semantic scores of a mask-classification network: its (N, Q, h, w) mask logits resized
    bilinearly to ``size`` = (H, W), sigmoid, weighted by the softmax of the (N, Q, K + 1) class logits without
    the last ("no object") class, summed over queries."""
    masks = F.interpolate(mask_logits, size=tuple(size), mode="bilinear", align_corners=False).sigmoid()
    return torch.einsum("nqc,nqhw->nchw", class_logits.softmax(dim=-1)[..., :-1], masks)


class HFSegmentation(LibraryModel):
    """A transformers ``SegformerForSemanticSegmentation``: logits (N, K, H/4, W/4), resized to the frame by the
    scorer as transformers' ``post_process_semantic_segmentation`` does (bilinear, align_corners=False)."""

    def num_network_classes(self):
        return self.module.config.num_labels

    def network_output(self, x):
        return SegOutput(self.module(pixel_values=x).logits, None)


class HFMaskClassification(LibraryModel):
    """A transformers ``Mask2FormerForUniversalSegmentation`` or ``EomtForUniversalSegmentation``: semantic scores
    per pixel as its authors compute them (:func:`mask_semantic_scores`), at the network's input size, and its
    query outputs (class logits (N, Q, K + 1), mask logits (N, Q, h, w)) for the mask-level methods."""

    mask_classification = True

    def num_network_classes(self):
        return self.module.config.num_labels

    def network_output(self, x):
        out = self.module(pixel_values=x)
        scores = mask_semantic_scores(out.class_queries_logits, out.masks_queries_logits, x.shape[-2:])
        return SegOutput(scores, None, None, QueryOutput(out.class_queries_logits, out.masks_queries_logits))


def hf_model(module, processor=None, **options):
    """A transformers network (an ``nn.Module`` already built) as a segood network.

    Args:
        module: a ``SegformerForSemanticSegmentation``, ``Mask2FormerForUniversalSegmentation`` or
            ``EomtForUniversalSegmentation``.
        processor: its image processor (None: the library's default one for the network's type), whose
            ``image_mean``, ``image_std``, ``rescale_factor``, ``size`` and ``size_divisor`` are honoured.
        options: :class:`~segood.models.adapters.LibraryModel`'s (``inference``, ``size``, ``crop``, ``stride``,
            ``classes``).
    """
    transformers = _transformers()
    model_type = getattr(getattr(module, "config", None), "model_type", None)
    if model_type not in HF_CLASSES:
        raise ValueError(f"segood adapts transformers networks of types {', '.join(HF_CLASSES)}; this one is "
                         f"{model_type!r} ({type(module).__name__})")
    model_class, processor_class = HF_CLASSES[model_type]
    if type(module).__name__ != model_class:
        raise ValueError(f"a {model_type} network for semantic segmentation is a {model_class}; this is a "
                         f"{type(module).__name__}: load it with {model_class}.from_pretrained")
    if processor is None:
        processor = getattr(transformers, processor_class)()
    config = module.config
    multiple = getattr(processor, "size_divisor", None) or (config.patch_size if model_type == "eomt" else 1)
    if model_type == "mask2former":
        multiple = max(int(multiple), 32)
    normalize, rescale = getattr(processor, "do_normalize", True), getattr(processor, "do_rescale", True)
    adapter = HFMaskClassification if model_type in ("mask2former", "eomt") else HFSegmentation
    id2label = dict(config.id2label)
    names = [id2label[i] for i in sorted(id2label)] if len(id2label) == config.num_labels else None
    if model_type == "eomt":  # a ViT with fixed position embeddings: image_size x image_size inputs only
        options["fixed_size"] = (config.image_size, config.image_size)
    return adapter(module, mean=processor.image_mean if normalize else (0.0, 0.0, 0.0),
                   std=processor.image_std if normalize else (1.0, 1.0, 1.0),
                   scale=255.0 * processor.rescale_factor if rescale else 255.0, multiple=int(multiple),
                   class_names=names, processor_size=getattr(processor, "size", None), **options)


@register_model_type(name="hf")
def load_hf(path, **options):
    """A transformers network saved in the local folder ``path`` (``save_pretrained``), never downloaded; its
    image processor from the folder's ``preprocessor_config.json`` where there is one."""
    transformers = _transformers()
    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a transformers model folder (no config.json): save the network with "
                                "model.save_pretrained(FOLDER) (and its processor with processor.save_pretrained)")
    check_folder(path, "hf")
    config = transformers.AutoConfig.from_pretrained(path, local_files_only=True)
    if config.model_type not in HF_CLASSES:
        raise ValueError(f"{path} holds a {config.model_type!r} network; segood adapts {', '.join(HF_CLASSES)}")
    model_class, processor_class = HF_CLASSES[config.model_type]
    if not hasattr(transformers, model_class):
        raise ValueError(f"{path} holds a {config.model_type} network and transformers {transformers.__version__} "
                         f"has no {model_class}: upgrade it (pip install -U transformers)")
    module = getattr(transformers, model_class).from_pretrained(path, local_files_only=True)
    processor = None
    if (path / "preprocessor_config.json").is_file():
        processor = getattr(transformers, processor_class).from_pretrained(path, local_files_only=True)
    network = hf_model(module, processor, **options)
    network.outlier_exposure = _outlier_exposure_record(path / "segood.json")
    return network


def _outlier_exposure_record(path):
    """The OE record of a folder that ``segood train --init-type hf`` fine-tuned (None for others)."""
    if not path.is_file():
        return None
    try:
        record = json.loads(path.read_text()).get("outlier_exposure")
    except (ValueError, AttributeError):
        raise ValueError(f"{path} is not segood's record of a fine-tuning (a JSON object); remove it or "
                         "fine-tune again") from None
    check_outlier_exposure(record, path)
    return record
