"""Cost of the component-level metrics (SegmentMeIfYouCan's sIoU / PPV / F1) per 1024x2048 frame, against the
CPU forward pass of PSPNet-ResNet50 on the same frame, in one run.

    python benchmarks/bench_components.py --height 1024 --width 2048 [--repeat 3] [--device cpu]

The frame holds 12 obstacle-like OOD blobs and ~9% ignore; the scores are noisy, so that the prediction at the
threshold has many small components (the worst case for labelling). Freed memory kept, as in every
``segood`` command (``segood.keep_freed_memory``).
"""

import numpy as np
import torch

from torch_timing import device_name, interleaved_best_ms, parse_args

from segood.labels import IGNORE, OOD
from segood.metrics.components import ComponentAccumulator
from segood.models import build_model


def frame(height, width, seed=0):
    rng = np.random.default_rng(seed)
    labels = np.zeros((height, width), np.uint8)
    labels[int(height * 0.91) :] = IGNORE
    for _ in range(12):
        h, w = rng.integers(height // 40, height // 8), rng.integers(width // 80, width // 16)
        y, x = rng.integers(0, height - h), rng.integers(0, width - w)
        labels[y : y + h, x : x + w] = OOD
    scores = (rng.random((height, width)) * 0.7 + 0.45 * (labels == OOD)).astype(np.float32)
    return scores, labels


@torch.no_grad()
def main():
    args = parse_args(__doc__, repeat=3)
    device = torch.device(args.device)
    scores, labels = frame(args.height, args.width)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet50").to(device).eval()
    x = torch.randn(1, 3, args.height, args.width, device=device)
    results = {}

    def components(preset):
        return lambda: results.setdefault(preset, ComponentAccumulator(0.6, preset).update(scores, labels).compute())

    forward, anomaly, obstacle = interleaved_best_ms([lambda: model(x), components("anomaly"), components("obstacle")],
                                                     args.repeat, device)
    print(f"frame {args.height}x{args.width}, {device_name(device)}, best of {args.repeat}\n")
    print("| pass | ms | share of a forward pass | components (truth / predicted) |\n|---|---:|---:|---|")
    print(f"| PSPNet-ResNet50 forward | {forward:.0f} | 100% | |")
    for name, ms in (("anomaly", anomaly), ("obstacle", obstacle)):
        r = results[name]
        print(f"| component metrics, {name} preset | {ms:.1f} | {ms / forward:.1%} | "
              f"{r['n_gt_components']} / {r['n_pred_components']} |")


if __name__ == "__main__":
    main()
