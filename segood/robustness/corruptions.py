"""Corruptions of driving frames at five severities, built from albumentations.

A corruption is a name of the severity table (``severities.yaml``, shipped in the package): its parameters at
levels 1-5 are data, read by :func:`severity_table`; the code below only says which albumentations transform each
name is. Every corruption is deterministic per (seed, frame id, corruption, severity) on every machine: its
random draws are seeded from a sha256 of the four (:func:`frame_seed`), never from Python's salted ``hash``.

Photometric corruptions change the image only. Geometric ones (:data:`GEOMETRIC`) move the image and the masks
together, the masks with nearest-neighbour interpolation so that a label is never blended; pixels the transform
invents (the corners a rotation or perspective brings in) are ignore (255) in both masks, and pixels that leave
the frame are gone with their labels. The robustness seed's ten (Heindrich 2020, §3.1.1) come first, then the
issue's night, motion blur, JPEG and sun flare.

Two families: segood's own (above, the default) and the standard one, the 15 ImageNet-C corruptions as Cityscapes-C
uses them (:mod:`segood.robustness.standard`), named ``c:NAME`` ("c:fog") beside segood's names. Every function
below takes a name of either family.
"""

import functools
import hashlib
from importlib import resources

import albumentations as A
import cv2
import numpy as np
import yaml

from segood.labels import IGNORE
from segood.robustness.standard import (STANDARD_GEOMETRIC, apply_standard, standard_scale,
                                        standard_table)

SEVERITIES = (1, 2, 3, 4, 5)
REFERENCE_ROWS = 1024  #: the "px" lengths of the table are pixels of a frame of this many rows
STANDARD_PREFIX = "c:"  #: a standard corruption's name: this prefix and the reference's name ("c:fog")
FAMILIES = ("segood", "standard", "all")
GEOMETRIC = frozenset({"perspective", "rotation", "crop"} | {STANDARD_PREFIX + n for n in STANDARD_GEOMETRIC})


@functools.cache
def severity_table():
    """{corruption: {parameter: [value at level 1, ..., level 5]}} from the shipped ``severities.yaml``, checked:
    every corruption has a transform below and five values per parameter."""
    table = yaml.safe_load(resources.files("segood.robustness").joinpath("severities.yaml").read_text())
    if set(table) != set(_BUILDERS):
        raise ValueError(f"severities.yaml lists {sorted(table)}, the code builds {sorted(_BUILDERS)}: they must agree")
    for name, params in table.items():
        bad = [p for p, values in params.items() if not isinstance(values, list) or len(values) != len(SEVERITIES)]
        if bad:
            raise ValueError(f"severities.yaml: {name}: parameters {bad} need one value per level {SEVERITIES}")
    return table


@functools.cache
def levels_table():
    """{corruption: {parameter: [five values]}} of both families, standard names with their prefix."""
    return {**severity_table(), **{STANDARD_PREFIX + n: params for n, params in standard_table().items()}}


def corruption_names(family="segood"):
    """Every corruption of a family ("segood", "standard" or "all"), in the tables' order."""
    if family not in FAMILIES:
        raise ValueError(f"unknown corruption family {family!r}; choose from {', '.join(FAMILIES)}")
    own = tuple(severity_table()) if family in ("segood", "all") else ()
    return own + (tuple(STANDARD_PREFIX + n for n in standard_table()) if family in ("standard", "all") else ())


def family_of(name):
    """"standard" or "segood"."""
    return "standard" if name.startswith(STANDARD_PREFIX) else "segood"


def resolve_corruptions(names, family=None):
    """Full names of ``names`` (default: all of ``family``, segood's own without one): a standard corruption may be
    named without its prefix when the family is "standard", or when segood has no corruption of that name ("c:fog"
    or, with family "standard", "fog"); an unknown name is a KeyError listing the valid ones, a name outside a
    given family (but "all") a ValueError."""
    every = corruption_names(family or "segood")  # (checks the family)
    if not names:
        return list(every)
    resolved = []
    for name in names:
        prefixed = STANDARD_PREFIX + name
        if prefixed in levels_table() and (family == "standard" or name not in levels_table()):
            name = prefixed
        check_corruption(name)
        if family in ("segood", "standard") and family_of(name) != family:
            raise ValueError(f"corruption {name} is not of the {family} family: name its corruptions ("
                             f"{', '.join(every)}), or leave the family out")
        if name in resolved:
            raise ValueError(f"corruption {name} is named twice; name each once")
        resolved.append(name)
    return resolved


def condition_name(set_name, corruption, severity):
    """The name of a set under a corruption at a severity in the run's state: "sun@fog-3"."""
    return f"{set_name}@{corruption}-{severity}"


def check_corruption(name, severity=None):
    """Refuse an unknown corruption or level with a message listing the valid ones."""
    if name not in levels_table():
        raise KeyError(f"unknown corruption {name!r}; choose from {', '.join(levels_table())}")
    if severity is not None and (isinstance(severity, bool) or severity not in SEVERITIES):
        raise ValueError(f"severity of {name} must be one of {SEVERITIES} (1 mild, 5 strong), got {severity!r}")


def level_params(name, severity):
    """{parameter: value} of ``name`` at ``severity`` (1-5)."""
    check_corruption(name, severity)
    return {key: values[severity - 1] for key, values in levels_table()[name].items()}


def frame_seed(seed, frame_id, name, severity):
    """The 32-bit seed of one frame's corruption: the same on every machine and Python process."""
    key = f"segood.robustness/{int(seed)}/{frame_id}/{name}/{int(severity)}".encode()
    return int.from_bytes(hashlib.sha256(key).digest()[:4], "little")


def build(name, severity, height, width):
    """The albumentations transform of ``name`` at ``severity`` for frames of ``height`` x ``width`` (unseeded)."""
    check_corruption(name, severity)
    if family_of(name) == "standard":
        raise ValueError(f"{name} is a standard corruption, not an albumentations transform: call corrupt()")
    return _BUILDERS[name](level_params(name, severity), height / REFERENCE_ROWS, (height, width))


def corrupt(image, masks=(), *, name, severity, seed=0, frame_id="", standard_size="fixed"):
    """Corrupt one frame.

    Args:
        image: (H, W, 3) uint8 RGB.
        masks: label maps of shape (H, W) (e.g. the ood_mask and the semantic trainIds), moved with the image by
            geometric corruptions (nearest neighbour; invented pixels 255) and returned unchanged otherwise.
        name, severity: a corruption of :func:`corruption_names` and a level 1-5.
        seed, frame_id: with ``name`` and ``severity``, what the random draws depend on (:func:`frame_seed`).
        standard_size: the lengths of a standard corruption: "fixed" (the standard's pixels, as published numbers
            use them) or "height" (pixels of a 1024-row frame, scaled to the frame's rows); segood's own are
            always scaled to the height.

    Returns:
        (image (H, W, 3) uint8, [masks]).
    """
    image = np.ascontiguousarray(image)
    if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
        raise ValueError(f"image must be (H, W, 3) uint8 RGB, got {image.dtype} of shape {image.shape}")
    masks = [np.ascontiguousarray(m) for m in masks]
    if any(m.shape != image.shape[:2] for m in masks):
        raise ValueError(f"masks must be {image.shape[:2]} like the image, got {[m.shape for m in masks]}")
    if family_of(name) == "standard":
        check_corruption(name, severity)
        scale = standard_scale(image.shape[0], standard_size)
        rng = np.random.default_rng(frame_seed(seed, frame_id, name, severity))
        return apply_standard(image, masks, name[len(STANDARD_PREFIX):], level_params(name, severity), rng, scale)
    transform = build(name, severity, *image.shape[:2])
    out = A.Compose([transform], seed=frame_seed(seed, frame_id, name, severity), strict=True)(
        image=image, masks=masks)
    return out["image"], [np.asarray(m) for m in out["masks"]]


class CorruptedSet:
    """A set (any Dataset of segood items: ``image`` (3, H, W) uint8 tensor, ``ood_mask``, ``semantic``,
    ``frame_id``) seen through one corruption at one severity, corrupted on the fly as frames are read."""

    def __init__(self, dataset, name, severity, *, seed=0, standard_size="fixed"):
        check_corruption(name, severity)
        standard_scale(1, standard_size)  # (checks it)
        self.dataset, self.name, self.severity, self.seed = dataset, name, severity, seed
        self.standard_size = standard_size

    def __len__(self):
        return len(self.dataset)

    @property
    def sizes(self):
        """Each frame's (H, W), as the set it corrupts has them (a corruption keeps a frame's size), or None."""
        return getattr(self.dataset, "sizes", None)

    def __getitem__(self, index):
        import torch

        item = self.dataset[index]
        image, (ood_mask, semantic) = corrupt(
            item["image"].permute(1, 2, 0).numpy(), [item["ood_mask"].numpy(), item["semantic"].numpy()],
            name=self.name, severity=self.severity, seed=self.seed, frame_id=item["frame_id"],
            standard_size=self.standard_size)
        return {**item, "image": torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1),
                "ood_mask": torch.from_numpy(ood_mask), "semantic": torch.from_numpy(semantic)}


# -- the transforms ---------------------------------------------------------------------------------------------
# Each builder takes one level's parameters, the frame's scale (rows / 1024) and (H, W); the random draws that are
# left (positions, directions, noise) come from the seeded Compose around it.

def _px(value, scale, odd=False):
    n = max(1, round(value * scale))
    return n + 1 - n % 2 if odd else n


def _noise(p, scale, size):
    return A.GaussNoise(std_range=(p["std"], p["std"]), p=1)


def _grey(p, scale, size):
    return A.ColorJitter(brightness=(1, 1), contrast=(1, 1), saturation=(1 - p["f"], 1 - p["f"]), hue=(0, 0), p=1)


def _snow(p, scale, size):
    height, width = size
    return A.Sequential([
        A.RandomSnow(snow_point_range=(p["snow_point"], p["snow_point"]), brightness_coeff=p["brightness"],
                     method="bleach", p=1),
        Flakes(max(1, round(p["flakes"] * height * width / (REFERENCE_ROWS * 2 * REFERENCE_ROWS))),
               p["flake_px"] * scale, p=1)], p=1)


def _rain(p, scale, size):
    return A.RandomRain(rain_type=p["rain_type"], brightness_coefficient=p["brightness"],
                        drop_length=_px(p["drop_length_px"], scale), blur_value=3, p=1)


def _fog(p, scale, size):
    return Fog(p["f"], p=1)


def _perspective(p, scale, size):
    return A.Perspective(scale=(p["scale"], p["scale"]), keep_size=True, fit_output=False,
                         mask_interpolation=cv2.INTER_NEAREST, border_mode=cv2.BORDER_CONSTANT, fill=0,
                         fill_mask=IGNORE, p=1)


def _blur(p, scale, size):
    sigma = p["sigma_px"] * scale
    size = 2 * int(np.ceil(3 * sigma)) + 1  # the kernel reaches 3 sigma (OpenCV's own choice drops small sigmas)
    return A.GaussianBlur(sigma_limit=(sigma, sigma), blur_limit=(size, size), p=1)


def _rotation(p, scale, size):
    d = float(p["degrees"])
    return A.OneOf([A.Rotate(limit=(a, a), border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=IGNORE,
                             mask_interpolation=cv2.INTER_NEAREST, p=1) for a in (-d, d)], p=1)


def _crop(p, scale, size):
    height, width = size
    share = p["keep"] ** 2
    # (nearest-exact: the mask pixel whose centre is nearest each output pixel's, where the image samples; OpenCV's
    # plain nearest floors the corner-aligned coordinate, a shift of up to a pixel up and left)
    return A.RandomResizedCrop(size=(height, width), scale=(share, share), ratio=(width / height,) * 2,
                               mask_interpolation=cv2.INTER_NEAREST_EXACT, p=1)


def _reflection(p, scale, size):
    return Reflection(_px(p["side_px"], scale), p=1)


def _night(p, scale, size):
    gamma = 100 * p["gamma"]
    return A.Sequential([A.MultiplicativeNoise(multiplier=(p["gain"], p["gain"]), p=1),
                         A.RandomGamma(gamma_limit=(gamma, gamma), p=1),
                         A.GaussNoise(std_range=(p["noise_std"], p["noise_std"]), p=1)], p=1)


def _motion_blur(p, scale, size):
    length = max(3, _px(p["length_px"], scale, odd=True))
    return A.MotionBlur(blur_limit=(length, length), allow_shifted=False, p=1)


def _jpeg(p, scale, size):
    return A.ImageCompression(compression_type="jpeg", quality_range=(p["quality"], p["quality"]), p=1)


def _sun_flare(p, scale, size):
    return A.RandomSunFlare(flare_roi=(0, 0, 1, 0.5), src_radius=_px(p["radius_px"], scale),
                            num_flare_circles_range=(p["circles"], p["circles"] + 1), method="overlay", p=1)


class Fog(A.ImageOnlyTransform):
    """The robustness seed's fog: (1 - f) image + f cloud, the cloud a smooth light-grey noise field (a coarse
    random grid, 8 cells high, upsampled bicubically to the frame). albumentations' RandomFog was measured and
    passed over: its density barely grows with its coefficient (contrast 40.8 -> 40.1 from 0.3 to 0.7 on the
    demo's frames) and it copies the frame once per fog particle."""

    def __init__(self, f, p=1.0):
        super().__init__(p=p)
        self.f = float(f)

    def get_params_dependent_on_data(self, params, data):
        height, width = params["shape"][:2]
        cells = (8, max(1, round(8 * width / height)))
        return {"cloud": self.random_generator.uniform(0.65, 1.0, (cells[0] + 1, cells[1] + 1)).astype(np.float32)}

    def apply(self, img, cloud=None, **params):
        height, width = img.shape[:2]
        cloud = 255.0 * cv2.resize(cloud, (width, height), interpolation=cv2.INTER_CUBIC)
        out = (1 - self.f) * img.astype(np.float32) + self.f * cloud[..., None]
        return np.clip(out, 0, 255).astype(np.uint8)

    def get_transform_init_args_names(self):
        return ("f",)


class Flakes(A.ImageOnlyTransform):
    """Falling snow flakes over the frame: ``count`` soft white discs (Gaussian, sigma ``radius``) at uniform
    random places, each of a random opacity in [0.5, 1], seeded per frame like every random draw of a corruption."""

    def __init__(self, count, radius, p=1.0):
        super().__init__(p=p)
        self.count, self.radius = int(count), float(radius)

    def get_params_dependent_on_data(self, params, data):
        height, width = params["shape"][:2]
        rng = self.random_generator
        return {"rows": rng.integers(0, height, self.count), "cols": rng.integers(0, width, self.count),
                "opacity": rng.uniform(0.5, 1.0, self.count).astype(np.float32)}

    def apply(self, img, rows=(), cols=(), opacity=(), **params):
        alpha = np.zeros(img.shape[:2], np.float32)
        np.maximum.at(alpha, (rows, cols), opacity)
        if self.radius > 0.3:  # a point blurred into a disc whose centre keeps the flake's opacity
            peak = np.float32(2 * np.pi * self.radius ** 2)
            alpha = np.minimum(1, cv2.GaussianBlur(alpha, (0, 0), self.radius) * peak)
        out = img.astype(np.float32) * (1 - alpha[..., None]) + 255 * alpha[..., None]
        return np.clip(np.rint(out), 0, 255).astype(np.uint8)

    def get_transform_init_args_names(self):
        return ("count", "radius")


class Reflection(A.ImageOnlyTransform):
    """The robustness seed's reflection: a white square of ``side`` pixels, blurred with a Gaussian of sigma
    side / 4 into a soft blob, added at a random place (its centre uniform over the frame)."""

    def __init__(self, side, p=1.0):
        super().__init__(p=p)
        self.side = int(side)

    def get_params_dependent_on_data(self, params, data):
        height, width = params["shape"][:2]
        return {"centre": (self.py_random.uniform(0, height), self.py_random.uniform(0, width))}

    def apply(self, img, centre=(0, 0), **params):
        sigma = self.side / 4
        reach = int(np.ceil(self.side / 2 + 3 * sigma))  # the blob is 0 beyond this distance from the centre
        y0, x0 = (int(round(c)) for c in centre)
        patch = np.zeros((2 * reach + 1, 2 * reach + 1), np.float32)
        half = self.side // 2
        patch[reach - half : reach - half + self.side, reach - half : reach - half + self.side] = 255.0
        patch = cv2.GaussianBlur(patch, (0, 0), sigma)
        top, left = y0 - reach, x0 - reach
        rows = slice(max(top, 0), min(top + patch.shape[0], img.shape[0]))
        cols = slice(max(left, 0), min(left + patch.shape[1], img.shape[1]))
        out = img.copy()
        region = out[rows, cols].astype(np.float32) + patch[rows.start - top : rows.stop - top,
                                                            cols.start - left : cols.stop - left, None]
        out[rows, cols] = np.clip(region, 0, 255).astype(np.uint8)
        return out

    def get_transform_init_args_names(self):
        return ("side",)


_BUILDERS = {"noise": _noise, "grey": _grey, "snow": _snow, "rain": _rain, "fog": _fog, "perspective": _perspective,
             "blur": _blur, "rotation": _rotation, "crop": _crop, "reflection": _reflection, "night": _night,
             "motion_blur": _motion_blur, "jpeg": _jpeg, "sun_flare": _sun_flare}


def severity_markdown(names=None):
    """The severity table as Markdown: one row per corruption (default: segood's own), its parameters at each
    level."""
    lines = ["| corruption | " + " | ".join(f"level {s}" for s in SEVERITIES) + " |", "|---|" + "---|" * len(SEVERITIES)]
    for name in names or severity_table():
        params = levels_table()[name]
        cells = [", ".join(f"{key} {values[k]}" for key, values in params.items()) for k in range(len(SEVERITIES))]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def contact_sheet(image, path=None, *, names=None, severities=SEVERITIES, seed=0, frame_id="", width=2.4,
                  standard_size="fixed"):
    """A figure of one frame under every corruption (rows) at every severity (columns), the clean frame first,
    so that a reader sees what "fog 4" means. Written to ``path`` (PNG) when given; returns the figure."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = list(names or corruption_names())
    for name in names:
        check_corruption(name)
    height, wide = image.shape[:2]
    cols = 1 + len(severities)
    fig, axes = plt.subplots(len(names), cols, squeeze=False,
                             figsize=(width * cols, width * height / wide * len(names) + 0.6))
    for row, name in enumerate(names):
        panels = [image] + [corrupt(image, name=name, severity=s, seed=seed, frame_id=frame_id,
                                    standard_size=standard_size)[0] for s in severities]
        for col, (ax, panel) in enumerate(zip(axes[row], panels)):
            ax.imshow(panel)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title("clean" if col == 0 else f"severity {severities[col - 1]}", fontsize=9)
            if col == 0:
                ax.set_ylabel(name, fontsize=9)
    fig.tight_layout()
    if path is not None:
        fig.savefig(path, dpi=100)
        plt.close(fig)
    return fig
