"""Conversion and read speed of converted sets, at Cityscapes size, in one run.

    python benchmarks/bench_convert.py [--frames 8] [--workdir /tmp/segood-bench]

Writes generated raw trees in the published layouts (driving scenes with sensor noise, so that decoding and
compression see photo-like content): Cityscapes (PNG + labelIds, 1024x2048), IDD (JPEG + polygon JSON,
1080x1920) and SUN (JPEG + LabelMe XML, 900x1200). Prints frames/s of ``convert`` in-process and with a
2-process pool, then frames/s of reading the Cityscapes set through ``H5SegmentationDataset`` with a
DataLoader of 0, 1 and 2 workers, with the per-frame sha256 check and without it (``verify=False``).
"""

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import torch

from segood.data import IDD, Cityscapes, H5SegmentationDataset, Sun, convert
from segood.data.synthetic import driving_scene
from segood.labels import LABEL_ID_TO_TRAIN_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from rawtrees import labelme_xml, rect, write_rgb  # noqa: E402


def make_trees(root, frames):
    rng = np.random.default_rng(0)
    train_to_label = np.zeros(256, np.uint8)  # inverse table: first labelId of each trainId, 255 -> 0
    for label_id in range(255, -1, -1):
        if LABEL_ID_TO_TRAIN_ID[label_id] != 255:
            train_to_label[LABEL_ID_TO_TRAIN_ID[label_id]] = label_id
    for k in range(frames):
        image, semantic, _ = driving_scene(rng, 1024, 2048)
        stem = f"bench_000000_{k:06d}"
        write_rgb(root / f"cs/leftImg8bit/val/bench/{stem}_leftImg8bit.png", image)
        (root / "cs/gtFine/val/bench").mkdir(parents=True, exist_ok=True)
        cv2.imwrite(str(root / f"cs/gtFine/val/bench/{stem}_gtFine_labelIds.png"), train_to_label[semantic])

        image, _, _ = driving_scene(rng, 1080, 1920)
        write_rgb(root / f"idd/leftImg8bit/val/0/{k:06d}_leftImg8bit.jpg", image)
        objects = [{"label": "road", "polygon": rect(0, 500, 1919, 1079), "deleted": 0}]
        objects += [{"label": "car" if i % 3 else "autorickshaw",
                     "polygon": rect(100 + 300 * i, 600, 300 + 300 * i, 800), "deleted": 0} for i in range(6)]
        (root / "idd/gtFine/val/0").mkdir(parents=True, exist_ok=True)
        (root / f"idd/gtFine/val/0/{k:06d}_gtFine_polygons.json").write_text(
            json.dumps({"imgHeight": 1080, "imgWidth": 1920, "objects": objects}))

        image, _, _ = driving_scene(rng, 900, 1200)
        write_rgb(root / f"sun/Images/a/alley/sun_{k:04d}.jpg", image)
        sun_objects = [("road", rect(0, 500, 1199, 899), "u", 0), ("car", rect(100, 550, 400, 700), "u", 0),
                       ("wall", rect(0, 0, 300, 500), "u", 0), ("fire hydrant", rect(700, 600, 760, 700), "u", 0)]
        (root / "sun/Annotations/a/alley").mkdir(parents=True, exist_ok=True)
        (root / f"sun/Annotations/a/alley/sun_{k:04d}.xml").write_text(
            labelme_xml(f"sun_{k:04d}.jpg", "a/alley", sun_objects, (900, 1200)))


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench"))
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    make_trees(args.workdir, args.frames)

    adapters = {"Cityscapes (PNG)": lambda: Cityscapes(args.workdir / "cs", "val"),
                "IDD (JPEG + JSON)": lambda: IDD(args.workdir / "idd", "val"),
                "SUN (JPEG + XML)": lambda: Sun(args.workdir / "sun", "all")}
    print(f"{args.frames} frames per source, output 1024x2048\n")
    print("| source | frames/s, in-process | frames/s, --workers 2 | ratio |\n|---|---:|---:|---:|")
    for name, make in adapters.items():
        seconds = []
        for workers in (0, 2):
            out = args.workdir / f"out_{workers}.h5"
            seconds.append(timed(lambda: convert(make(), out, workers=workers, overwrite=True, progress=False)))
        n = len(make().refs())
        print(f"| {name} | {n / seconds[0]:.2f} | {n / seconds[1]:.2f} | {seconds[0] / seconds[1]:.2f} |", flush=True)

    cs = args.workdir / "cs.h5"
    convert(Cityscapes(args.workdir / "cs", "val"), cs, progress=False)
    datasets = {True: H5SegmentationDataset(cs), False: H5SegmentationDataset(cs, verify=False)}
    print("\n| read Cityscapes set (1024x2048) | frames/s | ratio to verified, 0 workers |\n|---|---:|---:|")
    rows = {(verify, workers): [] for verify, workers in ((True, 0), (False, 0), (True, 1), (True, 2))}
    for _ in range(3):  # interleaved rounds, best of 3: both variants see the same machine
        for verify, workers in rows:
            loader = torch.utils.data.DataLoader(datasets[verify], batch_size=1, num_workers=workers)
            rows[(verify, workers)].append(timed(lambda: [batch for batch in loader]))
    base = min(rows[(True, 0)])
    for (verify, workers), seconds in rows.items():
        name = f"DataLoader num_workers={workers}, " + ("sha256 verified" if verify else "verify=False")
        print(f"| {name} | {len(datasets[True]) / min(seconds):.1f} | {base / min(seconds):.2f} |", flush=True)
    dataset = datasets[True]
    print(f"\nset size on disk: {cs.stat().st_size / 2**20:.1f} MiB for {len(dataset)} frames")


if __name__ == "__main__":
    main()
