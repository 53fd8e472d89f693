"""Throughput of the pixel metric engine against the memory-read floor and other libraries, in one run.

    python benchmarks/bench_metrics.py [--images 8] [--height 1024] [--width 2048] [--repeat 15] [--skip-slow]

Every contender sees the same data: ``images`` score maps (float32, higher = more OOD, shaped like a
max-softmax score) with uint8 OOD masks (~10% ignore). Rows print pixels/s and the ratio to the first row,
the memory-read floor (``scores.sum() + labels.sum()``); every segood row includes ``compute()``. The
float-order grid is timed at several resolutions m, on these scores in [0, 1] and on the same values spread
over 30 binades (multiplied by 2^k, k uniform in [0, 30)), on saturated ones (runs of pixels in one bin, as a
confident network's: :func:`saturated`), on scores of both signs (:func:`both_signs`) and on float64 scores. The run also prints the
error of each grid against exact mode (and whether its bounds contain it), and the peak memory of a streaming
run as the number of images grows.
"""

import argparse
import subprocess
import sys
import time

import numpy as np


def make_data(images, height, width, seed=0):
    """Realistic masks and scores. Masks are regions, as in real sets: an ignored strip at the bottom (ego
    vehicle) and rectangles of OOD or ignore, ~10% ignore in all. Scores are shaped like max-softmax: ID
    pixels mostly near 0 with a long tail, OOD pixels higher, independent from pixel to pixel."""
    rng = np.random.default_rng(seed)
    labels = np.zeros((images, height, width), np.uint8)
    for n in range(images):
        labels[n, int(height * 0.93) :] = 255
        for value in (1, 1, 1, 1, 255, 1):
            h, w = rng.integers(height // 12, height // 4), rng.integers(width // 16, width // 6)
            y, x = rng.integers(0, height - h), rng.integers(0, width - w)
            labels[n, y : y + h, x : x + w] = value
    logits = rng.standard_normal(labels.shape, dtype=np.float32) * 1.5
    logits += np.where(labels == 1, 0.5, -3.0).astype(np.float32)
    scores = 1.0 / (1.0 + np.exp(-logits))
    return scores.astype(np.float32), labels


def interleaved_best_times(fns, repeat):
    """Best wall time of each function over ``repeat`` rounds that take turns, so that a noisy neighbour
    on a shared machine slows every contender alike. Each runs once first to warm up (numba, caches)."""
    for fn in fns:
        fn()
    best = [float("inf")] * len(fns)
    for _ in range(repeat):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            fn()
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def one_run(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def spread(scores, binades=30, seed=1):
    """The same scores spread over ``binades`` binades (times 2^k, k uniform in [0, binades)): exact in float32."""
    k = np.random.default_rng(seed).integers(0, binades, scores.shape)
    return (scores * np.exp2(k).astype(np.float32)).astype(np.float32)


def saturated(scores, labels, seed=2):
    """The same scores where a confident network's saturate: in half the area (squares of 32x32 pixels) every ID
    pixel scores exactly 0 (one minus a max softmax of 1.0), so runs of pixels share a bin, as in real maps."""
    height, width = scores.shape[1:]
    squares = np.random.default_rng(seed).random((scores.shape[0], -(-height // 32), -(-width // 32))) < 0.5
    confident = squares.repeat(32, axis=1).repeat(32, axis=2)[:, :height, :width] & (labels == 0)
    return np.where(confident, np.float32(0), scores)


def both_signs(scores):
    """The same scores moved to both signs, as logit-based and standardized scores are: minus 0.125 (most ID pixels
    below zero, most OOD pixels above), so that most blocks of pixels hold scores of both signs."""
    return scores - np.float32(0.125)


def contenders(scores, labels):
    from segood.metrics import FloatOrderAccumulator, LinearGridAccumulator

    wide, confident, signed = spread(scores), saturated(scores, labels), both_signs(scores)
    as64, half = scores.astype(np.float64), scores.astype(np.float16)

    def floor():
        return scores.sum() + labels.sum()

    def floor64():
        return as64.sum() + labels.sum()

    def segood(num_thresholds, data=scores):
        return lambda: LinearGridAccumulator(num_thresholds).update(data, labels).compute()

    def float_order(m, data=scores):
        return lambda: FloatOrderAccumulator(m).update(data, labels).compute()

    def per_frame(data=scores, per_image=True):  # as segood evaluate calls it: an update per frame
        def run():
            acc = FloatOrderAccumulator(10, per_image=per_image)
            for frame, frame_labels in zip(data, labels):
                acc.update(frame, frame_labels)
            return acc.compute()

        return run

    def numpy_bincount():
        keep = labels != 255
        bins = np.minimum((scores[keep] * 399).astype(np.int64), 399)  # the naive multiply-and-floor
        hist = np.bincount(labels[keep].astype(np.int64) * 400 + bins, minlength=800)
        return np.cumsum(hist.reshape(2, 400)[:, ::-1], axis=1)

    def sklearn_exact():
        from sklearn.metrics import roc_auc_score

        keep = labels != 255
        return roc_auc_score(labels[keep], scores[keep])

    def torchmetrics_binned():
        import torch
        from torchmetrics.functional.classification import binary_auroc

        keep = labels != 255
        return binary_auroc(torch.from_numpy(scores[keep]), torch.from_numpy(labels[keep]), thresholds=400)

    return [
        ("memory-read floor: scores.sum() + labels.sum()", floor),
        ("segood float-order grid, m = 10 (default)", float_order(10)),
        ("segood float-order grid, m = 7", float_order(7)),
        ("segood float-order grid, m = 12", float_order(12)),
        ("segood float-order grid, m = 14", float_order(14)),
        ("segood float-order grid, m = 10, scores over 30 binades", float_order(10, wide)),
        ("segood float-order grid, m = 14, scores over 30 binades", float_order(14, wide)),
        ("float-order m = 10, an update per frame", per_frame(per_image=False)),
        ("float-order m = 10, an update per frame, per-image counts (as segood evaluate)", per_frame()),
        ("float-order m = 10, an update per frame, scores over 30 binades", per_frame(wide, per_image=False)),
        ("float-order m = 10, an update per frame, per-image counts, scores over 30 binades", per_frame(wide)),
        ("float-order m = 10, an update per frame, per-image counts, float16 scores", per_frame(half)),
        ("float-order m = 10, an update per frame, saturated scores", per_frame(confident, per_image=False)),
        ("float-order m = 10, an update per frame, per-image counts, scores of both signs", per_frame(signed)),
        ("memory-read floor of float64 scores: as64.sum() + labels.sum()", floor64),
        ("segood float-order grid, m = 10, float64 scores", float_order(10, as64)),
        ("segood float-order grid, m = 12, float64 scores (the general kernel)", float_order(12, as64)),
        ("segood linear grid, T = 400", segood(400)),
        ("segood linear grid, T = 65536", segood(65536)),
        ("segood linear grid, T = 400, saturated scores", segood(400, confident)),
        ("numpy bincount histogram, T = 400 (naive binning)", numpy_bincount),
        ("scikit-learn roc_auc_score (exact)", sklearn_exact),
        ("torchmetrics binary_auroc(thresholds=400)", torchmetrics_binned),
    ]


def accuracy(scores, labels):
    """Absolute error against exact mode, and whether the reported bounds contain it, per grid and data."""
    from segood.metrics import exact_metrics, grid_spec, make_accumulator

    names = ("auroc", "auprc", "fpr95", "max_iou")
    rows = []
    for data_name, data in (("[0, 1]", scores), ("30 binades", spread(scores))):
        exact = exact_metrics(data, labels)
        for grid in (grid_spec(400), grid_spec(65536), *(grid_spec(mantissa_bits=m) for m in (7, 10, 12, 14))):
            if grid["kind"] == "linear" and data_name != "[0, 1]":
                continue
            binned = make_accumulator(grid).update(data, labels).compute()
            errors = {m: abs(binned[m] - exact[m]) for m in names}
            inside = all(binned["bounds"][m][0] - 1e-12 <= exact[m] <= binned["bounds"][m][1] + 1e-12 for m in names)
            label = f"T = {grid['num_thresholds']}" if grid["kind"] == "linear" else f"m = {grid['mantissa_bits']}"
            rows.append((data_name, label, errors, inside))
    return exact_metrics(scores, labels), rows


def streaming_peak_rss(images, height, width, grid):
    """Child process: generate and accumulate one image at a time; peak RSS in MiB."""
    code = f"""
import resource, numpy as np, sys
sys.path.insert(0, {sys.path[0]!r})
from bench_metrics import make_data
from segood.metrics import make_accumulator, grid_spec
acc = make_accumulator({grid!r})
for i in range({images}):
    acc.update(*make_data(1, {height}, {width}, seed=i))
acc.compute()
print(next(l for l in open("/proc/self/status") if l.startswith("VmHWM")).split()[1])
"""
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return float(out.stdout.split()[-1]) / 1024


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=8)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=15)
    parser.add_argument("--skip-slow", action="store_true", help="skip scikit-learn and torchmetrics")
    args = parser.parse_args()

    import numba

    scores, labels = make_data(args.images, args.height, args.width)
    pixels = scores.size
    fractions = ", ".join(f"{name} {np.mean(labels == v):.1%}" for name, v in (("ID", 0), ("OOD", 1), ("ignore", 255)))
    print(f"{args.images} images of {args.height}x{args.width} = {pixels / 1e6:.1f} M pixels, "
          f"{numba.get_num_threads()} numba threads, best of {args.repeat} interleaved rounds; {fractions}\n")
    print("| contender | seconds | pixels/s | ratio to floor |\n|---|---:|---:|---:|")
    rows = contenders(scores, labels)
    fast = [(name, fn) for name, fn in rows if not name.startswith(("scikit", "torchmetrics"))]
    times = interleaved_best_times([fn for _, fn in fast], args.repeat)
    if not args.skip_slow:  # seconds to minutes each: one run, no warm-up
        times += [one_run(fn) for _, fn in rows[len(fast) :]]
    for (name, _), seconds in zip(rows, times):
        print(f"| {name} | {seconds:.4f} | {pixels / seconds:.3g} | {times[0] / seconds:.3g} |", flush=True)

    exact, rows = accuracy(scores, labels)
    names = list(rows[0][2])
    print("\n| scores | grid | " + " | ".join(f"abs error {m}" for m in names) + " | bounds contain exact |"
          "\n|---|---|" + "---:|" * len(names) + "---|")
    for data_name, label, errors, inside in rows:
        print(f"| {data_name} | {label} | " + " | ".join(f"{e:.2e}" for e in errors.values()) + f" | {inside} |")
    print("exact on [0, 1]: " + ", ".join(f"{m} {exact[m]:.6f}" for m in names))

    from segood.metrics import grid_spec

    print("\n| images streamed (one at a time) | float-order m = 10: peak RSS MiB | linear T = 65536: peak RSS MiB |"
          "\n|---:|---:|---:|")
    for images in (1, 8, 32):
        rss = [streaming_peak_rss(images, args.height, args.width, g) for g in (grid_spec(), grid_spec(65536))]
        print(f"| {images} | {rss[0]:.0f} | {rss[1]:.0f} |", flush=True)


if __name__ == "__main__":
    main()
