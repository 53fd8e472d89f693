"""Cityscapes: ``leftImg8bit`` images and ``gtFine_labelIds`` -> trainIds; every pixel with a trainId is ID."""

import hashlib

import cv2
import numpy as np

from segood.data.common import Sample, SkipFrame, SplitTree, read_rgb
from segood.labels import ID, IGNORE, LABEL_ID_TO_TRAIN_ID

EXPECTED_TREE = """\
<root>/leftImg8bit/{train,val,test}/<city>/<city>_<seq>_<frame>_leftImg8bit.png
<root>/gtFine/{train,val,test}/<city>/<city>_<seq>_<frame>_gtFine_labelIds.png"""


class Cityscapes(SplitTree):
    """Frames of one split. ``refs()`` lists them; ``load(ref)`` reads one (picklable, for process pools)."""

    name = source = "cityscapes"
    help = "leftImg8bit + gtFine_labelIds; every class pixel ID, the rest ignore"
    listed, suffix, hint, expected = "leftImg8bit", "_leftImg8bit.png", "Cityscapes", EXPECTED_TREE
    #: the labelId -> trainId table in use (from cityscapesscripts), recorded in every converted set
    label_map_sha256 = hashlib.sha256(LABEL_ID_TO_TRAIN_ID.tobytes()).hexdigest()

    def load(self, image_path):
        stem = self.stem(image_path)
        frame_id = self.frame_id(image_path)
        label_path = self.root / "gtFine" / self.split / image_path.parent.name / f"{stem}_gtFine_labelIds.png"
        if not label_path.is_file():
            raise SkipFrame(f"no label file {label_path.name}")
        label_ids = cv2.imread(str(label_path), cv2.IMREAD_UNCHANGED)
        if label_ids is None or label_ids.ndim != 2 or label_ids.dtype != np.uint8:
            raise SkipFrame(f"{label_path.name} is not a single-channel 8-bit label image")
        image = read_rgb(image_path)
        if image.shape[:2] != label_ids.shape:
            raise SkipFrame(f"image {image.shape[:2]} and labels {label_ids.shape} differ in size")
        semantic = LABEL_ID_TO_TRAIN_ID[label_ids]
        ood_mask = np.where(semantic == IGNORE, IGNORE, ID).astype(np.uint8)
        return Sample(image, ood_mask, semantic, frame_id)
