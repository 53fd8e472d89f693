"""Road Anomaly (Lis et al. 2019): 60 web images of unusual road hazards. Labels 0 ID, 2 OOD (the dataset has no
ignore value; any other value becomes ignore and is warned about); ``semantic`` is 255 everywhere. Some labels
were drawn at another resolution and rescaled: they are resized to the image with nearest neighbour, and the
manifest lists those frames (``rescaled_labels``) with a warning.

RoadObstacles v0 (Lis et al. 2020), in the same layout, labels 0 background, 1 road, 2 anomaly, 255 ignore: the
road is ID, the anomaly OOD, background and 255 ignore (only the road is evaluated, as for RoadObstacle21)."""

import json
from pathlib import Path

import cv2

from segood.data.adapter import Adapter, register_adapter
from segood.data.common import LabelTable, Sample, SkipFrame, read_label, read_rgb, require_tree, require_webp

EXPECTED_TREE = """\
<root>/frame_list.json
<root>/frames/<name>.webp   (or .jpg)
<root>/frames/<name>.labels/labels_semantic.png"""
LABELS = LabelTable({0: "id", 2: "ood"}, "Road Anomaly")
OBSTACLES_V0_LABELS = LabelTable({0: "ignore", 1: "id", 2: "ood", 255: "ignore"}, "RoadObstacles v0")
IMAGE_SUFFIXES = (".webp", ".jpg")


@register_adapter
class RoadAnomaly(Adapter):
    """The frames named in ``frame_list.json`` (RoadObstacles v0: or ``splits.json``'s ``full`` list), in its
    order; files in ``frames/`` it does not name are listed under ``unused_files``."""

    name, source = "road_anomaly", "road_anomaly"
    help = "Road Anomaly (Lis et al. 2019): 0 ID, 2 OOD; labels of another size resized nearest (listed)"
    default_split = None
    split = "test"
    labels, title, expected_tree = LABELS, "Road Anomaly", EXPECTED_TREE
    label_map_sha256 = LABELS.sha256

    #: the files that may list the frames, the first found read: {name: the key of the list in it, or None}
    index_files = {"frame_list.json": None}

    def __init__(self, root):
        self.root = Path(root)
        index = next((self.root / f for f in self.index_files if (self.root / f).is_file()), None)
        if index is None:
            require_tree(self.root, self.expected_tree, next(iter(self.index_files)), self.title)
            raise ValueError(f"{self.root / next(iter(self.index_files))} is not a file: the frames' list is a JSON "
                             f"file ({self.title}'s layout:\n{self.expected_tree})")
        key = self.index_files[index.name]
        try:
            names = json.loads(index.read_text())
        except (OSError, ValueError) as err:
            raise ValueError(f"{index} is not JSON ({err})") from None
        names = names.get(key) if key is not None and isinstance(names, dict) else names
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{index} must hold a JSON list of frame names" + (f" under {key!r}" if key else ""))
        outside = [n for n in names if n in ("", ".", "..") or "/" in n or "\\" in n]
        if outside:
            raise ValueError(f"{index} names {outside[0]!r}: a frame's name is the name of a file in frames/, without "
                             "a folder")
        self.stems = list(dict.fromkeys(_stem(n) for n in names))
        frames = self.root / "frames"
        if any(frames.glob("*.webp")):
            require_webp()
        self.unused_files = []
        listed = set(self.stems)
        for path in sorted(frames.iterdir()) if frames.is_dir() else ():
            stem = path.name[: -len(".labels")] if path.is_dir() and path.name.endswith(".labels") else _stem(path.name)
            if stem not in listed:
                self.unused_files.append((f"frames/{path.name}", f"not named in {index.name}"))

    def refs(self):
        return list(self.stems)

    def frame_id(self, stem):
        return stem

    def load(self, stem):
        frames = self.root / "frames"
        image_path = next((frames / f"{stem}{s}" for s in IMAGE_SUFFIXES if (frames / f"{stem}{s}").is_file()), None)
        if image_path is None:
            raise SkipFrame(f"no image {stem}.webp or {stem}.jpg")
        raw = read_label(frames / f"{stem}.labels" / "labels_semantic.png")
        image = read_rgb(image_path)
        extra = {}
        if raw.shape != image.shape[:2]:
            extra["rescaled_label"] = {"frame_id": stem, "from": list(raw.shape), "to": list(image.shape[:2])}
            raw = cv2.resize(raw, image.shape[1::-1], interpolation=cv2.INTER_NEAREST)
        ood_mask, semantic, unknown = self.labels.apply(raw)
        return Sample(image, ood_mask, semantic, stem, {**extra, **(unknown or {})} or None)

    def summary(self, extras):
        out = self.labels.summary(extras)
        rescaled = [e["rescaled_label"] for e in extras if "rescaled_label" in e]
        if rescaled:
            out["rescaled_labels"] = rescaled
            out["warnings"] = out.get("warnings", []) + [
                f"{len(rescaled)} labels were drawn at another resolution and resized to their image with nearest "
                f"neighbour: {', '.join(r['frame_id'] for r in rescaled[:5])}"]
        return out


@register_adapter
class RoadObstaclesV0(RoadAnomaly):
    """RoadObstacles v0: Road Anomaly's layout and rules for frames and rescaled labels, its own label values."""

    name, source = "road_obstacles_v0", "road_obstacles_v0"
    help = "RoadObstacles v0 (Road Anomaly's layout): road 1 ID, anomaly 2 OOD, background 0 and 255 ignore"
    labels, title = OBSTACLES_V0_LABELS, "RoadObstacles v0"
    label_map_sha256 = OBSTACLES_V0_LABELS.sha256
    # (the release lists its frames in splits.json, whose "full" list Fishyscapes' TFDS builder reads)
    index_files = {"frame_list.json": None, "splits.json": "full"}
    expected_tree = EXPECTED_TREE.replace("frame_list.json", "frame_list.json   (or splits.json, its \"full\" list)")


def _stem(name):
    """A frame name without its image suffix ('animals01_x.jpg' -> 'animals01_x')."""
    return next((name[: -len(s)] for s in IMAGE_SUFFIXES if name.endswith(s)), name)
