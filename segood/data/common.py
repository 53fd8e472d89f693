"""What every adapter shares: the sample, image reading, polygon rasterising, resizing, label-map files."""

import hashlib
import sys
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np
import yaml
from PIL import Image, ImageDraw

from segood.data.adapter import Adapter

# label_maps/ sits beside the package in a checkout (editable install) and in <prefix>/share/segood otherwise.
_LABEL_MAP_DIRS = (Path(__file__).resolve().parents[2] / "label_maps", Path(sys.prefix) / "share/segood/label_maps")


@dataclass
class Sample:
    """One frame in the unified convention.

    image: (H, W, 3) uint8 RGB. ood_mask: (H, W) uint8, 0 ID / 1 OOD / 255 ignore. semantic: (H, W) uint8
    Cityscapes trainIds, 255 where unknown. frame_id: stable string from the source path.
    """

    image: np.ndarray
    ood_mask: np.ndarray
    semantic: np.ndarray
    frame_id: str
    extra: dict | None = None  # adapter-specific facts for reports (e.g. SUN polygon statistics)


class SkipFrame(Exception):
    """This frame cannot be converted; the message is the reason recorded in the manifest."""


class DatasetLayoutError(FileNotFoundError):
    """The raw dataset folder does not have the published layout."""


def require_tree(root, expected, found_glob, hint):
    """Raise a :class:`DatasetLayoutError` showing the expected tree and what is really there."""
    root = Path(root)
    if any(root.glob(found_glob)):
        return
    seen = sorted(str(p.relative_to(root)) for p in root.glob("*")) if root.is_dir() else []
    raise DatasetLayoutError(
        f"{root} does not look like {hint}: no file matches {found_glob!r}.\nExpected:\n{expected}\n"
        f"Found at the top: {seen or ('nothing' if root.is_dir() else 'no such folder')}"
    )


class SplitTree(Adapter):
    """Frames listed from files ``<root>/<listed>/<split>/<folder>/<stem><suffix>``, identified as
    ``<split>/<folder>/<stem>`` (Cityscapes and IDD). Subclasses set ``listed``, ``suffix``, ``hint`` (the
    dataset's name in layout errors) and ``expected`` (the tree they show)."""

    listed = suffix = hint = expected = None

    def __init__(self, root, split="val"):
        self.root, self.split = Path(root), split
        require_tree(self.root, self.expected, self._glob(), f"{self.hint} ({split})")

    def _glob(self):
        return f"{self.listed}/{self.split}/*/*{self.suffix}"

    def refs(self):
        return sorted(self.root.glob(self._glob()))

    def stem(self, path):
        return path.name[: -len(self.suffix)]

    def frame_id(self, path):
        return f"{self.split}/{path.parent.name}/{self.stem(path)}"


def read_rgb(path):
    """Decode an image file to (H, W, 3) uint8 RGB; :class:`SkipFrame` when it cannot be decoded."""
    image = cv2.imread(str(path), cv2.IMREAD_COLOR)
    if image is None:
        raise SkipFrame(f"cannot decode image {Path(path).name}")
    return cv2.cvtColor(image, cv2.COLOR_BGR2RGB)


def rasterise(polygons, height, width):
    """Paint polygons in order, later over earlier, as the Cityscapes tooling does (PIL ``polygon``).

    Args:
        polygons: list of point lists [(x, y), ...].

    Returns:
        (H, W) int32: 0 where no polygon, else 1 + the index of the last polygon painted there.
    """
    canvas = Image.new("I", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for k, points in enumerate(polygons):
        if len(points) >= 2:
            draw.polygon([tuple(map(float, p)) for p in points], fill=k + 1)
    return np.asarray(canvas, dtype=np.int32)


def resize_sample(sample, size):
    """Resize to ``size`` = (H, W): the image with area (down) or bilinear (up), masks nearest only."""
    height, width = size
    if sample.image.shape[:2] == (height, width):
        return sample
    shrinking = height * width < sample.image.shape[0] * sample.image.shape[1]
    image = cv2.resize(sample.image, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    nearest = {"dsize": (width, height), "interpolation": cv2.INTER_NEAREST}
    return Sample(image, cv2.resize(sample.ood_mask, **nearest), cv2.resize(sample.semantic, **nearest),
                  sample.frame_id, sample.extra)


def load_label_map(name):
    """(parsed YAML dict, sha256 of the file's bytes) for ``label_maps/<name>.yaml`` or a path."""
    if str(name).endswith((".yaml", ".yml")):
        path = Path(name)
    else:
        path = next((d / f"{name}.yaml" for d in _LABEL_MAP_DIRS if (d / f"{name}.yaml").is_file()), None)
        if path is None:
            raise FileNotFoundError(f"label map {name!r} not found in {[str(d) for d in _LABEL_MAP_DIRS]}")
    data = path.read_bytes()
    return yaml.safe_load(data), hashlib.sha256(data).hexdigest()
