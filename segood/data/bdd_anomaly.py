"""BDD-Anomaly (Hendrycks et al., CAOS benchmark) from the BDD100K 10K segmentation release.

BDD's label files hold trainIds of the Cityscapes 19-class table (255 void). The anomalies are train (16),
motorcycle (17) and bicycle (18): ``test`` is every frame of BDD's train and val splits that contains one of
them, ``train`` / ``val`` the frames of those splits that contain none. ood_mask: 16, 17, 18 OOD, the other 16
classes ID, 255 ignore. ``semantic`` holds the BDD trainIds as they are (OOD pixels keep their class, so
analyses can tell the three anomaly classes apart). ``seg/color_labels/`` holds colour renderings and is never
read. Values 19..254 become ignore and are warned about.

Two protocols, as StreetHazards': ``segood`` (the default) as above, numbers pooled over pixels; ``original``,
the CAOS code's (``create_bdd_dataset.py`` shifts void to a label of its own, ``eval_ood.py`` counts every pixel
that is not an anomaly as ID): void (255) counts as ID, and the benchmark averages each metric per image (the set
records ``per_image_headline``)."""

from pathlib import Path

import numpy as np

from segood.data.adapter import Adapter, register_adapter
from segood.data.caos import PROTOCOLS, CAOSProtocols
from segood.data.common import LabelTable, SkipFrame, read_label, read_rgb, require_tree

EXPECTED_TREE = """\
<root>/seg/images/{train,val}/<id>.jpg
<root>/seg/labels/{train,val}/<id>_train_id.png"""
ANOMALY_CLASSES = (16, 17, 18)  # train, motorcycle, bicycle
LABEL_SUFFIX = "_train_id.png"
SPLITS = ("test", "train", "val")


@register_adapter
class BDDAnomaly(CAOSProtocols, Adapter):
    """Frames of ``test`` (BDD train + val frames with an anomaly class), ``train`` or ``val`` (without one).
    Listing reads every label file once to decide; unreadable ones are ``prefiltered`` with the reason."""

    name, source = "bdd_anomaly", "bdd_anomaly"
    help = ("BDD-Anomaly: BDD100K seg trainIds; train/motorcycle/bicycle OOD, other classes ID, void ignore "
            "(--protocol original: ID); --split test")
    default_split = "test"
    unlabeled = "void (255)"
    headline = "per-image mean, CAOS' protocol"  # how results.md names the original protocol's means
    tables = {protocol: LabelTable({**{c: ("id", c) for c in range(16)}, **{c: ("ood", c) for c in ANOMALY_CLASSES},
                                    255: role}, "BDD-Anomaly") for protocol, role in PROTOCOLS.items()}

    def __init__(self, root, split="test", *, protocol="segood"):
        if split not in SPLITS:
            raise ValueError(f"BDD-Anomaly split must be one of {SPLITS}, got {split!r}")
        self._use_protocol(protocol)
        self.root, self.split = Path(root), split
        require_tree(self.root, EXPECTED_TREE, f"seg/labels/*/*{LABEL_SUFFIX}", "BDD-Anomaly (BDD100K seg)")
        self.frames, self.prefiltered, self.unused_files = [], [], []
        anomaly = np.zeros(256, bool)
        anomaly[list(ANOMALY_CLASSES)] = True
        for bdd_split in ("train", "val") if split == "test" else (split,):
            labelled = set()
            for path in sorted((self.root / "seg" / "labels" / bdd_split).glob(f"*{LABEL_SUFFIX}")):
                labelled.add(path.name[: -len(LABEL_SUFFIX)])
                try:
                    has_anomaly = bool(anomaly[np.unique(read_label(path))].any())
                except SkipFrame as reason:
                    self.prefiltered.append((self.frame_id(path), str(reason)))
                    continue
                if has_anomaly == (split == "test"):
                    self.frames.append(path)
            for path in sorted((self.root / "seg" / "images" / bdd_split).glob("*")):
                if path.stem not in labelled:
                    self.unused_files.append((path.relative_to(self.root).as_posix(), "no label file"))
        if (self.root / "seg" / "color_labels").exists():
            self.unused_files.append(("seg/color_labels/", "colour renderings of the labels: never read"))


    def refs(self):
        return list(self.frames)

    def frame_id(self, path):
        return f"{path.parent.name}/{path.name[: -len(LABEL_SUFFIX)]}"

    def load(self, path):
        bdd_id = path.name[: -len(LABEL_SUFFIX)]
        image_path = self.root / "seg" / "images" / path.parent.name / f"{bdd_id}.jpg"
        if not image_path.is_file():
            raise SkipFrame(f"no image {bdd_id}.jpg")
        raw = read_label(path)
        image = read_rgb(image_path)
        return self._sample(image, raw, self.frame_id(path))
