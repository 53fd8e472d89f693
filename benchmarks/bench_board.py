"""Judging the verified track: N submissions of F frames of H x W float16 score maps (zips, lzf inside), scored
against the maintainer's private masks, in a fresh process; prints its wall time and peak RSS.

    python benchmarks/bench_board.py [--submissions 20] [--frames 50] [--height 1024] [--width 2048] [--work DIR]
                                     [--components anomaly]

Target (issue 18): 20 x 50 frames of 1024 x 2048 in <= 60 s on CPU and <= 2 GiB RSS. The data (about 4 GiB for
the full size) is generated once into --work (default a temporary folder) and seeded. ``--components``: then the
same submissions judged again on a track with SegmentMeIfYouCan's component metrics (a second pass over the maps).
"""

import argparse
import json
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import numpy as np

from segood.data.common import Sample
from segood.data.h5 import SetWriter
from segood.labels import IGNORE, OOD
from segood.leaderboard import make_benchmark
from segood.leaderboard.maps import map_member, write_maps

JUDGE = """
import json, resource, sys, time
from segood.leaderboard import leaderboard
start = time.perf_counter()
doc = leaderboard(sys.argv[1], sys.argv[2], sys.argv[3])
print(json.dumps({"seconds": time.perf_counter() - start, "peak_rss_mib": resource.getrusage(
    resource.RUSAGE_SELF).ru_maxrss / 1024, "entries": sum(len(t["entries"]) for t in doc["tracks"].values()),
    "rejected": doc["rejected"]}))
"""


def make_world(work, submissions, frames, height, width):
    rng = np.random.default_rng(0)
    masks = []
    writer = SetWriter(work / "private.h5", (height, width), {"source": "bench", "split": "test"}, overwrite=True)
    for k in range(frames):
        mask = np.zeros((height, width), np.uint8)
        mask[int(height * 0.9) :] = IGNORE
        y, x = rng.integers(0, height // 2), rng.integers(0, width // 2)
        mask[y : y + height // 8, x : x + width // 8] = OOD
        masks.append(mask)
        writer.append(Sample(np.zeros((height, width, 3), np.uint8), mask, mask, f"test/frame_{k:03d}"))
    writer.commit()
    make_benchmark({"verified": {"sets": {"private": work / "private.h5"}, "rank_by": "auroc", "private": ["private"],
                                 "verified_only": True}}, work / "bench.json")
    (work / "subs").mkdir()
    doc = {"schema": "segood.submission/1", "method": {"name": "", "params": {}},
           "sets": {"private": {"scores": map_member("private"), "same_source_tuning": False}}}
    for s in range(submissions):
        maps = {f"test/frame_{k:03d}": rng.random((height, width), np.float32) + 0.3 * s / submissions * (masks[k] == OOD)
                for k in range(frames)}
        write_maps(maps, list(maps), work / "maps.h5")
        with zipfile.ZipFile(work / "subs" / f"sub_{s:02d}.zip", "w") as archive:
            archive.writestr("submission.json", json.dumps({**doc, "method": {"name": f"method {s}", "params": {}}}))
            archive.write(work / "maps.h5", map_member("private"))
    (work / "maps.h5").unlink()


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--submissions", type=int, default=20)
    parser.add_argument("--frames", type=int, default=50)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    parser.add_argument("--work", type=Path)
    parser.add_argument("--components", choices=("anomaly", "obstacle"))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        work = args.work or Path(tmp)
        if not (work / "bench.json").exists():
            work.mkdir(parents=True, exist_ok=True)
            make_world(work, args.submissions, args.frames, args.height, args.width)
        size = sum(p.stat().st_size for p in (work / "subs").iterdir())
        benches = {"": work / "bench.json"}
        if args.components:
            benches[f", with component metrics ({args.components})"] = work / "bench_components.json"
            spec = json.loads((work / "bench.json").read_text())["tracks"]["verified"]
            make_benchmark({"verified": {"sets": {"private": spec["sets"]["private"]["path"]}, "rank_by": "auroc",
                                         "private": ["private"], "verified_only": True,
                                         "components": args.components}}, benches[list(benches)[1]])
        for label, bench in benches.items():
            out = subprocess.run([sys.executable, "-c", JUDGE, str(work / "subs"), str(bench), str(work / "board")],
                                 capture_output=True, text=True, check=True)
            result = json.loads(out.stdout)
            assert result["entries"] == args.submissions and not result["rejected"], result
            print(f"judged {args.submissions} submissions x {args.frames} frames of {args.height}x{args.width} "
                  f"float16 maps ({size / 2**30:.2f} GiB of zips){label}: {result['seconds']:.1f} s, peak RSS "
                  f"{result['peak_rss_mib']:.0f} MiB (targets: <= 60 s, <= 2048 MiB)")


if __name__ == "__main__":
    main()
