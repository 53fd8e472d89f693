"""Cost of each OOD method over a plain forward pass of the same network, in one run.

    python benchmarks/bench_methods.py [--height 512] [--width 1024] [--repeat 5] [--device cpu]

PSPNet-ResNet50 (the paper's PSPNet), batch 1. For each method: the segmentation forward pass of the network
with its head (``model(x)`` and the predicted classes, as an evaluation runs it once per image whatever the
methods), and what the method adds to it: for single-pass methods the scoring of that forward output
(``from_output``); for the others ``score`` minus the forward (Monte-Carlo samples, perturbation passes). The
forward pass and the method take turns in each round, so that both see the same machine; each network runs eight
forward passes first. Then the logit methods scored together (``logit_scores``, as an evaluation scores them)
against each alone in turn, and the Monte-Carlo samples drawn from torch's global generator against each frame's
own seeded one. Freed memory kept, as in every ``segood`` command (``segood.keep_freed_memory``).
Frames of at least 128×256: Mahalanobis is fitted on one frame of random labels, which must give some class more
pixels than the feature dimension.
"""

import torch

from torch_timing import best_ms, device_name, interleaved_best_ms, parse_args

from segood.methods import get_method
from segood.methods.functional import logit_scores, predicted_classes
from segood.models import build_model

ROWS = [("max_softmax", {}), ("entropy", {}), ("odin", {"temperature": 1000}),
        ("odin", {"temperature": 1000, "epsilon": 0.002}), ("confidence", {}), ("mahalanobis", {}),
        ("varsum", {"samples": 8}), ("mutual_info", {"samples": 8}), ("max_logit", {}), ("energy", {}), ("sml", {}),
        ("sml", {"boundary_suppression": True, "smoothing": True})]
LOGIT_METHODS = ("max_softmax", "odin", "entropy", "max_logit", "energy")  # (as benchmarks/gpu_check.py)


def main():
    args = parse_args(__doc__, repeat=5)
    device = torch.device(args.device)
    x = torch.randn(1, 3, args.height, args.width, device=device)
    name = device_name(device)
    logits = torch.randn(1, 19, args.height, args.width, device=device)
    argmax = best_ms(lambda: predicted_classes(logits), 9, device)
    print(f"pspnet resnet50, input 1x3x{args.height}x{args.width}, {name}, best of {args.repeat}; of the forward, "
          f"the predicted classes from the logits take {argmax:.0f} ms; freed memory kept\n")
    print("| method | params | head | forward ms | added ms | overhead over the forward |\n|---|---|---|---:|---:|---:|")
    models = {}
    for method_name, params in ROWS:
        method = get_method(method_name, **params)
        head = method.head or "plain"
        if head not in models:
            torch.manual_seed(0)
            models[head] = build_model("pspnet", "resnet50", head=head).to(device).eval()
            with torch.no_grad():
                for _ in range(8):
                    models[head](x)
        model = models[head]
        if method.needs.fit:
            batch = {"image": torch.randint(0, 256, (1, 3, args.height, args.width), dtype=torch.uint8),
                     "semantic": torch.randint(0, 19, (1, args.height, args.width), dtype=torch.uint8)}
            method.fit(model, [batch])
        with torch.no_grad():
            output = model(x)

            def segment():
                return predicted_classes(model(x).logits)

            if method.needs.forward:
                forward, added = interleaved_best_ms([segment, lambda: method.from_output(output)], args.repeat, device)
            else:
                forward, whole = interleaved_best_ms([segment, lambda: method.score(model, x)], args.repeat, device)
                added = whole - forward
        print(f"| {method_name} | {params or ''} | {head} | {forward:.0f} | {added:.0f} | {added / forward:.1%} |",
              flush=True)
    logit_methods = [get_method(name) for name in LOGIT_METHODS]
    with torch.no_grad():
        output = models["plain"](x)
        forms = [m.logit_form for m in logit_methods]
        together, alone = interleaved_best_ms([lambda: logit_scores(output.logits, forms),
                                               lambda: [m.from_output(output) for m in logit_methods]],
                                              args.repeat, device)
    print(f"\nthe logit methods ({', '.join(LOGIT_METHODS)}) scored together: {together:.0f} ms; each alone, in turn: "
          f"{alone:.0f} ms")
    model = models["dropout"]
    with torch.no_grad():
        features = model.penultimate(x)
        shared, seeded = interleaved_best_ms([lambda: model.mc_logits(x, 8, features),
                                              lambda: model.mc_logits(x, 8, features, seeds=[1])], args.repeat, device)
    print(f"8 Monte-Carlo samples from torch's global generator: {shared:.0f} ms; each frame's from its own seeded "
          f"generator (as segood evaluate draws them): {seeded:.0f} ms ({seeded / shared:.2f}x)")


if __name__ == "__main__":
    main()
