"""Runs of a test's worker in several processes joined by a gloo process group on this machine, for the tests of
``all_reduce`` and of distributed evaluation."""

import socket

import torch
import torch.distributed as dist


def run_in_group(worker, *args, world=2):
    """Spawn ``world`` processes that each join one gloo group and call ``worker(rank, world, *args)``.

    Args:
        worker: a module-level function (spawn pickles it by name); what it returns is dropped, so it writes its
            results to files for the test to read.
        *args: further arguments of ``worker``, picklable (paths as ``str``).
        world: the number of processes.
    """
    with socket.socket() as sock:  # a port free now; the group's rank 0 binds it moments later
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    torch.multiprocessing.spawn(_in_group, args=(world, port, worker, args), nprocs=world)


def _in_group(rank, world, port, worker, args):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        worker(rank, world, *args)
    finally:
        dist.destroy_process_group()
