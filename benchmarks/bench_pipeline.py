"""The evaluation pipeline's own cost: a null network isolates it, and each stage is timed alone.

    python benchmarks/bench_pipeline.py [--frames 24] [--height 512] [--width 1024] [--workers N] [--device cpu]
                                        [--profile] [--reading] [--many K]

The null network returns a view of fixed logits (no work; contiguous, as a network's are), so ``segood.evaluate``
spends its time reading frames, scoring (max logit) and accumulating. A perfectly overlapped pipeline runs at the
pace of its slowest stage, so the stages are timed alone on the same frames — reading (decode + sha256 verification,
through the reader evaluate uses, with its workers) and scoring + accumulating in the main process (from frames
already in memory), with every thread and with the threads evaluate leaves it beside its readers (one core fewer a
reader), its pace in the pipeline — and evaluate's throughput is reported as a share of the slowest stage's (no
figures, no bootstrap; the state saved as evaluate saves it), end to end and warm: the time a run over two copies of
the set adds per frame of the second copy, where the run's fixed costs (starting the readers, the first batch read
before anything overlaps, the report) cancel. Best of ``--repeat`` rounds in which the five take turns (so that the
machine's noise slows each alike), after one warm-up each.
"""

import argparse
import shutil
from pathlib import Path

import numpy as np
import torch

from torch_timing import interleaved_best_ms

from segood import keep_freed_memory
from segood._threads import beside_readers
from segood.data.h5 import H5SegmentationDataset
from segood.data.synthetic import write_scene_set
from segood.evaluation import evaluate
from segood.evaluation.reading import batch_reader, default_workers, device_batches
from segood.evaluation.runner import Evaluation
from segood.methods import get_method
from segood.methods.schedule import score_frames
from segood.models.external import as_network


class NullNetwork(torch.nn.Module):
    """Returns a view of fixed logits whatever the input: a network that costs nothing. The logits are contiguous,
    as a network's are (an expanded view of one frame's would make whatever needs contiguous logits, such as the
    softmax of the robustness suite, copy them first: a cost no network's output brings)."""

    def __init__(self, size, batch_size, classes=19):
        super().__init__()
        self.logits = torch.nn.Parameter(torch.randn(batch_size, classes, *size,
                                                     generator=torch.Generator().manual_seed(0)), requires_grad=False)

    def forward(self, x):
        return self.logits[: x.shape[0]]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--frames", type=int, default=24)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch-size", type=int, default=2)
    parser.add_argument("--workers", type=int, default=None, help="reader processes (default: evaluate's default)")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--methods", nargs="+", default=["max_logit"])
    parser.add_argument("--profile", action="store_true", help="then profile one evaluate run: where the main "
                        "process spends its time, by function")
    parser.add_argument("--reading", action="store_true", help="then time reading alone at 1, 2, 4, ... reader "
                        "processes (for the host and for a device), and one frame in the main process "
                        "with and without verification: why reading is slow on a machine")
    parser.add_argument("--many", type=int, default=0, metavar="K", help="then time evaluate over K copies of the "
                        "set, each a set of its own, and the robustness suite over 3 corruptions x 5 severities: "
                        "runs of many sets, where a cost per set adds up (one run each)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/segood-bench-pipeline"))
    args = parser.parse_args()
    keep_freed_memory()  # (as every segood command does)
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    size, path = (args.height, args.width), args.workdir / "scenes.h5"
    write_scene_set(path, args.frames, size)
    workers = default_workers() if args.workers is None else args.workers
    device = torch.device(args.device)
    model = as_network(NullNetwork(size, args.batch_size)).to(device).eval()
    methods = [get_method(name) for name in args.methods]
    dataset = H5SegmentationDataset(path)
    plan = [("scenes", list(range(k, min(k + args.batch_size, args.frames)))) for k in range(0, args.frames,
                                                                                            args.batch_size)]

    def read(workers=workers, pin=device.type == "cuda", copies=1):
        for _ in batch_reader({"scenes": dataset}, plan * copies, workers=workers, pin=pin):
            pass

    batches = [batch for runs, _ in batch_reader({"scenes": dataset}, plan, workers=0) for batch in runs]

    def score_and_accumulate():
        ev = Evaluation(args.methods, ["scenes"])
        for batch, kept in batches:
            scored = score_frames(model, batch["image"].to(device, non_blocking=True), methods)
            ev.update_pixels("scenes", kept, batch, scored, args.methods)
        ev.all_reduce()
        if device.type == "cuda":
            torch.cuda.synchronize()

    def run(copies=1):  # (copies of the set, as sets of their own: read and scored again)
        evaluate(model, {f"scenes{k}": path for k in range(copies)}, methods, args.workdir / "run",
                 batch_size=args.batch_size, device=device, progress=False, figures=False, bootstrap=None,
                 workers=workers)
        shutil.rmtree(args.workdir / "run")

    def score_and_accumulate_beside_readers():  # (with the threads evaluate leaves the main process)
        with beside_readers(workers):
            score_and_accumulate()

    beside = f"scoring + accumulating beside {workers} reader(s)"
    contenders = {"reading": read, "scoring + accumulating": score_and_accumulate,
                  beside: score_and_accumulate_beside_readers, "evaluate": run,
                  "evaluate, two copies of the set": lambda: run(2)}
    stages = dict(zip(contenders, (ms / 1000 for ms in interleaved_best_ms(list(contenders.values()), args.repeat,
                                                                            device))))
    warm = "evaluate, warm (the second copy's frames)"  # a run's fixed costs cancel
    stages[warm] = stages.pop("evaluate, two copies of the set") - stages["evaluate"]
    where = torch.cuda.get_device_name() if device.type == "cuda" else f"CPU, {torch.get_num_threads()} threads"
    print(f"{args.frames} frames of {args.height}x{args.width}, batch {args.batch_size}, null network, "
          f"{', '.join(args.methods)}, {workers} reader workers, {where}\n")
    print("| stage | ms/frame |\n|---|---:|")
    for stage, seconds in stages.items():
        print(f"| {stage} | {1000 * seconds / args.frames:.1f} |")
    slowest = max(stages["reading"], stages[beside])  # (the main process's pace as evaluate runs it)
    print(f"\nevaluate runs at {slowest / stages['evaluate']:.0%} of the slowest stage's pace end to end, "
          f"{slowest / stages[warm]:.0%} warm")
    if args.profile:
        profile_run(run, score_and_accumulate, device)
    if args.reading:
        reading_scaling(read, path, args.frames, len(plan), workers, device, args.repeat)
    if args.many:
        many_sets(run, model, path, args, workers, device)


def many_sets(run, model, path, args, workers, device):
    """evaluate over ``args.many`` copies of the set, and the robustness suite (clean + 3 corruptions x 5
    severities, with the segmentation quality it adds), each one run, ms per frame."""
    import time

    from segood.robustness.suite import robustness

    start = time.perf_counter()
    run(args.many)
    print(f"\nevaluate over {args.many} sets: {1000 * (time.perf_counter() - start) / (args.many * args.frames):.1f} "
          "ms/frame")
    start = time.perf_counter()
    robustness(model, {"scenes": path}, args.methods, args.workdir / "robustness", batch_size=args.batch_size,
               corruptions=["gaussian_noise", "brightness", "fog"], device=device, workers=workers, progress=False,
               figures=False)
    print(f"robustness suite, 16 conditions: {1000 * (time.perf_counter() - start) / (16 * args.frames):.1f} ms/frame")
    shutil.rmtree(args.workdir / "robustness")


def reading_scaling(read, path, frames, batches, workers, device, repeat):
    """Reading alone at 1, 2, 4, ... up to ``workers`` reader processes, warm, in ms per frame, and per frame and
    process (flat when the readers scale), with the readers' CPU time and page faults per frame (warm likewise), for
    the host and for a device (the batches as ``device_batches`` says: registered blocks, images channels last,
    unless SEGOOD_DEVICE_BATCHES says otherwise; without CUDA, the same blocks unregistered); one frame read in the
    main process with and without verification (its sha256s); the cores and the CPU quota this process may use.

    Warm is what a pass over 3c copies of the frames adds to a pass over c, per frame, c such that the shorter pass
    holds 4 batches a reader: both passes start as many readers (a pass starts no more readers than it has batches
    after its first), and each reader has made the blocks of shared memory it writes batches into (two or three: one
    a batch in flight) before the frames that count begin. Warm is thus a long run's pace; a short run's readers
    write most of its batches into fresh blocks, whose pages are faulted in (the reading stage above)."""
    import os
    import resource
    import time

    def timed(count, pin, copies):  # (ms; the readers' CPU ms and page faults: they exit at the pass's end)
        before, start = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
        read(count, pin, copies)
        ms, after = 1000 * (time.perf_counter() - start), resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
        return np.array([ms, 1000 * cpu, after.ru_minflt - before.ru_minflt])

    quota = Path("/sys/fs/cgroup/cpu.max")
    print(f"\nreading alone: {len(os.sched_getaffinity(0))} cores for this process, cgroup cpu.max "
          f"{quota.read_text().strip() if quota.exists() else 'absent'}\n")
    print("| readers | for | copies | ms/frame | ms/frame per reader | readers' CPU ms/frame "
          "| readers' page faults/frame |")
    print("|---:|---|---|---:|---:|---:|---:|")
    for count in sorted(({min(workers, 1 << k) for k in range(5)} | {workers}) - {0}):
        c = -(-(4 * count + 1) // batches)
        for pin in (False, True):  # (for a device: in its blocks, images channels last, CUDA or not)
            # the best pass of each length (wall time), in turns; CPU time and faults of those passes
            runs = [[timed(count, pin, copies) for copies in (c, 3 * c)] for _ in range(repeat)]
            one, three = (min((r[k] for r in runs), key=lambda v: v[0]) for k in (0, 1))
            ms, cpu, faults = (three - one) / (2 * c * frames)
            kind = "the host" if not pin else f"a device, {device_batches()}" + (
                "" if torch.cuda.is_available() else " (no CUDA: unregistered)")
            print(f"| {count} | {kind} | {c} / {3 * c} | {ms:.1f} | {ms * count:.1f} | {cpu:.1f} | {faults:.0f} |")
    for verify in (True, False):
        dataset = H5SegmentationDataset(path, verify=verify)
        start = time.perf_counter()
        for i in range(min(frames, 8)):
            dataset[i]
        ms = 1000 * (time.perf_counter() - start) / min(frames, 8)
        print(f"one frame in the main process, {'verified' if verify else 'not verified'}: {ms:.1f} ms")


def profile_run(run, score_and_accumulate, device):
    """Where one evaluate run's main process spends its time, by function (own time, then with callees); on
    CUDA also which operations the scoring and accumulating keep the device and the host busy with."""
    import cProfile
    import pstats

    profile = cProfile.Profile()
    profile.runcall(run)
    for order in ("tottime", "cumulative"):
        pstats.Stats(profile).sort_stats(order).print_stats(25)
    if device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile as torch_profile

        with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            score_and_accumulate()
        for order in ("self_device_time_total", "cpu_time_total"):
            print(prof.key_averages().table(sort_by=order, row_limit=25))


if __name__ == "__main__":
    main()
