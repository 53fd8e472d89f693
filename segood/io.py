"""Small file helpers: writes are atomic, so a run that dies never leaves a half-written file."""

import errno
import io
import json
import math
import os
import signal
import tempfile
import threading
import time
import zipfile
import zlib
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def exit_on_sigterm():
    """Within (in the main thread): SIGTERM raises SystemExit(143), so that ``finally`` blocks and context managers
    remove temporary files and stop worker processes, as after Ctrl-C (the default action ends the process at
    once). Elsewhere, nothing changes: only the main thread can set handlers."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def _exit(signum, frame):
    raise SystemExit(128 + signum)


def as_open_makes(path):
    """Give a temporary file the permissions ``open`` would have given it (0666 less the umask): mkstemp's 0600
    would surprise whoever shares the folder once the file is renamed into place."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def output_file(path, suffix, what, *, option="--out"):
    """``path`` as a Path if it names a ``suffix`` file; else a ValueError saying what to give (an output named like
    one of the inputs, ``--out SET.h5``, would silently replace it)."""
    path = Path(path)
    if path.suffix.lower() != suffix:
        raise ValueError(f"{option} {path}: give a {suffix} file for {what}")
    return path


def make_folder(path):
    """Make the folder ``path`` and its parents where missing. Where a file stands in the way, or the folder cannot
    be written, the error names that path and says what to do (the system's names the deepest missing folder or a
    temporary file)."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (path, *path.parents) if os.path.lexists(p) and not p.is_dir()), path)
        what = "a broken link" if blocker.is_symlink() and not blocker.exists() else "a file"
        raise NotADirectoryError(errno.ENOTDIR, f"cannot make the folder {path}: {blocker} is {what}; choose another "
                                                "path") from None
    except OSError as err:
        _refuse_unwritable(err, next((p for p in path.parents if p.is_dir()), path))  # (the deepest that is there)
        raise
    return path


def _refuse_unwritable(err, folder):
    """Where ``err`` says ``folder`` (or a parent) cannot be written, an error naming it."""
    if err.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        raise OSError(err.errno, f"cannot write into {folder} ({err.strerror}); choose a folder you can write, or "
                                 "give yourself write permission") from None


@contextmanager
def atomic_output(path):
    """Yield a temporary path beside ``path``; it replaces ``path`` only when the block completes."""
    path = Path(path)
    with _naming_full_disk(path):
        make_folder(path.parent)
        try:
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        except OSError as err:
            _refuse_unwritable(err, path.parent)
            raise
        os.close(fd)
    try:
        with _naming_full_disk(path):
            yield tmp
            as_open_makes(tmp)
            os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


@contextmanager
def _naming_full_disk(path):
    """A full disk (ENOSPC, EDQUOT) met inside names ``path``, which the system's message does not."""
    try:
        yield
    except OSError as err:
        if err.errno not in (errno.ENOSPC, errno.EDQUOT) or str(path) in str(err):
            raise
        raise OSError(err.errno, f"cannot write {path} ({err.strerror or err}); free space and rerun: "
                                 f"{'the previous file is unchanged' if path.exists() else 'nothing was left'}") \
            from None


@contextmanager
def exclusive(path, what="writer", *, inside=False):
    """Hold an exclusive lock on ``path`` (a lock file ``.<name>.lock`` beside it; ``inside``: ``.lock`` in the
    folder ``path``, made where missing) for the block; raises FileExistsError naming the path when another ``what``
    holds it. The lock dies with its process (flock), so a killed writer never leaves ``path`` locked."""
    path = Path(path)
    make_folder(path if inside else path.parent)
    lock = _lock_file(path, inside)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as err:
        _refuse_unwritable(err, lock.parent)
        raise
    try:
        try:
            _flock_soon(fd)
            if os.fstat(fd).st_ino != os.stat(lock).st_ino:  # removed by the holder that just finished
                raise BlockingIOError
        except (BlockingIOError, FileNotFoundError):
            raise FileExistsError(f"another {what} is writing {path} right now; wait for it to finish, or write "
                                  "elsewhere") from None
        try:
            yield
        finally:
            lock.unlink(missing_ok=True)
    finally:
        os.close(fd)


def _flock_soon(fd, wait=0.5):
    """An exclusive flock on ``fd``, waiting up to ``wait`` seconds for a :func:`held` that looks meanwhile (its
    shared lock lasts an instant); BlockingIOError where a writer holds it."""
    import fcntl

    deadline = time.monotonic() + wait
    while True:
        try:
            return fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def held(path, *, inside=False):
    """Whether a writer holds :func:`exclusive`'s lock on ``path`` right now; looks only (makes nothing, and takes
    a shared lock for no longer than the look)."""
    import fcntl

    try:
        fd = os.open(_lock_file(Path(path), inside), os.O_RDONLY)
    except OSError:  # (no lock file: nobody holds it)
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def _lock_file(path, inside):
    """The lock file of :func:`exclusive` and :func:`held`: ``.lock`` in the folder ``path`` (``inside``), else
    ``.<name>.lock`` beside ``path``."""
    return path / ".lock" if inside else path.with_name(f".{path.name}.lock")


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then a rename)."""
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(path, text):
    """Atomic text write (UTF-8)."""
    atomic_write_bytes(path, text.encode())


def write_json(path, obj):
    """Atomic JSON write; NaN and ±inf (an undefined metric; a threshold above every score, where all scores are
    +inf) are written as null so the file stays valid JSON."""
    atomic_write_text(path, json.dumps(_finite_or_none(obj), indent=2, allow_nan=False) + "\n")


def as_read_back(obj):
    """``obj`` as :func:`write_json` writes it and JSON gives it back (tuples as lists, keys as strings, NaN and
    ±inf as null, what JSON lacks as its ``str``): for comparing what is about to be written with what a file
    holds."""
    return json.loads(json.dumps(_finite_or_none(obj), sort_keys=True, default=str))


def _finite_or_none(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite_or_none(v) for v in obj]
    return obj


def write_npz(path, arrays, *, compressed=False):
    """Write {name: array} (plain arrays, no pickles) as an ``.npz`` file, atomically. ``compressed``: deflate
    every member (True), none (False), or those whose name it accepts (a callable: compress what compresses
    well, store what would only cost time, such as images)."""
    with atomic_output(path) as tmp:  # (straight into the file: a buffer first would copy every byte twice more)
        _write_npz(tmp, arrays, compressed)


def npz_bytes(arrays, *, compressed=False):
    """The bytes of :func:`write_npz`'s file."""
    buffer = io.BytesIO()
    _write_npz(buffer, arrays, compressed)
    return buffer.getvalue()


def zip_member(name, compress_type=zipfile.ZIP_DEFLATED):
    """A zip member ``name`` dated 1980-01-01 (the zip format's first day), so that the same content gives the same
    bytes whenever it is written."""
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = compress_type
    return info


def _write_npz(target, arrays, compressed):
    import numpy as np

    deflate = compressed if callable(compressed) else lambda name: compressed
    with zipfile.ZipFile(target, "w", allowZip64=True) as archive:
        for name, value in arrays.items():
            info = zip_member(f"{name}.npy", zipfile.ZIP_DEFLATED if deflate(name) else zipfile.ZIP_STORED)
            with archive.open(info, "w", force_zip64=True) as member:
                np.lib.format.write_array(member, np.asanyarray(value), allow_pickle=False)


def read_state(from_state_dict, path, what):
    """``from_state_dict`` of the arrays of the ``.npz`` file ``path`` (:func:`read_npz`); its ValueError names the
    file."""
    try:
        return from_state_dict(read_npz(path, what))
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


def read_npz(path, what, max_bytes=8 << 30):
    """{name: array} of an ``.npz`` file, read member by member with bounds: each header is read first and at
    most the bytes it declares (``max_bytes`` in all) are ever decompressed, object arrays (pickles) are refused.
    Every failure is a ValueError naming the file; ``what`` names its role ("accumulator state", ...)."""
    import numpy as np

    path = Path(path)
    try:
        archive = zipfile.ZipFile(path)
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} {path}") from None
    except (zipfile.BadZipFile, OSError, EOFError) as err:
        raise ValueError(f"{path} is not a readable {what}: empty, truncated or not an npz file ({err})") from None
    arrays, total = {}, 0
    try:
        with archive:
            for info in archive.infolist():
                if not info.filename.endswith(".npy"):
                    raise ValueError(f"member {info.filename!r} is not an array")
                with archive.open(info) as member:
                    shape, fortran, dtype = npy_header(member)
                    if dtype.hasobject:
                        raise _Pickled()
                    nbytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
                    total += nbytes
                    if total > max_bytes:
                        raise ValueError(f"its arrays declare {total} bytes, more than the limit of {max_bytes}")
                    data = member.read(nbytes + 1)
                if len(data) != nbytes:
                    raise ValueError(f"array {info.filename[:-4]!r} holds {len(data)} bytes where its header "
                                     f"declares {nbytes}")
                array = np.frombuffer(data, dtype=dtype).reshape(shape, order="F" if fortran else "C")
                arrays[info.filename[:-4]] = array.copy()
    except _Pickled:
        raise ValueError(f"refusing to read {path}: the {what} holds pickled Python objects, which segood never "
                         "loads (a pickle can run code); segood writes plain arrays only") from None
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, zlib.error, MemoryError) as err:
        raise ValueError(f"{path} is not a readable {what}: truncated or corrupt ({type(err).__name__}: {err})") \
            from None
    return arrays


class _Pickled(Exception):
    """An npz member holds object arrays."""


def npy_header(file):
    """(shape, Fortran order, dtype) from the header of an open .npy file or npz member, the array's data left
    unread (so that a header's claims can be checked before anything is allocated for them)."""
    import numpy as np

    version = np.lib.format.read_magic(file)
    read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) else np.lib.format.read_array_header_2_0
    return read_header(file)
