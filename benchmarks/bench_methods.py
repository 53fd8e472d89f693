"""Cost of each OOD method over a plain forward pass of the same network, in one run.

    python benchmarks/bench_methods.py [--height 512] [--width 1024] [--repeat 2] [--device cpu]

PSPNet-ResNet50 (the paper's PSPNet), batch 1. For each method: the forward pass of the network with its head,
and what the method adds to it: for single-pass methods the scoring of a forward output (``from_output`` plus
the class argmax, as an evaluation that shares one forward does); for the others ``score`` minus a forward
(Monte-Carlo samples, perturbation passes, Mahalanobis distances).
"""

import torch

from torch_timing import best_ms, device_name, parse_args

from segood.methods import get_method
from segood.methods.functional import predicted_classes
from segood.models import build_model

ROWS = [("max_softmax", {}), ("entropy", {}), ("odin", {"temperature": 1000}),
        ("odin", {"temperature": 1000, "epsilon": 0.002}), ("confidence", {}), ("mahalanobis", {}),
        ("varsum", {"samples": 8}), ("mutual_info", {"samples": 8})]


def main():
    args = parse_args(__doc__, repeat=3)
    device = torch.device(args.device)
    x = torch.randn(1, 3, args.height, args.width, device=device)
    name = device_name(device)
    print(f"pspnet resnet50, input 1x3x{args.height}x{args.width}, {name}, best of {args.repeat}\n")
    print("| method | params | head | forward ms | added ms | overhead over the forward |\n|---|---|---|---:|---:|---:|")
    models = {}
    for method_name, params in ROWS:
        method = get_method(method_name, **params)
        head = method.head or "plain"
        if head not in models:
            torch.manual_seed(0)
            models[head] = build_model("pspnet", "resnet50", head=head).to(device).eval()
        model = models[head]
        if method_name == "mahalanobis":
            batch = {"image": torch.randint(0, 256, (1, 3, args.height, args.width), dtype=torch.uint8),
                     "semantic": torch.randint(0, 19, (1, args.height, args.width), dtype=torch.uint8)}
            method.fit(model, [batch])
        with torch.no_grad():
            output = model(x)
            forward = best_ms(lambda: model(x), args.repeat, device)
            if hasattr(method, "from_output") and not params.get("epsilon"):
                # what the method adds to a forward pass the evaluation runs anyway
                added = best_ms(lambda: (method.from_output(output), predicted_classes(output.logits)), 3 * args.repeat,
                                device)
            else:
                added = best_ms(lambda: method.score(model, x), args.repeat, device) - forward
        print(f"| {method_name} | {params or ''} | {head} | {forward:.0f} | {added:.0f} | {added / forward:.1%} |",
              flush=True)


if __name__ == "__main__":
    main()
