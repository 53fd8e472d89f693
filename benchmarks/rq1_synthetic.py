"""The paper's RQ1 on procedural scenes: what each head costs in mIoU, trained and evaluated with segood's own
tools (``train`` and ``evaluate_miou``), in one run.

    python benchmarks/rq1_synthetic.py [--epochs 12] [--workdir /tmp/segood-rq1]

PSPNet-ResNet18 per head, 192 training and 48 validation scenes of 96x192 from ``segood.data.synthetic``
(seeds 0 and 1), batch 8, SGD lr 0.01 with poly decay, seed 0. Prints the per-class IoU table.
"""

import argparse
from pathlib import Path

from segood.data.synthetic import write_scene_set
from segood.models import HEADS, load_model
from segood.models.miou import evaluate_miou, miou_table
from segood.models.train import TrainConfig, train


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-rq1"))
    args = parser.parse_args()
    write_scene_set(args.workdir / "train.h5", 192, seed=0, split="0", overwrite=True)
    write_scene_set(args.workdir / "val.h5", 48, seed=1, split="1", overwrite=True)
    results = {}
    for head in HEADS:
        out = args.workdir / head
        config = TrainConfig(train_set=str(args.workdir / "train.h5"), out_dir=str(out), arch="pspnet",
                             encoder="resnet18", head=head, epochs=args.epochs, batch_size=8, lr=0.01,
                             crop=[96, 192], scale=[0.75, 1.5])
        train(config, progress=False)
        model, _ = load_model(out / "final.pt")
        results[f"pspnet resnet18 + {head}"] = evaluate_miou(model, args.workdir / "val.h5", progress=False)
        print(f"{head}: mIoU {results[f'pspnet resnet18 + {head}']['miou']:.4f}", flush=True)
    print()
    print(miou_table(results), end="")


if __name__ == "__main__":
    main()
