"""Timing helpers shared by the network benchmarks."""

import time

import torch


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
