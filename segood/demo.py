"""The demo benchmark: train a real segmentation network on procedural driving scenes, then measure how
well max softmax and entropy flag a novel object on the road, pixel by pixel.

Every stage is the real one at a small size: segood's PSPNet (ResNet-18, no pretrained weights), cross-entropy
training on Cityscapes trainIds, softmax scores, the binned :class:`PixelOODAccumulator` checked against
exact mode. ``segood demo`` runs it; it takes a few minutes on a laptop CPU.
"""

import platform
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

import segood
from segood.data.synthetic import scene_batch
from segood.io import atomic_write_text, write_json
from segood.labels import IGNORE, NUM_CLASSES
from segood.methods import get_method
from segood.methods.functional import predicted_classes
from segood.metrics import HIGHER_IS_BETTER, METRIC_NAMES, PixelOODAccumulator, exact_metrics
from segood.metrics.segmentation import confusion_matrix, mean_iou
from segood.models import build_model, preprocess

METHODS = ("max_softmax", "entropy")  # both scored from the same forward pass


def to_input(images):
    """(N, H, W, 3) uint8 RGB numpy -> (N, 3, H, W) float, ImageNet-normalised."""
    return preprocess(torch.from_numpy(np.ascontiguousarray(images)).permute(0, 3, 1, 2))


def run_demo(out_dir="runs/demo", *, seed=0, train_images=192, eval_images=48, steps=250, batch_size=8,
             height=96, width=192, num_thresholds=400, progress=True):
    """Train, score and evaluate; writes ``results.json`` and ``results.md`` in ``out_dir``; returns the results."""
    started = time.perf_counter()
    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    images, semantic, _ = scene_batch(seed, train_images, height, width)
    model = build_model("pspnet", "resnet18", NUM_CLASSES)
    optimizer = torch.optim.AdamW(model.parameters(), lr=2e-3, weight_decay=1e-4)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=2e-3, total_steps=steps)

    model.train()
    bar = tqdm(range(steps), desc="train PSPNet", disable=not progress, unit="step")
    for _ in bar:
        pick = rng.choice(train_images, batch_size, replace=False)
        x, y = to_input(images[pick]), torch.from_numpy(semantic[pick]).long()
        if rng.random() < 0.5:  # horizontal flip moves image and labels together
            x, y = x.flip(-1), y.flip(-1)
        loss = F.cross_entropy(model(x).logits, y, ignore_index=IGNORE)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        bar.set_postfix(loss=f"{loss.item():.3f}")

    images, semantic, ood_mask = scene_batch(seed + 1, eval_images, height, width, ood_fraction=1.0)
    accumulators = {name: PixelOODAccumulator(num_thresholds, per_image=True) for name in METHODS}
    all_scores = {name: [] for name in METHODS}
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
    model.eval()
    with torch.no_grad():
        for start in tqdm(range(0, eval_images, batch_size), desc="evaluate", disable=not progress, unit="batch"):
            stop = start + batch_size
            output = model(to_input(images[start:stop]))
            confusion += confusion_matrix(predicted_classes(output.logits).numpy(), semantic[start:stop], NUM_CLASSES)
            for name in METHODS:
                scores = get_method(name).from_output(output)
                accumulators[name].update(scores, ood_mask[start:stop])
                all_scores[name].append(scores.numpy())

    miou, iou = mean_iou(confusion)
    results = {
        "segood_version": segood.__version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "config": {"seed": seed, "train_images": train_images, "eval_images": eval_images, "steps": steps,
                   "batch_size": batch_size, "height": height, "width": width, "num_thresholds": num_thresholds,
                   "model": "segood build_model('pspnet', 'resnet18'), encoder_weights=None"},
        "miou": miou,
        "methods": {},
        "seconds": None,
    }
    for name, acc in accumulators.items():
        binned = acc.compute()
        exact = exact_metrics(np.concatenate(all_scores[name]), ood_mask)
        results["methods"][name] = {
            "pooled": {m: binned[m] for m in (*METRIC_NAMES, "max_iou_threshold")},
            "per_image_mean": binned["per_image_mean"],
            "exact": {m: exact[m] for m in METRIC_NAMES},
            "n_id": binned["n_id"],
            "n_ood": binned["n_ood"],
            "n_ignored": binned["n_ignored"],
        }
    results["seconds"] = round(time.perf_counter() - started, 1)
    out_dir = Path(out_dir)
    write_json(out_dir / "results.json", results)
    atomic_write_text(out_dir / "results.md", results_table(results))
    return results


def results_table(results):
    """Markdown: one row per method, pooled binned metrics with the exact-mode value beside each."""
    arrows = {m: "↑" if HIGHER_IS_BETTER[m] else "↓" for m in METRIC_NAMES}
    header = " | ".join(f"{m} {arrows[m]} (exact)" for m in METRIC_NAMES)
    lines = [f"| method | {header} |", "|---|" + "---:|" * len(METRIC_NAMES)]
    for name, r in results["methods"].items():
        cells = " | ".join(f"{r['pooled'][m]:.4f} ({r['exact'][m]:.4f})" for m in METRIC_NAMES)
        lines.append(f"| {name} | {cells} |")
    first = next(iter(results["methods"].values()))
    lines.append("")
    lines.append(f"Segmentation mIoU on the ID pixels: {results['miou']:.3f}. Pixels: {first['n_id']} ID, "
                 f"{first['n_ood']} OOD, {first['n_ignored']} ignored; metrics pooled over all "
                 f"{results['config']['eval_images']} images, T = {results['config']['num_thresholds']} thresholds.")
    return "\n".join(lines) + "\n"
