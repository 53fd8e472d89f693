"""Small file helpers: writes are atomic, so a run that dies never leaves a half-written file."""

import json
import os
import tempfile
from pathlib import Path


def atomic_write_bytes(path, data):
    """Write ``data`` to ``path`` through a temporary file in the same folder and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise


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
