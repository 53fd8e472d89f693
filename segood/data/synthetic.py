"""Procedural driving scenes with Cityscapes trainIds, for the demo and the tests. Deterministic per seed.

A scene is a perspective road with lane markings and sidewalks under a sky, buildings with windows,
vegetation, poles and cars. An OOD scene adds a novel object on the road (a saturated, striped crate
shape no training scene contains) whose pixels are OOD in the mask; everything else with a trainId is ID.
"""

import cv2
import numpy as np

from segood.labels import CLASS_NAMES, ID, IGNORE, OOD

TRAIN_ID = {name: i for i, name in enumerate(CLASS_NAMES)}


def driving_scene(rng, height=96, width=192, *, ood=False):
    """One scene.

    Args:
        rng: ``numpy.random.Generator`` (the only source of randomness).
        ood: paint a novel object on the road.

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

    ood_mask = np.where(semantic == IGNORE, IGNORE, ID).astype(np.uint8)
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
