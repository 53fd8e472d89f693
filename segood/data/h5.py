"""Converted sets: one HDF5 file per set plus a JSON manifest beside it, and a PyTorch Dataset over them.

Frames keep their own size: SegmentMeIfYouCan, Fishyscapes and Road Anomaly evaluate every frame at its native
size, so one set may hold frames of several sizes. File layout (``segood.h5set/2``): groups ``images``,
``ood_mask`` and ``semantic`` holding one dataset per frame, named by its index (``images/7``: (H, W, 3) uint8
RGB; the masks (H, W) uint8), each one gzip-compressed chunk; ``frame_id`` (N,) strings, ``frame_sha256``
(N, 3, 32) uint8 (the sha256 digest of each frame's raw bytes per array) and ``manifest`` (the manifest as a
JSON string, with every frame's ``frame_sizes`` [H, W]); attributes record the source, split, label-map hash,
seed, resize and segood version (lists, dicts and None as JSON strings). The manifest's ``sha256`` of each array
is the sha256 of its per-frame digests in frame order (so workers can hash frames in parallel). The manifest
lives inside the set, so that the set and its manifest appear together with one rename;
``<set>.manifest.json`` beside it is a copy for people and tools. Sets of the first layout (``segood.h5set/1``:
(N, H, W, ...) arrays, every frame of one size) still load.
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

from segood.io import as_open_makes, atomic_output, exclusive, make_folder, output_file

try:  # ISA-L's inflate, a drop-in for zlib's that reads the sets' deflated frames about twice as fast
    from isal import isal_zlib as _INFLATE
except ImportError:
    _INFLATE = zlib
from segood.labels import ID, IGNORE, NUM_CLASSES, OOD
from segood.version import __version__

ARRAYS = ("images", "ood_mask", "semantic")
FORMAT = "segood.h5set/2"
FIXED_SIZE_FORMAT = "segood.h5set/1"  # (N, H, W, ...) arrays: every frame of one size
MAX_SIDE = 16384  # a frame's height or width; larger is bad input, not an allocation
MAX_PIXELS = 1 << 26  # a frame's pixels (8192 × 8192)
_DEFLATE_LEVEL = 1  # gzip level of the chunks: fast, and photos barely compress further
_DEFLATE_WORTH = 0.75  # a chunk is stored deflated only where that saves a quarter of its bytes; else as it is (its
# gzip filter skipped, as HDF5 allows per chunk): inflating a photo (~0.4 GB/s with ISA-L) was most of reading it


@dataclass
class EncodedFrame:
    """A sample made ready for the writer (in a worker process): compressed chunks, digests, pixel counts."""

    frame_id: str
    shapes: dict
    chunks: dict  # array name -> (HDF5 filter mask, bytes) of its one chunk: (0, zlib stream) or (1, raw bytes)
    digests: dict  # array name -> sha256 digest of the raw bytes
    pixels: dict  # id / ood / ignore counts of the ood_mask
    extra: dict | None = None


def encode(sample):
    """Compress and hash one sample; the expensive half of writing, done wherever the sample was made."""
    chunks, digests, shapes = {}, {}, {}
    image_shape = np.shape(sample.image)
    if len(image_shape) != 3 or image_shape[2] != 3:
        raise ValueError(f"{sample.frame_id}: the image must be (H, W, 3) RGB, got shape {image_shape}")
    check_frame_size(image_shape[:2], sample.frame_id)
    for name, array in zip(ARRAYS, (sample.image, sample.ood_mask, sample.semantic)):
        if name != "images" and array.shape != image_shape[:2]:
            raise ValueError(f"{sample.frame_id}: {name} has shape {array.shape}, the image {image_shape[:2]}; "
                             "masks must cover the image pixel for pixel")
        if np.asarray(array).dtype != np.uint8:  # (a cast would wrap 300 to 44, or make [0, 1] floats black)
            raise ValueError(f"{sample.frame_id}: {name} is {np.asarray(array).dtype}; a set stores uint8 (images "
                             "RGB 0-255, trainIds 0-18 and 255)")
        raw = np.ascontiguousarray(array, dtype=np.uint8).tobytes()
        deflated = zlib.compress(raw, _DEFLATE_LEVEL)
        chunks[name] = (0, deflated) if len(deflated) <= _DEFLATE_WORTH * len(raw) else (1, raw)
        digests[name] = hashlib.sha256(raw).digest()
        shapes[name] = array.shape
    counts = np.bincount(np.asarray(sample.ood_mask, np.uint8).ravel(), minlength=256)
    bad = [v for v in np.flatnonzero(counts).tolist() if v not in (ID, OOD, IGNORE)]
    if bad or sample.ood_mask.dtype != np.uint8:
        raise ValueError(f"{sample.frame_id}: the ood_mask must be uint8 with 0 (ID), 1 (OOD), 255 (ignore), got "
                         f"{sample.ood_mask.dtype}" + (f" holding {bad}" if bad else ""))
    pixels = {"id": int(counts[ID]), "ood": int(counts[OOD]), "ignore": int(counts[IGNORE])}
    return EncodedFrame(sample.frame_id, shapes, chunks, digests, pixels, sample.extra)


def check_frame_size(size, what):
    """Refuse a frame size that no image has: a side beyond :data:`MAX_SIDE` or more than :data:`MAX_PIXELS`."""
    height, width = (int(v) for v in size)
    if not (0 < height <= MAX_SIDE and 0 < width <= MAX_SIDE and height * width <= MAX_PIXELS):
        raise ValueError(f"{what}: a frame of {height}×{width} pixels is outside what a set holds (sides 1 to "
                         f"{MAX_SIDE}, at most {MAX_PIXELS} pixels); resize it (--size H W) or crop it first")
    return height, width


def manifest_path(path):
    path = Path(path)
    return path.with_name(path.stem + ".manifest.json")


def check_output(path, *, overwrite=False, inputs=()):
    """Refuse, before any work, an output set ``path`` that is a folder, that is one of the sets being read
    (``inputs``, compared as resolved paths: replacing a set while reading it loses it), or that exists unless
    ``overwrite``."""
    path = Path(path)
    if path.is_dir():
        raise IsADirectoryError(f"{path} is a directory; the output must be the path of an .h5 file (e.g. "
                                f"{path / 'set.h5'})")
    output_file(path, ".h5", "the set")  # (another suffix is another kind of file: a checkpoint, a state)
    if any(path.resolve() == Path(p).resolve() for p in inputs):
        raise ValueError(f"the output {path} is one of the input sets; write the output to another path")
    if path.exists() and not overwrite:
        raise FileExistsError(f"{path} exists; pass --overwrite to replace it")


class SetWriter:
    """Append samples to ``path`` atomically: all goes to a temporary file renamed on :meth:`commit`.

    ``size`` = (H, W) that every frame must have, or None: each frame keeps its own (its size is recorded in the
    manifest's ``frame_sizes``).

    The set appears only complete and together with its manifest: the manifest is embedded, its copy beside the
    set is put in place first and the set's rename is the last step (readers trust the embedded one). Any
    failure, a full disk included, removes this writer's temporary files and leaves the previous set. The
    temporary name is unique, so two conversions to one output never touch each other's file. Refuses what
    :func:`check_output` refuses: a folder, one of the sets being read (``inputs``), an existing output unless
    ``overwrite``.
    """

    def __init__(self, path, size, attrs, *, overwrite=False, inputs=()):
        self.path, self.overwrite = Path(path), overwrite
        check_output(self.path, overwrite=overwrite, inputs=inputs)
        make_folder(self.path.parent)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=f".{self.path.name}.", suffix=".partial")
        os.close(fd)  # a name of this writer's own: two conversions to one output never touch each other's file
        self.tmp = Path(tmp)
        self.file = None
        try:
            self.file = h5py.File(self.tmp, "w")
            self.size = None if size is None else check_frame_size(size, str(self.path))
            for name in ARRAYS:
                self.file.create_group(name)
            self.file.create_dataset("frame_id", shape=(0,), maxshape=(None,), dtype=h5py.string_dtype())
            self.attrs = {"format": FORMAT, "segood_version": __version__, **attrs}
            for key, value in self.attrs.items():
                self.file.attrs[key] = json.dumps(value) if value is None or isinstance(value, (dict, list)) else value
        except BaseException:
            self.abort()
            raise
        self.digests = []  # per frame: the 3 × 32 digest bytes
        self.pixels = {"id": 0, "ood": 0, "ignore": 0}
        self.frame_ids, self.seen = [], set()
        self.frame_sizes = []

    def append(self, frame):
        """Add one frame: a :class:`EncodedFrame` (or a Sample, encoded here)."""
        if not isinstance(frame, EncodedFrame):
            frame = encode(frame)
        n = len(self.frame_ids)
        if frame.frame_id in self.seen:
            raise ValueError(f"{self.path}: frame id {frame.frame_id!r} comes twice; a set's frame ids must tell its "
                             "frames apart (they key corruption seeds and per-frame results): mixing a set with "
                             "itself, or two sets of one source that share frame ids?")
        size = tuple(frame.shapes["images"][:2])
        if self.size is not None and size != self.size:
            raise ValueError(f"{frame.frame_id}: the frame is {size[0]}×{size[1]}, this set's frames "
                             f"{self.size[0]}×{self.size[1]}")
        for name in ARRAYS:
            shape = frame.shapes[name]
            dataset = self.file[name].create_dataset(str(n), shape=shape, dtype=np.uint8, chunks=shape,
                                                     compression="gzip", compression_opts=_DEFLATE_LEVEL)
            filter_mask, data = frame.chunks[name]  # (mask 1: the gzip filter skipped for this chunk)
            dataset.id.write_direct_chunk((0,) * len(shape), data, filter_mask=filter_mask)
        self.file["frame_id"].resize(n + 1, axis=0)
        self.file["frame_id"][n] = frame.frame_id
        self.digests.append(b"".join(frame.digests[name] for name in ARRAYS))
        for key, count in frame.pixels.items():
            self.pixels[key] += count
        self.frame_ids.append(frame.frame_id)
        self.seen.add(frame.frame_id)
        self.frame_sizes.append(list(size))

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
                "frame_sizes": self.frame_sizes,
                "skipped": [{"frame_id": f, "reason": r} for f, r in skipped],
                **(extra or {}),
            }
            text = json.dumps(manifest, indent=2, allow_nan=False) + "\n"
            self.file.create_dataset("frame_sha256", data=digests)
            self.file.create_dataset("manifest", data=text, dtype=h5py.string_dtype())
            self.file.close()
            with exclusive(self.path, "conversion"):  # of two conversions to one output, exactly one wins
                if self.path.exists() and not self.overwrite:
                    raise FileExistsError(f"{self.path} was written by another conversion meanwhile; pass "
                                          "--overwrite to replace it")
                with atomic_output(manifest_path(self.path)) as copy:
                    Path(copy).write_text(text)
                as_open_makes(self.tmp)
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


def require_classes(path, what):
    """Refuse a set none of whose pixels has a class in its ``semantic`` labels (a noise set: every one is 255), for
    ``what`` (e.g. "mIoU"), which would be NaN. Reads the frames' labels until the first with a class."""
    with h5py.File(path, "r") as f:
        for index, size in enumerate(_frame_sizes(f, path)):
            if (read_array(f, "semantic", index, size) < NUM_CLASSES).any():
                return
    raise ValueError(f"{path} has no pixel with a class in its semantic labels (as a noise set): {what} needs a set "
                     "labelled with Cityscapes trainIds, e.g. Cityscapes val")


def frame_ids(path):
    """The frame ids of a converted set, in order, without reading any frame."""
    with h5py.File(path, "r") as f:
        return _frame_ids(f, path)


def _frame_ids(f, path):
    """The frame ids of an open set; a ValueError naming the file where ``frame_id`` is not a list of strings."""
    stored = f.get("frame_id")
    if not isinstance(stored, h5py.Dataset) or stored.ndim != 1 or h5py.check_string_dtype(stored.dtype) is None:
        found = "is missing" if stored is None else f"holds {getattr(stored, 'dtype', 'a group')}"
        raise ValueError(f"{path}: the field frame_id {found}, not one string per frame: the set is damaged or was "
                         "not written by segood; convert it again with segood convert")
    return [s.decode() for s in stored[...]]


def frame_sizes(path):
    """[(H, W)] of every frame of a converted set, in order, without reading any frame."""
    with h5py.File(path, "r") as f:
        return _frame_sizes(f, path)


def _frame_sizes(f, path):
    """The frames' sizes of an open set, each checked against :func:`check_frame_size`."""
    n = len(f["frame_id"])
    if f.attrs.get("format") == FIXED_SIZE_FORMAT:
        sizes = [(int(f.attrs["height"]), int(f.attrs["width"]))] * n if n else []
    else:
        try:
            sizes = [tuple(s) for s in json.loads(f["manifest"][()])["frame_sizes"]]
        except (KeyError, TypeError, ValueError) as err:
            raise CorruptFrame(f"{path}: the manifest lists no frame sizes ({type(err).__name__}); reconvert the "
                               "set") from None
        if len(sizes) != n or not all(len(s) == 2 and all(type(v) is int for v in s) for s in sizes):
            raise CorruptFrame(f"{path}: the manifest's frame_sizes do not give (H, W) for each of its {n} frames; "
                               "reconvert the set")
    for index, size in enumerate(sizes[:1] if f.attrs.get("format") == FIXED_SIZE_FORMAT else sizes):
        check_frame_size(size, f"{path}: frame {index}")
    return sizes


def read_array(f, name, index, size):
    """Array ``name`` of frame ``index`` of an open set (either layout), after checking that its stored shape is
    the frame's recorded ``size``, so that nothing larger than a recorded frame is ever decompressed. Any failure
    to read it (a missing or damaged dataset, a link where a dataset should be) is a :class:`CorruptFrame` naming
    the set, the frame and the array."""
    what = f"{f.filename}: frame {index}: {name}"
    try:
        node = _stored(f, name, what)
        per_frame = isinstance(node, h5py.Group)
        if per_frame:
            node = _stored(node, str(index), what)
        stored = node.shape if per_frame else node.shape[1:]
        if tuple(stored[:2]) != tuple(size) or len(stored) != (3 if name == "images" else 2):
            raise CorruptFrame(f"{what} is stored with shape {stored}, the manifest records a {size[0]}×{size[1]} "
                               "frame; reconvert the set")
        offset = (0,) * node.ndim if per_frame else (index,) + (0,) * (node.ndim - 1)
        frame = _inflated(node, offset, stored, what)
        if frame is not None:
            return frame
        return node[()] if per_frame else node[index]
    except CorruptFrame:
        raise
    except (KeyError, IndexError, OSError, ValueError) as err:  # h5py's errors for damaged objects and headers
        raise CorruptFrame(f"{what} cannot be read ({type(err).__name__}: {err}): the file is damaged; reconvert "
                           "the set") from None


def _stored(group, name, what):
    """``group[name]``, an object stored in the set itself: a soft or external link there (which would open another
    object, or another file) is a :class:`CorruptFrame`."""
    link = group.get(name, getlink=True)
    if link is None:
        raise CorruptFrame(f"{what} is missing from the set: the file is damaged; reconvert the set")
    if not isinstance(link, h5py.HardLink):
        raise CorruptFrame(f"{what} is a link ({type(link).__name__}) where the set stores the array itself: the "
                           "file was modified after conversion; reconvert the set")
    return group[name]


def _inflated(node, offset, shape, what):
    """The frame that ``node`` stores as one deflated uint8 chunk at chunk ``offset``, inflated here rather than by
    HDF5's filter: by ISA-L's inflate where ``isal`` is installed (about twice zlib's speed: reading is what an
    evaluation on a GPU waits for), else by zlib; never more than the frame's bytes. None for a dataset stored
    otherwise (other filters or chunks), which h5py reads. A chunk stored as it is (its filter skipped) is read
    straight into the frame's array."""
    chunk = tuple(shape) if len(offset) == len(shape) else (1, *shape)
    if (node.chunks != chunk or node.compression != "gzip" or node.shuffle or node.fletcher32
            or node.scaleoffset is not None or node.dtype != np.uint8
            or node.id.get_create_plist().get_nfilters() != 1):
        return None
    size = int(np.prod(shape))
    stored = node.id.get_chunk_info_by_coord(offset)
    if stored.filter_mask:  # (the filter was not applied to this chunk: stored as it is)
        _check_length(stored.size, size, shape, what)
        frame = np.empty(size, np.uint8)
        node.id.read_direct_chunk(offset, out=frame)
        return frame.reshape(shape)
    inflater = _INFLATE.decompressobj()
    try:
        data = inflater.decompress(node.id.read_direct_chunk(offset)[1], size)
    except _INFLATE.error as err:
        raise CorruptFrame(f"{what} cannot be inflated ({err}): the file is damaged; reconvert the set") from None
    if inflater.unconsumed_tail or not inflater.eof:
        raise CorruptFrame(f"{what} inflates to more than its {size} bytes: the file is damaged; reconvert the set")
    _check_length(len(data), size, shape, what)
    return np.frombuffer(data, np.uint8).reshape(shape).copy()  # (writable, as h5py's arrays are)


def _check_length(length, size, shape, what):
    if length != size:
        raise CorruptFrame(f"{what} holds {length} bytes, its shape {tuple(shape)} {size}: the file is damaged; "
                           "reconvert the set")


def ood_masks(path):
    """Yield (frame id, ood_mask) of a converted set in order, each checked against its conversion digest;
    reads no image and needs no torch (the leaderboard scores submitted maps with it)."""
    with h5py.File(path, "r") as f:
        digests = f["frame_sha256"][...] if "frame_sha256" in f else None
        if digests is None or aggregate_sha256(digests) != json.loads(f["manifest"][()])["sha256"]:
            raise CorruptFrame(f"{path}: no per-frame digests matching the manifest; reconvert the set")
        sizes = _frame_sizes(f, path)
        k = ARRAYS.index("ood_mask")
        for index, frame_id in enumerate(_frame_ids(f, path)):
            mask = read_array(f, "ood_mask", index, sizes[index])
            if hashlib.sha256(np.ascontiguousarray(mask)).digest() != digests[index, k].tobytes():
                raise CorruptFrame(f"{path}: frame {index} ({frame_id}): ood_mask differs from the sha256 recorded "
                                   "at conversion; reconvert the set")
            yield frame_id, mask


def set_identity(path):
    """What a converted set is, for provenance: its OOD sources and a hash of its manifest's array hashes; and
    ``per_image_headline`` where the set was converted with a protocol that averages per image (StreetHazards
    ``--protocol original``: reports name its per-image means so, beside the pooled numbers)."""
    manifest = read_manifest(path)
    if _manifest_field(manifest, path, "source") == "mix":  # mix() puts the OOD set first
        ood_sources = [_manifest_field(manifest, path, "components", 0, "source")]
    else:
        ood_sources = [manifest["source"]] if _manifest_field(manifest, path, "pixels", "ood") else []
    digest = hashlib.sha256(json.dumps(_manifest_field(manifest, path, "sha256"), sort_keys=True).encode()).hexdigest()
    headline = {"per_image_headline": manifest["per_image_headline"]} if manifest.get("per_image_headline") else {}
    return {"file": Path(path).name, "ood_sources": ood_sources, "manifest_sha256": digest, **headline}


def _manifest_field(manifest, path, *keys):
    """``manifest[keys[0]][keys[1]]...`` of the set at ``path``; a ValueError naming the file and the field where
    the manifest lacks it."""
    value = manifest
    for key in keys:
        try:
            value = value[key]
        except (KeyError, IndexError, TypeError):
            field = ".".join(map(str, keys))
            raise ValueError(f"{path}: its manifest has no field {field}: the set is damaged or was not written by "
                             "segood; convert it again with segood convert") from None
    return value


def object_sources(manifest):
    """Where the OOD pixels of a converted set come from, from its manifest: a pasted-object set names its objects'
    source ("sun2012" for objects cut from SUN2012, the source of segood's SUN sets; "generated objects" for the
    demo's), a mix its OOD component's, any other set its own source (none without OOD pixels). Outlier exposure
    on one source and a test set of the same source are flagged (:func:`segood.models.train.same_source_sets`)."""
    from segood.data.sun import Sun

    if manifest["source"] == "mix":
        first = manifest["components"][0]  # mix() puts the OOD set first
        return list(first.get("object_sources", [first["source"]]))
    if not manifest["pixels"]["ood"]:
        return []
    if manifest["source"] == "paste":
        objects = (manifest.get("params") or {}).get("objects")
        return ["generated objects" if objects == "demo" else Sun.source]
    return [manifest["source"]]


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
    ``frame_id`` str; each frame at its own size (``sizes[i]`` = (H, W), known without reading it: batch with
    :func:`frame_loader`). Raises :class:`CorruptFrame` (a ValueError) for a frame that fails a check.
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
            if f.attrs.get("format") not in (FORMAT, FIXED_SIZE_FORMAT):
                raise ValueError(f"{self.path} is not a segood set (format {f.attrs.get('format')!r})")
            self.frame_ids = _frame_ids(f, self.path)  # (once: one by one, 0.3 ms a frame)
            self.length = len(self.frame_ids)
            self.attrs = dict(f.attrs)
            self.sizes = _frame_sizes(f, self.path)
            self.digests = None
            if verify:
                self.digests = self._checked_digests(f)
        self._file = None
        self._pid = None

    def _checked_digests(self, f):
        """The per-frame digests, checked against the manifest's hashes (None for sets of the first layout, which
        predate them; a set of the current layout without them is a :class:`CorruptFrame`)."""
        if "frame_sha256" not in f:
            if f.attrs.get("format") != FIXED_SIZE_FORMAT:
                raise CorruptFrame(f"{self.path}: a {FORMAT} set without its per-frame digests (frame_sha256), "
                                   "which every set of this format stores: the file was modified after conversion; "
                                   "convert it again with segood convert (or read it unverified with verify=False; "
                                   "evaluate, score and robustness take --no-verify)")
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
        arrays = [read_array(f, name, index, self.sizes[index]) for name in ARRAYS]
        frame_id = self.frame_ids[index]
        if self.digests is not None:
            for k, (name, array) in enumerate(zip(ARRAYS, arrays)):
                if hashlib.sha256(np.ascontiguousarray(array)).digest() != self.digests[index, k].tobytes():
                    raise CorruptFrame(
                        f"{self.path}: frame {index} ({frame_id}): {name} differs from the sha256 recorded at "
                        "conversion: the file is corrupt or was modified; reconvert the set (or read it anyway with "
                        "verify=False; evaluate, score and robustness take --no-verify)")
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


def same_size_batches(sizes, batch_size, indices=None):
    """Batches of at most ``batch_size`` consecutive ``indices`` (default: all) whose frames share a size, in order:
    frames of another size start a new batch, so a set of one size batches as plainly as ever."""
    indices = range(len(sizes)) if indices is None else indices
    batches, current = [], []
    for i in indices:
        if current and (len(current) == batch_size or sizes[i] != sizes[current[0]]):
            batches.append(current)
            current = []
        current.append(i)
    return batches + ([current] if current else [])


def frame_loader(dataset, batch_size=1, **loader_options):
    """A DataLoader over ``dataset`` (an :class:`H5SegmentationDataset`, or any dataset with ``sizes``) whose
    batches hold frames of one size (:func:`same_size_batches`); a dataset without ``sizes`` batches plainly."""
    import torch

    sizes = getattr(dataset, "sizes", None)
    if sizes is None:
        return torch.utils.data.DataLoader(dataset, batch_size=batch_size, **loader_options)
    return torch.utils.data.DataLoader(dataset, batch_sampler=same_size_batches(sizes, batch_size), **loader_options)
