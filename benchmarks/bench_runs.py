"""How many atomic additions the device histogram's count pass makes, per counted pixel, on the CPU.

    python benchmarks/bench_runs.py [--frames 8] [--height 1024] [--width 2048]

The Triton count kernel (segood.metrics._device_triton.count) adds each counted pixel to its counter in device
memory: one atomic addition a pixel, which bounds it at a fraction of the memory-read floor. With ``ends`` a
program adds the pixels of its block's lowest and highest bin (per label) at once; with ``runs=R`` it sorts its
pixels by counter R at a time and adds each run of one counter at once; the CUDA kernel
(segood.metrics._device_cuda) counts a long stretch of an image per thread block in shared memory and adds each
distinct counter once. What that saves depends on how many distinct counters neighbouring pixels meet, so this
counts the additions to device memory each variant makes, exactly as the kernels group the pixels (Triton: blocks
of 2048 pixels of one image, groups of R within a block; CUDA: the stretches it would count on an H100), at m = 10,
on:

- the GPU check's maps: uniform scores with random labels (every pixel independent) and their saturated version;
- the score maps of the demo's PSPNet (``checkpoints/demo_plain.pt``) on generated Cityscapes-format frames shown
  to it at ``--height`` x ``--width`` (:func:`network_maps`; the GPU check times its max softmax too): a real
  network's maps, smooth from the upsampling of its logits, confident in most places.

No timing: the device check (benchmarks/gpu_check.py) times the variants; this says what they have to gain.
"""

import argparse
import sys
import tempfile
from pathlib import Path

import cv2
import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import saturated  # noqa: E402

from segood.demo import CHECKPOINTS  # noqa: E402
from segood.labels import IGNORE  # noqa: E402
from segood.methods.functional import energy, entropy_from_logits, max_logit, max_softmax_from_logits  # noqa: E402
from segood.metrics import _device, _device_cuda  # noqa: E402
from segood.models import load_model  # noqa: E402
from segood.models.network import preprocess  # noqa: E402

M = 10
H100 = {"processors": 132, "shared_per_processor": 233472, "threads_per_processor": 2048}
VARIANTS = (("one a pixel", False, 0), ("ends", True, 0), ("runs 32", False, 32), ("runs 256", False, 256),
            ("runs 2048", False, 2048), ("ends, runs 256", True, 256))  # (name, ends, runs)


def counters(scores, labels, block=_device.BLOCK):
    """(N, blocks, block) int64 counter of each pixel as the kernel groups them, -1 where none is counted (the
    binade stands for its slot: one slot a binade), and the same without the label (the kernel's end key)."""
    binade, low, nan = _device._torch_key(torch.from_numpy(scores).reshape(-1), M, True)
    label = torch.from_numpy(labels).reshape(-1).long()
    counted = (label <= 1) & ~nan
    bin_key = (binade.long() << M) | low.long()
    key = ((binade.long() * 2 + label) << M) | low.long()
    n, p = scores.shape[0], scores[0].size
    pad = -p % block
    shaped = []
    for values in (key, bin_key):
        values = torch.where(counted, values, -1).reshape(n, p)
        values = torch.nn.functional.pad(values, (0, pad), value=-1)
        shaped.append(values.reshape(n, -1, block).numpy())
    return shaped


def additions(key, bin_key, ends, runs):
    """Atomic additions of the count pass over the (N, blocks, block) counters (see :func:`counters`)."""
    key = key.copy()
    total = 0
    if ends:
        for edge in (np.where(bin_key >= 0, bin_key, np.iinfo(np.int64).max).min(axis=2, keepdims=True),
                     bin_key.max(axis=2, keepdims=True)):
            there = (bin_key == edge) & (key >= 0)
            for label in (0, 1):  # one addition per label present at the end bin
                total += int(np.any(there & ((key >> M) & 1 == label), axis=2).sum())
            key[there] = -1
            bin_key = np.where(there, -1, bin_key)
    if not runs:
        return total + int((key >= 0).sum())
    groups = np.sort(key.reshape(-1, runs), axis=1)
    distinct = groups[:, :1] >= 0
    return total + int(distinct.sum() + ((groups[:, 1:] != groups[:, :-1]) & (groups[:, 1:] >= 0)).sum())


def shared_additions(key, p, device=H100):
    """Atomic additions to device memory of the CUDA kernel (segood.metrics._device_cuda) over the counters of
    :func:`counters` on ``device``: each thread block adds the distinct counters of its stretch once."""
    n = key.shape[0]
    key = key.reshape(n, -1)[:, :p]
    slots = np.unique(key[key >= 0] >> (M + 1)).size  # (the binades)
    _, stretch = _device_cuda.stretches(n, p, _device_cuda.blocks_held(**device, slots=slots, m=M),
                                        _device_cuda.least(slots, M))
    total = 0
    for image in key:
        for start in range(0, p, stretch):
            part = image[start : start + stretch]
            total += np.unique(part[part >= 0]).size
    return total


FORMS = {"max_softmax": lambda x: 1 - max_softmax_from_logits(x), "entropy": entropy_from_logits,
         "max_logit": lambda x: -max_logit(x), "energy": lambda x: -energy(x)}


def network_maps(frames, height, width, device="cpu", forms=tuple(FORMS)):
    """{form: (frames, height, width) float32 scores} of :data:`FORMS`, uint8 labels (ID but for an ignored strip at
    the bottom): the demo's plain PSPNet on generated frames, run on ``device``, one frame at a time."""
    from segood.data.synthetic import write_cityscapes_tree

    with tempfile.TemporaryDirectory() as tmp:
        write_cityscapes_tree(tmp, counts=(("val", frames),))
        paths = sorted(Path(tmp, "leftImg8bit").rglob("*.png"))
        images = [cv2.resize(cv2.imread(str(p))[:, :, ::-1], (width, height), interpolation=cv2.INTER_LINEAR)
                  for p in paths]
    model, _ = load_model(CHECKPOINTS / "demo_plain.pt")
    model.to(device)
    maps = {name: [] for name in forms}
    for image in images:
        with torch.no_grad():  # (the network's logits come upsampled to its input's size)
            x = preprocess(torch.from_numpy(image).permute(2, 0, 1)[None].contiguous().to(device))
            logits = model(x).logits
        for name in forms:
            maps[name].append(FORMS[name](logits).float().cpu().numpy()[0])
    labels = np.zeros((frames, height, width), np.uint8)
    labels[:, int(height * 0.93):] = IGNORE
    return {name: np.stack(values) for name, values in maps.items()}, labels


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=8)
    parser.add_argument("--height", type=int, default=1024)
    parser.add_argument("--width", type=int, default=2048)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    shape = (args.frames, args.height, args.width)
    uniform = rng.random(shape, dtype=np.float32)
    labels = rng.integers(0, 2, shape).astype(np.uint8)
    inputs = {"uniform (GPU check)": (uniform, labels),
              "uniform, saturated (GPU check)": (saturated(uniform, labels), labels)}
    maps, map_labels = network_maps(*shape)
    inputs.update({f"demo PSPNet, {name}": (scores, map_labels) for name, scores in maps.items()})
    print(f"atomic additions per counted pixel, m = {M}, blocks of {_device.BLOCK}, {args.frames} maps of "
          f"{args.height}x{args.width}")
    print("| scores | " + " | ".join(name for name, _, _ in VARIANTS) + " | shared memory (CUDA, an H100) |")
    print("|---|" + "---:|" * (len(VARIANTS) + 1))
    for name, (scores, lab) in inputs.items():
        key, bin_key = counters(scores, lab)
        pixels = int((key >= 0).sum())
        cells = [f"{additions(key, bin_key, ends, runs) / pixels:.3f}" for _, ends, runs in VARIANTS]
        cells.append(f"{shared_additions(key, scores[0].size) / pixels:.3f}")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
