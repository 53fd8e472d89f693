"""Cost of each robustness corruption as a share of a PSPNet-ResNet50 forward pass, per frame, in one run.

    python benchmarks/bench_robustness.py [--height 512] [--width 1024] [--repeat 3] [--severity 5] [--device cpu]
                                          [--family segood|standard|all]

Each corruption corrupts one generated driving scene with its two masks (``segood.robustness.corrupt``: the
seeded albumentations Compose is built per frame, as ``CorruptedSet`` does), taking turns with the network's
forward pass (batch 1, no grad, eval mode), best of ``--repeat`` rounds. Target: every corruption <= 20% of the
forward pass. ``--family standard`` times the 15 ImageNet-C corruptions (at the standard's fixed pixel sizes;
1024x2048 is the size published Cityscapes-C numbers use). Freed memory kept, as in every ``segood`` command
(``segood.keep_freed_memory``).
"""

import numpy as np
import torch

from torch_timing import device_name, interleaved_best_ms, parse_args

from segood.data.synthetic import driving_scene
from segood.models import build_model
from segood.robustness import FAMILIES, corrupt, corruption_names

TARGET = 0.20


def _options(parser):
    parser.add_argument("--severity", type=int, default=5, choices=range(1, 6))
    parser.add_argument("--family", default="segood", choices=FAMILIES)


@torch.no_grad()
def main():
    args = parse_args(__doc__, repeat=3, more=_options)
    severity, family = args.severity, args.family
    device = torch.device(args.device)
    image, semantic, ood_mask = driving_scene(np.random.default_rng(0), args.height, args.width, ood=True)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet50", head="plain").to(device).eval()
    x = torch.randn(1, 3, args.height, args.width, device=device)
    names = corruption_names(family)
    calls = [lambda: model(x)] + [
        (lambda n=n: corrupt(image, [ood_mask, semantic], name=n, severity=severity, seed=0, frame_id="bench"))
        for n in names]
    forward, *costs = interleaved_best_ms(calls, args.repeat, device)
    print(f"frame {args.height}x{args.width}, severity {severity}, {device_name(device)}, best of {args.repeat}, "
          f"interleaved; PSPNet-ResNet50 forward {forward:.0f} ms\n")
    print("| corruption | ms / frame | share of the forward pass |\n|---|---:|---:|")
    for name, ms in sorted(zip(names, costs), key=lambda item: -item[1]):
        print(f"| {name} | {ms:.1f} | {ms / forward:.1%}{'' if ms / forward <= TARGET else ' (over 20%)'} |")
    worst = max(costs) / forward
    print(f"\nworst {worst:.1%} of the forward pass: target <= {TARGET:.0%} {'met' if worst <= TARGET else 'NOT met'}")


if __name__ == "__main__":
    main()
