"""Converted sets: one HDF5 file per set plus a JSON manifest beside it, and a PyTorch Dataset over them.

File layout: ``images`` (N, H, W, 3) uint8 RGB, ``ood_mask`` and ``semantic`` (N, H, W) uint8, chunked one
image per chunk and gzip-compressed, ``frame_id`` (N,) strings, ``frame_sha256`` (N, 3, 32) uint8 (the
sha256 digest of each frame's raw bytes per array) and ``manifest`` (the manifest as a JSON string);
attributes record the source, split, label-map hash, seed, size and segood version (lists and dicts as JSON
strings). The manifest's ``sha256`` of each array is the sha256 of its per-frame digests in frame order (so
workers can hash frames in parallel). The manifest lives inside the set, so that the set and its manifest
appear together with one rename; ``<set>.manifest.json`` beside it is a copy for people and tools.
"""

import hashlib
import json
import os
import tempfile
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np

import segood
from segood.io import atomic_output
from segood.labels import ID, IGNORE, OOD

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
    counts = np.bincount(np.asarray(sample.ood_mask, np.uint8).ravel(), minlength=256)
    bad = [v for v in np.flatnonzero(counts).tolist() if v not in (ID, OOD, IGNORE)]
    if bad or sample.ood_mask.dtype != np.uint8:
        raise ValueError(f"{sample.frame_id}: the ood_mask must be uint8 with 0 (ID), 1 (OOD), 255 (ignore), got "
                         f"{sample.ood_mask.dtype}" + (f" holding {bad}" if bad else ""))
    pixels = {"id": int(counts[ID]), "ood": int(counts[OOD]), "ignore": int(counts[IGNORE])}
    return EncodedFrame(sample.frame_id, shapes, chunks, digests, pixels, sample.extra)


def manifest_path(path):
    path = Path(path)
    return path.with_name(path.stem + ".manifest.json")


class SetWriter:
    """Append samples to ``path`` atomically: all goes to a temporary file renamed on :meth:`commit`.

    The set appears only complete and together with its manifest: the manifest is embedded, its copy beside the
    set is put in place first and the set's rename is the last step (readers trust the embedded one). Any
    failure, a full disk included, removes this writer's temporary files and leaves the previous set. The
    temporary name is unique, so two conversions to one output never touch each other's file. Refuses an
    existing output unless ``overwrite``.
    """

    def __init__(self, path, size, attrs, *, overwrite=False):
        self.path = Path(path)
        if self.path.exists() and not overwrite:
            raise FileExistsError(f"{self.path} exists; pass --overwrite to replace it")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".partial")
        os.close(fd)  # a name of this writer's own: two conversions to one output never touch each other's file
        self.tmp = Path(tmp)
        self.file = None
        try:
            self.file = h5py.File(self.tmp, "w")
            height, width = size
            shapes = {"images": (height, width, 3), "ood_mask": (height, width), "semantic": (height, width)}
            for name, shape in shapes.items():
                self.file.create_dataset(name, shape=(0, *shape), maxshape=(None, *shape), dtype=np.uint8,
                                         chunks=(1, *shape), compression="gzip", compression_opts=1)
            self.file.create_dataset("frame_id", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype())
            self.attrs = {"format": FORMAT, "segood_version": segood.__version__, "height": height,
                          "width": width, **attrs}
            for key, value in self.attrs.items():
                self.file.attrs[key] = json.dumps(value) if isinstance(value, (dict, list)) else value
        except BaseException:
            self.abort()
            raise
        self.digests = []  # per frame: the 3 × 32 digest bytes
        self.pixels = {"id": 0, "ood": 0, "ignore": 0}
        self.frame_ids = []

    def append(self, frame):
        """Add one frame: a :class:`EncodedFrame` (or a Sample, encoded here)."""
        if not isinstance(frame, EncodedFrame):
            frame = encode(frame)
        n = len(self.frame_ids)
        for name in ARRAYS:
            if frame.shapes[name] != self.file[name].shape[1:]:
                raise ValueError(f"{frame.frame_id}: {name} has shape {frame.shapes[name]}, the set "
                                 f"{self.file[name].shape[1:]}")
        for name in ARRAYS:
            dataset = self.file[name]
            dataset.resize(n + 1, axis=0)
            dataset.id.write_direct_chunk((n,) + (0,) * (dataset.ndim - 1), frame.chunks[name])
        self.file["frame_id"].resize(n + 1, axis=0)
        self.file["frame_id"][n] = frame.frame_id
        self.digests.append(b"".join(frame.digests[name] for name in ARRAYS))
        for key, count in frame.pixels.items():
            self.pixels[key] += count
        self.frame_ids.append(frame.frame_id)

    def commit(self, skipped=(), extra=None):
        """Embed the manifest, close, and put the set and its manifest copy in place; returns the manifest."""
        try:
            if not self.frame_ids:
                raise ValueError(f"{self.path}: no frame to write; an empty set is never written")
            digests = np.frombuffer(b"".join(self.digests), np.uint8).reshape(-1, len(ARRAYS), 32)
            manifest = {
                **self.attrs,
                "file": self.path.name,
                "frames": len(self.frame_ids),
                "pixels": self.pixels,
                "id_to_ood_ratio": self.pixels["id"] / self.pixels["ood"] if self.pixels["ood"] else None,
                "sha256": aggregate_sha256(digests),
                "skipped": [{"frame_id": f, "reason": r} for f, r in skipped],
                **(extra or {}),
            }
            text = json.dumps(manifest, indent=2, allow_nan=False) + "\n"
            self.file.create_dataset("frame_sha256", data=digests)
            self.file.create_dataset("manifest", data=text, dtype=h5py.string_dtype())
            self.file.close()
            with atomic_output(manifest_path(self.path)) as copy:
                Path(copy).write_text(text)
            os.replace(self.tmp, self.path)  # the commit point, and the last step: the set with its manifest
        except BaseException:
            self.abort()
            raise
        return manifest

    def abort(self):
        """Remove the temporary file, whatever state it is in (a failed close on a full disk included)."""
        try:
            if self.file is not None:
                self.file.close()
        except Exception:  # noqa: BLE001 - the file is removed below either way
            pass
        self.tmp.unlink(missing_ok=True)


def aggregate_sha256(digests):
    """{array: sha256 of its per-frame digests in frame order} from (N, 3, 32) digests."""
    return {name: hashlib.sha256(digests[:, k].tobytes()).hexdigest() for k, name in enumerate(ARRAYS)}


def read_manifest(path):
    """The manifest of a converted set: the copy embedded in the set (the file beside it for sets converted
    before segood embedded it). A ValueError names the file when neither can be read."""
    path = Path(path)
    try:
        with h5py.File(path, "r") as f:
            if "manifest" in f:
                return json.loads(f["manifest"][()])
    except OSError as err:
        if not path.exists():
            raise FileNotFoundError(f"no set {path}") from None
        raise ValueError(f"{path} is not a segood set: not a readable HDF5 file ({err}); convert the data with "
                         "segood convert") from None
    try:
        return json.loads(manifest_path(path).read_text())
    except (OSError, ValueError) as err:
        raise ValueError(f"{path} has no readable manifest ({err}); reconvert the set") from None


class UnlabelledFrames(ValueError):
    """A set holding frames without public labels was given to an evaluation."""


def require_labels(path):
    """Refuse to evaluate a set listing ``unlabelled_frames`` (e.g. a benchmark's test split): its masks are all
    ignore, so every metric would be computed on the labelled frames alone, or on nothing."""
    try:
        unlabelled = read_manifest(path).get("unlabelled_frames") or []
    except ValueError:  # a set older than its embedded manifest: it cannot list frames without labels
        return
    if unlabelled:
        shown = ", ".join(unlabelled[:3]) + (f" and {len(unlabelled) - 3} more" if len(unlabelled) > 3 else "")
        raise UnlabelledFrames(
            f"{path} holds {len(unlabelled)} frames without public labels ({shown}): they can be scored and "
            "exported (segood export) for the benchmark's server, never evaluated here; convert a split with "
            "labels (e.g. --split validation) to evaluate")


def frame_ids(path):
    """The frame ids of a converted set, in order, without reading any frame."""
    with h5py.File(path, "r") as f:
        return [s.decode() for s in f["frame_id"][...]]


def ood_masks(path):
    """Yield (frame id, ood_mask) of a converted set in order, each checked against its conversion digest;
    reads no image and needs no torch (the leaderboard scores submitted maps with it)."""
    with h5py.File(path, "r") as f:
        digests = f["frame_sha256"][...] if "frame_sha256" in f else None
        if digests is None or aggregate_sha256(digests) != json.loads(f["manifest"][()])["sha256"]:
            raise CorruptFrame(f"{path}: no per-frame digests matching the manifest; reconvert the set")
        k = ARRAYS.index("ood_mask")
        for index, frame_id in enumerate(f["frame_id"][...]):
            mask = f["ood_mask"][index]
            if hashlib.sha256(np.ascontiguousarray(mask)).digest() != digests[index, k].tobytes():
                raise CorruptFrame(f"{path}: frame {index} ({frame_id.decode()}): ood_mask differs from the sha256 "
                                   "recorded at conversion; reconvert the set")
            yield frame_id.decode(), mask


def set_identity(path):
    """What a converted set is, for provenance: its OOD sources and a hash of its manifest's array hashes; and
    ``per_image_headline`` where the set was converted with a protocol that averages per image (StreetHazards
    ``--protocol original``: reports name its per-image means so, beside the pooled numbers)."""
    manifest = read_manifest(path)
    if manifest["source"] == "mix":
        components = manifest["components"]
        ood_sources = [c["source"] for c in components[:1]]  # mix() puts the OOD set first
    else:
        ood_sources = [manifest["source"]] if manifest["pixels"]["ood"] else []
    digest = hashlib.sha256(json.dumps(manifest["sha256"], sort_keys=True).encode()).hexdigest()
    headline = {"per_image_headline": manifest["per_image_headline"]} if manifest.get("per_image_headline") else {}
    return {"file": Path(path).name, "ood_sources": ood_sources, "manifest_sha256": digest, **headline}


class CorruptFrame(ValueError):
    """A frame of a set does not match its manifest, or holds values a set never holds."""


class H5SegmentationDataset:
    """PyTorch Dataset over a converted set; safe with ``DataLoader(num_workers > 0)``.

    The file is opened lazily in each process that reads it (an h5py handle must not cross a fork).

    Args:
        path: the ``.h5`` file.
        transform: optional albumentations transform, applied jointly: ``transform(image=..., masks=[ood_mask,
            semantic])``; geometric transforms must use nearest interpolation for masks (albumentations' default).
        verify: check every frame read against the sha256 digests of its manifest (about 5 ms per 1024×2048
            frame), so that a corrupt or modified file is an error naming the frame, never a silent change of a
            benchmark number. Sets converted before segood stored per-frame digests cannot be checked (a
            warning says so). OOD mask values outside {0, 1, 255} are always an error.

    Items: dict with ``image`` (3, H, W) uint8 tensor, ``ood_mask`` and ``semantic`` (H, W) uint8 tensors,
    ``frame_id`` str. Raises :class:`CorruptFrame` (a ValueError) for a frame that fails a check.
    """

    def __init__(self, path, transform=None, *, verify=True):
        self.path, self.transform = Path(path), transform
        try:
            f = h5py.File(self.path, "r")
        except OSError as err:
            if not self.path.exists():
                raise FileNotFoundError(f"no set {self.path}") from None
            raise ValueError(f"{self.path} is not a segood set: not a readable HDF5 file ({err}); convert the "
                             "data with segood convert") from None
        with f:
            if f.attrs.get("format") != FORMAT:
                raise ValueError(f"{self.path} is not a segood set (format {f.attrs.get('format')!r})")
            self.length = len(f["frame_id"])
            self.attrs = dict(f.attrs)
            self.digests = None
            if verify:
                self.digests = self._checked_digests(f)
        self._file = None
        self._pid = None

    def _checked_digests(self, f):
        """The per-frame digests, checked against the manifest's hashes (None for sets without them)."""
        if "frame_sha256" not in f:
            warnings.warn(f"{self.path} was converted without per-frame digests: its frames cannot be verified; "
                          "reconvert it with this segood to have them checked", stacklevel=3)
            return None
        digests = f["frame_sha256"][...]
        manifest = json.loads(f["manifest"][()])
        if digests.shape != (self.length, len(ARRAYS), 32) or aggregate_sha256(digests) != manifest["sha256"]:
            raise CorruptFrame(f"{self.path}: the per-frame digests do not match the manifest's sha256: the file is "
                               "corrupt or was modified after conversion; reconvert the set")
        return digests

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
        index %= self.length
        f = self._handle()
        arrays = [f[name][index] for name in ARRAYS]
        frame_id = f["frame_id"][index].decode()
        if self.digests is not None:
            for k, (name, array) in enumerate(zip(ARRAYS, arrays)):
                if hashlib.sha256(np.ascontiguousarray(array)).digest() != self.digests[index, k].tobytes():
                    raise CorruptFrame(
                        f"{self.path}: frame {index} ({frame_id}): {name} differs from the sha256 recorded at "
                        "conversion: the file is corrupt or was modified; reconvert the set (or read it anyway with "
                        "verify=False, --no-verify)")
        image, ood_mask, semantic = arrays
        if ((ood_mask > OOD) & (ood_mask != IGNORE)).any():
            bad = sorted(set(np.unique(ood_mask).tolist()) - {ID, OOD, IGNORE})
            raise CorruptFrame(f"{self.path}: frame {index} ({frame_id}): ood_mask holds values {bad}; a set holds "
                               "only 0 (ID), 1 (OOD) and 255 (ignore)")
        if self.transform is not None:
            out = self.transform(image=image, masks=[ood_mask, semantic])
            image, (ood_mask, semantic) = out["image"], out["masks"]
        return {
            "image": torch.from_numpy(np.ascontiguousarray(image)).permute(2, 0, 1),
            "ood_mask": torch.from_numpy(np.ascontiguousarray(ood_mask)),
            "semantic": torch.from_numpy(np.ascontiguousarray(semantic)),
            "frame_id": frame_id,
        }

    def __getstate__(self):  # pickled to DataLoader workers without the open handle
        return {**self.__dict__, "_file": None, "_pid": None}
