"""The paste generator: masks pixel for pixel against a literal point-in-polygon loop, placement rules,
determinism per seed, blending that never touches the masks, the manifest and the command line."""

import json

import numpy as np
import pytest

from segood.cli import main
from segood.data import Cityscapes, convert, read_manifest
from segood.data.paste import (BLENDS, FOOTPRINT, GROUND, MAX_WIDTH, MIN_GROUND, MIN_HEIGHT, Paste, ground_horizon,
                               place_at, polygon_mask)
from segood.data.synthetic import write_cityscapes_tree, write_sun_tree
from segood.labels import CLASS_NAMES, ID, IGNORE, OOD

from rawtrees import sun_tree

SIZE = (64, 128)


def pnpoly(points, x, y):
    """W. R. Franklin's crossing test, literally: is the point (x, y) inside the polygon (even-odd rule)?"""
    inside = False
    j = len(points) - 1
    for i in range(len(points)):
        (xi, yi), (xj, yj) = points[i], points[j]
        if (yi > y) != (yj > y) and x < (xj - xi) * (y - yi) / (yj - yi) + xi:
            inside = not inside
        j = i
    return inside


def reference_mask(points, height, width):
    """Every pixel of the frame, one at a time: its centre (x, y) inside the polygon."""
    points = [(float(x), float(y)) for x, y in points]
    return np.array([[pnpoly(points, float(x), float(y)) for x in range(width)] for y in range(height)])


def full_mask(points, height, width):
    placed = polygon_mask(np.asarray(points, np.float64), height, width)
    mask = np.zeros((height, width), bool)
    if placed is not None:
        (x0, y0), box = placed
        mask[y0:y0 + box.shape[0], x0:x0 + box.shape[1]] = box
    return mask


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    root = tmp_path_factory.mktemp("paste")
    write_cityscapes_tree(root / "cs", 0, (("val", 4),), SIZE)
    write_sun_tree(root / "sun", 2, count=6, small=0)
    return root


POLYGONS = {
    "triangle": [(3.0, 2.0), (20.0, 9.5), (7.25, 17.0)],
    "integer vertices on pixel centres": [(2, 2), (12, 2), (12, 9), (2, 9)],
    "horizontal and vertical edges, concave": [(1, 1), (15, 1), (15, 12), (8, 12), (8, 6), (1, 6)],
    "self-intersecting bow tie": [(0.5, 0.5), (18.5, 14.5), (18.5, 0.5), (0.5, 14.5)],
    "partly outside the frame": [(-6.3, -4.1), (9.7, 3.3), (30.2, 20.9), (4.4, 25.5)],
    "entirely outside": [(40, 40), (50, 40), (45, 50)],
    "thinner than a pixel": [(2.2, 3.0), (17.9, 3.4), (17.9, 3.6), (2.2, 3.2)],
}


@pytest.mark.parametrize("name", POLYGONS)
def test_polygon_mask_equals_the_literal_crossing_test(name):
    points = POLYGONS[name]
    np.testing.assert_array_equal(full_mask(points, 16, 22), reference_mask(points, 16, 22))


def test_polygon_mask_on_random_polygons():
    rng = np.random.default_rng(0)
    for _ in range(30):
        n = int(rng.integers(3, 12))
        points = rng.uniform(-3, 25, (n, 2))
        if rng.random() < 0.5:
            points = np.round(points * 2) / 2  # vertices on pixel centres and half-way between them
        np.testing.assert_array_equal(full_mask(points, 20, 24), reference_mask(points, 20, 24))


def expected_masks(adapter, ref, pastes):
    """The frame's own labels with every recorded paste rasterised by the literal loop, in order; and how many
    pastes a later one covers in part."""
    frame = Cityscapes(adapter.frames.root, adapter.split).load(ref)
    ood_mask, semantic = frame.ood_mask.copy(), frame.semantic.copy()
    objects = {o.key: o for o in adapter.ood_objects + adapter.id_objects}
    overlapped = 0
    for paste in pastes:
        obj = objects[paste["object"]]
        points = np.asarray(obj.polygon) * paste["scale"] + paste["offset"]
        mask = reference_mask(points, *ood_mask.shape)
        overlapped += paste["pixels"] < mask.sum()
        ood_mask[mask] = OOD if paste["role"] == "ood" else ID
        semantic[mask] = IGNORE if paste["role"] == "ood" else CLASS_NAMES.index(paste["class"])
        assert paste["pixels"] <= mask.sum()
    return frame, ood_mask, semantic, overlapped


@pytest.mark.parametrize("objects", ["demo", "sun"])
def test_masks_are_the_pasted_polygons_pixel_for_pixel(trees, objects):
    adapter = Paste(trees / "cs", "val", "demo" if objects == "demo" else trees / "sun", per_frame=5, negatives=2,
                    seed=5)
    assert adapter.ood_objects and adapter.id_objects
    roles, overlapped = set(), 0
    for ref in adapter.refs():
        sample = adapter.load(ref)
        pastes = sample.extra["pastes"]
        roles |= {p["role"] for p in pastes}
        frame, ood_mask, semantic, overlaps = expected_masks(adapter, ref, pastes)
        overlapped += overlaps
        np.testing.assert_array_equal(sample.ood_mask, ood_mask)
        np.testing.assert_array_equal(sample.semantic, semantic)
        changed = (sample.ood_mask != frame.ood_mask) | (sample.semantic != frame.semantic)
        assert sum(p["pixels"] for p in pastes) >= changed.sum() > 0  # a paste over its own class changes none
    assert roles == {"ood", "id"}
    assert overlapped > 0  # so the order in which pastes win was checked too


def test_placement_on_the_ground_scaled_by_distance_below_the_horizon(trees):
    adapter = Paste(trees / "cs", "val", "demo", per_frame=4, negatives=2, seed=1, height_ratio=(0.2, 0.5))
    objects = {o.key: o for o in adapter.ood_objects + adapter.id_objects}
    count = 0
    for ref in adapter.refs():
        frame = Cityscapes(trees / "cs", "val").load(ref)
        ground = np.isin(frame.semantic, GROUND)
        horizon = ground_horizon(ground)
        for paste in adapter.load(ref).extra["pastes"]:
            x, y = (int(v) for v in paste["base"])
            assert ground[y, x] and y > horizon
            polygon = np.asarray(objects[paste["object"]].polygon)
            height = paste["scale"] * np.ptp(polygon[:, 1])
            assert 0.2 * (y - horizon) - 1e-9 <= height <= 0.5 * (y - horizon) + 1e-9
            placed = polygon * paste["scale"] + paste["offset"]
            assert placed[:, 1].max() == pytest.approx(y) and placed[:, 0].min() + placed[:, 0].max() == \
                pytest.approx(2 * x)
            # at least half its footprint (its lowest 10% of rows) on ground that no earlier paste covers
            mask = reference_mask(placed, *ground.shape)
            foot = mask & (np.arange(ground.shape[0])[:, None] >= paste["base"][1] - max(1.0, FOOTPRINT * height))
            assert ground[foot].mean() >= MIN_GROUND
            ground &= ~mask
            count += 1
    assert count >= 12



def test_placement_rules_at_their_bounds():
    """A 100 x 200 frame, the horizon at row 0: at least 4 pixels tall (2% of 100 is less), at most 100 wide, half
    the footprint on the ground; each bound itself is allowed."""
    assert (MIN_HEIGHT, MAX_WIDTH, MIN_GROUND) == (0.02, 0.5, 0.5)
    ground = np.ones((100, 200), bool)
    tall = [(0, 0), (10, 0), (10, 20), (0, 20)]
    assert place_at(tall, ground, 0, (100, 8.0), 0.5) is not None  # 0.5 * 8 = 4 pixels tall
    assert place_at(tall, ground, 0, (100, 7.9), 0.5) is None
    wide = [(0, 0), (50, 0), (50, 10), (0, 10)]
    assert place_at(wide, ground, 0, (100, 40.0), 0.5) is not None  # 20 tall: scale 2, 100 wide
    assert place_at(wide, ground, 0, (100, 40.2), 0.5) is None
    narrow = [(0, 0), (4.3, 0), (4.3, 10), (0, 10)]  # placed over x 95.2 .. 103.8: columns 96 .. 103
    half = np.zeros((100, 200), bool)
    half[:, :100] = True  # columns 96 .. 99 of each footprint row on the ground: exactly half
    placement = place_at(narrow, half, 0, (99.5, 40.0), 0.5)
    assert placement is not None and placement[4].sum(axis=1).max() == 8
    half[:, 99] = False  # three of eight
    assert place_at(narrow, half, 0, (99.5, 40.0), 0.5) is None


def test_the_horizon_is_the_first_row_where_the_ground_spans():
    ground = np.zeros((10, 200), bool)
    ground[3, :1] = True  # a speck: less than 1% of the width
    ground[5, 10:13] = True
    ground[6:] = True
    assert ground_horizon(ground) == 5
    assert ground_horizon(np.zeros((4, 4), bool)) is None


def set_bytes(path):
    from segood.data.h5 import H5SegmentationDataset

    return b"".join(item[k].numpy().tobytes() for item in H5SegmentationDataset(path)
                    for k in ("image", "ood_mask", "semantic"))


def test_deterministic_per_seed_in_any_order_and_with_workers(trees, tmp_path):
    def make(seed, blend="seamless"):
        return Paste(trees / "cs", "val", "demo", blend=blend, per_frame=2, negatives=1, seed=seed)

    convert(make(3), tmp_path / "a.h5", size=SIZE, progress=False)
    convert(make(3), tmp_path / "b.h5", size=SIZE, workers=2, progress=False)
    convert(make(4), tmp_path / "c.h5", size=SIZE, progress=False)
    assert set_bytes(tmp_path / "a.h5") == set_bytes(tmp_path / "b.h5") != set_bytes(tmp_path / "c.h5")
    manifests = [read_manifest(tmp_path / f"{k}.h5") for k in "abc"]
    assert manifests[0]["pastes"] == manifests[1]["pastes"] != manifests[2]["pastes"]
    adapter = make(3)
    forward = {adapter.frame_id(r): adapter.load(r) for r in adapter.refs()}
    for ref in reversed(adapter.refs()):  # each frame draws from its own generator: order does not matter
        again = make(3).load(ref)
        first = forward[adapter.frame_id(ref)]
        assert again.image.tobytes() == first.image.tobytes() and again.extra == first.extra


def test_blending_changes_only_pasted_pixels_never_the_masks(trees):
    adapters = {blend: Paste(trees / "cs", "val", "demo", blend=blend, per_frame=3, negatives=1, seed=2)
                for blend in BLENDS}
    samples = {blend: [adapter.load(r) for r in adapter.refs()] for blend, adapter in adapters.items()}
    objects = {o.key: o for o in adapters["none"].ood_objects + adapters["none"].id_objects}
    frames = [Cityscapes(trees / "cs", "val").load(r) for r in adapters["none"].refs()]
    for k, frame in enumerate(frames):
        base = samples["none"][k]
        pasted = np.zeros(SIZE, bool)
        for paste in base.extra["pastes"]:
            polygon = np.asarray(objects[paste["object"]].polygon)
            pasted |= full_mask(polygon * paste["scale"] + paste["offset"], *SIZE)
        for blend in BLENDS:
            sample = samples[blend][k]
            np.testing.assert_array_equal(sample.ood_mask, base.ood_mask)
            np.testing.assert_array_equal(sample.semantic, base.semantic)
            strip = [{**p, "blend": "none"} for p in sample.extra["pastes"]]
            assert strip == base.extra["pastes"]
            np.testing.assert_array_equal(sample.image[~pasted], frame.image[~pasted])
        assert (samples["feather"][k].image[pasted] != base.image[pasted]).any()
        assert (samples["seamless"][k].image[pasted] != base.image[pasted]).any()


def test_cli_manifest_and_report(trees, tmp_path, capsys):
    out = tmp_path / "paste.h5"
    assert main(["convert", "paste", "--cityscapes-root", str(trees / "cs"), "--objects", str(trees / "sun"),
                 "--blend", "feather", "--negatives", "1", "--per-frame", "2", "--seed", "7", "--out", str(out),
                 "--size", *map(str, SIZE)]) == 0
    assert "4 frames" in capsys.readouterr().out
    manifest = json.loads(out.with_suffix(".manifest.json").read_text())
    assert manifest["source"] == "paste" and manifest["seed"] == 7
    params = manifest["params"]
    assert params["blend"] == "feather" and params["negatives"] == 1 and params["objects"] == str(trees / "sun")
    assert params["objects_found"]["ood"] > 0 and params["objects_found"]["left_out"]
    assert {p["frame_id"] for p in manifest["pastes"]} == set(manifest_frames(out))
    for p in manifest["pastes"]:
        assert set(p) == {"frame_id", "object", "name", "role", "class", "base", "scale", "offset", "blend", "pixels"}
        assert p["object"].endswith(tuple(f"#{k}" for k in range(40))) and ".xml#" in p["object"]
    assert manifest["pixels"]["ood"] > 0
    assert "| ood: " in out.with_suffix(".pastes.md").read_text()


def manifest_frames(path):
    import h5py

    with h5py.File(path, "r") as f:
        return [s.decode() for s in f["frame_id"]]


def test_frames_without_ground_are_skipped_and_bad_options_refused(tmp_path):
    import cv2

    write_cityscapes_tree(tmp_path / "cs", 0, (("val", 2),), SIZE)
    label = tmp_path / "cs/gtFine/val/valtown1/valtown1_000000_000001_gtFine_labelIds.png"
    cv2.imwrite(str(label), np.full(SIZE, 26, np.uint8))  # all car: nowhere to stand
    manifest = convert(Paste(tmp_path / "cs", "val", "demo"), tmp_path / "p.h5", size=SIZE, progress=False)
    assert manifest["frames"] == 1 and manifest["skipped"] == [
        {"frame_id": "val/valtown1/valtown1_000000_000001", "reason": "no road or sidewalk to paste onto"}]
    with pytest.raises(ValueError, match="blend must be one of"):
        Paste(tmp_path / "cs", "val", "demo", blend="poisson")
    with pytest.raises(ValueError, match="height_ratio"):
        Paste(tmp_path / "cs", "val", "demo", height_ratio=(0.5, 0.1))
    sun_tree(tmp_path / "sun", eligible=2)  # its objects are occluded, cropped, ambiguous or classes: none to paste
    with pytest.raises(ValueError, match="holds no object that label map 'sun' calls OOD"):
        Paste(tmp_path / "cs", "val", tmp_path / "sun")
