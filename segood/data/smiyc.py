"""SegmentMeIfYouCan (Chan et al. 2021): RoadAnomaly21 (``dataset_AnomalyTrack``) and RoadObstacle21
(``dataset_ObstacleTrack``). Label 0 is ID (for RoadObstacle21: the road, the only region evaluated), 1 OOD,
anything else ignore; ``semantic`` is 255 everywhere (the benchmark has no class labels). The test frames have
no public labels: they are converted with an all-ignore mask and listed as ``unlabelled_frames``, so they can
be scored and exported for the benchmark's server but never evaluated here."""

import re
from pathlib import Path

import numpy as np

from segood.data.adapter import Adapter, register_adapter
from segood.data.common import LabelTable, Sample, SkipFrame, read_label, read_rgb, require_tree, require_webp
from segood.labels import IGNORE

LABEL_SUFFIX = "_labels_semantic.png"
LABELS = LabelTable({0: "id", 1: "ood", (2, 255): "ignore"}, "SMIYC")


class _Track(Adapter):
    """A SMIYC track: frames ``<root>/images/<fid><image_suffix>``, labels
    ``<root>/labels_masks/<fid>_labels_semantic.png`` (``*_labels_semantic_color.png`` renderings beside them are
    never read). The root is the track folder. Subclasses set ``folder``, ``image_suffix`` and the splits."""

    folder = image_suffix = ""
    splits = ()
    default_split = "validation"
    label_map_sha256 = LABELS.sha256

    def __init__(self, root, split="validation"):
        if split not in self.splits:
            raise ValueError(f"{self.source} split must be one of {self.splits}, got {split!r}")
        self.root, self.split = Path(root), split
        expected = (f"<root = {self.folder}>/images/<fid>{self.image_suffix}\n"
                    f"<root = {self.folder}>/labels_masks/<fid>{LABEL_SUFFIX}")
        require_tree(self.root, expected, f"images/*{self.image_suffix}", f"SMIYC {self.folder}")
        if self.image_suffix == ".webp":
            require_webp()
        self.unused_files = []
        self.frames = []
        for path in sorted((self.root / "images").iterdir()):
            if not path.name.endswith(self.image_suffix):
                self.unused_files.append((f"images/{path.name}", f"not a {self.image_suffix} image"))
                continue
            why_not = self.outside(path.name[: -len(self.image_suffix)])
            if why_not:
                self.unused_files.append((f"images/{path.name}", why_not))
            else:
                self.frames.append(path)
        used = {self.frame_id(path) for path in self.frames}
        for path in sorted((self.root / "labels_masks").glob("*")) if (self.root / "labels_masks").is_dir() else ():
            fid = path.name[: -len(LABEL_SUFFIX)]
            if not path.name.endswith(LABEL_SUFFIX):
                self.unused_files.append((f"labels_masks/{path.name}", "not a label file (*_labels_semantic.png)"))
            elif fid not in used:
                image = f"images/{fid}{self.image_suffix}"
                self.unused_files.append((f"labels_masks/{path.name}", f"no image {image}" if not (
                    self.root / image).is_file() else "the label of a frame outside this split"))

    def outside(self, fid):
        """Why frame ``fid`` is not in this split (a sentence), or '' when it is."""
        raise NotImplementedError(f"{type(self).__name__} must implement outside(fid)")

    def refs(self):
        return list(self.frames)

    def frame_id(self, path):
        return path.name[: -len(self.image_suffix)]

    def label_path(self, path):
        return self.root / "labels_masks" / f"{self.frame_id(path)}{LABEL_SUFFIX}"

    def has_labels(self, path):
        return self.label_path(path).is_file()

    def load(self, path):
        image = read_rgb(path)
        if not self.has_labels(path):
            if self.frame_id(path).startswith("validation"):
                raise SkipFrame(f"no label file {self.label_path(path).name} for a validation frame")
            unlabelled = np.full(image.shape[:2], IGNORE, np.uint8)
            return Sample(image, unlabelled, unlabelled.copy(), self.frame_id(path))
        raw = read_label(self.label_path(path))
        if raw.shape != image.shape[:2]:
            raise SkipFrame(f"image {image.shape[:2]} and labels {raw.shape} differ in size")
        ood_mask, semantic, extra = LABELS.apply(raw)
        return Sample(image, ood_mask, semantic, self.frame_id(path), extra)


@register_adapter
class RoadAnomaly21(_Track):
    """RoadAnomaly21: 110 frames (``.jpg``, mixed sizes, kept at their native sizes by default); ``validation``
    (``validation0000``..``validation0009``, with labels), ``test`` (the 100 others, no public labels), ``all``."""

    name, source = "smiyc_anomaly", "smiyc_roadanomaly21"
    help = "SMIYC RoadAnomaly21 (dataset_AnomalyTrack): 0 ID, 1 OOD, else ignore; test frames have no labels"
    folder, image_suffix = "dataset_AnomalyTrack", ".jpg"
    splits = ("validation", "test", "all")

    def outside(self, fid):
        validation = re.fullmatch(r"validation\d{4}", fid) is not None
        if self.split == "validation" and not validation:
            return "a test frame (the split is validation)"
        if self.split == "test" and validation:
            return "a validation frame (the split is test)"
        return ""


#: RoadObstacle21 scenes per split (fid = ``<scene>_<n>``): the benchmark's own lists.
OBSTACLE_SCENES = {
    "test": ("curvy-street", "one-way-street", "gravel", "greyasphalt", "motorway", "paving", "darkasphalt",
             "darkasphalt2"),
    "night": ("driveway",),
    "snowstorm": ("snowstorm1", "snowstorm2"),
    "validation": ("validation",),
}
#: validation frames SMIYC's RoadObstacle21 validation split leaves out
OBSTACLE_VALIDATION_LEFT_OUT = frozenset([19, *range(21, 30)])


@register_adapter
class RoadObstacle21(_Track):
    """RoadObstacle21 (``.webp``, 1920x1080): ``validation`` (with labels, less ``validation_19`` and
    ``validation_21``..``validation_29``), ``test`` (327 frames), ``night`` (30), ``snowstorm`` (55), ``all``
    (every scene, all 40 validation frames included, as SMIYC's ``ObstacleTrack-all``); the scene is the fid up to
    its first ``_``. Only the road is ID."""

    name, source = "smiyc_obstacle", "smiyc_roadobstacle21"
    help = "SMIYC RoadObstacle21 (dataset_ObstacleTrack, webp): road 0 ID, 1 OOD, else ignore; test has no labels"
    folder, image_suffix = "dataset_ObstacleTrack", ".webp"
    splits = ("validation", "test", "night", "snowstorm", "all")


    def outside(self, fid):
        scene = fid.split("_")[0]
        known = {s: split for split, scenes in OBSTACLE_SCENES.items() for s in scenes}
        if scene not in known:
            return f"scene {scene!r} is none of RoadObstacle21's ({', '.join(sorted(known))})"
        if self.split not in ("all", known[scene]):
            return f"scene {scene!r} belongs to the {known[scene]} split, not {self.split}"
        if scene == "validation":
            number = fid.split("_")[1] if "_" in fid else ""
            if not number.isdigit():
                return "not named validation_<n>"
            if self.split == "validation" and int(number) in OBSTACLE_VALIDATION_LEFT_OUT:
                return "left out of SMIYC's RoadObstacle21 validation split"
        return ""
