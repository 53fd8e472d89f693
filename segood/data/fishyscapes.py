"""Fishyscapes (Blum et al. 2019): Lost & Found (labels over LostAndFound frames) and Static (objects pasted
onto Cityscapes val frames, shipped as an integer overlay). Labels 0 ID, 1 OOD, 255 ignore; ``semantic`` is 255
everywhere (Fishyscapes ships no class labels, and the pasted objects change the frames gtFine describes).
Neither dataset holds its images: the adapter takes the LostAndFound or Cityscapes root as well."""

import re
import zipfile
import zlib
from pathlib import Path

import numpy as np

from segood.data.adapter import Adapter, register_adapter
from segood.data.common import LabelTable, Sample, SkipFrame, read_label, read_rgb, require_tree
from segood.data.lostandfound import laf_image_path
from segood.io import npy_header

LABELS = LabelTable({0: "id", 1: "ood", 255: "ignore"}, "Fishyscapes")


class _Flat(Adapter):
    """Frames listed from ``<root>/<NNNN>_<source id>_labels.png`` (a flat folder); files that match no frame
    pattern are listed under ``unused_files``. Subclasses set ``pattern``, ``expected`` and ``companion``."""

    default_split = None
    split = "val"
    label_map_sha256 = LABELS.sha256
    pattern = expected = companion = None

    def __init__(self, root, images_root):
        self.root, self.images_root = Path(root), Path(images_root)
        require_tree(self.root, self.expected, "*_labels.png", self.source)
        require_tree(self.images_root, self.expected.splitlines()[-1], "leftImg8bit/*/*/*_leftImg8bit.png",
                     f"the {self.companion.split('_')[0]} dataset (--{self.companion.replace('_', '-')})")
        self.params = {self.companion: str(self.images_root)}
        self.frames, self.unused_files = [], []
        for path in sorted(p for p in self.root.iterdir() if p.is_file()):
            if self.pattern.fullmatch(path.name):
                self.frames.append(path)
            elif not self.belongs(path.name):
                self.unused_files.append((path.name, "not a frame file of this layout"))

    def belongs(self, name):
        """True for a file that belongs to a frame without listing it (Static's overlays)."""
        return False

    def refs(self):
        return list(self.frames)

    def frame_id(self, path):
        return path.name[: -len("_labels.png")]

    def labels(self, path, image_shape):
        raw = read_label(path)
        if raw.shape != image_shape[:2]:
            raise SkipFrame(f"image {image_shape[:2]} and labels {raw.shape} differ in size")
        return LABELS.apply(raw)

    def summary(self, extras):
        return LABELS.summary(extras)

    @classmethod
    def add_arguments(cls, parser):
        super().add_arguments(parser)
        parser.add_argument(f"--{cls.companion.replace('_', '-')}", type=Path, required=True,
                            help=f"the {cls.companion.split('_')[0]} dataset folder the images come from")

    @classmethod
    def from_args(cls, args):
        return cls(args.root, getattr(args, cls.companion))


@register_adapter
class FishyscapesLostAndFound(_Flat):
    """Fishyscapes Lost & Found (val, 100 frames): ``<NNNN>_<LostAndFound fid>_labels.png``; each image is
    LostAndFound's ``leftImg8bit/train`` frame of that fid, else its ``test`` frame."""

    name, source = "fishyscapes_laf", "fishyscapes_laf"
    help = "Fishyscapes Lost & Found labels (0 ID, 1 OOD, 255 ignore) with images from --lostandfound-root"
    pattern = re.compile(r"[0-9]{4}_([0-9]{2}_.*_[0-9]{6}_[0-9]{6})_labels\.png")
    companion = "lostandfound_root"
    expected = ("<root>/<NNNN>_<LostAndFound fid>_labels.png   (flat)\n"
                "<lostandfound root>/leftImg8bit/{train,test}/<NN>_<scene>/<fid>_leftImg8bit.png")

    def load(self, path):
        fid = self.pattern.fullmatch(path.name)[1]
        candidates = [laf_image_path(self.images_root, folder, fid) for folder in ("train", "test")]
        image_path = next((p for p in candidates if p.is_file()), None)
        if image_path is None:
            raise SkipFrame(f"no LostAndFound image {fid}_leftImg8bit.png in leftImg8bit/train or test")
        image = read_rgb(image_path)
        ood_mask, semantic, extra = self.labels(path, image.shape)
        return Sample(image, ood_mask, semantic, self.frame_id(path), extra)


@register_adapter
class FishyscapesStatic(_Flat):
    """Fishyscapes Static: ``<NNNN>_<cityscapes id>_labels.png`` and ``<NNNN>_<cityscapes id>_rgb.npz`` (key
    ``rgb``, a signed integer overlay); image = clip(Cityscapes val leftImg8bit + overlay, 0, 255) as uint8."""

    name, source = "fishyscapes_static", "fishyscapes_static"
    help = "Fishyscapes Static: Cityscapes val image (--cityscapes-root) + shipped overlay; 0 ID, 1 OOD, 255 ignore"
    pattern = re.compile(r"[0-9]{4}_(([a-z_]+)_[0-9]{6}_[0-9]{6})_labels\.png")
    companion = "cityscapes_root"
    expected = ("<root>/<NNNN>_<city>_<seq>_<frame>_labels.png and <NNNN>_<city>_<seq>_<frame>_rgb.npz   (flat)\n"
                "<cityscapes root>/leftImg8bit/val/<city>/<city>_<seq>_<frame>_leftImg8bit.png")
    overlay_pattern = re.compile(r"[0-9]{4}_[a-z_]+_[0-9]{6}_[0-9]{6}_rgb\.npz")

    def belongs(self, name):
        return self.overlay_pattern.fullmatch(name) is not None and \
            (self.root / name.replace("_rgb.npz", "_labels.png")).is_file()

    def load(self, path):
        match = self.pattern.fullmatch(path.name)
        cityscapes_id, city = match[1], match[2]
        image_path = self.images_root / "leftImg8bit" / "val" / city / f"{cityscapes_id}_leftImg8bit.png"
        if not image_path.is_file():
            raise SkipFrame(f"no Cityscapes val image {image_path.name}")
        base = read_rgb(image_path)
        overlay = read_overlay(self.root / f"{self.frame_id(path)}_rgb.npz", base.shape)
        image = np.clip(base.astype(np.int64) + overlay, 0, 255).astype(np.uint8)
        ood_mask, semantic, extra = self.labels(path, image.shape)
        return Sample(image, ood_mask, semantic, self.frame_id(path), extra)


def read_overlay(path, image_shape):
    """The ``rgb`` array of a Static overlay file: (H, W, 3) of a signed integer dtype, the shape of the Cityscapes
    image (``image_shape``) it adds to; :class:`SkipFrame` otherwise. The member's .npy header is checked before its
    data is read, so a header that declares a huge array allocates nothing; pickled objects are never loaded."""
    try:
        with zipfile.ZipFile(path) as archive:
            if "rgb.npy" not in archive.namelist():
                found = [name[: -len(".npy")] if name.endswith(".npy") else name for name in archive.namelist()]
                raise SkipFrame(f"{path.name} has no array 'rgb' (found {found})")
            with archive.open("rgb.npy") as member:
                shape, _, dtype = npy_header(member)
            if not np.issubdtype(dtype, np.signedinteger) or len(shape) != 3 or shape[2] != 3:
                raise SkipFrame(f"overlay {path.name} is {dtype} of shape {shape}; expected a signed integer (H, W, "
                                "3) array")
            if shape != tuple(image_shape):
                raise SkipFrame(f"overlay {shape} and Cityscapes image {tuple(image_shape)} differ in shape")
            with archive.open("rgb.npy") as member:
                return np.lib.format.read_array(member, allow_pickle=False)
    except FileNotFoundError:
        raise SkipFrame(f"no overlay file {path.name}") from None
    except (OSError, ValueError, zipfile.BadZipFile, zlib.error, NotImplementedError, EOFError) as err:
        raise SkipFrame(f"cannot read overlay {path.name} ({type(err).__name__}: {err})") from None
