"""SUN2012 (LabelMe XML + JPEG) through the seed paper's map M: Cityscapes class -> ID, ambiguous -> ignore,
everything else -> OOD (§3.2, eq. 1). Anonymous and deleted polygons are skipped, later polygons paint over
earlier ones, uncovered pixels are ignore, images of at most 640×640 pixels are dropped, and a seeded 25% of
the rest is the tuning split (used only to choose hyperparameters such as ODIN's)."""

import re
from pathlib import Path

import defusedxml.ElementTree as ET
import numpy as np
from PIL import Image

from segood.arguments import natural
from segood.data.adapter import CITYSCAPES_SIZE, Adapter, register_adapter
from segood.data.common import LeftOut, Sample, SkipFrame, load_label_map, rasterise, read_rgb, require_tree
from segood.labels import CLASS_NAMES, ID, IGNORE, OOD

EXPECTED_TREE = """\
<root>/Images/<letter>/<category>/<name>.jpg
<root>/Annotations/<letter>/<category>/<name>.xml   (same relative path, LabelMe XML)"""
MIN_PIXELS = 640 * 640  # keep images with more pixels than this (the paper: no artefacts from upscaling)
TUNE_FRACTION = 0.25
SPLITS = ("tune", "eval", "all")


class SunLabelMap:
    """The map M loaded from ``label_maps/sun.yaml``: ``lookup(raw_name) -> (normalised, rule, class)``.

    Rules, in order (the file's header explains them): ``empty`` (ignore), ``not a class`` (default),
    ``class`` / ``ambiguous`` (a listed name), ``modifiers`` (a listed name with modifier words), ``part``
    (a listed name followed by part words), ``head noun`` (a phrase ending in a listed name), ``default``.
    """

    def __init__(self, name="sun"):
        self.data, self.sha256 = load_label_map(name, ("default", "classes"))
        self.qualifiers = tuple(self.data.get("qualifiers", ()))
        self.modifiers = set(self.data.get("modifiers", ()))
        self.parts = set(self.data.get("parts", ()))
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
        self.not_classes = {self.normalise(n) for n in self.data.get("not_classes", ())}
        self.head_nouns = {self.normalise(n) for n in self.data.get("head_nouns", ())}
        for other, what in ((self.ambiguous, "ambiguous"), (self.not_classes, "not_classes")):
            clash = other & set(self.classes)
            if clash:
                raise ValueError(f"sun label map: names both {what} and a class: {sorted(clash)}")
        self.targets = {**self.classes, **dict.fromkeys(self.ambiguous, _AMBIGUOUS)}

    def normalise(self, raw):
        """Lower case, whitespace collapsed, trailing qualifiers stripped: " Person  occluded" -> "person"."""
        words = re.sub(r"\s+", " ", str(raw).strip().lower()).split(" ")
        while len(words) > 1 and words[-1] in self.qualifiers:
            words.pop()
        return " ".join(words)

    def lookup(self, raw):
        """(normalised name, rule, Cityscapes class or None): the rule that decided (see the class docstring);
        the class is None for ``ambiguous``, ``empty``, ``not a class`` and ``default``."""
        name = self.normalise(raw)
        if not name:
            return name, "empty", None
        if name in self.not_classes or (name.endswith("s") and name[:-1] in self.not_classes):
            return name, "not a class", None
        target, rule = self.targets.get(name), "class"
        words = name.split(" ")
        core = [w for w in words if w not in self.modifiers]
        if target is None and core and len(core) < len(words):
            target, rule = self.targets.get(" ".join(core)), "modifiers"
        if target is None and len(core) >= 2:
            target, rule = self._part_or_head(core)
        if target is None:
            return name, "default", None
        if target is _AMBIGUOUS:
            return name, "ambiguous", None
        return name, rule, target

    def _part_or_head(self, words):
        """(target, rule) of ``part`` (a listed name, then only part words) or ``head noun`` (the phrase ends in
        one of the reviewed ``head_nouns``); (None, None) when neither applies."""
        for k in range(len(words) - 1, 0, -1):
            lead = " ".join(words[:k])
            if lead in self.targets and all(w in self.parts for w in words[k:]):
                return self.targets[lead], "part"
        if words[-1] in self.head_nouns and words[-1] in self.targets:
            return self.targets[words[-1]], "head noun"
        return None, None

    def values(self, raw):
        """(ood_mask value, trainId) for a raw name."""
        _, rule, class_name = self.lookup(raw)
        if class_name is not None:
            return ID, CLASS_NAMES.index(class_name)
        if rule in ("ambiguous", "empty") or self.default == "ignore":
            return IGNORE, IGNORE
        return OOD, IGNORE


_AMBIGUOUS = object()  # the target of the names under ``ambiguous``


@register_adapter
class Sun(Adapter):
    """SUN2012 frames of one split (``tune``, ``eval`` or ``all``), after the size filter.

    ``prefiltered`` lists (frame_id, reason) for frames that cannot be converted, found before loading (unreadable
    XML or image header); images the size filter leaves out are under ``unused_files``, as a split's other frames
    are: a rule of the dataset, not a failure (``strict`` conversions succeed with them).
    The manifest gets a label-map ``coverage`` report, also written beside the set as ``<set>.coverage.md``.
    """

    name, source = "sun", "sun2012"
    help = "SUN2012 LabelMe XML through label_maps/sun.yaml; size filter; seeded 25% tune / 75% eval split"
    default_split = "eval"
    default_size = CITYSCAPES_SIZE  # the paper resizes every SUN image to Cityscapes' size

    def __init__(self, root, split="eval", seed=0, label_map="sun"):
        if split not in SPLITS:
            raise ValueError(f"SUN split must be one of {SPLITS}, got {split!r}")
        self.root, self.split, self.seed = Path(root), split, seed
        require_tree(self.root, EXPECTED_TREE, "Annotations/**/*.xml", "SUN2012")
        self.label_map = SunLabelMap(label_map)
        self.label_map_sha256 = self.label_map.sha256
        self.prefiltered, self.unused_files = [], []
        annotations = self.root / "Annotations"
        eligible, used_images = [], set()
        for path in sorted(p for p in annotations.rglob("*") if p.is_file()):
            if path.suffix != ".xml":
                self.unused_files.append((path.relative_to(self.root).as_posix(), f"not a LabelMe annotation "
                                                                                  f"({path.suffix or 'no suffix'})"))
                continue
            used_images.add(self._image_path(path))
            try:  # the size filter reads the stored pixel grid from the image header, never trusting the XML
                _parse(path)
                height, width = _stored_size(self._image_path(path))
            except SkipFrame as reason:
                self.prefiltered.append((self.frame_id(path), str(reason)))
                continue
            if height * width <= MIN_PIXELS:
                self.unused_files.append((self._image_path(path).relative_to(self.root).as_posix(),
                                          f"{height}x{width} = {height * width} pixels <= 640x640: the size filter "
                                          "leaves it out"))
            else:
                eligible.append(path)
        for path in sorted(p for p in self.root.rglob("*") if p.is_file()):
            relative = path.relative_to(self.root)
            if relative.parts[0] == "Images" and path not in used_images:
                self.unused_files.append((relative.as_posix(), "no annotation with the same relative path"))
            elif relative.parts[0] not in ("Images", "Annotations"):
                self.unused_files.append((relative.as_posix(), "outside Images/ and Annotations/"))
        self.tune, self.eval = split_tune_eval(eligible, seed)

    @classmethod
    def add_arguments(cls, parser):
        super().add_arguments(parser)
        parser.add_argument("--label-map", default="sun", help="a label map name or YAML (default label_maps/sun.yaml)")
        parser.add_argument("--seed", type=natural, default=0, help="seed of the 25%% tune / 75%% eval split")

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

    def load(self, xml_path):
        root = _parse(xml_path)
        image = read_rgb(self._image_path(xml_path))  # the stored grid: EXIF orientation is not applied
        height, width = image.shape[:2]
        declared = _declared_size(root)
        if declared is not None and declared != (height, width):
            raise SkipFrame(f"the XML's imagesize is {declared[0]}x{declared[1]} but the image is {height}x{width} "
                            "on its stored pixel grid: the polygons would not fit the image")
        kept = kept_polygons(root)
        names, polygons = [name for name, _ in kept], [points for _, points in kept]  # PIL clips what lies outside
        if not polygons:
            raise LeftOut("an annotation with no polygon to paint (each deleted, anonymous or of fewer than 3 "
                          "points)", xml_path.relative_to(self.root).as_posix())
        painted = rasterise(polygons, height, width, names)
        values = [self.label_map.values(n) for n in names]
        ood_lut = np.array([IGNORE] + [v[0] for v in values], np.uint8)
        semantic_lut = np.array([IGNORE] + [v[1] for v in values], np.uint8)
        pixels = np.bincount(painted.ravel(), minlength=len(polygons) + 1)[1:]
        stats = [(raw, *self.label_map.lookup(raw), int(px)) for raw, px in zip(names, pixels)]
        return Sample(image, ood_lut[painted], semantic_lut[painted], self.frame_id(xml_path),
                      {"polygons": stats, "pixels": height * width})


def kept_polygons(annotation):
    """[(raw name, [(x, y), ...])] of the polygons a LabelMe annotation keeps, in file order: deleted objects,
    objects without a polygon, polygons submitted by ``anonymous`` (the paper: validity not confirmed) and
    polygons of fewer than 3 points are left out. :class:`SkipFrame` when a point is not numeric."""
    kept = []
    for obj in annotation.iter("object"):
        if (obj.findtext("deleted") or "0").strip() == "1":
            continue
        polygon = obj.find("polygon")
        if polygon is None:
            continue
        if (polygon.findtext("username") or "").strip().lower() == "anonymous":
            continue
        try:
            points = [(float(pt.findtext("x")), float(pt.findtext("y"))) for pt in polygon.iter("pt")]
        except (TypeError, ValueError):
            raise SkipFrame(f"polygon {len(kept)} has a non-numeric point") from None
        if len(points) >= 3:
            kept.append((obj.findtext("name") or "", points))
    return kept


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
        row["mapped_to"] = row["mapped_to"] or ("ignore" if row["rule"] in ("ambiguous", "empty") else "OOD")
        row["pixel_share"] = row["pixels"] / total if total else 0.0
    return out


def coverage_markdown(rows):
    lines = ["| name | raw names | rule | mapped to | polygons | pixel share |", "|---|---|---|---|---:|---:|"]
    for r in rows:
        raw = ", ".join(f"`{n}`" for n in r["raw"][:5]) + (" ..." if len(r["raw"]) > 5 else "")
        lines.append(f"| {r['name']} | {raw} | {r['rule']} | {r['mapped_to']} | {r['polygons']} | "
                     f"{r['pixel_share']:.2%} |")
    return "\n".join(lines) + "\n"


def _stored_size(image_path):
    """(H, W) of an image's stored pixel grid from its header (no decoding); :class:`SkipFrame` if unreadable."""
    try:
        with Image.open(image_path) as im:
            return im.height, im.width
    except FileNotFoundError:
        raise SkipFrame(f"no image {Path(image_path).name}") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as err:
        raise SkipFrame(f"cannot read the image header of {Path(image_path).name} ({err})") from None


def _declared_size(root):
    """(nrows, ncols) of the XML's ``imagesize``, or None when absent or not two integers."""
    rows, cols = root.findtext("imagesize/nrows"), root.findtext("imagesize/ncols")
    if rows and cols and rows.strip().isdigit() and cols.strip().isdigit():
        return int(rows), int(cols)
    return None


def _parse(xml_path):
    """Parse LabelMe XML safely (defusedxml: no entity expansion); :class:`SkipFrame` when unreadable."""
    try:
        return ET.parse(str(xml_path)).getroot()
    except Exception as err:  # ParseError, DefusedXmlException subclasses, OSError
        raise SkipFrame(f"unreadable XML ({type(err).__name__}: {err})") from None
