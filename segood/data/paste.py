"""Pasted-object OOD sets, in the spirit of Fishyscapes Static (Blum et al. 2019), which pastes Pascal VOC objects
onto Cityscapes val frames.

Objects are cut from a polygon-annotated source (SUN2012 LabelMe XML, or the demo's generated objects,
``segood.data.synthetic.paste_objects``); the SUN label map (``label_maps/sun.yaml``) says which are OOD and
which are Cityscapes things (person, rider, car, truck, bus, train, motorcycle, bicycle) that may be pasted the
same way as negatives, so that a detector cannot win by flagging pasting artefacts. Each object stands on road
or sidewalk (trainIds 0, 1) of a Cityscapes-format frame, its height proportional to the distance of its base
below the horizon estimated from the ground region (a flat ground seen by a level camera), and is blended in
with ``none``, ``feather`` (alpha ramping up from the object's edge) or ``seamless`` (OpenCV's Poisson cloning,
Pérez et al. 2003). Blending changes pixels inside the pasted polygon only, and never the masks.

Masks: a pasted OOD object's pixels are OOD (1) with ``semantic`` 255; a pasted ID object's pixels are ID (0)
with its class in ``semantic``; everywhere else the frame's own labels. A pixel belongs to a pasted object when
its centre lies inside the scaled polygon (even-odd rule: the crossing test of PNPOLY); where objects overlap,
the last paste wins in image and masks. Every frame draws from its own ``numpy.random.default_rng`` seeded with
(seed, sha256 of the frame id): the same placements on every machine, in any order, with any worker count.
"""

import hashlib
import math
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import cv2
import numpy as np

from segood.arguments import natural, positive_int
from segood.data.adapter import Adapter, register_adapter
from segood.data.cityscapes import Cityscapes
from segood.data.common import Sample, SkipFrame, clip_polygon, read_rgb, require_tree
from segood.data.sun import EXPECTED_TREE as SUN_TREE
from segood.data.sun import SunLabelMap, _declared_size, _parse, _stored_size, kept_polygons
from segood.labels import CLASS_NAMES, ID, IGNORE, OOD

BLENDS = ("none", "feather", "seamless")
GROUND = (CLASS_NAMES.index("road"), CLASS_NAMES.index("sidewalk"))
#: Cityscapes classes an ID object may have to be pasted as a negative (things that stand on the ground)
NEGATIVE_CLASSES = tuple(CLASS_NAMES.index(n) for n in ("person", "rider", "car", "truck", "bus", "train",
                                                          "motorcycle", "bicycle"))
HEIGHT_RATIO = (0.15, 0.6)  # pasted height / distance of the base below the horizon (object height / camera height)
MIN_OBJECT_SIDE = 16  # source objects whose bounding box is narrower or lower than this (pixels) are not used
MIN_HEIGHT = 0.02  # a pasted object is at least 2% of the frame height (and 4 pixels) tall ...
MAX_WIDTH = 0.5  # ... and at most half the frame wide
FOOTPRINT = 0.1  # the footprint: the pasted object's lowest 10% of rows ...
MIN_GROUND = 0.5  # ... of which at least half must lie on road or sidewalk
HORIZON_SPAN = 0.01  # the horizon: the first row in which the ground spans 1% of the width
FEATHER = 0.15  # feathering ramps alpha from the edge to 1 over 15% of the object's smaller side
TRIES = 25  # placements tried per paste before it is given up


@dataclass(frozen=True)
class PasteObject:
    """One object to paste: ``polygon`` ((x, y) pairs) in the pixel coordinates of ``image`` (a file path, or an
    (h, w, 3) uint8 array for generated objects); ``role`` "ood" or "id"; ``train_id`` 255 for OOD objects;
    ``key`` names it in manifests (``<annotation>#<k>``: the k-th kept polygon of that file, or ``demo#<k>``)."""

    key: str
    name: str
    role: str
    train_id: int
    polygon: tuple
    image: object


def paste_object(key, raw_name, points, image_size, label_map, image):
    """A :class:`PasteObject`, or the reason the object is not used (a short phrase, counted in the manifest)."""
    words = raw_name.strip().lower().split()
    if words and words[-1] in label_map.qualifiers:
        return "occluded or cropped (its cut would show the occluder or a straight edge)"
    value, train_id = label_map.values(raw_name)
    if value == OOD:
        role = "ood"
    elif value == ID and train_id in NEGATIVE_CLASSES:
        role = "id"
    else:
        return "neither OOD nor a Cityscapes thing class"
    height, width = image_size
    points = clip_polygon(np.asarray(points, np.float64), 0.0, 0.0, width - 1.0, height - 1.0)
    if len(points) < 3 or np.ptp(points[:, 0]) < MIN_OBJECT_SIDE or np.ptp(points[:, 1]) < MIN_OBJECT_SIDE:
        return f"smaller than {MIN_OBJECT_SIDE} pixels"
    polygon = tuple(map(tuple, points.tolist()))
    return PasteObject(key, label_map.normalise(raw_name), role, int(train_id), polygon, image)


def sun_objects(root, label_map):
    """(objects, unused files [(path, reason)], left-out objects {reason: count}) of a SUN2012 tree."""
    root = Path(root)
    require_tree(root, SUN_TREE, "Annotations/**/*.xml", "SUN2012 (the objects to paste)")
    objects, unused, left_out = [], [], Counter()
    for path in sorted(p for p in (root / "Annotations").rglob("*.xml") if p.is_file()):
        relative = path.relative_to(root / "Annotations")
        image_path = (root / "Images" / relative).with_suffix(".jpg")
        try:
            annotation = _parse(path)
            size = _stored_size(image_path)
            declared = _declared_size(annotation)
            if declared is not None and declared != size:
                raise SkipFrame(f"the XML's imagesize is {declared[0]}x{declared[1]} but the image is "
                                f"{size[0]}x{size[1]}")
            kept = kept_polygons(annotation)
        except SkipFrame as reason:
            unused.append((f"Annotations/{relative.as_posix()}", str(reason)))
            continue
        for k, (raw_name, points) in enumerate(kept):
            made = paste_object(f"{relative.as_posix()}#{k}", raw_name, points, size, label_map, str(image_path))
            if isinstance(made, str):
                left_out[made] += 1
            else:
                objects.append(made)
    return objects, unused, left_out


def demo_objects(label_map, seed=0):
    """(objects, [], left-out objects) of the demo's generated objects."""
    from segood.data.synthetic import paste_objects

    objects, left_out = [], Counter()
    for k, (name, points, image) in enumerate(paste_objects(seed)):
        made = paste_object(f"demo#{k}", name, points, image.shape[:2], label_map, image)
        if isinstance(made, str):
            left_out[made] += 1
        else:
            objects.append(made)
    return objects, [], left_out


def frame_rng(seed, frame_id):
    """The generator of one frame: seeded with (seed, the first 128 bits of sha256(frame_id)), never with
    Python's ``hash`` (salted per process)."""
    words = np.frombuffer(hashlib.sha256(frame_id.encode()).digest()[:16], dtype="<u4")
    return np.random.default_rng([int(seed), *map(int, words)])


def polygon_mask(points, height, width):
    """The pixels of a (height, width) frame whose centre lies inside the polygon, by the even-odd rule with
    PNPOLY's crossing test (W. R. Franklin): pixel (x, y) is inside when an odd number of edges (x_i, y_i) ->
    (x_j, y_j) with ``(y_i > y) != (y_j > y)`` cross the row at ``(x_j - x_i) * (y - y_i) / (y_j - y_i) + x_i > x``.
    A scanline version: every crossing toggles the pixels left of it, counted with a suffix sum per row.

    Args:
        points: (n, 2) float (x, y), pixel centres at integer coordinates.

    Returns:
        ((x0, y0), mask): the polygon's bounding box (one pixel wider on each side) clipped to the frame, and an
        (h, w) bool mask of it; None when the box misses the frame.
    """
    points = np.asarray(points, np.float64)
    xi, yi = points[:, 0], points[:, 1]
    xj, yj = np.roll(xi, 1), np.roll(yi, 1)
    x0, x1 = max(0, math.floor(xi.min()) - 1), min(width - 1, math.ceil(xi.max()) + 1)
    y0, y1 = max(0, math.floor(yi.min()) - 1), min(height - 1, math.ceil(yi.max()) + 1)
    if x0 > x1 or y0 > y1:
        return None
    w = x1 - x0 + 1
    y = np.arange(y0, y1 + 1, dtype=np.float64)[:, None]
    crosses = (yi > y) != (yj > y)  # (rows, edges)
    with np.errstate(divide="ignore", invalid="ignore"):
        x_cross = (xj - xi) * (y - yi) / (yj - yi) + xi
    # an integer x < x_cross exactly when x < ceil(x_cross): the crossing toggles columns [0, ceil(x_cross) - x0)
    ends = np.where(crosses, np.clip(np.ceil(np.where(crosses, x_cross, 0.0)) - x0, 0, w), 0).astype(np.intp)
    toggles = np.zeros((len(y), w + 1), np.int32)
    np.add.at(toggles, (np.arange(len(y))[:, None].repeat(len(xi), 1), ends), 1)
    toggles[:, 0] = 0  # a crossing that toggles no column (and the non-crossing edges, parked at 0)
    right = np.cumsum(toggles[:, ::-1], axis=1)[:, ::-1]  # right[:, c] = crossings toggling column c - 1
    return (x0, y0), right[:, 1:] % 2 == 1


def ground_horizon(ground):
    """The row of the horizon estimated from a (H, W) bool ground mask: the first row in which the ground spans
    ``HORIZON_SPAN`` of the width (a flat ground ends there); None when no row does."""
    rows = np.flatnonzero(ground.sum(axis=1) >= max(1.0, HORIZON_SPAN * ground.shape[1]))
    return int(rows[0]) if len(rows) else None


def place(polygon, ground, horizon, rng, height_ratio):
    """A placement of ``polygon`` (source pixels) on the ground: (scale, (tx, ty), (base x, base y), (x0, y0),
    mask) mapping source (x, y) to ``scale * (x, y) + (tx, ty)``, its base (the lowest point, horizontally
    centred) on a ground pixel drawn uniformly below the horizon, its height ``ratio * (base row - horizon)``
    with ratio drawn uniformly from ``height_ratio``; None when ``TRIES`` placements are all rejected (too small,
    too wide, empty, or a footprint mostly off the ground)."""
    ys, xs = np.nonzero(ground[horizon + 1:])
    if len(ys) == 0:
        return None
    ys = ys + horizon + 1
    for _ in range(TRIES):
        k = int(rng.integers(len(ys)))
        placement = place_at(polygon, ground, horizon, (float(xs[k]), float(ys[k])),
                             float(rng.uniform(*height_ratio)))
        if placement is not None:
            return placement
    return None


def place_at(polygon, ground, horizon, base, ratio):
    """The placement of ``polygon`` with its base at ``base`` = (x, y) and its height ``ratio * (y - horizon)``,
    as :func:`place` returns it; None when that placement breaks a rule (too small, too wide, empty, or a
    footprint mostly off the ground). The attack's search space (``segood.attack.space``) places with it."""
    height, width = ground.shape
    base_x, base_y = float(base[0]), float(base[1])
    points = np.asarray(polygon, np.float64)
    left, right = points[:, 0].min(), points[:, 0].max()
    top, bottom = points[:, 1].min(), points[:, 1].max()
    pasted_height = float(ratio) * (base_y - horizon)
    scale = pasted_height / (bottom - top)
    if pasted_height < max(4.0, MIN_HEIGHT * height) or (right - left) * scale > MAX_WIDTH * width:
        return None
    offset = (base_x - scale * (left + right) / 2, base_y - scale * bottom)
    placed = polygon_mask(points * scale + offset, height, width)
    if placed is None:
        return None
    (x0, y0), mask = placed
    rows = np.arange(y0, y0 + mask.shape[0])[:, None]
    foot = mask & (rows >= base_y - max(1.0, FOOTPRINT * pasted_height))
    on_ground = ground[y0:y0 + mask.shape[0], x0:x0 + mask.shape[1]][foot]
    if on_ground.size and on_ground.mean() >= MIN_GROUND:
        return scale, offset, (base_x, base_y), (x0, y0), mask
    return None


def render(image, source, polygon, scale, offset, box, mask, blend):
    """Paste ``source`` (RGB uint8) scaled by ``scale`` and moved by ``offset`` into ``image`` (in place), on the
    pixels of ``mask`` at ``box`` = (x0, y0) only. Shrinking blurs the source first (Gaussian, σ = 0.5 / scale:
    no aliasing); resampling is bilinear."""
    (x0, y0), (h, w) = box, mask.shape
    points = np.asarray(polygon, np.float64)
    sigma = 0.5 / scale if scale < 0.8 else 0.0
    margin = int(3 * sigma) + 2  # crop the source around the polygon: blurring and warping cost its size
    sx0, sy0 = (max(0, math.floor(v) - margin) for v in points.min(axis=0))
    sx1, sy1 = math.ceil(points[:, 0].max()) + margin + 1, math.ceil(points[:, 1].max()) + margin + 1
    crop = np.ascontiguousarray(source[sy0:sy1, sx0:sx1])
    if sigma:
        crop = cv2.GaussianBlur(crop, (0, 0), sigma)
    pad = 3 if blend == "seamless" else 0  # Poisson cloning needs frame context around the object
    matrix = np.array([[scale, 0.0, offset[0] + scale * sx0 - x0 + pad],
                       [0.0, scale, offset[1] + scale * sy0 - y0 + pad]])
    warped = cv2.warpAffine(crop, matrix, (w + 2 * pad, h + 2 * pad), flags=cv2.INTER_LINEAR,
                            borderMode=cv2.BORDER_REPLICATE)
    region = image[y0:y0 + h, x0:x0 + w]
    if blend == "none":
        region[mask] = warped[mask]
    elif blend == "feather":
        distance = cv2.distanceTransform(mask.astype(np.uint8), cv2.DIST_L2, 3)  # 1 on the edge pixels
        alpha = np.minimum(distance / max(1.0, FEATHER * min(h, w)), 1.0)[..., None]
        mixed = np.rint(alpha * warped + (1.0 - alpha) * region).astype(np.uint8)
        region[mask] = mixed[mask]
    else:
        rows = np.clip(np.arange(y0 - pad, y0 + h + pad), 0, image.shape[0] - 1)
        cols = np.clip(np.arange(x0 - pad, x0 + w + pad), 0, image.shape[1] - 1)
        context = image[np.ix_(rows, cols)]  # the frame around the object, edges replicated past the frame
        clone_mask = np.zeros(context.shape[:2], np.uint8)
        clone_mask[pad:pad + h, pad:pad + w][mask] = 255
        # OpenCV keeps the domain's outermost pixels as they are (the boundary condition): one pixel wider, every
        # pasted pixel is solved for (and a domain under 3 pixels across, which OpenCV refuses, cannot occur)
        clone_mask = cv2.dilate(clone_mask, np.ones((3, 3), np.uint8))
        bx, by, bw, bh = cv2.boundingRect(clone_mask)  # OpenCV centres the mask's bounding box on this point:
        cloned = cv2.seamlessClone(warped, context, clone_mask, (bx + bw // 2, by + bh // 2), cv2.NORMAL_CLONE)
        region[mask] = cloned[pad:pad + h, pad:pad + w][mask]  # with same-size canvases, nothing moves


@register_adapter
class Paste(Adapter):
    """Cityscapes-format frames of one split with objects pasted on their road and sidewalk.

    Args:
        cityscapes_root: the frames (``leftImg8bit`` + ``gtFine_labelIds``, datasets/README.md).
        objects: a SUN2012 root (LabelMe XML polygons) or ``"demo"`` (generated objects).
        blend: ``none``, ``feather`` or ``seamless``.
        per_frame: OOD objects pasted per frame; negatives: ID objects pasted per frame, the same way.
        seed: with the frame id, seeds each frame's placements.
        height_ratio: (low, high) of the pasted height over the base's distance below the horizon.
    A frame on which no OOD object finds a placement (no road or sidewalk) is skipped with the reason; every
    paste (object, class, scale, offset, base, blend, visible pixels) is listed in the manifest's ``pastes``.
    """

    name = source = "paste"
    help = ("objects from --objects (a SUN2012 root or 'demo') pasted onto the road and sidewalk of Cityscapes "
            "frames: pasted OOD objects OOD, pasted ID objects (--negatives) ID, the rest the frame's labels")

    def __init__(self, cityscapes_root, split="val", objects="demo", *, blend="none", per_frame=1, negatives=0,
                 seed=0, height_ratio=HEIGHT_RATIO, label_map="sun"):
        if blend not in BLENDS:
            raise ValueError(f"blend must be one of {BLENDS}, got {blend!r}")
        if int(per_frame) < 1 or int(negatives) < 0:
            raise ValueError(f"per_frame must be at least 1 and negatives at least 0, got {per_frame} and {negatives}")
        low, high = (float(v) for v in height_ratio)
        if not 0 < low <= high:
            raise ValueError(f"height_ratio must be 0 < low <= high, got {height_ratio}")
        self.frames = Cityscapes(cityscapes_root, split)
        self.split, self.seed, self.blend = split, int(seed), blend
        self.per_frame, self.negatives, self.height_ratio = int(per_frame), int(negatives), (low, high)
        self.label_map = SunLabelMap(label_map)
        self.label_map_sha256 = self.label_map.sha256
        if str(objects) == "demo":
            bank, self.unused_files, left_out = demo_objects(self.label_map)
        else:
            bank, unused, left_out = sun_objects(objects, self.label_map)
            self.unused_files = [(f"objects: {path}", reason) for path, reason in unused]
        self.ood_objects = [o for o in bank if o.role == "ood"]
        self.id_objects = [o for o in bank if o.role == "id"]
        if not self.ood_objects:
            raise ValueError(f"{objects} holds no object that label map {label_map!r} calls OOD (at least "
                             f"{MIN_OBJECT_SIDE} pixels, not occluded or cropped); left out: {dict(left_out)}")
        if self.negatives and not self.id_objects:
            names = ", ".join(CLASS_NAMES[c] for c in NEGATIVE_CLASSES)
            raise ValueError(f"negatives need ID objects ({names}) and {objects} holds none; use negatives=0")
        self.params = {"cityscapes_root": str(cityscapes_root), "objects": str(objects), "blend": blend,
                       "per_frame": self.per_frame, "negatives": self.negatives, "height_ratio": [low, high],
                       "objects_found": {"ood": len(self.ood_objects), "id": len(self.id_objects),
                                         "left_out": dict(sorted(left_out.items()))}}

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--cityscapes-root", type=Path, required=True, help="the Cityscapes-format frames")
        parser.add_argument("--split", default="val", help="Cityscapes split (default val)")
        parser.add_argument("--objects", required=True, help="a SUN2012 root (LabelMe XML) or 'demo' (generated)")
        parser.add_argument("--blend", choices=BLENDS, default="none", help="default none")
        parser.add_argument("--per-frame", type=positive_int, default=1, help="OOD objects per frame (default 1)")
        parser.add_argument("--negatives", type=natural, default=0,
                            help="ID objects (person, car, ...) per frame, pasted the same way (default 0)")
        parser.add_argument("--height-ratio", type=float, nargs=2, default=HEIGHT_RATIO, metavar=("LOW", "HIGH"),
                            help="pasted height / distance of its base below the horizon (default %(default)s)")
        parser.add_argument("--seed", type=natural, default=0, help="with the frame id, seeds each frame")
        parser.add_argument("--label-map", default="sun", help="which objects are OOD (default label_maps/sun.yaml)")

    @classmethod
    def from_args(cls, args):
        return cls(args.cityscapes_root, args.split, args.objects, blend=args.blend, per_frame=args.per_frame,
                   negatives=args.negatives, seed=args.seed, height_ratio=args.height_ratio,
                   label_map=args.label_map)

    def refs(self):
        return self.frames.refs()

    def frame_id(self, ref):
        return self.frames.frame_id(ref)

    def object_image(self, obj):
        if isinstance(obj.image, np.ndarray):
            return obj.image
        try:
            return read_rgb(obj.image)
        except SkipFrame as reason:
            raise SkipFrame(f"object {obj.key}: {reason}") from None

    def load(self, ref):
        frame = self.frames.load(ref)
        rng = frame_rng(self.seed, frame.frame_id)
        ground = np.isin(frame.semantic, GROUND)
        horizon = ground_horizon(ground)
        if horizon is None:
            raise SkipFrame("no road or sidewalk to paste onto")
        image, ood_mask, semantic = frame.image.copy(), frame.ood_mask.copy(), frame.semantic.copy()
        owner = np.zeros(ground.shape, np.int32)  # 1 + the index of the paste a pixel shows, 0 for none
        pastes, missed = [], 0
        for role in rng.permutation(["ood"] * self.per_frame + ["id"] * self.negatives):
            bank = self.ood_objects if role == "ood" else self.id_objects
            obj = bank[int(rng.integers(len(bank)))]
            placement = place(obj.polygon, ground, horizon, rng, self.height_ratio)
            if placement is None:
                missed += 1
                continue
            scale, offset, base, (x0, y0), mask = placement
            render(image, self.object_image(obj), obj.polygon, scale, offset, (x0, y0), mask, self.blend)
            window = np.s_[y0:y0 + mask.shape[0], x0:x0 + mask.shape[1]]
            ood_mask[window][mask] = OOD if role == "ood" else ID
            semantic[window][mask] = IGNORE if role == "ood" else obj.train_id
            owner[window][mask] = len(pastes) + 1
            ground[window][mask] = False  # a later object stands on road or sidewalk, not on this one
            pastes.append({"object": obj.key, "name": obj.name, "role": str(role),
                           "class": None if role == "ood" else CLASS_NAMES[obj.train_id],
                           "base": list(base), "scale": float(scale), "offset": [float(offset[0]), float(offset[1])],
                           "blend": self.blend})
        if not any(p["role"] == "ood" for p in pastes):
            raise SkipFrame(f"no OOD object found a placement on road or sidewalk ({TRIES} tries each)")
        visible = np.bincount(owner.ravel(), minlength=len(pastes) + 1)[1:]
        for paste, pixels in zip(pastes, visible):
            paste["pixels"] = int(pixels)
        extra = {"frame_id": frame.frame_id, "pastes": pastes, "missed": missed,
                 "asked": self.per_frame + self.negatives}
        return Sample(image, ood_mask, semantic, frame.frame_id, {**extra, **(frame.extra or {})})

    def summary(self, extras):
        """The manifest's ``pastes`` (every paste, with its frame), ``paste_counts`` per role and name, and
        warnings for pastes that found no placement and for unknown Cityscapes label ids."""
        pastes = [{"frame_id": e["frame_id"], **p} for e in extras for p in e["pastes"]]
        counts = {}
        for p in pastes:
            row = counts.setdefault(f"{p['role']}: {p['name']}", {"pastes": 0, "pixels": 0})
            row["pastes"] += 1
            row["pixels"] += p["pixels"]
        out = {"pastes": pastes, "paste_counts": dict(sorted(counts.items()))}
        warnings = []
        missed, asked = sum(e["missed"] for e in extras), sum(e["asked"] for e in extras)
        if missed:
            warnings.append(f"{missed} of {asked} pastes found no placement on road or sidewalk in {TRIES} tries "
                            "(their frames keep the other pastes)")
        unknown = [e for e in extras if "unknown_label_ids" in e]
        if unknown:
            cityscapes = self.frames.summary(unknown)
            out["unknown_label_ids"] = cityscapes["unknown_label_ids"]
            warnings += cityscapes["warnings"]
        return {**out, **({"warnings": warnings} if warnings else {})}

    def reports(self, summary):
        """``<set>.pastes.md``: pastes and visible pixels per role and object name."""
        lines = ["| role: object | pastes | visible pixels |", "|---|---:|---:|"]
        lines += [f"| {name} | {c['pastes']} | {c['pixels']} |" for name, c in summary["paste_counts"].items()]
        return {".pastes.md": "\n".join(lines) + "\n"}
