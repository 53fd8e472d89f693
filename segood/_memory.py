"""Freed memory kept by the process: glibc's malloc hands every block above a threshold (at most 32 MiB, adapting)
back to the system when it is freed, so the next block of that size faults its pages in afresh, zeroed by the
kernel. A network's forward pass on the CPU frees and allocates its activations, hundreds of MiB, every frame:
PSPNet-ResNet50 at 1024x2048 faulted 1.3 M pages a forward pass on a 2-core virtual machine and ran 3.0 times
slower than with its freed memory kept, 1.9 times at 512x1024 (``benchmarks/bench_malloc.py``)."""

import ctypes
import functools

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h
KEEP = 1 << 30  # bytes: blocks up to this size come from the heap, and this much freed at its top stays there
OLD_GLIBC_KEEP = 1 << 25  # the largest mmap threshold glibc before 2.35 accepts


@functools.cache
def keep_freed_memory():
    """Make glibc's malloc serve blocks of up to 1 GiB from its heap (32 MiB before glibc 2.35, which refuses
    more) and keep up to 1 GiB freed at the heap's top, instead of returning them to the system at once: the
    process's resident memory stays near its peak, and its large blocks reuse pages instead of faulting them in
    again. For this process and the reader processes it forks from then on; ``segood`` commands call it, a script
    of your own may too, and every reader process that reads an evaluation's frames calls it for itself (a reader
    decodes MiBs a frame). Returns whether it applied (False where the C library is not glibc, whose malloc has no
    such settings)."""
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (AttributeError, OSError, TypeError):  # (no mallopt: not glibc)
        return False
    heap = any(mallopt(M_MMAP_THRESHOLD, size) for size in (KEEP, OLD_GLIBC_KEEP))
    return bool(mallopt(M_TRIM_THRESHOLD, KEEP)) and heap
