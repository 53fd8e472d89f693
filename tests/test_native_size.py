"""Sets whose frames keep their native sizes: storage, batching, evaluation, export, limits, and the older
fixed-size sets, which still load."""

import hashlib
import json

import h5py
import numpy as np
import pytest
import torch

from segood.data import convert, mix, read_manifest
from segood.data.common import Sample
from segood.data.h5 import (ARRAYS, CorruptFrame, H5SegmentationDataset, SetWriter, aggregate_sha256, frame_loader,
                            frame_sizes, ood_masks, same_size_batches)
from segood.data.smiyc import RoadAnomaly21
from segood.evaluation import evaluate, evaluate_score_maps
from segood.evaluation.exchange import export_scores
from segood.methods import get_method
from segood.metrics import METRIC_NAMES, make_accumulator
from segood.models import build_model, preprocess

from rawtrees import smiyc_tree

# Two sizes in one track, as RoadAnomaly21 mixes 2048x1024 and 1280x720 frames; 20x36 is not a multiple of the
# network's stride (8), so scoring pads it.
SIZES = {"validation0000": (24, 40), "validation0001": (24, 40), "validation0002": (20, 36),
         "validation0003": (24, 40)}


@pytest.fixture(scope="module")
def track(tmp_path_factory):
    root = tmp_path_factory.mktemp("native") / "dataset_AnomalyTrack"
    frames = {}
    for fid, (height, width) in SIZES.items():
        frames.update(smiyc_tree(root, "dataset_AnomalyTrack", [(fid, True)], height=height, width=width))
    convert(RoadAnomaly21(root, "validation"), root.parent / "native.h5", progress=False)
    return root, frames


def test_frames_keep_their_native_size_unless_resized(track, tmp_path):
    root, frames = track
    path = root.parent / "native.h5"
    manifest = read_manifest(path)
    assert manifest["resize"] is None and manifest["frame_sizes"] == [list(s) for s in SIZES.values()]
    assert frame_sizes(path) == list(SIZES.values())
    dataset = H5SegmentationDataset(path)
    assert dataset.sizes == list(SIZES.values())
    for k, fid in enumerate(SIZES):
        item = dataset[k]
        image, label = frames[fid]
        np.testing.assert_array_equal(item["image"].permute(1, 2, 0).numpy(), image)
        np.testing.assert_array_equal(item["ood_mask"].numpy(), np.where(label == 0, 0, np.where(label == 1, 1, 255)))
    assert [m.shape for _, m in ood_masks(path)] == list(SIZES.values())
    assert manifest["pixels"]["id"] + manifest["pixels"]["ood"] + manifest["pixels"]["ignore"] == \
        sum(h * w for h, w in SIZES.values())  # pooled metrics weight frames by their native pixel counts
    resized = convert(RoadAnomaly21(root, "validation"), tmp_path / "resized.h5", size=(16, 32), progress=False)
    assert resized["resize"] == [16, 32] and frame_sizes(tmp_path / "resized.h5") == [(16, 32)] * 4


def test_same_size_batches_keep_order_and_split_at_size_changes():
    sizes = [(2, 2), (2, 2), (3, 3), (2, 2), (2, 2), (2, 2), (3, 3)]
    assert same_size_batches(sizes, 2) == [[0, 1], [2], [3, 4], [5], [6]]
    assert same_size_batches(sizes, 8) == [[0, 1], [2], [3, 4, 5], [6]]
    assert same_size_batches(sizes, 2, indices=[1, 3, 5, 6]) == [[1, 3], [5], [6]]  # a shard: its own neighbours
    assert same_size_batches([(2, 2)] * 5, 2) == [[0, 1], [2, 3], [4]]  # one size: plain batches


def test_evaluation_at_native_size_equals_frame_by_frame_scoring(track, tmp_path):
    """The reference pads each frame by hand to the network's stride (zeros after normalisation, bottom and right),
    scores it alone and crops the map back: the run, batching frames of one size together, gives the same counts."""
    root, _ = track
    path = root.parent / "native.h5"
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    assert model.input_multiple == 8
    names = ["max_softmax", "entropy", "max_logit"]
    doc = evaluate(model, {"native": path}, names, tmp_path / "run", batch_size=4, progress=False, figures=False)
    dataset = H5SegmentationDataset(path)
    for name in names:
        reference = make_accumulator()
        for item in dataset:
            height, width = item["image"].shape[1:]
            x = torch.zeros(1, 3, -(-height // 8) * 8, -(-width // 8) * 8)
            x[..., :height, :width] = preprocess(item["image"][None])
            with torch.no_grad():
                score = get_method(name).from_output(model(x))[:, :height, :width]
            reference.update(score, item["ood_mask"][None])
        want, got = reference.compute(), doc["results"][name]["native"]
        assert (got["n_id"], got["n_ood"]) == (want["n_id"], want["n_ood"])
        for metric in METRIC_NAMES:
            assert got["pooled"][metric] == pytest.approx(want[metric], abs=1e-12), (name, metric)
        assert got["per_image_mean"]["n_images_total"] == 4


def test_export_writes_each_map_at_its_frame_size_and_scores_back(track, tmp_path):
    root, _ = track
    path = root.parent / "native.h5"
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18").eval()
    sets = {"native": path}
    for layout in ("smiyc", "fishyscapes"):
        out = export_scores(model, sets, [get_method("entropy")], tmp_path / layout, layout=layout,
                            progress=False)[("entropy", "native")]
        if layout == "smiyc":
            for fid, size in SIZES.items():
                with h5py.File(out / f"{fid}.hdf5") as f:
                    assert f["value"].shape == size and f["value"].dtype == np.float16
    doc = evaluate(model, sets, ["entropy"], tmp_path / "run", progress=False, figures=False)
    got = evaluate_score_maps(out, path, tmp_path / "scored", name="entropy", figures=False)
    for metric in METRIC_NAMES:  # the Fishyscapes files are float32: the run's own scores
        assert got["results"]["entropy"]["native"]["pooled"][metric] == pytest.approx(
            doc["results"]["entropy"]["native"]["pooled"][metric], abs=1e-12)


def test_a_map_at_another_size_names_the_frame_size(track, tmp_path):
    root, _ = track
    path = root.parent / "native.h5"
    with h5py.File(tmp_path / "maps.h5", "w") as f:
        for fid in SIZES:
            f.create_dataset(fid, data=np.zeros((24, 40), np.float32))  # validation0002 is 20x36
    with pytest.raises(ValueError, match=r"frame validation0002: scores of shape \(24, 40\), the frame is \(20, 36\)"):
        evaluate_score_maps(tmp_path / "maps.h5", path, tmp_path / "run", figures=False)


def test_mix_keeps_each_frame_size(track, tmp_path):
    root, _ = track
    writer = SetWriter(tmp_path / "id.h5", (32, 64), {"source": "plain", "split": "val"})
    writer.append(Sample(np.full((32, 64, 3), 7, np.uint8), np.zeros((32, 64), np.uint8),
                         np.zeros((32, 64), np.uint8), "a"))
    writer.commit()
    manifest = mix(root.parent / "native.h5", tmp_path / "id.h5", tmp_path / "mixed.h5", seed=1, progress=False)
    dataset = H5SegmentationDataset(tmp_path / "mixed.h5")
    assert sorted(manifest["frame_sizes"]) == sorted([list(s) for s in SIZES.values()] + [[32, 64]])
    assert all(tuple(dataset[k]["image"].shape[1:]) == dataset.sizes[k] for k in range(len(dataset)))
    batches = list(frame_loader(dataset, batch_size=3))
    assert sum(len(b["frame_id"]) for b in batches) == 5  # every batch one size, no frame lost


def test_sizes_no_image_has_are_refused(track, tmp_path):
    with pytest.raises(ValueError, match=r"a frame of 1×20000 pixels is outside what a set holds"):
        SetWriter(tmp_path / "x.h5", None, {"source": "t"}).append(
            Sample(np.zeros((1, 20000, 3), np.uint8), np.zeros((1, 20000), np.uint8), np.zeros((1, 20000), np.uint8),
                   "wide"))
    with pytest.raises(ValueError, match="masks must cover the image"):
        SetWriter(tmp_path / "y.h5", None, {"source": "t"}).append(
            Sample(np.zeros((4, 4, 3), np.uint8), np.zeros((4, 5), np.uint8), np.zeros((4, 4), np.uint8), "odd"))
    forged = tmp_path / "forged.h5"
    forged.write_bytes((track[0].parent / "native.h5").read_bytes())
    with h5py.File(forged, "r+") as f:  # a manifest that declares a 50 000 × 50 000 frame: refused, not allocated
        manifest = json.loads(f["manifest"][()])
        manifest["frame_sizes"][1] = [50000, 50000]
        del f["manifest"]
        f.create_dataset("manifest", data=json.dumps(manifest), dtype=h5py.string_dtype())
    with pytest.raises(ValueError, match=r"frame 1: a frame of 50000×50000 pixels is outside what a set holds"):
        H5SegmentationDataset(forged)
    with h5py.File(forged, "r+") as f:  # a declared size that is not the stored one
        manifest["frame_sizes"][1] = [24, 36]
        del f["manifest"]
        f.create_dataset("manifest", data=json.dumps(manifest), dtype=h5py.string_dtype())
    dataset = H5SegmentationDataset(forged)
    with pytest.raises(CorruptFrame, match=r"frame 1: images is stored with shape \(24, 40, 3\), the manifest "
                                           r"records a 24×36 frame"):
        dataset[1]


def write_fixed_size_set(path, samples):
    """A set in the first layout (``segood.h5set/1``): (N, H, W, ...) arrays, written as segood once wrote them."""
    height, width = samples[0].image.shape[:2]
    digests = np.array([[np.frombuffer(hashlib.sha256(np.ascontiguousarray(a)).digest(), np.uint8)
                         for a in (s.image, s.ood_mask, s.semantic)] for s in samples])
    pixels = {"id": sum(int((s.ood_mask == 0).sum()) for s in samples),
              "ood": sum(int((s.ood_mask == 1).sum()) for s in samples),
              "ignore": sum(int((s.ood_mask == 255).sum()) for s in samples)}
    manifest = {"format": "segood.h5set/1", "source": "old", "split": "val", "height": height, "width": width,
                "frames": len(samples), "pixels": pixels, "sha256": aggregate_sha256(digests)}
    with h5py.File(path, "w") as f:
        for name, arrays in zip(ARRAYS, zip(*[(s.image, s.ood_mask, s.semantic) for s in samples])):
            f.create_dataset(name, data=np.stack(arrays), chunks=(1, *arrays[0].shape), compression="gzip")
        f.create_dataset("frame_id", data=[s.frame_id for s in samples], dtype=h5py.string_dtype())
        f.create_dataset("frame_sha256", data=digests)
        f.create_dataset("manifest", data=json.dumps(manifest), dtype=h5py.string_dtype())
        for key in ("format", "source", "split", "height", "width"):
            f.attrs[key] = manifest[key]


def test_fixed_size_sets_of_the_first_layout_still_load(tmp_path):
    rng = np.random.default_rng(0)
    samples = [Sample(rng.integers(0, 256, (16, 24, 3), dtype=np.uint8), rng.choice([0, 1, 255], (16, 24)).astype(
        np.uint8), np.zeros((16, 24), np.uint8), f"f{k}") for k in range(3)]
    write_fixed_size_set(tmp_path / "old.h5", samples)
    dataset = H5SegmentationDataset(tmp_path / "old.h5")
    assert dataset.sizes == [(16, 24)] * 3 and frame_sizes(tmp_path / "old.h5") == [(16, 24)] * 3
    for k, sample in enumerate(samples):
        np.testing.assert_array_equal(dataset[k]["image"].permute(1, 2, 0).numpy(), sample.image)
        np.testing.assert_array_equal(dataset[k]["ood_mask"].numpy(), sample.ood_mask)
    assert [fid for fid, _ in ood_masks(tmp_path / "old.h5")] == ["f0", "f1", "f2"]
    del dataset  # (closes its handle)
    with h5py.File(tmp_path / "old.h5", "r+") as f:  # its digests are still checked
        f["ood_mask"][1, 0, 0] = 1 - f["ood_mask"][1, 0, 0] if f["ood_mask"][1, 0, 0] < 2 else 0
    with pytest.raises(CorruptFrame, match=r"frame 1 \(f1\): ood_mask differs.*"
                                           r"evaluate, score and robustness take --no-verify"):
        H5SegmentationDataset(tmp_path / "old.h5")[1]


def test_mahalanobis_names_a_frame_size_it_was_not_fitted_on(track, tmp_path):
    rng = np.random.default_rng(1)
    writer = SetWriter(tmp_path / "fit.h5", (16, 32), {"source": "plain", "split": "train"})
    for k in range(8):  # road everywhere: 64 feature pixels of one class, more than the 32 dimensions
        writer.append(Sample(rng.integers(0, 256, (16, 32, 3), dtype=np.uint8), np.zeros((16, 32), np.uint8),
                             np.zeros((16, 32), np.uint8), f"f{k}"))
    writer.commit()
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head="dimreduce").eval()
    method = get_method("mahalanobis").fit(model, frame_loader(H5SegmentationDataset(tmp_path / "fit.h5"), 2))
    image = H5SegmentationDataset(track[0].parent / "native.h5")[0]["image"]  # 24x40: 3x5 features, not 2x4
    with pytest.raises(ValueError, match=r"per-location class means of 2×4 feature maps .*these frames give 3×5"):
        method.score(model, preprocess(image[None]))


def test_cropping_back_touches_only_what_is_at_the_padded_input_size():
    """Scores and logits of a padded input are cropped to the frame; a mask model's query outputs (here 100 queries
    of 40 class logits, larger than the frame on both axes) and features are left whole."""
    from segood.methods.schedule import _crop

    logits, queries, features = torch.zeros(1, 3, 24, 40), torch.zeros(1, 100, 40), torch.zeros(1, 8, 3, 5)
    out = _crop((logits, [queries, features]), (24, 40), (20, 36))
    assert [tuple(t.shape) for t in (out[0], *out[1])] == [(1, 3, 20, 36), (1, 100, 40), (1, 8, 3, 5)]
