"""torchvision segmentation networks (``deeplabv3_*``, ``fcn_*``, ``lraspp_*``) from a local state dict, and
segmentation_models_pytorch networks from a local ``save_pretrained`` folder, as segood networks. Both take
ImageNet-normalised inputs, as segood gives them, and return logits at the input's size."""

import contextlib
import io
from pathlib import Path

from segood.models.adapters import LibraryModel, check_folder, register_model_type
from segood.models.network import SegOutput

#: the torchvision segmentation builders segood adapts
TORCHVISION_ARCHS = ("deeplabv3_mobilenet_v3_large", "deeplabv3_resnet50", "deeplabv3_resnet101", "fcn_resnet50",
                     "fcn_resnet101", "lraspp_mobilenet_v3_large")


class TorchvisionSegmentation(LibraryModel):
    """A torchvision segmentation network: its ``out`` logits (N, K, H, W), already at the input's size (its
    own bilinear resize, align_corners=False); the auxiliary head, if any, is not scored."""

    def num_network_classes(self):
        return _classifier_out(self.module.state_dict())

    def network_output(self, x):
        return SegOutput(self.module(x)["out"], None)


class SmpSegmentation(LibraryModel):
    """A segmentation_models_pytorch network: logits (N, K, H, W); its input sides a multiple of its encoder's
    output stride (the scorer pads)."""

    def num_network_classes(self):
        return self.module.segmentation_head[0].out_channels

    def network_output(self, x):
        return SegOutput(self.module(x), None)


def _classifier_out(state):
    """The number of classes of a torchvision segmentation state dict (its last classifier layer's outputs)."""
    for key in ("classifier.4.weight", "classifier.high_classifier.weight"):
        if key in state:
            return int(state[key].shape[0])
    raise ValueError("this state dict has no torchvision segmentation classifier (classifier.4.weight or "
                     f"classifier.high_classifier.weight); its keys begin {list(state)[:5]}")


def torchvision_model(module, **options):
    """A torchvision segmentation network (built already) as a segood network; ``options`` as
    :class:`~segood.models.adapters.LibraryModel`'s (its classes have no names: map them by index)."""
    return TorchvisionSegmentation(module, **options)


@register_model_type(name="torchvision")
def load_torchvision(path, *, arch=None, num_classes=None, **options):
    """torchvision's ``arch`` (one of :data:`TORCHVISION_ARCHS`) built with ``weights=None,
    weights_backbone=None`` (no download) and the plain state dict at ``path`` (``weights_only``); its number of
    classes and auxiliary head read from the state dict where not given."""
    import torchvision

    from segood.models.checkpoint import mismatch, safe_load

    if arch not in TORCHVISION_ARCHS:
        raise ValueError(f"a torchvision network needs its architecture (--arch): one of {', '.join(TORCHVISION_ARCHS)}"
                         f"; got {arch!r}")
    state = safe_load(path, "state dict")
    if not isinstance(state, dict):
        raise ValueError(f"{path} holds a {type(state).__name__}, not a state dict of torchvision {arch}")
    classes = _classifier_out(state)
    if num_classes is not None and int(num_classes) != classes:
        raise ValueError(f"{path} predicts {classes} classes, not {num_classes}: drop --num-classes or fix it")
    extra = {"aux_loss": True} if any(k.startswith("aux_classifier.") for k in state) else {}
    module = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=classes, **extra)
    try:
        module.load_state_dict(state)
    except RuntimeError as err:
        raise ValueError(f"{path} does not fit torchvision {arch} with {classes} classes: {mismatch(err)}") from None
    return torchvision_model(module, **options)


@register_model_type(name="smp")
def load_smp(path, **options):
    """A segmentation_models_pytorch network saved in the local folder ``path`` (``model.save_pretrained``:
    ``config.json`` and the weights), never downloaded."""
    import segmentation_models_pytorch as smp

    path = Path(path)
    if not (path / "config.json").is_file():
        raise FileNotFoundError(f"{path} is not a segmentation_models_pytorch folder (no config.json): save the "
                                "network with model.save_pretrained(FOLDER), or give a plain state dict with --arch, "
                                "--encoder and --weights")
    check_folder(path, "smp")
    # (the folder holds the weights: the encoder's pretrained ones, which its config names, are never downloaded)
    with contextlib.redirect_stdout(io.StringIO()):  # (the hub's word that it reads a local folder)
        module = smp.from_pretrained(str(path), local_files_only=True, encoder_weights=None)
    stride = getattr(module.encoder, "output_stride", 32)
    return SmpSegmentation(module, multiple=stride, **options)
