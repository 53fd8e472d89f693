"""Training on a converted set (Cityscapes trainIds), resumable to the same result, and mIoU evaluation."""

import csv
import io
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from segood.data.h5 import H5SegmentationDataset
from segood.io import atomic_write_text
from segood.labels import IGNORE, NUM_CLASSES
from segood.models.checkpoint import read_checkpoint, save_checkpoint
from segood.models.losses import confidence_loss
from segood.models.miou import evaluate_miou
from segood.models.network import build_model, preprocess


#: settings that may change between a run and its --resume: they do not change the weights
RESUMABLE_CHANGES = ("workers", "device", "out_dir")


@dataclass
class TrainConfig:
    train_set: str
    out_dir: str
    val_set: str | None = None
    arch: str = "pspnet"
    encoder: str = "resnet50"
    head: str = "plain"
    dropout_p: float = 0.5
    reduced_dim: int = 32
    encoder_weights: str | None = None
    epochs: int = 10
    batch_size: int = 8
    lr: float = 0.01
    momentum: float = 0.9
    weight_decay: float = 1e-4
    poly_power: float = 0.9
    crop: list = field(default_factory=lambda: [512, 1024])
    scale: list = field(default_factory=lambda: [0.5, 2.0])
    conf_lambda: float = 0.5
    workers: int = 0
    seed: int = 0
    device: str = "auto"

    def __post_init__(self):  # paths as strings: checkpoints hold plain values only
        for key in ("train_set", "out_dir", "val_set"):
            if getattr(self, key) is not None:
                setattr(self, key, str(getattr(self, key)))


def check_resumable(saved, config, path):
    """Refuse to resume a run with other settings than it started with (the result would mix two
    configurations); ``RESUMABLE_CHANGES`` may differ."""
    if not isinstance(saved, dict):
        raise ValueError(f"{path} records no training configuration: it was not written by segood train")
    current = asdict(config)
    changed = sorted(k for k in set(saved) | set(current)
                     if k not in RESUMABLE_CHANGES and _comparable(saved.get(k)) != _comparable(current.get(k)))
    if changed:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ValueError(f"--resume with other settings than {path} was trained with ({shown}); resume with the "
                         "same settings, or train into a new --out")


def _comparable(value):
    return list(value) if isinstance(value, tuple) else value


def augmentation(config, epoch):
    """Random scale, pad, crop, flip (masks nearest, padded with 255), photometric jitter (image only)."""
    import albumentations as A
    import cv2

    crop_h, crop_w = config.crop
    transform = A.Compose([
        A.RandomScale(scale_limit=(config.scale[0] - 1, config.scale[1] - 1), interpolation=cv2.INTER_LINEAR,
                      mask_interpolation=cv2.INTER_NEAREST, p=1.0),
        A.PadIfNeeded(crop_h, crop_w, border_mode=cv2.BORDER_CONSTANT, fill=0, fill_mask=IGNORE),
        A.RandomCrop(crop_h, crop_w),
        A.HorizontalFlip(),
        A.ColorJitter(brightness=0.25, contrast=0.25, saturation=0.25, hue=0.02, p=0.8),
    ], seed=_epoch_seed(config.seed, epoch))
    return transform


def _epoch_seed(seed, epoch):
    return seed * 100_003 + epoch


def _device(name):
    return torch.device("cuda" if torch.cuda.is_available() else "cpu") if name == "auto" else torch.device(name)


def train(config, *, resume=False, progress=True, stop_after=None):
    """Train, checkpointing atomically every epoch to ``out_dir/last.pt`` (and ``final.pt`` at the end).

    Every epoch reseeds the data order, augmentation and dropout from (seed, epoch), so ``resume=True`` after
    an interruption gives the same weights as an uninterrupted run. ``stop_after``: return after this many
    epochs of this call (for time-boxed jobs; resume later). Returns the per-epoch log (list of dicts).
    """
    out = Path(config.out_dir)
    device = _device(config.device)
    torch.manual_seed(config.seed)  # the initial weights
    model = build_model(config.arch, config.encoder, NUM_CLASSES, config.head, dropout_p=config.dropout_p,
                        reduced_dim=config.reduced_dim, encoder_weights=config.encoder_weights).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    start_epoch, iteration, log = 0, 0, []
    if resume and (out / "last.pt").exists():
        state = read_checkpoint(out / "last.pt", map_location=device)
        check_resumable(state.get("train_config"), config, out / "last.pt")
        try:
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            start_epoch, iteration, log = int(state["epoch"]) + 1, int(state["iteration"]), list(state["log"])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise ValueError(f"{out / 'last.pt'} cannot be resumed from ({type(err).__name__}: {err}); start a "
                             "new --out or drop --resume") from None

    steps_per_epoch = len(H5SegmentationDataset(config.train_set)) // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{config.train_set} has fewer frames than one batch of {config.batch_size}")
    total = steps_per_epoch * config.epochs
    last_epoch = config.epochs if stop_after is None else min(config.epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, last_epoch):
        seed = _epoch_seed(config.seed, epoch)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        dataset = H5SegmentationDataset(config.train_set, transform=augmentation(config, epoch))
        loader = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, shuffle=True, drop_last=True,
                                             num_workers=config.workers, generator=torch.Generator().manual_seed(seed))
        model.train()
        losses, started = [], time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", disable=not progress)
        for batch in bar:
            for group in optimizer.param_groups:
                group["lr"] = config.lr * (1 - iteration / total) ** config.poly_power
            x = preprocess(batch["image"].to(device))
            y = batch["semantic"].to(device).long()
            with torch.autocast(device.type, enabled=amp):
                output = model(x)
                if config.head == "confidence":
                    loss = confidence_loss(output.logits.float(), output.confidence.float(), y,
                                           lam=config.conf_lambda)
                else:
                    loss = F.cross_entropy(output.logits.float(), y, ignore_index=IGNORE)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            iteration += 1
            losses.append(loss.item())
            bar.set_postfix(loss=f"{losses[-1]:.3f}", img_s=f"{len(losses) * config.batch_size / (time.perf_counter() - started):.1f}")
        row = {"epoch": epoch + 1, "iteration": iteration, "loss": float(np.mean(losses)),
               "lr": optimizer.param_groups[0]["lr"], "seconds": round(time.perf_counter() - started, 2)}
        if config.val_set:
            row["val_miou"] = evaluate_miou(model, config.val_set, device=device, progress=False)["miou"]
        log.append(row)
        save_checkpoint(out / "last.pt", model, optimizer=optimizer.state_dict(), epoch=epoch, iteration=iteration,
                        log=log, train_config=asdict(config))
        atomic_write_text(out / "log.csv", _csv(log))
    if last_epoch < config.epochs:
        return log
    save_checkpoint(out / "final.pt", model, epoch=config.epochs - 1, iteration=iteration, log=log,
                    train_config=asdict(config))
    return log


def _csv(rows):
    buffer = io.StringIO()
    fields = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
