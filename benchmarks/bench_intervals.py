"""Cost of the bootstrap intervals and paired comparisons, and the size of the per-image counts they need.

    python benchmarks/bench_intervals.py [--methods 7] [--sets 4] [--images 500] [--resamples 1000] [--binades 20]

Each (method, set) holds ``--images`` images whose scores spread log-uniformly over ``--binades`` binades (the
coarse grid then holds up to 32 bins per binade per image: the worst case for the state's size), accumulated on
the default float-order grid with per-image counts; the time is that of ``segood.evaluation.analysis
.computed`` and ``significance`` (the pooled metrics, every interval, paired comparison and rank), the size that of the per-image arrays in the
state. Target (issue 17): 7 methods x 4 sets x 500 images in <= 10 s on CPU; <= 32 KiB per image per
(method, set).
"""

import argparse
import time

import numpy as np

from segood.evaluation.runner import Evaluation
from segood.metrics.bootstrap import Bootstrap


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--methods", type=int, default=7)
    parser.add_argument("--sets", type=int, default=4)
    parser.add_argument("--images", type=int, default=500)
    parser.add_argument("--pixels", type=int, default=4096, help="pixels per image (the cost does not depend on it)")
    parser.add_argument("--resamples", type=int, default=1000)
    parser.add_argument("--binades", type=int, default=20)
    args = parser.parse_args()
    from segood.evaluation.analysis import computed, significance

    methods, sets = [f"m{k}" for k in range(args.methods)], [f"s{k}" for k in range(args.sets)]
    ev = Evaluation(methods, sets)
    rng = np.random.default_rng(0)
    start = time.perf_counter()
    for s in sets:
        labels = (rng.random((args.images, args.pixels)) < 0.2).astype(np.uint8)
        for k, m in enumerate(methods):
            scores = 2.0 ** (-args.binades * rng.random((args.images, args.pixels)) + 0.3 * k / args.methods * labels)
            ev.acc[(m, s)].update(scores.astype(np.float32), labels)
    built = time.perf_counter() - start
    sizes = [sum(a.nbytes for a in acc.images.arrays().values()) / acc.n_images for acc in ev.acc.values()]
    start = time.perf_counter()
    cells, comparisons, _ = significance(ev, computed(ev), Bootstrap(args.resamples, seed=0))
    seconds = time.perf_counter() - start
    assert len(cells) == args.methods * args.sets and len(comparisons) == args.sets
    print(f"{args.methods} methods x {args.sets} sets x {args.images} images, {args.resamples} resamples, scores over "
          f"{args.binades} binades: intervals, paired comparisons and ranks in {seconds:.2f} s (target <= 10 s); "
          f"per-image counts {np.mean(sizes) / 1024:.1f} KiB per image per (method, set) on average, "
          f"{max(sizes) / 1024:.1f} KiB at most (target <= 32 KiB); accumulation took {built:.1f} s")


if __name__ == "__main__":
    main()
