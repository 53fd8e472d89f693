"""What the exact grid costs against the float-order grid, per million pixels, in one run on the same data.

    python benchmarks/bench_exact.py [--images 4] [--height 1024] [--width 2048] [--repeat 3] [--per-image]

Both grids see ``images`` float32 score maps shaped like a max-softmax score with uint8 OOD masks (~10% ignore;
``bench_metrics.make_data``), fed one image per ``update``. Prints, per million pixels, the best-of-``repeat``
time of the updates and of ``compute()``, the bytes of the state (what ``save`` writes and a process holds), and
the peak bytes allocated through numpy while updating and computing (``tracemalloc``), for the exact grid and the
float-order grid at m = 10 (the default), and the ratio exact / float-order of each; then the largest
difference between the two grids' values and whether the float-order bounds hold the exact ones. With
``--per-image`` both track per-image counts (the runner's setting: one sort per image more).
"""

import argparse
import sys
import time
import tracemalloc
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_metrics import make_data  # noqa: E402

from segood.metrics import METRICS, make_accumulator  # noqa: E402


def run(grid, scores, labels, per_image):
    """(update seconds, compute seconds, result, state bytes, peak traced bytes) of one pass over the images."""
    tracemalloc.start()
    acc = make_accumulator(grid, per_image=per_image)
    t0 = time.perf_counter()
    for s, lab in zip(scores, labels):
        acc.update(s[None] if per_image else s, lab[None] if per_image else lab)
    t1 = time.perf_counter()
    result = acc.compute()
    t2 = time.perf_counter()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    state = sum(np.asarray(v).nbytes for v in acc.state_dict().values())
    return t1 - t0, t2 - t1, result, state, peak


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--per-image", action="store_true")
    args = parser.parse_args()
    scores, labels = make_data(args.images, args.height, args.width)
    megapixels = scores.size / 1e6
    grids = {"exact": {"kind": "exact", "max_pixels": 1 << 30}, "float-order (m = 10)": {"kind": "float",
                                                                                          "mantissa_bits": 10}}
    for grid in grids.values():  # compile the kernels first
        make_accumulator(grid).update(np.array([0.25, 0.75], np.float32), np.array([0, 1], np.uint8)).compute()
    rows = {}
    for name, grid in grids.items():
        runs = [run(grid, scores, labels, args.per_image) for _ in range(args.repeat)]
        rows[name] = {"update": min(r[0] for r in runs), "compute": min(r[1] for r in runs), "result": runs[0][2],
                      "state": runs[0][3], "peak": max(r[4] for r in runs)}
    print(f"{args.images} images of {args.height}x{args.width} ({megapixels:.1f} Mpx, float32 scores"
          f"{', per-image counts' if args.per_image else ''}), best of {args.repeat}; per million pixels:\n")
    print("| grid | update ms | compute ms | state bytes | peak bytes |")
    print("|---|---:|---:|---:|---:|")
    for name, row in rows.items():
        print(f"| {name} | {1e3 * row['update'] / megapixels:.1f} | {1e3 * row['compute'] / megapixels:.2f} | "
              f"{row['state'] / megapixels:.3g} | {row['peak'] / megapixels:.3g} |")
    exact, binned = rows["exact"], rows["float-order (m = 10)"]
    print(f"| exact / float-order | {exact['update'] / binned['update']:.2f}x | "
          f"{exact['compute'] / binned['compute']:.0f}x | {exact['state'] / binned['state']:.0f}x | "
          f"{exact['peak'] / binned['peak']:.1f}x |")
    differences = {k: abs(exact["result"][k] - binned["result"][k]) for k in METRICS}
    held = all(lo - 1e-12 <= exact["result"][k] <= hi + 1e-12 for k, (lo, hi) in binned["result"]["bounds"].items())
    worst = max(differences, key=differences.get)
    print(f"\nlargest |exact - float-order|: {differences[worst]:.2g} ({worst}); float-order bounds hold the exact "
          f"values: {held}")


if __name__ == "__main__":
    main()
