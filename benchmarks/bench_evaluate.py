"""A full evaluation (every method the head serves) and where its time goes, in one run.

    python benchmarks/bench_evaluate.py [--frames 8] [--height 512] [--width 1024] [--head dropout] [--device cpu]

Builds a mixed set of procedural scenes and Perlin noise at the given size, evaluates an untrained
PSPNet-ResNet50 with the given head on it through ``segood.evaluate`` (batch 1) and prints images/s and the share
of the run's time in data loading, forward, each method's scoring and accumulation. Freed memory kept, as in every
``segood`` command (``segood.keep_freed_memory``).
"""

import argparse
import shutil
import time
from pathlib import Path

import torch

from segood import keep_freed_memory
from segood.data import Noise, convert, mix
from segood.data.h5 import H5SegmentationDataset, frame_loader
from segood.data.synthetic import write_scene_set
from segood.evaluation import evaluate
from segood.evaluation.runner import default_methods
from segood.models import build_model


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--head", default="dropout")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench-eval"))
    args = parser.parse_args()
    keep_freed_memory()
    shutil.rmtree(args.workdir, ignore_errors=True)
    size = (args.height, args.width)
    write_scene_set(args.workdir / "scenes.h5", args.frames // 2, size)
    convert(Noise("perlin", args.frames - args.frames // 2, size=size), args.workdir / "perlin.h5", size=size,
            progress=False)
    mix(args.workdir / "perlin.h5", args.workdir / "scenes.h5", args.workdir / "mixed.h5", progress=False)

    torch.manual_seed(0)
    model = build_model("pspnet", "resnet50", head=args.head).to(args.device).eval()
    methods = default_methods(model)
    for method in methods:  # fitted before the clock starts (Mahalanobis on the scenes)
        if method.needs.fit:
            method.fit(model, frame_loader(H5SegmentationDataset(args.workdir / "scenes.h5")))
    start = time.perf_counter()
    doc = evaluate(model, [args.workdir / "mixed.h5"], methods, args.workdir / "run", batch_size=1,
                   device=args.device, progress=False, figures=False)
    seconds = time.perf_counter() - start
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else f"CPU, {torch.get_num_threads()} threads"
    print(f"pspnet resnet50 + {args.head}, {args.frames} frames of {args.height}x{args.width}, {name}")
    print(f"methods: {', '.join(doc['results'])}")
    print(f"{args.frames / seconds:.3f} images/s ({seconds:.1f} s in all, reports and figures excluded)\n")
    ms = doc["timings"]["ms_per_image"]
    total = sum(ms.values())
    print("| stage | ms/image | share |\n|---|---:|---:|")
    for stage, value in sorted(ms.items(), key=lambda kv: -kv[1]):
        print(f"| {stage} | {value:.1f} | {value / total:.1%} |")


if __name__ == "__main__":
    main()
