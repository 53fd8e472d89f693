"""Reading untrusted submission files: bounded zips, bounded strict JSON, pickle-free npz."""

import io
import json
import stat
import zipfile
import zlib
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import numpy as np

from segood.io import npy_header


class Rejected(Exception):
    """A submission is refused; the message is the reason shown on the board."""


class MaintainerError(RuntimeError):
    """A fault on the maintainer's side (a private set that fails its checks, a full disk): the board stops and
    publishes nothing, since the fault says nothing about any submission."""


@dataclass(frozen=True)
class Limits:
    member_bytes: int = 64 << 20  # one uncompressed member
    total_bytes: int = 256 << 20  # all members together
    json_bytes: int = 1 << 20  # submission.json
    members: int = 1000
    ratio: int = 200  # uncompressed / compressed size beyond which a member is a bomb
    map_bytes: int = 4 << 30  # one score-map file (scores/<set>.h5), written to disk rather than held in memory
    maps_bytes: int = 8 << 30  # all score-map files of one submission together


def is_map(name):
    """Whether a member is a score-map file (``scores/<set>.h5``), which is spilled to disk, not read into memory."""
    return name.startswith("scores/") and name.endswith(".h5") and name.count("/") == 1


def read_submission_files(path, limits=Limits(), spill=None, select_maps=None):
    """{relative name: bytes} of a submission zip or folder, refusing anything unsafe. Score-map members
    (:func:`is_map`) are {name: Path} instead: a folder's own file, or a zip member copied into the folder
    ``spill`` (each at most ``limits.map_bytes``, together at most ``limits.maps_bytes``, whatever the zip
    declares). ``select_maps(files)``, given the other members, returns {map name: the most bytes it may take} of
    the maps the submission may hold (raising :class:`Rejected` for what it may not); any other map, or one
    larger than that, is refused before (or while) it is copied.
    A failure to write into ``spill`` (a full disk) is a :class:`MaintainerError`."""
    path = Path(path)
    mode = path.lstat().st_mode  # (a link is not followed: it could lead out of the submissions' folder)
    if stat.S_ISLNK(mode):
        raise Rejected("a symbolic link; a submission is a zip file or a folder of its own")
    if not (stat.S_ISDIR(mode) or stat.S_ISREG(mode)):
        raise Rejected("neither a zip file nor a folder (a pipe, socket or device is never read)")
    if stat.S_ISDIR(mode):
        files = _read_folder(path, limits)
        wanted = _selected(files, [name for name in files if is_map(name)], select_maps)
        for name, bound in wanted.items():
            if name in files and files[name].stat().st_size > bound:
                raise Rejected(f"{name}: {files[name].stat().st_size} bytes, more than its set's frames need "
                               f"({bound})")
        return files
    try:
        archive = zipfile.ZipFile(path)
    except (zipfile.BadZipFile, OSError) as err:
        raise Rejected(f"not a readable zip file ({err})") from None
    with archive:
        infos = archive.infolist()
        if len(infos) > limits.members:
            raise Rejected(f"{len(infos)} members, more than the limit {limits.members}")
        files, maps, total, names = {}, [], 0, set()
        for info in infos:
            name = _safe_name(info.filename)
            if stat.S_ISLNK(info.external_attr >> 16):
                raise Rejected(f"member {name!r} is a symbolic link")
            if info.is_dir():
                continue
            if name in names:
                raise Rejected(f"duplicate member name {name!r}")
            names.add(name)
            if is_map(name) and spill is not None:
                maps.append((name, info))  # copied once the other members say which maps are wanted
                continue
            if info.file_size > limits.member_bytes or (info.compress_size and
                                                         info.file_size > limits.ratio * info.compress_size > 0):
                raise Rejected(f"member {name!r} would expand to {info.file_size} bytes: over the limits (zip bomb?)")
            with _member(archive, info, name) as member:  # never trust the declared size: read at most the limit
                data = member.read(limits.member_bytes + 1)
            if len(data) > limits.member_bytes:
                raise Rejected(f"member {name!r} expands beyond {limits.member_bytes} bytes (zip bomb?)")
            total += len(data)
            if total > limits.total_bytes:
                raise Rejected(f"members expand beyond {limits.total_bytes} bytes in all (zip bomb?)")
            files[name] = data
        wanted = _selected(files, [name for name, _ in maps], select_maps)
        declared = sum(info.file_size for _, info in maps)
        if declared > limits.maps_bytes:
            raise Rejected(f"score maps of {declared} bytes in all, over the limit {limits.maps_bytes}")
        budget = limits.maps_bytes
        for index, (name, info) in enumerate(maps):  # (copies named by position: no submitted string in a path)
            bound = min(limits.map_bytes, budget, wanted.get(name, limits.map_bytes))
            files[name] = _spill(archive, info, name, Path(spill) / f"map{index}.h5", bound)
            budget -= files[name].stat().st_size
        return files


@contextmanager
def _member(archive, info, name):
    """An open zip member; any failure to decompress it (damaged data, a CRC mismatch, encryption, an unknown
    compression method) is :class:`Rejected` naming the member."""
    try:
        with archive.open(info) as member:
            yield member
    except (Rejected, MaintainerError):
        raise
    except (zipfile.BadZipFile, zlib.error, EOFError) as err:
        raise Rejected(f"member {name!r} is corrupt ({err}): a CRC mismatch or damaged compressed data") from None
    except RuntimeError as err:  # zipfile: "File ... is encrypted, password required for extraction"
        raise Rejected(f"member {name!r} cannot be read ({err}); submit an unencrypted zip") from None
    except NotImplementedError as err:  # zipfile: "That compression method is not supported"
        raise Rejected(f"member {name!r} uses a compression method that is not read ({err}); store or deflate "
                       "members") from None


def _selected(files, maps, select_maps):
    """{map name: the most bytes it may take} of ``maps`` as ``select_maps`` selects them ({} without it: every map,
    at no bound of its own); :class:`Rejected` for a map it does not select."""
    if select_maps is None:
        return {}
    wanted = select_maps(files)
    foreign = sorted(name for name in maps if name not in wanted)
    if foreign:
        raise Rejected(f"{foreign[0]}: no set of the benchmark that submission.json gives score maps for ('scores' "
                       "in its entry); maps are read only for those")
    return wanted


def _spill(archive, info, name, target, max_bytes):
    """Copy the zip member ``name`` to the file ``target`` in bounded pieces; returns ``target``."""
    if info.file_size > max_bytes:
        raise Rejected(f"member {name!r} would expand to {info.file_size} bytes, over the limit {max_bytes}")
    written = 0
    with _member(archive, info, name) as member:
        try:
            out = open(target, "wb")
        except OSError as err:
            raise MaintainerError(f"cannot write {target} ({err}); give the board room to copy score maps") from err
        with out:
            while piece := member.read(1 << 20):
                written += len(piece)
                if written > max_bytes:
                    raise Rejected(f"member {name!r} expands beyond {max_bytes} bytes (zip bomb?)")
                try:
                    out.write(piece)
                except OSError as err:
                    raise MaintainerError(f"cannot write {target} ({err}); free space there (or give the board "
                                          "another folder) and rerun") from err
    return target


def _read_folder(path, limits):
    files, total = {}, 0
    for file in sorted(path.rglob("*")):
        if file.is_symlink():
            raise Rejected(f"{file.relative_to(path)} is a symbolic link")
        if not file.is_file():
            continue
        name = file.relative_to(path).as_posix()
        if is_map(name):
            if file.stat().st_size > limits.map_bytes:
                raise Rejected(f"{name}: {file.stat().st_size} bytes, over the limit {limits.map_bytes}")
            files[name] = file
            continue
        size = file.stat().st_size
        total += size
        if size > limits.member_bytes or total > limits.total_bytes:
            raise Rejected(f"{file.relative_to(path)}: over the size limits")
        files[file.relative_to(path).as_posix()] = file.read_bytes()
    return files


def _safe_name(name):
    if "\\" in name or name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        raise Rejected(f"member {name!r} has an absolute or non-POSIX path")
    parts = PurePosixPath(name).parts
    if ".." in parts:
        raise Rejected(f"member {name!r} climbs out of the archive with '..'")
    return name.rstrip("/")


def strict_json(data, limits=Limits()):
    """Parse JSON bytes: size-limited, UTF-8, and no NaN / Infinity passed off as numbers."""
    if len(data) > limits.json_bytes:
        raise Rejected(f"submission.json has {len(data)} bytes, more than the limit {limits.json_bytes}")

    def refuse(constant):
        raise Rejected(f"submission.json contains {constant}, which is not a number")

    def no_duplicates(pairs):
        keys = [k for k, _ in pairs]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise Rejected(f"submission.json repeats the keys {repeated[:5]} in one object: which one counts is "
                           "undefined, so none does")
        return dict(pairs)

    try:
        doc = json.loads(data.decode("utf-8"), parse_constant=refuse, object_pairs_hook=no_duplicates)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise Rejected(f"submission.json is not valid JSON ({err})") from None
    except ValueError:  # (Python's limit on the digits of an integer it converts)
        raise Rejected("submission.json has a number of more digits than any value it holds needs") from None
    except RecursionError:
        raise Rejected(f"submission.json nests deeper than {MAX_DEPTH} levels") from None
    if _depth(doc) > MAX_DEPTH:
        raise Rejected(f"submission.json nests deeper than {MAX_DEPTH} levels")
    return doc


MAX_DEPTH = 16  # a submission's JSON is a few levels deep


def _depth(value, level=1):
    if level > MAX_DEPTH:
        return level
    children = value.values() if isinstance(value, dict) else value if isinstance(value, list) else ()
    return max((_depth(child, level + 1) for child in children), default=level)


def load_npz(data, keys, max_bytes=16 << 20, optional=(), sizes=None):
    """{name: array} of npz bytes holding exactly ``keys`` (and any of ``optional``), each at most ``max_bytes``
    uncompressed, or at most ``sizes[name]`` where that is larger (arrays that grow with a set); never unpickles
    (object arrays are refused). Sizes are checked before anything is decompressed."""
    sizes = sizes or {}
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            names = {info.filename[:-4]: info for info in archive.infolist() if info.filename.endswith(".npy")}
            required = set(keys) - set(optional)
            if not required <= set(names) <= set(keys) or len(archive.infolist()) != len(names):
                raise Rejected(f"an accumulator state holds {sorted(names)}; expected exactly {sorted(keys)}")
            for name, info in names.items():
                most = max(max_bytes, sizes.get(name, 0))
                if info.file_size > most:
                    raise Rejected(f"accumulator state array {name!r} has {info.file_size} bytes, over {most}, the "
                                   "most a state of this set can need")
                declared = _declared_bytes(archive, info)  # what np.load would allocate, before it does
                if declared > info.file_size:
                    raise Rejected(f"accumulator state array {name!r} declares {declared} bytes in its header but "
                                   f"holds {info.file_size}; submit the state as segood wrote it")
        with np.load(io.BytesIO(data), allow_pickle=False) as arrays:
            return {key: arrays[key] for key in arrays.files}
    except ValueError as err:
        if "pickle" in str(err):
            raise Rejected("an accumulator state holds pickled objects; states hold plain arrays only") from None
        raise Rejected(f"an accumulator state holds a malformed array ({err})") from None
    except (OSError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError, RuntimeError) as err:
        raise Rejected(f"an accumulator state is not a readable npz file ({err})") from None


def _declared_bytes(archive, info):
    """The bytes an npz member's .npy header declares (shape × item size)."""
    with archive.open(info) as member:
        shape, _, dtype = npy_header(member)
    return int(np.prod(shape, dtype=object)) * dtype.itemsize
