"""The device kernels of the float-order grid (segood.metrics._device) against the numba kernel, per image of a
batch, bit for bit: the torch path on CPU tensors here, the Triton kernel in Triton's interpreter (a subprocess
with TRITON_INTERPRET=1, which Triton reads when it makes a kernel); and the accumulator fed tensors through the
device path against the numpy path, state for state."""

import functools
import itertools
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from segood import _triton
from segood.metrics import FloatOrderAccumulator, _device, _device_cuda, _kernels, float_order
from segood.metrics.float_order import bin_thresholds
from segood.metrics.functional import as_numpy_inputs

from interpreter import run_under_triton_interpreter
from test_metrics import runs_of

DTYPES = ("float16", "bfloat16", "float32", "float64", "int32", "int64", "uint8", "bool")


def adversarial(m, seed=0):
    """(float64 scores, uint8 labels): ±0, float64 / float32 / float16 subnormals, ±inf, NaN at counted and at
    ignored pixels, bad labels, every bin edge of a few binades and the value one float64 and one float32 step
    either side, both signs over 40 decades, ignored pixels."""
    rng = np.random.default_rng(seed)
    special = [0.0, -0.0, np.inf, -np.inf, np.nan, np.nan, 5e-324, -5e-324, 2.2250738585072014e-308, 1e-45, -1e-45,
               1.4e-45, 1e-40, -3e-39, 6e-8, -6e-8, 3e-5, 1.0, -1.0, 65504.0, 65520.0, 3.4e38, 1e39]
    mixed = rng.standard_normal(400) * 10.0 ** rng.integers(-20, 20, 400)
    edges = bin_thresholds(np.repeat([2048 + 1020, 2048 + 1023, 1024, 2048 + 1023 - 20], 16),
                           np.tile(np.arange(16) * ((1 << m) // 16 or 1) % (1 << m), 4), m)
    edges = edges[np.isfinite(edges)]
    near = np.concatenate([edges, np.nextafter(edges, -np.inf), np.nextafter(edges, np.inf),
                           edges.astype(np.float32).astype(np.float64),
                           np.nextafter(edges.astype(np.float32), np.float32(np.inf)).astype(np.float64)])
    scores = np.concatenate([special, mixed, near])
    labels = rng.integers(0, 2, scores.size).astype(np.uint8)
    labels[4] = 0  # NaN at a counted pixel: a problem
    labels[5] = 255  # NaN at an ignored pixel: fine
    labels[7::23] = 255
    labels[11::101] = 7  # bad labels: problems
    return scores, labels


def batch(dtype, m):
    """(scores (4, P) of ``dtype`` as a numpy array or a tensor for bfloat16 / bool, labels (4, P) uint8): four
    images of different content (the adversarial values, the same reversed and scaled, every float16 value, runs
    of one value: a confident network's saturated scores, the lowest and highest among them)."""
    scores, labels = adversarial(m)
    rng = np.random.default_rng(m)
    rows = [scores, scores[::-1] * -3.0, np.resize(np.arange(1 << 16, dtype=np.uint16).view(np.float16), scores.size),
            runs_of(rng, np.concatenate([scores[:30], [-1e30, 1e30]]), scores.size)]
    label_rows = [labels, labels[::-1], np.resize(labels[::7], labels.size),
                  runs_of(rng, np.uint8([0, 1, 255, 0, 1]), labels.size)]
    stacked = np.stack(rows)
    with np.errstate(all="ignore"):
        if dtype == "bfloat16":
            return torch.from_numpy(stacked).to(torch.bfloat16), np.stack(label_rows)
        if dtype == "bool":
            return torch.from_numpy(stacked > 0), np.stack(label_rows)
        if dtype.startswith(("int", "uint")):
            info = np.iinfo(dtype)
            stacked = np.nan_to_num(stacked * 1e3, nan=0.0, posinf=info.max, neginf=info.min)
            return np.clip(stacked, info.min, info.max).astype(dtype), np.stack(label_rows)
        return stacked.astype(dtype), np.stack(label_rows)


def numba_reference(scores, labels, m):
    """The numba kernel on one image, the way the accumulator calls it on the host."""
    if isinstance(scores, torch.Tensor):
        scores = scores.float() if scores.dtype == torch.bfloat16 else scores
    return _kernels.float_histogram_numpy(*as_numpy_inputs(scores, labels, keep_float32_exact=True), m, 1)


KNOWN = ("the batch's", "more", "fewer")  # binades known beforehand: the batch's own, a superset, all but one
# (m, runs, ends, known) of the Triton kernel's pixels sorted by counter in groups of `runs`: the whole block of
# 256 at m = 1 (a few long runs) and with known binades, 16 or 32 at a time at m = 10 and 14 (mostly runs of one)
RUNS = ((1, 256, False, None), (10, 16, True, None), (14, 32, False, None), (10, 64, False, "fewer"),
        (10, 256, True, "the batch's"))


def known_binades(wants, which):
    """The binades a :func:`check_kernel` call declares known (``which`` of :data:`KNOWN`), from the images'
    reference counts ``wants``."""
    union = np.unique(np.concatenate([binades for binades, _, _ in wants]))
    if which == "more":
        return np.union1d(union, [1, 2048, 4000])
    if which == "fewer":
        return np.delete(union, union.size // 2)
    return union


def check_kernel(kernel, dtype, m, block=_device.BLOCK, ends=False, runs=0, known=None, device="cpu", data=batch):
    scores, labels = data(dtype, m)
    wants = [numba_reference(scores[i], labels[i], m) for i in range(len(scores))]
    images, problems = _device.float_histograms(torch.as_tensor(scores).to(device),
                                                torch.as_tensor(labels).to(device), m, kernel=kernel,
                                                block=block, ends=ends, runs=runs,
                                                known=known and known_binades(wants, known))
    want_problems = np.zeros(3, np.int64)
    for i, ((binades, counts), (want_binades, want_counts, want)) in enumerate(zip(images, wants, strict=True)):
        want_problems += want
        for got, expected in ((binades, want_binades), (counts, want_counts)):
            assert got.dtype == expected.dtype, f"{kernel} {dtype} m={m} image {i}: dtype {got.dtype}"
            np.testing.assert_array_equal(got, expected,
                                          err_msg=f"{kernel} {dtype} m={m} ends={ends} runs={runs} known={known} "
                                                  f"image {i}")
    np.testing.assert_array_equal(problems, want_problems, err_msg=f"{kernel} {dtype} m={m} problems")
    assert want_problems[_kernels.N_IGNORED] and want_problems[_kernels.N_BAD_LABEL]  # the cases are there


@pytest.mark.parametrize("m", [1, 10, 14])
@pytest.mark.parametrize("dtype", DTYPES)
def test_the_torch_path_equals_the_numba_kernel_per_image(dtype, m):
    check_kernel("torch", dtype, m)


@pytest.mark.parametrize("known", KNOWN)
@pytest.mark.parametrize("dtype", ["float16", "float32", "float64", "int64"])
def test_the_torch_path_on_known_binades_counts_in_one_pass_where_they_hold_every_pixel(monkeypatch, dtype, known):
    passes = []
    two_passes = _device._two_passes
    monkeypatch.setattr(_device, "_two_passes", lambda *args: passes.append(1) or two_passes(*args))
    check_kernel("torch", dtype, 10, known=known)
    assert len(passes) == (known == "fewer")
    monkeypatch.setattr(_device, "_KNOWN_LIMIT", 4 * 8 * 2 << 10)  # a table of 8 binades at most: two passes
    check_kernel("torch", dtype, 10, known=known)
    assert len(passes) == (known == "fewer") + 1


def test_two_passes_whose_triton_kernels_fail_give_way_to_the_torch_path(monkeypatch):
    """The two passes after a one-pass miss run when the update completes, outside start_histograms: there too a
    Triton kernel that cannot launch here warns and leaves the counting to the torch path."""
    class Unlaunchable:  # the Triton kernels' module where they cannot build or launch
        def __getattr__(self, name):
            raise RuntimeError(f"cannot build {name} here")

    monkeypatch.setattr(_triton, "_BROKEN", [])
    scores, labels = (torch.as_tensor(x) for x in batch("float32", 10))
    steps = (scores, labels, 10, True, False, Unlaunchable(), {"BLOCK": 256, "ENDS": False, "RUN": 0})
    with pytest.warns(RuntimeWarning, match="cannot build presence here.*counting with torch operations"):
        images, problems = _device._counted_twice(steps)
    want_images, want_problems = _device._two_passes(*steps[:5], None, steps[6])
    np.testing.assert_array_equal(problems, want_problems)
    for (binades, counts), (want_binades, want_counts) in zip(images, want_images, strict=True):
        np.testing.assert_array_equal(binades, want_binades)
        np.testing.assert_array_equal(counts, want_counts)


def test_the_triton_kernel_in_the_interpreter_equals_the_numba_kernel_per_image():
    """Every dtype and m as above and the empty cases, through the Triton kernel run by Triton's CPU interpreter,
    with blocks of 256 pixels so that each image spans several programs; with each program's end bins added at
    once (``ends``) and without; on binades known beforehand (all, more, too few) likewise; float32 scores with
    each program's pixels counted by runs of one counter (:data:`RUNS`)."""
    out = run_under_triton_interpreter(__file__)
    assert out.count("equal") == len(DTYPES) * 3 * 2 + len(DTYPES) * len(KNOWN) + len(RUNS), out


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_shared_memory_cuda_kernel_compiles(dtype):
    """NVRTC (torch's run-time compiler, which needs no device) makes the kernel of each score dtype and m."""
    from torch.cuda import _utils

    try:
        _utils._get_nvrtc_library()
    except (OSError, RuntimeError) as err:
        pytest.skip(f"torch's NVRTC does not load here: {err}")
    for m in (1, 10, 14):
        binary, name = _utils._nvrtc_compile(_device_cuda.source(dtype, m), "count_shared", "90")  # (an H100's)
        assert name == "count_shared" and binary.startswith(b"\x7fELF"), f"{dtype} m={m}"


# The CUDA kernel's source as C++ on the CPU: the blocks of the grid in turn, each a team of threads that share its
# table, meet at its barriers and add atomically, as a thread block's threads do on the device.
EMULATION = r"""
#include <algorithm>
#include <atomic>
#include <barrier>
#include <cstring>
#include <thread>
#include <vector>
struct Index { unsigned int x; };
static thread_local Index threadIdx = {0};
static Index blockIdx = {0}, blockDim = {1};
static int* emulated_shared;
static std::barrier<>* block_barrier;
static inline void __syncthreads() { block_barrier->arrive_and_wait(); }
static inline int atomicAdd(int* at, int value) { return std::atomic_ref<int>(*at).fetch_add(value); }
static inline unsigned long long atomicAdd(unsigned long long* at, unsigned long long value) {
    return std::atomic_ref<unsigned long long>(*at).fetch_add(value);
}
static inline unsigned int __float_as_uint(float x) { unsigned int u; std::memcpy(&u, &x, 4); return u; }
static inline int __float_as_int(float x) { int i; std::memcpy(&i, &x, 4); return i; }
using std::min;
#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(threads)
"""

EMULATION_RUN = r"""
extern "C" void run(const scalar_t* scores, const unsigned char* labels, const int* slot_of, int* table,
                    unsigned long long* counters, int n, int p, int slots, int stretch, int blocks, int threads) {
    std::vector<int> shared_table((slots * 2 << M) + 4);
    emulated_shared = shared_table.data();
    std::barrier<> barrier(threads);
    block_barrier = &barrier;
    blockDim.x = threads;
    for (blockIdx.x = 0; blockIdx.x < (unsigned int)blocks; blockIdx.x++) {
        std::vector<std::thread> team;
        for (int t = 0; t < threads; t++)
            team.emplace_back([=] {
                threadIdx.x = t;
                count_shared(scores, labels, slot_of, table, counters, n, p, slots, stretch);
            });
        for (auto& thread : team) thread.join();
    }
}
"""


@functools.lru_cache(maxsize=None)
def emulated_cuda_kernel(dtype, m, folder):
    """The CUDA kernel of ``dtype`` and ``m`` compiled by the C++ compiler for :data:`EMULATION` (ctypes)."""
    import ctypes

    source = _device_cuda.source(dtype, m).replace("extern __shared__ int shared[];", "int* shared = emulated_shared;")
    path = Path(folder) / f"count_{dtype}_{m}"
    library, cpp = path.with_suffix(".so"), path.with_suffix(".cpp")
    cpp.write_text(EMULATION + source + EMULATION_RUN)
    subprocess.run(["g++", "-std=c++20", "-pthread", "-O1", "-shared", "-fPIC", "-o", str(library), str(cpp)],
                   check=True, capture_output=True, text=True)
    return ctypes.CDLL(str(library)).run


@functools.lru_cache(maxsize=None)
def cpp20_threads():
    """Whether g++ is here and builds C++20's std::barrier and std::atomic_ref (GCC 11 and later)."""
    if shutil.which("g++") is None:
        return False
    probe = "#include <atomic>\n#include <barrier>\nint x; int main() { std::barrier<> b(1); " \
            "return std::atomic_ref<int>(x).fetch_add(1); }\n"
    built = subprocess.run(["g++", "-std=c++20", "-pthread", "-x", "c++", "-", "-o", os.devnull], input=probe,
                           capture_output=True, text=True)
    return built.returncode == 0


@pytest.mark.skipif(not cpp20_threads(), reason="needs g++ with C++20's std::barrier and std::atomic_ref")
@pytest.mark.parametrize("known", KNOWN)
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_the_shared_memory_cuda_kernel_as_cpp_equals_the_numba_kernel_per_image(tmp_path_factory, dtype, known):
    """The CUDA kernel's own source, compiled as C++ and run on the CPU by teams of threads (8, 3 and 1 a block),
    over the adversarial batch in stretches of 97 pixels (so that an image's last stretch is short and blocks of
    every image take turns), at m = 1, 10 and 14: each image's table, the problems and the pixels of binades
    without a slot equal the numba kernel's."""
    import ctypes

    folder = str(tmp_path_factory.getbasetemp() / "cuda_as_cpp")
    Path(folder).mkdir(exist_ok=True)
    for m, threads in ((1, 8), (10, 3), (14, 1)):
        scores, labels = batch(dtype, m)
        wants = [numba_reference(scores[i], labels[i], m) for i in range(len(scores))]
        binades = known_binades(wants, known)
        bits = torch.as_tensor(scores).contiguous().view(torch.int32 if dtype == "float32" else torch.int16).numpy()
        labels = np.ascontiguousarray(labels)
        n, p = labels.shape
        slot_of = np.full(_kernels.BINADES, -1, np.int32)
        slot_of[binades] = np.arange(binades.size, dtype=np.int32)
        table = np.zeros((n, binades.size, 2, 1 << m), np.int32)
        counters = np.zeros(4, np.uint64)
        stretch = 97
        blocks = n * -(-p // stretch)
        emulated_cuda_kernel(dtype, m, folder)(*(ctypes.c_void_p(a.ctypes.data) for a in (bits, labels, slot_of, table,
                                                                                            counters)),
                                               n, p, binades.size, stretch, blocks, threads)
        missed = 0
        for i, (want_binades, want_counts, _) in enumerate(wants):
            inside = np.isin(want_binades, binades)
            np.testing.assert_array_equal(table[i, slot_of[want_binades[inside]]], want_counts[inside],
                                          err_msg=f"{dtype} m={m} known={known} image {i}")
            assert table[i].sum() == want_counts[inside].sum()
            missed += want_counts[~inside].sum()
        np.testing.assert_array_equal(counters, [*sum(want[2] for want in wants), missed])
        assert (missed > 0) == (known == "fewer")


@pytest.mark.parametrize("n, p, resident", [(8, 1024 * 2048, 132), (1, 1024 * 2048, 264), (3, 100, 132),
                                             (16, 512 * 1024, 132), (1, 1 << 15, 8), (2, (1 << 16) + 1, 1),
                                             (1, 9 << 15, 1 << 20)])
def test_the_cuda_kernels_stretches_cover_each_image_once(n, p, resident):
    blocks, stretch = _device_cuda.stretches(n, p, resident)
    starts = np.arange(blocks) * stretch
    assert starts[-1] < p <= starts[-1] + stretch  # every pixel in one stretch, no block without pixels
    assert stretch >= min(p, _device_cuda.MIN_STRETCH) and n * blocks <= max(resident, n) + n
    blocks, stretch = _device_cuda.stretches(n, p, resident, least=_device_cuda.least(28, 10))  # (57,344 counters)
    assert stretch >= min(p, 57344) and (blocks - 1) * stretch < p <= blocks * stretch


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_shared_memory_cuda_kernel_equals_the_numba_kernel_per_image(monkeypatch):
    """On scores of a few binades (:func:`few_binades`), whose table fits in shared memory at m = 10, the CUDA kernel
    counts float32, float16 and bfloat16 scores, in two passes and in one; elsewhere (float64 scores, the
    adversarial batch's hundreds of binades, m = 14) the Triton kernel: the same counts either way."""
    launched = []
    count = _device_cuda.count
    monkeypatch.setattr(_device_cuda, "count", lambda *args: launched.append(count(*args)) or launched[-1])
    for dtype, known in itertools.product(("float32", "float16", "bfloat16"), (None, *KNOWN)):
        check_kernel("cuda", dtype, 10, known=known, device="cuda", data=few_binades)
        # (too few known binades: the one pass, then both passes again, each counted by the CUDA kernel)
        assert launched == [True] * (2 if known == "fewer" else 1), f"{dtype} known={known}: {launched}"
        launched.clear()
    for dtype, m, known in itertools.product(("float32", "float16", "bfloat16", "float64"), (1, 10, 14), KNOWN):
        check_kernel("cuda", dtype, m, known=known, device="cuda")
    assert _device_cuda.failure() is None


def few_binades(dtype, m):
    """(scores (3, P) of ``dtype``, labels (3, P) uint8) of at most 20 binades, as a network's maps: uniform in
    [2^-8, 1) and ±0, 1, ±inf, a float32 subnormal, -0.5, NaN at counted and at ignored pixels, bad labels."""
    rng = np.random.default_rng(m)
    scores = 2.0 ** rng.uniform(-8, 0, (3, 5000))
    special = [0.0, -0.0, 1.0, np.inf, -np.inf, 1e-40, -0.5, np.nan, np.nan]
    scores[:, : len(special)] = special
    labels = rng.integers(0, 2, scores.shape).astype(np.uint8)
    labels[:, 7], labels[:, 8] = 0, 255  # NaN at a counted pixel (a problem) and at an ignored one (fine)
    labels[:, 20::37] = 255
    labels[:, 30::101] = 9
    return (torch.from_numpy(scores).to(torch.bfloat16) if dtype == "bfloat16" else scores.astype(dtype)), labels


def check_empty(kernel):
    """An image without counted pixels beside one with; batches without images or without pixels."""
    scores = torch.tensor([[0.5, np.nan], [1.0, 2.0]], dtype=torch.float32)
    labels = torch.tensor([[255, 255], [255, 0]], dtype=torch.uint8)
    images, problems = _device.float_histograms(scores, labels, 10, kernel=kernel)
    assert images[0][0].size == 0 and images[0][1].shape == (0, 2, 1024) and images[1][0].size == 1
    np.testing.assert_array_equal(problems, [3, 0, 0])
    images, problems = _device.float_histograms(scores[:0], labels[:0], 10, kernel=kernel)
    assert images == [] and not problems.any()
    images, problems = _device.float_histograms(scores[:, :0], labels[:, :0], 10, kernel=kernel)
    assert len(images) == 2 and images[1][0].size == 0 and not problems.any()


def test_a_batch_of_empty_images_and_images_without_counted_pixels():
    check_empty("torch")


@pytest.fixture()
def device_path(monkeypatch):
    """Torch CPU tensors take the device path (the torch kernels), as CUDA tensors do; numpy arrays the numba one."""
    calls = []
    real = _device.start_histograms

    def counted(*args, **kwargs):
        calls.append(args[0].shape)
        return real(*args, **kwargs)

    monkeypatch.setattr(float_order, "_on_device", lambda scores, labels: isinstance(scores, torch.Tensor))
    monkeypatch.setattr(_device, "start_histograms", counted)
    return calls


def assert_same_state(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for key in sa:
        np.testing.assert_array_equal(sa[key], sb[key], err_msg=key)


@pytest.mark.parametrize("per_image", [True, False])
def test_the_accumulator_on_the_device_path_keeps_the_numpy_paths_state(device_path, per_image):
    rng = np.random.default_rng(1)
    batches = [(rng.random((3, 16, 24)).astype(np.float32), rng.integers(0, 2, (3, 16, 24)).astype(np.uint8)),
               (-(10.0 ** rng.uniform(-30, 30, (2, 16, 24))), rng.integers(0, 2, (2, 16, 24)).astype(np.uint8)),
               (rng.random((4, 16, 24)).astype(np.float16), rng.integers(0, 2, (4, 16, 24)).astype(np.uint8))]
    batches[0][1][1] = 255  # an image without counted pixels
    batches[1][1][0, :4] = 255
    host, device = FloatOrderAccumulator(per_image=per_image), FloatOrderAccumulator(per_image=per_image)
    for scores, labels in batches:
        host.update(scores, labels)
        device.update(torch.from_numpy(scores), torch.from_numpy(labels).to(torch.int64))
    assert device_path == [(3, 384), (2, 384), (4, 384)] if per_image else [(1, 1152), (1, 768), (1, 1536)]
    assert len(device._queued) == (9 if per_image else 0)  # each image's host bookkeeping waits for a read
    assert_same_state(host, device)
    assert not device._queued
    assert host.compute()["per_image_mean" if per_image else "auroc"] == \
        device.compute()["per_image_mean" if per_image else "auroc"]


def test_updates_begun_together_and_completed_in_turn_keep_the_state_of_updates_one_by_one(device_path,
                                                                                            monkeypatch):
    """The evaluation begins every method's update of a batch before it completes any: the state is unchanged until
    each is completed, and then that of updates one after another, on the two-pass path (the first batch, and one
    of new binades) and the one-pass one (the binades of the first); an update completed with a problem (NaN)
    leaves the state unchanged."""
    passes = []
    two_passes = _device._two_passes
    monkeypatch.setattr(_device, "_two_passes", lambda *args: passes.append(1) or two_passes(*args))
    rng = np.random.default_rng(2)
    first = torch.from_numpy(rng.random((2, 8, 8)).astype(np.float32))
    frames = [first, first.flip(-1), first * 1e6]
    labels = torch.from_numpy(rng.integers(0, 2, (2, 8, 8)).astype(np.uint8))
    one_by_one = [FloatOrderAccumulator(per_image=True) for _ in range(2)]
    together = [FloatOrderAccumulator(per_image=True) for _ in range(2)]
    for scores in frames:
        for k, acc in enumerate(one_by_one):
            acc.update(scores * (k + 1), labels)
        before = [acc.state_dict() for acc in together]
        updates = [acc.begin_update(scores * (k + 1), labels) for k, acc in enumerate(together)]
        for acc, state in zip(together, before):
            assert_same_state(acc, FloatOrderAccumulator.from_state_dict(state))
        assert [complete() for complete in updates] == together
        for a, b in zip(one_by_one, together):
            assert_same_state(a, b)
    assert len(passes) == 2 * 2 + 0 + 2 * 2  # (each accumulator of both lists: the first frame and the last)
    nan = frames[0].clone()
    nan[0, 0, 0] = np.nan
    complete = together[0].begin_update(nan, labels)
    before = together[0].state_dict()
    with pytest.raises(ValueError, match="NaN scores"):
        complete()
    assert_same_state(together[0], FloatOrderAccumulator.from_state_dict(before))


def test_the_device_path_refuses_what_the_numpy_path_refuses(device_path):
    labels = torch.tensor([0, 1, 1], dtype=torch.uint8)
    acc = FloatOrderAccumulator(per_image=True).update(torch.rand(2, 3, 3), torch.zeros(2, 3, 3, dtype=torch.uint8))
    before = acc.state_dict()
    with pytest.raises(ValueError, match="1 counted pixels have NaN scores"):
        acc.update(torch.tensor([0.1, np.nan, 0.3]), labels)
    with pytest.raises(ValueError, match=r"labels contain values \{7\}"):
        acc.update(torch.tensor([0.1, 0.2]), torch.tensor([0, 7], dtype=torch.uint8))
    with pytest.raises(ValueError, match="must be on the same device"):
        acc.update(torch.tensor([0.1, 0.2]), np.array([0, 1], np.uint8))
    with pytest.raises(ValueError, match="but labels have shape"):
        acc.update(torch.rand(2, 3, 3), torch.zeros(2, 3, 4, dtype=torch.uint8))
    with pytest.raises(ValueError, match="outside the declared score_range"):
        FloatOrderAccumulator(score_range=(0, 1)).update(torch.tensor([0.1, 2.0, 0.3]), labels)
    assert_same_state(acc, FloatOrderAccumulator.from_state_dict(before))


if __name__ == "__main__":  # the interpreter test's subprocess: TRITON_INTERPRET=1 is set
    check_empty("triton")
    check_kernel("triton", "float32", 10)  # the default block: one partly filled program per image
    for name in DTYPES:
        for bits in (1, 10, 14):
            for gathered in (False, True):
                check_kernel("triton", name, bits, block=256, ends=gathered)
                print(f"{name} m={bits} ends={gathered}: equal", flush=True)
        for which in KNOWN:
            check_kernel("triton", name, 10, block=256, ends=which == "more", known=which)
            print(f"{name} known={which}: equal", flush=True)
    for bits, runs, gathered, which in RUNS:  # (sorting is slow in the interpreter: the keys' dtype is known here)
        check_kernel("triton", "float32", bits, block=256, ends=gathered, runs=runs, known=which)
        print(f"float32 m={bits} runs={runs} ends={gathered} known={which}: equal", flush=True)
