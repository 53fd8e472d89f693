"""Native size against one size for all: the numbers and the cost, on a RoadAnomaly21-like track of mixed sizes.

    python benchmarks/bench_native.py [--frames 16] [--scale 4] [--variants native resized] [--out FILE.json]

Writes a SegmentMeIfYouCan anomaly track (``dataset_AnomalyTrack``: JPEG images, label PNGs) of procedural
driving scenes with an OOD object, half of them 2048x1024 and half 1280x720 (both divided by ``--scale``), as
RoadAnomaly21 mixes them. Converts it twice: ``native`` (each frame at its own size, how SMIYC evaluates) and
``resized`` (every frame stretched to the larger size, as a set of one size had to be), and evaluates the
demo's plain network on both with four methods and no bootstrap (timed: the pixel pass), then with the component
metrics (obstacle preset, oracle threshold; not timed). Prints conversion and evaluation time per frame and per
megapixel, and the metrics side by side.
``--variants resized`` alone runs on code that predates native sizes (the baseline of the timings).
"""

import argparse
import json
import shutil
import time
from pathlib import Path

import cv2
import numpy as np

from segood.data import convert
from segood.data.smiyc import RoadAnomaly21
from segood.data.synthetic import driving_scene
from segood.evaluation import evaluate
from segood.models import load_model

METHODS = ["max_softmax", "entropy", "max_logit", "energy"]
CHECKPOINT = Path(__file__).resolve().parent.parent / "checkpoints" / "demo_plain.pt"


def write_track(root, frames, scale, seed=0):
    """A dataset_AnomalyTrack of ``frames`` validation frames, sizes alternating 1024x2048 and 720x1280 / scale."""
    rng = np.random.default_rng(seed)
    sizes = [(1024 // scale, 2048 // scale), (720 // scale, 1280 // scale)]
    (root / "images").mkdir(parents=True)
    (root / "labels_masks").mkdir()
    for k in range(frames):
        height, width = sizes[k % 2]
        image, _, ood_mask = driving_scene(rng, height, width, ood=True)
        fid = f"validation{k:04d}"
        cv2.imwrite(str(root / "images" / f"{fid}.jpg"), image[..., ::-1], [cv2.IMWRITE_JPEG_QUALITY, 95])
        cv2.imwrite(str(root / "labels_masks" / f"{fid}_labels_semantic.png"), ood_mask)
    return sizes


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--scale", type=int, default=4)
    parser.add_argument("--variants", nargs="+", default=["native", "resized"], choices=["native", "resized"])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench-native"))
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    track = args.workdir / "dataset_AnomalyTrack"
    sizes = write_track(track, args.frames, args.scale)
    model, _ = load_model(CHECKPOINT)
    model = model.float().eval()
    report = {"frames": args.frames, "sizes": sizes}
    for variant in args.variants:
        size = None if variant == "native" else sizes[0]
        path = args.workdir / f"{variant}.h5"
        t0 = time.perf_counter()
        manifest = convert(RoadAnomaly21(track, "validation"), path, size=size, progress=False)
        convert_s = time.perf_counter() - t0
        pixels = sum(manifest["pixels"].values())
        evaluate(model, {variant: path}, METHODS, args.workdir / f"warm_{variant}", progress=False, figures=False,
                 bootstrap=None)  # numba's kernels compiled, caches warm
        t0 = time.perf_counter()  # the pixel pass: the cost of every evaluation
        evaluate(model, {variant: path}, METHODS, args.workdir / f"time_{variant}", progress=False, figures=False,
                 bootstrap=None)
        evaluate_s = time.perf_counter() - t0
        doc = evaluate(model, {variant: path}, METHODS, args.workdir / f"run_{variant}", progress=False,
                       figures=False, bootstrap=None, components={"preset": "obstacle", "source": "oracle"})
        results = {m: {k: doc["results"][m][variant]["pooled"][k] for k in ("auroc", "auprc", "fpr95")}
                   | {"f1_star": doc["results"][m][variant]["components"]["f1_star"]} for m in METHODS}
        report[variant] = {"pixels": pixels, "convert_ms_per_frame": 1000 * convert_s / args.frames,
                           "evaluate_ms_per_frame": 1000 * evaluate_s / args.frames,
                           "evaluate_ms_per_megapixel": 1000 * evaluate_s / (pixels / 1e6), "results": results}
        print(f"{variant}: {pixels / 1e6:.2f} Mpx, convert {report[variant]['convert_ms_per_frame']:.1f} ms/frame, "
              f"evaluate {report[variant]['evaluate_ms_per_frame']:.1f} ms/frame "
              f"({report[variant]['evaluate_ms_per_megapixel']:.0f} ms/Mpx)", flush=True)
    print("\n| method | metric | " + " | ".join(args.variants) + " |\n|---|---|" + "---:|" * len(args.variants))
    for m in METHODS:
        for k in ("auroc", "auprc", "fpr95", "f1_star"):
            cells = " | ".join("–" if report[v]["results"][m][k] is None else f"{report[v]['results'][m][k]:.4f}"
                               for v in args.variants)
            print(f"| {m} | {k} | {cells} |")
    if args.out:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
