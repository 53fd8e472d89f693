"""What segood's library adapters add per frame over the bare network's forward pass, in one run.

    OMP_NUM_THREADS=1 python benchmarks/bench_adapters.py [--height 256] [--width 512] [--repeat 9] [--device cpu]

(one thread: on a shared machine, the ratios are steadier; results in ``results/bench_adapters_cpu.txt``)

Random-weight networks of the libraries' default sizes (no download): torchvision LRASPP-MobileNetV3 and
DeepLabV3-MobileNetV3, smp FPN-ResNet18, transformers SegFormer (MiT-b0), Mask2Former (Swin-T, 100 queries) and
EoMT (ViT-S, 100 queries, 256 x 256 only). Per network, best of ``--repeat`` rounds that take turns:

- bare: the module on an input already in its own normalisation, its own output (no resize, no aggregation);
- library: bare + the library's own semantic post-processing to the frame (transformers'
  ``post_process_semantic_segmentation``; none for torchvision and smp, which give frame-sized logits);
- adapter: segood's adapter on ImageNet-normalised frames (renormalisation, forward, mask aggregation);
- scored: :func:`segood.methods.score_batch` with ``max_logit`` (adapter + resize to the frame + argmax + score).

Ratios are to bare. Then the inference modes of one network (LRASPP) on the same frame.
"""

import torch

from torch_timing import device_name, interleaved_best_ms, parse_args

from segood.methods import get_method, score_batch
from segood.models import hf_model, torchvision_model
from segood.models.torch_models import SmpSegmentation


def networks(height, width):
    """(name, adapter, bare callable of the adapter's network input, library post-processing or None, frame)."""
    import segmentation_models_pytorch as smp
    import torchvision
    import transformers as tf

    torch.manual_seed(0)
    for arch in ("lraspp_mobilenet_v3_large", "deeplabv3_mobilenet_v3_large"):
        module = torchvision.models.get_model(arch, weights=None, weights_backbone=None, num_classes=19).eval()
        yield f"torchvision {arch}", torchvision_model(module), lambda x, m=module: m(x)["out"], None, (height, width)
    module = smp.create_model("fpn", encoder_name="resnet18", encoder_weights=None, classes=19).eval()
    yield "smp fpn resnet18", SmpSegmentation(module, multiple=32), module, None, (height, width)
    labels = {"id2label": {i: str(i) for i in range(19)}}
    segformer = tf.SegformerForSemanticSegmentation(tf.SegformerConfig(num_labels=19, **labels)).eval()
    processor = tf.SegformerImageProcessor()
    yield ("transformers segformer (mit-b0)", hf_model(segformer, processor),
           lambda x: segformer(pixel_values=x), processor, (height, width))
    swin = tf.SwinConfig(out_features=["stage1", "stage2", "stage3", "stage4"])
    m2f = tf.Mask2FormerForUniversalSegmentation(tf.Mask2FormerConfig(backbone_config=swin, **labels)).eval()
    processor = tf.Mask2FormerImageProcessor()
    yield ("transformers mask2former (swin-t)", hf_model(m2f, processor), lambda x: m2f(pixel_values=x), processor,
           (height, width))
    eomt = tf.EomtForUniversalSegmentation(tf.EomtConfig(hidden_size=384, num_attention_heads=6, image_size=256,
                                                         **labels)).eval()
    processor = tf.EomtImageProcessor(size={"shortest_edge": 256, "longest_edge": 256})
    yield "transformers eomt (vit-s)", hf_model(eomt, processor), lambda x: eomt(pixel_values=x), processor, (256, 256)


@torch.no_grad()
def main():
    args = parse_args(__doc__, repeat=9, height=256, width=512)
    device = torch.device(args.device)
    method = get_method("max_logit")
    print(f"{device_name(device)}, best of {args.repeat}\n")
    print("| network | frame | bare ms | library ms | adapter ms | scored ms | library / bare | adapter / bare | "
          "scored / bare |\n|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for name, model, bare, processor, (height, width) in networks(args.height, args.width):
        model = model.to(device)
        x = torch.randn(1, 3, height, width, device=device)
        inner = model.network_input(x)

        def library(bare=bare, processor=processor, inner=inner):
            out = bare(inner)
            if processor is not None:
                processor.post_process_semantic_segmentation(out, target_sizes=[(height, width)])

        contenders = [lambda: bare(inner), library, lambda: model(x), lambda: score_batch(model, x, [method])]
        if processor is None:  # (library = bare)
            contenders.pop(1)
        times = interleaved_best_ms(contenders, args.repeat, device)
        if processor is None:
            times.insert(1, None)
        cells = ["—" if t is None else f"{t:.1f}" for t in times]
        ratios = ["—" if t is None else f"{t / times[0]:.3f}" for t in times[1:]]
        print(f"| {name} | {height}x{width} | " + " | ".join(cells + ratios) + " |", flush=True)

    import torchvision

    module = torchvision.models.get_model("lraspp_mobilenet_v3_large", weights=None, weights_backbone=None,
                                          num_classes=19).eval().to(device)
    x = torch.randn(1, 3, args.height, args.width, device=device)
    half = (args.height // 2, args.width // 2)
    window = (args.height, args.height)
    modes = {"whole": {}, f"resize to {half[0]}x{half[1]}": {"inference": "resize", "size": half},
             f"slide {window[0]}x{window[1]}, stride {window[0] // 2}":
                 {"inference": "slide", "crop": window, "stride": (window[0] // 2, window[1] // 2)}}
    models = [torchvision_model(module, **options) for options in modes.values()]
    times = interleaved_best_ms([lambda: module(x)] + [lambda m=m: m(x) for m in models], args.repeat, device)
    print(f"\n| LRASPP {args.height}x{args.width} | ms | ratio to the bare forward |\n|---|---:|---:|")
    print(f"| bare forward | {times[0]:.1f} | 1.000 |")
    for mode, t in zip(modes, times[1:]):
        print(f"| adapter, {mode} | {t:.1f} | {t / times[0]:.3f} |")


if __name__ == "__main__":
    main()
