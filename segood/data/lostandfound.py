"""LostAndFound (Pinggera et al. 2016) and SMIYC's ``testNoKnown`` selection of its test split.

``gtCoarse_labelIds``: 0 (unlabelled, ego vehicle, out of ROI) ignore, 1 (free space) ID, 2..200 (every object
id, the "non-hazard" ones 31, 33, 34, 36-39 included, as SMIYC and Fishyscapes count them) OOD, above 200
ignore. ``semantic`` holds road (trainId 0) on the free space and 255 elsewhere. The PNGs carry a gAMA chunk:
raw values are read, never gamma-corrected ones."""

import re
from pathlib import Path

from segood.data.adapter import Adapter, register_adapter
from segood.data.common import LabelTable, Sample, SkipFrame, read_label, read_rgb, require_tree

EXPECTED_TREE = """\
<root>/leftImg8bit/{train,test}/<NN>_<scene>/<fid>_leftImg8bit.png
<root>/gtCoarse/{train,test}/<NN>_<scene>/<fid>_gtCoarse_labelIds.png"""
FID = re.compile(r"([0-9]{2})_(.*)_([0-9]{6})_([0-9]{6})")
IMAGE_SUFFIX, LABEL_SUFFIX = "_leftImg8bit.png", "_gtCoarse_labelIds.png"
LABELS = LabelTable({0: "ignore", 1: ("id", 0), (2, 200): "ood", (201, 255): "ignore"}, "LostAndFound")
#: SMIYC's testNoKnown leaves out the frames showing classes a Cityscapes model knows (fid prefixes)
KNOWN_CLASS_FRAMES = {"15_Rechbergstr_Deckenpfronn": "children", "01_Hanns_Klemm_Str_45_000006": "bicycles",
                      "01_Hanns_Klemm_Str_45_000007": "bicycles", "10_Schlossberg_9_000004": "bicycles"}
SPLITS = {"train": "train", "test": "test", "testNoKnown": "test"}  # split -> folder


def laf_image_path(root, folder, fid):
    """``<root>/leftImg8bit/<folder>/<NN>_<scene>/<fid>_leftImg8bit.png`` for a LostAndFound fid."""
    match = FID.fullmatch(fid)
    if match is None:
        raise ValueError(f"{fid!r} is not a LostAndFound frame id (<NN>_<scene>_<6 digits>_<6 digits>)")
    return Path(root) / "leftImg8bit" / folder / f"{match[1]}_{match[2]}" / f"{fid}{IMAGE_SUFFIX}"


@register_adapter
class LostAndFound(Adapter):
    """Frames of ``train``, ``test`` or ``testNoKnown`` (test less frames with an empty label and scenes with
    known classes; both listed under ``unused_files`` with the reason), listed from the images."""

    name, source = "lostandfound", "lostandfound"
    help = "LostAndFound gtCoarse labelIds: 1 free space ID, 2..200 OOD, else ignore; --split testNoKnown (SMIYC)"
    default_split = "test"
    label_map_sha256 = LABELS.sha256

    def __init__(self, root, split="test"):
        if split not in SPLITS:
            raise ValueError(f"LostAndFound split must be one of {tuple(SPLITS)}, got {split!r}")
        self.root, self.split, self.folder = Path(root), split, SPLITS[split]
        require_tree(self.root, EXPECTED_TREE, f"leftImg8bit/{self.folder}/*/*{IMAGE_SUFFIX}",
                     f"LostAndFound ({self.folder})")
        self.unused_files, self.frames = [], []
        for path in sorted((self.root / "leftImg8bit" / self.folder).glob(f"*/*{IMAGE_SUFFIX}")):
            relative = path.relative_to(self.root).as_posix()
            fid = path.name[: -len(IMAGE_SUFFIX)]
            if FID.fullmatch(fid) is None or not fid.startswith(path.parent.name + "_"):
                self.unused_files.append((relative, "not named <NN>_<scene>_<seq>_<frame> inside its scene folder"))
            elif split == "testNoKnown" and self._known_class(fid):
                self.unused_files.append((relative, f"testNoKnown leaves out frames with known classes "
                                                    f"({self._known_class(fid)})"))
            elif split == "testNoKnown" and self._empty_label(path):
                self.unused_files.append((relative, "testNoKnown leaves out frames whose label has no ID and no "
                                                    "OOD pixel"))
            else:
                self.frames.append(path)
        for label in sorted((self.root / "gtCoarse" / self.folder).glob(f"*/*{LABEL_SUFFIX}")):
            image = (self.root / "leftImg8bit" / self.folder / label.parent.name /
                     f"{label.name[: -len(LABEL_SUFFIX)]}{IMAGE_SUFFIX}")
            if not image.is_file():  # (a download cut short: said, not passed over)
                self.unused_files.append((label.relative_to(self.root).as_posix(),
                                          f"no image {image.relative_to(self.root).as_posix()}"))

    @staticmethod
    def _known_class(fid):
        return next((what for prefix, what in KNOWN_CLASS_FRAMES.items() if fid.startswith(prefix)), "")

    def _empty_label(self, path):
        try:
            raw = read_label(self.label_path(path))
        except SkipFrame:
            return False  # converting it says why
        ood_mask, _, _ = LABELS.apply(raw)
        return bool((ood_mask == 255).all())

    def refs(self):
        return list(self.frames)

    def frame_id(self, path):
        return f"{self.folder}/{path.name[: -len(IMAGE_SUFFIX)]}"

    def label_path(self, path):
        stem = path.name[: -len(IMAGE_SUFFIX)]
        return self.root / "gtCoarse" / self.folder / path.parent.name / f"{stem}{LABEL_SUFFIX}"

    def load(self, path):
        raw = read_label(self.label_path(path))
        image = read_rgb(path)
        if raw.shape != image.shape[:2]:
            raise SkipFrame(f"image {image.shape[:2]} and labels {raw.shape} differ in size")
        ood_mask, semantic, extra = LABELS.apply(raw)
        return Sample(image, ood_mask, semantic, self.frame_id(path), extra)
