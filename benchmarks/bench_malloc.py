"""A network's forward pass on the CPU, and a reader process's batch, with glibc's defaults and with freed memory
kept (``segood.keep_freed_memory``, which every ``segood`` command and every reader process calls).

    python benchmarks/bench_malloc.py [--sizes 512x1024 1024x2048] [--rounds 3] [--encoder resnet50]

Each measurement runs in a fresh process (the setting cannot be undone), the two settings taking turns for
``--rounds`` rounds at each size; each process times the best of 3 runs after 2 that warm up, and counts the page
faults of the last: a forward pass of PSPNet (random weights, batch 1), and a reader's batch (four frames of a
converted set read, verified and decoded, then stacked into the block of memory that the reader writes again).
Prints the best time of each and their ratio.
"""

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from segood.data.synthetic import write_scene_set

CHILD = """
import resource, sys, time
import torch
import segood

what, kept, height, width, arg = sys.argv[1], sys.argv[2] == "kept", int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
if kept:
    assert segood.keep_freed_memory(), "glibc's malloc settings could not be set here"
if what == "forward":
    from segood.models import build_model

    torch.manual_seed(0)
    model = build_model("pspnet", arg).eval()
    x = torch.randn(1, 3, height, width)
    run = lambda: model(x)
else:  # a reader's batch
    from segood.data.h5 import H5SegmentationDataset
    from segood.evaluation.reading import _filled, _layout, read_batch

    dataset, indices, block = H5SegmentationDataset(arg), [0, 1, 2, 3], None

    def run():
        global block
        items, kept, _ = read_batch(dataset, indices)
        layout, size = _layout(items, kept)
        block = torch.empty(size, dtype=torch.uint8) if block is None else block
        _filled(block, layout, items)
with torch.no_grad():
    for _ in range(2):
        run()
    best = float("inf")
    for _ in range(3):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(1000 * best, faults)
"""


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", nargs="+", default=["512x1024", "1024x2048"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--encoder", default="resnet50")
    args = parser.parse_args()
    print(f"CPU; best of {args.rounds} processes each\n")
    print("| what | size | glibc's defaults ms | page faults | freed memory kept ms | page faults | speed-up |")
    print("|---|---|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as work:
        for size in args.sizes:
            height, width = size.split("x")
            path = Path(work) / f"{size}.h5"
            write_scene_set(path, 4, (int(height), int(width)))
            for what, arg, name in (("forward", args.encoder, f"PSPNet-{args.encoder} forward pass, batch 1"),
                                    ("reader", str(path), "a reader's batch of 4 frames")):
                best = {}
                for _ in range(args.rounds):
                    for mode in ("default", "kept"):
                        run = subprocess.run([sys.executable, "-c", CHILD, what, mode, height, width, arg],
                                             capture_output=True, text=True, check=True)
                        ms, faults = run.stdout.split()
                        best[mode] = min(best.get(mode, (float("inf"), 0)), (float(ms), int(faults)))
                (slow, slow_faults), (fast, fast_faults) = best["default"], best["kept"]
                print(f"| {name} | {size} | {slow:.0f} | {slow_faults} | {fast:.0f} | {fast_faults} | "
                      f"{slow / fast:.2f}x |")


if __name__ == "__main__":
    main()
