"""Segmentation quality of a network on a converted set: per-class IoU and mIoU (the paper's RQ1)."""

from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from segood.data.h5 import H5SegmentationDataset, frame_loader, require_classes
from segood.labels import CLASS_NAMES, NUM_CLASSES
from segood.metrics.segmentation import confusion_matrix, mean_iou
from segood.models.network import device_of, evaluation_mode, preprocess
from segood.models.predict import predicted_classes


@torch.no_grad()
def evaluate_miou(model, data, *, batch_size=4, device=None, progress=True):
    """Per-class IoU and mIoU of ``model`` on a converted set (its ``semantic`` trainIds)."""
    device = device or device_of(model)
    dataset = data if isinstance(data, H5SegmentationDataset) else H5SegmentationDataset(data)
    require_classes(dataset.path, "mIoU")
    loader = frame_loader(dataset, batch_size)
    confusion = np.zeros((NUM_CLASSES, NUM_CLASSES), np.int64)
    with evaluation_mode(model):
        for batch in tqdm(loader, desc="mIoU", unit="batch", disable=not progress):
            predicted = predicted_classes(model(preprocess(batch["image"].to(device))).logits).cpu().numpy()
            confusion += confusion_matrix(predicted, batch["semantic"].numpy(), NUM_CLASSES)
    miou, iou = mean_iou(confusion)
    return {"miou": miou, "iou": dict(zip(CLASS_NAMES, iou.tolist())), "confusion": confusion}


def miou_table(results):
    """Markdown: one row per network (name -> evaluate_miou result), per-class IoU columns, mIoU last."""
    lines = ["| network | " + " | ".join(CLASS_NAMES) + " | mIoU ↑ |", "|---|" + "---:|" * (NUM_CLASSES + 1)]
    for name, r in results.items():
        cells = " | ".join("–" if np.isnan(v) else f"{v:.3f}" for v in r["iou"].values())
        lines.append(f"| {name} | {cells} | **{r['miou']:.4f}** |")
    return "\n".join(lines) + "\n"


def network_name(config):
    """A network's name in tables: arch, encoder and head (the plain head unnamed)."""
    name = f"{config['arch']} {config['encoder']}"
    return name if config["head"] == "plain" else f"{name} + {config['head']}"


def miou_report(checkpoints, data, *, batch_size=2, progress=True):
    """(Markdown table, CSV text) of the per-class IoU and mIoU of each checkpoint on the set ``data``."""
    from segood.models.checkpoint import load_model

    rows = []
    for path in checkpoints:
        model, state = load_model(path)
        rows.append((network_name(state["config"]), Path(path).name,
                     evaluate_miou(model, data, batch_size=batch_size, progress=progress)))
    names = [name for name, _, _ in rows]  # (one network twice, e.g. a parent and its fine-tune: named by file too)
    results = {name if names.count(name) == 1 else f"{name} ({file})": r for name, file, r in rows}
    if len(results) < len(rows):
        raise ValueError(f"checkpoints {[str(p) for p in checkpoints]} name one file twice; give each once")
    csv = "network,class,iou\n" + "".join(f"{name},{cls},{iou}\n" for name, r in results.items()
                                         for cls, iou in r["iou"].items())
    return miou_table(results), csv
