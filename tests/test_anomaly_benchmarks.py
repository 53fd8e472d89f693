"""Today's anomaly-segmentation benchmarks (SMIYC, LostAndFound, Fishyscapes, StreetHazards, BDD-Anomaly,
Road Anomaly, RoadObstacles v0) on tiny raw trees in their published layouts, with their gotchas, checked pixel for
pixel."""

import io
import json
import shutil
import zipfile

import h5py
import numpy as np
import pytest

from segood.cli import main
from segood.data import Cityscapes, ConversionError, convert, mix, read_manifest
from segood.data.common import DatasetLayoutError
from segood.data.convert import ConversionWarning
from segood.data.h5 import UnlabelledFrames, require_labels, set_identity
from segood.data.bdd_anomaly import BDDAnomaly
from segood.data.lostandfound import LostAndFound
from segood.data.registry import ADAPTERS, get_adapter
from segood.data.road_anomaly import RoadAnomaly, RoadObstaclesV0
from segood.data.smiyc import RoadAnomaly21, RoadObstacle21
from segood.data.streethazards import StreetHazards

from rawtrees import (LAF_EMPTY, LAF_FRAMES, bdd_tree, cityscapes_tree, fishyscapes_laf_tree, fishyscapes_static_tree,
                      gradient_image, laf_tree, read_set, road_anomaly_tree, road_obstacles_v0_tree, smiyc_tree,
                      streethazards_tree, write_label, write_rgb, write_webp)


def smiyc_expected(label):
    """The rule written out: 0 -> ID, 1 -> OOD, every other value -> ignore."""
    return np.where(label == 0, 0, np.where(label == 1, 1, 255)).astype(np.uint8)


ANOMALY_FRAMES = [("validation0000", True), ("validation0001", True), ("zebra0001", False), ("cow0007", False)]
OBSTACLE_FRAMES = [("validation_1", True), ("validation_19", True), ("validation_25", True), ("validation_30", True),
                   ("gravel_000", False), ("curvy-street_003", False), ("driveway_001", False),
                   ("snowstorm1_000", False), ("snowstorm2_004", False), ("marsbase_000", False)]


@pytest.mark.parametrize("split, expected", [
    ("validation", ["validation0000", "validation0001"]), ("test", ["cow0007", "zebra0001"]),
    ("all", ["cow0007", "validation0000", "validation0001", "zebra0001"])])
def test_smiyc_anomaly_splits_labels_and_unlabelled_test_frames(tmp_path, split, expected):
    frames = smiyc_tree(tmp_path / "dataset_AnomalyTrack", "dataset_AnomalyTrack", ANOMALY_FRAMES)
    lonely = tmp_path / "dataset_AnomalyTrack" / "labels_masks" / "validation0002_labels_semantic.png"
    shutil.copy(lonely.with_name("validation0000_labels_semantic.png"), lonely)  # (a download cut short)
    adapter = RoadAnomaly21(tmp_path / "dataset_AnomalyTrack", split)
    manifest = convert(adapter, tmp_path / "a.h5", size=(24, 40), progress=False)
    arrays, frame_ids = read_set(tmp_path / "a.h5")
    assert frame_ids == expected
    for k, fid in enumerate(frame_ids):
        image, label = frames[fid]
        np.testing.assert_array_equal(arrays["images"][k], image)
        if label is None:
            assert (arrays["ood_mask"][k] == 255).all()
        else:
            np.testing.assert_array_equal(arrays["ood_mask"][k], smiyc_expected(label))
        assert (arrays["semantic"][k] == 255).all()
    assert manifest.get("unlabelled_frames", []) == [f for f in expected if frames[f][1] is None]
    unused = {u["path"]: u["reason"] for u in manifest["unused_files"]}
    assert unused["labels_masks/validation0000_labels_semantic_color.png"].startswith("not a label file")
    assert unused["labels_masks/validation0002_labels_semantic.png"] == "no image images/validation0002.jpg"
    if split == "validation":
        assert unused["images/zebra0001.jpg"] == "a test frame (the split is validation)"


def test_frames_without_labels_can_be_exported_never_evaluated(tmp_path):
    smiyc_tree(tmp_path / "track", "dataset_AnomalyTrack", ANOMALY_FRAMES)
    convert(RoadAnomaly21(tmp_path / "track", "all"), tmp_path / "all.h5", size=(24, 40), progress=False)
    convert(RoadAnomaly21(tmp_path / "track", "validation"), tmp_path / "val.h5", size=(24, 40), progress=False)
    require_labels(tmp_path / "val.h5")
    with pytest.raises(UnlabelledFrames, match=r"2 frames without public labels \(cow0007, zebra0001\).*exported"):
        require_labels(tmp_path / "all.h5")
    from segood.evaluation.api import _open_set
    with pytest.raises(UnlabelledFrames, match="never evaluated"):
        _open_set(tmp_path / "all.h5")


@pytest.mark.parametrize("split, expected", [
    ("validation", ["validation_1", "validation_30"]),
    ("test", ["curvy-street_003", "gravel_000"]),
    ("night", ["driveway_001"]),
    ("snowstorm", ["snowstorm1_000", "snowstorm2_004"]),
    ("all", ["curvy-street_003", "driveway_001", "gravel_000", "snowstorm1_000", "snowstorm2_004", "validation_1",
             "validation_19", "validation_25", "validation_30"])])  # as SMIYC's ObstacleTrack-all: every frame
def test_smiyc_obstacle_scene_splits_from_webp(tmp_path, split, expected):
    frames = smiyc_tree(tmp_path / "dataset_ObstacleTrack", "dataset_ObstacleTrack", OBSTACLE_FRAMES)
    adapter = RoadObstacle21(tmp_path / "dataset_ObstacleTrack", split)
    assert adapter.default_size is None  # frames keep their native size unless --size says otherwise
    manifest = convert(adapter, tmp_path / "o.h5", size=(24, 40), progress=False)
    arrays, frame_ids = read_set(tmp_path / "o.h5")
    assert frame_ids == expected
    for k, fid in enumerate(frame_ids):
        image, label = frames[fid]
        np.testing.assert_array_equal(arrays["images"][k], image)  # lossless WebP, decoded exactly
        expected_mask = np.full((24, 40), 255) if label is None else smiyc_expected(label)
        np.testing.assert_array_equal(arrays["ood_mask"][k], expected_mask)
    unused = {u["path"]: u["reason"] for u in manifest["unused_files"]}
    assert "none of RoadObstacle21's" in unused["images/marsbase_000.webp"]
    if split == "validation":
        assert unused["images/validation_19.webp"] == "left out of SMIYC's RoadObstacle21 validation split"
        assert "validation_25" not in " ".join(frame_ids)
        assert "unlabelled_frames" not in manifest


def test_smiyc_layout_errors_and_split_names(tmp_path):
    smiyc_tree(tmp_path / "dataset_ObstacleTrack", "dataset_ObstacleTrack", OBSTACLE_FRAMES[:1])
    with pytest.raises(FileNotFoundError, match=r"images/<fid>\.jpg"):
        RoadAnomaly21(tmp_path / "dataset_ObstacleTrack")
    with pytest.raises(ValueError, match="night"):
        RoadObstacle21(tmp_path / "dataset_ObstacleTrack", "val")
    (tmp_path / "dataset_ObstacleTrack/labels_masks/validation_1_labels_semantic.png").unlink()
    with pytest.raises(ConversionError, match="no label file validation_1_labels_semantic.png for a validation frame"):
        convert(RoadObstacle21(tmp_path / "dataset_ObstacleTrack"), tmp_path / "x.h5", size=(8, 8), progress=False)


def test_smiyc_obstacle_splits_are_the_benchmarks_scene_lists_and_left_out_validation_frames(tmp_path):
    """RoadObstacle21's scenes per split as road-anomaly-benchmark lists them (ObstacleTrack-test: every scene but
    snowstorm1, snowstorm2 and driveway), and the validation frames SMIYC leaves out: 19 and 21..29."""
    test_scenes = ["curvy-street", "darkasphalt", "darkasphalt2", "gravel", "greyasphalt", "motorway", "one-way-street",
                   "paving"]
    frames = [(f"{scene}_000", False) for scene in test_scenes + ["driveway", "snowstorm1", "snowstorm2"]]
    frames += [(f"validation_{n}", True) for n in (18, 19, 20, 21, 22, 28, 29, 30)]
    smiyc_tree(tmp_path / "track", "dataset_ObstacleTrack", frames, height=4, width=6)
    listed = {split: [path.stem for path in RoadObstacle21(tmp_path / "track", split).refs()]
              for split in ("test", "night", "snowstorm", "validation", "all")}
    assert listed["test"] == sorted(f"{scene}_000" for scene in test_scenes)
    assert listed["night"] == ["driveway_000"] and listed["snowstorm"] == ["snowstorm1_000", "snowstorm2_000"]
    assert listed["validation"] == ["validation_18", "validation_20", "validation_30"]
    assert sorted(listed["all"]) == sorted(fid for fid, _ in frames)


def test_smiyc_values_other_than_0_and_1_are_ignore(tmp_path):
    smiyc_tree(tmp_path / "track", "dataset_AnomalyTrack", [("validation0000", True)], height=2, width=3)
    raw = np.array([[0, 1, 2], [3, 254, 255]], np.uint8)
    write_label(tmp_path / "track/labels_masks/validation0000_labels_semantic.png", raw)
    adapter = RoadAnomaly21(tmp_path / "track")
    assert adapter.load(adapter.refs()[0]).ood_mask.tolist() == [[0, 1, 255], [255, 255, 255]]


def test_every_new_adapter_is_registered_with_a_convert_command(capsys):
    for name in ("smiyc_anomaly", "smiyc_obstacle", "lostandfound", "fishyscapes_laf", "fishyscapes_static",
                 "streethazards", "bdd_anomaly", "road_anomaly", "road_obstacles_v0"):
        assert name in ADAPTERS
        with pytest.raises(SystemExit):
            main(["convert", name, "--help"])
        assert "--split" in capsys.readouterr().out or ADAPTERS[name].default_split is None


def laf_expected(label):
    ood = np.full(label.shape, 255, np.uint8)
    ood[label == 1] = 0
    ood[(label >= 2) & (label <= 200)] = 1
    return ood, np.where(label == 1, 0, 255).astype(np.uint8)


@pytest.mark.parametrize("split", ["train", "test", "testNoKnown"])
def test_lostandfound_splits_rules_and_gamma(tmp_path, split):
    frames = laf_tree(tmp_path / "laf")
    manifest = convert(LostAndFound(tmp_path / "laf", split), tmp_path / "laf.h5", size=(16, 32), progress=False)
    arrays, frame_ids = read_set(tmp_path / "laf.h5")
    folder = "train" if split == "train" else "test"
    expected = sorted(LAF_FRAMES[folder])
    if split == "testNoKnown":
        expected = ["02_Hanns_Klemm_Str_44_000015_000200", "04_Maurener_Weg_8_000002_000140"]
        unused = {u["path"].split("/")[-1]: u["reason"] for u in manifest["unused_files"]}
        assert unused == {
            "01_Hanns_Klemm_Str_45_000006_000070_leftImg8bit.png": "testNoKnown leaves out frames with known classes "
                                                                   "(bicycles)",
            "10_Schlossberg_9_000004_000030_leftImg8bit.png": "testNoKnown leaves out frames with known classes "
                                                              "(bicycles)",
            "15_Rechbergstr_Deckenpfronn_000000_000010_leftImg8bit.png": "testNoKnown leaves out frames with known "
                                                                         "classes (children)",
            f"{LAF_EMPTY}_leftImg8bit.png": "testNoKnown leaves out frames whose label has no ID and no OOD pixel"}
    assert frame_ids == [f"{folder}/{fid}" for fid in expected]
    for k, fid in enumerate(expected):
        image, label = frames[fid]
        ood, semantic = laf_expected(label)
        if fid != LAF_EMPTY:
            assert (label == 31).any() and (ood[label == 31] == 1).all()  # a "non-hazard" id is OOD too
        np.testing.assert_array_equal(arrays["images"][k], image)  # raw values: the gAMA chunk is not applied
        np.testing.assert_array_equal(arrays["ood_mask"][k], ood)
        np.testing.assert_array_equal(arrays["semantic"][k], semantic)


def test_lostandfound_test_no_known_drops_empty_labels_and_the_known_class_frames_only(tmp_path):
    """A frame with free space and no object stays (its label is not empty); 01_Hanns_Klemm_Str_45_000007 shows
    bicycles, 01_Hanns_Klemm_Str_45_000008 does not."""
    fids = {"01_Hanns_Klemm_Str_45_000007_000050": 1, "01_Hanns_Klemm_Str_45_000008_000040": 1,
            "05_Schafgasse_1_000001_000100": 0}  # fid -> the label's only value (1 free space, 0 unlabelled)
    for fid, value in fids.items():
        scene = fid[: -len("_000000_000000")]
        write_rgb(tmp_path / "laf/leftImg8bit/test" / scene / f"{fid}_leftImg8bit.png", gradient_image(4, 6))
        write_label(tmp_path / "laf/gtCoarse/test" / scene / f"{fid}_gtCoarse_labelIds.png", np.full((4, 6), value))
    adapter = LostAndFound(tmp_path / "laf", "testNoKnown")
    assert [adapter.frame_id(path) for path in adapter.refs()] == ["test/01_Hanns_Klemm_Str_45_000008_000040"]
    assert (adapter.load(adapter.refs()[0]).ood_mask == 0).all()
    reasons = {path.split("/")[-1]: reason for path, reason in adapter.unused_files}
    assert reasons == {
        "01_Hanns_Klemm_Str_45_000007_000050_leftImg8bit.png": "testNoKnown leaves out frames with known classes "
                                                               "(bicycles)",
        "05_Schafgasse_1_000001_000100_leftImg8bit.png": "testNoKnown leaves out frames whose label has no ID and no "
                                                         "OOD pixel"}


def test_fishyscapes_lost_and_found_takes_images_from_lostandfound(tmp_path):
    frames = laf_tree(tmp_path / "laf")
    fids = [LAF_FRAMES["train"][0], LAF_FRAMES["test"][1]]
    labels = fishyscapes_laf_tree(tmp_path / "fs_laf", fids)
    adapter = get_adapter("fishyscapes_laf")(tmp_path / "fs_laf", tmp_path / "laf")
    with pytest.warns(ConversionWarning, match="Fishyscapes label values outside its published table became ignore: 9"):
        manifest = convert(adapter, tmp_path / "fs.h5", size=(16, 32), progress=False)
    arrays, frame_ids = read_set(tmp_path / "fs.h5")
    assert frame_ids == [f"0000_{fids[0]}", f"0001_{fids[1]}"]
    assert manifest["skipped"] == [{"frame_id": "0002_07_Nowhere_000000_000000", "reason":
                                    "no LostAndFound image 07_Nowhere_000000_000000_leftImg8bit.png in "
                                    "leftImg8bit/train or test"}]
    for k, (frame_id, fid) in enumerate(zip(frame_ids, fids)):
        label = labels[frame_id]
        np.testing.assert_array_equal(arrays["images"][k], frames[fid][0])
        expected = np.where(label == 9, 255, label)  # 9 is no Fishyscapes value: ignore, and warned about
        np.testing.assert_array_equal(arrays["ood_mask"][k], expected)
        assert (arrays["semantic"][k] == 255).all()
    assert manifest["unknown_label_values"] == {"9": {"pixels": 2, "frames": 2}}
    assert manifest["unused_files"] == [{"path": "README.txt", "reason": "not a frame file of this layout"}]
    assert manifest["params"] == {"lostandfound_root": str(tmp_path / "laf")}
    with pytest.raises(DatasetLayoutError, match=rf"^{tmp_path / 'nowhere'} does not look like the lostandfound "
                                                 r"dataset \(--lostandfound-root\): no file matches"):
        get_adapter("fishyscapes_laf")(tmp_path / "fs_laf", tmp_path / "nowhere")  # (a missing image a frame)


def test_fishyscapes_lost_and_found_prefers_the_lostandfound_train_image(tmp_path):
    fid = "01_Hanns_Klemm_Str_45_000000_000080"
    for k, folder in enumerate(("test", "train")):
        write_rgb(tmp_path / "laf/leftImg8bit" / folder / "01_Hanns_Klemm_Str_45" / f"{fid}_leftImg8bit.png",
                  np.full((4, 6, 3), 100 * k, np.uint8))
    write_label(tmp_path / "fs" / f"0000_{fid}_labels.png", np.zeros((4, 6)))
    adapter = get_adapter("fishyscapes_laf")(tmp_path / "fs", tmp_path / "laf")
    assert (adapter.load(adapter.refs()[0]).image == 100).all()  # train's image, not test's


def test_fishyscapes_static_rebuilds_the_image_from_cityscapes_and_the_overlay(tmp_path):
    cityscapes_tree(tmp_path / "cs")
    ids = ["frankfurt_000000_000294", "lindau_000001_000019"]
    frames = fishyscapes_static_tree(tmp_path / "static", tmp_path / "cs", ids)
    assert main(["convert", "fishyscapes_static", str(tmp_path / "static"), "--cityscapes-root",
                 str(tmp_path / "cs"), "--out", str(tmp_path / "st.h5"), "--size", "32", "64", "--quiet"]) == 0
    arrays, frame_ids = read_set(tmp_path / "st.h5")
    manifest = read_manifest(tmp_path / "st.h5")
    assert frame_ids == ["0000_frankfurt_000000_000294"]
    assert "float64" in manifest["skipped"][0]["reason"] and manifest["skipped"][0]["frame_id"].startswith("0001_")
    image, label = frames["0000_frankfurt_000000_000294"]
    assert (image[4:12, 8:20] == 255).all() and (image[14:20, 30:40] == 0).all()  # clipped, not wrapped
    np.testing.assert_array_equal(arrays["images"][0], image)
    np.testing.assert_array_equal(arrays["ood_mask"][0], label)
    assert "unused_files" not in manifest  # the overlays belong to their frames


def test_fishyscapes_static_overlay_header_is_checked_before_its_data_is_read(tmp_path):
    frames_cs = [("frankfurt", "000000", "000294"), ("lindau", "000001", "000019"), ("munster", "000002", "000019"),
                 ("frankfurt", "000003", "000576")]
    cityscapes_tree(tmp_path / "cs", frames=frames_cs)
    ids = ["_".join(frame) for frame in frames_cs]
    frames = fishyscapes_static_tree(tmp_path / "static", tmp_path / "cs", ids)

    def plant(frame_id, shape):
        """An overlay of a few bytes of int16 data under a header that declares ``shape``."""
        header = io.BytesIO()
        np.lib.format.write_array_header_1_0(header, {"descr": "<i2", "fortran_order": False, "shape": shape})
        with zipfile.ZipFile(tmp_path / "static" / f"{frame_id}_rgb.npz", "w") as archive:
            archive.writestr("rgb.npy", header.getvalue() + b"\0" * 64)

    plant(f"0000_{ids[0]}", (1 << 30, 1 << 30, 3))  # 6 EiB declared: np.load would try to allocate them
    plant(f"0002_{ids[2]}", (32, 64, 3))  # the image's shape, the data cut short
    with np.load(tmp_path / "static" / f"0001_{ids[1]}_rgb.npz") as npz:
        overlay = npz["rgb"]
    np.savez_compressed(tmp_path / "static" / f"0001_{ids[1]}_rgb.npz", rgb=overlay)  # compressed overlays read too
    assert main(["convert", "fishyscapes_static", str(tmp_path / "static"), "--cityscapes-root",
                 str(tmp_path / "cs"), "--out", str(tmp_path / "st.h5"), "--size", "32", "64", "--quiet"]) == 0
    arrays, frame_ids = read_set(tmp_path / "st.h5")
    assert frame_ids == [f"0001_{ids[1]}"]
    np.testing.assert_array_equal(arrays["images"][0], frames[f"0001_{ids[1]}"][0])
    reasons = {row["frame_id"]: row["reason"] for row in read_manifest(tmp_path / "st.h5")["skipped"]}
    assert sorted(reasons) == [f"0000_{ids[0]}", f"0002_{ids[2]}", f"0003_{ids[3]}"]
    assert reasons[f"0000_{ids[0]}"] == "overlay (1073741824, 1073741824, 3) and Cityscapes image (32, 64, 3) " \
        "differ in shape"
    assert reasons[f"0002_{ids[2]}"].startswith(f"cannot read overlay 0002_{ids[2]}_rgb.npz (ValueError: ")
    assert "float64" in reasons[f"0003_{ids[3]}"]


def streethazards_expected(label, protocol):
    """The benchmark's definition written out: 2..13 ID, 14 OOD, unlabeled (1) ignore (original protocol: ID)."""
    ood = np.full(label.shape, 255)
    ood[(label >= 2) & (label <= 13)] = 0
    ood[label == 14] = 1
    if protocol == "original":
        ood[label == 1] = 0
    return ood


@pytest.mark.parametrize("protocol", ["segood", "original"])
def test_streethazards_splits_and_its_own_classes(tmp_path, protocol):
    frames = streethazards_tree(tmp_path / "sh")
    for split in ("training", "validation", "test"):
        adapter = StreetHazards(tmp_path / "sh", split, protocol=protocol)
        with pytest.warns(ConversionWarning, match="StreetHazards label values outside .*: 0 .*15"):
            manifest = convert(adapter, tmp_path / f"{split}.h5", size=(12, 28), overwrite=True, progress=False)
        arrays, frame_ids = read_set(tmp_path / f"{split}.h5")
        assert frame_ids == sorted(f for f in frames if f.startswith(split + "/"))
        assert manifest["params"] == {"protocol": protocol}
        headline = "per-image mean, StreetHazards' protocol" if protocol == "original" else None
        assert manifest.get("per_image_headline") == headline
        assert set_identity(tmp_path / f"{split}.h5").get("per_image_headline") == headline
        for k, frame_id in enumerate(frame_ids):
            image, label = frames[frame_id]
            ood = streethazards_expected(label, protocol)
            cityscapes = {2: 2, 3: 4, 5: 11, 6: 5, 7: 0, 8: 0, 9: 1, 10: 8, 11: 13, 12: 3, 13: 7}
            semantic = np.vectorize(lambda v: cityscapes.get(v, 255))(label)
            np.testing.assert_array_equal(arrays["images"][k], image)
            np.testing.assert_array_equal(arrays["ood_mask"][k], ood)
            np.testing.assert_array_equal(arrays["semantic"][k], semantic)
    assert StreetHazards(tmp_path / "sh").default_size is None


def test_a_label_without_its_image_is_an_unused_file_of_lostandfound_and_streethazards(tmp_path):
    """A partial download (a label whose image is missing) is said in the manifest, not passed over."""
    laf_tree(tmp_path / "laf")
    label = next((tmp_path / "laf" / "gtCoarse" / "test").glob("*/*_gtCoarse_labelIds.png"))
    lonely = label.with_name(label.name.replace("_000", "_999", 1))
    shutil.copy(label, lonely)
    manifest = convert(LostAndFound(tmp_path / "laf", "test"), tmp_path / "laf.h5", size=(16, 32), progress=False)
    image = f"leftImg8bit/test/{lonely.parent.name}/{lonely.name.replace('_gtCoarse_labelIds', '_leftImg8bit')}"
    assert {"path": lonely.relative_to(tmp_path / "laf").as_posix(), "reason": f"no image {image}"} in \
        manifest["unused_files"]
    streethazards_tree(tmp_path / "sh")
    label = next((tmp_path / "sh").glob("*/annotations/test/*/*.png"))
    shutil.copy(label, label.with_name("999.png"))
    with pytest.warns(ConversionWarning):
        manifest = convert(StreetHazards(tmp_path / "sh", "test"), tmp_path / "sh.h5", progress=False)
    relative = label.with_name("999.png").relative_to(tmp_path / "sh").as_posix()
    assert manifest["unused_files"] == [{"path": relative,
                                         "reason": f"no image {relative.replace('/annotations/', '/images/')}"}]


def test_streethazards_protocol_from_the_command_line_and_bad_values(tmp_path, capsys):
    frames = streethazards_tree(tmp_path / "sh")
    assert main(["convert", "streethazards", str(tmp_path / "sh"), "--split", "test", "--protocol", "original",
                 "--out", str(tmp_path / "o.h5"), "--size", "12", "28", "--quiet"]) == 0
    manifest = read_manifest(tmp_path / "o.h5")
    assert manifest["params"] == {"protocol": "original"}
    arrays, frame_ids = read_set(tmp_path / "o.h5")
    for k, frame_id in enumerate(frame_ids):
        label = frames[frame_id][1]
        assert (arrays["ood_mask"][k][label == 1] == 0).all()  # unlabeled is ID under the original protocol
        np.testing.assert_array_equal(arrays["ood_mask"][k], streethazards_expected(label, "original"))
    assert main(["convert", "streethazards", str(tmp_path / "sh"), "--out", str(tmp_path / "d.h5"), "--size", "12",
                 "28", "--quiet"]) == 0
    assert read_manifest(tmp_path / "d.h5")["params"] == {"protocol": "segood"}  # the default
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["convert", "streethazards", str(tmp_path / "sh"), "--protocol", "caos", "--out", str(tmp_path / "x.h5")])
    assert "invalid choice: 'caos' (choose from" in capsys.readouterr().err
    with pytest.raises(ValueError, match=r"protocol must be one of \('segood', 'original'\), got 'caos'"):
        StreetHazards(tmp_path / "sh", protocol="caos")


def test_streethazards_original_protocol_reports_per_image_means_beside_pooled(tmp_path):
    """results.md of a set converted with the original protocol names both numbers, each equal to scikit-learn on
    the converted masks: AUROC pooled over every pixel, and the mean of the per-image AUROCs (CAOS' own, with
    official="caos", too); the metrics figure's bar is the per-image mean there, the pooled value elsewhere."""
    from sklearn.metrics import roc_auc_score

    from segood.evaluation import evaluate_score_maps
    from segood.evaluation.report import bar_values

    streethazards_tree(tmp_path / "sh")
    rng = np.random.default_rng(5)
    docs = {}
    for protocol in ("segood", "original"):
        data = tmp_path / f"sh_{protocol}.h5"
        with pytest.warns(ConversionWarning):
            convert(StreetHazards(tmp_path / "sh", "test", protocol=protocol), data, size=(12, 28), progress=False)
        arrays, frame_ids = read_set(data)
        masks = arrays["ood_mask"]
        shift = 6 * np.arange(len(masks))[:, None, None]  # moves the pooled AUROC, not the per-image ones
        scores = (rng.integers(0, 12, masks.shape) + 5 * (masks == 1) + shift) / 16  # few values: exact on any grid
        with h5py.File(tmp_path / f"scores_{protocol}.h5", "w") as f:
            for frame_id, score in zip(frame_ids, scores):
                f[frame_id] = score.astype(np.float32)
        docs[protocol] = evaluate_score_maps(tmp_path / f"scores_{protocol}.h5", data, tmp_path / f"run_{protocol}",
                                             name="external", figures=False, official="caos")
        kept = masks != 255
        pooled = roc_auc_score(masks[kept], scores[kept])
        per_image = np.mean([roc_auc_score(m[m != 255], s[m != 255]) for m, s in zip(masks, scores)])
        assert pooled != pytest.approx(per_image, abs=1e-3)  # the two aggregations differ on this set
        result = docs[protocol]["results"]["external"][f"sh_{protocol}"]
        assert result["pooled"]["auroc"] == pytest.approx(pooled, abs=1e-12)
        assert result["per_image_mean"]["auroc"] == pytest.approx(per_image, abs=1e-12)
        assert result["official"]["auroc"] == pytest.approx(per_image, abs=1e-12)  # CAOS' own: the same here
        headline = per_image if protocol == "original" else pooled  # the figure's bar: the set's headline
        assert bar_values(docs[protocol], "external", [f"sh_{protocol}"], "auroc")[0] == [pytest.approx(headline)]
        markdown = (tmp_path / f"run_{protocol}" / "results.md").read_text()
        section = markdown.split("## AUROC ↑ (pooled over all pixels")[1].split("\n## ")[0]
        header = next(line for line in section.splitlines() if line.startswith("| method |"))
        row = next(line for line in section.splitlines() if line.startswith("| external |"))
        cells = [c.strip().strip("*").split("*")[0] for c in row.split("|")[2:-1]]
        if protocol == "original":
            assert header == ("| method | sh_original (pooled over pixels) | sh_original (per-image mean, "
                              "StreetHazards' protocol) |")
            assert cells == [f"{pooled:.4f}", f"{per_image:.4f}"]
        else:
            assert header == "| method | sh_segood |" and cells == [f"{pooled:.4f}"]
            assert "StreetHazards' protocol" not in markdown
        assert "## AUROC ↑ (per-image mean)" in markdown  # the per-image tables stay below, as for every set
    assert docs["original"]["sets"]["sh_original"]["per_image_headline"] == "per-image mean, StreetHazards' protocol"


def test_road_obstacles_v0_evaluates_the_road_only(tmp_path, capsys):
    frames = road_obstacles_v0_tree(tmp_path / "ro")
    with pytest.warns(ConversionWarning) as caught:
        manifest = convert(RoadObstaclesV0(tmp_path / "ro"), tmp_path / "ro.h5", size=(18, 32), progress=False)
    messages = " ".join(str(w.message) for w in caught)
    assert "RoadObstacles v0 label values outside its published table became ignore: 7 (4 pixels in 1 frames)" \
        in messages
    assert "1 labels were drawn at another resolution" in messages
    arrays, frame_ids = read_set(tmp_path / "ro.h5")
    assert frame_ids == ["snowstorm01_0000", "curvy02_0003"]
    literal = {0: 255, 1: 0, 2: 1, 255: 255}  # background ignore, road ID, obstacle OOD, 255 ignore
    for k, frame_id in enumerate(frame_ids):
        image, label = frames[frame_id]
        assert set(np.unique(label)) >= {0, 1, 2, 255}
        np.testing.assert_array_equal(arrays["images"][k], image)
        np.testing.assert_array_equal(arrays["ood_mask"][k], np.vectorize(lambda v: literal.get(v, 255))(label))
        assert (arrays["semantic"][k] == 255).all()
    assert manifest["source"] == "road_obstacles_v0"
    assert manifest["label_map_sha256"] not in ("", RoadAnomaly.label_map_sha256)
    assert manifest["rescaled_labels"] == [{"frame_id": "curvy02_0003", "from": [36, 64], "to": [18, 32]}]
    assert main(["convert", "road_obstacles_v0", str(tmp_path / "ro"), "--out", str(tmp_path / "cli.h5"), "--size",
                 "18", "32", "--quiet"]) == 0
    np.testing.assert_array_equal(read_set(tmp_path / "cli.h5")[0]["ood_mask"], arrays["ood_mask"])
    # the release lists its frames in splits.json (Fishyscapes' TFDS builder reads its "full" list)
    listed = json.loads((tmp_path / "ro" / "frame_list.json").read_text())
    (tmp_path / "ro" / "frame_list.json").unlink()
    (tmp_path / "ro" / "splits.json").write_text(json.dumps({"full": listed, "snowstorm": listed[:1]}))
    with pytest.warns(ConversionWarning):
        convert(RoadObstaclesV0(tmp_path / "ro"), tmp_path / "splits.h5", size=(18, 32), progress=False)
    np.testing.assert_array_equal(read_set(tmp_path / "splits.h5")[0]["ood_mask"], arrays["ood_mask"])
    with pytest.raises(DatasetLayoutError, match="no file matches 'frame_list.json'"):
        RoadAnomaly(tmp_path / "ro")  # (Road Anomaly has no splits.json)
    (tmp_path / "ro" / "frame_list.json").mkdir()
    with pytest.raises(ValueError, match="frame_list.json is not a file: the frames' list is a JSON file"):
        RoadAnomaly(tmp_path / "ro")
    (tmp_path / "ro" / "frame_list.json").rmdir()
    (tmp_path / "ro" / "frame_list.json").write_text(json.dumps(listed + ["../outside.jpg"]))
    with pytest.raises(ValueError, match="frame_list.json names '../outside.jpg': a frame's name is the name of a "
                                         "file in frames/, without a folder"):
        RoadAnomaly(tmp_path / "ro")
    (tmp_path / "ro" / "frame_list.json").write_text(json.dumps(listed))
    with pytest.raises(KeyError, match="road_obstacles_v0"):
        get_adapter("road_obstacles")
    capsys.readouterr()
    with pytest.raises(SystemExit):
        main(["convert", "road_obstacles", str(tmp_path / "ro"), "--out", str(tmp_path / "x.h5")])
    assert "invalid choice: 'road_obstacles'" in capsys.readouterr().err
    with pytest.warns(ConversionWarning) as caught:  # the same files under Road Anomaly's rules
        convert(RoadAnomaly(tmp_path / "ro"), tmp_path / "ra.h5", size=(18, 32), progress=False)
    assert "Road Anomaly label values outside its published table became ignore: 1 (668 pixels" in \
        " ".join(str(w.message) for w in caught)
    assert (read_set(tmp_path / "ra.h5")[0]["ood_mask"][:, :6, :-2] == 0).all()  # would count the background as ID

@pytest.mark.parametrize("protocol", ["segood", "original"])
def test_bdd_anomaly_test_set_is_the_frames_with_anomaly_classes(tmp_path, protocol):
    """0..15 ID, 16..18 OOD, void (255) ignore (the original protocol, CAOS': ID), other values ignore."""
    frames = bdd_tree(tmp_path / "bdd")
    with pytest.warns(ConversionWarning, match="40"):
        manifest = convert(BDDAnomaly(tmp_path / "bdd", "test", protocol=protocol), tmp_path / "t.h5", size=(12, 20),
                           progress=False)
    assert manifest["params"] == {"protocol": protocol}
    headline = "per-image mean, CAOS' protocol" if protocol == "original" else None
    assert manifest.get("per_image_headline") == headline == set_identity(tmp_path / "t.h5").get("per_image_headline")
    arrays, frame_ids = read_set(tmp_path / "t.h5")
    assert frame_ids == ["train/00054602-3bf57337", "val/7d06fefd-f7be05a6"]
    for k, frame_id in enumerate(frame_ids):
        image, label = frames[frame_id]
        void = 0 if protocol == "original" else 255
        ood = np.where(label <= 15, 0, np.where(np.isin(label, (16, 17, 18)), 1, np.where(label == 255, void, 255)))
        np.testing.assert_array_equal(arrays["images"][k], image)
        np.testing.assert_array_equal(arrays["ood_mask"][k], ood)
        np.testing.assert_array_equal(arrays["semantic"][k], np.where(label == 40, 255, label))
        assert (arrays["ood_mask"][k] == 1).any()
    assert {"path": "seg/color_labels/", "reason": "colour renderings of the labels: never read"} \
        in manifest["unused_files"]
    assert {"path": "seg/images/val/ffffffff-00000000.jpg", "reason": "no label file"} in manifest["unused_files"]
    for split, expected in (("train", ["train/0004a4c0-d4dff0ad"]), ("val", ["val/7d128593-0ccfea4c"])):
        with pytest.warns(ConversionWarning):
            convert(BDDAnomaly(tmp_path / "bdd", split), tmp_path / f"{split}.h5", size=(12, 20), progress=False)
        assert read_set(tmp_path / f"{split}.h5")[1] == expected
    with pytest.raises(ValueError, match=r"BDD-Anomaly protocol must be one of \('segood', 'original'\), got 'caos'"):
        BDDAnomaly(tmp_path / "bdd", protocol="caos")


def test_bdd_anomaly_protocol_from_the_command_line(tmp_path):
    frames = bdd_tree(tmp_path / "bdd")
    assert main(["convert", "bdd_anomaly", str(tmp_path / "bdd"), "--protocol", "original", "--out",
                 str(tmp_path / "o.h5"), "--size", "12", "20", "--quiet"]) == 0
    assert read_manifest(tmp_path / "o.h5")["params"] == {"protocol": "original"}
    arrays, frame_ids = read_set(tmp_path / "o.h5")
    for k, frame_id in enumerate(frame_ids):
        assert (arrays["ood_mask"][k][frames[frame_id][1] == 255] == 0).all()  # void is ID, as CAOS counts it


def test_road_anomaly_frame_list_webp_and_rescaled_labels(tmp_path):
    frames = road_anomaly_tree(tmp_path / "ra")
    with pytest.warns(ConversionWarning) as caught:
        manifest = convert(RoadAnomaly(tmp_path / "ra"), tmp_path / "ra.h5", size=(18, 32), progress=False)
    messages = " ".join(str(w.message) for w in caught)
    assert "values outside its published table became ignore: 1 (3 pixels in 1 frames)" in messages
    assert "1 labels were drawn at another resolution" in messages
    arrays, frame_ids = read_set(tmp_path / "ra.h5")
    assert frame_ids == ["animals01_Guiyang_Rhinoceros", "cones02_road", "rocks03_big"]
    for k, frame_id in enumerate(frame_ids):
        image, label = frames[frame_id]
        np.testing.assert_array_equal(arrays["images"][k], image)
        np.testing.assert_array_equal(arrays["ood_mask"][k], np.where(label == 0, 0, np.where(label == 2, 1, 255)))
    assert manifest["rescaled_labels"] == [{"frame_id": "rocks03_big", "from": [36, 64], "to": [18, 32]}]
    assert manifest["unused_files"] == [{"path": "frames/extra09_unlisted.webp",
                                         "reason": "not named in frame_list.json"}]


def test_road_anomaly_labels_drawn_smaller_are_enlarged_nearest_never_blended(tmp_path):
    """Labels of 3x4 and 4x5 for 6x8 images: each image pixel takes the value of one label pixel (nearest, the
    pixel at floor(position × label size / image size)), 0 ID and 2 OOD, never the 1 (ignore) that blending 0 and
    2 would give."""
    small = {"cones01_x": np.array([[0, 2, 2, 0], [0, 0, 2, 0], [2, 0, 0, 0]], np.uint8),
             "cones02_y": np.array([[0, 2, 2, 0, 2], [0, 0, 2, 0, 0], [2, 0, 0, 0, 2], [0, 2, 0, 2, 0]], np.uint8)}
    for stem, label in small.items():
        write_webp(tmp_path / f"ra/frames/{stem}.webp", np.zeros((6, 8, 3), np.uint8))
        write_label(tmp_path / f"ra/frames/{stem}.labels/labels_semantic.png", label)
    (tmp_path / "ra/frame_list.json").write_text(json.dumps([f"{stem}.webp" for stem in small]))
    adapter = RoadAnomaly(tmp_path / "ra")
    twice = adapter.load("cones01_x")
    np.testing.assert_array_equal(twice.ood_mask, (small["cones01_x"] // 2).repeat(2, 0).repeat(2, 1))
    assert twice.extra["rescaled_label"] == {"frame_id": "cones01_x", "from": [3, 4], "to": [6, 8]}
    rows, cols = [0, 0, 1, 2, 2, 3], [0, 0, 1, 1, 2, 3, 3, 4]  # floor(row × 4 / 6), floor(column × 5 / 8)
    np.testing.assert_array_equal(adapter.load("cones02_y").ood_mask, small["cones02_y"][rows][:, cols] // 2)


def test_webp_is_decoded_by_the_declared_dependency(tmp_path):
    """Pillow (declared in setup.cfg) decodes WebP exactly: the RoadObstacle21 and Road Anomaly images."""
    from segood.data.common import read_rgb, require_webp

    require_webp()
    image = np.random.default_rng(0).integers(0, 256, (9, 13, 3), dtype=np.uint8)
    write_webp(tmp_path / "x.webp", image)
    np.testing.assert_array_equal(read_rgb(tmp_path / "x.webp"), image)


def test_labels_are_raw_values_palette_indices_and_no_gamma(tmp_path):
    from segood.data.common import SkipFrame, read_label

    values = np.arange(60, dtype=np.uint8).reshape(6, 10)
    write_label(tmp_path / "g.png", values, gamma=0.45455)
    write_label(tmp_path / "p.png", values, palette=True)
    np.testing.assert_array_equal(read_label(tmp_path / "g.png"), values)
    np.testing.assert_array_equal(read_label(tmp_path / "p.png"), values)  # indices, not the palette's colours
    write_rgb(tmp_path / "c.png", np.zeros((4, 4, 3), np.uint8))
    with pytest.raises(SkipFrame, match="has mode RGB; expected single-channel"):
        read_label(tmp_path / "c.png")


def test_mixing_keeps_the_unlabelled_frames_listed(tmp_path):
    smiyc_tree(tmp_path / "track", "dataset_AnomalyTrack", ANOMALY_FRAMES)
    cityscapes_tree(tmp_path / "cs", height=24, width=40)
    convert(RoadAnomaly21(tmp_path / "track", "test"), tmp_path / "test.h5", size=(24, 40), progress=False)
    convert(Cityscapes(tmp_path / "cs", "val"), tmp_path / "cs.h5", size=(24, 40), progress=False)
    manifest = mix(tmp_path / "test.h5", tmp_path / "cs.h5", tmp_path / "mixed.h5", progress=False)
    assert manifest["unlabelled_frames"] == ["smiyc_roadanomaly21/cow0007", "smiyc_roadanomaly21/zebra0001"]
    with pytest.raises(UnlabelledFrames):
        require_labels(tmp_path / "mixed.h5")
