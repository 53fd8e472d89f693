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
from segood.labels import ID, IGNORE, OOD

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


class LeftOut(SkipFrame):
    """A rule of the dataset leaves this frame out (an annotation with nothing to paint): its file is listed under
    the manifest's ``unused_files`` with the reason, as the adapter's other unused files are, not as a failure
    (``strict`` conversions succeed with it). ``path``: the file, relative to the raw tree."""

    def __init__(self, reason, path):
        super().__init__(reason)
        self.path = path


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


def decode(path, modes, what="image"):
    """Decode an image file completely, on its stored pixel grid (an EXIF orientation tag is not applied: the
    annotations are drawn on the stored grid). Returns the PIL image, converted to ``modes[0]`` when it is in
    another of ``modes``.

    Raises:
        SkipFrame: the file is missing, not an image, truncated or corrupt (libjpeg and libpng would decode a
            truncated file into a grey or black remainder with only a warning), or of another mode.
    """
    name = Path(path).name
    try:
        with Image.open(path) as image:
            image.load()  # decodes every pixel; a truncated file raises here
            if image.mode not in modes:
                raise SkipFrame(f"{what} {name} has mode {image.mode}; expected {' or '.join(modes)}")
            return image.convert(modes[0]) if image.mode != modes[0] else image.copy()
    except FileNotFoundError:
        raise SkipFrame(f"no {what} file {name}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise SkipFrame(f"cannot decode {what} {name} completely ({type(err).__name__}: {err})") from None


def read_rgb(path):
    """Decode an image file to (H, W, 3) uint8 RGB; :class:`SkipFrame` when it cannot be decoded completely."""
    return np.asarray(decode(path, ("RGB", "L", "P", "RGBA", "CMYK", "YCbCr", "LA", "PA")))


def rasterise(polygons, height, width, names=None):
    """Paint polygons in order, later over earlier, as the Cityscapes tooling does (PIL ``polygon``).

    Args:
        polygons: list of point lists [(x, y), ...].
        names: the polygons' labels, for the reasons of :class:`SkipFrame`.

    Returns:
        (H, W) int32: 0 where no polygon, else 1 + the index of the last polygon painted there.

    Raises:
        SkipFrame: a coordinate is NaN or infinite (a NaN passes every bounds test and paints most of a frame).
    Coordinates far outside the frame are clipped to it geometrically first, so that PIL's integer
    coordinates never overflow; polygons within ``FAR`` of the frame are drawn exactly as given.
    """
    canvas = Image.new("I", (width, height), 0)
    draw = ImageDraw.Draw(canvas)
    for k, points in enumerate(polygons):
        points = np.asarray(points, dtype=np.float64).reshape(-1, 2)
        if not np.isfinite(points).all():
            label = f" ({names[k]!r})" if names else ""
            raise SkipFrame(f"polygon {k}{label} has a non-finite coordinate")
        far = FAR * max(height, width)
        if np.abs(points).max(initial=0.0) > far:
            points = clip_polygon(points, -1.0, -1.0, width + 1.0, height + 1.0)
        if len(points) >= 2:
            draw.polygon([tuple(p) for p in points.tolist()], fill=k + 1)
    return np.asarray(canvas, dtype=np.int32)


FAR = 4  # polygons reaching beyond FAR frame sizes are clipped to the frame before drawing


def clip_polygon(points, x0, y0, x1, y1):
    """Sutherland–Hodgman: the part of the polygon ``points`` (n, 2) inside the rectangle [x0, x1] × [y0, y1]."""
    for axis, limit, keep_above in ((0, x0, True), (0, x1, False), (1, y0, True), (1, y1, False)):
        if len(points) == 0:
            break
        inside = points[:, axis] >= limit if keep_above else points[:, axis] <= limit
        out = []
        for k in range(len(points)):
            current, previous = points[k], points[k - 1]
            if inside[k] != inside[k - 1]:  # the edge crosses the line: add the crossing
                t = (limit - previous[axis]) / (current[axis] - previous[axis])
                crossing = previous + t * (current - previous)
                crossing[axis] = limit
                out.append(crossing)
            if inside[k]:
                out.append(current)
        points = np.array(out, dtype=np.float64).reshape(-1, 2)
    return points


def resize_sample(sample, size):
    """Resize to ``size`` = (H, W): the image with area (down) or bilinear (up), masks nearest only; ``size``
    None keeps the sample as it is."""
    if size is None:
        return sample
    height, width = size
    if sample.image.shape[:2] == (height, width):
        return sample
    shrinking = height * width < sample.image.shape[0] * sample.image.shape[1]
    image = cv2.resize(sample.image, (width, height), interpolation=cv2.INTER_AREA if shrinking else cv2.INTER_LINEAR)
    nearest = {"dsize": (width, height), "interpolation": cv2.INTER_NEAREST}
    return Sample(image, cv2.resize(sample.ood_mask, **nearest), cv2.resize(sample.semantic, **nearest),
                  sample.frame_id, sample.extra)


def load_label_map(name, required=()):
    """(parsed YAML dict, sha256 of the file's bytes) for ``label_maps/<name>.yaml`` or a path; a ValueError naming
    the file where it is not a YAML mapping holding the ``required`` keys (another dataset's map, say)."""
    shipped = sorted({p.stem for d in _LABEL_MAP_DIRS if d.is_dir() for p in d.glob("*.yaml")})
    if str(name).endswith((".yaml", ".yml")):
        path = Path(name)
        if not path.is_file():
            raise FileNotFoundError(f"no label map file {path} (--label-map: a .yaml file, or a shipped map: "
                                    f"{', '.join(shipped)})")
    else:
        path = next((d / f"{name}.yaml" for d in _LABEL_MAP_DIRS if (d / f"{name}.yaml").is_file()), None)
        if path is None:
            raise FileNotFoundError(f"label map {name!r} is neither a shipped map ({', '.join(shipped)}) nor a file "
                                    "ending in .yaml (--label-map)")
    data = path.read_bytes()
    try:
        parsed = yaml.safe_load(data)
    except yaml.YAMLError as err:
        raise ValueError(f"label map {path} is not valid YAML ({str(err).splitlines()[0]})") from None
    missing = [key for key in required if not isinstance(parsed, dict) or key not in parsed]
    if not isinstance(parsed, dict) or missing:
        raise ValueError(f"label map {path} lacks {missing or 'any mapping'}: is it another dataset's map? (the "
                         "shipped ones are in label_maps/)")
    return parsed, hashlib.sha256(data).hexdigest()


def read_label(path, what="label image"):
    """Decode a single-channel 8-bit label PNG to (H, W) uint8 raw values.

    The stored values are returned as they are: a palette image gives its indices (never the palette's
    colours), and a gAMA chunk (LostAndFound's PNGs carry one) is not applied. :class:`SkipFrame` when the
    file is missing, cannot be decoded completely, or is not single-channel 8-bit (e.g. a colour rendering).
    """
    name = Path(path).name
    try:
        with Image.open(path) as image:
            image.load()
            if image.mode not in ("L", "P"):
                raise SkipFrame(f"{what} {name} has mode {image.mode}; expected single-channel 8-bit (L or P)")
            return np.array(image, dtype=np.uint8)
    except FileNotFoundError:
        raise SkipFrame(f"no {what} file {name}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise SkipFrame(f"cannot decode {what} {name} completely ({type(err).__name__}: {err})") from None


_ROLES = {"id": ID, "ood": OOD, "ignore": IGNORE}


class LabelTable:
    """Declarative label rules of a dataset whose labels are values in a PNG: raw value -> ``ood_mask`` value
    and -> ``semantic`` (Cityscapes trainId), as two (256,) lookup tables applied by indexing.

    Args:
        rules: {value or (low, high) inclusive range: role} or {...: (role, trainId)}; role is "id", "ood" or
            "ignore"; a trainId of None (or no trainId) is 255.
        name: the dataset, for warnings.
    Values no rule names are *unknown*: ignore in both arrays, counted per frame and warned about in the
    manifest (:meth:`summary`), never silently given a meaning.
    """

    def __init__(self, rules, name):
        self.name = name
        self.ood = np.full(256, IGNORE, np.uint8)
        self.semantic = np.full(256, IGNORE, np.uint8)
        self.known = np.zeros(256, bool)
        for key, rule in rules.items():
            role, train_id = (rule, None) if isinstance(rule, str) else rule
            low, high = key if isinstance(key, tuple) else (key, key)
            self.ood[low:high + 1] = _ROLES[role]
            self.semantic[low:high + 1] = IGNORE if train_id is None else train_id
            self.known[low:high + 1] = True
        self.sha256 = hashlib.sha256(self.ood.tobytes() + self.semantic.tobytes()).hexdigest()

    def apply(self, raw):
        """(ood_mask, semantic, extra) for (H, W) uint8 raw values; extra names unknown values or is None."""
        counts = np.bincount(raw.ravel(), minlength=256)
        unknown = {int(v): int(counts[v]) for v in np.flatnonzero(counts * ~self.known)}
        return self.ood[raw], self.semantic[raw], ({"unknown_label_values": unknown} if unknown else None)

    def summary(self, extras):
        """Manifest entries: pixels and frames per unknown value, and a warning, or nothing."""
        pixels, frames = {}, {}
        for extra in extras:
            for value, count in extra.get("unknown_label_values", {}).items():
                pixels[value] = pixels.get(value, 0) + count
                frames[value] = frames.get(value, 0) + 1
        if not pixels:
            return {}
        unknown = {str(v): {"pixels": pixels[v], "frames": frames[v]} for v in sorted(pixels)}
        shown = ", ".join(f"{v} ({u['pixels']} pixels in {u['frames']} frames)" for v, u in unknown.items())
        return {"unknown_label_values": unknown,
                "warnings": [f"{self.name} label values outside its published table became ignore: {shown}; are "
                             "these the label files (not colour renderings or another release)?"]}


def require_webp():
    """Raise an ImportError saying how to fix it when Pillow cannot decode WebP (SMIYC, Road Anomaly)."""
    from PIL import features

    if not features.check("webp"):
        raise ImportError("this Pillow cannot decode WebP images; install a Pillow wheel built with libwebp "
                          "(pip install --force-reinstall 'pillow>=10')")
