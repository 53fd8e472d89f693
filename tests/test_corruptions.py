"""Corruptions of both families: deterministic per (seed, frame, corruption, severity), masks moved exactly,
severities monotone (the standard family: where the reference is), the standard family against the reference's
numbers (tests/fixtures/standard_reference.json) and each fast path against a slow literal one."""

import colorsys
import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

import albumentations as A
import numpy as np
import pytest

from segood.data.synthetic import driving_scene
from segood.robustness import (GEOMETRIC, SEVERITIES, CorruptedSet, contact_sheet, corrupt, corruption_names,
                               resolve_corruptions)
from segood.robustness import standard
from segood.robustness.corruptions import build, frame_seed, severity_markdown, severity_table

NAMES = corruption_names()
RANDOM = set(NAMES) - {"grey", "blur", "jpeg"}  # these draw nothing at random: the same on every frame, by design
STANDARD = corruption_names("standard")
STANDARD_DETERMINISTIC = {"c:defocus_blur", "c:zoom_blur", "c:brightness", "c:contrast", "c:pixelate",
                          "c:jpeg_compression"}
FIXTURES = Path(__file__).parent / "fixtures"


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



def test_lengths_scale_with_the_height_and_flakes_with_the_area():
    """The table's "px" are pixels of a 1024-row frame: a 128x256 frame takes an eighth of each length, the flakes
    of a 1024x2048 frame in proportion to its area; crop's keep is a share of each side, so of the area squared."""
    assert build("blur", 1, 128, 256).sigma_limit == (0.5, 0.5)  # 4 px / 8, the kernel reaching 3 sigma: 5 taps
    assert build("blur", 1, 128, 256).blur_limit == (5, 5)
    assert build("motion_blur", 3, 256, 512).blur_limit == (15, 15)  # 60 px / 4
    assert build("rain", 2, 512, 1024).drop_length == 15 and build("reflection", 3, 512, 1024).side == 70
    flakes = build("snow", 1, 128, 256).transforms[1]
    assert flakes.count == 23 and flakes.radius == 0.1875  # round(1500 / 64), 1.5 px / 8
    assert build("snow", 5, 1024, 2048).transforms[1].count == 12000
    assert build("crop", 2, 128, 256).scale == pytest.approx((0.92 ** 2, 0.92 ** 2))
    assert standard.standard_scale(256, "height") == 0.25 and standard.standard_scale(2048, "height") == 2.0
    assert standard.standard_scale(256, "fixed") == 1.0

@pytest.mark.parametrize("name", NAMES)
def test_each_corruption_is_deterministic_per_seed_frame_and_severity(name):
    assert digest(name, 3) == digest(name, 3)
    if name in RANDOM:
        assert digest(name, 3, seed=1) != digest(name, 3)
        assert digest(name, 3, frame_id="g") != digest(name, 3)


def test_the_same_on_another_process_whatever_its_hash_seed():
    """frame_seed hashes with sha256, never Python's salted hash(): another interpreter draws the same."""
    names = ("rain", "rotation", "sun_flare", "snow", "c:glass_blur", "c:fog", "c:elastic_transform")
    here = {name: digest(name, 4, frame_id="frame/7") for name in names}
    code = ("import sys; sys.path[:0] = sys.argv[1:]; from test_corruptions import digest; "
            f"print(*(digest(n, 4, frame_id='frame/7') for n in {names!r}))")
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
    if name == "crop":  # the window scaled up, pixel centres to pixel centres
        x1, y1, x2, y2 = params["crop_coords"]
        return y1 + (ys + 0.5) * (y2 - y1) / height - 0.5, x1 + (xs + 0.5) * (x2 - x1) / width - 0.5
    matrix = params["matrix"]
    if name == "perspective":  # warped to max_height x max_width, then scaled to the frame, in one matrix
        matrix = np.diag([width / params["max_width"], height / params["max_height"], 1.0]) @ matrix
    sx, sy, w = np.linalg.inv(matrix) @ np.stack([xs.ravel(), ys.ravel(), np.ones(xs.size)])
    return (sy / w).reshape(shape), (sx / w).reshape(shape)


@pytest.mark.parametrize("name", sorted(GEOMETRIC & set(NAMES)))
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
    # A crop's scaled centre may fall exactly halfway between two source pixels: either is nearest.
    ties = (np.abs(sy % 1 - 0.5) < 1e-9) | (np.abs(sx % 1 - 0.5) < 1e-9)
    assert agree[~ties].mean() >= (1.0 if name != "rotation" else 0.995)
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


# -- the standard family -----------------------------------------------------------------------------------------

def test_the_standard_family_lists_the_15_of_imagenet_c_in_their_order():
    assert STANDARD == tuple("c:" + n for n in (
        "gaussian_noise", "shot_noise", "impulse_noise", "defocus_blur", "glass_blur", "motion_blur", "zoom_blur",
        "snow", "frost", "fog", "brightness", "contrast", "elastic_transform", "pixelate", "jpeg_compression"))
    assert corruption_names("all") == NAMES + STANDARD
    assert resolve_corruptions(["fog", "c:snow"], "standard") == ["c:fog", "c:snow"]
    assert resolve_corruptions(["fog", "frost"], "all") == ["fog", "c:frost"]  # segood's fog; frost is standard only
    assert resolve_corruptions(None, "standard") == list(STANDARD)
    with pytest.raises(KeyError, match="unknown corruption 'haze'; choose from noise, .*c:fog"):
        resolve_corruptions(["haze"], "standard")
    with pytest.raises(ValueError, match="corruption c:fog is named twice"):  # (a condition counted twice)
        resolve_corruptions(["fog", "c:fog"], "standard")
    with pytest.raises(ValueError, match="unknown corruption family 'imagenet'; choose from segood, standard, all"):
        corruption_names("imagenet")
    assert resolve_corruptions(["blur", "c:fog"]) == ["blur", "c:fog"]  # no family given: any corruption
    with pytest.raises(ValueError, match="corruption blur is not of the standard family: name its corruptions "
                                         r"\(c:gaussian_noise, "):  # (segood's blur was run, the family ignored)
        resolve_corruptions(["blur"], "standard")
    with pytest.raises(ValueError, match="corruption c:fog is not of the segood family"):
        resolve_corruptions(["c:fog"], "segood")
    with pytest.raises(ValueError, match="standard_size must be one of"):
        corrupt(scenes(1)[0][0], name="c:fog", severity=1, standard_size="scaled")
    assert "| c:fog | thickness 1.5, decay 2.0 |" in severity_markdown(["c:fog"])


@pytest.mark.parametrize("name", STANDARD)
def test_each_standard_corruption_is_deterministic_per_seed_frame_and_severity(name):
    assert digest(name, 3) == digest(name, 3)
    if name in STANDARD_DETERMINISTIC:  # the same on every frame, as in the reference
        assert digest(name, 3, seed=1) == digest(name, 3) == digest(name, 3, frame_id="g")
    else:
        assert digest(name, 3, seed=1) != digest(name, 3)
        assert digest(name, 3, frame_id="g") != digest(name, 3)
    assert digest(name, 2) != digest(name, 3)


@pytest.mark.parametrize("name", sorted(set(STANDARD) - GEOMETRIC))
def test_photometric_standard_corruptions_leave_masks_alone(name):
    image, semantic, ood_mask = scenes(1)[0]
    out, (ood, sem) = corrupt(image, [ood_mask, semantic], name=name, severity=5, frame_id="x")
    assert (ood == ood_mask).all() and (sem == semantic).all()
    assert out.shape == image.shape and out.dtype == np.uint8 and (out != image).any()


@pytest.mark.parametrize("severity", (1, 5))
def test_the_elastic_transform_moves_masks_where_it_moves_the_image(severity):
    """The image is a ramp that encodes each pixel's coordinates (row 5 r, column 3 c): linear interpolation of it
    reads back the source coordinate of every output pixel, and the masks must hold the label at its nearest
    pixel, the same source for both."""
    height, width = 48, 80
    rows, cols = np.mgrid[0:height, 0:width]
    image = np.stack([5 * rows, 3 * cols, np.zeros_like(rows)], axis=2).astype(np.uint8)
    index = rows * width + cols
    semantic = (index % 19).astype(np.uint8)
    out, (moved_index, moved_semantic) = corrupt(image, [index, semantic], name="c:elastic_transform",
                                                 severity=severity, seed=3, frame_id="x")
    source_row, source_col = out[..., 0] / 5, out[..., 1] / 3
    got_row, got_col = np.divmod(moved_index, width)
    assert (moved_semantic == semantic.ravel()[moved_index]).all()
    inside = (source_row > 1) & (source_row < height - 2) & (source_col > 1) & (source_col < width - 2)
    assert inside.mean() > 0.8 and (got_row != rows).any()  # it moves pixels, mostly inside the frame
    # nearest within the ramp's own rounding (1/10 row, 1/6 column) and OpenCV's 1/32-pixel interpolation weights
    assert (np.abs(got_row - source_row)[inside] <= 0.5 + 0.1 + 1 / 32).all()
    assert (np.abs(got_col - source_col)[inside] <= 0.5 + 1 / 6 + 1 / 32).all()


def test_standard_size_scales_lengths_with_the_frame_height():
    image = driving_scene(np.random.default_rng(0), 1024, 48)[0]
    for name in ("c:defocus_blur", "c:motion_blur", "c:glass_blur"):  # at 1024 rows, "height" is the standard
        fixed = corrupt(image, name=name, severity=4, seed=1, frame_id="a")[0]
        assert (corrupt(image, name=name, severity=4, seed=1, frame_id="a", standard_size="height")[0] == fixed).all()
    small = image[:256]
    assert (corrupt(small, name="c:defocus_blur", severity=4, standard_size="height")[0]
            != corrupt(small, name="c:defocus_blur", severity=4)[0]).any()
    assert (corrupt(small, name="c:gaussian_noise", severity=4, standard_size="height")[0]
            == corrupt(small, name="c:gaussian_noise", severity=4)[0]).all()  # no lengths: not scaled


# -- the standard family against the reference implementation --------------------------------------------------

@pytest.fixture(scope="module")
def reference():
    return json.loads((FIXTURES / "standard_reference.json").read_text())


@pytest.fixture(scope="module")
def reference_frames(reference):
    spec = reference["frames"]
    frames = np.stack([driving_scene(np.random.default_rng(k), spec["height"], spec["width"], ood=True)[0]
                       for k in range(spec["count"])])
    assert hashlib.sha256(frames.tobytes()).hexdigest() == spec["sha256"], "the generated frames changed: " \
        "rebuild the fixture as tests/fixtures/make_standard_reference.py says"
    return frames


def psnr_table(frames, seeds):
    """PSNR of segood's standard corruptions as the fixture measures the reference's: 10 log10(255^2 / MSE), the
    MSE over every frame under seeds 0 .. n - 1."""
    table = {}
    for name in STANDARD:
        short = name[2:]
        table[short] = []
        for severity in SEVERITIES:
            errors = [np.mean((corrupt(image, name=name, severity=severity, seed=seed, frame_id=str(k))[0]
                               .astype(np.float64) - image) ** 2)
                      for k, image in enumerate(frames) for seed in range(seeds.get(short, seeds["default"]))]
            table[short].append(10 * np.log10(255.0 ** 2 / np.mean(errors)))
    return table


@pytest.fixture(scope="module")
def psnr(reference, reference_frames):
    return psnr_table(reference_frames, reference["seeds"])


@pytest.mark.parametrize("name", STANDARD)
def test_psnr_within_half_a_db_of_the_reference_at_every_severity(name, psnr, reference):
    ours, theirs = np.array(psnr[name[2:]]), np.array(reference["psnr"][name[2:]])
    assert np.abs(ours - theirs).max() <= 0.5, f"{name}: segood {ours.round(2)}, reference {theirs.round(2)} dB"


@pytest.mark.parametrize("name", sorted(STANDARD_DETERMINISTIC))
def test_deterministic_ones_equal_the_reference_within_rounding(name, reference, reference_frames):
    """The reference truncates its float output to uint8, segood rounds: within 1 everywhere."""
    patch = reference["patch"]
    rows, cols = slice(*patch["rows"]), slice(*patch["cols"])
    for severity, theirs in zip(SEVERITIES, patch["outputs"][name[2:]]):
        ours = corrupt(reference_frames[patch["frame"]], name=name, severity=severity)[0][rows, cols].astype(int)
        theirs = np.array(theirs.split(), int).reshape(ours.shape)
        assert np.abs(ours - theirs).max() <= 1, f"{name} {severity}"


def test_severity_is_monotone_where_the_reference_is(psnr, reference):
    """Where the reference's PSNR falls by 0.2 dB or more from one level to the next, segood's falls too; the
    reference's non-monotone steps (glass blur 1-2 and 3-4, snow 2-3, frost 3-4) are its definitions, kept."""
    rising = set()
    for name, theirs in reference["psnr"].items():
        for level in range(4):
            step = theirs[level + 1] - theirs[level]
            if step <= -0.2:
                assert psnr[name][level + 1] < psnr[name][level], f"{name} {level + 1}->{level + 2}: {psnr[name]}"
            elif step > 0:
                rising.add((name, level + 1))
    assert rising == {("glass_blur", 1), ("glass_blur", 3), ("snow", 2), ("frost", 3)}


# -- fast paths against slow literal ones ------------------------------------------------------------------------

def test_glass_blur_kernel_equals_the_literal_loop():
    rng = np.random.default_rng(0)
    image = rng.integers(0, 256, (12, 15, 3), dtype=np.uint8)
    delta = 2
    offsets = rng.integers(-delta, delta, size=((12 - 2 * delta) * (15 - 2 * delta), 2), dtype=np.int16)
    literal, k = image.copy(), 0
    for h in range(12 - delta, delta, -1):
        for w in range(15 - delta, delta, -1):
            literal[h, w] = literal[h + offsets[k, 0], w + offsets[k, 1]]
            k += 1
    fast = image.copy()
    standard._neighbour_copy_kernel(fast, offsets, delta)
    assert (fast == literal).all()


@pytest.mark.parametrize("angle", (-130.0, -45.0, -10.0, 0.0, 33.0))
def test_streak_equals_the_sum_of_shifted_copies(angle):
    rng = np.random.default_rng(1)
    image = rng.random((20, 24, 3)).astype(np.float32)
    radius, sigma = 4, 2.5
    width = 2 * radius + 1
    weights = np.exp(-np.arange(width) ** 2 / (2 * sigma ** 2))
    weights /= weights.sum()
    literal = np.zeros_like(image, dtype=np.float64)
    rows, cols = np.mgrid[0:20, 0:24]
    for i in range(width):  # copy i: the frame moved by (dy, dx), its edges repeated
        dy = -math.ceil(i * math.sin(math.radians(angle)) - 0.5)
        dx = -math.ceil(i * math.cos(math.radians(angle)) - 0.5)
        literal += weights[i] * image[np.clip(rows - dy, 0, 19), np.clip(cols - dx, 0, 23)]
    assert np.abs(standard._streak(image, radius, sigma, angle) - literal).max() < 1e-5


def test_clipped_zoom_equals_scipy_zoom_of_the_centre():
    from scipy.ndimage import zoom

    image = np.random.default_rng(2).random((30, 50, 3)).astype(np.float32)
    for factor in (1.07, 1.24, 2.5):
        n0, n1 = int(np.ceil(30 / factor)), int(np.ceil(50 / factor))
        top0, top1 = (30 - n0) // 2, (50 - n1) // 2
        literal = zoom(image[top0 : top0 + n0, top1 : top1 + n1], (factor, factor, 1), order=1)[:30, :50]
        # OpenCV interpolates with 1/32-pixel weights
        assert np.abs(standard._clipped_zoom(image, factor) - literal).max() < 1 / 32


def box_taps(size, new, i):
    """PIL's BOX resampling, literally: the source pixels j of output pixel i, those in its support window whose
    box weight ((j - centre + 0.5) / scale in (-0.5, 0.5]) is 1."""
    scale = size / new
    centre = (i + 0.5) * scale
    first, stop = max(int(centre - scale / 2 + 0.5), 0), min(int(centre + scale / 2 + 0.5), size)
    return [j for j in range(first, stop) if -0.5 < (j - centre + 0.5) / scale <= 0.5]


def test_box_downscale_averages_the_pixels_whose_centres_fall_in_each_cell():
    image = np.random.default_rng(3).integers(0, 256, (7, 23), dtype=np.uint8)
    for new in (4, 13, 14, 22):
        literal = np.array([[np.floor(row[box_taps(23, new, i)].mean() + 0.5) for i in range(new)] for row in image])
        assert (standard._box_mean(image, 1, new) == literal).all()


def test_brightness_shifts_the_hsv_value():
    image = np.random.default_rng(4).integers(0, 256, (6, 7, 3), dtype=np.uint8)
    image[0, 0] = 0  # black: no hue, no saturation
    out = corrupt(image, name="c:brightness", severity=2)[0]
    for pixel, got in zip(image.reshape(-1, 3) / 255, out.reshape(-1, 3)):
        h, s, v = colorsys.rgb_to_hsv(*pixel)
        assert np.abs(np.array(colorsys.hsv_to_rgb(h, s, min(v + 0.2, 1))) * 255 - got).max() <= 0.5 + 1e-6
