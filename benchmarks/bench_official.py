"""Cost of the official mode (SMIYC's, Fishyscapes' and CAOS' own metrics) per frame, against segood's own pixel
accumulator on the same frame, in one run.

    python benchmarks/bench_official.py --height 1024 --width 2048 [--repeat 3]

Random scores with ~5% OOD pixels, as float32 (every pixel a distinct value: the worst case for Fishyscapes' table)
and as float16; each contender adds the frame to a fresh accumulator and computes. Freed memory kept, as in every
``segood`` command (``segood.keep_freed_memory``).
"""

import numpy as np
import torch

from torch_timing import interleaved_best_ms, parse_args

from segood.metrics import make_accumulator
from segood.metrics.official import CAOSPixelAccumulator, FishyscapesPixelAccumulator, SMIYCPixelAccumulator


def main():
    args = parse_args(__doc__, repeat=3)
    rng = np.random.default_rng(0)
    labels = (rng.random((args.height, args.width)) < 0.05).astype(np.uint8)
    scores = rng.random((args.height, args.width)).astype(np.float32)
    rows = []
    for dtype in (np.float32, np.float16):
        s = scores.astype(dtype)
        contenders = {"segood (float-order grid, m = 10)": lambda: make_accumulator().update(s, labels).compute(),
                      "SMIYC official": lambda: SMIYCPixelAccumulator().update(s, labels).compute(),
                      "Fishyscapes official": lambda: FishyscapesPixelAccumulator().update(s, labels).compute(),
                      "CAOS official": lambda: CAOSPixelAccumulator().update(s, labels).compute()}
        times = interleaved_best_ms(list(contenders.values()), args.repeat, torch.device("cpu"))
        rows += [(name, np.dtype(dtype).name, ms) for name, ms in zip(contenders, times)]
    print(f"frame {args.height}x{args.width}, CPU, {torch.get_num_threads()} threads, best of {args.repeat}\n")
    print("| accumulator | scores | ms per frame |\n|---|---|---:|")
    for name, dtype, ms in rows:
        print(f"| {name} | {dtype} | {ms:.0f} |")


if __name__ == "__main__":
    main()
