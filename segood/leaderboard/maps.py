"""The verified track: score maps from strangers, read safely and scored here against the maintainer's masks.

A submission's ``scores/<set>.h5`` holds one float16 H×W dataset per frame id of the benchmark's set (the
``segood`` layout of :mod:`segood.evaluation.exchange`, in float16). Before any score is read the file's
structure is checked: hard links only (no soft or external links), no virtual datasets or external storage,
filters gzip / lzf / none, exactly the benchmark's frame ids, each of its frame's shape and float16, in chunks and
storage of at most about one frame. Memory stays bounded by one frame; NaN scores are refused. Nothing here imports
torch.
"""

import h5py
import numpy as np

from segood.leaderboard.safe import Rejected

ALLOWED_FILTERS = {h5py.h5z.FILTER_DEFLATE: "gzip", h5py.h5z.FILTER_LZF: "lzf"}


def map_member(set_name):
    """The name of a set's score-map file inside a submission."""
    return f"scores/{set_name}.h5"


def write_maps(maps, frame_ids, out, source=None):
    """Write ``maps[frame_id]`` (H×W, any real dtype) for every frame id to ``out`` as float16 HDF5, lzf-compressed
    (what a verified submission carries); finite scores beyond float16's range are a ValueError (they would become
    ±inf and tie: :func:`~segood.evaluation.exchange.half_precision`). NaN scores raise :class:`Rejected`, as the
    board would (:func:`refuse_nan`). ``source``: where the maps were read, named in errors."""
    from segood.evaluation.exchange import half_precision

    with h5py.File(out, "w") as f:
        for frame_id in frame_ids:
            scores = half_precision(maps[frame_id], f"{'' if source is None else f'score maps {source}: '}frame "
                                                    f"{frame_id}")
            refuse_nan(frame_id, scores)
            f.create_dataset(frame_id, data=scores, compression="lzf")


def read_maps(path, frames, name=None, max_objects=100_000):
    """Yield (frame id, float16 H×W scores) for ``frames`` = [(frame id, H, W)] from a submitted file, in order,
    after checking its whole structure. Raises :class:`Rejected` naming what is wrong (and the file by ``name``,
    the submission's own name for it: default its file name)."""
    try:
        f = h5py.File(path, "r")
    except OSError as err:
        raise Rejected(f"{name or path.name}: not a readable HDF5 file ({err})") from None
    with f:
        datasets = _check_structure(f, frames, max_objects)
        for frame_id, height, width in frames:
            dataset = datasets[frame_id]
            if dataset.shape != (height, width):
                raise Rejected(f"frame {frame_id}: scores of shape {dataset.shape}, the frame is ({height}, {width})")
            try:
                scores = dataset[...].astype(np.float16, copy=False)  # native byte order (big-endian files too)
            except OSError as err:
                raise Rejected(f"frame {frame_id}: its stored scores cannot be read ({err}): damaged compressed "
                               "data; write the map again") from None
            refuse_nan(frame_id, scores)
            yield frame_id, scores


MIN_CHUNK = 1024  # the fewest scores a chunk of a map may hold (a smaller frame: the frame)


def map_bytes(height, width):
    """The most bytes a frame's map may take in a score file: twice its float16 frame and 64 KiB."""
    return 2 * (height * width * 2) + (64 << 10)


def refuse_nan(frame_id, scores):
    """Raise :class:`Rejected` where a frame's scores hold NaN: every pixel needs a score."""
    nan = int(np.isnan(scores).sum())
    if nan:
        raise Rejected(f"frame {frame_id}: {nan} NaN scores; every pixel needs a score (±inf are allowed)")


def _check_structure(f, frames, max_objects):
    """{frame id: dataset} once every link, object, dtype and filter of the file has been checked."""
    links = []
    expected = [frame_id for frame_id, _, _ in frames]
    groups = {prefix for frame_id in expected for prefix in _prefixes(frame_id)}
    known = set(expected) | groups
    bound = min(max_objects, len(expected) + len(groups))  # what the set's frames need: the visit stops beyond

    def visit(name, link):  # a returned reason stops the visit (an exception cannot cross HDF5's C callback)
        if len(links) >= bound:
            extra = next((n for n in [*links, name] if n not in known), None)
            return (f"the score file holds more than the {bound} maps and groups the set's {len(expected)} frames "
                    "need" + (f": extra {extra!r}" if extra else ""))
        if not isinstance(link, h5py.HardLink):
            return f"{name!r} is a {type(link).__name__}: score files may hold hard links only"
        links.append(name)
        return None

    reason = f.visititems_links(visit)
    if reason:
        raise Rejected(reason)
    stored = {name for name in links if f.get(name, getclass=True) is h5py.Dataset}
    strays = [name for name in links if name not in stored and name not in groups]
    missing, extra = sorted(set(expected) - stored), sorted(stored - set(expected)) + strays
    if missing or extra:
        raise Rejected(f"the score file has {len(stored)} maps for the set's {len(expected)} frames: missing "
                       f"{_some(missing)}, extra {_some(extra)}")
    datasets = {}
    for frame_id, height, width in frames:
        dataset = f[frame_id]
        if dataset.is_virtual or dataset.external:
            raise Rejected(f"frame {frame_id}: a virtual dataset or external storage; store the scores in the file")
        if dataset.dtype.kind != "f" or dataset.dtype.itemsize != 2:  # float16 of either byte order
            raise Rejected(f"frame {frame_id}: scores of dtype {dataset.dtype}; verified maps are float16")
        chunk = None if dataset.chunks is None else int(np.prod(dataset.chunks, dtype=np.int64))
        if chunk is not None and chunk > height * width:
            raise Rejected(f"frame {frame_id}: stored in chunks of shape {dataset.chunks}, larger than the "
                           f"{height}×{width} frame; store each map in chunks of at most its frame")
        if chunk is not None and chunk < min(height * width, MIN_CHUNK):  # (each chunk costs an index entry)
            raise Rejected(f"frame {frame_id}: stored in chunks of shape {dataset.chunks}, of fewer than "
                           f"{MIN_CHUNK} scores; store each map in chunks of at least {MIN_CHUNK} (or the frame)")
        if dataset.id.get_storage_size() > map_bytes(height, width):
            raise Rejected(f"frame {frame_id}: {dataset.id.get_storage_size()} bytes stored for a {height}×{width} "
                           "float16 map; a map takes at most about its frame's size")
        plist = dataset.id.get_create_plist()
        for k in range(plist.get_nfilters()):
            code, _, _, name = plist.get_filter(k)
            if code not in ALLOWED_FILTERS:
                raise Rejected(f"frame {frame_id}: HDF5 filter {name.decode(errors='replace')!r} ({code}); only "
                               f"{', '.join(ALLOWED_FILTERS.values())} or none are read")
        datasets[frame_id] = dataset
    return datasets


def _prefixes(frame_id):
    parts = frame_id.split("/")
    return ["/".join(parts[:k]) for k in range(1, len(parts))]


def _some(names):
    return "none" if not names else ", ".join(repr(n) for n in names[:3]) + (
        f" and {len(names) - 3} more" if len(names) > 3 else "")
