"""Timing helpers shared by the network benchmarks."""

import argparse
import time

import torch

from segood import keep_freed_memory


def parse_args(doc, repeat, height=512, width=1024, more=None):
    """The options every network benchmark takes: input size, repeats, device; ``more(parser)`` adds a script's
    own."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=height)
    parser.add_argument("--width", type=int, default=width)
    parser.add_argument("--repeat", type=int, default=repeat)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    if more is not None:
        more(parser)
    args = parser.parse_args()
    keep_freed_memory()  # (as every segood command does: forward passes on the CPU without page faults)
    return args


def best_ms(fn, repeat, device):
    """Best wall time of ``fn()`` in ms over ``repeat`` runs after one warm-up, synchronising CUDA."""
    return interleaved_best_ms([fn], repeat, device)[0]


def interleaved_best_ms(fns, repeat, device):
    """Best wall time in ms of each function over ``repeat`` rounds that take turns, after one warm-up each,
    so that a noisy neighbour on a shared machine slows every contender alike (ratios stay honest)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            if device.type == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            fn()
            if device.type == "cuda":
                torch.cuda.synchronize()
            best[i] = min(best[i], time.perf_counter() - start)
    return [seconds * 1e3 for seconds in best]


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
