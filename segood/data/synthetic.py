"""Procedural driving scenes with Cityscapes trainIds, for the demo and the tests. Deterministic per seed.

A scene is a perspective road with lane markings and sidewalks under a sky, buildings with windows,
vegetation, poles and cars. An OOD scene adds a novel object on the road (a saturated, striped crate
shape no training scene contains) whose pixels are OOD in the mask; everything else with a trainId is ID.
"""

import hashlib
import json
from pathlib import Path

import cv2
import numpy as np

from segood.labels import CLASS_NAMES, ID, IGNORE, LABEL_ID_TO_TRAIN_ID, OOD

TRAIN_ID = {name: i for i, name in enumerate(CLASS_NAMES)}


def driving_scene(rng, height=96, width=192, *, ood=False, novel_vehicles=0):
    """One scene.

    Args:
        rng: ``numpy.random.Generator`` (the only source of randomness).
        ood: paint a novel object (a striped crate) on the road.
        novel_vehicles: how many three-wheelers (an IDD-like novel vehicle, OOD) to paint among the cars.

    Returns:
        (image (H, W, 3) uint8 RGB, semantic (H, W) uint8 trainIds, ood_mask (H, W) uint8 0/1/255).
    """
    image = np.zeros((height, width, 3), np.float32)
    semantic = np.full((height, width), IGNORE, np.uint8)

    def paint(mask_or_poly, train_id, colour):
        mask = mask_or_poly
        if not isinstance(mask, np.ndarray) or mask.dtype != bool:
            canvas = np.zeros((height, width), np.uint8)
            cv2.fillPoly(canvas, [np.asarray(mask_or_poly, np.int32)], 1)
            mask = canvas.astype(bool)
        image[mask] = colour
        semantic[mask] = train_id
        return mask

    horizon = int(height * rng.uniform(0.35, 0.5))
    sky = np.zeros((height, width), bool)
    sky[:horizon] = True
    paint(sky, TRAIN_ID["sky"], rng.uniform([110, 150, 200], [160, 200, 250]))
    image[:horizon] *= np.linspace(0.85, 1.1, horizon)[:, None, None]  # gradient towards the horizon

    # Buildings and vegetation along the horizon.
    x = 0
    while x < width:
        w = int(rng.integers(width // 10, width // 4))
        top = int(horizon - rng.integers(height // 8, horizon))
        if rng.random() < 0.65:
            colour = rng.uniform([90, 70, 60], [170, 150, 140])
            paint([(x, top), (x + w, top), (x + w, horizon + 2), (x, horizon + 2)], TRAIN_ID["building"], colour)
            for wy in range(top + 3, horizon - 3, 7):  # windows
                for wx in range(x + 3, x + w - 4, 8):
                    image[wy : wy + 3, wx : wx + 4] = colour * 0.45
        else:
            centre = (x + w // 2, horizon)
            canvas = np.zeros((height, width), np.uint8)
            cv2.ellipse(canvas, centre, (w // 2 + 2, horizon - top), 0, 180, 360, 1, -1)
            mask = canvas.astype(bool)
            paint(mask, TRAIN_ID["vegetation"], rng.uniform([40, 90, 30], [80, 150, 60]))
            image[mask] *= rng.uniform(0.7, 1.2, (int(mask.sum()), 1))  # leafy texture
        x += w

    # Road in perspective, sidewalks beside it, lane markings.
    vanish = width * rng.uniform(0.4, 0.6)
    left, right = -width * rng.uniform(0.1, 0.3), width * rng.uniform(1.1, 1.3)
    paint([(0, horizon), (width, horizon), (width, height), (0, height)], TRAIN_ID["sidewalk"],
          rng.uniform([150, 140, 150], [190, 180, 190]))
    road = [(vanish - 3, horizon), (vanish + 3, horizon), (right, height), (left, height)]
    road_mask = paint(road, TRAIN_ID["road"], rng.uniform([70, 70, 75], [110, 105, 110]))
    for t0 in np.arange(0.05, 1.0, 0.16):
        t1 = t0 + 0.07
        pts = [(vanish + (width / 2 - vanish) * t, horizon + (height - horizon) * t) for t in (t0, t1)]
        cv2.line(image, tuple(map(int, pts[0])), tuple(map(int, pts[1])), (235, 235, 235), max(1, int(3 * t1)))

    # Poles on the sidewalk.
    for _ in range(int(rng.integers(1, 3))):
        px = int(rng.choice([rng.integers(2, width // 6), rng.integers(5 * width // 6, width - 3)]))
        paint([(px, horizon - height // 4), (px + 2, horizon - height // 4), (px + 2, horizon + height // 6),
               (px, horizon + height // 6)], TRAIN_ID["pole"], (90, 90, 90))

    # Cars on the road, further ones smaller.
    for _ in range(int(rng.integers(1, 4))):
        depth = rng.uniform(0.15, 0.9)
        cy = int(horizon + (height - horizon) * depth)
        ch, cw = max(4, int(height * 0.22 * depth)), max(6, int(width * 0.22 * depth))
        cx = int(vanish + (rng.uniform(-0.8, 0.8) * (right - left) / 2) * depth)
        body = [(cx - cw // 2, cy - ch), (cx + cw // 2, cy - ch), (cx + cw // 2, cy), (cx - cw // 2, cy)]
        colour = rng.uniform(20, 230, 3)
        paint(body, TRAIN_ID["car"], colour)
        image[max(cy - ch, 0) : max(cy - ch + ch // 3, 0), max(cx - cw // 3, 0) : cx + cw // 3] = (30, 40, 50)

    # A grass verge beside the road on one side.
    if rng.random() < 0.7:
        side = rng.choice([0, 1])
        y1 = horizon + (height - horizon) * rng.uniform(0.25, 0.5)
        x0, x1 = (0, width * 0.18) if side == 0 else (width * 0.82, width)
        paint([(x0, horizon + 1), (x1, horizon + 1), (x1, y1), (x0, y1)], TRAIN_ID["terrain"],
              rng.uniform([90, 120, 40], [130, 160, 70]))

    # Traffic signs and lights on poles by the road.
    for _ in range(int(rng.integers(0, 3))):
        px = int(rng.choice([rng.integers(4, width // 5), rng.integers(4 * width // 5, width - 6)]))
        top = int(horizon - height * rng.uniform(0.05, 0.2))
        s_ = max(3, height // 24)
        paint([(px, top), (px + 1, top), (px + 1, horizon + height // 10), (px, horizon + height // 10)],
              TRAIN_ID["pole"], (90, 90, 90))
        if rng.random() < 0.5:
            paint([(px - s_, top - 2 * s_), (px + s_ + 1, top - 2 * s_), (px + s_ + 1, top), (px - s_, top)],
                  TRAIN_ID["traffic sign"], rng.choice([(200, 30, 30), (30, 60, 190), (230, 200, 40)]))
        else:
            paint([(px - s_ // 2, top - 3 * s_), (px + s_ // 2 + 1, top - 3 * s_), (px + s_ // 2 + 1, top),
                   (px - s_ // 2, top)], TRAIN_ID["traffic light"], (25, 25, 25))
            image[top - 2 * s_ : top - 2 * s_ + 2, px - 1 : px + 1] = rng.choice([(255, 40, 40), (40, 255, 80)])

    # People on the sidewalks; a rider on a bicycle at the road's edge.
    for _ in range(int(rng.integers(0, 3))):
        depth = rng.uniform(0.2, 0.8)
        foot = int(horizon + (height - horizon) * depth)
        h_ = max(6, int(height * 0.35 * depth))
        x = int(rng.choice([rng.uniform(0.02, 0.2), rng.uniform(0.8, 0.97)]) * width)
        body = [(x - h_ // 6, foot - h_ + h_ // 5), (x + h_ // 6, foot - h_ + h_ // 5), (x + h_ // 8, foot),
                (x - h_ // 8, foot)]
        paint(body, TRAIN_ID["person"], rng.uniform(20, 200, 3))
        canvas = np.zeros((height, width), np.uint8)
        cv2.circle(canvas, (x, foot - h_ + h_ // 10), max(1, h_ // 9), 1, -1)
        paint(canvas.astype(bool), TRAIN_ID["person"], (200, 160, 130))
    if rng.random() < 0.4:
        depth = rng.uniform(0.3, 0.8)
        ground = int(horizon + (height - horizon) * depth)
        r = max(2, int(height * 0.05 * depth))
        x = int(vanish + (rng.choice([-1, 1]) * 0.6 * (right - left) / 2) * depth)
        canvas = np.zeros((height, width), np.uint8)
        for dx in (-2 * r, 2 * r):
            cv2.circle(canvas, (x + dx, ground - r), r, 1, max(1, r // 2))
        cv2.line(canvas, (x - 2 * r, ground - r), (x + 2 * r, ground - r), 1, max(1, r // 2))
        paint(canvas.astype(bool), TRAIN_ID["bicycle"], (30, 30, 30))
        paint([(x - r, ground - 5 * r), (x + r, ground - 5 * r), (x + r, ground - r), (x - r, ground - r)],
              TRAIN_ID["rider"], rng.uniform(30, 220, 3))

    ood_mask = np.where(semantic == IGNORE, IGNORE, ID).astype(np.uint8)
    for _ in range(novel_vehicles):  # a three-wheeler: rounded cab, bright body, dark canopy
        depth = rng.uniform(0.3, 0.85)
        base = int(horizon + (height - horizon) * depth)
        h_, w_ = max(5, int(height * 0.24 * depth)), max(5, int(width * 0.12 * depth))
        x = int(vanish + (rng.uniform(-0.7, 0.7) * (right - left) / 2) * depth)
        cab = [(x - w_ // 2, base), (x - w_ // 2, base - h_ // 2), (x - w_ // 4, base - h_), (x + w_ // 3, base - h_),
               (x + w_ // 2, base - h_ // 2), (x + w_ // 2, base)]
        canvas = np.zeros((height, width), np.uint8)
        cv2.fillPoly(canvas, [np.asarray(cab, np.int32)], 1)
        mask = canvas.astype(bool)
        image[mask] = rng.choice([(240, 200, 20), (60, 170, 60)])
        image[mask & (np.arange(height)[:, None] < base - 2 * h_ // 3)] = (20, 30, 20)  # canopy
        semantic[mask] = IGNORE  # no Cityscapes class
        ood_mask[mask] = OOD
    if ood:
        ys, xs = np.nonzero(road_mask[horizon + (height - horizon) // 3 :])
        k = int(rng.integers(len(ys)))
        cy, cx = ys[k] + horizon + (height - horizon) // 3, xs[k]
        size = int(rng.uniform(0.12, 0.3) * height)
        crate = [(cx - size, cy - size), (cx + size // 2, cy - size - size // 3), (cx + size, cy),
                 (cx - size // 3, cy + size // 3)]
        canvas = np.zeros((height, width), np.uint8)
        cv2.fillPoly(canvas, [np.asarray(crate, np.int32)], 1)
        mask = canvas.astype(bool)
        stripes = ((np.add.outer(np.arange(height), np.arange(width)) // 3) % 2).astype(bool)
        image[mask & stripes] = rng.uniform([200, 0, 150], [255, 80, 255])
        image[mask & ~stripes] = rng.uniform([200, 200, 0], [255, 255, 60])
        semantic[mask] = IGNORE
        ood_mask[mask] = OOD

    image *= rng.uniform(0.75, 1.2)  # lighting
    image += rng.normal(0, 6, image.shape)  # sensor noise
    return np.clip(image, 0, 255).astype(np.uint8), semantic, ood_mask


def scene_batch(seed, count, height=96, width=192, *, ood_fraction=0.0):
    """``count`` scenes from ``seed``; every ``1 / ood_fraction``-th one holds an OOD object.

    Returns stacked (images (N, H, W, 3), semantic (N, H, W), ood_mask (N, H, W)), all uint8.
    """
    rng = np.random.default_rng(seed)
    every = int(round(1 / ood_fraction)) if ood_fraction else 0
    scenes = [driving_scene(rng, height, width, ood=bool(every) and i % every == 0) for i in range(count)]
    return tuple(np.stack(parts) for parts in zip(*scenes))


def write_scene_set(path, count, size=(96, 192), *, seed=0, split="val", overwrite=False):
    """A converted set at ``path`` of the ``count`` scenes of :func:`scene_batch` (``seed``) at ``size`` = (H, W),
    frames ``scene/<seed>/<k>``: a set without a raw tree, for benchmarks and device checks. Returns ``path``."""
    from segood.data.common import Sample
    from segood.data.h5 import SetWriter

    images, semantic, ood = scene_batch(seed, count, *size)
    writer = SetWriter(path, tuple(size), {"source": "synthetic", "split": split}, overwrite=overwrite)
    for k in range(count):
        writer.append(Sample(images[k], ood[k], semantic[k], f"scene/{seed}/{k}"))
    writer.commit()
    return path


# -- raw dataset trees in the published layouts (datasets/README.md), for the demo and the tests ---------------

#: trainId -> the first Cityscapes labelId with that trainId (255 -> 0, "unlabeled")
TRAIN_TO_LABEL_ID = np.zeros(256, np.uint8)
for _label_id in range(255, -1, -1):
    if LABEL_ID_TO_TRAIN_ID[_label_id] != IGNORE:
        TRAIN_TO_LABEL_ID[LABEL_ID_TO_TRAIN_ID[_label_id]] = _label_id

#: IDD label names of the classes the scenes contain, in the order the scenes paint them
IDD_PAINT_ORDER = ("sky", "building", "vegetation", "sidewalk", "road", "pole", "car", "non-drivable fallback",
                   "traffic sign", "traffic light", "person", "bicycle", "rider")
_IDD_TRAIN_ID = {"non-drivable fallback": TRAIN_ID["terrain"]}


def _write_image(path, image, quality=92):
    path.parent.mkdir(parents=True, exist_ok=True)
    params = [cv2.IMWRITE_JPEG_QUALITY, quality] if path.suffix == ".jpg" else []
    if not cv2.imwrite(str(path), np.ascontiguousarray(image[..., ::-1]), params):
        raise OSError(f"cannot write {path}")


def write_cityscapes_tree(root, seed=0, counts=(("train", 96), ("val", 32)), size=(128, 256)):
    """Cityscapes-format tree: leftImg8bit PNGs and gtFine_labelIds in real Cityscapes ids."""
    root, rng = Path(root), np.random.default_rng(seed)
    for split, count in counts:
        for k in range(count):
            image, semantic, _ = driving_scene(rng, *size)
            city = f"{split}town{k % 3}"
            stem = f"{city}_{k // 3:06d}_{k:06d}"
            _write_image(root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png", image)
            label_path = root / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png"
            label_path.parent.mkdir(parents=True, exist_ok=True)
            if not cv2.imwrite(str(label_path), TRAIN_TO_LABEL_ID[semantic]):
                raise OSError(f"cannot write {label_path}")


def _polygons(mask):
    """Outer contours of a boolean mask as [[x, y], ...] lists (holes are painted over by later objects)."""
    contours, _ = cv2.findContours(mask.astype(np.uint8), cv2.RETR_EXTERNAL, cv2.CHAIN_APPROX_SIMPLE)
    return [c[:, 0, :].tolist() for c in contours if len(c) >= 3]


def write_idd_tree(root, seed=1, count=24, size=(128, 256), split="val"):
    """IDD-format tree: JPEG images and polygon JSON in paint order; vehicles include three-wheelers
    (``autorickshaw``) beside ``car``s. Returns the raster ground truth {frame_id: (semantic, ood_mask)}."""
    root, rng = Path(root), np.random.default_rng(seed)
    truth = {}
    for k in range(count):
        image, semantic, ood_mask = driving_scene(rng, *size, novel_vehicles=int(rng.integers(1, 3)))
        seq, stem = str(k % 4), f"{k:06d}"
        objects = []
        for name in IDD_PAINT_ORDER:
            train_id = _IDD_TRAIN_ID.get(name, TRAIN_ID.get(name))
            objects += [{"label": name, "polygon": p, "deleted": 0} for p in _polygons(semantic == train_id)]
        objects += [{"label": "autorickshaw", "polygon": p, "deleted": 0} for p in _polygons(ood_mask == OOD)]
        _write_image(root / "leftImg8bit" / split / seq / f"{stem}_leftImg8bit.jpg", image)
        json_path = root / "gtFine" / split / seq / f"{stem}_gtFine_polygons.json"
        json_path.parent.mkdir(parents=True, exist_ok=True)
        json_path.write_text(json.dumps({"imgHeight": size[0], "imgWidth": size[1], "objects": objects}))
        truth[f"{split}/{seq}/{stem}"] = (semantic, ood_mask)
    return truth


# SUN-like scenes: (name as annotators typed it, colour); names exercise label_maps/sun.yaml
_INDOOR = {"background": ("wall", (200, 190, 170)), "floor": ("floor", (140, 100, 70)),
           "things": [("Window", (170, 210, 240)), ("door", (120, 80, 50)), ("table", (150, 110, 60)),
                      ("chair occluded", (90, 60, 40)), ("sofa", (110, 40, 60)), ("vase crop", (40, 120, 160)),
                      ("painting", (200, 150, 40)), ("lamp", (240, 230, 150)), ("person sitting crop", (180, 140, 120))]}
_OUTDOOR = {"background": ("sky", (130, 180, 230)), "floor": ("road", (90, 90, 95)),
            "things": [("building", (160, 120, 100)), ("building windows", (60, 80, 110)), ("pine tree", (50, 120, 50)),
                       ("parked car occluded", (150, 20, 30)), (" Person  walking", (60, 60, 160)), ("fire hydrant", (220, 40, 30)),
                       ("bench", (120, 90, 50)), ("sidewalk", (170, 170, 170)), ("mailbox", (30, 60, 160))]}


def _sun_scene(rng, height, width):
    """(image, objects [(name, points, username, deleted)]) of one indoor or outdoor scene."""
    kind = _INDOOR if rng.random() < 0.5 else _OUTDOOR
    image = np.zeros((height, width, 3), np.float32)
    objects = []

    def add(name, colour, points, user=None, deleted=0):
        if not deleted:
            canvas = np.zeros((height, width), np.uint8)
            cv2.fillPoly(canvas, [np.asarray(points, np.int32)], 1)
            image[canvas.astype(bool)] = np.asarray(colour) * rng.uniform(0.8, 1.2)
        objects.append((name, points, user or rng.choice(["alice", "bob", "carol"]), deleted))

    name, colour = kind["background"]
    add(name, colour, [(0, 0), (width - 1, 0), (width - 1, height - 1), (0, height - 1)])
    horizon = int(height * rng.uniform(0.45, 0.65))
    name, colour = kind["floor"]
    add(name, colour, [(0, horizon), (width - 1, horizon), (width - 1, height - 1), (0, height - 1)])
    for _ in range(int(rng.integers(4, 9))):
        name, colour = kind["things"][int(rng.integers(len(kind["things"])))]
        w, h = int(width * rng.uniform(0.08, 0.3)), int(height * rng.uniform(0.08, 0.35))
        x, y = int(rng.integers(-w // 4, width - w // 2)), int(rng.integers(0, height - h // 2))
        points = [(x, y), (x + w, y + int(rng.integers(-h // 6, h // 6 + 1))), (x + w, y + h), (x, y + h)]
        roll = rng.random()
        add(name, colour, points, user="anonymous" if roll < 0.1 else None, deleted=int(0.1 <= roll < 0.15))
    image += rng.normal(0, 8, image.shape)
    return np.clip(image, 0, 255).astype(np.uint8), objects


def write_sun_tree(root, seed=2, count=32, size=(720, 960), small=2):
    """SUN2012-format tree: JPEGs and LabelMe XML (some without imagesize, anonymous and deleted polygons,
    free-text names), plus ``small`` images of 600x600 that the size filter drops."""
    from xml.sax.saxutils import escape

    root, rng = Path(root), np.random.default_rng(seed)
    for k in range(count + small):
        height, width = size if k < count else (600, 600)
        image, objects = _sun_scene(rng, height, width)
        folder = ("s/street", "l/living_room")[k % 2]
        name = f"sun_demo{k:04d}"
        _write_image(root / "Images" / folder / f"{name}.jpg", image)
        parts = [f"<annotation><filename>{name}.jpg</filename><folder>{folder}</folder>"]
        if k % 3:
            parts.append(f"<imagesize><nrows>{height}</nrows><ncols>{width}</ncols></imagesize>")
        for label, points, user, deleted in objects:
            pts = "".join(f"<pt><x>{x}</x><y>{y}</y></pt>" for x, y in points)
            parts.append(f"<object><name>{escape(label)}</name><deleted>{deleted}</deleted><verified>0</verified>"
                         f"<polygon><username>{user}</username>{pts}</polygon></object>")
        parts.append("</annotation>")
        xml_path = root / "Annotations" / folder / f"{name}.xml"
        xml_path.parent.mkdir(parents=True, exist_ok=True)
        xml_path.write_text("".join(parts))


# Objects to paste (``segood convert paste --objects demo``): (name, colour); names go through label_maps/sun.yaml
_PASTE_OOD = [("fire hydrant", (220, 40, 30)), ("mailbox", (30, 60, 160)), ("traffic cone", (250, 120, 20)),
              ("sofa", (110, 40, 60)), ("suitcase", (60, 140, 150)), ("dog", (150, 110, 70)), ("barrel", (40, 110, 60)),
              ("armchair", (170, 150, 40))]
_PASTE_ID = [("car", None), ("person", None)]


def paste_objects(seed=0, count=24):
    """Polygon-annotated objects for the paste generator: ``count`` (name, polygon [(x, y), ...], image (h, w, 3)
    uint8 RGB) with the polygon in the image's pixel coordinates; most are novel things (striped or
    speckled blobs named fire hydrant, mailbox, traffic cone, ...), every fourth a car or a person (ID
    negatives). Deterministic per seed."""
    rng = np.random.default_rng(seed)
    objects = []
    for k in range(count):
        name, colour = _PASTE_ID[(k // 4) % 2] if k % 4 == 3 else _PASTE_OOD[int(rng.integers(len(_PASTE_OOD)))]
        height, width = int(rng.integers(40, 96)), int(rng.integers(40, 96))
        cy, cx = height / 2, width / 2
        if name == "car":  # a body with a cabin
            height = int(width * rng.uniform(0.5, 0.7))
            points = [(2, height - 3), (2, height * 0.45), (width * 0.25, height * 0.4), (width * 0.35, 2), (width * 0.7, 2),
                      (width * 0.8, height * 0.4), (width - 3, height * 0.45), (width - 3, height - 3)]
            colour = rng.uniform(20, 230, 3)
        elif name == "person":  # a head above a tapering body
            width = int(height * rng.uniform(0.3, 0.4))
            points = [(cx - width * 0.12, 2), (cx + width * 0.12, 2), (cx + width * 0.15, height * 0.15),
                      (width - 2, height * 0.25), (width * 0.7, height - 2), (width * 0.3, height - 2),
                      (1, height * 0.25), (cx - width * 0.15, height * 0.15)]
            colour = rng.uniform(20, 200, 3)
        else:  # a star-convex blob of 6 to 10 vertices
            n = int(rng.integers(6, 11))
            u = np.sort(rng.uniform(0, 4, n))  # around a square's perimeter, normalised: directions without
            side, f = u.astype(int), u % 1       # trigonometry (the same bytes on every machine)
            dx = np.choose(side, [np.ones(n), 1 - 2 * f, -np.ones(n), -1 + 2 * f])
            dy = np.choose(side, [-1 + 2 * f, np.ones(n), 1 - 2 * f, -np.ones(n)])
            radii = rng.uniform(0.55, 1.0, n) / np.sqrt(dx * dx + dy * dy)
            points = list(zip(cx + (cx - 2) * radii * dx, cy + (cy - 2) * radii * dy))
        image = np.empty((height, width, 3), np.float32)
        image[:] = np.asarray(colour, np.float32) * rng.uniform(0.8, 1.2)
        if k % 2:  # stripes
            image[(np.add.outer(np.arange(height), np.arange(width)) // 4) % 2 == 1] *= 0.5
        image += rng.normal(0, 10, image.shape)
        points = [(round(float(x), 2), round(float(y), 2)) for x, y in points]
        objects.append((name, points, np.clip(image, 0, 255).astype(np.uint8)))
    return objects


def tree_sha256(root):
    """sha256 over the sorted relative paths and bytes of every file under ``root`` (determinism checks)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(root).rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()
