"""Tiny raw dataset trees in the exact published layouts (datasets/README.md), with known contents; a
simulated kill for the resume tests, a damaged frame for the integrity tests and a converted set read back."""

import json
from pathlib import Path

import cv2
import numpy as np


def write_rgb(path, image):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.ascontiguousarray(image[..., ::-1]))


def gradient_image(height, width, seed=0):
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (height, width, 3), dtype=np.uint8)


def cityscapes_tree(root, split="val", frames=(("frankfurt", "000000", "000294"), ("lindau", "000001", "000019")),
                    height=32, width=64):
    """Label ids per frame: road (7) top half, car (26) a block, unlabeled (0) and ego vehicle (1) strips."""
    root = Path(root)
    label_ids = np.full((height, width), 7, np.uint8)
    label_ids[height // 2 :] = 26
    label_ids[:, :4] = 0
    label_ids[-3:] = 1
    label_ids[2:6, 10:20] = 4  # static: no train class
    for k, (city, seq, frame) in enumerate(frames):
        stem = f"{city}_{seq}_{frame}"
        write_rgb(root / "leftImg8bit" / split / city / f"{stem}_leftImg8bit.png", gradient_image(height, width, k))
        label_path = root / "gtFine" / split / city / f"{stem}_gtFine_labelIds.png"
        label_path.parent.mkdir(parents=True, exist_ok=True)
        assert cv2.imwrite(str(label_path), label_ids)
    return label_ids


def rect(x0, y0, x1, y1):
    return [[x0, y0], [x1, y0], [x1, y1], [x0, y1]]


def idd_json(path, height, width, objects):
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"imgHeight": height, "imgWidth": width, "objects": objects}))


def idd_tree(root, split="val", height=40, width=60):
    """Frame 0: road everywhere, a car, an autorickshaw painted over part of the car, a cargroup, a deleted
    autorickshaw (not drawn). Frame 1 (jpg image): an unknown label, so it is skipped."""
    root = Path(root)
    objects = [
        {"label": "road", "polygon": rect(0, 0, width - 1, height - 1), "deleted": 0},
        {"label": "car", "polygon": rect(5, 5, 24, 19), "deleted": 0},
        {"label": "autorickshaw", "polygon": rect(20, 10, 34, 24), "deleted": 0},
        {"label": "cargroup", "polygon": rect(40, 30, 49, 35), "deleted": 0},
        {"label": "autorickshaw", "polygon": rect(0, 30, 9, 39), "deleted": 1},
        {"label": "sky", "polygon": rect(50, 0, 59, 4)},
    ]
    write_rgb(root / "leftImg8bit" / split / "0" / "000100_leftImg8bit.png", gradient_image(height, width))
    idd_json(root / "gtFine" / split / "0" / "000100_gtFine_polygons.json", height, width, objects)
    write_rgb(root / "leftImg8bit" / split / "1" / "000200_leftImg8bit.jpg", gradient_image(height, width, 1))
    idd_json(root / "gtFine" / split / "1" / "000200_gtFine_polygons.json", height, width,
             [{"label": "spaceship", "polygon": rect(0, 0, 5, 5), "deleted": 0}])


def labelme_xml(filename, folder, objects, size=None):
    """objects: (name, points, username, deleted) tuples; points None = an object without polygon."""
    parts = [f"<annotation><filename>{filename}</filename><folder>{folder}</folder>"]
    if size:
        parts.append(f"<imagesize><nrows>{size[0]}</nrows><ncols>{size[1]}</ncols></imagesize>")
    for name, points, user, deleted in objects:
        parts.append(f"<object><name>{name}</name><deleted>{deleted}</deleted><verified>0</verified>"
                     "<occluded>no</occluded>")
        if points is not None:
            pts = "".join(f"<pt><x>{x}</x><y>{y}</y></pt>" for x, y in points)
            parts.append(f"<polygon><username>{user}</username>{pts}</polygon>")
        parts.append("</object>")
    parts.append("</annotation>")
    return "".join(parts)


SUN_OBJECTS = [  # painted in this order on a 660x700 image
    (" Car  occluded", rect(0, 0, 99, 99), "alice", 0),      # -> car (ID, trainId 13)
    ("wall", rect(50, 50, 149, 149), "bob", 0),              # ambiguous -> ignore, over the car's corner
    ("vase crop", rect(200, 200, 299, 299), "carol", 0),     # -> OOD
    ("vase", rect(400, 400, 499, 499), "anonymous", 0),      # anonymous: skipped
    ("car", rect(300, 0, 399, 99), "dave", 1),               # deleted: skipped
    ("chair", None, "erin", 0),                              # no polygon: skipped
    ("Window", rect(600, 600, 800, 800), "frank", 0),        # -> building, clipped to the image
]


def sun_tree(root, eligible=8, height=660, width=700):
    """``eligible`` frames of height x width with SUN_OBJECTS (half of them without imagesize in the XML),
    plus one 600x600 frame (dropped by the size filter) and one unreadable XML."""
    root = Path(root)
    for k in range(eligible):
        folder = f"{'ab'[k % 2]}/{'abbey' if k % 2 == 0 else 'bedroom'}"
        name = f"sun_frame{k:02d}"
        write_rgb(root / "Images" / folder / f"{name}.jpg", gradient_image(height, width, k))
        xml = labelme_xml(f"{name}.jpg", folder, SUN_OBJECTS, (height, width) if k % 2 == 0 else None)
        (root / "Annotations" / folder).mkdir(parents=True, exist_ok=True)
        (root / "Annotations" / folder / f"{name}.xml").write_text(xml)
    write_rgb(root / "Images" / "s" / "street" / "sun_small.jpg", gradient_image(600, 600))
    (root / "Annotations" / "s" / "street").mkdir(parents=True, exist_ok=True)
    (root / "Annotations" / "s" / "street" / "sun_small.xml").write_text(
        labelme_xml("sun_small.jpg", "s/street", SUN_OBJECTS, (600, 600)))
    write_rgb(root / "Images" / "s" / "street" / "sun_broken.jpg", gradient_image(700, 700))
    (root / "Annotations" / "s" / "street" / "sun_broken.xml").write_text("<annotation><object><name>")


def mixed_noise_sets(root, kinds=("perlin", "normal"), noise_frames=2, cityscapes_frames=2, seed=3, side=64):
    """Converted sets under ``root``: ``cs.h5`` (Cityscapes-format val), ``<kind>.h5`` noise and
    ``<kind>_mixed.h5`` (noise + the Cityscapes frames), all side x side. Returns ``root``."""
    from segood.data import Cityscapes, Noise, convert, mix

    frames = [("aachen", "000000", f"{k:06d}") for k in range(cityscapes_frames)]
    cityscapes_tree(root / "cs", height=side, width=side, frames=frames)
    convert(Cityscapes(root / "cs", "val"), root / "cs.h5", size=(side, side), progress=False)
    for kind in kinds:
        convert(Noise(kind, noise_frames, size=(side, side), seed=seed), root / f"{kind}.h5", size=(side, side),
                progress=False)
        mix(root / f"{kind}.h5", root / "cs.h5", root / f"{kind}_mixed.h5", progress=False)
    return root


def write_label(path, values, *, gamma=None, palette=False):
    """Write (H, W) uint8 label values as an 8-bit PNG; ``gamma`` adds a gAMA chunk (as LostAndFound's PNGs
    have), ``palette`` stores it as a palette image (mode P) whose colours are not the values."""
    from PIL import Image

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    values = np.ascontiguousarray(values, np.uint8)
    image = Image.frombytes("P" if palette else "L", values.shape[::-1], values.tobytes())
    if palette:
        image.putpalette([255 - v for v in range(256) for _ in range(3)])
    image.save(path)
    if gamma is not None:
        add_gamma_chunk(path, gamma)


def add_gamma_chunk(path, gamma):
    """Insert a gAMA chunk (gamma × 100000) after a PNG's IHDR, as a decoder that applied it would see."""
    import struct
    import zlib

    data = Path(path).read_bytes()
    end_of_ihdr = 8 + 8 + 13 + 4
    body = b"gAMA" + struct.pack(">I", int(round(gamma * 100000)))
    chunk = struct.pack(">I", 4) + body + struct.pack(">I", zlib.crc32(body))
    Path(path).write_bytes(data[:end_of_ihdr] + chunk + data[end_of_ihdr:])


def write_webp(path, image):
    """Lossless WebP (RoadObstacle21, Road Anomaly), so that the decoded pixels are exactly ``image``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), np.ascontiguousarray(image[..., ::-1]), [cv2.IMWRITE_WEBP_QUALITY, 101])


def smiyc_labels(height, width, k):
    """Road (0) below the middle, an obstacle (1), a void region (255) and a stray value (7, also ignore)."""
    label = np.full((height, width), 255, np.uint8)
    label[height // 2:] = 0
    label[height // 2 + 2: height // 2 + 5, 5 + k: 12 + k] = 1
    label[-2:, :3] = 7
    return label


def smiyc_tree(root, track, frames, height=24, width=40):
    """A SMIYC track folder (``dataset_AnomalyTrack`` or ``dataset_ObstacleTrack``) with ``frames`` (fid,
    labelled) in order; labelled frames get a label PNG and its colour rendering beside it. Returns
    {fid: (image, label or None)}."""
    root = Path(root)
    suffix = ".webp" if track == "dataset_ObstacleTrack" else ".jpg"
    out = {}
    for k, (fid, labelled) in enumerate(frames):
        image = gradient_image(height, width, k)
        if suffix == ".webp":
            write_webp(root / "images" / f"{fid}.webp", image)
        else:
            write_rgb(root / "images" / f"{fid}.jpg", image)
            image = decoded(root / "images" / f"{fid}.jpg")  # what the lossy JPEG holds
        label = None
        if labelled:
            label = smiyc_labels(height, width, k)
            write_label(root / "labels_masks" / f"{fid}_labels_semantic.png", label)
            write_rgb(root / "labels_masks" / f"{fid}_labels_semantic_color.png", np.stack([label * 100] * 3, -1))
        out[fid] = (image, label)
    return out


def decoded(path):
    """The RGB pixels a lossy file holds, decoded as segood decodes it (Pillow)."""
    from PIL import Image

    with Image.open(path) as image:
        return np.asarray(image.convert("RGB"))


def laf_labels(height, width, k):
    """Every rule of LostAndFound's labelIds: 0 ignore, 1 free space, 2..200 objects (31: a "non-hazard" id,
    still OOD), 201 and 255 ignore."""
    label = np.zeros((height, width), np.uint8)
    label[height // 2:] = 1
    label[height // 2 + 1: height // 2 + 4, 3 + k: 9 + k] = 2 + k
    label[-3:, -6:-3] = 31
    label[-2:, -2:] = 200
    label[1, 1:4] = 201
    label[2, 1:4] = 255
    return label


LAF_FRAMES = {  # split folder -> fids
    "train": ["01_Hanns_Klemm_Str_45_000000_000080", "02_Hanns_Klemm_Str_44_000001_000120"],
    "test": ["01_Hanns_Klemm_Str_45_000006_000070", "02_Hanns_Klemm_Str_44_000015_000200",
             "04_Maurener_Weg_8_000002_000140", "04_Maurener_Weg_8_000003_000190",
             "10_Schlossberg_9_000004_000030", "15_Rechbergstr_Deckenpfronn_000000_000010"],
}
LAF_EMPTY = "04_Maurener_Weg_8_000003_000190"  # a test frame whose label is all 0 (no ID, no OOD pixel)


def laf_tree(root, height=16, width=32):
    """LostAndFound with gAMA chunks in every PNG (images and labels), instanceIds and colour files beside the
    labels; one test label all 0. Returns {fid: (image, label)}."""
    root = Path(root)
    out = {}
    for folder, fids in LAF_FRAMES.items():
        for k, fid in enumerate(fids):
            scene = fid[: -len("_000000_000000")]
            image = gradient_image(height, width, 10 + k)
            image_path = root / "leftImg8bit" / folder / scene / f"{fid}_leftImg8bit.png"
            write_rgb(image_path, image)
            add_gamma_chunk(image_path, 0.45455)
            label = np.zeros((height, width), np.uint8) if fid == LAF_EMPTY else laf_labels(height, width, k)
            labels = root / "gtCoarse" / folder / scene
            write_label(labels / f"{fid}_gtCoarse_labelIds.png", label, gamma=0.45455)
            write_label(labels / f"{fid}_gtCoarse_instanceIds.png", label // 2)
            write_rgb(labels / f"{fid}_gtCoarse_color.png", np.stack([label] * 3, -1))
            out[fid] = (image, label)
    return out


def fishyscapes_laf_tree(root, laf_frames, height=16, width=32):
    """Flat ``<NNNN>_<fid>_labels.png`` over LostAndFound frames (0 ID, 1 OOD, 255 ignore, one stray 9); one
    label names a frame LostAndFound does not have. Returns {frame id: label}."""
    root = Path(root)
    out = {}
    for k, fid in enumerate(list(laf_frames) + ["07_Nowhere_000000_000000"]):
        label = np.zeros((height, width), np.uint8)
        label[3:6, 4 + k: 9 + k] = 1
        label[:2] = 255
        label[-1, -1] = 9
        write_label(root / f"{k:04d}_{fid}_labels.png", label)
        out[f"{k:04d}_{fid}"] = label
    (root / "README.txt").write_text("Fishyscapes Lost & Found\n")
    return out


def fishyscapes_static_tree(root, cityscapes_root, cityscapes_ids, height=32, width=64):
    """Flat ``<NNNN>_<cityscapes id>_labels.png`` + ``_rgb.npz`` int16 overlays (that push values past 0 and
    255) over Cityscapes val frames; the last id's overlay is float (refused). Returns {frame id: (image,
    label)} with the expected image = clip(Cityscapes image + overlay)."""
    from PIL import Image

    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    out = {}
    for k, cs_id in enumerate(cityscapes_ids):
        city = cs_id.split("_")[0]
        with Image.open(Path(cityscapes_root) / "leftImg8bit/val" / city / f"{cs_id}_leftImg8bit.png") as im:
            base = np.asarray(im.convert("RGB")).astype(np.int64)
        overlay = np.zeros((height, width, 3), np.int16)
        overlay[4:12, 8:20] = 300
        overlay[14:20, 30:40] = -300
        overlay[22:26, 2:4] = np.arange(-12, 12, dtype=np.int16).reshape(4, 2, 3)
        label = np.zeros((height, width), np.uint8)
        label[4:12, 8:20] = 1
        label[:2] = 255
        frame_id = f"{k:04d}_{cs_id}"
        write_label(root / f"{frame_id}_labels.png", label)
        np.savez(root / f"{frame_id}_rgb.npz", rgb=overlay if k < len(cityscapes_ids) - 1 else overlay * 0.5)
        out[frame_id] = (np.clip(base + overlay, 0, 255).astype(np.uint8), label)
    return out


def streethazards_labels(height, width, k):
    """Every StreetHazards value 1..14 in a band each, the anomaly (14) in a block, and a stray 0 and 15."""
    label = np.repeat(np.arange(1, 15, dtype=np.uint8)[None], height, 0).repeat(width // 14 + 1, 1)[:, :width]
    label = np.ascontiguousarray(label)
    label[2:5, 3 + k: 8 + k] = 14
    label[0, 0], label[0, 1] = 0, 15
    return label


STREETHAZARDS_FRAMES = {"training": [("t1", "0")], "validation": [("t3", "12")],
                        "test": [("t5", "100"), ("t6", "3")]}


def streethazards_tree(root, height=12, width=28):
    """StreetHazards' two top folders; returns {frame id: (image, label)}."""
    root = Path(root)
    out = {}
    for split, frames in STREETHAZARDS_FRAMES.items():
        top = root / ("test" if split == "test" else "train")
        for k, (town, n) in enumerate(frames):
            image, label = gradient_image(height, width, 20 + k), streethazards_labels(height, width, k)
            write_rgb(top / "images" / split / town / f"{n}.png", image)
            write_label(top / "annotations" / split / town / f"{n}.png", label)
            out[f"{split}/{town}/{n}"] = (image, label)
    return out


BDD_FRAMES = {  # (bdd split, id) -> anomaly classes drawn in it
    ("train", "0004a4c0-d4dff0ad"): (), ("train", "00054602-3bf57337"): (17,),
    ("val", "7d06fefd-f7be05a6"): (16, 18), ("val", "7d128593-0ccfea4c"): (),
}


def bdd_tree(root, height=12, width=20):
    """BDD100K seg: JPEG images, ``_train_id.png`` labels (0..15 stripes, anomaly blocks, 255 void, a stray 40),
    a ``color_labels`` folder beside them and an image without a label. Returns {frame id: (image, label)}."""
    root = Path(root) / "seg"
    out = {}
    for k, ((split, bdd_id), anomalies) in enumerate(BDD_FRAMES.items()):
        label = (np.arange(width, dtype=np.uint8)[None].repeat(height, 0) % 16).astype(np.uint8)
        for j, c in enumerate(anomalies):
            label[2 + 4 * j: 5 + 4 * j, 4:9] = c
        label[-1] = 255
        label[0, 0] = 40
        write_rgb(root / "images" / split / f"{bdd_id}.jpg", gradient_image(height, width, 30 + k))
        write_label(root / "labels" / split / f"{bdd_id}_train_id.png", label)
        write_rgb(root / "color_labels" / split / f"{bdd_id}_train_color.png", np.stack([label] * 3, -1))
        out[f"{split}/{bdd_id}"] = (decoded(root / "images" / split / f"{bdd_id}.jpg"), label)
    write_rgb(root / "images" / "val" / "ffffffff-00000000.jpg", gradient_image(height, width))
    return out


def road_anomaly_tree(root, height=18, width=32):
    """Road Anomaly: frame_list.json naming three frames (WebP, JPEG, WebP whose label was drawn at twice the
    size), a frame folder it does not name. Returns {name: (image, label at the image's size)}."""
    root = Path(root)
    frames = root / "frames"
    names = ["animals01_Guiyang_Rhinoceros.jpg", "cones02_road.webp", "rocks03_big.webp"]
    out = {}
    for k, name in enumerate(names):
        stem = name.rsplit(".", 1)[0]
        image = gradient_image(height, width, 40 + k)
        label = np.zeros((height, width), np.uint8)
        label[5:11, 6 + k: 15 + k] = 2
        if name.endswith(".webp"):
            write_webp(frames / name, image)
        else:
            write_rgb(frames / name, image)
            image = decoded(frames / name)
        stored = label.repeat(2, 0).repeat(2, 1) if k == 2 else label
        if k == 1:
            stored = stored.copy()
            stored[0, :3] = 1  # no Road Anomaly value: ignore, and warned about
            label = stored
        write_label(frames / f"{stem}.labels" / "labels_semantic.png", stored)
        out[stem] = (image, label)
    write_webp(frames / "extra09_unlisted.webp", gradient_image(height, width))
    (root / "frame_list.json").write_text(json.dumps(names))
    return out


def road_obstacles_v0_tree(root, height=18, width=32):
    """RoadObstacles v0 in Road Anomaly's layout: background (0) top rows, road (1) below, an obstacle (2) block,
    255 strips; a stray 7 in one frame; the second frame's label drawn at twice the size. Returns {name: (image,
    label at the image's size)}."""
    root = Path(root)
    frames = root / "frames"
    names = ["snowstorm01_0000.webp", "curvy02_0003.jpg"]
    out = {}
    for k, name in enumerate(names):
        stem = name.rsplit(".", 1)[0]
        image = gradient_image(height, width, 60 + k)
        label = np.ones((height, width), np.uint8)
        label[:6] = 0
        label[9:13, 4 + k: 10 + k] = 2
        label[:, -2:] = 255
        if k == 0:
            label[-1, :4] = 7  # no RoadObstacles value: ignore, and warned about
            write_webp(frames / name, image)
        else:
            write_rgb(frames / name, image)
            image = decoded(frames / name)
        stored = label.repeat(2, 0).repeat(2, 1) if k == 1 else label
        write_label(frames / f"{stem}.labels" / "labels_semantic.png", stored)
        out[stem] = (image, label)
    (root / "frame_list.json").write_text(json.dumps(names))
    return out


def killed_after(model, calls_allowed):
    """The model's forward, dying with KeyboardInterrupt at call ``calls_allowed + 1`` (a simulated kill)."""
    original, calls = model.forward, []

    def forward(x):
        calls.append(1)
        if len(calls) > calls_allowed:
            raise KeyboardInterrupt
        return original(x)

    return forward


def replace_chunk(path, name, index, array):
    """Overwrite frame ``index`` of dataset ``name`` in a converted set with ``array``, validly compressed: damage
    that leaves the file readable, found only by the per-frame digests."""
    import zlib

    import h5py

    with h5py.File(path, "r+") as f:
        dataset = f[name][str(index)]
        dataset.id.write_direct_chunk((0,) * dataset.ndim, zlib.compress(array.tobytes()))


def read_set(path):
    """({array: the frames stacked, or a list where their sizes differ}, frame ids), read without the Dataset's
    checks."""
    import h5py

    from segood.data.h5 import ARRAYS, frame_sizes, read_array

    sizes = frame_sizes(path)
    with h5py.File(path, "r") as f:
        arrays = {k: [read_array(f, k, i, size) for i, size in enumerate(sizes)] for k in ARRAYS}
        return ({k: np.stack(v) if len(set(sizes)) == 1 else v for k, v in arrays.items()},
                [s.decode() for s in f["frame_id"]])
