"""Bad raw files and damaged sets: one test per fault, each on a tiny generated tree or file, asserting the clear
message (or the correct mask), that nothing is half-written and that the good frames around a bad one still
convert."""

import errno
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest
from PIL import Image

from segood.cli import main
from segood.data import IDD, Cityscapes, ConversionError, Sample, Sun, convert
from segood.data.common import rasterise
from segood.data.convert import ConversionWarning
from segood.data.h5 import (CorruptFrame, H5SegmentationDataset, SetWriter, frame_ids, frame_sizes, manifest_path,
                             ood_masks, read_manifest, set_identity)
from segood.evaluation import evaluate
from segood.labels import IGNORE, OOD
from segood.models import build_model

from rawtrees import cityscapes_tree, gradient_image, idd_json, labelme_xml, rect, replace_chunk, write_rgb

H, W = 40, 60


def idd_frames(root, names, image_suffix=".jpg", objects=None):
    """IDD frames (car ID, autorickshaw OOD) named ``names``; returns their image paths."""
    objects = objects or [{"label": "car", "polygon": rect(5, 5, 24, 19), "deleted": 0},
                          {"label": "autorickshaw", "polygon": rect(30, 10, 44, 24), "deleted": 0}]
    paths = []
    for k, name in enumerate(names):
        image = root / "leftImg8bit" / "val" / "0" / f"{name}_leftImg8bit{image_suffix}"
        write_rgb(image, gradient_image(H, W, k))
        idd_json(root / "gtFine" / "val" / "0" / f"{name}_gtFine_polygons.json", H, W,
                 objects if not callable(objects) else objects(k))
        paths.append(image)
    return paths


def skipped(manifest):
    return {entry["frame_id"]: entry["reason"] for entry in manifest["skipped"]}


def nothing_written(out):
    out = Path(out)
    return not out.exists() and not manifest_path(out).exists() and not list(out.parent.glob(f".{out.name}*"))


# 1. A truncated JPEG is a skipped frame with its reason (an error with strict), never a grey lower third.
def test_truncated_jpeg_is_skipped_not_converted(tmp_path):
    images = idd_frames(tmp_path / "idd", ["000100", "000200", "000300"])
    data = images[1].read_bytes()
    images[1].write_bytes(data[: len(data) * 2 // 3])
    manifest = convert(IDD(tmp_path / "idd"), tmp_path / "x.h5", size=(H, W), progress=False)
    assert manifest["frames"] == 2  # the good frames around the bad one
    assert "cannot decode image 000200_leftImg8bit.jpg completely" in skipped(manifest)["val/0/000200"]
    with pytest.raises(ConversionError, match="000200.*completely"):
        convert(IDD(tmp_path / "idd"), tmp_path / "y.h5", size=(H, W), strict=True, progress=False)
    assert nothing_written(tmp_path / "y.h5")


# 2. NaN coordinates skip the frame; huge ones are clipped to the frame geometrically.
def test_non_finite_and_huge_polygon_coordinates(tmp_path):
    objects = {0: [{"label": "car", "polygon": [[5, 5], [float("nan"), 5], [20, 30]], "deleted": 0}],
               1: [{"label": "car", "polygon": [[-1e12, -1e12], [1e12, -1e12], [1e12, 20.5], [-1e12, 20.5]]}],
               2: [{"label": "car", "polygon": [[12, 3], [1e12, 3], [12, 1e12]], "deleted": 0}]}
    idd_frames(tmp_path / "idd", ["000100", "000200", "000300"], objects=objects.get)
    manifest = convert(IDD(tmp_path / "idd"), tmp_path / "x.h5", size=(H, W), progress=False)
    assert "polygon 0 ('car') has a non-finite coordinate" in skipped(manifest)["val/0/000100"]
    dataset = H5SegmentationDataset(tmp_path / "x.h5")
    band = dataset[0]["ood_mask"].numpy()
    expected = rasterise([[[-5, -5], [W + 5, -5], [W + 5, 20.5], [-5, 20.5]]], H, W)  # the same band, drawn small
    assert np.array_equal(band == 0, expected == 1) and (band == 0).sum() == 21 * W
    triangle = dataset[1]["ood_mask"].numpy() == 0  # every pixel right of x = 12 and below y = 3 is car
    rows, cols = np.mgrid[:H, :W]
    assert np.array_equal(triangle, (rows >= 3) & (cols >= 12))


# 3. EXIF orientation is not applied (annotations are on the stored grid); a size mismatch is a skip.
# 4. The SUN size filter reads the image, never the XML's claim.
def test_sun_exif_orientation_and_size_claims(tmp_path):
    root = tmp_path / "sun"
    objects = [("car", rect(0, 0, 99, 299), "alice", 0), ("vase", rect(300, 400, 499, 599), "bob", 0)]
    cases = {"rotated": ((660, 700), (660, 700), 6), "plain": ((660, 700), (660, 700), None),
             "small_claims_big": ((600, 600), (700, 700), None), "big_claims_small": ((700, 700), (600, 600), None)}
    for name, (size, claimed, orientation) in cases.items():
        path = root / "Images" / "a" / "abbey" / f"{name}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        exif = Image.Exif()
        if orientation:
            exif[0x0112] = orientation  # "rotate 90° clockwise to display": cv2.imread would turn the image
        Image.fromarray(gradient_image(*size)).save(path, quality=95, exif=exif)
        (root / "Annotations" / "a" / "abbey").mkdir(parents=True, exist_ok=True)
        (root / "Annotations" / "a" / "abbey" / f"{name}.xml").write_text(
            labelme_xml(f"{name}.jpg", "a/abbey", objects, claimed))
    sun = Sun(root, "all")
    assert dict(sun.unused_files) == {"Images/a/abbey/small_claims_big.jpg": "600x600 = 360000 pixels <= 640x640: the "
                                                                             "size filter leaves it out"}
    manifest = convert(sun, tmp_path / "x.h5", size=(660, 700), progress=False)
    assert "imagesize is 600x600 but the image is 700x700" in skipped(manifest)["a/abbey/big_claims_small"]
    masks = {item["frame_id"]: item["ood_mask"].numpy() for item in H5SegmentationDataset(tmp_path / "x.h5")}
    assert np.array_equal(masks["a/abbey/rotated"], masks["a/abbey/plain"])
    assert (masks["a/abbey/rotated"][:300, :100] == 0).all() and (masks["a/abbey/rotated"][400:600, 300:500] == 1).all()


# 5. A chunk replaced by valid gzip of other content is found when the set is read, naming the frame.
def test_modified_chunk_is_found_and_named(small_set, tmp_path):
    doctored = tmp_path / "doctored.h5"
    shutil.copy(small_set, doctored)
    with h5py.File(doctored, "r+") as f:  # a doctored digest table no longer matches the manifest
        f["frame_sha256"][1, 1, 0] ^= 1
    with pytest.raises(CorruptFrame, match="per-frame digests do not match the manifest"):
        H5SegmentationDataset(doctored)
    mask = H5SegmentationDataset(small_set)[1]["ood_mask"].numpy().copy()
    mask[:5] = OOD
    replace_chunk(small_set, "ood_mask", 1, mask)
    dataset = H5SegmentationDataset(small_set)
    dataset[0], dataset[2]
    with pytest.raises(CorruptFrame, match=r"frame 1 \(val/aachen/aachen_000000_000001\): ood_mask differs"):
        dataset[1]
    assert (H5SegmentationDataset(small_set, verify=False)[1]["ood_mask"][:5] == OOD).all()  # skipping the check
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match="cs: cannot read frame 1 .*ood_mask differs"):
        evaluate(model, [small_set], ["max_softmax"], tmp_path / "run", progress=False, figures=False)
    doc = evaluate(model, [small_set], ["max_softmax"], tmp_path / "run2", progress=False, figures=False,
                   skip_bad=True)
    assert [s[:2] for s in doc["skipped_frames"]] == [["cs", 1]]


@pytest.mark.parametrize("inflate", ["isal", "zlib"])
def test_frames_inflated_here_equal_hdf5s_own_reading(small_set, tmp_path, monkeypatch, inflate):
    """The deflated chunks read directly and inflated by ISA-L (or zlib where isal is missing) give h5py's arrays
    bit for bit; a damaged or oversized chunk is a CorruptFrame naming the frame; a dataset stored with other filters
    is left to h5py."""
    import zlib

    from segood.data import h5

    monkeypatch.setattr(h5, "_INFLATE", pytest.importorskip("isal.isal_zlib") if inflate == "isal" else zlib)
    with h5py.File(small_set, "r") as f:
        for name in h5.ARRAYS:
            for index in range(3):
                node = f[name][str(index)]
                got = h5._inflated(node, (0,) * node.ndim, node.shape, "frame")
                assert got.flags.writeable and np.array_equal(got, node[()]) and got.dtype == np.uint8
    damaged, oversized = tmp_path / "damaged.h5", tmp_path / "oversized.h5"
    for path, payload in ((damaged, b"not a deflate stream"), (oversized, zlib.compress(bytes(32 * 64 + 1)))):
        shutil.copy(small_set, path)
        with h5py.File(path, "r+") as f:
            node = f["ood_mask"]["2"]
            node.id.write_direct_chunk((0, 0), payload)
    with pytest.raises(CorruptFrame, match="frame 2: ood_mask cannot be inflated"):
        H5SegmentationDataset(damaged, verify=False)[2]
    with pytest.raises(CorruptFrame, match="frame 2: ood_mask inflates to more than its 2048 bytes"):
        H5SegmentationDataset(oversized, verify=False)[2]
    with h5py.File(tmp_path / "shuffled.h5", "w") as f:
        node = f.create_dataset("x", data=np.arange(12, dtype=np.uint8).reshape(3, 4), chunks=(3, 4),
                                compression="gzip", shuffle=True)
        assert h5._inflated(node, (0, 0), (3, 4), "x") is None


def test_a_chunk_deflating_would_barely_shrink_is_stored_as_it_is(tmp_path):
    """A noise image (deflating keeps more than 3/4 of it) is stored as it is, its chunk's gzip filter skipped as
    HDF5 allows per chunk; the masks are deflated. Both read back equal through h5py and segood's reader, verified;
    a stored chunk of the wrong length is a CorruptFrame naming the frame."""
    from segood.data import h5

    rng = np.random.default_rng(3)
    image = rng.integers(0, 256, (40, 64, 3), dtype=np.uint8)
    mask = np.zeros((40, 64), np.uint8)
    mask[10:20, 10:30] = OOD
    writer = SetWriter(tmp_path / "x.h5", None, {"source": "noise", "split": "test"})
    writer.append(Sample(image, mask, mask, "f/0"))
    writer.commit()
    with h5py.File(tmp_path / "x.h5", "r") as f:
        assert [f[name]["0"].id.read_direct_chunk((0,) * f[name]["0"].ndim)[0] for name in h5.ARRAYS] == [1, 0, 0]
        assert np.array_equal(f["images"]["0"][()], image) and np.array_equal(f["ood_mask"]["0"][()], mask)
    item = H5SegmentationDataset(tmp_path / "x.h5")[0]
    assert np.array_equal(item["image"].permute(1, 2, 0).numpy(), image)
    assert np.array_equal(item["ood_mask"].numpy(), mask)
    with h5py.File(tmp_path / "x.h5", "r+") as f:
        f["images"]["0"].id.write_direct_chunk((0, 0, 0), image.tobytes()[:-1], filter_mask=1)
    with pytest.raises(CorruptFrame, match=r"frame 0: images holds 7679 bytes, its shape \(40, 64, 3\) 7680"):
        H5SegmentationDataset(tmp_path / "x.h5", verify=False)[0]


# 6. Label ids outside the official Cityscapes table are counted per id in the manifest, with a warning.
def test_unknown_cityscapes_label_ids_are_counted_and_warned(tmp_path, capsys):
    label_ids = cityscapes_tree(tmp_path / "cs", frames=[("aachen", "000000", "000000"), ("bonn", "000000", "000001")])
    odd = label_ids.copy()
    odd[0, :7] = 250
    Image.fromarray(odd).save(tmp_path / "cs/gtFine/val/bonn/bonn_000000_000001_gtFine_labelIds.png")
    with pytest.warns(ConversionWarning, match=r"label ids outside the official Cityscapes table.*250 \(7 pixels"):
        manifest = convert(Cityscapes(tmp_path / "cs"), tmp_path / "x.h5", size=(32, 64), progress=False)
    assert manifest["unknown_label_ids"] == {"250": {"pixels": 7, "frames": 1}} and manifest["frames"] == 2
    assert main(["convert", "cityscapes", str(tmp_path / "cs"), "--out", str(tmp_path / "y.h5"), "--quiet"]) == 0
    assert "warning: label ids outside the official Cityscapes table" in capsys.readouterr().err


# 7. No frames: an error, nothing written; an empty set is refused by evaluate.
def test_empty_conversions_and_sets_are_errors(tmp_path, capsys):
    cityscapes_tree(tmp_path / "cs")
    for label in (tmp_path / "cs" / "gtFine").rglob("*.png"):
        label.rename(label.with_name(label.name.replace("labelIds", "color")))
    assert main(["convert", "cityscapes", str(tmp_path / "cs"), "--out", str(tmp_path / "x.h5"), "--quiet"]) == 2
    assert "gtFine/val/*/*_gtFine_labelIds.png" in capsys.readouterr().err and nothing_written(tmp_path / "x.h5")
    (tmp_path / "cs" / "gtFine" / "val" / "frankfurt" / "frankfurt_000000_000294_gtFine_labelIds.png").write_bytes(b"")
    with pytest.raises(ConversionError, match=r"no frame of cityscapes could be converted \(2 skipped: .*nothing"):
        convert(Cityscapes(tmp_path / "cs"), tmp_path / "x.h5", progress=False)
    assert nothing_written(tmp_path / "x.h5")
    writer = SetWriter(tmp_path / "empty.h5", (8, 8), {"source": "test"})
    with pytest.raises(ValueError, match="no frame to write"):
        writer.commit()
    assert nothing_written(tmp_path / "empty.h5")
    with h5py.File(tmp_path / "legacy.h5", "w") as f:  # an empty set as older versions wrote them
        f.attrs["format"] = "segood.h5set/1"
        f.create_dataset("frame_id", shape=(0,), dtype=h5py.string_dtype())
    with pytest.warns(UserWarning, match="without per-frame digests"), pytest.raises(ValueError, match="holds no frames"):
        evaluate(build_model("pspnet", "resnet18"), [tmp_path / "legacy.h5"], ["max_softmax"], tmp_path / "run",
                 progress=False)


def test_two_conversions_to_one_output_never_delete_each_other(tmp_path):
    a = SetWriter(tmp_path / "x.h5", (8, 8), {"source": "a"})
    b = SetWriter(tmp_path / "x.h5", (8, 8), {"source": "b"})
    sample = Sample(np.zeros((8, 8, 3), np.uint8), np.zeros((8, 8), np.uint8), np.zeros((8, 8), np.uint8), "f")
    a.append(sample)
    b.append(sample)
    b.abort()  # b's failure leaves a's work alone
    assert a.commit()["source"] == "a" and read_manifest(tmp_path / "x.h5")["source"] == "a"
    assert not list(tmp_path.glob(".x.h5*"))


# 13. A failure at any point of a conversion (a full disk) leaves the old state: no partial set, no orphan.
@pytest.mark.parametrize("where", ["append", "close", "manifest"])
def test_failed_conversion_leaves_nothing_or_the_old_set(tmp_path, monkeypatch, where):
    images = idd_frames(tmp_path / "idd", ["000100", "000200"])
    assert images
    old = convert(IDD(tmp_path / "idd"), tmp_path / "x.h5", size=(H, W), progress=False)
    old_bytes = (tmp_path / "x.h5").read_bytes(), manifest_path(tmp_path / "x.h5").read_bytes()
    full = OSError(errno.ENOSPC, "No space left on device")
    calls = {"n": 0}

    def fail_once(original):
        def wrapper(*args, **kwargs):
            calls["n"] += 1
            if calls["n"] == 2 or (where != "append" and calls["n"] == 1):
                raise full
            return original(*args, **kwargs)
        return wrapper

    target = {"append": (SetWriter, "append"), "close": (h5py.File, "close"), "manifest": (Path, "write_text")}[where]
    monkeypatch.setattr(*target, fail_once(getattr(*target)))
    for out, overwrite in ((tmp_path / "new.h5", False), (tmp_path / "x.h5", True)):
        calls["n"] = 0
        with pytest.raises(OSError, match="No space left"):
            convert(IDD(tmp_path / "idd"), out, size=(H, W), overwrite=overwrite, progress=False)
    monkeypatch.undo()
    assert nothing_written(tmp_path / "new.h5")
    assert ((tmp_path / "x.h5").read_bytes(), manifest_path(tmp_path / "x.h5").read_bytes()) == old_bytes
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert read_manifest(tmp_path / "x.h5") == old
    assert convert(IDD(tmp_path / "idd"), tmp_path / "new.h5", size=(H, W), progress=False)["frames"] == 2


def test_the_manifest_travels_inside_the_set(small_set):
    manifest_path(small_set).unlink()  # e.g. a copy of the .h5 alone
    manifest = read_manifest(small_set)
    assert manifest["frames"] == 3 and len(H5SegmentationDataset(small_set)) == 3


@pytest.mark.parametrize("workers", [0, 2])
def test_malformed_idd_coordinate_skips_the_named_frame(tmp_path, workers):
    objects = {1: [{"label": "car", "polygon": [[5, 5], ["12,5px", 3], [20, 30]], "deleted": 0}]}
    idd_frames(tmp_path / "idd", ["000100", "000200", "000300"], objects=lambda k: objects.get(k) or [
        {"label": "car", "polygon": rect(5, 5, 24, 19), "deleted": 0}])
    manifest = convert(IDD(tmp_path / "idd"), tmp_path / "x.h5", size=(H, W), workers=workers, progress=False)
    assert manifest["frames"] == 2
    assert "polygon 0 ('car') has a non-numeric coordinate" in skipped(manifest)["val/0/000200"]


def test_idd_deleted_as_text_and_numbers_beyond_floats(tmp_path):
    """A re-exported file's "deleted": "0" is not deleted (its autorickshaw stays OOD); an image size or a coordinate
    no float holds skips its frame, with the others converted."""
    car = {"label": "car", "polygon": rect(5, 5, 24, 19), "deleted": 0}
    objects = {0: [car, {"label": "autorickshaw", "polygon": rect(30, 10, 44, 24), "deleted": "0"}],
               1: [car, {"label": "autorickshaw", "polygon": rect(30, 10, 44, 24), "deleted": "1"}],
               2: [{"label": "car", "polygon": [[5, 5], [10 ** 400, 5], [20, 30]], "deleted": 0}],
               3: [car, {"label": "car", "polygon": rect(0, 0, 3, 3), "deleted": "maybe"}]}
    idd_frames(tmp_path / "idd", ["000100", "000200", "000300", "000400"], objects=objects.get)
    manifest = convert(IDD(tmp_path / "idd"), tmp_path / "x.h5", size=(H, W), progress=False)
    masks = dict(ood_masks(tmp_path / "x.h5"))
    assert (masks["val/0/000100"] == OOD).sum() == 15 * 15 and (masks["val/0/000200"] == OOD).sum() == 0
    assert "polygon 0 ('car') has a non-numeric coordinate (int too large" in skipped(manifest)["val/0/000300"]
    assert skipped(manifest)["val/0/000400"] == "object 'car' has deleted='maybe'; expected 0 or 1"


def test_an_unexpected_error_names_the_frame(tmp_path, monkeypatch):
    idd_frames(tmp_path / "idd", ["000100", "000200"])
    adapter = IDD(tmp_path / "idd")
    monkeypatch.setattr(IDD, "load", lambda self, ref: 1 / 0)
    with pytest.raises(ConversionError, match="val/0/000100: unexpected ZeroDivisionError"):
        convert(adapter, tmp_path / "x.h5", size=(H, W), progress=False)
    assert nothing_written(tmp_path / "x.h5")


# 15. SUN is listed recursively; every file not used is recorded with the reason.
# 16. A class noun with modifiers is that class; an empty name is ignore.
def test_sun_listing_and_label_rules_on_a_tree(tmp_path):
    root = tmp_path / "sun"
    objects = [("person sitting crop", rect(0, 0, 99, 99), "alice", 0), ("", rect(200, 0, 299, 99), "bob", 0),
               ("parked white car", rect(0, 200, 99, 299), "carol", 0), ("teapot", rect(300, 300, 399, 399), "dan", 0)]
    for folder, name in (("c/church/outdoor", "deep"), ("a/abbey", "shallow"), ("misc", "other")):
        write_rgb(root / "Images" / folder / f"{name}.jpg", gradient_image(660, 700))
        (root / "Annotations" / folder).mkdir(parents=True, exist_ok=True)
        (root / "Annotations" / folder / f"{name}.xml").write_text(labelme_xml(f"{name}.jpg", folder, objects))
    (root / "Annotations" / "a" / "abbey" / "notes.txt").write_text("not an annotation")
    write_rgb(root / "Images" / "a" / "abbey" / "orphan.jpg", gradient_image(8, 8))
    (root / "README").write_text("release notes")
    sun = Sun(root, "all")
    assert [sun.frame_id(r) for r in sun.refs()] == ["a/abbey/shallow", "c/church/outdoor/deep", "misc/other"]
    assert dict(sun.unused_files) == {"Annotations/a/abbey/notes.txt": "not a LabelMe annotation (.txt)",
                                      "Images/a/abbey/orphan.jpg": "no annotation with the same relative path",
                                      "README": "outside Images/ and Annotations/"}
    manifest = convert(sun, tmp_path / "x.h5", size=(660, 700), progress=False)
    assert len(manifest["unused_files"]) == 3 and manifest["frames"] == 3
    item = H5SegmentationDataset(tmp_path / "x.h5")[0]
    mask, semantic = item["ood_mask"].numpy(), item["semantic"].numpy()
    assert (mask[:100, :100] == 0).all() and (semantic[:100, :100] == 11).all()  # person
    assert (mask[:100, 200:300] == IGNORE).all()  # empty name
    assert (mask[200:300, :100] == 0).all() and (semantic[200:300, :100] == 13).all()  # car
    assert (mask[300:400, 300:400] == OOD).all()
    rules = {row["name"]: row["rule"] for row in manifest["coverage"]}
    assert rules == {"person sitting": "modifiers", "": "empty", "parked white car": "modifiers",
                     "teapot": "default"}


# 17. A damaged set (a frame's dataset deleted, a bit flipped in an object header, a link where a frame's dataset
# should be) is a CorruptFrame naming the set, the frame and the array, which skip_bad skips as a digest mismatch.
def test_damaged_frames_are_corrupt_frames_that_skip_bad_passes_over(small_set, tmp_path):
    missing, flipped, linked = (tmp_path / f"{name}.h5" for name in ("missing", "flipped", "linked"))
    for path in (missing, flipped, linked):
        shutil.copy(small_set, path)
    with h5py.File(missing, "r+") as f:
        del f["images"]["1"]
    with h5py.File(flipped, "r") as f:
        header = h5py.h5o.get_info(f["images"]["1"].id).addr
    data = bytearray(flipped.read_bytes())
    data[data.index(b"deflate\0", header) - 2] ^= 1  # the deflate filter's count of parameters: 1 -> 0
    flipped.write_bytes(data)
    with h5py.File(linked, "r+") as f:
        del f["ood_mask"]["1"], f["semantic"]["2"]
        f["ood_mask"]["1"] = h5py.ExternalLink(str(small_set), "ood_mask/1")  # another file, however alike
        f["semantic"]["2"] = h5py.SoftLink("/semantic/0")
    with pytest.raises(CorruptFrame, match=r"missing.h5: frame 1: images is missing from the set"):
        H5SegmentationDataset(missing)[1]
    with pytest.raises(CorruptFrame, match=r"flipped.h5: frame 1: images cannot be read \(IndexError"):
        H5SegmentationDataset(flipped)[1]
    with pytest.raises(CorruptFrame, match=r"linked.h5: frame 1: ood_mask is a link \(ExternalLink\)"):
        H5SegmentationDataset(linked, verify=False)[1]
    with pytest.raises(CorruptFrame, match=r"linked.h5: frame 2: semantic is a link \(SoftLink\)"):
        H5SegmentationDataset(linked, verify=False)[2]
    assert H5SegmentationDataset(flipped)[0]["frame_id"] == "val/aachen/aachen_000000_000000"
    model = build_model("pspnet", "resnet18").eval()
    with pytest.raises(ValueError, match="missing: cannot read frame 1 .*images is missing"):
        evaluate(model, [missing], ["max_softmax"], tmp_path / "run", progress=False, figures=False)
    doc = evaluate(model, [missing, flipped, linked], ["max_softmax"], tmp_path / "run2", progress=False,
                   figures=False, skip_bad=True)
    assert [s[:2] for s in doc["skipped_frames"]] == [["missing", 1], ["flipped", 1], ["linked", 1], ["linked", 2]]


# 18. A set whose manifest lacks a field, or whose frame ids are not strings, is an error naming the file and the
# field, never a KeyError or AttributeError.
def test_bad_set_fields_are_errors_naming_the_file_and_the_field(small_set, tmp_path):
    import json

    no_source, int_ids = tmp_path / "no_source.h5", tmp_path / "int_ids.h5"
    shutil.copy(small_set, no_source)
    shutil.copy(small_set, int_ids)
    with h5py.File(no_source, "r+") as f:
        manifest = json.loads(f["manifest"][()])
        del manifest["source"], f["manifest"]
        f.create_dataset("manifest", data=json.dumps(manifest), dtype=h5py.string_dtype())
    with h5py.File(int_ids, "r+") as f:
        del f["frame_id"]
        f.create_dataset("frame_id", data=np.arange(3))
    with pytest.raises(ValueError, match=r"no_source.h5: its manifest has no field source.*convert it again with "
                                         "segood convert"):
        set_identity(no_source)
    for read in (H5SegmentationDataset, frame_ids):
        with pytest.raises(ValueError, match=r"int_ids.h5: the field frame_id holds int64, not one string per "
                                             "frame.*convert it again with segood convert"):
            read(int_ids)


# 19. A current-format set whose per-frame digests were deleted is an error, never a read left unverified with a
# warning (only sets of the first format, which predate digests, are read so: test_empty_conversions_...).
def test_a_current_set_without_its_digests_is_an_error(small_set):
    with h5py.File(small_set, "r+") as f:
        assert f.attrs["format"] == "segood.h5set/2"
        del f["frame_sha256"]
    with pytest.raises(CorruptFrame, match=r"cs.h5: a segood.h5set/2 set without its per-frame digests"):
        H5SegmentationDataset(small_set)
    assert len(H5SegmentationDataset(small_set, verify=False)) == 3  # read unverified only when asked


# 20. A score file's malformed score_range is an error naming the file, never a TypeError.
@pytest.mark.parametrize("declared", [5, (0.0, 1.0, 2.0), "low"])
def test_a_malformed_score_range_is_an_error_naming_the_file(small_set, tmp_path, declared):
    from segood.evaluation.exchange import ScoreMaps

    scores = tmp_path / "scores.h5"
    with h5py.File(scores, "w") as f:
        for frame_id, size in zip(frame_ids(small_set), frame_sizes(small_set)):
            f.create_dataset(frame_id, data=np.zeros(size, np.float32))
        f.attrs["score_range"] = (0, 1)
    with ScoreMaps(scores, frame_ids(small_set)) as maps:
        assert maps.score_range == (0.0, 1.0)
    with h5py.File(scores, "r+") as f:
        f.attrs["score_range"] = declared
    with pytest.raises(ValueError, match=r"scores.h5: the score_range attribute is .*; score_range must be two "
                                         r"numbers \(low, high\)"):
        ScoreMaps(scores, frame_ids(small_set))


def test_another_datasets_label_map_and_bad_yaml_are_one_line_errors(tmp_path):
    """IDD's converter given SUN's map (or a file that is no YAML mapping) names the file and what it lacks."""
    from segood.data.common import load_label_map

    with pytest.raises(ValueError, match=r"sun.yaml lacks \['cs_train_id', 'eval_roles'\]: is it another"):
        load_label_map(Path(__file__).parents[1] / "label_maps" / "sun.yaml", ("cs_train_id", "eval_roles"))
    for text, message in (("- a\n- b\n", r"lacks \['default'\]"), ("a: [\n", "is not valid YAML")):
        (tmp_path / "bad.yaml").write_text(text)
        with pytest.raises(ValueError, match=message):
            load_label_map(tmp_path / "bad.yaml", ("default",))


def test_converted_sets_have_the_permissions_open_gives(tmp_path):
    """Not mkstemp's 0600: whoever shares the folder reads the set as they read its manifest."""
    import os

    from segood.data import Noise

    convert(Noise("perlin", 1, size=(8, 8), seed=1, frequency=2, octaves=2), tmp_path / "n.h5", size=(8, 8),
            progress=False)
    umask = os.umask(0)
    os.umask(umask)
    assert os.stat(tmp_path / "n.h5").st_mode & 0o777 == 0o666 & ~umask
    assert os.stat(tmp_path / "n.manifest.json").st_mode & 0o777 == 0o666 & ~umask
