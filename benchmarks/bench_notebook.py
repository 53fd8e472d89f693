"""The notebook call's time: ``segood.evaluate`` of one method on 4 frames of 64x64, kept in memory (no run folder,
no figures) against writing a run folder with figures (what every call did before ``out_dir=None``).

    python benchmarks/bench_notebook.py [--repeats 3] [--folder-only]

Builds a mixed set (2 Perlin-noise frames, 2 Cityscapes-layout frames, 64x64), times each way ``--repeats`` times
after one warm-up call (numba compiled) and prints the best of each and their ratio. ``--folder-only`` times only
the folder way, for code without the in-memory one.
"""

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from rawtrees import mixed_noise_sets  # noqa: E402

from segood.evaluation import evaluate  # noqa: E402


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--folder-only", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="segood-bench-notebook-") as folder:
        work = Path(folder)
        sets = mixed_noise_sets(work, kinds=("perlin",), noise_frames=2, cityscapes_frames=2)
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Conv2d(8, 19, 1))
        data = {"perlin": sets / "perlin_mixed.h5"}
        ways = {"run folder + figures":
                lambda k: evaluate(model, data, ["max_softmax"], work / f"run{k}", progress=False)}
        if not args.folder_only:
            ways["in memory"] = lambda k: evaluate(model, data, ["max_softmax"], progress=False)
        best = {}
        for name, call in ways.items():
            call("warm")
            times = []
            for k in range(args.repeats):
                t0 = time.perf_counter()
                call(k)
                times.append(time.perf_counter() - t0)
            best[name] = min(times)
            print(f"{name}: {best[name]:.2f} s (best of {args.repeats})")
    if len(best) == 2:
        print(f"in memory / run folder + figures: {best['in memory'] / best['run folder + figures']:.2f}")


if __name__ == "__main__":
    main()
