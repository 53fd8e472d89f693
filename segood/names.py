"""The names of segood's registries as plain tuples, for the command line's choices and ``--help`` texts.

``segood --help`` and each subcommand's ``--help`` read these instead of the registries themselves, whose
modules import torch, numba and albumentations (seconds). ``tests/test_cli_startup.py`` checks every tuple
against its registry, so a method, metric or corruption added there and not here fails the tests.
"""

#: segood.methods.METHODS, in registration order.
METHODS = ("max_softmax", "odin", "mahalanobis", "confidence", "entropy", "varsum", "mutual_info", "max_logit",
           "energy", "sml", "rba", "mask_max_softmax", "eam")
#: segood.metrics.METRICS.
METRICS = ("auroc", "auprc", "fpr95", "max_iou")
#: segood.metrics.thresholds.RULES.
THRESHOLD_RULES = ("tpr95", "balanced_accuracy", "f1", "iou")
#: segood.models.ARCHS and HEADS.
ARCHS = ("pspnet", "deeplabv3plus")
HEADS = ("plain", "dimreduce", "dropout", "confidence")
#: segood.models.train.OE_LOSSES.
OE_LOSSES = ("entropy", "energy", "rba")
#: segood.robustness.FAMILIES and STANDARD_SIZES.
FAMILIES = ("segood", "standard", "all")
STANDARD_SIZES = ("fixed", "height")
#: segood.robustness.corruption_names("segood") and corruption_names("standard").
CORRUPTIONS = ("noise", "grey", "snow", "rain", "fog", "perspective", "blur", "rotation", "crop", "reflection",
               "night", "motion_blur", "jpeg", "sun_flare")
STANDARD_CORRUPTIONS = tuple("c:" + name for name in (
    "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur", "snow",
    "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"))
#: segood.models.list_model_types() and INFERENCE_MODES.
MODEL_TYPES = ("hf", "smp", "torchvision")
INFERENCE_MODES = ("whole", "resize", "slide")
#: segood.data.paste.BLENDS and HEIGHT_RATIO.
BLENDS = ("none", "feather", "seamless")
HEIGHT_RATIO = (0.15, 0.6)


def method_names():
    """:data:`METHODS`, or the live registry where its module is imported already (a plugin registered methods of
    its own before the command line was built): the command line offers those too."""
    return _live(METHODS, "segood.methods.methods", "METHODS")


def metric_names():
    """:data:`METRICS`, or the live registry where its module is imported already (as :func:`method_names`)."""
    return _live(METRICS, "segood.metrics.functional", "METRICS")


def _live(names, module, registry):
    import sys

    loaded = sys.modules.get(module)
    return tuple(getattr(loaded, registry)) if loaded is not None else names
