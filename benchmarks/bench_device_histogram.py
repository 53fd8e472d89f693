"""The float-order histogram's torch path (what a device without Triton runs) against the numba kernel, on the CPU.

    python benchmarks/bench_device_histogram.py [--images 8] [--height 1024] [--width 2048] [--repeat 5]

Both see the same ``images`` max-softmax-like float32 maps (benchmarks/bench_metrics.py's data) at m = 10 and
give per-image counts: the numba kernel one image at a time (as the accumulator runs it on host arrays), the torch
path on the whole batch (segood.metrics._device, as the accumulator runs it on a device): its two passes, and its
one pass where the binades are known (an accumulator's, after its first batches). Prints ms, the ratio to
the memory-read floor and the torch path's time as a multiple of the numba kernel's: on a GPU the Triton kernel
runs instead (benchmarks/gpu_check.py).
"""

import argparse
import sys
from pathlib import Path

import numba
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import interleaved_best_times, make_data  # noqa: E402

from segood.metrics import _device, _kernels  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    scores, labels = make_data(args.images, args.height, args.width)
    batch = torch.from_numpy(scores).reshape(args.images, -1), torch.from_numpy(labels).reshape(args.images, -1)
    threads = numba.get_num_threads()

    def floor():
        return scores.sum() + labels.sum()

    def numba_per_image():
        return [_kernels.float_histogram_numpy(s.ravel(), lab.ravel(), 10, threads) for s, lab in zip(scores, labels)]

    def torch_batch():
        return _device.float_histograms(*batch, 10, kernel="torch")

    known = np.unique(np.concatenate([binades for binades, _ in torch_batch()[0]]))

    def torch_known():
        return _device.float_histograms(*batch, 10, kernel="torch", known=known)

    rows = {"memory-read floor": floor, "numba kernel, per image": numba_per_image,
            "torch path, one batch (segood.metrics._device)": torch_batch,
            "torch path, one batch, binades known (one pass)": torch_known}
    seconds = dict(zip(rows, interleaved_best_times(list(rows.values()), args.repeat)))
    print(f"float-order histogram, m = 10, {args.images} maps of {args.height}x{args.width} float32, CPU "
          f"({torch.get_num_threads()} torch threads, {threads} numba threads)")
    for name, value in seconds.items():
        print(f"{name:64s} {value * 1e3:9.1f} ms  {seconds['memory-read floor'] / value:6.3f} of the floor")
    ratio = seconds["torch path, one batch (segood.metrics._device)"] / seconds["numba kernel, per image"]
    print(f"torch path / numba kernel: {ratio:.1f}x the time")
    one_pass, two_passes = (seconds[f"torch path, one batch{which}"]
                            for which in (", binades known (one pass)", " (segood.metrics._device)"))
    print(f"torch path, one pass / two passes: {one_pass / two_passes:.2f}x the time")


if __name__ == "__main__":
    main()
