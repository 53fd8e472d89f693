"""The attack's learned fill: a small convolutional autoencoder over OOD object crops, whose decoder is the
adversarial-distributions paper's generator g(z) (seed 002: an autoencoder trained on the known outliers, its
decoder searched over the latent cube Z = [-1, 1]^D_z).

Crops (:func:`object_crops`): each OOD object of the paste bank cut at its polygon's bounding box, resized to
``SIZE`` x ``SIZE`` (area interpolation; the image only), its mask the polygon drawn again at that size (PNPOLY,
never an interpolated mask), the pixels outside the mask set to the object's mean colour inside it (so that the
decoder learns the object's texture, not the background its annotator left around it); each crop also enters
mirrored (the paper's horizontal flips, made deterministic).

The network (:class:`Autoencoder`): three stride-2 convolutions (16, 32, 64 channels) and a linear layer to a
``tanh`` latent of ``latent`` numbers after a batch norm (the paper's FC-BN-Tanh: the latent space is the cube
[-1, 1]^latent; without the norm, a bank of a few dozen objects drives the tanh into saturation within a few
epochs and every crop decodes to the mean), and back through a linear layer and three transposed convolutions to
a sigmoid RGB image in [0, 1]. The decoder has no norm: it is a pure function of z. Trained (:func:`train`) by
Adam on the mean squared error over the crop, seeded (weights and batch order from ``seed``), on the CPU.

Files (:func:`save_generator`, :func:`load_generator`): a plain dict (format tag, settings, state dict, the
training's record) written atomically with ``torch.save`` and read with ``torch.load(weights_only=True)``;
a pickle of Python objects or another file is refused with a ValueError that says what it is.
"""

import hashlib
import math

import cv2
import numpy as np
import torch
from torch import nn
from tqdm import tqdm

from segood.data.paste import polygon_mask
from segood.io import atomic_output
from segood.models.checkpoint import safe_load
from segood.version import __version__

FORMAT = "segood.generator/1"
SIZE = 32  # crop side (pixels): three stride-2 layers down to 4 x 4
WIDTHS = (16, 32, 64)
LATENT = 16


def object_crops(objects, object_image, size=SIZE):
    """The training crops of ``objects`` (PasteObjects): (images (N, 3, size, size) float32 in [0, 1], masks
    (N, size, size) bool), in the objects' order; outside its mask a crop holds the object's mean colour."""
    images, masks = [], []
    for obj in objects:
        source = object_image(obj)
        points = np.asarray(obj.polygon, np.float64)
        x0, y0 = (max(0, math.floor(v)) for v in points.min(axis=0))
        x1 = min(source.shape[1], math.ceil(points[:, 0].max()) + 1)
        y1 = min(source.shape[0], math.ceil(points[:, 1].max()) + 1)
        crop = cv2.resize(np.ascontiguousarray(source[y0:y1, x0:x1]), (size, size), interpolation=cv2.INTER_AREA)
        # the polygon in the crop's pixel-centre coordinates: source pixel centre x maps to (x - x0 + 0.5) * s - 0.5
        scale = np.array([size / (x1 - x0), size / (y1 - y0)])
        placed = polygon_mask((points - (x0, y0) + 0.5) * scale - 0.5, size, size)
        mask = np.zeros((size, size), bool)
        if placed is not None:
            (bx, by), inside = placed
            mask[by:by + inside.shape[0], bx:bx + inside.shape[1]] = inside
        if not mask.any():
            raise ValueError(f"object {obj.key}: its polygon covers no pixel of its {size}x{size} crop")
        crop = crop.astype(np.float32) / 255.0
        crop[~mask] = crop[mask].mean(axis=0)
        images.append(crop.transpose(2, 0, 1))
        masks.append(mask)
    if not images:
        raise ValueError("no objects to train the generator on: the bank holds no object the label map calls OOD")
    return np.stack(images), np.stack(masks)


class Autoencoder(nn.Module):
    """Crops (N, 3, size, size) in [0, 1] -> latents (N, latent) in [-1, 1] -> reconstructions in [0, 1]."""

    def __init__(self, latent=LATENT, size=SIZE, widths=WIDTHS):
        super().__init__()
        if int(latent) < 1 or int(size) % 8 or int(size) < 8 or len(widths) != 3:
            raise ValueError(f"the generator needs latent >= 1, a size divisible by 8 and three widths, got "
                             f"latent={latent}, size={size}, widths={widths}")
        self.latent, self.size, self.widths = int(latent), int(size), tuple(int(w) for w in widths)
        a, b, c = self.widths
        side = self.size // 8
        self.encoder = nn.Sequential(
            nn.Conv2d(3, a, 4, 2, 1), nn.ReLU(), nn.Conv2d(a, b, 4, 2, 1), nn.ReLU(), nn.Conv2d(b, c, 4, 2, 1),
            nn.ReLU(), nn.Flatten(), nn.Linear(c * side * side, self.latent), nn.BatchNorm1d(self.latent), nn.Tanh())
        self.decoder = nn.Sequential(
            nn.Linear(self.latent, c * side * side), nn.ReLU(), nn.Unflatten(1, (c, side, side)),
            nn.ConvTranspose2d(c, b, 4, 2, 1), nn.ReLU(), nn.ConvTranspose2d(b, a, 4, 2, 1), nn.ReLU(),
            nn.ConvTranspose2d(a, 3, 4, 2, 1), nn.Sigmoid())

    def config(self):
        return {"latent": self.latent, "size": self.size, "widths": list(self.widths)}

    def encode(self, x):
        """Latents (N, latent) in [-1, 1] of crops (N, 3, size, size) in [0, 1] (centred on 0.5 first)."""
        return self.encoder(2.0 * x - 1.0)

    def forward(self, x):
        return self.decoder(self.encode(x))

    @torch.no_grad()
    def texture(self, z):
        """The decoder's image for one latent ``z`` (latent,) in [-1, 1]: (size, size, 3) float64 in [0, 1]."""
        z = torch.as_tensor(np.asarray(z, np.float32)).reshape(1, self.latent)
        return self.decoder(z)[0].permute(1, 2, 0).double().numpy()

    def digest(self):
        """sha256 of the weights (names, shapes and bytes in order): the generator's identity in manifests."""
        h = hashlib.sha256()
        for name, tensor in self.state_dict().items():
            h.update(f"{name}{tuple(tensor.shape)}".encode())
            h.update(tensor.detach().cpu().contiguous().numpy().tobytes())
        return h.hexdigest()


def reconstruction_loss(model, images, batch_size=256):
    """Mean squared error per pixel and channel ([0, 1] scale) of ``model`` on ``images`` (N, 3, s, s)."""
    total = 0.0
    with torch.no_grad():
        for start in range(0, len(images), batch_size):
            x = torch.as_tensor(images[start:start + batch_size])
            total += float(((model(x) - x) ** 2).double().sum())
    return total / images.size


def train(images, *, latent=LATENT, epochs=200, batch_size=8, lr=2e-3, seed=0, progress=True):
    """Train an :class:`Autoencoder` on ``images`` (N, 3, size, size) float32 in [0, 1] (each also mirrored).
    Weights and batch order draw from ``seed`` (the global torch generator is left as it was); deterministic on
    the CPU for a given thread count. Returns (model in eval mode, record: settings and the loss per epoch)."""
    images = np.asarray(images, np.float32)
    if images.ndim != 4 or images.shape[1] != 3 or images.shape[2] != images.shape[3]:
        raise ValueError(f"images must be (N, 3, s, s) crops, got shape {images.shape}")
    if int(epochs) < 1 or int(batch_size) < 1:
        raise ValueError(f"the generator needs epochs >= 1 and batch_size >= 1, got {epochs}, {batch_size}")
    data = torch.as_tensor(np.concatenate([images, images[..., ::-1]]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Autoencoder(latent, images.shape[2])
    generator = torch.Generator().manual_seed(seed)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    bar = tqdm(range(int(epochs)), desc="generator", unit="epoch", disable=not progress)
    model.train()
    for _ in bar:
        order, total, seen = torch.randperm(len(data), generator=generator), 0.0, 0
        for start in range(0, len(data), batch_size):
            x = data[order[start:start + batch_size]]
            if len(x) < 2:  # batch norm needs two crops; a last batch of one waits for the next epoch
                continue
            loss = ((model(x) - x) ** 2).mean()
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
            total, seen = total + float(loss.detach()) * len(x), seen + len(x)
        losses.append(total / seen)
        bar.set_postfix(loss=f"{losses[-1]:.4f}")
    model.eval()
    record = {"seed": int(seed), "epochs": int(epochs), "batch_size": int(batch_size), "lr": float(lr),
              "crops": int(len(images)), "loss": losses, "final_loss": reconstruction_loss(model, images)}
    return model, record


def save_generator(path, model, record=None):
    """Write the generator atomically: {format, segood_version, config, model (state dict), training}."""
    state = {"format": FORMAT, "segood_version": __version__, "config": model.config(),
             "model": model.state_dict(), "training": record or {}}
    with atomic_output(path) as tmp:
        torch.save(state, tmp)


def load_generator(path):
    """(model in eval mode, the file's training record). ValueError for a pickle, another kind of file, or
    weights that do not fit the settings the file records."""
    state = safe_load(path, "generator")
    if not isinstance(state, dict) or state.get("format") != FORMAT:
        raise ValueError(f"{path} is not a segood generator (expected format {FORMAT!r}); train one with "
                         "`segood attack-generator --out PATH`")
    config = state.get("config")
    if not isinstance(config, dict) or set(config) != {"latent", "size", "widths"} or not isinstance(
            state.get("model"), dict):
        raise ValueError(f"{path}: the generator's settings or weights are missing or unknown ({config!r})")
    try:
        model = Autoencoder(config["latent"], config["size"], config["widths"])
        model.load_state_dict(state["model"])
    except (RuntimeError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: the weights do not fit the generator its settings describe ({config}): "
                         f"{str(err).splitlines()[0]}") from None
    return model.eval(), state.get("training", {})
