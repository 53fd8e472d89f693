"""Small file helpers: writes are atomic, so a run that dies never leaves a half-written file."""

import json
import os
import tempfile
import zipfile
from contextlib import contextmanager
from pathlib import Path


@contextmanager
def atomic_output(path):
    """Yield a temporary path beside ``path``; it replaces ``path`` only when the block completes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    os.close(fd)
    try:
        yield tmp
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)  # mkstemp's 0600 would surprise whoever shares the run folder
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then a rename)."""
    with atomic_output(path) as tmp, open(tmp, "wb") as f:
        f.write(data)


def atomic_write_text(path, text):
    """Atomic text write (UTF-8)."""
    atomic_write_bytes(path, text.encode())


def write_json(path, obj):
    """Atomic JSON write; NaN is written as null so the file stays valid JSON."""
    atomic_write_text(path, json.dumps(_nan_to_none(obj), indent=2, allow_nan=False) + "\n")


def _nan_to_none(obj):
    if isinstance(obj, float) and obj != obj:
        return None
    if isinstance(obj, dict):
        return {k: _nan_to_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_nan_to_none(v) for v in obj]
    return obj


def read_npz(path, what):
    """{name: array} of an ``.npz`` file, never unpickling; every failure is a ValueError naming the file.

    ``what`` names the file's role in the message ("accumulator state", "evaluation state").
    """
    import numpy as np

    try:
        with np.load(path, allow_pickle=False) as arrays:
            return {key: arrays[key] for key in arrays.files}
    except FileNotFoundError:
        raise FileNotFoundError(f"no {what} {path}") from None
    except ValueError as err:
        if "pickle" in str(err):  # numpy's message suggests loading it unsafely: never pass that on
            raise ValueError(f"refusing to read {path}: the {what} holds pickled Python objects, which segood "
                             "never loads (a pickle can run code); segood writes plain arrays only") from None
        raise ValueError(f"{path} is not a readable {what}: corrupt array header ({err})") from None
    except (OSError, EOFError, zipfile.BadZipFile, KeyError) as err:
        raise ValueError(f"{path} is not a readable {what}: empty, truncated or not an npz file "
                         f"({type(err).__name__}: {err})") from None
