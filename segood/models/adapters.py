"""Networks from the libraries users have, as segood networks: one adapter per library, each registered by the
name ``segood evaluate --model-type NAME`` takes (:data:`MODEL_TYPES`, ``@register_model_type``).

An adapter (:class:`LibraryModel`) takes what every segood network takes, ImageNet-normalised frames
(:func:`segood.models.network.preprocess`), and gives the network its own normalisation (an image processor's
mean, std and rescale factor), runs it in an inference mode (:mod:`segood.models.inference`), and maps its classes
to another label set where asked (:func:`class_indices`). A mask-classification network (Mask2Former, EoMT) gives
per-pixel semantic scores computed as its authors do, and keeps its per-query outputs
(:class:`~segood.models.network.QueryOutput`) for the mask-level methods (:mod:`segood.methods.mask`).

The loaders never download: they read local folders and files only (``from_pretrained(PATH)`` with
``local_files_only=True``; torchvision with ``weights=None, weights_backbone=None``).
"""

import json
import operator
import re

import torch

from segood.labels import CLASS_NAMES
from segood.models.external import ExternalModel
from segood.models.inference import (check_inference, processor_size, resize_and_back, run_padded, size_settings,
                                     slide)
from segood.models.network import IMAGENET_MEAN, IMAGENET_STD, SegOutput
from segood.registry import Registry

#: Loaders of library networks by model type (``hf``, ``torchvision``, ``smp``); ``@register_model_type`` adds one.
MODEL_TYPES = Registry("model type")


def register_model_type(loader=None, *, name=None, replace=False):
    """Register ``loader(path, **options) -> LibraryModel`` as model type ``name`` (decorator or call)."""
    return MODEL_TYPES.register(loader, name=name, replace=replace)


def load_library_model(model_type, path, **options):
    """The network of ``model_type`` (a registered name: :func:`list_model_types`) stored at ``path``, with the
    adapter ``options`` (``inference``, ``size``, ``crop``, ``stride``, ``classes``, and the loader's own)."""
    return MODEL_TYPES[model_type](path, **options)


def list_model_types():
    return sorted(MODEL_TYPES)


def _normalised(name):
    """A class name for matching: case, spaces, underscores, hyphens and slashes aside ("Traffic_Light" is
    "trafficlight")."""
    return re.sub(r"[\s_\-/]+", "", str(name).lower())


def _integer(value):
    """``value`` as an int where it is an integer of any kind (int, numpy, a 0-d tensor; not bool), else None."""
    if isinstance(value, (bool, str)):
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def class_indices(network_classes, classes):
    """The network's class index for each target class, a tuple; None keeps the network's own classes.

    Args:
        network_classes: the network's class names by index (a Hugging Face ``id2label``'s values), or an int,
            its number of classes, where it names none (torchvision, smp).
        classes: None (the network's own classes); ``"cityscapes"`` (the 19 Cityscapes trainIds, found by name
            among the network's classes, case, spaces and underscores aside); a sequence of network class
            indices or names, one per target class in order; or a dict {Cityscapes trainId or name: network class
            index or name} covering all 19.

    A target class the network cannot give is a ValueError naming it and what the network has.
    """
    if classes is None:
        return None
    names = list(network_classes) if not isinstance(network_classes, int) else None
    count = len(names) if names is not None else int(network_classes)
    lookup = {} if names is None else {_normalised(n): i for i, n in enumerate(names)}

    def index(value, target):
        if (number := _integer(value)) is not None:
            if not 0 <= number < count:
                raise ValueError(f"class {target!r} maps to network class {number}, but the network has classes "
                                 f"0..{count - 1}")
            return number
        found = lookup.get(_normalised(value))
        if found is None:
            raise ValueError(f"class {target!r} maps to {value!r}, which is not a class of the network; it has "
                             f"{some_names(names) if names else f'{count} unnamed classes (give indices)'}")
        return found

    if isinstance(classes, str):
        if classes != "cityscapes":
            raise ValueError(f"classes={classes!r}: give 'cityscapes', a list of network classes per target class, "
                             "or a dict {Cityscapes class: network class}")
        if names is None:
            raise ValueError("classes='cityscapes' finds the Cityscapes classes by name, and this network names "
                             f"none of its {count} classes: give their indices, a list of 19 or a dict")
        missing = missing_cityscapes_classes(names)
        if missing:
            raise ValueError(f"the network's classes cannot be mapped to the 19 Cityscapes trainIds: it has no class "
                             f"named {', '.join(map(repr, missing))} (its classes: {some_names(names)}). Map them "
                             "yourself (classes={'rider': 'person', ...} or a list of 19 network classes), or keep "
                             "the network's own classes (classes=None)")
        return tuple(lookup[_normalised(n)] for n in CLASS_NAMES)
    if isinstance(classes, dict):
        by_name = {_normalised(n): k for k, n in enumerate(CLASS_NAMES)}
        mapped = {}
        for key, value in classes.items():
            train_id = _integer(key)
            if train_id is None:  # a name, or a trainId as text (JSON's keys are strings)
                train_id = int(key) if str(key).isdigit() else by_name.get(_normalised(key))
            if train_id is None or not 0 <= train_id < len(CLASS_NAMES):
                raise ValueError(f"{key!r} is not a Cityscapes class (trainIds 0..{len(CLASS_NAMES) - 1} or "
                                 f"names {', '.join(CLASS_NAMES)})")
            mapped[train_id] = index(value, CLASS_NAMES[train_id])
        missing = [CLASS_NAMES[k] for k in range(len(CLASS_NAMES)) if k not in mapped]
        if missing:
            raise ValueError(f"the class map leaves Cityscapes classes {', '.join(missing)} unmapped; map every one "
                             "of the 19")
        return tuple(mapped[k] for k in range(len(CLASS_NAMES)))
    if not (isinstance(classes, (list, tuple)) or getattr(classes, "ndim", None) == 1):  # (or an array, a tensor)
        raise ValueError(f"classes={classes!r}: give 'cityscapes', a list of network classes per target class, or a "
                         "dict {Cityscapes class: network class}")
    indices = tuple(index(v, k) for k, v in enumerate(classes))
    if not indices:
        raise ValueError("an empty class list maps no class: give one network class per target class")
    return indices


#: the key of a saved folder's config.json that tells each library's folders apart
FOLDER_KEYS = {"hf": ("transformers", "model_type"), "smp": ("segmentation_models_pytorch", "_model_class")}


def check_folder(path, model_type):
    """Refuse a folder whose ``config.json`` another library than ``model_type``'s saved, naming that library."""
    library, key = FOLDER_KEYS[model_type]
    try:
        config = json.loads((path / "config.json").read_text())
    except (OSError, UnicodeDecodeError, ValueError) as err:
        raise ValueError(f"{path / 'config.json'} cannot be read as JSON ({err}): save the network again with "
                         "model.save_pretrained(FOLDER)") from err
    if not isinstance(config, dict) or key not in config:
        other = [name for name, (_, k) in FOLDER_KEYS.items() if isinstance(config, dict) and k in config]
        hint = (f": {FOLDER_KEYS[other[0]][0]} saved it, read it with model type {other[0]!r} (--model-type "
                f"{other[0]})") if other else ""
        raise ValueError(f"{path} is not a {library} model folder (its config.json has no {key!r}){hint}")


def missing_cityscapes_classes(names):
    """The Cityscapes class names that none of the network's class ``names`` matches (case, spaces and underscores
    aside)."""
    found = {_normalised(name) for name in names}
    return [name for name in CLASS_NAMES if _normalised(name) not in found]


def some_names(names):
    """At most 25 of ``names``, and how many more."""
    names = [str(n) for n in names]
    return ", ".join(names[:25]) + (f" and {len(names) - 25} more" if len(names) > 25 else "")


# torch's words for an input smaller than a layer's kernel or a pooling's output
TOO_SMALL = ("Kernel size can't be greater than actual input size", "Output size is too small",
             "Expected more than 1 value per channel", "Padding size should be less than")
TOO_SMALL_FIX = {"whole": "Give the frames a larger size, or inference 'resize' to the network's size "
                          "(--inference resize)",
                 "resize": "Give a larger size (--infer-size H W), e.g. the network's training size",
                 "slide": "Give a larger window (--window H W), e.g. the network's training crop"}


class LibraryModel(ExternalModel):
    """A library's network as a segood network (subclasses implement :meth:`network_output`).

    Args:
        module: the library's ``nn.Module``.
        fixed_size: (h, w) the network's only input size (EoMT's position embeddings): ``resize`` resizes to it,
            ``slide`` windows must be it (border windows of a smaller frame are padded), ``whole`` frames must be it.
        mean, std, scale: the network's input normalisation, ``(pixels * scale - mean) / std`` for pixels in
            [0, 1] (an image processor: ``scale`` = 255 × ``rescale_factor``).
        multiple: the network's input sides must be multiples of this (the scorer pads in ``whole`` mode).
        inference: ``whole``, ``resize`` (to ``size``, or the image processor's ``processor_size`` rule) or
            ``slide`` (windows ``crop`` every ``stride``): :mod:`segood.models.inference`.
        classes: a class mapping (:func:`class_indices`) from the network's ``class_names`` to the target's.
        align_corners: how its logits are resized, as its library does (False for all three).
    """

    mask_classification = False

    def __init__(self, module, *, mean=IMAGENET_MEAN, std=IMAGENET_STD, scale=1.0, multiple=1, inference="whole",
                 size=None, crop=None, stride=None, classes=None, class_names=None, processor_size=None,
                 fixed_size=None, align_corners=False):
        super().__init__(module, align_corners=align_corners)
        check_inference(inference, size=size, crop=crop, stride=stride)
        self.module.eval()
        self.inference = inference
        self.size = None if size is None else tuple(int(v) for v in size)
        self.crop = None if crop is None else tuple(int(v) for v in crop)
        self.stride = self.crop if stride is None else tuple(int(v) for v in stride)
        self.multiple = int(multiple)
        self.processor_size = processor_size
        self.fixed_size = None if fixed_size is None else tuple(int(v) for v in fixed_size)
        if self.fixed_size and (self.size or self.crop or self.fixed_size) != self.fixed_size:
            raise ValueError(f"this network sees inputs of exactly {self.fixed_size[0]}x{self.fixed_size[1]} (its "
                             f"position embeddings); give size=crop={self.fixed_size} or leave them out")
        if inference == "resize" and size is None and processor_size is None and fixed_size is None:
            raise ValueError("resize inference needs the network's size: size=(H, W) (--infer-size H W), or an "
                             "image processor that has one")
        self.class_names = None if class_names is None else tuple(str(n) for n in class_names)
        self.class_indices = class_indices(self.class_names if self.class_names is not None
                                           else self.num_network_classes(), classes)
        # (x * std_in + mean_in) * scale: pixels in the network's units, then its own normalisation
        mean_in, std_in = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
        mean, std = torch.as_tensor(mean, dtype=torch.float32), torch.as_tensor(std, dtype=torch.float32)
        gain, shift = std_in * scale / std, (mean_in * scale - mean) / std
        self.renormalise = not (torch.allclose(gain, torch.ones(3)) and torch.allclose(shift, torch.zeros(3)))
        self.register_buffer("gain", gain.view(1, 3, 1, 1), persistent=False)
        self.register_buffer("shift", shift.view(1, 3, 1, 1), persistent=False)
        self.served_heads = {"plain"}
        if self.mask_classification:
            self.served_heads.add("mask_scores")  # its logits are mask-aggregated class probabilities
            if inference != "slide":
                self.served_heads.add("queries")

    def num_network_classes(self):
        """The number of classes the network predicts (for a class mapping by index); each library's adapter says."""
        raise NotImplementedError(f"{type(self).__name__} must implement num_network_classes()")

    def network_output(self, x):
        """:class:`SegOutput` of the network on ``x`` in its own normalisation, logits at its own resolution; each
        library's adapter says."""
        raise NotImplementedError(f"{type(self).__name__} must implement network_output(x)")

    @property
    def input_multiple(self):
        """What the scorer pads frames to a multiple of: the network's multiple in ``whole`` mode, unless it sees one
        size only (a padded frame of another size would pass for it)."""
        return self.multiple if self.inference == "whole" and not self.fixed_size else 1

    def network_input(self, x):
        """ImageNet-normalised ``x`` in the network's own normalisation."""
        return x * self.gain + self.shift if self.renormalise else x

    def forward(self, x):
        try:
            return self.mapped(self._forward(self.network_input(x)))
        except RuntimeError as err:  # a layer that an input this small cannot pass
            if not any(message in str(err) for message in TOO_SMALL):
                raise
            size = {"whole": x.shape[-2:], "resize": self.size, "slide": self.crop}[self.inference]
            given = f" ({size[0]}x{size[1]})" if size else ""
            raise ValueError(f"the network cannot run on inputs this small{given}: {err}. "
                             f"{TOO_SMALL_FIX[self.inference]}") from err

    def _forward(self, x):
        if self.inference == "whole":
            if self.fixed_size and tuple(x.shape[-2:]) != self.fixed_size:
                raise ValueError(f"this network sees inputs of exactly {self.fixed_size[0]}x{self.fixed_size[1]}; "
                                 f"these frames are {x.shape[-2]}x{x.shape[-1]}: use inference 'resize' or 'slide' "
                                 f"(window {self.fixed_size[0]} {self.fixed_size[1]})")
            divisible = x.shape[-2] % self.multiple == 0 and x.shape[-1] % self.multiple == 0
            return self.network_output(x) if divisible else run_padded(self.network_output, x, self.multiple,
                                                                       align_corners=self.align_corners)
        if self.inference == "resize":
            size = self.size or self.fixed_size or processor_size(*x.shape[-2:], self.processor_size,
                                                                  multiple=self.multiple)
            size = tuple(-(-s // self.multiple) * self.multiple for s in size)
            return resize_and_back(self.network_output, x, size, align_corners=self.align_corners)
        pad = self.fixed_size[0] if self.fixed_size else self.multiple  # (border windows of smaller frames)
        return SegOutput(slide(lambda window: run_padded(self.network_output, window, pad,
                                                         align_corners=self.align_corners),
                               x, crop=self.crop, stride=self.stride, align_corners=self.align_corners), None)

    def mapped(self, out):
        """``out`` with its logits (and query outputs) restricted to the mapped classes, in the target's order."""
        if self.class_indices is None:
            return out
        queries = out.queries
        if queries is not None:
            queries = type(queries)(queries.class_logits, queries.mask_logits, self.class_indices)
        return SegOutput(out.logits[:, list(self.class_indices)], out.features, out.confidence, queries)

    def penultimate(self, x):
        raise ValueError(f"a {type(self).__name__} exposes no feature layer: Mahalanobis needs a segood network "
                         "with the 'dimreduce' head")

    def describe(self):
        """What sets this adapter's outputs apart beyond its weights (recorded with a run)."""
        return {"adapter": type(self).__name__, "inference": self.inference,
                **({"size": list(self.size)} if self.size else {}),
                **({"crop": list(self.crop), "stride": list(self.stride)} if self.crop else {}),
                **({"class_indices": list(self.class_indices)} if self.class_indices else {}),
                # (the input's normalisation and the sizes the network is given: a resumed run never mixes two)
                **({"gain": self.gain.flatten().tolist(), "shift": self.shift.flatten().tolist()}
                   if self.renormalise else {}),
                **({"multiple": self.multiple} if self.multiple != 1 else {}),
                **({"fixed_size": list(self.fixed_size)} if self.fixed_size else {}),
                **({"processor_size": size_settings(self.processor_size)}
                   if self.inference == "resize" and self.processor_size else {})}
