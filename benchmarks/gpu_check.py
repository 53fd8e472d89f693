"""The GPU check: prove segood's CUDA paths on a real device and measure them, in one command (`make gpu-check`).

    python benchmarks/gpu_check.py [--out gpu_check.json] [--device cuda] [--dry-run]

Part 1, correctness, each check printed as passed or failed (with what differed):
- accumulator counts of CUDA tensors equal the CPU kernels' on both grids (linear T = 400 and 65536,
  float-order m = 10), on scores with ties, thresholds, ±0.0, subnormals and infinities;
- every method scored on the device equals the CPU within float tolerance, from the same weights (Monte-Carlo
  methods from the same samples; perturbing methods on all but a 0.1% of pixels whose gradient sign flips);
- AMP training steps (autocast + GradScaler on CUDA) give finite, falling losses;
- `segood.evaluate` under torch.distributed in one process (NCCL on CUDA, gloo on CPU) equals a plain run.
- `segood.evaluate` with each batch's update beside the next batch's network (the default on CUDA), and with its
  batches in blocks of shared memory written again (pageable or registered), writes the state of updates in turn,
  array for array.
Part 2, throughput at 1024×2048 (batch 1, best of a few interleaved rounds):
- forward passes of PSPNet-ResNet50/101 and DeepLabV3+-Xception65 in fp32, bf16 and fp16 autocast;
- what every method adds to the forward pass of its network (PSPNet-ResNet50), MC dropout T = 8 against one
  forward, all single-pass methods together;
- the accumulators against the device's memory-read floor (8 score maps);
- end-to-end `segood evaluate` images/s with data loading from a converted set.
Prints one table and writes every number, and the targets (single-pass methods together <= 5% of a forward
pass; accumulation >= 50% of the floor; MC dropout T = 8 <= 2.5x one forward), to a JSON file.

``--dry-run`` runs everything on the CPU at tiny sizes in about a minute: the test suite runs it, so the
script never rots. On one H200 the full check takes 6–7 minutes (by its parts' times there).
"""

import argparse
import contextlib
import functools
import itertools
import json
import os
import shutil
import socket
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_metrics import saturated  # noqa: E402
from bench_runs import network_maps  # noqa: E402
from torch_timing import device_name, interleaved_best_ms  # noqa: E402

from segood import keep_freed_memory  # noqa: E402
from segood.metrics import FloatOrderAccumulator, LinearGridAccumulator  # noqa: E402
from segood.methods import get_method  # noqa: E402
from segood.methods.schedule import score_batch  # noqa: E402
from segood.models import build_model  # noqa: E402

LOGIT_METHODS = ("max_softmax", "odin", "entropy", "max_logit", "energy")
HEAD_OF = {"max_softmax": "plain", "odin": "plain", "entropy": "plain", "mahalanobis": "dimreduce",
           "varsum": "dropout", "mutual_info": "dropout", "confidence": "confidence"}
FULL = {"size": (1024, 2048), "check_size": (256, 512), "networks": (("pspnet", "resnet50"), ("pspnet", "resnet101"),
        ("deeplabv3plus", "tu-xception65")), "repeat": 5, "maps": 8, "frames": 16, "pipeline_frames": 32,
        "pipeline_copies": (4, 8),
        "batches": (1, 4, 8), "demo": "full", "compile_backend": "inductor"}
DRY = {"size": (64, 128), "check_size": (64, 128), "networks": (("pspnet", "resnet18"),), "repeat": 1, "maps": 2,
       "frames": 4, "pipeline_frames": 4, "pipeline_copies": (1, 2), "batches": (1, 2),
       "demo": "quick", "compile_backend": "eager"}  # (inductor compiles for half a minute on a CPU)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--dry-run", action="store_true", help="CPU, tiny sizes: a test of this script")
    parser.add_argument("--only", nargs="+", choices=[*CHECKS, *MEASURES], metavar="PART",
                        help=f"run only these parts (checks: {', '.join(CHECKS)}; measurements: {', '.join(MEASURES)})")
    args = parser.parse_args()
    keep_freed_memory()  # (as every segood command does)
    wanted = set(args.only or [*CHECKS, *MEASURES])
    scale = DRY if args.dry_run else FULL
    device = torch.device("cpu" if args.dry_run else args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("gpu_check: no CUDA device here; run with --dry-run to test the script on the CPU")
    started = time.perf_counter()
    report = {"device": device_name(device), "torch": torch.__version__, "dry_run": args.dry_run,
              "checks": {}, "throughput": {}, "targets": {}}
    work = Path(tempfile.mkdtemp(prefix="segood-gpu-check-"))

    def save():  # after every part, so that a run stopped at its time limit still leaves its numbers
        report["seconds"] = round(time.perf_counter() - started, 1)
        args.out.write_text(json.dumps(report, indent=2, default=lambda v: v.item()) + "\n")  # numpy scalars

    try:
        for name, check in ((n, c) for n, c in CHECKS.items() if n in wanted):
            try:
                report["checks"][name] = {"passed": True, **(check(device, scale, work) or {})}
            except Exception as err:  # noqa: BLE001 - a failed check is reported, and the rest still run
                report["checks"][name] = {"passed": False, "why": f"{type(err).__name__}: {err}"}
            print(f"check {name}: {'passed' if report['checks'][name]['passed'] else 'FAILED'}", flush=True)
            save()
        for name, measure in ((n, m) for n, m in MEASURES.items() if n in wanted):
            try:
                report["throughput"][name] = measure(device, scale, work)
            except Exception as err:  # noqa: BLE001 - reported; the other measurements still run
                report["throughput"][name] = {"failed": f"{type(err).__name__}: {err}"}
            print(f"measured {name}", flush=True)
            save()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failed = {k: v["failed"] for k, v in report["throughput"].items() if "failed" in v}
    if failed:
        print(f"wrote {args.out}; measurements that failed: {failed}")
        return 1
    if args.only:
        print(json.dumps(report["throughput"], indent=1, default=lambda v: v.item()))
        print(f"wrote {args.out} ({report['seconds']} s; parts {', '.join(args.only)})")
        return 0 if all(c["passed"] for c in report["checks"].values()) else 1
    methods, acc = report["throughput"]["methods"], report["throughput"]["accumulators"]
    pipeline = report["throughput"]["pipeline"]
    report["targets"] = {
        "evaluate (warm) >= 0.5 of forward-only throughput": min(r["warm_share"] for r in pipeline["rows"]) >= 0.5,
        "logit methods scored together <= 0.10 over a forward": methods["logit_methods_scored_together_overhead"]
        <= 0.10,
        "accumulation >= 0.5 of the memory-read floor": min(acc["ratio_linear_400"], acc["ratio_float_m10"],
                                                            acc["ratio_float_m10_per_image"]) >= 0.5,
        "mc_dropout_T8 <= 2.5 forwards": methods["mc_logits_T8_ratio"] <= 2.5,
    }
    save()
    print(table(report))
    print(f"wrote {args.out} ({report['seconds']} s)")
    return 0 if all(c["passed"] for c in report["checks"].values()) else 1


# -- part 1: correctness -------------------------------------------------------------------------------------

def adversarial_scores(n, seed=0):
    rng = np.random.default_rng(seed)
    scores = rng.random(n).astype(np.float32)
    scores[: n // 8] = np.round(scores[: n // 8] * 399) / 399  # on linear thresholds (ties)
    special = np.array([0.0, -0.0, 1.0, 1e-45, 1e-38, np.float32(np.nextafter(np.float32(0.5), 1))], np.float32)
    scores[n // 8 : n // 8 + special.size] = special
    labels = rng.integers(0, 2, n).astype(np.uint8)
    labels[::13] = 255
    return scores, labels


def check_accumulators(device, scale, work):
    scores, labels = adversarial_scores(1 << 18)
    wide = scores * np.float32(1e6) - np.float32(3e5)  # mixed signs for the float-order grid
    wide[:4] = [np.inf, -np.inf, -0.0, 1e-40]
    s, lab = torch.from_numpy(scores).to(device), torch.from_numpy(labels).to(device)
    for num_thresholds in (400, 65536):
        cpu = LinearGridAccumulator(num_thresholds).update(scores, labels)
        dev = LinearGridAccumulator(num_thresholds).update(s, lab)
        assert np.array_equal(cpu.hist, dev.hist), f"linear grid T = {num_thresholds}: device counts differ"
    for data in (scores, wide):
        cpu = FloatOrderAccumulator().update(data, labels)
        dev = FloatOrderAccumulator().update(torch.from_numpy(data).to(device), lab)
        assert np.array_equal(cpu.binades, dev.binades) and np.array_equal(cpu.counts, dev.counts), \
            "float-order grid: device counts differ"
    batch, batch_labels = np.stack([scores, wide]).reshape(4, 256, -1), np.stack([labels, labels]).reshape(4, 256, -1)
    cpu = FloatOrderAccumulator(per_image=True).update(batch, batch_labels)
    on_device = torch.from_numpy(batch).to(device), torch.from_numpy(batch_labels).to(device)
    dev = FloatOrderAccumulator(per_image=True).update(*on_device)
    # the batch again, now on the state's binades (one pass), begun as an evaluation begins it: on a stream of high
    # priority that waits for the batch, while the main stream is busy
    cpu.update(batch, batch_labels)
    stream = torch.cuda.Stream(device, priority=-1) if device.type == "cuda" else None
    busy = torch.randn(2048, 2048, device=device)
    with contextlib.ExitStack() as stack:
        if stream is not None:
            stream.wait_stream(torch.cuda.current_stream(device))
            busy @ busy @ busy
            stack.enter_context(torch.cuda.stream(stream))
        dev.begin_update(*on_device)()
    for key, value in cpu.state_dict().items():  # NaN equals NaN here (an undeclared score_range)
        np.testing.assert_array_equal(dev.state_dict()[key], value, f"float-order grid, per image: device {key} differs")
    return {"pixels": int(scores.size), "float_order_kernel": check_float_order_kernel(device, scores, wide, labels)}


def check_float_order_kernel(device, scores, wide, labels):
    """The device kernel (Triton on CUDA, the torch path on the CPU) against the numba kernel, per image of a batch
    of the adversarial and the wide scores: float32 at m = 1, 10, 14, float16 and float64 at m = 10 (each case a
    compilation of the Triton kernels), in two passes and in one pass over known binades (the batch's, more, all
    but one: the two passes again), each program's end bins added pixel by pixel and at once (``ends``), and its
    pixels added by runs of one counter (``runs``, float32 at m = 10); on a CUDA device the CUDA kernel that counts
    in shared memory too (``check_cuda_kernel``). Returns the kernel's name."""
    from segood import _triton
    from segood.metrics import _device, _kernels
    from segood.metrics.functional import as_numpy_inputs

    kernel = "triton" if device.type == "cuda" and _triton.available() else "torch"
    batch = np.stack([scores, wide]).astype(np.float64)
    batch_labels = np.stack([labels, labels[::-1]])
    batch_labels[1, ::101] = 7  # bad labels, counted as problems
    with np.errstate(over="ignore"):
        inputs = {"float32": batch.astype(np.float32), "float16": batch.astype(np.float16), "float64": batch}
    for name, data in inputs.items():
        for m in (1, 10, 14) if name == "float32" else (10,):
            wants = [_kernels.float_histogram_numpy(*as_numpy_inputs(data[i], batch_labels[i], keep_float32_exact=True),
                                                    m, 1) for i in range(len(data))]
            union = np.unique(np.concatenate([want[0] for want in wants]))
            variants = ((False, 0), (True, 0)) + (((False, 2048), (True, 64)) if (name, m) == ("float32", 10) else ())
            for known, (ends, runs) in itertools.product((None, union, np.union1d(union, [1, 4000]), union[1:]),
                                                         variants):
                images, problems = _device.float_histograms(torch.from_numpy(data).to(device),
                                                            torch.from_numpy(batch_labels).to(device), m,
                                                            kernel=kernel, known=known, ends=ends, runs=runs)
                assert_counts(images, problems, wants,
                              f"{kernel} kernel, {name} scores, m = {m}, {'no' if known is None else known.size} "
                              f"known binades, ends {'at once' if ends else 'pixel by pixel'}, runs {runs}")
    if kernel == "triton":
        check_cuda_kernel(device)
    return kernel


def assert_counts(images, problems, wants, case):
    """A device kernel's counts per image and problems equal to the numba kernel's (``wants``, one per image)."""
    for i, ((binades, counts), want) in enumerate(zip(images, wants)):
        assert np.array_equal(binades, want[0]) and np.array_equal(counts, want[1]), \
            f"{case}, image {i}: counts differ from the CPU kernel's"
    assert np.array_equal(problems, sum(want[2] for want in wants)), f"{case}: problems differ"


def check_cuda_kernel(device):
    """The CUDA kernel that counts in shared memory (``kernel="cuda"``) against the numba kernel, per image, on
    scores of a few binades (a network's: uniform in [2^-8, 1), with ±0, 1, ±inf, a subnormal, -0.5, NaN at counted
    and ignored pixels, bad labels), float32, float16 and bfloat16 at m = 1 and 10, in two passes and on known
    binades (the batch's, more, all but one: the two passes again); each case must have been counted by the CUDA
    kernel itself."""
    from segood.metrics import _device, _device_cuda, _kernels
    from segood.metrics.functional import as_numpy_inputs

    rng = np.random.default_rng(3)
    scores = 2.0 ** rng.uniform(-8, 0, (3, 200_000))
    scores[:, :9] = [0.0, -0.0, 1.0, np.inf, -np.inf, 1e-40, -0.5, np.nan, np.nan]
    labels = rng.integers(0, 2, scores.shape).astype(np.uint8)
    labels[:, 7], labels[:, 8], labels[:, 20::37], labels[:, 30::101] = 0, 255, 255, 9
    count, launched = _device_cuda.count, []
    _device_cuda.count = lambda *args: launched.append(count(*args)) or launched[-1]
    try:
        for dtype, m in itertools.product((torch.float32, torch.float16, torch.bfloat16), (1, 10)):
            data = torch.from_numpy(scores).to(dtype)
            wants = [_kernels.float_histogram_numpy(*as_numpy_inputs(data[i].float().numpy(), labels[i],
                                                                     keep_float32_exact=True), m, 1)
                     for i in range(len(data))]
            union = np.unique(np.concatenate([want[0] for want in wants]))
            for known in (None, union, np.union1d(union, [1, 4000]), union[1:]):
                images, problems = _device.float_histograms(data.to(device), torch.from_numpy(labels).to(device), m,
                                                            kernel="cuda", known=known)
                case = f"cuda kernel, {dtype} scores, m = {m}, {'no' if known is None else known.size} known binades"
                # (too few known binades: the one pass, then both passes again, each counted by the CUDA kernel)
                assert launched == [True] * (2 if known is not None and known.size < union.size else 1), \
                    f"{case}: not counted by the CUDA kernel each time ({launched}; {_device_cuda.failure()})"
                launched.clear()
                assert_counts(images, problems, wants, case)
    finally:
        _device_cuda.count = count


def check_methods(device, scale, work):
    """TF32 is off here: with it on (PyTorch's default for cuDNN convolutions) features round to 10 mantissa
    bits, and the first H100 run saw Mahalanobis distances differ from the CPU's by 1.3e-2 of their maximum."""
    flags = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        return compare_methods(device, scale)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = flags


def compare_methods(device, scale):
    height, width = scale["check_size"]
    torch.manual_seed(0)
    x = torch.randn(2, 3, height, width)
    worst = {}
    for head in ("plain", "dimreduce", "dropout", "confidence"):
        model = build_model("pspnet", "resnet18", head=head).eval()
        names = [n for n, h in HEAD_OF.items() if h == head]
        methods = [get_method(n) for n in names]
        if head == "plain":  # (with CUDA and Triton, the logit methods come from the fused kernel there)
            methods += [get_method("max_logit"), get_method("energy"), get_method("odin", temperature=10, epsilon=0.002)]
        for method in methods:
            if method.needs.fit:
                batch = {"image": torch.randint(0, 256, (2, 3, height, width), dtype=torch.uint8),
                         "semantic": torch.randint(0, 3, (2, height, width), dtype=torch.uint8)}
                method.fit(model, [batch])
        cpu = score_batch(model, x, methods).scores
        dev = score_batch(model.to(device), x.to(device), methods).scores
        for method, a, b in zip(methods, cpu, dev):
            if method.needs.samples:  # the same samples on both: the dropout masks of two devices differ
                samples = model.cpu().mc_logits(x, samples=8)
                a, b = method.from_samples(samples), method.from_samples(samples.to(device))
                model.to(device)
            diff = (a - b.cpu()).abs()
            scale_ = max(1.0, float(a.abs().max()))
            key = method.name + (" eps" if method.needs.perturbs else "")
            worst[key] = float(diff.max() / scale_)
            if method.needs.perturbs:  # a gradient sign may flip where the gradient is ~0
                assert float((diff > 1e-3 * scale_).float().mean()) <= 1e-3, f"{key}: device scores differ"
            else:
                assert worst[key] <= 1e-3, f"{key}: device scores differ by {worst[key]:.2e}"
    return {"max_relative_difference": worst, "class_sums": compare_class_sums(device, scale),
            "calibration": compare_calibration(device, scale)}


def compare_class_sums(device, scale):
    """The per-class score sums on the device: the same bits twice, and the CPU's in-order sums up to rounding."""
    from segood.evaluation.class_sums import class_sums

    height, width = scale["size"]
    g = torch.Generator().manual_seed(1)
    semantic = torch.randint(0, 24, (2, height, width), dtype=torch.uint8, generator=g)
    scores = torch.randn(2, height, width, generator=g)
    cpu = class_sums(semantic, scores, 19)
    first, second = (class_sums(semantic.to(device), scores.to(device), 19).cpu() for _ in range(2))
    assert torch.equal(first, second), "the device's per-class sums differ from run to run"
    difference = float(((first - cpu).abs() / cpu.abs().clamp(min=1.0)).max())
    assert difference <= 1e-9, f"the device's per-class sums differ from the CPU's by {difference:.2e}"
    return {"relative_difference": difference, "same_twice": True}


def compare_calibration(device, scale):
    """The calibration on the device (its Triton kernel): the same bits twice, the CPU's counts and hits, and its
    confidence and Brier sums up to rounding."""
    from segood.metrics.calibration import CalibrationAccumulator

    height, width = scale["size"]
    g = torch.Generator().manual_seed(2)
    probs = torch.softmax(torch.randn(2, 19, height, width, generator=g) * 3, dim=1)
    target = torch.randint(0, 19, (2, height, width), generator=g).to(torch.uint8)
    cpu = CalibrationAccumulator().update(probs, target)
    first, second = (CalibrationAccumulator().update(probs.to(device), target.to(device)) for _ in range(2))
    assert np.array_equal(first.confidence, second.confidence) and first.brier == second.brier, \
        "the device's calibration sums differ from run to run"
    assert np.array_equal(first.count, cpu.count) and np.array_equal(first.correct, cpu.correct), \
        "the device's calibration counts differ from the CPU's"
    difference = max(float(np.max(np.abs(first.confidence - cpu.confidence) / np.maximum(cpu.confidence, 1.0))),
                     abs(first.brier - cpu.brier) / max(cpu.brier, 1.0))
    assert difference <= 1e-9, f"the device's calibration sums differ from the CPU's by {difference:.2e}"
    return {"relative_difference": difference, "same_twice": True}


def check_amp_training(device, scale, work):
    from segood.data.synthetic import write_scene_set
    from segood.models.train import TrainConfig, train

    height, width = scale["check_size"]
    write_scene_set(work / "train.h5", 8, (height, width), split="train")
    config = TrainConfig(train_set=str(work / "train.h5"), out_dir=str(work / "train"), arch="pspnet",
                         encoder="resnet18", epochs=3, batch_size=4, lr=0.01, crop=[height, width],
                         scale=[1.0, 1.0], device=str(device))
    log = train(config, progress=False)
    losses = [row["loss"] for row in log]
    assert all(np.isfinite(losses)), f"non-finite losses {losses}"
    assert losses[-1] < losses[0], f"the loss did not fall: {losses}"
    return {"losses": losses, "amp": device.type == "cuda"}


def make_eval_set(work, size, frames):
    from segood.data import Noise, convert, mix
    from segood.data.synthetic import write_scene_set

    tag = f"{size[0]}x{size[1]}_{frames}"
    path = work / f"mixed_{tag}.h5"
    if path.exists():
        return path
    write_scene_set(work / f"scenes_{tag}.h5", frames // 2, size, seed=1)
    convert(Noise("perlin", frames - frames // 2, size=size), work / f"perlin_{tag}.h5", size=size, progress=False)
    mix(work / f"perlin_{tag}.h5", work / f"scenes_{tag}.h5", path, progress=False)
    return path


def check_distributed(device, scale, work):
    import torch.distributed as dist

    from segood.evaluation import evaluate

    path = make_eval_set(work, scale["check_size"], 4)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head="dropout").eval()
    methods = ["max_softmax", "entropy", "varsum"]
    plain = evaluate(model, [path], methods, work / "plain", device=device, progress=False, figures=False)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        shared = evaluate(model, [path], methods, work / "dist", device=device, progress=False, figures=False)
    finally:
        dist.destroy_process_group()
    for method in methods:
        a, b = plain["results"][method], shared["results"][method]
        assert a == b, f"{method}: the {backend} run differs from the plain run"
    return {"backend": backend}


def check_overlap(device, scale, work):
    """A run whose updates overlap the next batch's network (the default on CUDA) writes the state of a run with
    the updates in turn."""
    return same_states(device, scale, work, [{"overlap": False}, {"overlap": True}])


def check_blocks(device, scale, work):
    """A run whose readers write blocks again (``reading.device_batches``), copied to the device from pageable
    memory or registered with CUDA, writes the state of a run whose batches are pinned by the DataLoader, with its
    updates in turn or overlapped."""
    return same_states(device, scale, work, [{"overlap": False, "blocks": "pinned"}] + [
        {"overlap": overlap, "blocks": blocks} for blocks in ("pageable", "registered") for overlap in (False, True)])


def same_states(device, scale, work, variants):
    """``segood evaluate`` of one network over 16 frames, 2 readers, in each pipeline ``variant`` (see
    :func:`pipeline_variant`): the states equal the first's, array for array."""
    from segood.evaluation import evaluate
    from segood.io import read_npz

    path = make_eval_set(work, scale["check_size"], 16)
    torch.manual_seed(0)
    model = build_model("pspnet", "resnet18", head="dropout").to(device).eval()
    cudnn = torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark
    torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = True, False  # (the same scores twice)
    states = []
    try:
        for k, variant in enumerate(variants):
            with pipeline_variant(**variant):
                evaluate(model, [path], ["max_softmax", "entropy", "varsum"], work / f"variant_{k}", device=device,
                         batch_size=2, workers=2, progress=False, figures=False, bootstrap=None)
            states.append(read_npz(work / f"variant_{k}" / "state.npz", "evaluation state"))
    finally:
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = cudnn
    for variant, state in zip(variants[1:], states[1:]):
        assert set(state) == set(states[0]), f"the run {variant} holds other arrays"
        for key in set(state) - {"progress"}:  # (the stages' times differ)
            np.testing.assert_array_equal(state[key], states[0][key], err_msg=f"the run {variant}: {key} differs")
    return {"arrays": len(states[0])}


# -- part 2: throughput --------------------------------------------------------------------------------------

def time_forwards(device, scale, work):
    height, width = scale["size"]
    x = torch.randn(1, 3, height, width, device=device)
    rows = {}
    for arch, encoder in scale["networks"]:
        torch.manual_seed(0)
        model = build_model(arch, encoder).to(device).eval()
        row = {}
        for precision in ("fp32", "bf16", "fp16"):
            dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(precision)
            if device.type == "cpu" and precision == "fp16":
                continue  # no fp16 autocast on the CPU

            def forward():
                with torch.no_grad(), torch.autocast(device.type, dtype=dtype, enabled=dtype is not None):
                    return model(x)

            row[precision] = interleaved_best_ms([forward], scale["repeat"], device)[0]
        rows[f"{arch} {encoder}"] = row
        model = None  # free it before the next network
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return rows


def time_methods(device, scale, work):
    from segood.models.predict import predicted_classes

    height, width = scale["size"]
    x = torch.randn(1, 3, height, width, device=device)
    rows, models = {}, {}
    for name, head in HEAD_OF.items():
        if head not in models:
            torch.manual_seed(0)
            models[head] = build_model("pspnet", scale["networks"][0][1], head=head).to(device).eval()
        model, method = models[head], get_method(name)
        if method.needs.fit:
            batch = {"image": torch.randint(0, 256, (1, 3, height, width), dtype=torch.uint8),
                     "semantic": torch.randint(0, 3, (1, height, width), dtype=torch.uint8)}
            method.fit(model, [batch])
        with torch.no_grad():
            output = model(x)

            def forward():
                return predicted_classes(model(x).logits)

            if method.needs.forward:
                ms_forward, ms_added = interleaved_best_ms([forward, lambda: method.from_output(output)],
                                                           scale["repeat"], device)
            else:
                ms_forward, ms_whole = interleaved_best_ms([forward, lambda: score_batch(model, x, [method])],
                                                           scale["repeat"], device)
                ms_added = ms_whole - ms_forward
        rows[name] = {"forward_ms": ms_forward, "added_ms": ms_added, "overhead": ms_added / ms_forward}
    model = models["dropout"]
    with torch.no_grad():
        seeds = list(range(len(x)))  # (each frame's masks from its own generator, as segood evaluate draws them)
        one, mc = interleaved_best_ms([lambda: model(x), lambda: model.mc_logits(x, samples=8, seeds=seeds)],
                                      scale["repeat"], device)
    single = [n for n in rows if get_method(n).needs.forward]
    together = sum(rows[n]["added_ms"] for n in single) / np.mean([rows[n]["forward_ms"] for n in single])
    plain, logit_methods = models["plain"], [get_method(n) for n in LOGIT_METHODS]
    with torch.no_grad():  # the logit methods scored together (one read of the logits), over the forward alone
        forward_ms, scored_ms = interleaved_best_ms([lambda: plain(x), lambda: score_batch(plain, x, logit_methods)],
                                                    scale["repeat"], device)
    return {"per_method": rows, "single_pass_together_overhead": together, "mc_logits_T8_ratio": mc / one,
            "logit_methods": LOGIT_METHODS, "logit_methods_scored_together_overhead": scored_ms / forward_ms - 1}


def time_accumulators(device, scale, work):
    """The accumulators against the memory-read floor on ``maps`` score maps: the linear grid and the float-order
    grid over the whole batch; the float-order grid with per-image counts as the evaluation runs it (one (N, H, W)
    batch per update, and one frame per update), compute() excluded and included, and a batch to an accumulator
    that holds its binades already (one pass); float16 scores (against their own floor); the device kernel alone
    (at three block sizes, with each program's end bins added at once, and on known binades: one pass, with and
    without the end bins at once, and with each program's pixels added by runs of one counter); on saturated
    scores (``bench_metrics.saturated``: a confident network's), where every pixel's own addition meets the same
    counter, and on the demo network's max softmax (``bench_runs.network_maps``), whose neighbouring pixels share
    counters; the CUDA kernel that counts in shared memory (``kernel="cuda"``) on each of these and on float16."""
    from segood import _triton
    from segood.metrics import _device, _device_cuda

    height, width = scale["size"]
    rng = np.random.default_rng(0)
    labels = torch.from_numpy(rng.integers(0, 2, (scale["maps"], height, width)).astype(np.uint8)).to(device)
    scores = torch.rand(scale["maps"], height, width, device=device)
    half = scores.half()
    confident = torch.from_numpy(saturated(scores.cpu().numpy(), labels.cpu().numpy())).to(device)
    maps, map_labels = network_maps(scale["maps"], height, width, device=device, forms=("max_softmax",))
    flat_network = torch.from_numpy(maps["max_softmax"]).to(device).reshape(scale["maps"], -1)
    flat_map_labels = torch.from_numpy(map_labels).to(device).reshape(scale["maps"], -1)
    flat_scores, flat_labels = scores.reshape(scale["maps"], -1), labels.reshape(scale["maps"], -1)
    flat_confident = confident.reshape(scale["maps"], -1)

    def floor():
        return scores.sum() + labels.sum()

    def floor16():
        return half.sum() + labels.sum()

    def per_image(data, frames=False, compute=False):
        def run():
            acc = FloatOrderAccumulator(10, per_image=True)
            for s, lab in (zip(data.split(1), labels.split(1)) if frames else [(data, labels)]):
                acc.update(s, lab)
            return acc.compute() if compute else acc
        return run

    # its binades: those of every update; each image's bookkeeping left queued, as per_image leaves it (the
    # evaluation does it while the device runs the next batch's network)
    warm = FloatOrderAccumulator(10, per_image=True).update(scores, labels)

    def one_pass(flat, ends=False, runs=0, labels=flat_labels, kernel=None):
        known = np.unique(np.concatenate([b for b, _ in _device.float_histograms(flat, labels, 10)[0]]))
        return functools.partial(_device.float_histograms, flat, labels, 10, known=known, ends=ends, runs=runs,
                                 kernel=kernel)

    named = {
        "floor_ms": floor,
        "linear_400_ms": lambda: LinearGridAccumulator(400).update(scores, labels),
        "float_m10_ms": lambda: FloatOrderAccumulator(10).update(scores, labels),
        "float_m10_per_image_ms": per_image(scores),
        "float_m10_per_image_compute_ms": per_image(scores, compute=True),
        "float_m10_per_frame_ms": per_image(scores, frames=True),
        "float_m10_per_frame_compute_ms": per_image(scores, frames=True, compute=True),
        "float16_floor_ms": floor16,
        "float16_m10_per_image_ms": per_image(half),
        "float_m10_per_image_known_ms": lambda: warm.update(scores, labels),
        "float_m10_kernel_ms": lambda: _device.float_histograms(flat_scores, flat_labels, 10),
        "float_m10_kernel_known_ms": one_pass(flat_scores),
        "float_m10_kernel_known_ends_ms": one_pass(flat_scores, ends=True),
        **{f"float_m10_kernel_block{block}_ms": functools.partial(_device.float_histograms, flat_scores, flat_labels,
                                                                  10, block=block) for block in (1024, 4096)},
        "float_m10_kernel_ends_ms": lambda: _device.float_histograms(flat_scores, flat_labels, 10, ends=True),
        "float_m10_per_image_saturated_ms": per_image(confident),
        "float_m10_kernel_saturated_ms": lambda: _device.float_histograms(flat_confident, flat_labels, 10),
        "float_m10_kernel_ends_saturated_ms": lambda: _device.float_histograms(flat_confident, flat_labels, 10,
                                                                               ends=True),
        "float_m10_kernel_known_saturated_ms": one_pass(flat_confident),
        "float_m10_kernel_known_ends_saturated_ms": one_pass(flat_confident, ends=True),
        "float_m10_kernel_known_network_ms": one_pass(flat_network, labels=flat_map_labels),
    }
    # each program's pixels sorted by counter, runs at a time, each run one addition (bench_runs.py counts them),
    # where its kernel builds (a failure is recorded, not left to turn every later kernel into the torch path)
    runs_failed = {}
    first = _device.float_histograms(flat_scores[:1], flat_labels[:1], 10)[0][0][0]  # (the first map's binades)
    for runs in (32, 256, 2048):
        try:
            if device.type == "cuda":
                for known in (None, first):  # (both passes' builds)
                    _device.float_histograms(flat_scores[:1], flat_labels[:1], 10, kernel="triton", runs=runs,
                                             known=known)
        except Exception as err:  # noqa: BLE001 - recorded in the report
            runs_failed[runs] = f"{type(err).__name__}: {str(err)[:500]}"
            continue
        for name, flat, lab in (("", flat_scores, flat_labels), ("_saturated", flat_confident, flat_labels),
                                ("_network", flat_network, flat_map_labels)):
            named[f"float_m10_kernel_known_runs{runs}{name}_ms"] = one_pass(flat, runs=runs, labels=lab)
    # the CUDA kernel that counts in shared memory (segood.metrics._device_cuda), where it builds
    cuda_slots = {}  # (binades known, whether their table fits in shared memory) by input
    if device.type == "cuda":
        for data in (flat_scores, flat_scores.half()):  # (built before the timing; a failure is recorded)
            _device.float_histograms(data[:1], flat_labels[:1], 10, kernel="cuda", known=first)
    if device.type == "cuda" and _device_cuda.failure() is None:
        for name, flat, lab in (("", flat_scores, flat_labels), ("_saturated", flat_confident, flat_labels),
                                ("_network", flat_network, flat_map_labels),
                                ("_float16", half.reshape(scale["maps"], -1), flat_labels)):
            named[f"float_m10_kernel_known_cuda{name}_ms"] = run = one_pass(flat, labels=lab, kernel="cuda")
            cuda_slots[name or "_uniform"] = [int(run.keywords["known"].size),  # (beyond: Triton counts)
                                              bool(_device_cuda.fits(run.keywords["known"].size, 10, device))]
    ms = dict(zip(named, interleaved_best_ms(list(named.values()), scale["repeat"] * 3, device)))
    result = {**ms, "pixels": int(scores.numel()), "maps": scale["maps"], "size": [height, width],
              "kernel": ("triton" if _triton.available() else "torch") if device.type == "cuda" else "numba",
              "runs_failed": runs_failed, "cuda_failed": _device_cuda.failure(), "cuda_slots": cuda_slots}
    for name, value in ms.items():
        if name not in ("floor_ms", "float16_floor_ms"):
            floor_ms = ms["float16_floor_ms"] if name.startswith("float16") else ms["floor_ms"]
            result["ratio_" + name[: -len("_ms")]] = floor_ms / value
    return result


def time_evaluate(device, scale, work):
    from segood.evaluation import evaluate

    path = make_eval_set(work, scale["size"], scale["frames"])
    torch.manual_seed(0)
    model = build_model("pspnet", scale["networks"][0][1], head="dropout").to(device).eval()
    start = time.perf_counter()
    doc = evaluate(model, [path], None, work / "throughput", batch_size=1, device=device, progress=False,
                   figures=False)
    seconds = time.perf_counter() - start
    return {"images_per_s": scale["frames"] / seconds, "methods": list(doc["results"]),
            "ms_per_image": doc["timings"]["ms_per_image"]}


def time_pipeline(device, scale, work):
    """``segood evaluate`` of the plain head's single-pass methods against its network's forward pass alone, at
    each batch size in fp32 and half precision (fp16 on CUDA, bf16 on the CPU), each batch's update beside the
    next batch's network (the default on CUDA), the batches pinned by the DataLoader and in blocks written again
    that are registered as pinned memory (``reading.device_batches``), one after the other; and at the largest
    batch up to 4 with the updates in turn, in fp32 in blocks pageable or registered, and at the batch sizes after
    the first in registered blocks with the CUDA kernel counting (``_device.COUNTING``). After a run that warms
    up (kernels built, memory allocated), two runs over a and b copies of one set (as sets of their own: the frames
    of each are read and scored again): the run of b copies, start-up included, gives the end-to-end throughput;
    the difference of the two runs, the warm one (the run's fixed costs cancel: both runs have enough batches for
    every reader process evaluate starts); the run of b copies, the time of each stage (``data``: waiting for the
    readers; the others run beside one another where the updates overlap); and, warm, the readers' CPU time and
    page faults and the main process's page faults a frame."""
    from segood.evaluation.runner import default_methods
    from segood.metrics import _device_cuda

    path = make_eval_set(work, scale["size"], scale["pipeline_frames"])
    runs = [{f"copy{k}": path for k in range(copies)} for copies in scale["pipeline_copies"]]
    frames = [scale["pipeline_frames"] * copies for copies in scale["pipeline_copies"]]
    torch.manual_seed(0)
    model = build_model("pspnet", scale["networks"][0][1]).to(device).eval()
    methods = [m.name for m in default_methods(model, fitted=False) if m.needs.forward and not m.needs.perturbs]
    half = "fp16" if device.type == "cuda" else "bf16"
    in_turn = max(b for b in scale["batches"] if b <= 4)
    variants = ([(p, b, True, blocks) for p in ("fp32", half) for b in scale["batches"]
                 for blocks in ("pinned", "registered")]
                + [(p, in_turn, False, "pinned") for p in ("fp32", half)]
                + [("fp32", in_turn, False, "registered"), ("fp32", in_turn, False, "pageable"),
                   ("fp32", in_turn, True, "pageable")])
    variants = [(*variant, "triton") for variant in variants] + [
        (p, b, True, "registered", "cuda") for p in ("fp32", half) for b in scale["batches"][1:]]
    rows = []
    for precision, batch, overlap, blocks, counting in variants:
        amp = None if precision == "fp32" else precision
        x = torch.randn(batch, 3, *scale["size"], device=device)

        def forward():
            with torch.no_grad(), torch.autocast(device.type, dtype=torch.float16 if amp == "fp16" else
                                                 torch.bfloat16, enabled=amp is not None):
                return model(x)

        forward_ms = interleaved_best_ms([forward], scale["repeat"], device)[0] / batch
        with pipeline_variant(overlap, blocks, counting):
            seconds, stages, use = evaluate_seconds(model, runs, methods, work / f"pipeline_{precision}_{batch}_"
                                                    f"{overlap}_{blocks}_{counting}", batch_size=batch,
                                                    device=device, amp=amp)
        warm_ms = 1000 * (seconds[1] - seconds[0]) / (frames[1] - frames[0])
        readers_cpu_ms, readers_faults, main_faults = (use[1] - use[0]) / (frames[1] - frames[0])
        rows.append({"precision": precision, "batch": batch, "overlap": overlap, "blocks": blocks,
                     "counting": counting, "cuda_failed": _device_cuda.failure() if counting == "cuda" else None,
                     "forward_ms_per_frame": forward_ms,
                     "evaluate_ms_per_frame_warm": warm_ms,
                     "evaluate_ms_per_frame_with_startup": 1000 * seconds[1] / frames[1],
                     "warm_share": forward_ms / warm_ms, "share_with_startup": forward_ms * frames[1] /
                     (1000 * seconds[1]), "startup_s": seconds[1] - frames[1] * warm_ms / 1000,
                     "stages_ms_per_frame": stages, "readers_cpu_ms_per_frame_warm": readers_cpu_ms,
                     "readers_page_faults_per_frame_warm": readers_faults,
                     "main_page_faults_per_frame_warm": main_faults})
    return {"methods": methods, "frames": list(frames), "rows": rows}


@contextlib.contextmanager
def pipeline_variant(overlap=None, blocks=None, counting=None):
    """``segood evaluate`` with each batch's update beside the next batch's network or in turn (``overlap``), its
    batches for the device pinned by the DataLoader or in blocks written again, pageable or registered (``blocks``:
    ``reading.device_batches``), its histograms' counting pass by the Triton or the CUDA kernel
    (``counting``: ``segood.metrics._device.COUNTING``); None: the default."""
    from segood.evaluation import reading, runner
    from segood.metrics import _device

    saved = runner._overlaps, reading.device_batches, _device.COUNTING
    if overlap is not None:
        runner._overlaps = lambda device: overlap
    if blocks is not None:
        reading.device_batches = lambda: blocks
    if counting is not None:
        _device.COUNTING = counting
    try:
        yield
    finally:
        runner._overlaps, reading.device_batches, _device.COUNTING = saved


def evaluate_seconds(model, runs, methods, folder, **options):
    """The seconds of one ``segood evaluate`` (no figures, no bootstrap) over each of ``runs`` ({set: path}),
    after an unmeasured run over the first (kernels built and memory allocated); the last run's milliseconds a
    frame per stage; and what each run used: [its reader processes' CPU ms and page faults (they have exited at
    its end), the main process's page faults]."""
    import resource

    from segood.evaluation import evaluate

    def used():
        readers, main = resource.getrusage(resource.RUSAGE_CHILDREN), resource.getrusage(resource.RUSAGE_SELF)
        return np.array([1000 * (readers.ru_utime + readers.ru_stime), readers.ru_minflt, main.ru_minflt])

    seconds, use = [], []
    for k, sets in enumerate([runs[0], *runs]):
        before, start = used(), time.perf_counter()
        doc = evaluate(model, sets, methods, folder / str(k), progress=False, figures=False, bootstrap=None,
                       **options)
        seconds.append(time.perf_counter() - start)
        use.append(used() - before)
    return seconds[1:], doc["timings"]["ms_per_image"], use[1:]


def time_compile(device, scale, work):
    """The network's forward pass through ``torch.compile`` (the scale's backend: inductor on a GPU) against it as
    it is, at the largest batch up to 4, in fp32 and half precision: ms per frame, and the first call's seconds
    (compiling); then ``segood evaluate --compile`` in fp32, warm (the difference of runs over a and b copies of
    one set, as :func:`time_pipeline` measures it) against the same runs without it."""
    from segood.evaluation.runner import default_methods
    from segood.methods.schedule import compiled

    path = make_eval_set(work, scale["size"], scale["pipeline_frames"])
    runs = [{f"copy{k}": path for k in range(copies)} for copies in scale["pipeline_copies"]]
    frames = [scale["pipeline_frames"] * copies for copies in scale["pipeline_copies"]]
    batch = max(b for b in scale["batches"] if b <= 4)
    torch.manual_seed(0)
    model = build_model("pspnet", scale["networks"][0][1]).to(device).eval()
    fast = compiled(model, scale["compile_backend"])
    x = torch.randn(batch, 3, *scale["size"], device=device)
    half = ("fp16", torch.float16) if device.type == "cuda" else ("bf16", torch.bfloat16)
    out = {"backend": scale["compile_backend"], "batch": batch}
    for precision, dtype in (("fp32", None), half):
        def forward(net):
            with torch.no_grad(), torch.autocast(device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
                return net(x)

        start = time.perf_counter()
        forward(fast)
        if device.type == "cuda":
            torch.cuda.synchronize()
        first = time.perf_counter() - start
        eager_ms, compiled_ms = (ms / batch for ms in interleaved_best_ms(
            [lambda: forward(model), lambda: forward(fast)], scale["repeat"], device))
        out[precision] = {"forward_ms_per_frame": eager_ms, "compiled_forward_ms_per_frame": compiled_ms,
                          "speedup": eager_ms / compiled_ms, "first_call_s": first}
    methods = [m.name for m in default_methods(model, fitted=False) if m.needs.forward and not m.needs.perturbs]
    for name, backend in (("evaluate_ms_per_frame_warm", None),
                          ("compiled_evaluate_ms_per_frame_warm", scale["compile_backend"])):
        seconds, _, _ = evaluate_seconds(model, runs, methods, work / f"compile_{backend}", batch_size=batch,
                                         device=device, compile=backend)
        out[name] = 1000 * (seconds[1] - seconds[0]) / (frames[1] - frames[0])
    return out


def time_robustness(device, scale, work):
    """One corruption condition end to end (``segood robustness``: the clean set and one corrupted copy, the
    corruption applied in the reader processes), against the plain evaluation of the same frames."""
    from segood.evaluation import evaluate
    from segood.robustness.suite import robustness

    frames = scale["pipeline_frames"]
    path = make_eval_set(work, scale["size"], frames)
    torch.manual_seed(0)
    model = build_model("pspnet", scale["networks"][0][1]).to(device).eval()
    methods = ["max_softmax", "max_logit"]
    start = time.perf_counter()
    evaluate(model, [path], methods, work / "robust_plain", device=device, progress=False, figures=False,
             bootstrap=None)
    plain = time.perf_counter() - start
    start = time.perf_counter()
    robustness(model, [path], methods, work / "robust", corruptions=["gaussian_noise"], severities=[3],
               device=device, progress=False, figures=False)
    both = time.perf_counter() - start
    return {"frames": frames, "clean_ms_per_frame": 1000 * plain / frames,
            "clean_and_one_condition_ms_per_frame": 1000 * both / (2 * frames)}


def amp_effect(device, scale, work):
    """The demo's plain network scored from an fp16 (CUDA; bf16 on the CPU) forward against fp32, on the demo's
    sets: per method and set, the metrics of both, the difference, and whether a paired image bootstrap finds it
    significant (the interval of the difference excludes 0)."""
    from segood.demo import CHECKPOINTS, FULL as DEMO_FULL, QUICK, prepare_data
    from segood.evaluation import evaluate
    from segood.metrics.bootstrap import Bootstrap, compare
    from segood.models import load_model

    sets = prepare_data(work / "demo", DEMO_FULL if scale["demo"] == "full" else QUICK, progress=False)
    sets = {name: sets[f"mixed_{name}"] for name in ("sun", "idd", "perlin", "normal")}
    model, _ = load_model(CHECKPOINTS / "demo_plain.pt")
    model = model.to(device).eval()
    methods = ["max_softmax", "entropy", "max_logit", "energy"]
    half = "fp16" if device.type == "cuda" else "bf16"
    runs = {amp: evaluate(model, sets, methods, None, amp=None if amp == "fp32" else amp, device=device,
                          progress=False, figures=False, bootstrap=None) for amp in ("fp32", half)}
    rows = []
    for set_name in sets:
        for method in methods:
            images = {amp: runs[amp].state.acc[(method, set_name)].images for amp in runs}
            found = compare(images, Bootstrap(resamples=1000, seed=0))
            for metric in ("auroc", "auprc", "fpr95"):
                values = {amp: runs[amp]["results"][method][set_name]["pooled"][metric] for amp in runs}
                rows.append({"set": set_name, "method": method, "metric": metric, "fp32": values["fp32"],
                             half: values[half], "difference": values[half] - values["fp32"],
                             "fp32_interval": found["intervals"]["fp32"][metric],
                             "significant": found["significant"][metric]["fp32"][half]})
    return {"half": half, "rows": rows,
            "largest_difference": max(abs(r["difference"]) for r in rows if r["difference"] == r["difference"]),
            "significant": sum(r["significant"] for r in rows)}


CHECKS = {"accumulator_counts": check_accumulators, "methods_device_vs_cpu": check_methods,
          "amp_training": check_amp_training, "distributed_evaluate": check_distributed, "overlap": check_overlap,
          "blocks": check_blocks}
MEASURES = {"forward_ms": time_forwards, "methods": time_methods, "accumulators": time_accumulators,
            "evaluate": time_evaluate, "pipeline": time_pipeline, "robustness": time_robustness,
            "amp_effect": amp_effect, "compile": time_compile}


def table(report):
    lines = [f"## segood GPU check: {report['device']} (torch {report['torch']})" + (" — DRY RUN" if report["dry_run"]
                                                                                      else ""), "",
             "| check | result |", "|---|---|"]
    lines += [f"| {name} | {'passed' if c['passed'] else 'FAILED: ' + c['why']} |" for name, c in report["checks"].items()]
    lines += ["", "| forward ms (batch 1) | " + " | ".join(("fp32", "bf16", "fp16")) + " |", "|---|---:|---:|---:|"]
    for net, row in report["throughput"]["forward_ms"].items():
        lines.append(f"| {net} | " + " | ".join(f"{row[p]:.1f}" if p in row else "–" for p in ("fp32", "bf16", "fp16"))
                     + " |")
    methods = report["throughput"]["methods"]
    lines += ["", "| method | forward ms | added ms | overhead |", "|---|---:|---:|---:|"]
    lines += [f"| {n} | {r['forward_ms']:.1f} | {r['added_ms']:.1f} | {r['overhead']:.1%} |"
              for n, r in methods["per_method"].items()]
    acc, ev = report["throughput"]["accumulators"], report["throughput"]["evaluate"]
    lines += ["", f"single-pass methods, the sum of each alone: {methods['single_pass_together_overhead']:.1%} of a "
              f"forward; {', '.join(methods['logit_methods'])} scored together: "
              f"{methods['logit_methods_scored_together_overhead']:.1%} over a forward; "
              f"mc_logits(T=8): {methods['mc_logits_T8_ratio']:.2f} forwards",
              f"accumulators on {acc['pixels'] / 1e6:.1f} M pixels: floor {acc['floor_ms']:.2f} ms, linear T=400 "
              f"{acc['linear_400_ms']:.2f} ms ({acc['ratio_linear_400']:.2f} of the floor), float-order m=10 "
              f"{acc['float_m10_ms']:.2f} ms ({acc['ratio_float_m10']:.2f})", "",
              f"| float-order m=10, per-image counts ({acc['kernel']} kernel) | ms | of the floor |", "|---|---:|---:|"]
    lines += [f"| {name[:-3]} | {acc[name]:.2f} | {acc['ratio_' + name[:-3]]:.2f} |" for name in acc
              if name.startswith("float") and name.endswith("_ms") and "floor" not in name]
    lines += ["", f"segood evaluate (dropout head: {', '.join(ev['methods'])}): {ev['images_per_s']:.2f} images/s", ""]
    pipeline = report["throughput"]["pipeline"]
    lines += [f"segood evaluate against the forward pass alone ({', '.join(pipeline['methods'])}; "
              f"{pipeline['frames'][1]} frames, warm = the difference of runs of {pipeline['frames'][1]} and "
              f"{pipeline['frames'][0]} frames):", "",
              "| precision | batch | updates | batches in | forward ms/frame | evaluate ms/frame, warm | share | "
              "with start-up | share | start-up s | readers' page faults/frame |",
              "|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    lines += [f"| {r['precision']} | {r['batch']} | {'beside' if r['overlap'] else 'in turn'} | "
              f"{r['blocks']} | "
              f"{r['forward_ms_per_frame']:.1f} | {r['evaluate_ms_per_frame_warm']:.1f} | {r['warm_share']:.0%} | "
              f"{r['evaluate_ms_per_frame_with_startup']:.1f} | {r['share_with_startup']:.0%} | {r['startup_s']:.2f} | "
              f"{r['readers_page_faults_per_frame_warm']:.0f} |" for r in pipeline["rows"]]
    robust, amp = report["throughput"]["robustness"], report["throughput"]["amp_effect"]
    lines += ["", f"robustness, clean + one condition: {robust['clean_and_one_condition_ms_per_frame']:.1f} ms/frame "
              f"(plain evaluation {robust['clean_ms_per_frame']:.1f})",
              f"{amp['half']} forward against fp32 on the demo: largest metric difference {amp['largest_difference']:.2e}, "
              f"{amp['significant']} of {len(amp['rows'])} significant"]
    comp = report["throughput"]["compile"]
    lines += [f"torch.compile ({comp['backend']}, batch {comp['batch']}): forward ms/frame "
              + ", ".join(f"{p} {row['forward_ms_per_frame']:.1f} -> {row['compiled_forward_ms_per_frame']:.1f} "
                          f"(compiling {row['first_call_s']:.0f} s)"
                          for p, row in comp.items() if isinstance(row, dict))
              + f"; evaluate fp32 warm {comp['evaluate_ms_per_frame_warm']:.1f} -> "
              f"{comp['compiled_evaluate_ms_per_frame_warm']:.1f} ms/frame", "", "| target | met |", "|---|---|"]
    lines += [f"| {t} | {'yes' if ok else 'NO'} |" for t, ok in report["targets"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    sys.exit(main())
