"""Whether segood's Triton kernels can run here: Triton imports (it ships with torch's CUDA builds on Linux) and
no kernel has failed to build or launch on this machine. After a failure every kernel gives way to its torch path,
which computes the same."""

import contextlib
import functools
import warnings

_BROKEN = []  # why a Triton kernel failed on this machine, once one has


def available():
    return _imports() and not _BROKEN


@functools.lru_cache(maxsize=None)
def _imports():
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True


def attempt(call, kernel, fallback, device):
    """``call()``, a launch of the Triton ``kernel`` on the CUDA ``device`` of its tensors (made the current device
    meanwhile: Triton launches on the current one); None where Triton cannot build or launch it on this machine,
    after a warning that ``fallback`` is used from now on (running out of device memory is raised as it is)."""
    import torch

    try:
        with torch.cuda.device(device) if device.type == "cuda" else contextlib.nullcontext():  # (CPU: tests)
            return call()
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - a Triton that cannot build or launch its kernels here
        _BROKEN.append(f"{type(err).__name__}: {err}")
        warnings.warn(f"segood's Triton {kernel} failed here ({_BROKEN[0][:300]}); {fallback} instead",
                      RuntimeWarning, stacklevel=3)
        return None
