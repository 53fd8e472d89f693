"""``segood score`` of score maps made elsewhere, as it is and with what the official mode and the component
metrics add, in ms per frame, in one run.

    python benchmarks/bench_score.py [--frames 16] [--height 1024] [--width 2048] [--repeat 3] [--workdir DIR]

A set of frames with obstacle-like OOD blobs and noisy float16 maps (the frame of ``bench_components.py``, one seed
a frame) in segood's layout; each contender is ``segood.evaluate_score_maps`` into a fresh run folder, no figures.
The component metrics with thresholds tuned on the set (``oracle``) read the maps a second time. Freed memory kept,
as in every ``segood`` command (``segood.keep_freed_memory``).
"""

import argparse
import shutil
from pathlib import Path

import h5py
import numpy as np
import torch

from bench_components import frame
from torch_timing import interleaved_best_ms

from segood import keep_freed_memory
from segood.data.common import Sample
from segood.data.h5 import SetWriter
from segood.evaluation import evaluate_score_maps

CONTENDERS = {
    "segood score": {},
    "--official smiyc": {"official": "smiyc"},
    "--official caos": {"official": "caos"},
    "--components obstacle --component-thresholds oracle": {"components": {"preset": "obstacle", "source": "oracle"}},
}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench-score"))
    args = parser.parse_args()
    keep_freed_memory()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    data, maps = args.workdir / "set.h5", args.workdir / "maps.h5"
    writer = SetWriter(data, (args.height, args.width), {"source": "bench", "split": "test"})
    with h5py.File(maps, "w") as f:
        for k in range(args.frames):
            scores, labels = frame(args.height, args.width, seed=k)
            writer.append(Sample(np.zeros((args.height, args.width, 3), np.uint8), labels, labels, f"bench/{k}"))
            f.create_dataset(f"bench/{k}", data=scores.astype(np.float16))
    writer.commit()

    def score(options):
        out = args.workdir / "run"
        shutil.rmtree(out, ignore_errors=True)
        evaluate_score_maps(maps, data, out, figures=False, **options)

    times = interleaved_best_ms([lambda o=o: score(o) for o in CONTENDERS.values()], args.repeat,
                                torch.device("cpu"))
    print(f"{args.frames} frames of {args.height}x{args.width} float16 maps, CPU, best of {args.repeat}\n")
    print("| segood score | ms per frame | ratio |\n|---|---:|---:|")
    for name, ms in zip(CONTENDERS, times):
        print(f"| {name} | {ms / args.frames:.1f} | {ms / times[0]:.2f} |")


if __name__ == "__main__":
    main()
