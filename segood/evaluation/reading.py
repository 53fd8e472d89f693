"""Reading a run's frames ahead of the network: batches read, verified and decoded in worker processes.

A pass over the sets is a plan of batches, (set name, frame indices) each, read in that order by
:func:`batch_reader`. With ``workers`` > 0 the batches are read by that many ``DataLoader`` worker processes, a
few batches ahead, into pinned memory where the network runs on CUDA (so that the copy to the device is
asynchronous), while the main process scores the batch before; with 0 they are read in the main process, one
at a time. The batches and their order are the same either way, so are the counts.
"""

import functools
import math
import threading

import torch

from segood._threads import cores
from segood.data.h5 import same_size_batches

MAX_WORKERS = 16  # decoding a 1024x2048 frame takes ~40 ms a core: 16 keep up with a fast GPU
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
    (every tensor of an item: image, masks, and what a wrapped set adds, such as score maps)."""
    sizes = [tuple(item["image"].shape) for item in items]
    keys = [key for key, value in items[0].items() if isinstance(value, torch.Tensor)] if items else []
    return [(_stacked_in_one_block([items[k] for k in run], keys), [indices[k] for k in run])
            for run in same_size_batches(sizes, len(items))]


def _stacked_in_one_block(items, keys):
    """{key: the items' tensors stacked}, all views of one block of memory: a reader process hands a batch to the
    main process as one shared storage (each storage costs a handshake with the reader, about 1 ms while it
    decodes the next batch)."""
    shapes = [(len(items), *items[0][key].shape) for key in keys]
    promoted = functools.partial(functools.reduce, torch.promote_types)  # (the dtype torch.stack gives)
    dtypes = [promoted(item[key].dtype for item in items) for key in keys]
    sizes = [math.prod(shape) * dtype.itemsize for shape, dtype in zip(shapes, dtypes)]
    offsets = [sum(-(-size // 64) * 64 for size in sizes[:k]) for k in range(len(sizes) + 1)]  # (aligned)
    block = torch.empty(offsets[-1], dtype=torch.uint8)
    return {key: torch.stack([item[key] for item in items], out=block[start : start + size].view(dtype).view(shape))
            for key, shape, dtype, start, size in zip(keys, shapes, dtypes, offsets, sizes)}


class _Batches(torch.utils.data.Dataset):
    """The k-th batch of a plan: ([(stacked batch, frame indices)], [(index, reason)] passed over), or
    ``("unreadable", index, reason)`` for a frame that cannot be read without ``skip_bad`` (raised as
    :class:`UnreadableFrame` by the main process, which saves the run first)."""

    def __init__(self, datasets, plan, skip_bad):
        self.datasets, self.plan, self.skip_bad = datasets, plan, skip_bad

    def __len__(self):
        return len(self.plan)

    def __getitem__(self, k):
        set_name, indices = self.plan[k]
        try:
            items, kept, bad = read_batch(self.datasets[set_name], indices, skip_bad=self.skip_bad)
        except UnreadableFrame as err:
            return "unreadable", err.index, err.reason
        return stacked(items, kept), bad


def batch_reader(datasets, plan, *, workers=0, pin=False, skip_bad=False):
    """Yield the batches of ``plan`` ([(set name, frame indices)]) of ``datasets`` ({name: Dataset}) in order, as
    ``([(batch, frame indices)] per run of one frame size, [(index, reason)] of frames passed over)``; raises
    :class:`UnreadableFrame` for an unreadable frame without ``skip_bad``. ``workers`` > 0: read that many
    batches at once in worker processes (never more than the plan has batches to read ahead); ``pin``: into
    pinned memory (for an asynchronous copy to a CUDA device)."""
    workers = max(0, min(workers, len(plan) - 1))
    loader = torch.utils.data.DataLoader(_Batches(datasets, plan, skip_bad), batch_size=None, shuffle=False,
                                         num_workers=workers, pin_memory=pin and torch.cuda.is_available())
    reads = iter(loader)
    for count, read in enumerate(reads, 1):
        if read[0] == "unreadable":
            raise UnreadableFrame(read[1], read[2])
        if workers and count == len(plan):  # the last batch is in: the readers are stopped and joined in the
            # background (a join waits for each process to exit, ~0.04 s a reader, while the run scores the last
            # batch; they are daemons, ended with the main process). Not after the last yield: a loop that takes
            # as many batches as it planned never resumes the generator there, and the join would wait when it is
            # collected.
            threading.Thread(target=reads._shutdown_workers, name="segood-readers-exit", daemon=True).start()
        yield read
