"""Models from elsewhere as segood networks: any ``nn.Module`` returning logits, or a plain smp state dict."""

import difflib
import os

import torch

from segood.labels import NUM_CLASSES
from segood.models.network import SegmentationNetwork, SegOutput


class ExternalModel(torch.nn.Module):
    """Any ``nn.Module`` returning logits (N, C, h, w) as a segood network; C any number of classes, (h, w) any
    resolution (logits smaller than the input, as mmseg and detectron2 heads give them before their final resize,
    are resized to the input before scoring: :func:`segood.models.network.resize_output`).

    Args:
        module: the network; its output may be a tensor, or a dict / tuple whose first entry is the logits.
        feature_layer: name of a submodule (``dict(module.named_modules())``) whose output serves as the
            penultimate features, captured with a forward hook; then the model serves Mahalanobis too.
        align_corners: how its logits are resized to the input: as the model's own library does (False: torch
            and smp's ``F.interpolate(..., mode="bilinear", align_corners=False)``; True for some mmseg configs).
        multiple: the network's input sides must be multiples of this (an smp network's encoder stride): frames
            are zero-padded to it and the logits cropped back, as for segood's own networks.

    segood feeds ImageNet-normalised inputs (:func:`segood.models.network.preprocess`).
    """

    def __init__(self, module, feature_layer=None, *, align_corners=False, multiple=1):
        super().__init__()
        if not isinstance(align_corners, bool):
            raise TypeError(f"align_corners must be True or False, got {align_corners!r}")
        self.module = module
        self.align_corners = align_corners
        self.multiple = int(multiple)
        self._features = None
        self.served_heads = {"plain"}
        self.feature_layer = feature_layer
        if feature_layer is not None:
            layers = dict(module.named_modules())
            if feature_layer not in layers:
                close = difflib.get_close_matches(feature_layer, [name for name in layers if name], n=5, cutoff=0.5)
                raise ValueError(f"no layer {feature_layer!r} in the model (dict(model.named_modules()) names its "
                                 f"{len(layers) - 1} layers)" + (f"; the closest: {', '.join(map(repr, close))}"
                                                                 if close else ""))
            layers[feature_layer].register_forward_hook(lambda _m, _i, out: setattr(self, "_features", out))
            self.served_heads.add("dimreduce")

    @property
    def input_multiple(self):
        """What the scorer pads frames to a multiple of."""
        return self.multiple

    def forward(self, x):
        weight = next((p for p in self.module.parameters() if p.is_floating_point()), None)
        if weight is not None and weight.dtype != x.dtype:  # (a network kept in float64 or float16: its own dtype)
            x = x.to(weight.dtype)
        out = self.module(x)
        if isinstance(out, dict) and out:
            out = next(iter(out.values()))
        elif isinstance(out, (tuple, list)) and out:
            out = out[0]
        return SegOutput(self._checked(out, x), self._features)

    def _checked(self, logits, x):
        """``logits`` where they are a floating (N, C, h, w) tensor of x's N frames; else what the network gave."""
        if isinstance(logits, torch.Tensor) and logits.dim() == 4 and logits.shape[0] == x.shape[0] and (
                logits.is_floating_point()):
            return logits
        what = _described(logits) + (f" and dtype {logits.dtype}" if isinstance(logits, torch.Tensor) else "")
        module = type(self.module)
        hint = ("; a transformers network: wrap it with segood.models.hf_model(network, processor)"
                if module.__module__.startswith("transformers") else "")
        raise ValueError(f"the network ({module.__name__}) gave {what} for {x.shape[0]} frames; segood takes "
                         f"float logits (N, C, h, w): a tensor, or a dict / tuple whose first entry is one{hint}")

    def penultimate(self, x):
        if "dimreduce" not in self.served_heads:
            raise ValueError("this model has no feature layer: pass feature_layer=NAME (--feature-layer NAME), a "
                             "name of its named_modules(), to use Mahalanobis")
        features = self(x).features
        if not (isinstance(features, torch.Tensor) and features.dim() == 4):
            raise ValueError(f"feature layer {self.feature_layer!r} gives {_described(features)}; Mahalanobis needs "
                             "one whose output is one (N, D, h, w) feature map: a layer inside it (an encoder's last "
                             "stage, the decoder)")
        return features


def _described(value):
    """What a network gave, in words: a tensor by its shape, anything else by its type."""
    return f"a tensor of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else f"a {type(value).__name__}"


def load_smp_weights(arch, encoder, weights, *, num_classes=NUM_CLASSES):
    """An smp model (``smp.create_model(arch, encoder)``, no encoder download) with the state dict in ``weights``
    (read with ``weights_only=True``), wrapped as an :class:`ExternalModel`."""
    from segood.models.checkpoint import FORMAT, mismatch, safe_load
    from segood.models.network import create_smp

    model = create_smp(arch, encoder, num_classes)
    state = safe_load(weights, "state dict")
    if not isinstance(state, dict):
        raise ValueError(f"{weights} holds a {type(state).__name__}, not a state dict of {arch}/{encoder}")
    if state.get("format") == FORMAT:
        raise ValueError(f"{weights} is a segood checkpoint (segood train's), not a bare state dict: pass it as "
                         "--checkpoint (load_model), which reads its network from it")
    try:
        model.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{weights} does not fit smp {arch} with {encoder} and {num_classes} classes: "
                         f"{mismatch(err)}") from None
    return ExternalModel(model, multiple=getattr(model.encoder, "output_stride", 32)).eval()


def as_network(model, *, feature_layer=None, align_corners=None):
    """``model`` as segood scores it: a segood network as it is; any other ``nn.Module`` returning logits wrapped in
    :class:`ExternalModel` (``feature_layer``, ``align_corners`` as there; an ExternalModel gets ``align_corners``
    when given, and is wrapped again with ``feature_layer``). A TypeError for what is no ``nn.Module``."""
    if isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model is a path ({model}), not a network: load it first, segood.models.load_model(path)[0] "
                        "for a segood checkpoint (load_smp_weights or load_library_model for another library's)")
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model is a {type(model).__name__}, not a torch nn.Module; a callable that returns anomaly "
                        "scores itself is evaluated as segood.Scorer(fn)")
    if isinstance(model, SegmentationNetwork):
        if align_corners is not None:
            raise ValueError("align_corners sets how a model's smaller logits are resized to the frame; a segood "
                             "network gives them at the frame's size already: drop it")
        return model
    if not isinstance(model, ExternalModel):
        return ExternalModel(model, feature_layer, align_corners=bool(align_corners))
    if feature_layer is not None:  # (a plain smp state dict's wrapper: hooked again; a library's adapter: refused)
        if type(model) is not ExternalModel:
            raise ValueError(f"feature_layer {feature_layer!r}: a {type(model).__name__} gives its own features (or "
                             "none); it takes no feature layer")
        return ExternalModel(model.module, feature_layer, multiple=model.multiple,
                             align_corners=model.align_corners if align_corners is None else bool(align_corners))
    if align_corners is not None:
        model.align_corners = bool(align_corners)
    return model
