"""Timing helpers shared by the network benchmarks."""

import argparse
import time

import torch


def parse_args(doc, repeat):
    """The options every network benchmark takes: input size, repeats, device."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--repeat", type=int, default=repeat)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    return parser.parse_args()


def best_ms(fn, repeat, device):
    """Best wall time of ``fn()`` in ms over ``repeat`` runs after one warm-up, synchronising CUDA."""
    fn()
    best = float("inf")
    for _ in range(repeat):
        if device.type == "cuda":
            torch.cuda.synchronize()
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def device_name(device):
    return torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
