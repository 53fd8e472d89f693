"""The main process's threads: how many while reader processes run beside it, and the pool that runs a kernel's
chunks on them (:func:`run_chunks`).

Reading, scoring and accumulating overlap: reader processes decode the next batches while the main process scores
this one. The main process's own elementwise work (normalising the frames, scoring, histograms) is split into as
many chunks as it has threads, and an operation ends with its last chunk: a chunk waiting for a core that a reader
holds holds the whole operation up. So while readers run, that work uses only the cores they leave (at least
one), and the network's passes on the CPU, which do most of the arithmetic, keep every thread the process had.
"""

import contextlib
import functools
import os
from concurrent.futures import ThreadPoolExecutor

_FULL = []  # the torch thread count before the innermost :func:`beside_readers` limited it


def cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def beside_readers(workers):
    """Within: torch's and the histogram kernels' (numba's) threads of the calling thread limited to the cores
    ``workers`` reader processes leave; unchanged without readers."""
    import numba  # (here: the histogram kernels import this module without torch)
    import torch

    torch_before, numba_before = torch.get_num_threads(), numba.get_num_threads()
    if workers:
        torch.set_num_threads(max(1, min(torch_before, cores() - workers)))
        numba.set_num_threads(max(1, min(numba_before, cores() - workers)))
    _FULL.append(torch_before)
    try:
        yield
    finally:
        _FULL.pop()
        torch.set_num_threads(torch_before)
        numba.set_num_threads(numba_before)


@contextlib.contextmanager
def for_network(device):
    """Within: a network's passes on the CPU get back every torch thread :func:`beside_readers` took."""
    import torch

    limited = torch.get_num_threads()
    if not _FULL or _FULL[-1] == limited or torch.device(device).type != "cpu":
        yield
        return
    torch.set_num_threads(_FULL[-1])
    try:
        yield
    finally:
        torch.set_num_threads(limited)


@functools.lru_cache(maxsize=None)
def _pool(threads):
    return ThreadPoolExecutor(max_workers=threads, thread_name_prefix="segood-kernel")


def run_chunks(work, chunks, threads):
    """Run ``work(taken)`` in ``threads`` threads at once, the calling thread one of them (one thread fewer to wake
    per call: a frame-sized call is ~1 ms of work): ``taken`` yields chunk indices in [0, ``chunks``), each to
    the one thread that takes it, so that a thread that starts late or runs slow takes fewer chunks."""
    taken = iter(range(chunks))  # (a range iterator's next is atomic: the threads share it)
    others = [_pool(threads).submit(work, taken) for _ in range(1, min(threads, chunks))]
    try:
        work(taken)
    finally:
        for future in others:
            future.result()
