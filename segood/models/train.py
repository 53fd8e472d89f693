"""Training on a converted set (Cityscapes trainIds), resumable to the same result, and mIoU evaluation; fine-tuning
with outlier exposure on a set of pasted OOD objects (``segood convert paste``).

Outlier exposure (``TrainConfig.outlier_exposure``) starts from a trained checkpoint (``init``) and trains on the
frames of ``train_set`` and of the OE set together, with one of :data:`OE_LOSSES` (:mod:`segood.models.losses`).
The checkpoint records where the OE objects came from (``outlier_exposure``: the set's identity and its
:func:`~segood.data.h5.object_sources`), so that an evaluation flags test sets of the same source.
"""

import csv
import io
import math
import random
import time
import warnings
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from tqdm import tqdm

from segood.data.h5 import (H5SegmentationDataset, frame_sizes, object_sources, read_manifest, require_classes,
                             set_identity)
from segood.io import atomic_write_text
from segood.labels import IGNORE, NUM_CLASSES
from segood.models.checkpoint import load_model, read_checkpoint, save_checkpoint
from segood.models.losses import confidence_loss, energy_oe_loss, entropy_oe_loss, rba_oe_loss
from segood.models.miou import evaluate_miou
from segood.models.network import build_model, preprocess


#: settings that may change between a run and its --resume: they do not change the weights
RESUMABLE_CHANGES = ("workers", "device", "out_dir")
#: outlier-exposure losses: {name: (default weight, default margins (m_in, m_out) or None, paper)}
OE_LOSSES = {"entropy": (0.9, None, "Meta-OOD entropy maximisation, Chan et al. ICCV 2021"),
             "energy": (0.1, (-25.0, -7.0), "energy-bounded OE, Liu et al. NeurIPS 2020"),
             "rba": (1.0, (0.0, 5.0), "RbA outlier supervision, Nayal et al. ICCV 2023")}
#: the network settings a fine-tuning run takes from its --init checkpoint
NETWORK_KEYS = ("arch", "encoder", "head", "dropout_p", "reduced_dim")


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
    init: str | None = None
    outlier_exposure: str | None = None
    oe_loss: str = "entropy"
    oe_weight: float | None = None
    oe_margins: list | None = None
    oe_reduction: str = "sets"
    init_type: str | None = None  # "hf": ``init`` is a transformers mask-classification network's folder

    def __post_init__(self):  # paths as strings: checkpoints hold plain values only
        for key in ("train_set", "out_dir", "val_set", "init", "outlier_exposure"):
            if getattr(self, key) is not None:
                setattr(self, key, str(getattr(self, key)))
        if self.oe_margins is not None:
            self.oe_margins = [float(v) for v in self.oe_margins]
        if type(self.batch_size) is not int or self.batch_size < 1:
            raise ValueError(f"the batch size must be at least 1, got {self.batch_size!r}")
        if type(self.epochs) is not int or self.epochs < 0:
            raise ValueError(f"the epochs must be at least 0, got {self.epochs!r}")
        if not 0 < self.scale[0] <= self.scale[1] < math.inf:
            raise ValueError(f"--scale MIN MAX must satisfy 0 < MIN <= MAX, got {list(self.scale)}")
        for key, high in (("lr", math.inf), ("momentum", 1), ("weight_decay", math.inf), ("poly_power", math.inf),
                          ("conf_lambda", math.inf), ("dropout_p", 1)):  # (NaN fails every comparison)
            value = getattr(self, key)
            if not 0 <= value < high or key == "lr" and value == 0:
                raise ValueError(f"--{key.replace('_', '-')} must lie in {'(' if key == 'lr' else '['}0, {high}), got "
                                 f"{value!r}")
        check_oe_options(self)

    @property
    def oe_settings(self):
        """(weight, margins) of the OE loss, the paper's defaults where not given; None without OE."""
        if self.outlier_exposure is None:
            return None
        weight, margins, _ = OE_LOSSES[self.oe_loss]
        return (weight if self.oe_weight is None else self.oe_weight,
                None if margins is None else tuple(self.oe_margins or margins))


def check_oe_options(config):
    """Refuse outlier-exposure options that cannot work, saying which option and how to fix it."""
    oe_given = [name for name, default in (("oe_loss", "entropy"), ("oe_weight", None), ("oe_margins", None),
                                           ("oe_reduction", "sets")) if getattr(config, name) != default]
    if config.outlier_exposure is None:
        if config.init_type is not None:
            oe_given.insert(0, "init_type")  # (a transformers network is trained here only by RbA's fine-tuning)
        if oe_given:
            raise ValueError(f"{', '.join('--' + n.replace('_', '-') for n in oe_given)} set up outlier exposure: "
                             "pass --outlier-exposure SET (a set made by segood convert paste) or drop them")
        return
    if config.init is None:
        raise ValueError("--outlier-exposure fine-tunes a trained network: pass --init CHECKPOINT (e.g. a final.pt "
                         "of segood train)")
    if config.init_type not in (None, "hf"):
        raise ValueError(f"--init-type must be hf (a transformers folder) or absent (a segood checkpoint), got "
                         f"{config.init_type!r}")
    if config.init_type == "hf" and config.oe_loss != "rba":
        raise ValueError(f"a transformers mask-classification network is fine-tuned with RbA's outlier supervision: "
                         f"pass --oe-loss rba (not {config.oe_loss!r}, whose losses are for per-pixel logits)")
    if config.oe_loss not in OE_LOSSES:
        raise ValueError(f"--oe-loss must be one of {sorted(OE_LOSSES)}, got {config.oe_loss!r}")
    weight, margins = config.oe_settings
    if config.oe_loss == "entropy" and not 0.0 <= weight <= 1.0:
        raise ValueError(f"--oe-weight is Meta-OOD's λ, the OOD term's share of the loss: it must lie in [0, 1], "
                         f"got {weight}")
    if not 0 <= weight < math.inf:
        raise ValueError(f"--oe-weight must be a finite number of at least 0, got {weight}")
    if config.oe_margins is not None:
        if margins is None:
            raise ValueError(f"--oe-loss {config.oe_loss} has no margins: drop --oe-margins (they set the hinges of "
                             "the energy and rba losses)")
        if len(config.oe_margins) != 2 or not all(map(math.isfinite, config.oe_margins)):
            raise ValueError(f"--oe-margins takes two finite values, M_IN M_OUT; got {config.oe_margins}")
    if config.oe_loss == "energy" and margins[0] >= margins[1]:
        raise ValueError(f"energy margins must have m_in < m_out (ID energies are pushed below m_in, OOD ones above "
                         f"m_out), got m_in={margins[0]}, m_out={margins[1]}")
    if config.oe_loss == "rba" and margins[0] >= margins[1]:
        raise ValueError(f"rba margins must have m_in < m_out (ID RbA scores are pushed below m_in, OOD ones above "
                         f"m_out), got m_in={margins[0]}, m_out={margins[1]}")
    if config.oe_reduction not in ("sets", "pixels"):
        raise ValueError(f"--oe-reduction must be 'sets' or 'pixels', got {config.oe_reduction!r}")
    if config.oe_reduction != "sets" and config.oe_loss != "entropy":
        raise ValueError("--oe-reduction applies to --oe-loss entropy only: drop it")
    if config.head == "confidence":
        raise ValueError("outlier exposure fine-tunes a network trained with cross-entropy; the confidence head's "
                         "loss has no OE form here: fine-tune a plain, dropout or dimreduce network")


def finetune_config(init, **settings):
    """A :class:`TrainConfig` whose network settings (``NETWORK_KEYS``) are those of the checkpoint ``init``;
    a setting given that differs from the checkpoint's is a ValueError."""
    network = read_checkpoint(init)["config"]
    classes = network.get("num_classes", NUM_CLASSES)
    if classes != NUM_CLASSES:  # (its losses would clamp the trainIds above its classes onto its last one)
        raise ValueError(f"{init} predicts {classes} classes; segood train trains on the {NUM_CLASSES} Cityscapes "
                         "trainIds: start from a network of those")
    differ = {k: (settings[k], network[k]) for k in NETWORK_KEYS if settings.get(k) is not None
              and settings[k] != network[k]}
    if differ:
        shown = ", ".join(f"--{k.replace('_', '-')} {given!r} (the checkpoint: {saved!r})"
                          for k, (given, saved) in differ.items())
        raise ValueError(f"{init} is another network than the options say: {shown}; drop those options, the "
                         "network comes from --init")
    return TrainConfig(**{**settings, **{k: network[k] for k in NETWORK_KEYS}, "init": str(init)})


def oe_record(config):
    """What a checkpoint records about its outlier exposure: the loss, its settings, the OE set's identity and
    the source of its objects, and the parent checkpoint."""
    weight, margins = config.oe_settings
    manifest = read_manifest(config.outlier_exposure)
    return {"loss": config.oe_loss, "paper": OE_LOSSES[config.oe_loss][2], "weight": weight,
            "margins": None if margins is None else list(margins), "reduction": config.oe_reduction,
            "set": set_identity(config.outlier_exposure), "object_sources": object_sources(manifest),
            "objects": (manifest.get("params") or {}).get("objects"),
            "parent": {"checkpoint": Path(config.init).name, "sha256": _sha256(config.init)}}  # (a folder: its files)


def same_source_sets(record, sets):
    """The names of ``sets`` ({name: path}) whose OOD objects come from a source the OE ``record`` trained on."""
    trained = set(record.get("object_sources") or ())
    return [name for name, path in sets.items() if trained & set(object_sources(read_manifest(path)))]


def _sha256(path):
    """The sha256 of a file; of a folder, the sha256 of its files' relative names and digests, in name order."""
    import hashlib

    path = Path(path)
    if path.is_dir():
        files = sorted(f for f in path.rglob("*") if f.is_file())
        return hashlib.sha256("".join(f"{f.relative_to(path).as_posix()} {_sha256(f)}\n" for f in files).encode()) \
            .hexdigest()
    return hashlib.sha256(path.read_bytes()).hexdigest()


def check_resumable(saved, config, path):
    """Refuse to resume a run with other settings than it started with (the result would mix two
    configurations); ``RESUMABLE_CHANGES`` may differ."""
    if not isinstance(saved, dict):
        raise ValueError(f"{path} records no training configuration: it was not written by segood train")
    current, defaults = asdict(config), {f.name: f.default for f in fields(TrainConfig)}
    # a setting added after the run started is compared as its default
    changed = sorted(k for k in set(saved) | set(current) if k not in RESUMABLE_CHANGES
                     and _comparable(saved.get(k, defaults.get(k))) != _comparable(current.get(k)))
    if changed:
        shown = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise ValueError(f"--resume with other settings than {path} was trained with ({shown}); resume with the "
                         "same settings, or train into a new --out")


def data_identity(config):
    """{option: manifest sha256} of the sets a training reads: a resume must read the same frames."""
    from segood.data.h5 import set_identity

    return {key: set_identity(getattr(config, key))["manifest_sha256"]
            for key in ("train_set", "val_set", "outlier_exposure") if getattr(config, key)}


def check_same_data(saved, data, path):
    """Refuse to resume on other frames than ``path`` was trained on (its ``saved`` data identity; runs that
    recorded none are not checked)."""
    changed = [key for key in data if saved.get(key) != data[key]] if saved is not None else []
    if changed:
        raise ValueError(f"--resume: {', '.join(changed)} hold other frames than {path} was trained on (the sets' "
                         "manifest sha256 differs); resume with the same sets, or train into a new --out")


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
    """Train, checkpointing atomically every epoch to ``out_dir/last.pt`` (and, at the end, ``final.pt``; for a
    transformers network, its folder ``final/``).

    Every epoch reseeds the data order and dropout from (seed, epoch) and each frame's augmentation from (seed,
    epoch, frame), so ``resume=True`` after an interruption gives the same weights as an uninterrupted run, with
    any number of ``workers``. ``stop_after``: return after this many
    epochs of this call (for time-boxed jobs; resume later). Returns the per-epoch log (list of dicts).
    """
    out = Path(config.out_dir)
    if out.is_file():
        raise ValueError(f"{out} is a file; --out names the folder a training writes")
    held = [name for name in ("last.pt", "final.pt", "final") if (out / name).exists()]
    if held and not resume:
        raise ValueError(f"{out} already holds a training ({', '.join(held)}): --resume continues it; another "
                         "--out starts a new one")
    device = _device(config.device)
    torch.manual_seed(config.seed)  # the initial weights
    if config.init_type == "hf":
        from segood.models.hf_train import MaskLearner as learner_class  # (transformers: imported where needed)
    else:
        learner_class = NetworkLearner
    learner = learner_class(config, device)
    record = oe_record(config) if config.outlier_exposure else None
    optimizer = torch.optim.SGD(learner.module.parameters(), lr=config.lr, momentum=config.momentum,
                                weight_decay=config.weight_decay)
    amp = device.type == "cuda"
    scaler = torch.amp.GradScaler("cuda", enabled=amp)
    start_epoch, iteration, log = 0, 0, []
    data = data_identity(config)
    if resume and (out / "last.pt").exists():
        state = learner.read(out / "last.pt", device)
        check_resumable(state.get("train_config"), config, out / "last.pt")
        check_same_data(state.get("data"), data, out / "last.pt")
        try:
            learner.module.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            if state.get("scaler"):  # (CUDA's loss scale: a resume goes on at the scale the run had reached)
                scaler.load_state_dict(state["scaler"])
            start_epoch, iteration, log = int(state["epoch"]) + 1, int(state["iteration"]), list(state["log"])
        except (KeyError, RuntimeError, ValueError, TypeError) as err:
            raise ValueError(f"{out / 'last.pt'} cannot be resumed from ({type(err).__name__}: {err}); start a "
                             "new --out or drop --resume") from None
    elif resume:
        warnings.warn(f"nothing to resume in {out} (no last.pt): the training starts afresh", stacklevel=2)

    frames = len(_dataset(config, None))
    steps_per_epoch = frames // config.batch_size
    if steps_per_epoch == 0:
        raise ValueError(f"{config.train_set} has {frames} frames, fewer than one batch of {config.batch_size}: give "
                         f"a smaller --batch-size (at most {frames})")
    check_crop(config)
    multiple = getattr(learner.network, "input_multiple", 1)
    if config.init_type is None and any(side % multiple for side in config.crop):
        fits = " ".join(str(-(-side // multiple) * multiple) for side in config.crop)
        raise ValueError(f"--crop {config.crop[0]} {config.crop[1]}: the network's input sides must be multiples of "
                         f"{multiple} (its encoder's stride); give e.g. --crop {fits}")
    require_classes(config.train_set, "training")  # (a loss of NaN from the first batch)
    if config.val_set:
        require_classes(config.val_set, "--val's mIoU")
    total = steps_per_epoch * config.epochs
    last_epoch = config.epochs if stop_after is None else min(config.epochs, start_epoch + stop_after)
    for epoch in range(start_epoch, last_epoch):
        seed = _epoch_seed(config.seed, epoch)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        random.seed(seed)
        transform = augmentation(config, epoch)
        dataset = _Augmented(_dataset(config, transform), transform, seed)
        loader = torch.utils.data.DataLoader(dataset, batch_size=config.batch_size, shuffle=True, drop_last=True,
                                             num_workers=config.workers, generator=torch.Generator().manual_seed(seed))
        learner.module.train()
        losses, started = [], time.perf_counter()
        bar = tqdm(loader, desc=f"epoch {epoch + 1}/{config.epochs}", unit="batch", disable=not progress)
        for batch in bar:
            for group in optimizer.param_groups:
                group["lr"] = config.lr * (1 - iteration / total) ** config.poly_power
            with torch.autocast(device.type, enabled=amp):
                loss = learner.loss({k: batch[k].to(device) for k in ("image", "semantic", "ood_mask")}, record)
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
            row["val_miou"] = evaluate_miou(learner.network, config.val_set, device=device, progress=False)["miou"]
        log.append(row)
        learner.save(out / "last.pt", optimizer=optimizer.state_dict(), scaler=scaler.state_dict(), epoch=epoch,
                     iteration=iteration, log=log, train_config=asdict(config), data=data, **_oe_entry(record))
        atomic_write_text(out / "log.csv", _csv(log))
    if last_epoch < config.epochs:
        return log
    learner.finish(out, epoch=config.epochs - 1, iteration=iteration, log=log, train_config=asdict(config),
                   data=data, **_oe_entry(record))
    return log


class NetworkLearner:
    """Training a segood network: built from the config, or fine-tuned from its ``init`` checkpoint; cross-entropy,
    the confidence head's loss, or an outlier-exposure loss; checkpoints ``last.pt`` and ``final.pt``."""

    def __init__(self, config, device):
        self.config = config
        if config.init is not None:
            self.network = _initial_model(config).to(device)
        else:
            self.network = build_model(config.arch, config.encoder, NUM_CLASSES, config.head,
                                       dropout_p=config.dropout_p, reduced_dim=config.reduced_dim,
                                       encoder_weights=config.encoder_weights).to(device)
        self.module = self.network

    def loss(self, batch, record):
        config, output = self.config, self.network(preprocess(batch["image"]))
        target = batch["semantic"].long()
        if record is not None:
            return oe_loss(config, output.logits.float(), target, batch["ood_mask"])
        if config.head == "confidence":
            return confidence_loss(output.logits.float(), output.confidence.float(), target, lam=config.conf_lambda)
        return F.cross_entropy(output.logits.float(), target, ignore_index=IGNORE)

    def read(self, path, device):
        return read_checkpoint(path, map_location=device)

    def save(self, path, **extra):
        save_checkpoint(path, self.network, **extra)

    def finish(self, out, **extra):
        save_checkpoint(out / "final.pt", self.network, **extra)


def oe_loss(config, logits, target, ood_mask):
    """The configured outlier-exposure loss of a batch (``config.oe_loss``, with its weight and margins)."""
    weight, margins = config.oe_settings
    if config.oe_loss == "entropy":
        return entropy_oe_loss(logits, target, ood_mask, lam=weight, reduction=config.oe_reduction)
    if config.oe_loss == "energy":
        return energy_oe_loss(logits, target, ood_mask, weight=weight, m_in=margins[0], m_out=margins[1])
    # segood's networks have no queries: their logits stand for RbA's per-class scores
    ce = F.cross_entropy(logits, torch.where(ood_mask == 1, IGNORE, target), ignore_index=IGNORE)
    return ce + weight * rba_oe_loss(logits, ood_mask, m_in=margins[0], m_out=margins[1])


def _initial_model(config):
    """The network of the ``init`` checkpoint, checked against the config's network settings."""
    model, state = load_model(config.init)
    saved = state["config"]
    differ = [k for k in NETWORK_KEYS if getattr(config, k) != saved[k]]
    if differ:
        raise ValueError(f"{config.init} is a {saved['arch']}/{saved['encoder']}/{saved['head']} network, but the "
                         "settings say " + ", ".join(f"{k}={getattr(config, k)!r}" for k in differ)
                         + "; build the settings with segood.models.train.finetune_config(init, ...), which takes "
                         "them from the checkpoint")
    return model.float()


def check_crop(config):
    """Refuse a crop that no frame of the training sets reaches, even scaled up by ``--scale``'s largest factor: its
    batches would be mostly padding (and a crop far beyond the frames exhausts the memory)."""
    paths = [p for p in (config.train_set, config.outlier_exposure) if p is not None]
    height, width = (max(side) for side in zip(*[size for p in paths for size in frame_sizes(p)]))
    reach = math.floor(height * config.scale[1]), math.floor(width * config.scale[1])
    if config.crop[0] > reach[0] or config.crop[1] > reach[1]:
        raise ValueError(f"--crop {config.crop[0]} {config.crop[1]} is larger than any frame of {', '.join(paths)} "
                         f"becomes (at most {height}x{width}, scaled by up to {config.scale[1]:g}: {reach[0]}x"
                         f"{reach[1]}): pass --crop H W no larger than that")


def _dataset(config, transform):
    """The training frames: ``train_set``, followed by the OE set's frames when fine-tuning with outlier exposure."""
    train_set = H5SegmentationDataset(config.train_set, transform=transform)
    if config.outlier_exposure is None:
        return train_set
    oe_set = H5SegmentationDataset(config.outlier_exposure, transform=transform)
    if read_manifest(config.outlier_exposure)["pixels"]["ood"] == 0:
        raise ValueError(f"{config.outlier_exposure} has no OOD pixels: outlier exposure needs a set with pasted OOD "
                         "objects (segood convert paste --cityscapes-root ... --split train --objects SUN2012_ROOT)")
    return torch.utils.data.ConcatDataset([train_set, oe_set])


class _Augmented(torch.utils.data.Dataset):
    """The frames of ``dataset``, whose reads apply ``transform``, augmented with draws from (``seed``, frame
    index): the same whichever process reads a frame, in whatever order (each reader process holds a copy of the
    transform, so draws from its own running state would repeat across readers and change with their number)."""

    def __init__(self, dataset, transform, seed):
        self.dataset, self.transform, self.seed = dataset, transform, seed

    def __len__(self):
        return len(self.dataset)

    def __getitem__(self, index):
        self.transform.set_random_seed((self.seed * 1_000_003 + index) % 2**32)
        return self.dataset[index]


def _oe_entry(record):
    return {} if record is None else {"outlier_exposure": record}


def _csv(rows):
    buffer = io.StringIO()
    fields = list(dict.fromkeys(k for row in rows for k in row))
    writer = csv.DictWriter(buffer, fieldnames=fields)
    writer.writeheader()
    writer.writerows(rows)
    return buffer.getvalue()
