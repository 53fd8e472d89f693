"""Forward cost of each architecture and head, and what Monte-Carlo sampling saves, in one run.

    python benchmarks/bench_models.py [--height 512] [--width 1024] [--repeat 2] [--device cpu]

Rows: forward ms/image (batch 1, no grad, eval mode) for PSPNet-ResNet50 and DeepLabV3+-Xception41 with each
head; then for the dropout head: ``mc_logits(T=8)`` against one forward pass and against 8 full passes (the
three take turns). Freed memory kept, as in every ``segood`` command (``segood.keep_freed_memory``).
"""

import torch

from torch_timing import best_ms, device_name, interleaved_best_ms, parse_args

from segood.models import HEADS, build_model

NETWORKS = (("pspnet", "resnet50"), ("deeplabv3plus", "tu-xception41"))


@torch.no_grad()
def main():
    args = parse_args(__doc__, repeat=2)
    device = torch.device(args.device)
    x = torch.randn(1, 3, args.height, args.width, device=device)
    name = device_name(device)
    print(f"input 1x3x{args.height}x{args.width}, {name}, best of {args.repeat}\n")
    print("| network | " + " | ".join(f"{h} ms" for h in HEADS) + " |\n|---|" + "---:|" * len(HEADS))
    for arch, encoder in NETWORKS:
        cells = []
        for head in HEADS:
            torch.manual_seed(0)
            model = build_model(arch, encoder, head=head).to(device).eval()
            cells.append(f"{best_ms(lambda: model(x), args.repeat, device):.0f}")
        print(f"| {arch} {encoder} | " + " | ".join(cells) + " |", flush=True)

    print("\n| dropout head, T = 8 | network | ms | ratio to one forward |\n|---|---|---:|---:|")
    for arch, encoder in NETWORKS:
        model = build_model(arch, encoder, head="dropout").to(device).eval()
        one, mc, full = interleaved_best_ms(
            [lambda: model(x), lambda: model.mc_logits(x, samples=8),
             lambda: [model.head(model.penultimate(x), x.shape[-2:], stochastic=True) for _ in range(8)]],
            args.repeat, device)
        for label, ms in (("one forward pass", one), ("mc_logits(T=8)", mc), ("8 full passes", full)):
            print(f"| {label} | {arch} {encoder} | {ms:.0f} | {ms / one:.2f} |", flush=True)


if __name__ == "__main__":
    main()
