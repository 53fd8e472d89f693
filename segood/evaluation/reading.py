"""Reading a run's frames ahead of the network: batches read, verified and decoded in worker processes.

A pass over the sets is a plan of batches, (set name, frame indices) each, read in that order by
:func:`batch_reader`. With ``workers`` > 0 the batches are read by that many ``DataLoader`` worker processes, a few
batches ahead, into blocks of shared memory they write again (registered as pinned memory where the network runs on
CUDA, so that the copy to the device is asynchronous), while the main process scores the batch before; with 0 they
are read in the main process, one at a time. The batches and their order are the same either way, so are the counts.
"""

import functools
import math
import os
import threading
import typing
import warnings
from pathlib import Path

import torch

from segood._memory import keep_freed_memory
from segood._threads import cores
from segood.data.h5 import same_size_batches

MAX_WORKERS = 16  # a verified 1024x2048 frame takes 10-13 ms of a core to read, a fast GPU's network 3-5 ms
MIN_PIXELS = 1 << 23  # a pass reading fewer pixels (~0.2 s of decoding) is read in the main process: starting
# the reader processes would cost more than they save (small sets, notebooks, tests)


def default_workers(datasets=None, plan=None):
    """A reader process per core the main process leaves spare, at most :data:`MAX_WORKERS`; none for a ``plan``
    of ``datasets`` whose frames (where their sizes are known) hold fewer than :data:`MIN_PIXELS` pixels."""
    if plan is not None and _pixels(datasets, plan) < MIN_PIXELS:
        return 0
    return max(0, min(MAX_WORKERS, cores() - 1))


def _pixels(datasets, plan):
    """The pixels of a plan's frames, by their datasets' ``sizes``; infinite where a dataset does not know them."""
    total = 0
    for set_name, indices in plan:
        sizes = getattr(datasets[set_name], "sizes", None)
        if sizes is None:
            return float("inf")
        total += sum(sizes[i][0] * sizes[i][1] for i in indices)
    return total


class UnreadableFrame(ValueError):
    """A frame of a set could not be read."""

    def __init__(self, index, err):
        super().__init__(f"cannot read frame {index} ({err})")
        self.index, self.reason = index, str(err)


def read_batch(dataset, indices, *, skip_bad=False):
    """(items, kept indices, [(index, reason)] of unreadable frames passed over). Without ``skip_bad`` an
    unreadable frame raises :class:`UnreadableFrame`."""
    items, kept, bad = [], [], []
    for i in indices:
        try:
            items.append(dataset[i])
            kept.append(i)
        except (OSError, ValueError) as err:
            if not skip_bad:
                raise UnreadableFrame(i, err) from None
            bad.append((i, str(err)))
    return items, kept, bad


def stacked(items, indices):
    """[(batch of stacked tensors, its frame indices)], one for each run of consecutive ``items`` of one size
    (every tensor of an item: image, masks, and what a wrapped set adds, such as score maps), all views of one
    block of memory (:func:`_layout`)."""
    layout, size = _layout(items, indices)
    return _filled(torch.empty(size, dtype=torch.uint8), layout, items)


def _layout(items, indices, channels_last=False):
    """(``[(frame indices, {key: (offset, shape, dtype, channels last)})]``, bytes): where one block of memory holds
    ``items`` stacked, a run of frames of one size at a time, each tensor 64-byte aligned; the dtypes promote as
    ``torch.stack``'s do. One block a batch: a reader process hands a batch to the main process as one shared
    storage (each storage costs a handshake with the reader, about 1 ms while it decodes the next batch).
    ``channels_last``: the images (N, C, H, W) are stored as (N, H, W, C), the frames' own order, so that stacking
    them copies rather than transposes (a reader's CPU 10.0 against 11.3 ms a 1024x2048 frame: ``bench_pipeline.py
    --reading``): for a device, which transposes them in the copy that normalises them."""
    sizes = [tuple(item["image"].shape) for item in items]
    keys = [key for key, value in items[0].items() if isinstance(value, torch.Tensor)] if items else []
    promoted = functools.partial(functools.reduce, torch.promote_types)
    layout, offset = [], 0
    for run in same_size_batches(sizes, len(items)):
        places = {}
        for key in keys:
            shape, dtype = (len(run), *items[run[0]][key].shape), promoted(items[k][key].dtype for k in run)
            places[key] = (offset, shape, dtype, channels_last and key == "image" and len(shape) == 4)
            offset += -(-math.prod(shape) * dtype.itemsize // 64) * 64
        layout.append(([indices[k] for k in run], places))
    return layout, offset


def _filled(block, layout, items):
    """The batch of :func:`stacked`, ``items`` stacked into ``block`` (a uint8 tensor) as ``layout`` says."""
    views, first = _views(block, layout), 0
    for batch, indices in views:
        for key, view in batch.items():
            torch.stack([item[key] for item in items[first : first + len(indices)]], out=view)
        first += len(indices)
    return views


def _views(block, layout):
    """[(batch, frame indices)]: the tensors ``layout`` places in ``block``."""
    return [({key: _view(block, *place) for key, place in places.items()}, indices) for indices, places in layout]


def _view(block, offset, shape, dtype, channels_last):
    flat = block[offset : offset + math.prod(shape) * dtype.itemsize].view(dtype)
    if channels_last:  # (stored (N, H, W, C))
        n, c, h, w = shape
        return flat.view(n, h, w, c).permute(0, 3, 1, 2)
    return flat.view(shape)


NO_SHARED_MEMORY = "no shared memory"  # a reader's answer for a batch it found no room for in shared memory


def shared_storage(size):
    """A storage of ``size`` bytes in shared memory (on Linux a file in /dev/shm, whose size a container caps at 64
    MiB unless started with more); a RuntimeError where there is no room."""
    return torch.UntypedStorage._new_shared(size)


def _shared_block(size):
    return torch.empty(0, dtype=torch.uint8).set_(shared_storage(size))


class _InBlock(typing.NamedTuple):
    """A batch a reader process wrote into a block of shared memory it keeps (:class:`_Batches`): the block itself
    only the first time, after that only where in it."""

    reader: int
    slot: int
    block: torch.Tensor | None
    layout: list


class _Batches(torch.utils.data.Dataset):
    """The k-th batch of a plan: ([(stacked batch, frame indices)], [(index, reason)] passed over), or
    ``("unreadable", index, reason)`` for a frame that cannot be read without ``skip_bad`` (raised as
    :class:`UnreadableFrame` by the main process, which saves the run first).

    With ``taken`` (a shared count: the main process is done with the batches before it) a reader process writes
    its batches into blocks of shared memory it keeps, a block the main process is done with and large enough,
    else a new one, and hands over an :class:`_InBlock`: the main process maps each block once. A fresh block a
    batch, as a ``DataLoader`` hands batches over (without ``taken``), has its pages faulted in by the reader and
    again by the main process (each about 600 faults a 512x1024 frame, 1.5 ms on a virtual machine's CPU). A
    reader that finds no room in shared memory for a batch answers ``(NO_SHARED_MEMORY, bytes, reason)``."""

    def __init__(self, datasets, plan, skip_bad, taken=None, channels_last=False):
        self.datasets, self.plan, self.skip_bad, self.taken = datasets, plan, skip_bad, taken
        self.channels_last = channels_last  # (of the images in blocks: :func:`_layout`)
        self.blocks = []  # (in a reader process) [[block, the batch it holds]]

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, k):
        set_name, indices = self.plan[k]
        try:
            items, kept, bad = read_batch(self.datasets[set_name], indices, skip_bad=self.skip_bad)
        except UnreadableFrame as err:
            return "unreadable", err.index, err.reason
        reader = torch.utils.data.get_worker_info()
        if reader is None:
            return stacked(items, kept), bad
        layout, size = _layout(items, kept, self.channels_last)
        try:
            slot, block, fresh = self._block(k, size)
        except RuntimeError as err:  # (no room in shared memory: the main process reads this batch itself)
            return NO_SHARED_MEMORY, size, str(err)
        batch = _filled(block, layout, items)
        return (batch if slot is None else _InBlock(reader.id, slot, block if fresh else None, layout)), bad

    def _block(self, k, size):
        """(slot, block, whether it is new) of this reader's blocks for batch ``k`` of ``size`` bytes; without
        ``taken``, a new block that is not kept (slot None: the DataLoader hands it over)."""
        if self.taken is None:
            return None, _shared_block(size), True
        done = int(self.taken[0])  # (read once: it only grows, and an old value only holds a block back)
        free = [slot for slot, (_, held) in enumerate(self.blocks) if held < done]
        fits = [slot for slot in free if len(self.blocks[slot][0]) >= size]
        if fits:
            self.blocks[fits[0]][1] = k
            return fits[0], self.blocks[fits[0]][0], False
        block = _shared_block(size)
        if free:  # (too small: replaced)
            self.blocks[free[0]] = [block, k]
            return free[0], block, True
        self.blocks.append([block, k])
        return len(self.blocks) - 1, block, True


DEVICE_BATCHES = ("registered", "pinned", "pageable")


def device_batches():
    """How batches for a device reach it (the environment variable ``SEGOOD_DEVICE_BATCHES``, default the first; off
    CUDA, registered and pageable blocks are the same): ``"registered"``, in blocks of shared memory that the
    readers write again and that the main process registers with CUDA as pinned memory, once a block (copies the
    host does not wait for); ``"pinned"``, each in a fresh block that the DataLoader's pinning thread copies into
    pinned memory (on an H200's host 21 ms a batch of four 1024x2048 frames, slower than the network);
    ``"pageable"``, in blocks written again, each batch copied to the device from its block (a copy the host waits
    for). On an H200, registered blocks gave the same states as pinned copies, and evaluate ran faster warm with
    them in 8 of 9 pairs of pipeline rows (``benchmarks/gpu_check.py --only blocks pipeline``)."""
    mode = os.environ.get("SEGOOD_DEVICE_BATCHES", DEVICE_BATCHES[0])
    if mode not in DEVICE_BATCHES:
        raise ValueError(f"SEGOOD_DEVICE_BATCHES must be one of {', '.join(DEVICE_BATCHES)}, got {mode!r}")
    return mode


def _register(block):
    """``block`` (a uint8 tensor) registered with CUDA as pinned memory; returns it."""
    error = int(torch.cuda.cudart().cudaHostRegister(block.data_ptr(), block.numel(), 0))
    if error:  # (torch binds no call that clears the error: the run stops here, not at a later kernel's check)
        raise RuntimeError(f"CUDA refused to register a reader's block of {block.numel()} bytes of shared memory as "
                           f"pinned memory (cudaError {error}); pinned copies work where registered blocks do not: "
                           "run with the environment variable SEGOOD_DEVICE_BATCHES=pinned")
    return block


def _unregister(block):
    if block is not None:
        torch.cuda.cudart().cudaHostUnregister(block.data_ptr())


def batch_reader(datasets, plan, *, workers=0, pin=False, skip_bad=False):
    """Yield the batches of ``plan`` ([(set name, frame indices)]) of ``datasets`` ({name: Dataset}) in order, as
    ``([(batch, frame indices)] per run of one frame size, [(index, reason)] of frames passed over)``; raises
    :class:`UnreadableFrame` for an unreadable frame without ``skip_bad``. ``workers`` > 0: that many reader
    processes read the batches after the first (which the main process reads while they start), a few batches
    ahead (never more readers than there are batches to read ahead). Without ``pin``, a batch from the readers
    lives in a block of memory they write again: it is valid until the next batch is asked for (copy what is kept
    longer). ``pin``: the batches are for a device, which may still be copying from one when the next is asked
    for: in blocks written again (:func:`device_batches` other than pinned), a batch is valid until the batch after
    next is asked for (the device and the batch's update must be done with it by then), on CUDA from a block
    registered as pinned memory where it says so, its images stored channels last (a view (N, 3, H, W) of (N, H,
    W, 3): :func:`_layout`); else no block is written again, and on CUDA each batch goes into pinned memory (for an
    asynchronous copy)."""
    workers = max(0, min(workers, len(plan) - 1))
    if not workers:
        batches = _Batches(datasets, plan, skip_bad)
        for k in range(len(plan)):
            yield _checked(batches[k])
        return
    mode = device_batches() if pin else None
    cuda = pin and torch.cuda.is_available()
    register = cuda and mode == "registered"
    taken = None if mode == "pinned" else torch.zeros(1, dtype=torch.int64).share_memory_()
    loader = torch.utils.data.DataLoader(_Batches(datasets, plan[1:], skip_bad, taken, channels_last=pin),
                                         batch_size=None, shuffle=False, num_workers=workers,
                                         pin_memory=cuda and mode == "pinned", worker_init_fn=_reader_started)
    reads = iter(loader)  # (the readers start)
    stopping = threading.Thread(target=reads._shutdown_workers, name="segood-readers-exit", daemon=True)
    registered = {}  # {(reader, slot): its block, registered with CUDA}
    warned = False  # that a batch found no room in shared memory (once a pass)
    try:
        yield _checked(_Batches(datasets, plan, skip_bad)[0])
        blocks = {}  # {(reader, slot): a block of shared memory the readers write batches into}
        for k in range(len(plan) - 1):
            if taken is not None:  # (the batches before k are done with, as the next one is asked for; for a
                taken[0] = k - 1 if pin else k  # device, the batches before k - 1)
            read = next(reads)
            if read[0] == NO_SHARED_MEMORY:  # (the same batch, read here: slower, the same counts)
                if not warned:
                    _warn_no_shared_memory(*read[1:])
                    warned = True
                read = _Batches(datasets, plan, skip_bad)[k + 1]
            runs, bad = _checked(read)
            if isinstance(runs, _InBlock):
                if runs.block is not None:
                    key = runs.reader, runs.slot
                    blocks[key] = runs.block
                    if register:  # (a block replaced was free: no copy from it runs)
                        _unregister(registered.pop(key, None))
                        registered[key] = _register(runs.block)
                runs = _views(blocks[runs.reader, runs.slot], runs.layout)
            if k == len(plan) - 2:  # the last batch is in: the readers are stopped and joined in the background
                # (a join waits for each process to exit, ~0.04 s a reader, while the run scores the last batch).
                # Not after the last yield: a loop that takes as many batches as it planned never resumes the
                # generator there, and the join would wait when it is collected.
                stopping.start()
            yield runs, bad
    finally:  # closed, collected or failed: the readers are stopped before they are let go (a thread still stopping
        if stopping.ident is not None:  # them when the interpreter exits can leave a lock held that its exit waits
            stopping.join()  # for), and at once where the stop had not begun: a traceback holding this frame (an
        else:  # unreadable frame's) would keep them running, holding the sets' files open
            reads._shutdown_workers()
        if registered:
            torch.cuda.synchronize()  # (no copy from a block runs when it is unregistered)
            for block in registered.values():
                _unregister(block)


def _warn_no_shared_memory(size, reason):
    """Warns that batches of ``size`` bytes are read in the main process, and why."""
    shm, room = Path("/dev/shm"), ""
    if shm.is_dir():
        stat, mib = os.statvfs(shm), 2**20
        free, total = stat.f_bavail * stat.f_frsize / mib, stat.f_blocks * stat.f_frsize / mib
        room = f" (/dev/shm: {free:.0f} MiB free of {total:.0f})"
    warnings.warn(f"a reader process found no room in shared memory for a batch of {size / 2**20:.0f} MiB ({reason}); "
                  f"such batches are read in the main process instead: the same batches, more slowly. The readers' "
                  f"batches live in shared memory{room}, 64 MiB in a container unless it is started with more "
                  "(docker run --shm-size=8g ...); fewer readers (--workers) or a smaller --batch-size need less",
                  RuntimeWarning, stacklevel=2)


def _reader_started(_):
    keep_freed_memory()  # (a reader's arrays, MiBs a frame, reuse its pages rather than fault them in again)


def _checked(read):
    if read[0] == "unreadable":
        raise UnreadableFrame(read[1], read[2])
    return read
