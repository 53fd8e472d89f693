"""The ``segood`` command line: ``segood SUBCOMMAND --help`` for each."""

import argparse
import sys

import segood


def _demo(args):
    from segood.demo import run_demo

    results = run_demo(args.out, seed=args.seed, steps=args.steps, train_images=args.train_images,
                       eval_images=args.eval_images, progress=not args.quiet)
    print((args.out / "results.md").read_text(), end="")
    print(f"\nwrote {args.out / 'results.json'} and {args.out / 'results.md'} in {results['seconds']} s")
    return 0


def _metrics(args):
    import numpy as np

    from segood.metrics import METRIC_NAMES, PixelOODAccumulator

    acc = PixelOODAccumulator.load(args.state)
    result = acc.compute()
    for name in (*METRIC_NAMES, "max_iou_threshold", "n_id", "n_ood", "n_ignored"):
        print(f"{name:>18}: {result[name]}")
    if args.curves:
        np.savetxt(args.curves, np.column_stack([result[k] for k in ("thresholds", "tp", "fp", "fn", "tn")]),
                   delimiter=",", header="threshold,tp,fp,fn,tn", comments="", fmt=["%.17g"] + ["%d"] * 4)
    return 0


def build_parser():
    from pathlib import Path

    parser = argparse.ArgumentParser(prog="segood", description=segood.__doc__)
    parser.add_argument("--version", action="version", version=f"segood {segood.__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    demo = sub.add_parser("demo", help="train a small network on procedural scenes and benchmark OOD scores")
    demo.add_argument("--out", type=Path, default=Path("runs/demo"), help="output folder (default runs/demo)")
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--steps", type=int, default=250, help="training steps (default 250)")
    demo.add_argument("--train-images", type=int, default=192)
    demo.add_argument("--eval-images", type=int, default=48)
    demo.add_argument("--quiet", action="store_true", help="no progress bars")
    demo.set_defaults(run=_demo)

    metrics = sub.add_parser("metrics", help="print the metrics of a saved accumulator state (.npz)")
    metrics.add_argument("state", type=Path, help="file written by PixelOODAccumulator.save")
    metrics.add_argument("--curves", type=Path, help="also write the per-threshold counts to this CSV")
    metrics.set_defaults(run=_metrics)
    return parser


def main(argv=None):
    args = build_parser().parse_args(argv)
    try:
        return args.run(args)
    except (ValueError, FileNotFoundError) as err:  # bad input: one clear line, no traceback
        print(f"segood {args.command}: error: {err}", file=sys.stderr)
        return 2
