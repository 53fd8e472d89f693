"""The per-image bookkeeping beside the main thread: compiled kernels that hold the GIL against ones that release it.

    python benchmarks/bench_gil.py [--images 4] [--height 1024] [--width 2048] [--repeat 15]

On CUDA each batch's update runs in a thread of its own (``segood.evaluation.runner._Updates``) while the main thread
starts the next batch's network, a stream of short torch calls, each releasing the GIL. The update's host work is
mostly each image's bookkeeping (its curve, metrics and coarse counts: numba kernels). This times that work for the
images of 5 methods on ``--images`` frames (by default 20 images of 1024x2048, scores over 30 binades), a stream of
3000 small torch additions (one thread), and the two at once, with the kernels compiled holding the GIL and
releasing it (segood's), in turns.
"""

import argparse
import threading
import time

import numba
import torch

from bench_metrics import make_data, spread

from segood.metrics import FloatOrderAccumulator, _kernels, bootstrap, functional

# (module, name) of each kernel where the bookkeeping calls it from
KERNELS = [(_kernels, "float_order_curve"), (functional, "builtin_metrics"), (bootstrap, "coarse_counts")]


def compiled(nogil):
    """{(module, name): the kernel compiled with or without releasing the GIL}."""
    return {(module, name): numba.njit(nogil=nogil)(getattr(module, name).py_func) for module, name in KERNELS}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--images", type=int, default=4)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    scores, labels = make_data(args.images, args.height, args.width)
    counts = [(acc.binades, acc.counts) for acc in
              (FloatOrderAccumulator().update(s, lab) for s, lab in zip(spread(scores), labels))]

    def queued():  # the bookkeeping an update leaves for settle(): every image of 5 methods
        acc = FloatOrderAccumulator(per_image=True)
        for _ in range(5):
            for binades, table in counts:
                acc._queue_image(_kernels.float_order_curve, binades, table, acc.mantissa_bits)
        return acc

    small = torch.zeros(64, 64)

    def launches():
        out = small
        for _ in range(3000):
            out = torch.add(out, 1.0)

    def together():
        acc = queued()
        update = threading.Thread(target=acc.settle)
        update.start()
        launches()
        update.join()

    work = {f"bookkeeping of {5 * args.images} images": lambda: queued().settle(), "3000 torch calls": launches,
            "both at once": together}
    variants = {"kernels hold the GIL": compiled(False), "kernels release it (segood)": compiled(True)}
    best = {(v, w): float("inf") for v in variants for w in work}
    for round_ in range(args.repeat + 1):  # (round 0: the warm-up, compiling each variant)
        for variant, kernels in variants.items():
            for (module, name), kernel in kernels.items():
                setattr(module, name, kernel)
            for name, fn in work.items():
                start = time.perf_counter()
                fn()
                if round_:
                    best[variant, name] = min(best[variant, name], time.perf_counter() - start)
    print(f"{args.images} frames of {args.height}x{args.width} over 30 binades, 5 methods; best of {args.repeat} "
          "rounds in turns\n")
    print("| kernels | " + " | ".join(f"{w}, ms" for w in work) + " |")
    print("|---|" + "---:|" * len(work))
    for variant in variants:
        print(f"| {variant} | " + " | ".join(f"{best[variant, w] * 1e3:.1f}" for w in work) + " |")


if __name__ == "__main__":
    main()
