"""StreetHazards (Hendrycks et al., CAOS benchmark): synthetic CARLA frames, 1280x720, labels 1..14.

Two protocols. ``segood`` (the default): 2..13 (its own 12 classes and "other") ID, 14 (anomaly) OOD, 1
(unlabeled) ignore, and reports pool every pixel. ``original`` (the CAOS evaluation): unlabeled counts as ID too,
and the benchmark averages each metric per image; a set converted so records ``params["protocol"]`` and
``per_image_headline``, and its results.md shows the per-image means beside the pooled numbers, each named.
``semantic`` holds Cityscapes trainIds for the classes that have a Cityscapes counterpart (building, fence,
pedestrian -> person, pole, road line -> road, road, sidewalk, vegetation, car, wall, traffic sign) and 255 for
unlabeled, other and anomaly. Values outside 1..14 become ignore and are warned about."""

from pathlib import Path

from segood.data.adapter import Adapter, register_adapter
from segood.data.caos import PROTOCOLS, CAOSProtocols
from segood.data.common import LabelTable, read_label, read_rgb, require_tree

EXPECTED_TREE = """\
<root>/train/images/{training,validation}/<town>/<n>.png   + <root>/train/annotations/<same path>
<root>/test/images/test/<town>/<n>.png                     + <root>/test/annotations/test/<same path>"""
SPLITS = {"training": "train", "validation": "train", "test": "test"}  # split -> top folder
CLASSES = {  # StreetHazards value -> (ood role, Cityscapes trainId or None)
    2: ("id", 2),     # building
    3: ("id", 4),     # fence
    4: ("id", None),  # other
    5: ("id", 11),    # pedestrian -> person
    6: ("id", 5),     # pole
    7: ("id", 0),     # road line -> road
    8: ("id", 0),     # road
    9: ("id", 1),     # sidewalk
    10: ("id", 8),    # vegetation
    11: ("id", 13),   # car
    12: ("id", 3),    # wall
    13: ("id", 7),    # traffic sign
    14: "ood",        # anomaly
}


@register_adapter
class StreetHazards(CAOSProtocols, Adapter):
    """Frames of ``training``, ``validation`` or ``test``, listed from the images (``<split>/<town>/<n>``)."""

    name, source = "streethazards", "streethazards"
    help = "StreetHazards: its 13 classes ID, anomaly (14) OOD, unlabeled ignore (--protocol original: ID)"
    default_split = "test"
    unlabeled = "unlabeled (1)"
    headline = "per-image mean, StreetHazards' protocol"  # how results.md names the original protocol's means
    tables = {protocol: LabelTable({1: role, **CLASSES}, "StreetHazards") for protocol, role in
              PROTOCOLS.items()}

    def __init__(self, root, split="test", *, protocol="segood"):
        if split not in SPLITS:
            raise ValueError(f"StreetHazards split must be one of {tuple(SPLITS)}, got {split!r}")
        self._use_protocol(protocol)
        self.root, self.split = Path(root), split
        self.top = self.root / SPLITS[split]
        require_tree(self.root, EXPECTED_TREE, f"{SPLITS[split]}/images/{split}/*/*.png", f"StreetHazards ({split})")
        self.unused_files = [  # (an annotation whose image a download cut short: said, not passed over)
            (label.relative_to(self.root).as_posix(), f"no image {image.relative_to(self.root).as_posix()}")
            for label in sorted((self.top / "annotations" / split).glob("*/*.png"))
            if not (image := self.top / "images" / split / label.parent.name / label.name).is_file()]

    def refs(self):
        return sorted((self.top / "images" / self.split).glob("*/*.png"))

    def frame_id(self, path):
        return f"{self.split}/{path.parent.name}/{path.stem}"

    def load(self, path):
        label_path = self.top / "annotations" / self.split / path.parent.name / path.name
        raw = read_label(label_path)
        image = read_rgb(path)
        return self._sample(image, raw, self.frame_id(path))
