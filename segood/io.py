"""Small file helpers: writes are atomic, so a run that dies never leaves a half-written file."""

import json
import os
import tempfile
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
