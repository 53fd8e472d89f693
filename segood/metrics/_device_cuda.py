"""A CUDA kernel for the counting pass of :mod:`segood.metrics._device` that counts in shared memory.

The Triton count kernel adds every counted pixel to its counter in device memory: one atomic addition a pixel,
about 12 G pixels a second on an H200, a tenth of the memory-read floor. Triton has no scattered additions to
shared memory, so this kernel is CUDA C, compiled at run time by NVRTC (``torch.cuda._compile_kernel``: no
compiler beyond the one torch ships). Each thread block counts a stretch of one image into a table of its own in
shared memory (a slot for each binade counted: ``fits``), then adds the table's non-zero counters to the image's
table in device memory: one addition per distinct counter of the stretch, not per pixel. It reads float32,
float16 and bfloat16 scores, whose keys it computes from their bits in 32-bit integers as the Triton kernel does,
and counts the problems and the pixels of binades without a slot alike.
"""

import functools
import warnings

from segood.labels import IGNORE, OOD
from segood.metrics._kernels import N_BAD_LABEL, N_BAD_SCORE, N_IGNORED

THREADS = 1024  # per thread block
RESERVED = 1024  # bytes of shared memory the device keeps for each thread block
_BROKEN = []  # why the kernel failed to build or launch on this machine, once it has
MIN_STRETCH = 1 << 15  # pixels a block counts at least (and at least as many as its table has counters, which it
# zeroes and reads once)
_SCALARS = {"float32": ("unsigned int", 0), "float16": ("unsigned short", 1), "bfloat16": ("unsigned short", 2)}

SOURCE = r"""
#define M __M__
#define KIND __KIND__  /* 0: float32, 1: float16, 2: bfloat16 */
typedef __SCALAR__ scalar_t;

__device__ __forceinline__ unsigned int float32_bits(scalar_t x) {
#if KIND == 0
    return x;
#elif KIND == 1  /* every float16 is a float32: sign, exponent rebased, mantissa widened; subnormals scaled */
    unsigned int sign = (unsigned int)(x & 0x8000) << 16, exponent = (x >> 10) & 0x1F, mantissa = x & 0x3FF;
    if (exponent == 0x1F) return sign | 0x7F800000u | (mantissa << 13);
    if (exponent == 0) return sign | __float_as_uint((float)mantissa * 5.9604644775390625e-08f);
    return sign | ((exponent + 112) << 23) | (mantissa << 13);
#else  /* a bfloat16 is the top half of its float32 */
    return (unsigned int)x << 16;
#endif
}

extern "C" __global__ void __launch_bounds__(__THREADS__)
count_shared(const scalar_t* scores, const unsigned char* labels, const int* slot_of, int* table,
             unsigned long long* counters, int n, int p, int slots, int stretch) {
    extern __shared__ int shared[];  /* the block's table (slots x 2 x 2^M), then the 4 counters */
    const int size = slots * 2 << M;
    for (int i = threadIdx.x; i < size + 4; i += blockDim.x) shared[i] = 0;
    __syncthreads();
    const int image = blockIdx.x % n;  /* the blocks take the images in turn */
    const long long base = (long long)image * p;
    const int start = (blockIdx.x / n) * stretch;
    const int stop = min(p, start + stretch);
    int ignored = 0, bad_label = 0, bad_score = 0, missed = 0;
    for (int i = start + threadIdx.x; i < stop; i += blockDim.x) {
        const unsigned int label = labels[base + i];
        const unsigned int bits = float32_bits(scores[base + i]);
        if (label > __OOD__) {
            ignored += label == __IGNORE__;
            bad_label += label != __IGNORE__;
            continue;
        }
        const unsigned int magnitude = bits & 0x7FFFFFFFu;
        if (magnitude > 0x7F800000u) {  /* NaN */
            bad_score++;
            continue;
        }
        /* the top 12 bits (binade) and the next M bits of the key of the score's float64 value */
        const int exponent = magnitude >> 23, mantissa = magnitude & 0x7FFFFF;
        int exponent64 = exponent == 255 ? 2047 : (magnitude == 0 ? 0 : exponent + 896);
        int top = mantissa;
        if (exponent == 0 && mantissa != 0) {  /* subnormal: normalised by its mantissa's exact float32 */
            const int normalised = __float_as_int((float)mantissa);
            exponent64 = (normalised >> 23) + 747;
            top = normalised & 0x7FFFFF;
        }
        top >>= 23 - M;
        const bool negative = (bits >> 31) && magnitude != 0;
        const int binade = negative ? 2047 - exponent64 : 2048 + exponent64;
        const int low = negative ? top ^ ((1 << M) - 1) : top;
        const int slot = slot_of[binade];
        if (slot < 0) {
            missed++;
            continue;
        }
        atomicAdd(&shared[((slot * 2 + (int)label) << M) + low], 1);
    }
    const int counts[4] = {ignored, bad_label, bad_score, missed};
    for (int k = 0; k < 4; k++)
        if (counts[k]) atomicAdd(&shared[size + k], counts[k]);
    __syncthreads();
    int* own = table + (long long)image * size;
    for (int i = threadIdx.x; i < size; i += blockDim.x)
        if (shared[i]) atomicAdd(&own[i], shared[i]);
    const int at[4] = {__N_IGNORED__, __N_BAD_LABEL__, __N_BAD_SCORE__, 3};
    for (int k = threadIdx.x; k < 4; k += blockDim.x)
        if (shared[size + k]) atomicAdd(&counters[at[k]], (unsigned long long)shared[size + k]);
}
"""


def source(dtype, m):
    """The kernel's CUDA source for scores of ``dtype`` ("float32", "float16", "bfloat16") at ``m`` bits."""
    scalar, kind = _SCALARS[dtype]
    values = {"M": m, "THREADS": THREADS, "KIND": kind, "SCALAR": scalar, "OOD": OOD, "IGNORE": IGNORE,
              "N_IGNORED": N_IGNORED, "N_BAD_LABEL": N_BAD_LABEL, "N_BAD_SCORE": N_BAD_SCORE}
    text = SOURCE
    for name, value in values.items():
        text = text.replace(f"__{name}__", str(value))
    return text


def usable(scores, labels, table, slots, m):
    """Whether the kernel counts these (N, P) CUDA tensors into ``table``: float32, float16 or bfloat16 scores, uint8
    labels, int32 counters, P up to 2^30 (its pixel indices are 32-bit), the table of ``slots`` binades within a
    thread block's shared memory, and the kernel not failed here before."""
    import torch

    return (not _BROKEN and _name(scores.dtype) in _SCALARS and labels.dtype == torch.uint8
            and table.dtype == torch.int32 and scores.shape[1] <= 1 << 30 and fits(slots, m, scores.device))


def _name(dtype):
    return str(dtype).replace("torch.", "")


def failure():
    """Why the kernel failed to build or launch here, or None."""
    return _BROKEN[0] if _BROKEN else None


def table_bytes(slots, m):
    """Shared memory a thread block of the kernel uses for ``slots`` binades."""
    return (slots * 2 << m) * 4 + 16


@functools.lru_cache(maxsize=None)
def shared_limit(device_index):
    """Bytes of shared memory one thread block may use on the CUDA device (opted in to)."""
    import torch

    props = torch.cuda.get_device_properties(device_index)
    return getattr(props, "shared_memory_per_block_optin", 48 << 10)


def resident_blocks(device, slots, m):
    """Thread blocks of the kernel the CUDA device runs at once, as many as its multiprocessors' shared memory and
    threads hold: each then counts one long stretch, whose table it adds to device memory once."""
    import torch

    props = torch.cuda.get_device_properties(device)
    return blocks_held(props.multi_processor_count,
                       getattr(props, "shared_memory_per_multiprocessor", shared_limit(device.index)),
                       props.max_threads_per_multi_processor, slots, m)


def blocks_held(processors, shared_per_processor, threads_per_processor, slots, m):
    """Thread blocks of the kernel for ``slots`` binades that ``processors`` multiprocessors hold at once."""
    per_processor = min(shared_per_processor // (table_bytes(slots, m) + RESERVED), threads_per_processor // THREADS)
    return processors * max(1, per_processor)


def stretches(n, p, resident, least=MIN_STRETCH):
    """(thread blocks per image, pixels each counts) for n images of p pixels: about ``resident`` blocks in all,
    each counting at least ``least`` pixels where the images hold as many."""
    stretch = -(-p // max(1, min(-(-resident // n), p // least)))
    return max(1, -(-p // stretch)), stretch


def least(slots, m):
    """Pixels a thread block counts at least for ``slots`` binades: :data:`MIN_STRETCH`, or its table's counters."""
    return max(MIN_STRETCH, slots * 2 << m)


def fits(slots, m, device):
    """Whether the table of ``slots`` binades at ``m`` bits fits in a thread block's shared memory on ``device``."""
    return table_bytes(slots, m) <= shared_limit(device.index)


@functools.lru_cache(maxsize=None)
def _kernel(dtype, m, device_index):
    import torch

    with torch.cuda.device(device_index):
        kernel = torch.cuda._compile_kernel(source(dtype, m), "count_shared")
        kernel.set_shared_memory_config(shared_limit(device_index))
    return kernel


def count(scores, labels, slot_of, table, counters, slots, m):
    """table[image, slot_of[binade], label, low] += 1 for every counted pixel of the (N, P) CUDA ``scores`` and
    ``labels``; counters += (ignored, bad labels, NaN scores at counted pixels, counted pixels without a slot),
    as the Triton count kernel (where :func:`usable`). Returns whether it launched: where it cannot build or launch
    here, a warning says why, nothing is counted, and it is not used again."""
    import torch

    n, p = scores.shape
    device = scores.device
    blocks_per_image, stretch = stretches(n, p, resident_blocks(device, slots, m), least(slots, m))
    try:
        kernel = _kernel(_name(scores.dtype), m, device.index)
        with torch.cuda.device(device):  # (its module is loaded on that device)
            kernel(grid=(n * blocks_per_image, 1, 1), block=(THREADS, 1, 1),
                   args=[scores, labels, slot_of, table, counters, n, p, slots, stretch],
                   shared_mem=table_bytes(slots, m), stream=torch.cuda.current_stream(device))
    except torch.cuda.OutOfMemoryError:
        raise
    except Exception as err:  # noqa: BLE001 - NVRTC or the driver cannot build or launch it here
        _BROKEN.append(f"{type(err).__name__}: {err}")
        warnings.warn(f"segood's CUDA histogram kernel failed here ({_BROKEN[0][:300]}); the Triton kernel counts "
                      "instead", RuntimeWarning, stacklevel=3)
        return False
    return True
