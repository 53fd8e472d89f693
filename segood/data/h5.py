"""Converted sets: one HDF5 file per set plus a JSON manifest beside it, and a PyTorch Dataset over them.

File layout: ``images`` (N, H, W, 3) uint8 RGB, ``ood_mask`` and ``semantic`` (N, H, W) uint8, chunked one
image per chunk and gzip-compressed, ``frame_id`` (N,) strings; attributes record the source, split,
label-map hash, seed, size and segood version (lists and dicts as JSON strings). The manifest's ``sha256`` of each array is the sha256 of the
per-frame sha256 digests of its raw bytes, in frame order (so workers can hash frames in parallel).
"""

import hashlib
import json
import os
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

import segood
from segood.io import write_json

ARRAYS = ("images", "ood_mask", "semantic")
FORMAT = "segood.h5set/1"
_DEFLATE_LEVEL = 1  # gzip level of the chunks: fast, and photos barely compress further


@dataclass
class EncodedFrame:
    """A sample made ready for the writer (in a worker process): compressed chunks, digests, pixel counts."""

    frame_id: str
    shapes: dict
    chunks: dict  # array name -> zlib stream of the whole image (one chunk per image)
    digests: dict  # array name -> sha256 digest of the raw bytes
    pixels: dict  # id / ood / ignore counts of the ood_mask
    extra: dict | None = None


def encode(sample):
    """Compress and hash one sample; the expensive half of writing, done wherever the sample was made."""
    chunks, digests, shapes = {}, {}, {}
    for name, array in zip(ARRAYS, (sample.image, sample.ood_mask, sample.semantic)):
        raw = np.ascontiguousarray(array, dtype=np.uint8).tobytes()
        chunks[name] = zlib.compress(raw, _DEFLATE_LEVEL)
        digests[name] = hashlib.sha256(raw).digest()
        shapes[name] = array.shape
    counts = np.bincount(sample.ood_mask.ravel(), minlength=256)
    pixels = {"id": int(counts[0]), "ood": int(counts[1]), "ignore": int(counts[255])}
    return EncodedFrame(sample.frame_id, shapes, chunks, digests, pixels, sample.extra)


def manifest_path(path):
    path = Path(path)
    return path.with_name(path.stem + ".manifest.json")


class SetWriter:
    """Append samples to ``path`` atomically: all goes to a temporary file renamed on :meth:`commit`.

    An interrupted conversion leaves no file that looks complete (only ``.<name>.partial``, removed on the
    next run). Refuses an existing output unless ``overwrite``.
    """

    def __init__(self, path, size, attrs, *, overwrite=False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists; pass --overwrite to replace it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = self.path.with_name(f".{self.path.name}.partial")
        self.file = h5py.File(self.tmp, "w")
        height, width = size
        shapes = {"images": (height, width, 3), "ood_mask": (height, width), "semantic": (height, width)}
        for name, shape in shapes.items():
            self.file.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=np.uint8,
                                     chunks=(1, *shape), compression="gzip", compression_opts=1)
        self.file.create_dataset("frame_id", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype())
        self.attrs = {"format": FORMAT, "segood_version": segood.__version__, "height": height, "width": width,
                      **attrs}
        for key, value in self.attrs.items():
            self.file.attrs[key] = json.dumps(value) if isinstance(value, (dict, list)) else value
        self.hashes = {name: hashlib.sha256() for name in ARRAYS}
        self.pixels = {"id": 0, "ood": 0, "ignore": 0}
        self.frame_ids = []

    def append(self, frame):
        """Add one frame: a :class:`EncodedFrame` (or a Sample, encoded here)."""
        if not isinstance(frame, EncodedFrame):
            frame = encode(frame)
        n = len(self.frame_ids)
        for name in ARRAYS:
            dataset = self.file[name]
            if frame.shapes[name] != dataset.shape[1:]:
                raise ValueError(f"{frame.frame_id}: {name} has shape {frame.shapes[name]}, the set {dataset.shape[1:]}")
            dataset.resize(n + 1, axis=0)
            dataset.id.write_direct_chunk((n,) + (0,) * (dataset.ndim - 1), frame.chunks[name])
            self.hashes[name].update(frame.digests[name])
        self.file["frame_id"].resize(n + 1, axis=0)
        self.file["frame_id"][n] = frame.frame_id
        for key, count in frame.pixels.items():
            self.pixels[key] += count
        self.frame_ids.append(frame.frame_id)

    def commit(self, skipped=(), extra=None):
        """Close, rename into place, write the manifest; returns the manifest dict."""
        self.file.close()
        os.replace(self.tmp, self.path)
        manifest = {
            **self.attrs,
            "file": self.path.name,
            "frames": len(self.frame_ids),
            "pixels": self.pixels,
            "id_to_ood_ratio": self.pixels["id"] / self.pixels["ood"] if self.pixels["ood"] else None,
            "sha256": {name: h.hexdigest() for name, h in self.hashes.items()},
            "skipped": [{"frame_id": f, "reason": r} for f, r in skipped],
            **(extra or {}),
        }
        write_json(manifest_path(self.path), manifest)
        return manifest

    def abort(self):
        self.file.close()
        self.tmp.unlink(missing_ok=True)


def read_manifest(path):
    return json.loads(manifest_path(path).read_text())


def set_identity(path):
    """What a converted set is, for provenance: its OOD sources and a hash of its manifest's array hashes."""
    manifest = read_manifest(path)
    if manifest["source"] == "mix":
        components = manifest["components"]
        ood_sources = [c["source"] for c in components[:1]]  # mix() puts the OOD set first
    else:
        ood_sources = [manifest["source"]] if manifest["pixels"]["ood"] else []
    digest = hashlib.sha256(json.dumps(manifest["sha256"], sort_keys=True).encode()).hexdigest()
    return {"file": Path(path).name, "ood_sources": ood_sources, "manifest_sha256": digest}


class H5SegmentationDataset:
    """PyTorch Dataset over a converted set; safe with ``DataLoader(num_workers > 0)``.

    The file is opened lazily in each process that reads it (an h5py handle must not cross a fork).

    Args:
        path: the ``.h5`` file.
        transform: optional albumentations transform, applied jointly: ``transform(image=..., masks=[ood_mask,
            semantic])``; geometric transforms must use nearest interpolation for masks (albumentations' default).

    Items: dict with ``image`` (3, H, W) uint8 tensor, ``ood_mask`` and ``semantic`` (H, W) uint8 tensors,
    ``frame_id`` str.
    """

    def __init__(self, path, transform=None):
        self.path, self.transform = Path(path), transform
        with h5py.File(self.path, "r") as f:
            if f.attrs.get("format") != FORMAT:
                raise ValueError(f"{self.path} is not a segood set (format {f.attrs.get('format')!r})")
            self.length = len(f["frame_id"])
            self.attrs = dict(f.attrs)
        self._file = None
        self._pid = None

    def __len__(self):
        return self.length

    def _handle(self):
        if self._file is None or self._pid != os.getpid():
            self._file, self._pid = h5py.File(self.path, "r"), os.getpid()
        return self._file

    def __getitem__(self, index):
        import torch

        if not -self.length <= index < self.length:
            raise IndexError(f"index {index} out of range for {self.length} frames")
        f = self._handle()
        image, ood_mask, semantic = (f[name][index] for name in ARRAYS)
        if self.transform is not None:
            out = self.transform(image=image, masks=[ood_mask, semantic])
            image, (ood_mask, semantic) = out["image"], out["masks"]
        return {
            "image": torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1),
            "ood_mask": torch.from_numpy(np.ascontiguousarray(ood_mask)),
            "semantic": torch.from_numpy(np.ascontiguousarray(semantic)),
            "frame_id": f["frame_id"][index].decode(),
        }

    def __getstate__(self):  # pickled to DataLoader workers without the open handle
        return {**self.__dict__, "_file": None, "_pid": None}
