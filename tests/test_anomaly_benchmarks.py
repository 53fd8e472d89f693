"""Today's anomaly-segmentation benchmarks (SMIYC, LostAndFound, Fishyscapes, StreetHazards, BDD-Anomaly,
Road Anomaly) on tiny raw trees in their published layouts, with their gotchas, checked pixel for pixel."""

import h5py
import numpy as np
import pytest

from segood.cli import main
from segood.data import ConversionError, convert, read_manifest
from segood.data.h5 import UnlabelledFrames, require_labels
from segood.data.registry import ADAPTERS
from segood.data.smiyc import RoadAnomaly21, RoadObstacle21

from rawtrees import smiyc_tree


def read_set(path):
    with h5py.File(path, "r") as f:
        return {k: f[k][...] for k in ("images", "ood_mask", "semantic")}, [s.decode() for s in f["frame_id"]]


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
    ("all", ["curvy-street_003", "driveway_001", "gravel_000", "snowstorm1_000", "snowstorm2_004"])])
def test_smiyc_obstacle_scene_splits_from_webp(tmp_path, split, expected):
    frames = smiyc_tree(tmp_path / "dataset_ObstacleTrack", "dataset_ObstacleTrack", OBSTACLE_FRAMES)
    adapter = RoadObstacle21(tmp_path / "dataset_ObstacleTrack", split)
    assert adapter.native_size == (1080, 1920)
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


def test_every_new_adapter_is_registered_with_a_convert_command(capsys):
    for name in ("smiyc_anomaly", "smiyc_obstacle"):
        assert name in ADAPTERS
        with pytest.raises(SystemExit):
            main(["convert", name, "--help"])
        assert "--split" in capsys.readouterr().out
