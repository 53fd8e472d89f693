"""A network's forward pass on the CPU with glibc's defaults and with its freed memory kept
(``segood.keep_freed_memory``, which every ``segood`` command calls).

    python benchmarks/bench_malloc.py [--sizes 512x1024 1024x2048] [--rounds 3] [--encoder resnet50]

Each measurement runs in a fresh process (the setting cannot be undone), the two settings taking turns for
``--rounds`` rounds at each size; each process times the best of 3 forward passes of PSPNet (random weights, batch
1) after 2 that warm up, and counts the page faults of the last. Prints the best time of each and their ratio.
"""

import argparse
import subprocess
import sys

CHILD = """
import resource, sys, time
import torch
import segood
from segood.models import build_model

kept, encoder, height, width = sys.argv[1] == "kept", sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
if kept:
    assert segood.keep_freed_memory(), "glibc's malloc settings could not be set here"
torch.manual_seed(0)
model = build_model("pspnet", encoder).eval()
x = torch.randn(1, 3, height, width)
with torch.no_grad():
    for _ in range(2):
        model(x)
    best = float("inf")
    for _ in range(3):
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        start = time.perf_counter()
        model(x)
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
    print(f"PSPNet-{args.encoder} forward pass, batch 1, CPU; best of {args.rounds} processes each\n")
    print("| size | glibc's defaults ms | page faults | freed memory kept ms | page faults | speed-up |")
    print("|---|---:|---:|---:|---:|---:|")
    for size in args.sizes:
        height, width = size.split("x")
        best = {}
        for _ in range(args.rounds):
            for mode in ("default", "kept"):
                run = subprocess.run([sys.executable, "-c", CHILD, mode, args.encoder, height, width],
                                     capture_output=True, text=True, check=True)
                ms, faults = run.stdout.split()
                best[mode] = min(best.get(mode, (float("inf"), 0)), (float(ms), int(faults)))
        (slow, slow_faults), (fast, fast_faults) = best["default"], best["kept"]
        print(f"| {size} | {slow:.0f} | {slow_faults} | {fast:.0f} | {fast_faults} | {slow / fast:.2f}x |")


if __name__ == "__main__":
    main()
