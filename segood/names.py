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
#: segood.metrics.official.BENCHMARKS.
OFFICIAL = ("smiyc", "fishyscapes", "caos")
#: segood.metrics.thresholds.RULES.
THRESHOLD_RULES = ("tpr95", "balanced_accuracy", "f1", "iou")
#: segood.models.ARCHS and HEADS.
ARCHS = ("pspnet", "deeplabv3plus")
HEADS = ("plain", "dimreduce", "dropout", "confidence")
#: segood.models.train.OE_LOSSES.
OE_LOSSES = ("entropy", "energy", "rba")
#: the defaults of segood.models.train.TrainConfig that segood train's --help states.
TRAIN_DEFAULTS = {"arch": "pspnet", "head": "plain", "epochs": 10, "batch_size": 8, "lr": 0.01, "poly_power": 0.9,
                  "dropout_p": 0.5, "reduced_dim": 32, "workers": 0, "seed": 0}
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
#: segood.data.registry.ADAPTERS: {name: its help}, what ``segood convert --help`` lists (each one's options are
#: read from the adapter itself once a dataset is named).
ADAPTERS = {
    "cityscapes": "leftImg8bit + gtFine_labelIds; every class pixel ID, the rest ignore",
    "idd": "polygon JSON in file order; car ID, autorickshaw OOD, the rest ignore",
    "noise": "Perlin or random normal noise, every pixel OOD, the same bytes on every machine",
    "sun": "SUN2012 LabelMe XML through label_maps/sun.yaml; size filter; seeded 25% tune / 75% eval split",
    "bdd_anomaly": "BDD-Anomaly: BDD100K seg trainIds; train/motorcycle/bicycle OOD, other classes ID, void ignore "
                   "(--protocol original: ID); --split test",
    "lostandfound": "LostAndFound gtCoarse labelIds: 1 free space ID, 2..200 OOD, else ignore; --split testNoKnown "
                    "(SMIYC)",
    "fishyscapes_laf": "Fishyscapes Lost & Found labels (0 ID, 1 OOD, 255 ignore) with images from "
                       "--lostandfound-root",
    "fishyscapes_static": "Fishyscapes Static: Cityscapes val image (--cityscapes-root) + shipped overlay; 0 ID, 1 "
                          "OOD, 255 ignore",
    "paste": "objects from --objects (a SUN2012 root or 'demo') pasted onto the road and sidewalk of Cityscapes "
             "frames: pasted OOD objects OOD, pasted ID objects (--negatives) ID, the rest the frame's labels",
    "road_anomaly": "Road Anomaly (Lis et al. 2019): 0 ID, 2 OOD; labels of another size resized nearest (listed)",
    "road_obstacles_v0": "RoadObstacles v0 (Road Anomaly's layout): road 1 ID, anomaly 2 OOD, background 0 and 255 "
                         "ignore",
    "smiyc_anomaly": "SMIYC RoadAnomaly21 (dataset_AnomalyTrack): 0 ID, 1 OOD, else ignore; test frames have no "
                     "labels",
    "smiyc_obstacle": "SMIYC RoadObstacle21 (dataset_ObstacleTrack, webp): road 0 ID, 1 OOD, else ignore; test has "
                      "no labels",
    "streethazards": "StreetHazards: its 13 classes ID, anomaly (14) OOD, unlabeled ignore (--protocol original: "
                     "ID)",
}
#: segood.data.paste.BLENDS and HEIGHT_RATIO.
BLENDS = ("none", "feather", "seamless")
HEIGHT_RATIO = (0.15, 0.6)


def method_names():
    """:data:`METHODS`, or the live registry where its module is imported already (a plugin registered methods of
    its own before the command line was built): the command line offers those too."""
    return _live(METHODS, "segood.methods.methods", "METHODS")


def adapter_help():
    """:data:`ADAPTERS`, or {name: help} of the live registry where its module is imported already (an adapter a
    plugin registered), with every built-in adapter's module imported too."""
    import sys

    if "segood.data.adapter" not in sys.modules:
        return ADAPTERS
    from segood.data.registry import ADAPTERS as registered

    return {name: adapter.help for name, adapter in registered.items()}


def model_type_names():
    """:data:`MODEL_TYPES`, or the live registry's names, sorted, where its module is imported already (as
    :func:`method_names`)."""
    return tuple(sorted(_live(MODEL_TYPES, "segood.models.adapters", "MODEL_TYPES")))


def metric_names():
    """:data:`METRICS`, or the live registry where its module is imported already (as :func:`method_names`)."""
    return _live(METRICS, "segood.metrics.functional", "METRICS")


def _live(names, module, registry):
    import sys

    loaded = sys.modules.get(module)
    return tuple(getattr(loaded, registry)) if loaded is not None else names
