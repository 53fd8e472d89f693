"""The search space of the attack: one OOD object pasted on the ground of a clean frame, as a point of the unit
cube [0, 1]^D.

Each dimension decodes to one parameter (:data:`DIMENSIONS`): which OOD object's outline (from the paste
generator's bank: SUN2012 or the demo's objects, only those the label map calls OOD), its fill (the object's own
pixels, fractal Perlin noise, normal noise, or a flat colour; ``segood.data.noise``), the fill's pattern seed,
Perlin frequency and roughness, mean colour (r, g, b), contrast, brightness, and the placement: base position
(x across the frame, y between the horizon and the bottom) and height over the base's distance below the horizon,
as the paste generator scales objects (``segood.data.paste.place_at``). The pasted pixels are composited by the
paste generator's :func:`~segood.data.paste.render` with its blending; masks never pass through interpolation.

With a generator (:mod:`segood.attack.generator`, an autoencoder over the bank's OOD object crops) the space gains
one more fill, ``learned``: the decoder's image for a latent z, stretched over the object's bounding box and
used as the object's own pixels are (its mean replaced by the colour dimensions, its amplitude scaled by
contrast). The latent's ``latent`` numbers are appended to the cube as dimensions ``z0``, ``z1``, ... mapped
linearly to the decoder's latent cube [-1, 1] (z = 2u - 1: the paper's search space Z = [-1, 1]^D_z), so the same
proposals move them, one dimension at a time (the paper's latent search). Without a generator the space, its
decoding and its description are exactly those above, so earlier sets stay reproducible.

The sampler is uniform on the cube; the proposal kernel moves one dimension, chosen uniformly, by a Gaussian
step reflected at 0 and 1 (symmetric, so the Metropolis ratio needs no Hastings correction), as the
adversarial-distributions paper's sampler moves one latent dimension at a time.
"""

import json
import math
from dataclasses import dataclass

import cv2
import numpy as np

from segood.data.noise import normal_image, perlin_image
from segood.data.paste import BLENDS, GROUND, HEIGHT_RATIO, ground_horizon, place_at, render
from segood.labels import IGNORE, OOD

TEXTURES = ("object", "perlin", "normal", "flat")
PATTERNS = 16  # fill seeds: the pattern dimension picks one of these
FREQUENCY = (1.0, 8.0)  # Perlin lattice cells across the object (log scale)
ROUGHNESS = (0.3, 0.8)  # Perlin persistence; normal noise's sigma is half of it
BRIGHTNESS = (0.5, 1.5)
#: The decoded parameters a fill never reads (flat: its pattern is zero, so contrast scales nothing).
INERT = {"object": ("pattern", "frequency", "roughness", "latent"), "perlin": ("latent",),
         "normal": ("frequency", "latent"), "flat": ("pattern", "frequency", "roughness", "contrast", "latent"),
         "learned": ("pattern", "frequency", "roughness")}
#: The dimensions of the unit cube, in order.
DIMENSIONS = ("object", "texture", "pattern", "frequency", "roughness", "red", "green", "blue", "contrast",
              "brightness", "x", "y", "height_ratio")


@dataclass(frozen=True)
class Scene:
    """A clean frame to paste onto: image (H, W, 3) uint8, ood_mask and semantic (H, W) uint8, its ground
    (road and sidewalk) and horizon row."""

    frame_id: str
    image: np.ndarray
    ood_mask: np.ndarray
    semantic: np.ndarray
    ground: np.ndarray
    horizon: int

    @classmethod
    def from_item(cls, item):
        """A Scene from an :class:`~segood.data.h5.H5SegmentationDataset` item; ValueError when the frame holds
        OOD pixels (the attack pastes onto clean ID frames) or no road or sidewalk."""
        image = item["image"].permute(1, 2, 0).numpy()
        ood_mask, semantic = item["ood_mask"].numpy(), item["semantic"].numpy()
        if (ood_mask == OOD).any():
            raise ValueError(f"{item['frame_id']} holds OOD pixels: the attack pastes onto clean ID frames "
                             "(e.g. a converted Cityscapes val split)")
        ground = np.isin(semantic, GROUND)
        horizon = ground_horizon(ground)
        if horizon is None:
            raise ValueError(f"{item['frame_id']}: no road or sidewalk to paste onto")
        return cls(item["frame_id"], image, ood_mask, semantic, ground, horizon)


@dataclass
class Candidate:
    """A rendered point: image, ood_mask, semantic (H, W(, 3)) uint8, ``region`` (H, W) bool (the pasted
    pixels), ``params`` (the decoded parameters)."""

    image: np.ndarray
    ood_mask: np.ndarray
    semantic: np.ndarray
    region: np.ndarray
    params: dict


def check_blend(blend):
    """``blend``, or a ValueError: one of :data:`~segood.data.paste.BLENDS`."""
    if blend not in BLENDS:
        raise ValueError(f"blend (--blend) must be one of {', '.join(BLENDS)}, got {blend!r}")
    return blend


def check_height_ratio(height_ratio):
    """(low, high) as two floats, or a ValueError: two finite numbers with 0 < low <= high."""
    try:
        low, high = (float(v) for v in height_ratio)
    except (TypeError, ValueError):
        low = high = math.nan
    if not (0 < low <= high and math.isfinite(high)):
        raise ValueError(f"height_ratio (--height-ratio LOW HIGH) must be two finite numbers with 0 < LOW <= HIGH, "
                         f"got {height_ratio!r}; the default is {list(HEIGHT_RATIO)}")
    return low, high


class SearchSpace:
    """Points of [0, 1]^D (D = len(DIMENSIONS)) and how they render onto a :class:`Scene`.

    Args:
        objects: the OOD :class:`~segood.data.paste.PasteObject` bank (outlines and own pixels).
        object_image: callable returning an object's (h, w, 3) uint8 image (``Paste.object_image``).
        blend: the paste generator's blending (``none``, ``feather``, ``seamless``).
        height_ratio: (low, high) of the pasted height over the base's distance below the horizon.
        generator: an :class:`~segood.attack.generator.Autoencoder` whose decoder makes the ``learned`` fill
            (None: the four parametric fills only, and D = 13).
    """

    def __init__(self, objects, object_image, *, blend="feather", height_ratio=HEIGHT_RATIO, generator=None):
        if not objects:
            raise ValueError("the search space needs at least one OOD object to take outlines from")
        self.objects, self.object_image = list(objects), object_image
        self.blend, self.height_ratio = check_blend(blend), check_height_ratio(height_ratio)
        self.generator = generator
        self.textures = TEXTURES + (("learned",) if generator is not None else ())
        self.dimensions = DIMENSIONS + (tuple(f"z{k}" for k in range(generator.latent)) if generator is not None
                                        else ())
        self.dims = len(self.dimensions)

    def describe(self):
        """The space's definition, for manifests."""
        described = {"dimensions": list(self.dimensions), "textures": list(self.textures), "patterns": PATTERNS,
                     "frequency": list(FREQUENCY), "roughness": list(ROUGHNESS), "brightness": list(BRIGHTNESS),
                     "height_ratio": list(self.height_ratio), "blend": self.blend,
                     "objects": [o.key for o in self.objects]}
        if self.generator is not None:
            described["generator"] = {**self.generator.config(), "sha256": self.generator.digest()}
        return described

    def sample(self, rng):
        """A point drawn uniformly from the cube: (D,) float64."""
        return rng.random(self.dims)

    def propose(self, u, rng, step):
        """``u`` with one dimension (uniform) moved by N(0, step²), reflected into [0, 1]: a symmetric kernel."""
        v = np.array(u, np.float64)
        d = int(rng.integers(self.dims))
        v[d] = reflect(v[d] + step * rng.standard_normal())
        return v

    def decode(self, u):
        """The parameters of point ``u``: a dict of plain values (the manifest's per-frame record)."""
        u = np.asarray(u, np.float64)
        if u.shape != (self.dims,) or not ((u >= 0) & (u <= 1)).all():
            raise ValueError(f"a point of the search space is {self.dims} numbers in [0, 1], got {u!r}")
        v = dict(zip(self.dimensions, u.tolist()))
        obj = self.objects[_pick(v["object"], len(self.objects))]
        lo, hi = self.height_ratio
        latent = {} if self.generator is None else {"latent": [2.0 * x - 1.0 for x in u[len(DIMENSIONS):].tolist()]}
        return {"object": obj.key, "name": obj.name, "texture": self.textures[_pick(v["texture"], len(self.textures))],
                "pattern": _pick(v["pattern"], PATTERNS),
                "frequency": FREQUENCY[0] * (FREQUENCY[1] / FREQUENCY[0]) ** v["frequency"],
                "roughness": ROUGHNESS[0] + (ROUGHNESS[1] - ROUGHNESS[0]) * v["roughness"],
                "colour": [255.0 * v["red"], 255.0 * v["green"], 255.0 * v["blue"]], "contrast": v["contrast"],
                "brightness": BRIGHTNESS[0] + (BRIGHTNESS[1] - BRIGHTNESS[0]) * v["brightness"],
                "x": v["x"], "y": v["y"], "height_ratio": lo + (hi - lo) * v["height_ratio"], **latent,
                "u": u.tolist()}

    def render_key(self, u):
        """What the image of point ``u`` depends on: its decoded parameters less those its fill never reads, with
        Perlin's frequency as the lattice it rounds to. Two points of one key render the same image on every scene
        (tested), so the search scores such a proposal without a network pass."""
        params = self.decode(u)
        key = {k: v for k, v in params.items() if k not in INERT[params["texture"]] and k not in ("u", "name")}
        if params["texture"] == "perlin":
            key["frequency"] = _lattice(params["frequency"])
        return json.dumps(key, sort_keys=True)

    def fill(self, params, obj):
        """The object's source image re-filled by ``params``: (h, w, 3) uint8 at the object's own size."""
        source = self.object_image(obj)
        h, w = source.shape[:2]
        rng = np.random.default_rng([params["pattern"], h, w])
        texture = params["texture"]
        if texture == "object":
            own = source.astype(np.float64)
            pattern = (own - own.mean(axis=(0, 1))) / 127.5
        elif texture == "perlin":
            frequency = _lattice(params["frequency"])
            pattern = perlin_image(rng, h, w, frequency, 3, params["roughness"]) / 127.5 - 1.0
        elif texture == "learned":
            own = self.learned_texture(params["latent"], obj.polygon, h, w)
            pattern = (own - own.mean(axis=(0, 1))) / 127.5
        elif texture == "normal":
            pattern = normal_image(rng, h, w, params["roughness"] / 2) / 127.5 - 1.0
        else:
            pattern = np.zeros((h, w, 3))
        colour = np.asarray(params["colour"], np.float64)
        pixels = (colour + params["contrast"] * 127.5 * pattern) * params["brightness"]
        return np.clip(np.rint(pixels), 0, 255).astype(np.uint8)

    def learned_texture(self, latent, polygon, height, width):
        """The decoder's image for ``latent`` stretched (bilinear) over the polygon's bounding box in a
        (height, width, 3) float64 canvas on the 0-255 scale, its edges replicated beyond the box."""
        points = np.asarray(polygon, np.float64)
        x0, y0 = (max(0, math.floor(v)) for v in points.min(axis=0))
        x1 = min(width, math.ceil(points[:, 0].max()) + 1)
        y1 = min(height, math.ceil(points[:, 1].max()) + 1)
        texture = cv2.resize(255.0 * self.generator.texture(latent), (x1 - x0, y1 - y0),
                             interpolation=cv2.INTER_LINEAR)
        return np.pad(texture, ((y0, height - y1), (x0, width - x1), (0, 0)), mode="edge")

    def render(self, scene, u):
        """The :class:`Candidate` of point ``u`` on ``scene``, or None when its placement breaks the paste
        generator's rules (too small, too wide, or a footprint mostly off road and sidewalk)."""
        params = self.decode(u)
        obj = next(o for o in self.objects if o.key == params["object"])
        height, width = scene.ground.shape
        top = scene.horizon + 1
        base = (params["x"] * (width - 1), top + params["y"] * (height - 1 - top))
        placement = place_at(obj.polygon, scene.ground, scene.horizon, base, params["height_ratio"])
        if placement is None:
            return None
        scale, offset, base, (x0, y0), mask = placement
        image = scene.image.copy()
        render(image, self.fill(params, obj), obj.polygon, scale, offset, (x0, y0), mask, self.blend)
        region = np.zeros((height, width), bool)
        region[y0:y0 + mask.shape[0], x0:x0 + mask.shape[1]] = mask
        ood_mask, semantic = scene.ood_mask.copy(), scene.semantic.copy()
        ood_mask[region], semantic[region] = OOD, IGNORE
        params.update(base=[float(base[0]), float(base[1])], scale=float(scale), pixels=int(region.sum()))
        return Candidate(image, ood_mask, semantic, region, params)


def reflect(value):
    """``value`` folded into [0, 1] by reflection at 0 and 1 (period 2)."""
    value = abs(float(value)) % 2.0
    return 2.0 - value if value > 1.0 else value


def _lattice(frequency):
    """The Perlin lattice cells of a frequency parameter."""
    return max(1, int(round(frequency)))


def _pick(value, count):
    """The discrete choice in range(count) of a coordinate in [0, 1]."""
    return min(int(value * count), count - 1)

