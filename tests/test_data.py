"""Adapters and conversion on tiny raw trees in the published layouts, checked pixel for pixel."""

import hashlib
import json

import albumentations as A
import h5py
import numpy as np
import pytest
import torch

from segood.cli import main
from segood.data import (IDD, Cityscapes, ConversionError, DatasetLayoutError, H5SegmentationDataset, Noise, Sun,
                         convert, mix, read_manifest, resize_sample)
from segood.data.sun import SunLabelMap, split_tune_eval
from segood.labels import LABEL_ID_TO_TRAIN_ID

from rawtrees import cityscapes_tree, idd_tree, read_set, sun_tree


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


def test_sun_map_anonymous_deleted_order_clip_and_size_filter(tmp_path):
    sun_tree(tmp_path / "sun")
    sun = Sun(tmp_path / "sun", "all", seed=0)
    manifest = convert(sun, tmp_path / "sun.h5", size=(660, 700), progress=False)
    arrays, frame_ids = read_set(tmp_path / "sun.h5")
    assert len(frame_ids) == 8
    skipped = {s["frame_id"]: s["reason"] for s in manifest["skipped"]}
    assert "600x600" in skipped["s/street/sun_small"] and "unreadable XML" in skipped["s/street/sun_broken"]
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


def test_sun_label_map_rules():
    m = SunLabelMap()
    # a class noun with modifiers, parts or as the head of a phrase is that class; an empty name is ignore
    assert m.lookup("Person  Sitting crop") == ("person sitting", "modifiers", "person")
    assert m.lookup("parked white car")[1:] == ("modifiers", "car") and m.lookup("car window")[1:] == ("part", "car")
    assert m.lookup("pine tree")[1:] == ("head noun", "vegetation") and m.lookup("brick wall")[1] == "ambiguous"
    assert m.lookup("toy car")[1] == "not a class" and m.values("toy car") == (1, 255)
    assert m.lookup("  ")[1] == "empty" and m.values("") == (255, 255)
    assert m.lookup("person with umbrella")[1] == "default"
    assert m.lookup("person occluded crop") == ("person", "class", "person")
    assert m.lookup("streetlight")[2] == "pole" and m.lookup("window")[2] == "building"
    assert m.lookup("wall")[1] == "ambiguous" and m.values("teapot") == (1, 255)


def test_sun_split_is_seeded_exact_and_order_free(tmp_path):
    refs = [f"frame{k}" for k in range(20)]
    tune, eval_ = split_tune_eval(refs, seed=3)
    assert len(tune) == 5 and sorted(tune + eval_) == sorted(refs) and not set(tune) & set(eval_)
    assert split_tune_eval(refs[::-1], seed=3) == (tune, eval_)
    assert split_tune_eval(refs, seed=4) != (tune, eval_)
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
    assert main(["convert", "sun", str(tmp_path / "sun"), "--out", str(out), "--size", "33", "35", "--quiet"]) == 0
    assert "3 frames" in capsys.readouterr().out  # 75% of 4 eligible
    assert read_set(out)[0]["images"].shape == (3, 33, 35, 3)
    assert main(["convert", "coverage", str(out)]) == 0
    assert "| vase |" in capsys.readouterr().out
