"""Score maps in and out: segood's own file, SegmentMeIfYouCan's inference output and Fishyscapes' layout.

Layouts (``LAYOUTS``), for the frames of one converted set:
- ``segood``: one HDF5 file, one H×W dataset per frame id of the set (optional root attribute ``score_range``);
- ``smiyc``: a folder of ``<fid>.hdf5`` files with the H×W scores in the dataset ``value`` (float16), as
  SegmentMeIfYouCan's ``Evaluation.save_output`` writes them under ``outputs/anomaly_p/<method>/<dataset>/``;
- ``fishyscapes``: a folder of ``<fid>_anomaly.npy`` files (H×W), as the Fishyscapes server expects.
In the two folder layouts ``<fid>`` is the last component of segood's frame id (``val/x/frame_7`` -> ``frame_7``).
Every missing, unreadable or misshapen file is an error that names the frame and the path, and so is an extra
dataset in segood's file; a folder may hold other frames' files besides the set's (SegmentMeIfYouCan stores the
maps of all of a track's splits in one folder).
"""

import errno
import os
from contextlib import ExitStack, contextmanager
from pathlib import Path

import h5py
import numpy as np
from tqdm import tqdm

from segood.io import npy_header
from segood.models.network import keeps_modes

LAYOUTS = ("segood", "smiyc", "fishyscapes")
_SUFFIX = {"smiyc": ".hdf5", "fishyscapes": "_anomaly.npy"}


def file_ids(frame_ids):
    """{frame id: the name it has in the folder layouts}; a ValueError when two frames would share a name."""
    names = {f: f.rsplit("/", 1)[-1] for f in frame_ids}
    seen = {}
    for frame_id, name in names.items():
        if name in seen:
            raise ValueError(f"frames {seen[name]!r} and {frame_id!r} would share the file name {name!r}: the folder "
                             "layouts name files by the last part of the frame id; use the segood layout")
        seen[name] = frame_id
    return names


def detect_layout(path):
    """The layout of ``path``: a file is segood's; a folder is SMIYC's (``*.hdf5``) or Fishyscapes' (``*_anomaly.npy``)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"no score file or folder {path}")
    if path.is_file():
        return "segood"
    fishyscapes, smiyc = any(path.glob("*_anomaly.npy")), any(path.glob("*.hdf5"))
    if fishyscapes and smiyc:
        raise ValueError(f"{path} holds both <fid>.hdf5 files (SegmentMeIfYouCan) and <fid>_anomaly.npy files "
                         "(Fishyscapes): keep one layout's maps in a folder")
    if fishyscapes or smiyc:
        return "fishyscapes" if fishyscapes else "smiyc"
    inside = next((p for depth in range(1, 5) for pattern in ("*.hdf5", "*_anomaly.npy", "*.h5")
                   for p in path.glob("*/" * (depth - 1) + pattern)), None)  # (an export's root: a few levels)
    hint = "" if inside is None else (f"; it holds segood's file {inside.relative_to(path)}: give that file"
                                      if inside.suffix == ".h5" else f"; {inside.relative_to(path).parent} inside it "
                                      f"holds {inside.name}: give the folder of one method and set")
    raise ValueError(f"{path} holds neither <fid>.hdf5 files (SegmentMeIfYouCan) nor <fid>_anomaly.npy files "
                     f"(Fishyscapes){hint}")


class ScoreMaps:
    """Read access to the score maps of one set's frames in any layout: ``maps[frame_id]`` -> (H, W) array in
    native byte order; ``score_range`` a declared range or None. Use as a context manager. ``frame_ids``: the
    set's; None reads every map of a segood file (the folder layouts need them: their file names carry only the
    last part of each id). ``sizes``: the frames' (H, W), in the order of ``frame_ids``: each map's stored shape is
    checked against its frame's before its scores are read (a file that claims a huge map allocates nothing)."""

    def __init__(self, path, frame_ids, sizes=None):
        self.path, self.layout = Path(path), detect_layout(path)
        if frame_ids is None and self.layout != "segood":
            raise ValueError(f"{self.path} is a folder of {self.layout} score files, named by the last part of each "
                             "frame id: give the set they belong to for the full ids (its converted file or public "
                             "copy; segood submit --data SET=FILE.h5)")
        self.frame_ids = None if frame_ids is None else list(frame_ids)
        self.sizes = None if sizes is None else {f: tuple(size) for f, size in zip(self.frame_ids, sizes)}
        self.score_range, self.file, self._pid = None, None, os.getpid()
        if self.layout == "segood":
            try:
                self.file = h5py.File(self.path, "r")
            except OSError as err:
                raise ValueError(f"{self.path} is not a readable HDF5 score file ({err}); write one dataset of H×W "
                                 "scores per frame id") from None
            if "manifest" in self.file and "frame_sha256" in self.file:
                self.close()
                raise ValueError(f"{self.path} is a converted set, not score maps: give it as --data, and as "
                                 "--scores the maps of its frames")
            if "score_range" in self.file.attrs:
                self.score_range = self._declared_range(self.file.attrs["score_range"])
            stored = []
            self.file.visititems(lambda key, obj: stored.append(key) if isinstance(obj, h5py.Dataset) else None)
            if self.frame_ids is None:
                self.frame_ids = stored
        else:
            self.names = file_ids(self.frame_ids)
            suffix = _SUFFIX[self.layout]
            stored_names = {p.name[: -len(suffix)] for p in self.path.glob(f"*{suffix}")}
            by_name = {n: f for f, n in self.names.items()}
            stored = [by_name.get(n, f"{n}{suffix}") for n in stored_names]
        missing = sorted(set(self.frame_ids) - set(stored))
        # a folder may hold other sets' frames too (SMIYC stores every RoadAnomaly21 split in AnomalyTrack-all)
        extra = sorted(set(stored) - set(self.frame_ids)) if self.layout == "segood" else []
        if missing or extra:
            self.close()
            raise ValueError(f"the score maps in {self.path} do not match the set: missing {_some(missing)}"
                             + (f", extra {_some(extra)}" if self.layout == "segood" else ""))

    def _declared_range(self, value):
        """(low, high) of the file's ``score_range`` attribute; a ValueError naming the file where it is not two
        numbers."""
        try:
            low, high = (float(v) for v in value)
        except (TypeError, ValueError):
            self.close()
            raise ValueError(f"{self.path}: the score_range attribute is {np.asarray(value).tolist()!r}; score_range "
                             "must be two numbers (low, high), e.g. f.attrs['score_range'] = (0.0, 1.0); or leave it "
                             "out and pass --score-range LO HI") from None
        return low, high

    def __getitem__(self, frame_id):
        if self.layout == "segood":
            if self._pid != os.getpid():  # a reader process: its own handle (HDF5's are not shared across a fork)
                self.file, self._pid = h5py.File(self.path, "r"), os.getpid()
            node = self.file[frame_id]
            self._check_shape(frame_id, node.shape)
            score = node[...]
        else:
            path = self.path / f"{self.names[frame_id]}{_SUFFIX[self.layout]}"
            try:
                if self.layout == "smiyc":
                    with h5py.File(path, "r") as f:
                        value = f.get("value")
                        if not isinstance(value, h5py.Dataset) or value.ndim != 2:
                            raise ValueError(f"its 'value' is {_what(value)}; SegmentMeIfYouCan files hold the "
                                             "H×W scores in a dataset 'value'")
                        self._check_shape(frame_id, value.shape)
                        score = value[...]
                else:
                    score = _load_npy(path, lambda shape: self._check_shape(frame_id, shape))
            except WrongShape:
                raise
            except (OSError, KeyError, ValueError, EOFError) as err:
                raise ValueError(f"frame {frame_id}: {path} is not a readable {self.layout} score file "
                                 f"({type(err).__name__}: {str(err)[:200]})") from None
        return score.astype(score.dtype.newbyteorder("="), copy=False)  # big-endian files too

    def _check_shape(self, frame_id, shape):
        """Refuse a stored map that is not H×W, or not its frame's size where the sizes are known."""
        if len(shape) != 2:
            raise WrongShape(f"frame {frame_id}: the scores in {self.path} have shape {shape}, not (H, W)")
        size = None if self.sizes is None else self.sizes[frame_id]
        if size is not None and tuple(shape) != size:
            raise WrongShape(f"frame {frame_id}: scores of shape {tuple(shape)}, the frame is {size} (maps are "
                             "exchanged at each frame's own size)")

    def close(self):
        if getattr(self, "file", None) is not None and self._pid == os.getpid():
            self.file.close()

    def __getstate__(self):  # (to reader processes started by spawn: without the open handle)
        return {**self.__dict__, "file": None, "_pid": None}

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


@keeps_modes
def export_scores(model, sets, methods, out_dir, *, layout="segood", batch_size=2, device=None, progress=True,
                  fit_set=None):
    """Score every frame of ``sets`` ({name: converted set}) with ``methods`` (names or method objects) and write
    the maps in ``layout``: ``segood``: ``out_dir/<method>/<set>.h5``; ``smiyc``:
    ``out_dir/anomaly_p/<method>/<set>/<fid>.hdf5`` (float16, dataset ``value``); ``fishyscapes``:
    ``out_dir/<method>/<set>/<fid>_anomaly.npy`` (float32).
    In the two folder layouts ``<set>`` is the folder the benchmark's own code reads a split's maps from (from its
    manifest, :func:`segood.data.benchmarks.split_name`: ``AnomalyTrack-all``, ``LostAndFound``), the name in
    ``sets`` for any other. Methods that need a fit and have none are fitted on ``fit_set`` (a converted training
    set), once everything else has been checked. Every file is written atomically. Returns {(method, set): path
    written}."""
    from segood.data.benchmarks import split_name
    from segood.data.h5 import H5SegmentationDataset, frame_ids, frame_loader, read_manifest
    from segood.methods import get_method
    from segood.methods.schedule import fit_methods, frame_seeds, refuse_unrecordable, score_batch, unfitted_methods
    from segood.models.external import as_network
    from segood.models.network import device_of, preprocess

    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; choose one of {LAYOUTS}")
    out_dir = Path(out_dir)
    if out_dir.is_file():
        raise ValueError(f"{out_dir} is a file; --out names the folder the maps are written into")
    device = device or device_of(model)
    model = as_network(model).to(device).eval()
    methods = [get_method(m) if isinstance(m, str) else m for m in methods]
    unfitted = unfitted_methods(model, methods, fit_set)
    refuse_unrecordable(methods)
    datasets = {name: H5SegmentationDataset(path) for name, path in sets.items()}  # (each set opened before a fit)
    folders = {name: name if layout == "segood" else split_name(read_manifest(path), layout) or name
               for name, path in sets.items()}
    files = {}  # {(folder, file name): set}: sets may share a folder (a benchmark's splits do), never a file
    for set_name, path in sets.items():
        for name in (file_ids(frame_ids(path)).values() if layout != "segood" else [set_name]):
            other = files.setdefault((folders[set_name], name), set_name)
            if other != set_name:
                raise ValueError(f"sets {other} and {set_name} would both write {folders[set_name]}/{name}: export "
                                 "them to different --out folders")
    fit_methods(model, unfitted, fit_set, progress=progress)  # (last: everything above is checked in a moment)
    written = {}
    for set_name, path in sets.items():
        dataset = datasets[set_name]
        names = file_ids(frame_ids(path)) if layout != "segood" else None
        targets = {m.name: _target(out_dir, layout, m.name, folders[set_name]) for m in methods}
        with ExitStack() as stack:  # on an error the segood layout's temporary files are removed, nothing renamed
            files = {}
            if layout == "segood":
                for m in methods:
                    files[m.name] = stack.enter_context(_h5_output(targets[m.name]))
            loader, done = frame_loader(dataset, batch_size), 0
            for batch in tqdm(loader, desc=f"export {set_name}", unit="batch", disable=not progress):
                frames = range(done, done + len(batch["image"]))  # (the samples segood evaluate draws, at seed 0)
                done += len(frames)
                scored = score_batch(model, preprocess(batch["image"].to(device)), methods,
                                     mc_seeds=frame_seeds(0, set_name, frames))
                for method, scores in zip(methods, scored.scores):
                    for frame_id, score in zip(batch["frame_id"], scores.float().cpu().numpy()):
                        if layout == "segood":
                            with _naming(targets[method.name]):
                                _check_room(targets[method.name], score.nbytes)
                                files[method.name].create_dataset(frame_id, data=score, compression="gzip",
                                                                  compression_opts=1)
                        else:
                            target = targets[method.name] / f"{names[frame_id]}{_SUFFIX[layout]}"
                            with _naming(target):
                                _check_room(target, score.nbytes)
                                _write_file(layout, target, score)
        written.update({(m.name, set_name): targets[m.name] for m in methods})
    return written


def _what(node):
    if node is None:
        return "missing"
    if isinstance(node, h5py.Dataset):
        return f"a dataset of shape {node.shape}"
    return f"a {type(node).__name__.lower()}"


class WrongShape(ValueError):
    """A stored score map of another shape than its frame's."""


def _load_npy(path, check_shape):
    """An H×W array of an .npy file, its header checked first: ``check_shape(shape)``, and no more bytes declared
    than the file holds (so that nothing is allocated for a header's claims)."""
    with open(path, "rb") as f:
        shape, _, dtype = npy_header(f)
        check_shape(shape)
        if dtype.hasobject:
            raise ValueError(f"it holds an array of dtype {dtype} (pickled Python objects, never read here): save "
                             "the scores as a float array")
        declared = int(np.prod(shape, dtype=object)) * dtype.itemsize
        if declared > os.fstat(f.fileno()).st_size - f.tell():
            raise ValueError(f"its header declares a {shape[0]}×{shape[1]} {dtype} array ({declared} bytes), more "
                             "than the file holds: truncated or not written by numpy")
    return np.load(path, allow_pickle=False)


ROOM_MARGIN = 1 << 20  # bytes kept free beyond a map: what HDF5 needs to close a file cleanly


def _check_room(path, nbytes):
    """Refuse to start a write that the disk cannot hold: HDF5 that meets a full disk mid-write leaves a file it
    cannot close (and may crash), so the room for ``nbytes`` (uncompressed, an upper bound) is checked first."""
    folder = Path(path).parent
    while not folder.exists():
        folder = folder.parent
    stats = os.statvfs(folder)
    free = stats.f_bavail * stats.f_frsize
    if free < nbytes + ROOM_MARGIN:
        raise OSError(errno.ENOSPC, f"No space left on device: {free} bytes free, a map may take {nbytes}")


@contextmanager
def _naming(path):
    """An OSError (a full disk) raised inside names ``path`` and says what to do."""
    try:
        yield
    except OSError as err:
        if str(path) in str(err):
            raise
        raise OSError(err.errno, f"cannot write {path} ({err.strerror or err}); free space (or choose another "
                                 "--out) and rerun: nothing partial was left") from None


@contextmanager
def _h5_output(path):
    """An HDF5 file written under a temporary name and renamed to ``path`` when the block completes; on any
    failure the temporary file is emptied before HDF5 closes it (so a full disk cannot fail the close too) and
    removed."""
    from segood.io import atomic_output

    with atomic_output(path) as tmp:
        f = h5py.File(tmp, "w")
        try:
            yield f
            with _naming(path):
                f.close()
        except BaseException:
            _discard(f, tmp)
            raise


def _discard(f, tmp):
    try:
        os.truncate(tmp, 0)  # frees the room HDF5 needs to close the file
    except OSError:
        pass
    try:
        f.close()
    except Exception:  # noqa: BLE001 - the file is removed either way
        pass


def _target(out_dir, layout, method, set_name):
    if layout == "segood":
        return out_dir / method / f"{set_name}.h5"
    if layout == "smiyc":
        return out_dir / "anomaly_p" / method / set_name
    return out_dir / method / set_name


def half_precision(scores, what, fix="rescale the scores (e.g. divide them by a constant, which keeps their order)"):
    """``scores`` as float16 (SegmentMeIfYouCan's maps, a verified submission's); a ValueError naming ``what`` and
    ``fix`` where finite scores lie beyond float16's range (±65504): they would all become ±inf and tie."""
    scores = np.asarray(scores)
    with np.errstate(over="ignore"):
        half = scores.astype(np.float16)
    beyond = np.isinf(half) & np.isfinite(scores)
    if beyond.any():
        largest = float(np.abs(scores[beyond].astype(np.float64)).max())
        raise ValueError(f"{what}: {int(beyond.sum())} finite scores lie beyond float16's range (±65504; the largest "
                         f"magnitude {largest:.6g}), where they would all become ±inf and tie: {fix}")
    return half


def _write_file(layout, path, score):
    """One frame's file of a folder layout, written atomically."""
    from segood.io import atomic_output

    if layout == "smiyc":
        value = half_precision(score, path, "export this method in the segood or fishyscapes layout, which keep "
                                            "float32 scores")
        with _h5_output(path) as f:
            f.create_dataset("value", data=value, compression="gzip", compression_opts=9)
        return
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        np.save(f, score.astype(np.float32), allow_pickle=False)


def _some(names):
    return "none" if not names else ", ".join(names[:5]) + (f" and {len(names) - 5} more" if len(names) > 5 else "")
