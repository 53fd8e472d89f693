"""Corruptions: deterministic per (seed, frame, corruption, severity), masks moved exactly, severities monotone."""

import hashlib
import subprocess
import sys
from pathlib import Path

import albumentations as A
import numpy as np
import pytest

from segood.data.synthetic import driving_scene
from segood.robustness import GEOMETRIC, SEVERITIES, CorruptedSet, contact_sheet, corrupt, corruption_names
from segood.robustness.corruptions import build, frame_seed, severity_markdown, severity_table

NAMES = corruption_names()
RANDOM = set(NAMES) - {"grey", "snow", "blur", "jpeg"}  # these draw nothing at random (snow: "bleach")


def scenes(count, height=64, width=128):
    return [driving_scene(np.random.default_rng(k), height, width, ood=True) for k in range(count)]


def digest(name, severity, seed=0, frame_id="f"):
    image, semantic, ood_mask = scenes(1)[0]
    out, masks = corrupt(image, [ood_mask, semantic], name=name, severity=severity, seed=seed, frame_id=frame_id)
    return hashlib.sha256(out.tobytes() + b"".join(m.tobytes() for m in masks)).hexdigest()


def test_the_table_lists_the_seeds_ten_and_the_issues_four():
    assert NAMES[:10] == ("noise", "grey", "snow", "rain", "fog", "perspective", "blur", "rotation", "crop",
                          "reflection")
    assert set(NAMES[10:]) == {"night", "motion_blur", "jpeg", "sun_flare"}
    assert all(len(v) == len(SEVERITIES) for params in severity_table().values() for v in params.values())
    assert severity_markdown().count("\n") == 2 + len(NAMES) and "| fog | f 0.3 |" in severity_markdown()


@pytest.mark.parametrize("name", NAMES)
def test_each_corruption_is_deterministic_per_seed_frame_and_severity(name):
    assert digest(name, 3) == digest(name, 3)
    if name in RANDOM:
        assert digest(name, 3, seed=1) != digest(name, 3)
        assert digest(name, 3, frame_id="g") != digest(name, 3)


def test_the_same_on_another_process_whatever_its_hash_seed():
    """frame_seed hashes with sha256, never Python's salted hash(): another interpreter draws the same."""
    here = {name: digest(name, 4, frame_id="frame/7") for name in ("rain", "rotation", "sun_flare")}
    code = ("import sys; sys.path[:0] = sys.argv[1:]; from test_corruptions import digest; "
            "print(*(digest(n, 4, frame_id='frame/7') for n in ('rain', 'rotation', 'sun_flare')))")
    for hash_seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code, str(Path(__file__).parent), str(Path(__file__).parents[1])],
                             capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": hash_seed})
        assert out.stdout.split() == list(here.values())
    assert frame_seed(0, "frame/7", "fog", 4) == 0x5F41B3F5  # sha256 of "segood.robustness/0/frame/7/fog/4"
    assert frame_seed(0, "a", "fog", 4) != frame_seed(0, "a", "fog", 5) != frame_seed(1, "a", "fog", 5)


def reference_source(name, severity, seed, frame_id, shape):
    """The slow reference: for each output pixel, the (float) source coordinate of the transform albumentations
    drew (its matrix or crop window, read from the applied parameters), inverted pixel by pixel."""
    height, width = shape
    out = A.Compose([build(name, severity, height, width)], seed=frame_seed(seed, frame_id, name, severity),
                    save_applied_params=True)(image=np.zeros((*shape, 3), np.uint8))
    params = out["applied_transforms"][-1][1]
    ys, xs = np.mgrid[0:height, 0:width].astype(np.float64)
    if name == "crop":  # the window, scaled up with nearest neighbour (source = floor(dst * scale))
        x1, y1, x2, y2 = params["crop_coords"]
        return y1 + np.floor(ys * (y2 - y1) / height), x1 + np.floor(xs * (x2 - x1) / width)
    matrix = params["matrix"]
    if name == "perspective":  # warped to max_height x max_width, then scaled to the frame, in one matrix
        matrix = np.diag([width / params["max_width"], height / params["max_height"], 1.0]) @ matrix
    sx, sy, w = np.linalg.inv(matrix) @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
    return (sy / w).reshape(shape), (sx / w).reshape(shape)


@pytest.mark.parametrize("name", sorted(GEOMETRIC))
@pytest.mark.parametrize("severity", (1, 3, 5))
def test_geometric_corruptions_move_masks_exactly(name, severity):
    image, semantic, ood_mask = scenes(1, 48, 80)[0]
    shape = semantic.shape
    index = (256 + np.arange(semantic.size)).reshape(shape).astype(np.int32)  # 255 stays free for "invented"
    out, (moved_index, moved_ood, moved_semantic) = corrupt(image, [index, ood_mask, semantic], name=name,
                                                            severity=severity, seed=5, frame_id="x")
    # every output label is exactly the label of one source pixel, the same source for both masks; invented 255
    invented = moved_index == 255
    source = moved_index[~invented] - 256
    assert ((moved_ood[invented] == 255) & (moved_semantic[invented] == 255)).all()
    assert (moved_ood[~invented] == ood_mask.ravel()[source]).all()
    assert (moved_semantic[~invented] == semantic.ravel()[source]).all()
    # ... and that source is where the drawn transform puts it (nearest), pixel for pixel
    sy, sx = reference_source(name, severity, 5, "x", shape)
    ry, rx = np.rint(sy).astype(int), np.rint(sx).astype(int)
    inside = (ry >= 0) & (ry < shape[0]) & (rx >= 0) & (rx < shape[1])
    reference = np.full(shape, 255, np.int64)
    reference[inside] = index[ry[inside], rx[inside]]
    agree = moved_index == reference
    # OpenCV computes warp coordinates in 1/1024-pixel fixed point: a coordinate within 1/1024 of a half pixel may
    # round the other way. Such pixels are rare, and their source is then a neighbour of the reference's.
    assert agree.mean() >= (1.0 if name != "rotation" else 0.995)
    for y, x in zip(*np.nonzero(~agree)):
        if moved_index[y, x] == 255:
            assert not (0.5 <= sy[y, x] + 0.5 <= shape[0] - 0.5 and 0.5 <= sx[y, x] + 0.5 <= shape[1] - 0.5)
        else:
            gy, gx = divmod(int(moved_index[y, x]) - 256, shape[1])
            assert abs(gy - sy[y, x]) <= 1 and abs(gx - sx[y, x]) <= 1
    assert out.shape == image.shape and out.dtype == np.uint8
    if name == "rotation":
        assert invented.any()  # the corners a rotation brings in are ignore


@pytest.mark.parametrize("name", sorted(set(NAMES) - GEOMETRIC))
def test_photometric_corruptions_leave_masks_alone(name):
    image, semantic, ood_mask = scenes(1)[0]
    out, (ood, sem) = corrupt(image, [ood_mask, semantic], name=name, severity=5, frame_id="x")
    assert (ood == ood_mask).all() and (sem == semantic).all()
    assert out.shape == image.shape and out.dtype == np.uint8 and (out != image).any()


def laplacian_energy(image):
    grey = image.astype(np.float64).mean(axis=2)
    return np.mean((4 * grey[1:-1, 1:-1] - grey[:-2, 1:-1] - grey[2:, 1:-1] - grey[1:-1, :-2] - grey[1:-1, 2:]) ** 2)


STATISTICS = {  # a simple statistic per corruption and the way it must move with the severity, averaged over frames
    **{name: ("mean |corrupted - clean|", lambda clean, out: np.abs(out.astype(np.float64) - clean).mean(), +1)
       for name in NAMES},
    "fog": ("contrast (std of the intensities)", lambda clean, out: out.astype(np.float64).std(), -1),
    "blur": ("blur energy (Laplacian)", lambda clean, out: laplacian_energy(out), -1),
    "motion_blur": ("blur energy (Laplacian)", lambda clean, out: laplacian_energy(out), -1),
    "night": ("mean brightness", lambda clean, out: out.astype(np.float64).mean(), -1),
    "grey": ("saturation (channel spread)", lambda clean, out: np.ptp(out.astype(np.float64), axis=2).mean(), -1),
}


@pytest.mark.parametrize("name", NAMES)
def test_severity_is_monotone_on_a_simple_statistic(name):
    label, statistic, sign = STATISTICS[name]
    # the demo's frame size (blur 1 is 0.5 px at 128 rows); perspective's corner shifts are |N(0, scale)| draws,
    # so it averages more frames
    frames = scenes(32, 64, 128) if name == "perspective" else scenes(8, 128, 256)
    values = [np.mean([statistic(image, corrupt(image, name=name, severity=s, seed=0, frame_id=str(k))[0])
                       for k, (image, _, _) in enumerate(frames)]) for s in SEVERITIES]
    clean = np.mean([statistic(image, image) for image, _, _ in frames])
    assert np.all(sign * np.diff([clean, *values]) > 0), f"{name}: {label} at levels 0-5: {[clean, *values]}"


def test_unknown_corruptions_and_levels_are_clear_errors():
    image = scenes(1)[0][0]
    with pytest.raises(KeyError, match="unknown corruption 'smoke'; choose from noise, grey"):
        corrupt(image, name="smoke", severity=1)
    for level in (0, 6, 2.5, "3", True):
        with pytest.raises(ValueError, match=r"severity of fog must be one of \(1, 2, 3, 4, 5\)"):
            corrupt(image, name="fog", severity=level)
    with pytest.raises(ValueError, match="image must be"):
        corrupt(image[..., 0], name="fog", severity=1)
    with pytest.raises(ValueError, match="masks must be"):
        corrupt(image, [np.zeros((3, 3), np.uint8)], name="rotation", severity=1)


def test_corrupted_set_equals_corrupting_each_frame(tmp_path):
    import torch

    frames = scenes(2)
    items = [{"image": torch.from_numpy(image).permute(2, 0, 1), "ood_mask": torch.from_numpy(ood),
              "semantic": torch.from_numpy(sem), "frame_id": f"frame{k}"} for k, (image, sem, ood) in enumerate(frames)]
    corrupted = CorruptedSet(items, "rotation", 4, seed=2)
    assert len(corrupted) == 2
    for k, (image, semantic, ood_mask) in enumerate(frames):
        out, (ood, sem) = corrupt(image, [ood_mask, semantic], name="rotation", severity=4, seed=2,
                                  frame_id=f"frame{k}")
        item = corrupted[k]
        assert (item["image"].permute(1, 2, 0).numpy() == out).all()
        assert (item["ood_mask"].numpy() == ood).all() and (item["semantic"].numpy() == sem).all()
        assert item["frame_id"] == f"frame{k}"


def test_contact_sheet(tmp_path):
    image = scenes(1, 64, 128)[0][0]
    contact_sheet(image, tmp_path / "sheet.png", names=["fog", "rotation"])
    assert (tmp_path / "sheet.png").stat().st_size > 10_000
    with pytest.raises(KeyError, match="unknown corruption"):
        contact_sheet(image, names=["haze"])
