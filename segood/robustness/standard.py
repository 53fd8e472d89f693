"""The standard family: the 15 ImageNet-C corruptions at their 5 severities, as published robustness numbers of
segmentation use them (Cityscapes-C).

ImageNet-C: Hendrycks & Dietterich 2019, "Benchmarking neural network robustness to common corruptions and
perturbations"; Cityscapes-C: Kamann & Rother 2020, "Benchmarking the robustness of semantic segmentation
models"; the reference definitions: the ``imagecorruptions`` package (Michaelis et al. 2019, version 1.1.2). The
parameters are the reference's (``standard.yaml``, read by :func:`standard_table`); the code is segood's own,
vectorised with numpy and OpenCV, and draws from a ``numpy.random.Generator`` it is given (seeded per frame,
corruption and severity by :func:`segood.robustness.corruptions.corrupt`), never from numpy's global state.

Where segood departs from the reference (each named in docs/robustness.md): frost uses seeded procedural frost
textures in the tints of the reference's five photographs instead of the photographs; outputs are rounded to
uint8 (the reference truncates); the elastic transform moves the masks with the image (Cityscapes-C keeps the
labels unmoved); glass blur's pixel loop runs compiled (numba): well under a second per 1024x2048 frame.
"""

import functools
import math
from importlib import resources

import cv2
import numba
import numpy as np
import yaml

STANDARD_ROWS = 1024  #: with standard_size="height", "px" lengths are pixels of a frame of this many rows
STANDARD_SIZES = ("fixed", "height")
STANDARD_GEOMETRIC = frozenset({"elastic_transform"})  # moves pixels: the masks move with it

# Mean and standard deviation per RGB channel of the five frost photographs the reference draws from (frost1-5;
# its frost2 and frost3 are one picture, its frost6 is never drawn). The procedural texture takes one tint each
# frame, so that the frost layer's brightness and contrast are distributed as the reference's.
FROST_TINTS = (((77.7, 149.1, 165.7), (26.9, 16.5, 15.3)), ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)),
               ((200.8, 205.4, 214.5), (21.4, 22.1, 22.6)), ((137.6, 152.8, 165.2), (28.5, 28.5, 29.9)),
               ((112.4, 123.4, 134.8), (44.4, 43.3, 41.7)))


@functools.cache
def standard_table():
    """{corruption: {parameter: [value at level 1, ..., level 5]}} of the standard family (``standard.yaml``)."""
    table = yaml.safe_load(resources.files("segood.robustness").joinpath("standard.yaml").read_text())
    if set(table) != set(_CORRUPTIONS):
        raise ValueError(f"standard.yaml lists {sorted(table)}, the code builds {sorted(_CORRUPTIONS)}: "
                         "they must agree")
    return table


def standard_scale(height, standard_size):
    """The factor of "px" lengths: 1 (the standard's fixed pixel sizes) or ``height`` / 1024."""
    if standard_size not in STANDARD_SIZES:
        raise ValueError(f"standard_size must be one of {STANDARD_SIZES} (fixed: the published pixel sizes; "
                         f"height: scaled to the frame's rows / {STANDARD_ROWS}), got {standard_size!r}")
    return 1.0 if standard_size == "fixed" else height / STANDARD_ROWS


def apply_standard(image, masks, name, params, rng, scale=1.0):
    """One standard corruption of one frame.

    Args:
        image: (H, W, 3) uint8 RGB. masks: label maps (H, W), moved by the geometric ones, else returned as they are.
        name: a corruption of :func:`standard_table`. params: its parameters at one level ({name: value}).
        rng: the ``numpy.random.Generator`` every random draw comes from. scale: the factor of "px" lengths.

    Returns:
        (image (H, W, 3) uint8, [masks]).
    """
    x = image.astype(np.float32) * np.float32(1 / 255)
    out = _CORRUPTIONS[name](x, params, rng, scale)
    if isinstance(out, tuple):  # a geometric one: the image and the source coordinates of every pixel
        out, (rows, cols) = out
        masks = [m[rows, cols] for m in masks]
    if out.dtype != np.uint8:
        out = np.rint(np.clip(out, 0, 1) * 255).astype(np.uint8)
    return out, list(masks)


# -- helpers -----------------------------------------------------------------------------------------------------

def _gaussian(x, sigma, *, border=cv2.BORDER_REPLICATE, truncate=4.0):
    """scipy's gaussian_filter (the reference's skimage ``gaussian``: kernel radius int(truncate sigma + 0.5),
    border 'nearest') per channel, with OpenCV. ``sigma``: a number or (rows, cols)."""
    sy, sx = (sigma, sigma) if np.isscalar(sigma) else sigma
    ky, kx = (2 * int(truncate * s + 0.5) + 1 for s in (sy, sx))
    return cv2.GaussianBlur(x, (kx, ky), sigmaX=sx, sigmaY=sy, borderType=border)


def _streak(x, radius, sigma, angle):
    """The reference's motion blur: the sum over i < 2 radius + 1 of gauss(i; sigma) (normalised) times the frame
    shifted by i pixels along ``angle`` (degrees; edges repeated), as one correlation with OpenCV."""
    width = 2 * radius + 1
    weights = np.exp(-np.arange(width) ** 2 / (2 * sigma ** 2))
    weights /= weights.sum()
    sin, cos = math.sin(math.radians(angle)), math.cos(math.radians(angle))
    dy = np.array([-math.ceil(i * sin - 0.5) for i in range(width)])  # the shift of copy i: frame[y - dy, x - dx]
    dx = np.array([-math.ceil(i * cos - 0.5) for i in range(width)])
    rows, cols = -dy - (-dy).min(), -dx - (-dx).min()
    kernel = np.zeros((rows.max() + 1, cols.max() + 1), np.float32)
    np.add.at(kernel, (rows, cols), weights.astype(np.float32))
    anchor = (int(dx.max()), int(dy.max()))  # kernel cell (r, c) reads the frame at offset (r - anchor_y, c - anchor_x)
    return cv2.filter2D(x, -1, kernel, anchor=anchor, borderType=cv2.BORDER_REPLICATE)


def _zoom_map(size, factor):
    """Source coordinates (along one axis) of the reference's clipped zoom: the centre ceil(size / factor) pixels
    stretched by ``factor`` with scipy's zoom (corner-aligned: output i reads i (n - 1) / (m - 1)), cropped to size."""
    n = int(np.ceil(size / factor))
    top = (size - n) // 2
    m = int(round(n * factor))
    return top + np.arange(size, dtype=np.float32) * np.float32((n - 1) / (m - 1))


def _clipped_zoom(x, factor):
    """The frame's centre zoomed in by ``factor`` (>= 1), linear interpolation, the size kept."""
    if factor == 1:
        return x
    height, width = x.shape[:2]
    ys, xs = _zoom_map(height, factor), _zoom_map(width, factor)
    matrix = np.float32([[xs[1] - xs[0], 0, xs[0]], [0, ys[1] - ys[0], ys[0]]])
    return cv2.warpAffine(x, matrix, (width, height), flags=cv2.INTER_LINEAR | cv2.WARP_INVERSE_MAP,
                          borderMode=cv2.BORDER_REPLICATE)


@numba.njit(nogil=True, cache=True)
def _neighbour_copy_kernel(image, offsets, delta):
    """The reference's glass-blur loop, in its order: from the bottom-right pixel to the top-left one (a margin of
    ``delta`` left out), each pixel takes the value its neighbour (dy, dx) holds at that moment."""
    height, width, channels = image.shape
    k = 0
    for h in range(height - delta, delta, -1):
        for w in range(width - delta, delta, -1):
            sy, sx = h + offsets[k, 0], w + offsets[k, 1]
            k += 1
            for c in range(channels):
                image[h, w, c] = image[sy, sx, c]


def _plasma(size, decay, rng):
    """A size x size plasma fractal in [0, 1] (diamond-square; wibble 100, divided by ``decay`` each octave)."""
    grid = np.zeros((size, size))
    step, wibble = size, 100.0
    while step >= 2:
        half = step // 2
        corners = grid[0:size:step, 0:size:step]
        square = corners + np.roll(corners, -1, axis=0)
        square += np.roll(square, -1, axis=1)
        grid[half:size:step, half:size:step] = square / 4 + wibble * rng.uniform(-wibble, wibble, square.shape)
        centres, corners = grid[half:size:step, half:size:step], grid[0:size:step, 0:size:step]
        left = centres + np.roll(centres, 1, axis=0) + corners + np.roll(corners, -1, axis=1)
        grid[0:size:step, half:size:step] = left / 4 + wibble * rng.uniform(-wibble, wibble, left.shape)
        top = centres + np.roll(centres, 1, axis=1) + corners + np.roll(corners, -1, axis=0)
        grid[half:size:step, 0:size:step] = top / 4 + wibble * rng.uniform(-wibble, wibble, top.shape)
        step, wibble = half, wibble / decay
    grid -= grid.min()
    return grid / grid.max()


def _frost_texture(height, width, rng):
    """A procedural frost layer (H, W, 3) float32 on [0, 255]: ridged multi-octave noise (thin bright crystal
    veins over a mottled ground), standardised and put in one of the :data:`FROST_TINTS`."""
    texture = np.zeros((height, width), np.float32)
    for octave, cells in enumerate((8, 16, 32, 64, 128, 256)):  # the fine octaves weigh most: crystals, not clouds
        cells = min(cells, max(2, height // 2))
        grid = rng.standard_normal((cells + 1, max(2, round(cells * width / height)) + 1)).astype(np.float32)
        layer = cv2.resize(grid, (width, height), interpolation=cv2.INTER_CUBIC)
        texture += 0.75 ** (5 - octave) * (1 - np.abs(layer))  # ridges where the noise crosses 0: veins
    texture += 0.15 * rng.standard_normal((height, width), dtype=np.float32)  # grain
    texture = (texture - texture.mean()) / texture.std()
    mean, std = FROST_TINTS[rng.integers(len(FROST_TINTS))]
    return np.float32(mean) + np.float32(std) * texture[..., None]


def _rgb_to_grey(x):
    return cv2.cvtColor(x, cv2.COLOR_RGB2GRAY)[..., None]


# -- the corruptions: (x (H, W, 3) float32 on [0, 1], params, rng, scale) -> image (float on [0, 1] or uint8),
#    or (image, (source rows, source cols)) for a geometric one ---------------------------------------------------

def _gaussian_noise(x, p, rng, scale):
    return x + np.float32(p["std"]) * rng.standard_normal(x.shape, dtype=np.float32)


def _shot_noise(x, p, rng, scale):
    photons = p["photons"]
    return rng.poisson(x * photons).astype(np.float32) / np.float32(photons)


def _impulse_noise(x, p, rng, scale):
    draw = rng.random(x.shape, dtype=np.float32)
    amount = np.float32(p["amount"])
    out = x.copy()
    out[draw < amount / 2] = 1  # salt and pepper, half each (skimage's salt_vs_pepper 0.5)
    out[(draw >= amount / 2) & (draw < amount)] = 0
    return out


def _defocus_blur(x, p, rng, scale):
    radius, alias = p["radius_px"] * scale, p["alias_sigma_px"] * scale
    reach = 8 if radius <= 8 else int(np.ceil(radius))
    grid = np.arange(-reach, reach + 1)
    disk = ((grid[:, None] ** 2 + grid[None, :] ** 2) <= radius ** 2).astype(np.float32)
    disk /= disk.sum()
    size = 3 if radius <= 8 else 5
    disk = cv2.GaussianBlur(disk, (size, size), sigmaX=alias) if alias > 0 else disk
    return cv2.filter2D(x, -1, disk, borderType=cv2.BORDER_REFLECT_101)


def _glass_blur(x, p, rng, scale):
    sigma, delta = p["sigma_px"] * scale, max(1, round(p["max_delta_px"] * scale))
    height, width = x.shape[:2]
    # the reference stores the first blur as uint8 by truncation before the pixel loop
    blurred = (_gaussian(x, sigma) * 255).astype(np.uint8)
    count = max(0, height - 2 * delta) * max(0, width - 2 * delta)
    for _ in range(p["iterations"]):
        offsets = rng.integers(-delta, delta, size=(count, 2), dtype=np.int16)  # [-delta, delta): the reference's
        _neighbour_copy_kernel(blurred, offsets, delta)
    return _gaussian(blurred.astype(np.float32) * np.float32(1 / 255), sigma)


def _motion_blur(x, p, rng, scale):
    angle = rng.uniform(-45, 45)
    radius, sigma = max(1, round(p["radius_px"] * scale)), p["sigma_px"] * scale
    return _streak(x, radius, sigma, angle)


def _zoom_blur(x, p, rng, scale):
    out = x.copy()
    for k in range(p["count"]):
        out += _clipped_zoom(x, 1 + k * p["step"])
    return out / np.float32(p["count"] + 1)


def _snow(x, p, rng, scale):
    height, width = x.shape[:2]
    layer = (p["mean"] + p["std"] * rng.standard_normal((height, width), dtype=np.float32)).astype(np.float32)
    layer = _clipped_zoom(layer, max(1.0, p["zoom_px"] * scale))
    layer[layer < p["threshold"]] = 0
    layer = np.clip(layer, 0, 1)
    layer = _streak(layer, max(1, round(p["radius_px"] * scale)), p["sigma_px"] * scale, rng.uniform(-135, -45))
    layer = (np.rint(layer * 255) / 255).astype(np.float32)[..., None]  # the reference rounds the flakes to 8 bits
    keep = np.float32(p["keep"])
    x = keep * x + (1 - keep) * np.maximum(x, _rgb_to_grey(x) * 1.5 + 0.5)
    return x + layer + layer[::-1, ::-1]


def _frost(x, p, rng, scale):
    frost = _frost_texture(*x.shape[:2], rng)
    return (np.float32(p["image"]) * 255 * x + np.float32(p["frost"]) * frost) * np.float32(1 / 255)


def _fog(x, p, rng, scale):
    height, width = x.shape[:2]
    size = 1 << (max(height, width) - 1).bit_length()
    fog = _plasma(size, p["decay"], rng)[:height, :width, None].astype(np.float32)
    peak, thickness = x.max(), np.float32(p["thickness"])
    return (x + thickness * fog) * (peak / (peak + thickness))


def _brightness(x, p, rng, scale):
    # + shift on HSV's value V = max(R, G, B): hue and saturation kept, so each pixel is scaled by V' / V (a black
    # pixel, saturation 0, becomes grey V')
    value = x.max(axis=2, keepdims=True)
    lifted = np.minimum(value + np.float32(p["shift"]), 1)
    return np.where(value > 0, x * (lifted / np.where(value > 0, value, 1)), lifted)


def _contrast(x, p, rng, scale):
    means = x.mean(axis=(0, 1), keepdims=True, dtype=np.float64).astype(np.float32)
    return (x - means) * np.float32(p["factor"]) + means


def _elastic_transform(x, p, rng, scale):
    height, width = x.shape[:2]
    reach, alpha = 0.005 * height, p["alpha"]
    sigma = (0.01 * height, 0.01 * width)
    dx, dy = (alpha * _gaussian(rng.uniform(-reach, reach, (height, width)).astype(np.float32), sigma,
                                border=cv2.BORDER_REFLECT, truncate=3.0) for _ in range(2))
    rows = np.arange(height, dtype=np.float32)[:, None] + dy
    cols = np.arange(width, dtype=np.float32)[None, :] + dx
    out = cv2.remap(x, cols, rows, interpolation=cv2.INTER_LINEAR, borderMode=cv2.BORDER_REFLECT)
    return out, (_reflect(np.rint(rows).astype(np.intp), height), _reflect(np.rint(cols).astype(np.intp), width))


def _reflect(index, size):
    """Indices outside [0, size) mirrored back in (scipy's 'reflect', OpenCV's BORDER_REFLECT: ...cba|abc...)."""
    index = np.mod(index, 2 * size)
    return np.where(index < size, index, 2 * size - 1 - index)


def _box_bounds(size, new_size):
    """[first, last) source pixels of each output pixel of a box downscale from ``size`` to ``new_size`` pixels:
    those whose centres lie in the output pixel's footprint, (centre - scale / 2, centre + scale / 2] (PIL's BOX
    filter, which the reference uses; OpenCV's INTER_AREA weighs partly covered pixels instead)."""
    scale = size / new_size
    centre = (np.arange(new_size) + 0.5) * scale
    first = np.maximum((centre - scale / 2 + 0.5).astype(np.intp), 0)
    taps = first[:, None] + np.arange(int(np.ceil(scale / 2)) * 2 + 2)[None, :]
    weight_at = (taps - centre[:, None] + 0.5) / scale
    inside = (weight_at > -0.5) & (weight_at <= 0.5) & (taps < size)
    lo = taps[np.arange(new_size), inside.argmax(axis=1)]
    return lo, lo + inside.sum(axis=1)


def _box_mean(image, axis, new_size):
    """``image`` (uint8) box-downscaled along ``axis`` by means of contiguous runs (prefix sums), rounded to uint8."""
    lo, hi = _box_bounds(image.shape[axis], new_size)
    sums = np.cumsum(image, axis=axis, dtype=np.int64)
    sums = np.concatenate([np.zeros_like(np.take(sums, [0], axis=axis)), sums], axis=axis)
    shape = [1] * image.ndim
    shape[axis] = new_size
    means = (np.take(sums, hi, axis=axis) - np.take(sums, lo, axis=axis)) / (hi - lo).reshape(shape)
    return np.floor(means + 0.5).astype(np.uint8)


def _pixelate(x, p, rng, scale):
    height, width = x.shape[:2]
    image = np.rint(x * 255).astype(np.uint8)
    small = _box_mean(_box_mean(image, 1, int(width * p["factor"])), 0, int(height * p["factor"]))  # PIL: rows first
    return cv2.resize(small, (width, height), interpolation=cv2.INTER_NEAREST_EXACT)


def _jpeg_compression(x, p, rng, scale):
    image = cv2.cvtColor(np.rint(x * 255).astype(np.uint8), cv2.COLOR_RGB2BGR)
    ok, data = cv2.imencode(".jpg", image, [cv2.IMWRITE_JPEG_QUALITY, int(p["quality"])])
    return cv2.cvtColor(cv2.imdecode(data, cv2.IMREAD_COLOR), cv2.COLOR_BGR2RGB)


_CORRUPTIONS = {"gaussian_noise": _gaussian_noise, "shot_noise": _shot_noise, "impulse_noise": _impulse_noise,
                "defocus_blur": _defocus_blur, "glass_blur": _glass_blur, "motion_blur": _motion_blur,
                "zoom_blur": _zoom_blur, "snow": _snow, "frost": _frost, "fog": _fog, "brightness": _brightness,
                "contrast": _contrast, "elastic_transform": _elastic_transform, "pixelate": _pixelate,
                "jpeg_compression": _jpeg_compression}
