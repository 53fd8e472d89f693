"""How far each method's AUROC falls: ``segood attack`` on the demo's networks and generated frames, on a CPU.

    python benchmarks/bench_attack.py [--frames 16] [--budget 100] [--out runs/attack_demo] [--data datasets/demo]
        [--methods energy ...] [--learned] [--no-reuse]

Prepares the demo's data (``segood.demo.prepare_data``, full scale: 128x256 frames), then attacks the ten
methods of the demo (each on its head's shipped checkpoint, default parameters: ODIN at T = 1000, ε = 0) on the
first ``--frames`` clean Cityscapes-format val frames, ``--budget`` network passes per frame and method, the
demo's pasted-object set as the standard set, sml and mahalanobis fitted on the train split. Prints the report
(``<out>/attack.md``) and the wall-clock times; the numbers in docs/attack.md come from this script.
``--methods`` attacks a subset; ``--learned`` first trains the learned fill's generator on the demo's OOD objects
(``segood.attack.run.train_generator``, default settings, ``--seed``) into ``<out>/generator.pt``, prints its
training time and reconstruction loss, and adds its fill to the search space. ``--no-reuse`` spends a pass on
every proposal, as before proposals that render the state's image again were scored without one.
"""

import argparse
import os
import time
from pathlib import Path

import torch

from segood.attack.run import attack, train_generator
from segood.attack.search import SearchConfig
from segood.demo import CHECKPOINTS, FULL, METHODS_BY_HEAD, prepare_data


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=16)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path("runs/attack_demo"))
    parser.add_argument("--data", type=Path, default=Path("datasets/demo"))
    parser.add_argument("--resume", action="store_true")
    parser.add_argument("--methods", nargs="+", help="attack these of the demo's methods only")
    parser.add_argument("--learned", action="store_true", help="train a generator and add the learned fill")
    parser.add_argument("--no-reuse", action="store_true",
                        help="spend a pass on every proposal, also those that render the state's image again")
    args = parser.parse_args()
    started = time.perf_counter()
    sets = prepare_data(args.data, FULL, 0, progress=False)
    prepared = time.perf_counter() - started
    targets = [(method, CHECKPOINTS / f"demo_{head}.pt") for head, methods in METHODS_BY_HEAD.items()
               for method in methods if args.methods is None or method in args.methods]
    generator = None
    if args.learned:
        generator = args.out / "generator.pt"
        if not generator.exists():
            record = train_generator(generator, seed=args.seed)
            print(f"generator: {record['crops']} crops, {record['epochs']} epochs, loss {record['loss'][0]:.4f} -> "
                  f"{record['final_loss']:.4f}, trained in {record['seconds']:.1f} s")
    config = SearchConfig(budget=args.budget, seed=args.seed, reuse_unchanged=not args.no_reuse)
    doc = attack(targets, sets["cityscapes_val"], args.out, config=config,
                 standard=sets["paste"], fit_set=sets["cityscapes_train"], max_frames=args.frames, resume=args.resume,
                 generator=generator)
    print((args.out / "attack.md").read_text())
    print(f"CPU: {os.cpu_count()} cores visible, torch {torch.get_num_threads()} threads; data {prepared:.0f} s, "
          f"search {doc['search_seconds']:.0f} s ({doc['passes']} passes, "
          f"{1000 * doc['search_seconds'] / doc['passes']:.1f} ms each), evaluation {doc['evaluation_seconds']:.0f} s, "
          f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
