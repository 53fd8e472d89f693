"""Conversion and read speed of converted sets, at Cityscapes size, in one run.

    python benchmarks/bench_convert.py [--frames 8] [--workdir /tmp/segood-bench]

Writes generated raw trees in the published layouts (driving scenes with sensor noise, so that decoding and
compression see photo-like content): Cityscapes (PNG + labelIds, 1024x2048), IDD (JPEG + polygon JSON,
1080x1920), SUN (JPEG + LabelMe XML, 900x1200) and today's anomaly benchmarks at their published sizes:
RoadAnomaly21 (JPEG, 1024x2048), RoadObstacle21 (WebP, 1080x1920), LostAndFound (PNG with gAMA chunks,
1024x2048), Fishyscapes Lost & Found (labels over those LostAndFound frames), Fishyscapes Static (Cityscapes
frame + int16 overlay .npz), StreetHazards (PNG, 720x1280), BDD-Anomaly (JPEG, 720x1280) and Road Anomaly (WebP,
720x1280), and pasted-object sets (``paste``: the SUN objects onto the Cityscapes frames, two OOD objects and
one ID negative per frame, each blending). Prints frames/s of ``convert`` in-process and with a 2-process pool (``--only NAME`` for some rows), then frames/s of reading the Cityscapes set through ``H5SegmentationDataset`` with a
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
from segood.data.registry import get_adapter
from segood.data.synthetic import driving_scene
from segood.labels import LABEL_ID_TO_TRAIN_ID

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from rawtrees import add_gamma_chunk, labelme_xml, rect, write_label, write_rgb, write_webp  # noqa: E402


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


def make_benchmark_trees(root, frames):
    """The anomaly benchmarks' trees: photo-like images, labels with ID, OOD and ignore regions."""
    rng = np.random.default_rng(1)

    def scene(height, width):
        image, semantic, _ = driving_scene(rng, height, width)
        label = np.where(semantic == 0, 0, 255).astype(np.uint8)  # road ID, the rest ignore
        label[height * 2 // 3: height * 2 // 3 + height // 20, width // 3: width // 3 + width // 15] = 1
        return image, label

    laf_fids = []
    for k in range(frames):
        image, label = scene(1024, 2048)
        write_rgb(root / f"ra21/images/validation{k:04d}.jpg", image)
        write_label(root / f"ra21/labels_masks/validation{k:04d}_labels_semantic.png", label)
        image, label = scene(1080, 1920)
        write_webp(root / f"ro21/images/gravel_{k:03d}.webp", image)
        write_label(root / f"ro21/labels_masks/gravel_{k:03d}_labels_semantic.png", label)

        image, label = scene(1024, 2048)
        fid = f"04_Maurener_Weg_8_{k:06d}_000100"
        laf_fids.append(fid)
        path = root / f"laf/leftImg8bit/test/04_Maurener_Weg_8/{fid}_leftImg8bit.png"
        write_rgb(path, image)
        add_gamma_chunk(path, 0.45455)
        laf_label = np.where(label == 0, 1, np.where(label == 1, 12, 0)).astype(np.uint8)
        write_label(root / f"laf/gtCoarse/test/04_Maurener_Weg_8/{fid}_gtCoarse_labelIds.png", laf_label,
                    gamma=0.45455)
        write_label(root / f"fs_laf/{k:04d}_{fid}_labels.png", label)

        (root / "fs_static").mkdir(parents=True, exist_ok=True)
        overlay = np.zeros((1024, 2048, 3), np.int16)
        overlay[700:800, 900:1100] = rng.integers(-200, 200, (100, 200, 3))
        np.savez_compressed(root / f"fs_static/{k:04d}_bench_000000_{k:06d}_rgb.npz", rgb=overlay)
        write_label(root / f"fs_static/{k:04d}_bench_000000_{k:06d}_labels.png", label)

        image, label = scene(720, 1280)
        write_rgb(root / f"streethazards/test/images/test/t5/{k}.png", image)
        write_label(root / f"streethazards/test/annotations/test/t5/{k}.png",
                    np.where(label == 0, 8, np.where(label == 1, 14, 1)).astype(np.uint8))
        image, label = scene(720, 1280)
        write_rgb(root / f"bdd/seg/images/val/bench-{k:04d}.jpg", image)
        write_label(root / f"bdd/seg/labels/val/bench-{k:04d}_train_id.png", np.where(label == 1, 17, label))
        image, label = scene(720, 1280)
        write_webp(root / f"road_anomaly/frames/bench{k:02d}.webp", image)
        write_label(root / f"road_anomaly/frames/bench{k:02d}.labels/labels_semantic.png",
                    np.where(label == 1, 2, 0).astype(np.uint8))  # Road Anomaly has no ignore value
    (root / "road_anomaly/frame_list.json").write_text(json.dumps([f"bench{k:02d}.webp" for k in range(frames)]))


def timed(fn):
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench"))
    parser.add_argument("--only", nargs="+", help="only the rows whose name contains one of these words")
    args = parser.parse_args()
    shutil.rmtree(args.workdir, ignore_errors=True)
    make_trees(args.workdir, args.frames)
    make_benchmark_trees(args.workdir, args.frames)

    w = args.workdir
    adapters = {"Cityscapes (PNG)": lambda: Cityscapes(w / "cs", "val"),
                "IDD (JPEG + JSON)": lambda: IDD(w / "idd", "val"),
                "SUN (JPEG + XML)": lambda: Sun(w / "sun", "all"),
                "smiyc_anomaly (JPEG 1024x2048)": lambda: get_adapter("smiyc_anomaly")(w / "ra21", "validation"),
                "smiyc_obstacle (WebP 1080x1920)": lambda: get_adapter("smiyc_obstacle")(w / "ro21", "test"),
                "lostandfound (PNG + gAMA)": lambda: get_adapter("lostandfound")(w / "laf", "test"),
                "fishyscapes_laf (labels + LostAndFound PNG)": lambda: get_adapter("fishyscapes_laf")(w / "fs_laf",
                                                                                                     w / "laf"),
                "fishyscapes_static (Cityscapes PNG + npz)": lambda: get_adapter("fishyscapes_static")(w / "fs_static",
                                                                                                     w / "cs"),
                "streethazards (PNG 720x1280)": lambda: get_adapter("streethazards")(w / "streethazards", "test"),
                "bdd_anomaly (JPEG 720x1280)": lambda: get_adapter("bdd_anomaly")(w / "bdd", "test"),
                "road_anomaly (WebP 720x1280)": lambda: get_adapter("road_anomaly")(w / "road_anomaly"),
                **{f"paste (SUN objects onto Cityscapes PNG, --blend {blend})":
                   (lambda blend=blend: get_adapter("paste")(w / "cs", "val", w / "sun", blend=blend, per_frame=2,
                                                             negatives=1)) for blend in ("none", "feather", "seamless")},
                "paste (demo objects, --blend seamless)": lambda: get_adapter("paste")(w / "cs", "val", "demo",
                                                                                       blend="seamless", per_frame=2,
                                                                                       negatives=1)}
    if args.only:
        adapters = {k: v for k, v in adapters.items() if any(word in k for word in args.only)}
    print(f"{args.frames} frames per source, output at each adapter's native size (1024x2048 unless named)\n")
    print("| source | frames/s, in-process | frames/s, --workers 2 | ratio |\n|---|---:|---:|---:|")
    for name, make in adapters.items():
        seconds = []
        for workers in (0, 2):
            out = args.workdir / f"out_{workers}.h5"
            seconds.append(timed(lambda: convert(make(), out, workers=workers, overwrite=True, progress=False)))
        n = len(make().refs())
        print(f"| {name} | {n / seconds[0]:.2f} | {n / seconds[1]:.2f} | {seconds[0] / seconds[1]:.2f} |", flush=True)

    if args.only:
        return
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
