"""Cityscapes: ``leftImg8bit`` images and ``gtFine_labelIds`` -> trainIds; every pixel with a trainId is ID."""

import hashlib

import numpy as np

from segood.data.adapter import register_adapter
from segood.data.common import Sample, SkipFrame, SplitTree, decode, read_rgb, require_tree
from segood.labels import ID, IGNORE, LABEL_ID_TO_TRAIN_ID, OFFICIAL_LABEL_IDS

EXPECTED_TREE = """\
<root>/leftImg8bit/{train,val,test}/<city>/<city>_<seq>_<frame>_leftImg8bit.png
<root>/gtFine/{train,val,test}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png"""


@register_adapter
class Cityscapes(SplitTree):
    """Frames of one split. ``refs()`` lists them; ``load(ref)`` reads one (picklable, for process pools)."""

    name = source = "cityscapes"
    help = "leftImg8bit + gtFine_labelIds; every class pixel ID, the rest ignore"
    listed, suffix, hint, expected = "leftImg8bit", "_leftImg8bit.png", "Cityscapes", EXPECTED_TREE
    #: the labelId -> trainId table in use (from cityscapesscripts), recorded in every converted set
    label_map_sha256 = hashlib.sha256(LABEL_ID_TO_TRAIN_ID.tobytes()).hexdigest()

    def __init__(self, root, split="val"):
        super().__init__(root, split)
        require_tree(self.root, self.expected, f"gtFine/{split}/*/*_gtFine_labelIds.png", f"Cityscapes ({split}) labels")

    def load(self, image_path):
        stem = self.stem(image_path)
        frame_id = self.frame_id(image_path)
        label_path = self.root / "gtFine" / self.split / image_path.parent.name / f"{stem}_gtFine_labelIds.png"
        if not label_path.is_file():
            raise SkipFrame(f"no label file {label_path.name}")
        label_ids = np.asarray(decode(label_path, ("L",), "label image"))  # single-channel 8-bit labelIds
        image = read_rgb(image_path)
        if image.shape[:2] != label_ids.shape:
            raise SkipFrame(f"image {image.shape[:2]} and labels {label_ids.shape} differ in size")
        semantic = LABEL_ID_TO_TRAIN_ID[label_ids]
        ood_mask = np.where(semantic == IGNORE, IGNORE, ID).astype(np.uint8)
        counts = np.bincount(label_ids.ravel(), minlength=256)
        unknown = {int(i): int(counts[i]) for i in np.flatnonzero(counts) if i not in OFFICIAL_LABEL_IDS}
        return Sample(image, ood_mask, semantic, frame_id, {"unknown_label_ids": unknown} if unknown else None)

    def summary(self, extras):
        """Pixels of label ids outside the official table (they become ignore), per id, with a warning."""
        pixels, frames = {}, {}
        for extra in extras:
            for label_id, count in extra["unknown_label_ids"].items():
                pixels[label_id] = pixels.get(label_id, 0) + count
                frames[label_id] = frames.get(label_id, 0) + 1
        unknown = {str(i): {"pixels": pixels[i], "frames": frames[i]} for i in sorted(pixels)}
        shown = ", ".join(f"{i} ({v['pixels']} pixels in {v['frames']} frames)" for i, v in unknown.items())
        return {"unknown_label_ids": unknown,
                "warnings": [f"label ids outside the official Cityscapes table became ignore: {shown}; are these "
                             "gtFine_labelIds files (not trainIds or colour images)?"]}
