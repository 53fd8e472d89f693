"""SUN2012 (LabelMe XML + JPEG) through the seed paper's map M: Cityscapes class -> ID, ambiguous -> ignore,
everything else -> OOD (§3.2, eq. 1). Anonymous and deleted polygons are skipped, later polygons paint over
earlier ones, uncovered pixels are ignore, images of at most 640×640 pixels are dropped, and a seeded 25% of
the rest is the tuning split (used only to choose hyperparameters such as ODIN's)."""

import re
from pathlib import Path

import defusedxml.ElementTree as ET
import numpy as np
from PIL import Image

from segood.data.adapter import Adapter
from segood.data.common import Sample, SkipFrame, load_label_map, rasterise, read_rgb, require_tree
from segood.labels import CLASS_NAMES, ID, IGNORE, OOD

EXPECTED_TREE = """\
<root>/Images/<letter>/<category>/<name>.jpg
<root>/Annotations/<letter>/<category>/<name>.xml   (same relative path, LabelMe XML)"""
MIN_PIXELS = 640 * 640  # keep images with more pixels than this (the paper: no artefacts from upscaling)
TUNE_FRACTION = 0.25
SPLITS = ("tune", "eval", "all")


class SunLabelMap:
    """The map M loaded from ``label_maps/sun.yaml``: ``lookup(raw_name) -> (normalised, rule, class)``."""

    def __init__(self, name="sun"):
        self.data, self.sha256 = load_label_map(name)
        self.qualifiers = tuple(self.data.get("qualifiers", ()))
        self.default = self.data["default"]
        if self.default not in ("ood", "ignore"):
            raise ValueError(f"sun label map: default must be 'ood' or 'ignore', got {self.default!r}")
        self.classes = {}
        for class_name, synonyms in self.data["classes"].items():
            if class_name not in CLASS_NAMES:
                raise ValueError(f"sun label map: {class_name!r} is not a Cityscapes class {CLASS_NAMES}")
            for synonym in synonyms or ():
                self.classes[self.normalise(synonym)] = class_name
        self.ambiguous = {self.normalise(n) for n in self.data.get("ambiguous", ())}
        clash = self.ambiguous & set(self.classes)
        if clash:
            raise ValueError(f"sun label map: names both ambiguous and a class: {sorted(clash)}")

    def normalise(self, raw):
        """Lower case, whitespace collapsed, trailing qualifiers stripped: " Person  occluded" -> "person"."""
        words = re.sub(r"\s+", " ", str(raw).strip().lower()).split(" ")
        while len(words) > 1 and words[-1] in self.qualifiers:
            words.pop()
        return " ".join(words)

    def lookup(self, raw):
        """(normalised name, rule, Cityscapes class or None); rule is 'class', 'ambiguous' or 'default'."""
        name = self.normalise(raw)
        if name in self.classes:
            return name, "class", self.classes[name]
        if name in self.ambiguous:
            return name, "ambiguous", None
        return name, "default", None

    def values(self, raw):
        """(ood_mask value, trainId) for a raw name."""
        _, rule, class_name = self.lookup(raw)
        if rule == "class":
            return ID, CLASS_NAMES.index(class_name)
        if rule == "ambiguous" or self.default == "ignore":
            return IGNORE, IGNORE
        return OOD, IGNORE


class Sun(Adapter):
    """SUN2012 frames of one split (``tune``, ``eval`` or ``all``), after the size filter.

    ``prefiltered`` lists (frame_id, reason) for frames dropped before loading (too small, unreadable XML).
    The manifest gets a label-map ``coverage`` report, also written beside the set as ``<set>.coverage.md``.
    """

    name, source = "sun", "sun2012"
    help = "SUN2012 LabelMe XML through label_maps/sun.yaml; size filter; seeded 25% tune / 75% eval split"
    default_split = "eval"

    def __init__(self, root, split="eval", seed=0, label_map="sun"):
        if split not in SPLITS:
            raise ValueError(f"SUN split must be one of {SPLITS}, got {split!r}")
        self.root, self.split, self.seed = Path(root), split, seed
        require_tree(self.root, EXPECTED_TREE, "Annotations/*/*/*.xml", "SUN2012")
        self.label_map = SunLabelMap(label_map)
        self.label_map_sha256 = self.label_map.sha256
        self.prefiltered = []
        eligible = []
        for xml_path in sorted(self.root.glob("Annotations/*/*/*.xml")):
            frame_id = self.frame_id(xml_path)
            try:
                height, width = self._size(xml_path)
            except SkipFrame as reason:
                self.prefiltered.append((frame_id, str(reason)))
                continue
            if height * width <= MIN_PIXELS:
                self.prefiltered.append((frame_id, f"{height}x{width} = {height * width} pixels <= 640x640"))
            else:
                eligible.append(xml_path)
        self.tune, self.eval = split_tune_eval(eligible, seed)

    @classmethod
    def add_arguments(cls, parser):
        super().add_arguments(parser)
        parser.add_argument("--label-map", default="sun", help="a label map name or YAML (default label_maps/sun.yaml)")
        parser.add_argument("--seed", type=int, default=0, help="seed of the 25%% tune / 75%% eval split")

    @classmethod
    def from_args(cls, args):
        return cls(args.root, args.split, seed=args.seed, label_map=args.label_map)

    def summary(self, extras):
        return {"coverage": coverage(extras)}

    def reports(self, summary):
        return {".coverage.md": coverage_markdown(summary["coverage"])}

    def frame_id(self, xml_path):
        return xml_path.relative_to(self.root / "Annotations").with_suffix("").as_posix()

    def refs(self):
        return {"tune": self.tune, "eval": self.eval, "all": sorted(self.tune + self.eval)}[self.split]

    def _image_path(self, xml_path):
        return (self.root / "Images" / xml_path.relative_to(self.root / "Annotations")).with_suffix(".jpg")

    def _size(self, xml_path):
        root = _parse(xml_path)
        rows, cols = root.findtext("imagesize/nrows"), root.findtext("imagesize/ncols")
        if rows and cols and rows.strip().isdigit() and cols.strip().isdigit():
            return int(rows), int(cols)
        try:  # no size in the XML: read the image header only
            with Image.open(self._image_path(xml_path)) as im:
                return im.height, im.width
        except OSError as err:
            raise SkipFrame(f"no imagesize in the XML and the image cannot be opened ({err})") from None

    def load(self, xml_path):
        root = _parse(xml_path)
        image = read_rgb(self._image_path(xml_path))
        height, width = image.shape[:2]
        names, polygons = [], []
        for obj in root.iter("object"):
            if (obj.findtext("deleted") or "0").strip() == "1":
                continue
            polygon = obj.find("polygon")
            if polygon is None:
                continue
            if (polygon.findtext("username") or "").strip().lower() == "anonymous":
                continue  # the paper: validity not confirmed
            try:
                points = [(float(pt.findtext("x")), float(pt.findtext("y"))) for pt in polygon.iter("pt")]
            except (TypeError, ValueError):
                raise SkipFrame(f"polygon {len(polygons)} has a non-numeric point") from None
            if len(points) >= 3:
                names.append(obj.findtext("name") or "")
                polygons.append(points)  # PIL clips what lies outside the image
        if not polygons:
            raise SkipFrame("empty annotation: no kept polygon")
        painted = rasterise(polygons, height, width)
        values = [self.label_map.values(n) for n in names]
        ood_lut = np.array([IGNORE] + [v[0] for v in values], np.uint8)
        semantic_lut = np.array([IGNORE] + [v[1] for v in values], np.uint8)
        pixels = np.bincount(painted.ravel(), minlength=len(polygons) + 1)[1:]
        stats = [(raw, *self.label_map.lookup(raw), int(px)) for raw, px in zip(names, pixels)]
        return Sample(image, ood_lut[painted], semantic_lut[painted], self.frame_id(xml_path),
                      {"polygons": stats, "pixels": height * width})


def split_tune_eval(refs, seed):
    """Seeded split of ``refs`` into exactly round(25%) tune and the rest eval, independent of input order."""
    refs = sorted(refs)
    order = np.random.default_rng(seed).permutation(len(refs))
    n_tune = int(round(TUNE_FRACTION * len(refs)))
    return sorted(refs[i] for i in order[:n_tune]), sorted(refs[i] for i in order[n_tune:])


def coverage(frame_stats):
    """Audit of the label map over converted frames.

    Args:
        frame_stats: iterable of ``Sample.extra`` dicts from :meth:`Sun.load`.

    Returns:
        list of dicts, one per normalised name, most pixels first: name, raw names seen, rule, mapped_to,
        polygons, pixels, pixel_share (of all pixels of the converted images, before resizing).
    """
    rows, total = {}, 0
    for extra in frame_stats:
        total += extra["pixels"]
        for raw, name, rule, class_name, pixels in extra["polygons"]:
            row = rows.setdefault(name, {"name": name, "raw": set(), "rule": rule, "mapped_to": class_name,
                                         "polygons": 0, "pixels": 0})
            row["raw"].add(raw)
            row["polygons"] += 1
            row["pixels"] += pixels
    out = sorted(rows.values(), key=lambda r: (-r["pixels"], r["name"]))
    for row in out:
        row["raw"] = sorted(row["raw"])
        row["mapped_to"] = row["mapped_to"] or ("ignore" if row["rule"] == "ambiguous" else "OOD")
        row["pixel_share"] = row["pixels"] / total if total else 0.0
    return out


def coverage_markdown(rows):
    lines = ["| name | raw names | rule | mapped to | polygons | pixel share |", "|---|---|---|---|---:|---:|"]
    for r in rows:
        raw = ", ".join(f"`{n}`" for n in r["raw"][:5]) + (" ..." if len(r["raw"]) > 5 else "")
        lines.append(f"| {r['name']} | {raw} | {r['rule']} | {r['mapped_to']} | {r['polygons']} | "
                     f"{r['pixel_share']:.2%} |")
    return "\n".join(lines) + "\n"


def _parse(xml_path):
    """Parse LabelMe XML safely (defusedxml: no entity expansion); :class:`SkipFrame` when unreadable."""
    try:
        return ET.parse(str(xml_path)).getroot()
    except Exception as err:  # ParseError, DefusedXmlException subclasses, OSError
        raise SkipFrame(f"unreadable XML ({type(err).__name__}: {err})") from None
