"""Freed memory kept (glibc): a large block freed and allocated again reuses its pages, where glibc's defaults hand
it back to the system and fault it in afresh; ``segood`` commands and reader processes keep it."""

import os
import platform
import subprocess
import sys

import pytest

CHILD = """
import ctypes, resource, sys
ctypes.CDLL(None).prctl(41, 1, 0, 0, 0)  # PR_SET_THP_DISABLE: 4 KiB pages, whatever the machine's huge pages
import torch
import segood
from segood.cli import main

from segood.evaluation.reading import batch_reader

torch.manual_seed(0)
layer, x = torch.nn.Conv2d(3, 32, 3, padding=1), torch.rand(1, 3, 512, 1024)


@torch.no_grad()
def faults():
    for _ in range(3):  # (the heap grows to its size)
        layer(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(4):
        layer(x)  # 64 MiB of activations allocated, written and freed, as a network's layers do
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before


class Faults(torch.utils.data.Dataset):  # (a frame: the faults of the process that reads it)
    def __getitem__(self, index):
        return {"image": torch.zeros(3, 1, 1, dtype=torch.uint8), "faults": torch.tensor([faults()])}


if sys.argv[1] == "function":
    print(segood.keep_freed_memory(), segood.keep_freed_memory())
elif sys.argv[1] == "command":
    main(["metrics", "/nonexistent/state.npz"])  # (an error: the command returns at once)
elif sys.argv[1] == "reader":  # (the first batch is read by this process, the second by a reader process)
    for runs, _ in batch_reader({"frames": Faults()}, [("frames", [0]), ("frames", [1])], workers=1):
        print(int(runs[0][0]["faults"][0]))
print(faults())
"""
PAGES = 4 * 32 * 512 * 1024 * 4 // 4096
LIBC, LIBC_VERSION = platform.libc_ver()
KEEPS_LARGE_BLOCKS = LIBC == "glibc" and tuple(map(int, LIBC_VERSION.split(".")[:2])) >= (2, 35)  # (before 2.35,
# blocks above 32 MiB are handed back whatever the settings)


def faults(mode):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MALLOC_", "GLIBC_TUNABLES"))}  # (defaults)
    run = subprocess.run([sys.executable, "-c", CHILD, mode], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0, run.stderr[-2000:]
    return run.stdout.split()


@pytest.mark.skipif(LIBC != "glibc", reason="glibc's malloc settings")
def test_freed_memory_is_kept_by_the_function_and_by_every_command():
    # glibc's defaults hand back every block above 32 MiB: its pages are faulted in again, each time
    assert int(faults("default")[-1]) >= 0.9 * PAGES
    function = faults("function")
    assert function[:2] == ["True", "True"]
    if KEEPS_LARGE_BLOCKS:
        assert int(function[-1]) < 0.01 * PAGES
        assert int(faults("command")[-1]) < 0.01 * PAGES


@pytest.mark.skipif(not KEEPS_LARGE_BLOCKS, reason="glibc 2.35 or later, which keeps blocks above 32 MiB")
def test_reader_processes_keep_freed_memory_whatever_the_process_that_starts_them():
    in_this_process, in_a_reader, _ = map(int, faults("reader"))
    assert in_this_process >= 0.9 * PAGES
    assert in_a_reader < 0.01 * PAGES
