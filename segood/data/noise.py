"""Synthetic whole-image OOD sets: Perlin noise (Perlin 1985) and random normal noise.

Deterministic from a seed, the same bytes on every machine: each frame draws from its own
``numpy.random.default_rng([seed, index])`` and the maths uses only +, -, *, / and rounding (no
transcendental functions, whose last bits may differ between libms).
"""

import numpy as np

from segood.arguments import natural, non_negative_float, positive_int
from segood.data.adapter import CITYSCAPES_SIZE, Adapter, register_adapter
from segood.data.common import Sample
from segood.labels import IGNORE, OOD

# Perlin's gradient directions (the "improved noise" set in 2-D): no trigonometry needed.
_GRADIENTS = np.array([(1, 1), (-1, 1), (1, -1), (-1, -1), (1, 0), (-1, 0), (0, 1), (0, -1)], np.float64)
KINDS = ("perlin", "normal")


def perlin_octave(rng, height, width, cells):
    """One octave of 2-D gradient noise with ``cells`` lattice cells across the width, values in about [-1, 1]."""
    cells_y = max(1, int(round(cells * height / width)))
    grad = _GRADIENTS[rng.integers(0, len(_GRADIENTS), (cells_y + 1, cells + 1))]
    y = np.arange(height) * (cells_y / height)
    x = np.arange(width) * (cells / width)
    iy, ix = y.astype(np.int64), x.astype(np.int64)
    fy, fx = (y - iy)[:, None], (x - ix)[None, :]

    def corner(dy, dx):  # (the gradients of each pixel's corner, a component at a time: rows, then columns)
        gx, gy = (np.take(np.take(grad[..., k], iy + dy, axis=0), ix + dx, axis=1) for k in (0, 1))
        return gx * (fx - dx) + gy * (fy - dy)

    def fade(t):  # 6t^5 - 15t^4 + 10t^3: zero first and second derivatives at the lattice
        return t * t * t * (t * (t * 6 - 15) + 10)

    wy, wx = fade(fy), fade(fx)
    top_left, bottom_left = corner(0, 0), corner(1, 0)
    top = top_left + wx * (corner(0, 1) - top_left)
    bottom = bottom_left + wx * (corner(1, 1) - bottom_left)
    return top + wy * (bottom - top)


def perlin_image(rng, height, width, frequency=4, octaves=4, persistence=0.5):
    """(H, W, 3) uint8: fractal Perlin noise per channel, large smooth colour blobs."""
    channels = []
    for _ in range(3):
        total, amplitude, norm = np.zeros((height, width)), 1.0, 0.0
        for octave in range(octaves):
            total += amplitude * perlin_octave(rng, height, width, frequency * 2**octave)
            norm += amplitude
            amplitude *= persistence
        channels.append(total / norm)
    noise = np.stack(channels, axis=-1)  # about [-1, 1]; stretch so the blobs use the colour range
    return np.clip(np.rint((noise * 1.5 + 1.0) * 127.5), 0, 255).astype(np.uint8)


def check_lattice(frequency, octaves, width):
    """Refuse Perlin settings whose finest octave has more lattice cells across (``frequency * 2**(octaves - 1)``)
    than the frame has pixels of width: such an octave adds nothing a pixel can show, and its lattice alone can
    take gigabytes."""
    if octaves - 1 > width.bit_length() or frequency << (octaves - 1) > width:
        raise ValueError(f"Perlin noise of frequency {frequency} and {octaves} octaves would have frequency * "
                         f"2**(octaves - 1) lattice cells across its finest octave, more than the frame's {width} "
                         f"pixels of width: that product must be at most {width} (fewer --octaves, a lower "
                         "--frequency or a larger --size)")


def normal_image(rng, height, width, sigma=0.25):
    """(H, W, 3) uint8: i.i.d. N(0.5, sigma) per pixel and channel in [0, 1] units, clipped."""
    noise = 0.5 + sigma * rng.standard_normal((height, width, 3))
    return np.clip(np.rint(noise * 255.0), 0, 255).astype(np.uint8)


@register_adapter
class Noise(Adapter):
    """``count`` noise frames of one kind, generated at ``size``; every pixel OOD, no Cityscapes class."""

    name = "noise"
    help = "Perlin or random normal noise, every pixel OOD, the same bytes on every machine"
    default_split = None

    def __init__(self, kind="perlin", count=100, size=CITYSCAPES_SIZE, seed=0, **params):
        if kind not in KINDS:
            raise ValueError(f"noise kind must be one of {KINDS}, got {kind!r}")
        least = {"count": (count, 1), "frequency": (params.get("frequency", 1), 1),
                 "octaves": (params.get("octaves", 1), 1), "seed": (seed, 0)}
        wrong = [f"{k} {v!r}" for k, (v, low) in least.items() if int(v) != v or v < low]
        if not 0 <= params.get("sigma", 0) < np.inf:
            wrong.append(f"sigma {params['sigma']!r}")
        if wrong:
            raise ValueError(f"noise needs a count, frequency and octaves of at least 1, a seed of at least 0 and a "
                             f"finite sigma of at least 0; got {', '.join(wrong)}")
        if kind == "perlin":  # (4 and 4: perlin_image's defaults)
            check_lattice(int(params.get("frequency", 4)), int(params.get("octaves", 4)), int(size[1]))
        self.kind, self.count, self.size, self.seed, self.params = kind, int(count), tuple(size), int(seed), params
        self.source = f"{kind}_noise"

    @property
    def default_size(self):
        return self.size

    @classmethod
    def add_arguments(cls, parser):
        parser.add_argument("--kind", choices=KINDS, default="perlin")
        parser.add_argument("--count", type=positive_int, default=100)
        parser.add_argument("--seed", type=natural, default=0)
        parser.add_argument("--frequency", type=positive_int, default=4, help="Perlin lattice cells across the width")
        parser.add_argument("--octaves", type=positive_int, default=4)
        parser.add_argument("--sigma", type=non_negative_float, default=0.25, help="normal noise std in [0, 1] units")

    @classmethod
    def from_args(cls, args):
        params = {"frequency": args.frequency, "octaves": args.octaves} if args.kind == "perlin" else {"sigma": args.sigma}
        return cls(args.kind, args.count, size=args.size or CITYSCAPES_SIZE, seed=args.seed, **params)

    def refs(self):
        return list(range(self.count))

    def frame_id(self, index):
        return f"{self.kind}/{index:06d}"

    def load(self, index):
        rng = np.random.default_rng([self.seed, index])
        make = perlin_image if self.kind == "perlin" else normal_image
        image = make(rng, *self.size, **self.params)
        shape = self.size
        return Sample(image, np.full(shape, OOD, np.uint8), np.full(shape, IGNORE, np.uint8), self.frame_id(index))
