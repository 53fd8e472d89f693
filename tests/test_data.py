"""Adapters and conversion on tiny raw trees in the published layouts, checked pixel for pixel."""

import hashlib
import json
import re

import albumentations as A
import defusedxml.ElementTree as ET
import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data import (IDD, Cityscapes, ConversionError, DatasetLayoutError, H5SegmentationDataset, Noise, Sun,
                         convert, mix, read_manifest, resize_sample)
from segood.data.sun import SunLabelMap, kept_polygons, split_tune_eval
from segood.labels import LABEL_ID_TO_TRAIN_ID

from rawtrees import (SUN_OBJECTS, cityscapes_tree, gradient_image, idd_json, idd_tree, labelme_xml, read_set, rect,
                      sun_tree, write_label, write_rgb)


def test_cityscapes_label_ids_to_train_ids(tmp_path):
    label_ids = cityscapes_tree(tmp_path / "cs")
    manifest = convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    arrays, frame_ids = read_set(tmp_path / "cs.h5")
    assert frame_ids == ["val/frankfurt/frankfurt_000000_000294", "val/lindau/lindau_000001_000019"]
    expected_semantic = LABEL_ID_TO_TRAIN_ID[label_ids]
    assert expected_semantic[0, 30] == 0 and expected_semantic[20, 30] == 13 and expected_semantic[3, 12] == 255
    for k in range(2):
        np.testing.assert_array_equal(arrays["semantic"][k], expected_semantic)
        np.testing.assert_array_equal(arrays["ood_mask"][k], np.where(expected_semantic == 255, 255, 0))
    assert manifest["pixels"]["ood"] == 0 and manifest["frames"] == 2 and manifest["skipped"] == []
    frame_digests = b"".join(hashlib.sha256(frame.tobytes()).digest() for frame in arrays["semantic"])
    assert manifest["sha256"]["semantic"] == hashlib.sha256(frame_digests).hexdigest()


def test_idd_polygons_in_file_order(tmp_path):
    idd_tree(tmp_path / "idd")
    manifest = convert(IDD(tmp_path / "idd", "val"), tmp_path / "idd.h5", size=(40, 60), progress=False)
    arrays, frame_ids = read_set(tmp_path / "idd.h5")
    assert frame_ids == ["val/0/000100"]
    assert manifest["skipped"] == [{"frame_id": "val/1/000200", "reason": "unknown IDD label 'spaceship'"}]
    ood = np.full((40, 60), 255, np.uint8)
    sem = np.zeros((40, 60), np.uint8)  # road
    ood[5:20, 5:25], sem[5:20, 5:25] = 0, 13  # car
    ood[10:25, 20:35], sem[10:25, 20:35] = 1, 255  # autorickshaw over the car: later paints over earlier
    ood[30:36, 40:50], sem[30:36, 40:50] = 0, 13  # "cargroup" -> car; the deleted autorickshaw is not drawn
    sem[0:5, 50:60] = 10  # sky
    np.testing.assert_array_equal(arrays["ood_mask"][0], ood)
    np.testing.assert_array_equal(arrays["semantic"][0], sem)
    with pytest.raises(ConversionError, match="spaceship"):
        convert(IDD(tmp_path / "idd", "val"), tmp_path / "strict.h5", size=(40, 60), strict=True, progress=False)
    assert not (tmp_path / "strict.h5").exists()


# The official labelId -> trainId table (cityscapesscripts.helpers.labels), written out for ids 0..33; every id not
# listed (unlabeled 0, ego vehicle 1, ..., parking 9, rail track 10, guard rail 14, bridge 15, tunnel 16, polegroup
# 18, caravan 29, trailer 30) has no train class: 255.
CITYSCAPES_TRAIN_IDS = {7: 0, 8: 1, 11: 2, 12: 3, 13: 4, 17: 5, 19: 6, 20: 7, 21: 8, 22: 9, 23: 10, 24: 11, 25: 12,
                        26: 13, 27: 14, 28: 15, 31: 16, 32: 17, 33: 18}


def test_cityscapes_every_label_id_gets_its_published_train_id(tmp_path):
    cityscapes_tree(tmp_path / "cs", frames=(("bonn", "000000", "000019"),), height=4, width=34)
    label_ids = np.arange(34, dtype=np.uint8)[None].repeat(4, 0)  # column k holds label id k
    write_label(tmp_path / "cs/gtFine/val/bonn/bonn_000000_000019_gtFine_labelIds.png", label_ids)
    adapter = Cityscapes(tmp_path / "cs", "val")
    sample = adapter.load(adapter.refs()[0])
    expected = [CITYSCAPES_TRAIN_IDS.get(k, 255) for k in range(34)]
    assert sample.semantic.tolist() == [expected] * 4
    assert sample.ood_mask.tolist() == [[0 if k in CITYSCAPES_TRAIN_IDS else 255 for k in range(34)]] * 4


# IDD's level-3 names -> the official csTrainId column; None: no Cityscapes counterpart (255).
IDD_CS_TRAIN_IDS = {
    "road": 0, "parking": None, "drivable fallback": None, "sidewalk": 1, "rail track": None,
    "non-drivable fallback": 9, "person": 11, "animal": None, "rider": 12, "motorcycle": 17, "bicycle": 18,
    "autorickshaw": None, "car": 13, "truck": 14, "bus": 15, "caravan": None, "trailer": None, "train": 16,
    "vehicle fallback": None, "curb": None, "wall": 3, "fence": 4, "guard rail": None, "billboard": None,
    "traffic sign": 7, "traffic light": 6, "pole": 5, "polegroup": None, "obs-str-bar-fallback": None,
    "building": 2, "bridge": None, "tunnel": None, "vegetation": 8, "sky": 10, "fallback background": None,
    "unlabeled": None, "ego vehicle": None, "rectification border": None, "out of roi": None, "license plate": None}


def test_idd_every_label_name_gets_its_cs_train_id_and_only_car_and_autorickshaw_are_scored(tmp_path):
    """One two-column stripe per IDD label name over rows 0..5; rows 6..7 no polygon covers (unlabeled)."""
    names = list(IDD_CS_TRAIN_IDS)
    assert len(names) == 40
    height, width = 8, 2 * len(names)
    objects = [{"label": name, "polygon": rect(2 * k, 0, 2 * k + 1, 5), "deleted": 0} for k, name in enumerate(names)]
    write_rgb(tmp_path / "idd/leftImg8bit/val/0/000100_leftImg8bit.png", gradient_image(height, width))
    idd_json(tmp_path / "idd/gtFine/val/0/000100_gtFine_polygons.json", height, width, objects)
    adapter = IDD(tmp_path / "idd", "val")
    sample = adapter.load(adapter.refs()[0])
    semantic = [255 if IDD_CS_TRAIN_IDS[n] is None else IDD_CS_TRAIN_IDS[n] for n in names for _ in range(2)]
    ood = [{"car": 0, "autorickshaw": 1}.get(n, 255) for n in names for _ in range(2)]  # "polegroup" stays itself
    assert sample.semantic[:6].tolist() == [semantic] * 6 and sample.ood_mask[:6].tolist() == [ood] * 6
    assert (sample.semantic[6:] == 255).all() and (sample.ood_mask[6:] == 255).all()  # background: unlabeled


def test_sun_map_anonymous_deleted_order_clip_and_size_filter(tmp_path):
    sun_tree(tmp_path / "sun")
    sun = Sun(tmp_path / "sun", "all", seed=0)
    manifest = convert(sun, tmp_path / "sun.h5", size=(660, 700), progress=False)
    arrays, frame_ids = read_set(tmp_path / "sun.h5")
    assert len(frame_ids) == 8
    skipped = {s["frame_id"]: s["reason"] for s in manifest["skipped"]}
    unused = {u["path"]: u["reason"] for u in manifest["unused_files"]}
    assert "600x600" in unused["Images/s/street/sun_small.jpg"] and list(skipped) == ["s/street/sun_broken"]
    assert "unreadable XML" in skipped["s/street/sun_broken"]
    ood = np.full((660, 700), 255, np.uint8)
    sem = np.full((660, 700), 255, np.uint8)
    ood[0:100, 0:100], sem[0:100, 0:100] = 0, 13  # " Car  occluded" -> car
    ood[50:150, 50:150], sem[50:150, 50:150] = 255, 255  # wall: ambiguous, painted over the car
    ood[200:300, 200:300] = 1  # "vase crop" -> OOD; the anonymous vase and the deleted car are not drawn
    ood[600:, 600:], sem[600:, 600:] = 0, 2  # "Window" -> building, clipped to the image
    for k in range(8):
        np.testing.assert_array_equal(arrays["ood_mask"][k], ood)
        np.testing.assert_array_equal(arrays["semantic"][k], sem)
    rows = {r["name"]: r for r in manifest["coverage"]}
    assert rows["car"]["rule"] == "class" and rows["car"]["raw"] == [" Car  occluded"]
    assert rows["wall"]["mapped_to"] == "ignore" and rows["vase"]["mapped_to"] == "OOD"
    assert rows["vase"]["polygons"] == 8 and rows["vase"]["pixel_share"] == pytest.approx(100 * 100 / (660 * 700))
    assert "vase" in (tmp_path / "sun.coverage.md").read_text()


def test_sun_size_filter_keeps_only_frames_of_more_than_640x640_pixels(tmp_path):
    for name, (height, width) in (("exact", (640, 640)), ("one_more_row", (641, 640))):
        write_rgb(tmp_path / "sun/Images/a/abbey" / f"{name}.jpg", gradient_image(height, width))
        (tmp_path / "sun/Annotations/a/abbey").mkdir(parents=True, exist_ok=True)
        (tmp_path / "sun/Annotations/a/abbey" / f"{name}.xml").write_text(
            labelme_xml(f"{name}.jpg", "a/abbey", SUN_OBJECTS, (height, width)))
    sun = Sun(tmp_path / "sun", "all")
    assert [sun.frame_id(r) for r in sun.refs()] == ["a/abbey/one_more_row"]  # 410,240 pixels
    assert sun.unused_files == [("Images/a/abbey/exact.jpg", "640x640 = 409600 pixels <= 640x640: the size filter "
                                                             "leaves it out")] and sun.prefiltered == []


def test_sun_polygons_of_fewer_than_three_points_are_left_out():
    objects = [("car", rect(0, 0, 9, 9)[:2], "alice", 0), ("tree", rect(0, 0, 9, 9)[:3], "bob", 0)]
    kept = kept_polygons(ET.fromstring(labelme_xml("x.jpg", "a/abbey", objects)))
    assert kept == [("tree", [(0.0, 0.0), (9.0, 0.0), (9.0, 9.0)])]


def test_sun_frames_are_resized_to_the_cityscapes_size_by_default(tmp_path):
    sun_tree(tmp_path / "sun", eligible=1)
    sun = Sun(tmp_path / "sun", "eval")
    assert sun.default_size == (1024, 2048)
    convert(sun, tmp_path / "sun.h5", progress=False)
    arrays, _ = read_set(tmp_path / "sun.h5")
    assert arrays["images"].shape == (1, 1024, 2048, 3)
    # nearest neighbour from 660x700: the OOD vase (rows and columns 200..299) lands on rows 311..465, columns 586..877
    rows, cols = np.nonzero(arrays["ood_mask"][0] == 1)
    assert (rows.min(), rows.max(), cols.min(), cols.max()) == (311, 465, 586, 877)


def test_sun_label_map_rules():
    m = SunLabelMap()
    # a class noun with modifiers, parts or as the head of a phrase is that class; an empty name is ignore
    assert m.lookup("Person  Sitting crop") == ("person sitting", "modifiers", "person")
    assert m.lookup("parked white car")[1:] == ("modifiers", "car") and m.lookup("car window")[1:] == ("part", "car")
    assert m.lookup("pine tree")[1:] == ("head noun", "vegetation") and m.lookup("brick wall")[1] == "ambiguous"
    assert m.lookup("toy car")[1] == "not a class" and m.values("toy car") == (1, 255)
    assert m.lookup("toy cars")[1] == "not a class" and m.values("Toy Cars") == (1, 255)  # plurals too
    assert m.lookup("  ")[1] == "empty" and m.values("") == (255, 255)
    assert m.lookup("person with umbrella")[1] == "default"
    assert m.lookup("person occluded crop") == ("person", "class", "person")
    assert m.lookup("streetlight")[2] == "pole" and m.lookup("window")[2] == "building"
    assert m.lookup("wall")[1] == "ambiguous" and m.values("teapot") == (1, 255)


def test_a_bad_label_map_is_named_with_what_to_give(tmp_path):
    with pytest.raises(FileNotFoundError, match=rf"^no label map file {tmp_path / 'missing.yaml'} \(--label-map: a "
                                                r"\.yaml file, or a shipped map: idd, sun\)$"):
        SunLabelMap(str(tmp_path / "missing.yaml"))
    (tmp_path / "mine").write_text("default: ood\n")  # a file, without the suffix: not "not found"
    for name in (str(tmp_path / "mine"), "suN"):
        with pytest.raises(FileNotFoundError, match=rf"^label map '{re.escape(name)}' is neither a shipped map \(idd, "
                                                    r"sun\) nor a file ending in \.yaml \(--label-map\)$"):
            SunLabelMap(name)
    (tmp_path / "mine.yaml").write_text("version: 1\ndefault: ood\n")  # (no classes: a bare KeyError)
    with pytest.raises(ValueError, match=r"mine\.yaml lacks \['classes'\]: is it another dataset's map\?"):
        SunLabelMap(str(tmp_path / "mine.yaml"))


def test_sun_split_is_seeded_exact_and_order_free(tmp_path):
    refs = [f"frame{k}" for k in range(20)]
    tune, eval_ = split_tune_eval(refs, seed=3)
    assert len(tune) == 5 and sorted(tune + eval_) == sorted(refs) and not set(tune) & set(eval_)
    assert split_tune_eval(refs[::-1], seed=3) == (tune, eval_)
    assert split_tune_eval(refs, seed=4) != (tune, eval_)
    assert [len(split_tune_eval(refs[:n], seed=0)[0]) for n in (3, 4, 7, 11)] == [1, 1, 2, 3]  # rounded, not cut
    sun_tree(tmp_path / "sun")
    a, b = Sun(tmp_path / "sun", "tune", seed=0), Sun(tmp_path / "sun", "eval", seed=0)
    assert len(a.refs()) == 2 and len(b.refs()) == 6 and not set(a.refs()) & set(b.refs())


NOISE_SHA256 = {  # fixed seed -> fixed bytes on every machine
    "perlin": "c65e81a49c9733a3737963abba6ef26199cbc3531f48d3990e0d742f1cfe9e8f",
    "normal": "18dbee08e0eac89dc0ca7a9b3ff3c59f4d9ebf27518ab115565553140edb09bc",
}


@pytest.mark.parametrize("kind", ["perlin", "normal"])
def test_noise_is_deterministic(kind):
    noise = Noise(kind, count=2, size=(24, 48), seed=7)
    first, again = noise.load(1), Noise(kind, count=5, size=(24, 48), seed=7).load(1)
    np.testing.assert_array_equal(first.image, again.image)
    assert hashlib.sha256(first.image.tobytes()).hexdigest() == NOISE_SHA256[kind]
    assert (first.ood_mask == 1).all() and (first.semantic == 255).all()
    assert not np.array_equal(first.image, noise.load(0).image)


def test_a_perlin_octave_is_gradient_noise_pixel_by_pixel():
    """perlin_octave (whole arrays, each corner's gradients gathered once) against Perlin's formula at each pixel:
    the dot products of its cell's four corner gradients with its offsets from them, blended by 6t^5 - 15t^4 + 10t^3."""
    from segood.data.noise import _GRADIENTS, perlin_octave

    height, width, cells = 9, 20, 3
    got = perlin_octave(np.random.default_rng(4), height, width, cells)
    grad = _GRADIENTS[np.random.default_rng(4).integers(0, len(_GRADIENTS), (2, cells + 1))]  # (cells_y = 1)
    fade = lambda t: t * t * t * (t * (t * 6 - 15) + 10)  # noqa: E731
    for i in range(height):
        for j in range(width):
            y, x = i * 1 / height, j * cells / width
            cy, cx = int(y), int(x)
            dot = {(a, b): grad[cy + a, cx + b] @ (x - cx - b, y - cy - a) for a in (0, 1) for b in (0, 1)}
            top = dot[0, 0] + fade(x - cx) * (dot[0, 1] - dot[0, 0])
            bottom = dot[1, 0] + fade(x - cx) * (dot[1, 1] - dot[1, 0])
            assert got[i, j] == pytest.approx(top + fade(y - cy) * (bottom - top), abs=1e-12)


def test_set_attributes_record_provenance(tmp_path):
    manifest = convert(Noise("perlin", 1, size=(8, 16), seed=5, frequency=2, octaves=3), tmp_path / "p.h5",
                       size=(8, 16), progress=False)
    with h5py.File(tmp_path / "p.h5", "r") as f:
        assert f.attrs["source"] == "perlin_noise" and f.attrs["seed"] == 5
        assert json.loads(f.attrs["params"]) == {"frequency": 2, "octaves": 3}
        assert f.attrs["segood_version"] and json.loads(f.attrs["resize"]) == [8, 16]  # lists and dicts as JSON
    assert manifest["params"] == {"frequency": 2, "octaves": 3} and manifest["pixels"]["ood"] == 128


def test_masks_never_interpolated():
    rng = np.random.default_rng(0)
    idd_like = rng.choice(np.array([0, 1, 255], np.uint8), (37, 53))
    from segood.data.common import Sample

    sample = Sample(rng.integers(0, 256, (37, 53, 3), dtype=np.uint8), idd_like, idd_like.copy(), "x")
    for size in ((100, 160), (16, 20), (37, 90)):
        assert set(np.unique(resize_sample(sample, size).ood_mask)) <= {0, 1, 255}
    augment = A.Compose([A.RandomScale(0.5, p=1), A.Rotate(limit=30, p=1), A.PadIfNeeded(64, 64),
                         A.RandomCrop(64, 64), A.HorizontalFlip(p=1)], seed=0)
    out = augment(image=sample.image, masks=[sample.ood_mask])
    assert set(np.unique(out["masks"][0])) <= {0, 1, 255}


def test_dataset_with_dataloader_workers_and_mix(tmp_path):
    cityscapes_tree(tmp_path / "cs")
    convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    convert(Noise("perlin", 3, size=(32, 64), seed=1), tmp_path / "perlin.h5", size=(32, 64), workers=2,
            progress=False)
    manifest = mix(tmp_path / "perlin.h5", tmp_path / "cs.h5", tmp_path / "mixed.h5", seed=0, progress=False)
    assert manifest["frames"] == 5 and manifest["id_to_ood_ratio"] == pytest.approx(
        manifest["pixels"]["id"] / (3 * 32 * 64))
    again = mix(tmp_path / "perlin.h5", tmp_path / "cs.h5", tmp_path / "mixed2.h5", seed=0, progress=False)
    assert again["sha256"] == manifest["sha256"]  # deterministic order
    with pytest.raises(ValueError, match="frame id 'perlin_noise/.*' comes twice"):  # a set mixed with itself
        mix(tmp_path / "perlin.h5", tmp_path / "perlin.h5", tmp_path / "self.h5", progress=False)
    assert not (tmp_path / "self.h5").exists()

    dataset = H5SegmentationDataset(tmp_path / "mixed.h5")
    loader = torch.utils.data.DataLoader(dataset, batch_size=2, num_workers=2)
    frames = [fid for batch in loader for fid in batch["frame_id"]]
    arrays, frame_ids = read_set(tmp_path / "mixed.h5")
    assert frames == frame_ids and {f.split("/")[0] for f in frames} == {"perlin_noise", "cityscapes"}
    item = dataset[1]
    assert item["image"].shape == (3, 32, 64) and item["image"].dtype == torch.uint8
    np.testing.assert_array_equal(item["ood_mask"].numpy(), arrays["ood_mask"][1])


def test_mix_takes_the_asked_number_of_id_frames(tmp_path):
    cityscapes_tree(tmp_path / "cs")
    convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", progress=False)
    convert(Noise("normal", 2, size=(32, 64)), tmp_path / "n.h5", progress=False)
    for id_frames, expected in ((0, 0), (1, 1), (5, 2)):  # at most every frame of the ID set
        manifest = mix(tmp_path / "n.h5", tmp_path / "cs.h5", tmp_path / f"m{id_frames}.h5", id_frames=id_frames,
                       progress=False)
        sources = [frame_id.split("/")[0] for frame_id in read_set(tmp_path / f"m{id_frames}.h5")[1]]
        assert sorted(sources) == ["cityscapes"] * expected + ["normal_noise"] * 2
        # each Cityscapes frame: 32 x 64 pixels, 348 of them without a train class
        assert manifest["frames"] == 2 + expected and manifest["pixels"]["id"] == expected * (32 * 64 - 348)


def test_atomic_output_and_overwrite(tmp_path):
    class Interrupted(Noise):
        def load(self, index):
            if index == 2:
                raise KeyboardInterrupt
            return super().load(index)

    with pytest.raises(KeyboardInterrupt):
        convert(Interrupted("normal", 4, size=(8, 8)), tmp_path / "n.h5", size=(8, 8), progress=False)
    assert list(tmp_path.iterdir()) == []  # no half-written set, no partial file
    convert(Noise("normal", 2, size=(8, 8)), tmp_path / "n.h5", size=(8, 8), progress=False)
    with pytest.raises(FileExistsError, match="--overwrite"):
        convert(Noise("normal", 2, size=(8, 8)), tmp_path / "n.h5", size=(8, 8), progress=False)
    assert read_manifest(tmp_path / "n.h5")["frames"] == 2


def test_bad_raw_input(tmp_path, capsys):
    with pytest.raises(DatasetLayoutError, match="Expected:"):
        IDD(tmp_path, "val")
    cityscapes_tree(tmp_path / "cs")
    broken = next((tmp_path / "cs").glob("leftImg8bit/val/*/*.png"))
    broken.write_bytes(b"not a png")
    manifest = convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    assert manifest["frames"] == 1 and "cannot decode image" in manifest["skipped"][0]["reason"]
    sun_tree(tmp_path / "sun", eligible=2)
    bomb = ('<?xml version="1.0"?><!DOCTYPE lolz [<!ENTITY lol "lol"><!ENTITY lol2 "&lol;&lol;&lol;">]>'
            "<annotation><object><name>&lol2;</name></object></annotation>")
    (tmp_path / "sun" / "Annotations" / "a" / "abbey" / "sun_frame00.xml").write_text(bomb)
    sun = Sun(tmp_path / "sun", "all")
    assert any("Entities" in reason for _, reason in sun.prefiltered)
    assert main(["convert", "sun", str(tmp_path / "nowhere"), "--out", str(tmp_path / "x.h5")]) == 2
    assert "Annotations/<letter>" in capsys.readouterr().err


def test_convert_cli_and_coverage(tmp_path, capsys):
    sun_tree(tmp_path / "sun", eligible=4)
    out = tmp_path / "sun_eval.h5"
    assert main(["convert", "sun", str(tmp_path / "sun"), "--out", str(out), "--size", "33", "35"]) == 0
    assert "3 frames" in capsys.readouterr().out  # 75% of 4 eligible
    assert read_set(out)[0]["images"].shape == (3, 33, 35, 3)
    assert main(["convert", "coverage", str(out)]) == 0
    assert "| vase |" in capsys.readouterr().out


def test_perlin_lattices_finer_than_the_pixels_are_refused_before_any_work(tmp_path, capsys):
    """frequency * 2**(octaves - 1) lattice cells across the finest octave, at most the width: beyond, an octave
    adds nothing a pixel shows and its lattice alone took 32 GiB after a minute's work (--octaves 20)."""
    with pytest.raises(ValueError, match=r"^Perlin noise of frequency 4 and 20 octaves would have frequency \* "
                                         r"2\*\*\(octaves - 1\) lattice cells across its finest octave, more than the "
                                         r"frame's 128 pixels of width: that product must be at most 128 \(fewer "
                                         r"--octaves, a lower --frequency or a larger --size\)$"):
        Noise("perlin", 1, size=(64, 128), octaves=20)
    with pytest.raises(ValueError, match=r"frequency 100000 and 4 octaves"):
        Noise("perlin", 1, size=(64, 128), frequency=100000)
    with pytest.raises(ValueError, match=r"frequency 4 and 100000 octaves"):  # (refused without computing 2**99999)
        Noise("perlin", 1, size=(64, 128), octaves=100000)
    Noise("perlin", 1, size=(8, 16), frequency=2, octaves=4)  # 16 cells across 16 pixels: the limit itself
    with pytest.raises(ValueError, match="frequency 2 and 5 octaves"):
        Noise("perlin", 1, size=(8, 16), frequency=2, octaves=5)
    Noise("normal", 1, size=(8, 16), frequency=100000)  # normal noise has no lattice
    out = tmp_path / "o.h5"
    assert main(["convert", "noise", "--kind", "perlin", "--count", "1", "--octaves", "20", "--size", "64", "128",
                 "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("segood convert: error: Perlin noise of frequency 4 and 20 octaves") and err.count("\n") == 1
    assert not out.exists()


def test_mix_refuses_an_output_that_is_one_of_its_inputs(tmp_path, capsys):
    cityscapes_tree(tmp_path / "cs")
    convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    convert(Noise("normal", 2, size=(32, 64)), tmp_path / "n.h5", progress=False)
    before = read_manifest(tmp_path / "n.h5")
    (tmp_path / "link.h5").symlink_to(tmp_path / "n.h5")
    for out in (tmp_path / "n.h5", tmp_path / "sub" / ".." / "cs.h5", tmp_path / "link.h5"):  # compared resolved
        with pytest.raises(ValueError, match="is one of the input sets; write the output to another path"):
            mix(tmp_path / "n.h5", tmp_path / "cs.h5", out, overwrite=True, progress=False)
    assert main(["convert", "mix", "--ood", str(tmp_path / "n.h5"), "--id", str(tmp_path / "cs.h5"), "--out",
                 str(tmp_path / "n.h5"), "--overwrite", "--quiet"]) == 2
    assert "is one of the input sets" in capsys.readouterr().err
    assert read_manifest(tmp_path / "n.h5") == before and read_manifest(tmp_path / "cs.h5")["frames"] == 2


def test_an_annotation_with_nothing_to_paint_is_an_unused_file_not_a_failure(tmp_path):
    """SUN: every polygon deleted, anonymous or of fewer than 3 points; IDD: every polygon deleted. A rule of the
    dataset, as SUN's size filter: listed under unused_files, and --strict conversions succeed with it."""
    sun_tree(tmp_path / "sun", eligible=2)
    (tmp_path / "sun" / "Annotations" / "s" / "street" / "sun_broken.xml").unlink()  # (its own failure)
    nothing = [("vase", rect(0, 0, 9, 9), "anonymous", 0), ("car", rect(0, 0, 9, 9), "dave", 1),
               ("road", [[0, 0], [5, 5]], "erin", 0)]
    (tmp_path / "sun" / "Annotations" / "a" / "abbey" / "sun_frame00.xml").write_text(
        labelme_xml("sun_frame00.jpg", "a/abbey", nothing, (660, 700)))
    manifest = convert(Sun(tmp_path / "sun", "all"), tmp_path / "sun.h5", size=(33, 35), strict=True,
                       progress=False)
    assert manifest["frames"] == 1 and manifest["skipped"] == []
    assert {"path": "Annotations/a/abbey/sun_frame00.xml", "reason": "an annotation with no polygon to paint (each "
            "deleted, anonymous or of fewer than 3 points)"} in manifest["unused_files"]

    idd_tree(tmp_path / "idd")
    idd_json(tmp_path / "idd" / "gtFine" / "val" / "1" / "000200_gtFine_polygons.json", 40, 60,
             [{"label": "car", "polygon": rect(0, 0, 5, 5), "deleted": 1}])
    manifest = convert(IDD(tmp_path / "idd", "val"), tmp_path / "idd.h5", size=(40, 60), strict=True,
                       progress=False)
    assert manifest["frames"] == 1 and manifest["skipped"] == []
    assert manifest["unused_files"] == [{"path": "gtFine/val/1/000200_gtFine_polygons.json",
                                         "reason": "an annotation with no polygon that is not deleted"}]


def test_mix_refuses_a_mixed_set_as_either_input(tmp_path, capsys):
    """A mixed set already holds ID frames: as --ood they would come twice, as --id its OOD frames would count."""
    cityscapes_tree(tmp_path / "cs")
    convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(32, 64), progress=False)
    convert(Noise("normal", 2, size=(32, 64)), tmp_path / "n.h5", progress=False)
    mix(tmp_path / "n.h5", tmp_path / "cs.h5", tmp_path / "m.h5", progress=False)
    for ood, id_, role in (("m.h5", "cs.h5", "OOD"), ("n.h5", "m.h5", "ID")):
        with pytest.raises(ValueError, match=rf"m\.h5 is already a mixed set \(of \S+n\.h5 and \S+cs\.h5\); "
                                             rf"give the {role} set itself$"):
            mix(tmp_path / ood, tmp_path / id_, tmp_path / "again.h5", progress=False)
    assert main(["convert", "mix", "--ood", str(tmp_path / "m.h5"), "--id", str(tmp_path / "cs.h5"), "--out",
                 str(tmp_path / "again.h5"), "--quiet"]) == 2
    assert "is already a mixed set" in capsys.readouterr().err and not (tmp_path / "again.h5").exists()


def test_a_directory_as_output_is_refused_before_converting(tmp_path, capsys):
    class Untouchable(Noise):
        def load(self, index):
            raise AssertionError("converted a frame for an output that cannot be written")

    folder = tmp_path / "sets"
    folder.mkdir()
    for overwrite in (False, True):  # not "exists; pass --overwrite", which then failed after converting everything
        with pytest.raises(IsADirectoryError, match="sets is a directory; the output must be the path of an .h5 file"):
            convert(Untouchable("normal", 2, size=(8, 8)), folder, overwrite=overwrite, progress=False)
    cityscapes_tree(tmp_path / "cs")
    for more in ([], ["--overwrite"]):
        assert main(["convert", "cityscapes", str(tmp_path / "cs"), "--out", str(folder), "--quiet", *more]) == 2
        assert "sets is a directory; the output must be the path of an .h5 file" in capsys.readouterr().err
    assert main(["convert", "sun", str(tmp_path / "nowhere"), "--out", str(folder)]) == 2  # before the listing
    assert "sets is a directory" in capsys.readouterr().err
    assert list(folder.iterdir()) == [] and sorted(p.name for p in tmp_path.iterdir()) == ["cs", "sets"]


def test_frames_left_out_by_the_size_filter_are_no_failure_under_strict(tmp_path):
    """SUN's documented size filter (at most 640x640 pixels) is a rule, not a failure: with real SUN2012 a strict
    conversion could never succeed. A frame that cannot be read still fails it."""
    from segood.data.synthetic import write_sun_tree

    write_sun_tree(tmp_path / "sun", count=3, size=(660, 700), small=2)
    manifest = convert(Sun(tmp_path / "sun", "all"), tmp_path / "sun.h5", size=(33, 35), strict=True, progress=False)
    assert manifest["frames"] == 3 and manifest["skipped"] == []
    assert [u["reason"] for u in manifest["unused_files"]] == [
        "600x600 = 360000 pixels <= 640x640: the size filter leaves it out"] * 2
    write_sun_tree(tmp_path / "small", count=0, small=2)
    with pytest.raises(ConversionError, match=r"\(0 skipped: the adapter listed no frame; 2 files of the raw tree not "
                                              r"used, e.g. Images/l/living_room/sun_demo0001.jpg: 600x600"):
        convert(Sun(tmp_path / "small", "all"), tmp_path / "small.h5", strict=True, progress=False)
    image = tmp_path / "sun/Images/s/street/sun_demo0000.jpg"
    image.write_bytes(image.read_bytes()[:2000])  # the header reads, the pixels do not
    with pytest.raises(ConversionError, match="s/street/sun_demo0000: cannot decode image sun_demo0000.jpg "
                                              "completely"):
        convert(Sun(tmp_path / "sun", "all"), tmp_path / "truncated.h5", size=(33, 35), strict=True, progress=False)
    (tmp_path / "sun/Annotations/l/living_room/sun_demo0001.xml").write_text("<annotation><object>")
    with pytest.raises(ConversionError, match="l/living_room/sun_demo0001: unreadable XML"):
        convert(Sun(tmp_path / "sun", "all"), tmp_path / "broken.h5", size=(33, 35), strict=True, progress=False)
