"""The main process's threads while reader processes run beside it.

Reading, scoring and accumulating overlap: reader processes decode the next batches while the main process scores
this one. The main process's own elementwise work (normalising the frames, scoring, histograms) is split into as
many chunks as it has threads, and an operation ends with its last chunk: a chunk waiting for a core that a reader
holds holds the whole operation up. So while readers run, that work uses only the cores they leave (at least
one), and the network's passes on the CPU, which do most of the arithmetic, keep every thread the process had.
"""

import contextlib
import os

import numba
import torch

_FULL = []  # the torch thread count before the innermost :func:`beside_readers` limited it


def cores():
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


@contextlib.contextmanager
def beside_readers(workers):
    """Within: torch's and the histogram kernels' (numba's) threads of the calling thread limited to the cores
    ``workers`` reader processes leave; unchanged without readers."""
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
    limited = torch.get_num_threads()
    if not _FULL or _FULL[-1] == limited or torch.device(device).type != "cpu":
        yield
        return
    torch.set_num_threads(_FULL[-1])
    try:
        yield
    finally:
        torch.set_num_threads(limited)
